"""What every subcommand of the command line shares: the one-line error and the warning."""

from __future__ import annotations

import sys


class CliError(Exception):
    """A failure ``main`` reports as one line, ``jaxspec: error: {message}``, and exits with ``code``.

    Attributes:
      code: the exit code: 2 for bad usage or inputs (the default), 1 for a failure at run time.
    """

    def __init__(self, message: str, code: int = 2):
        super().__init__(message)
        self.code = code


def warn(message: str) -> None:
    """Print ``jaxspec: warning: {message}`` to stderr (flushed)."""
    print(f"jaxspec: warning: {message}", file=sys.stderr, flush=True)
