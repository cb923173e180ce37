"""Progress of the command line's long steps, on stderr: a line naming each stage as it begins (loading a model,
compiling, the batch job's plain and speculative passes) and a bar per pass.

Stdout may carry generated text, so progress goes to stderr. It is shown when stderr is a terminal; ``--progress``
shows it anyway (a log file) and ``--no-progress`` hides it. Compilation happens inside a pass's first program
calls, which report nothing until they return, so a pass's bar redraws its elapsed time every second on a terminal:
a pass whose first rows still wait for their compiled programs visibly runs.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator

from tqdm import tqdm

REDRAW_S = 1.0
"""How often (seconds) a pass's bar is redrawn on a terminal while no row finishes."""


def is_terminal(stream) -> bool:
    """Whether ``stream`` is an open terminal (False for a file, a pipe, a closed or a stand-in stream)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


class Progress:
    """Stage lines and pass bars on stderr (``sys.stderr`` when each is written).

    Attributes:
      enabled: whether anything is shown; ``Progress(None)`` (the flag not given): when stderr is a terminal.
    """

    def __init__(self, enabled: bool | None = None):
        self.enabled = is_terminal(sys.stderr) if enabled is None else bool(enabled)

    def stage(self, name: str, detail: str = "") -> None:
        """Say that the stage ``name`` begins: the line ``jaxspec: {name}: {detail}`` (flushed)."""
        if self.enabled:
            print(f"jaxspec: {name}" + (f": {detail}" if detail else ""), file=sys.stderr, flush=True)

    @contextlib.contextmanager
    def bar(self, name: str, total: int, unit: str = "row") -> Iterator[tqdm]:
        """A tqdm bar named ``name`` over ``total`` ``unit``s (a disabled one, which shows nothing, unless
        ``enabled``); on a terminal it is redrawn every ``REDRAW_S`` seconds until it closes."""
        bar = tqdm(total=total, unit=unit, desc=name, file=sys.stderr, disable=not self.enabled, dynamic_ncols=True)
        stop = threading.Event()
        redraw = None
        if self.enabled and is_terminal(sys.stderr):
            redraw = threading.Thread(target=_redraw, args=(bar, stop), name="jaxspec-progress", daemon=True)
            redraw.start()
        try:
            yield bar
        finally:
            stop.set()
            if redraw is not None:
                redraw.join()
            bar.close()


def _redraw(bar: tqdm, stop: threading.Event) -> None:
    while not stop.wait(REDRAW_S):
        bar.refresh()  # under tqdm's own lock, like the main thread's updates
