"""Progress on stderr (jaxspec.cli.progress): shown on a terminal or when asked, silent otherwise; a pass's bar
keeps being redrawn on a terminal while no row finishes (a pass that is compiling)."""

import io
import sys
import threading
import time

from jaxspec.cli import progress as progress_lib
from jaxspec.cli.progress import Progress


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_shown_on_a_terminal_or_when_asked(monkeypatch, capsys):
    Progress().stage("loading", "target t")  # captured stderr is no terminal: silent by default
    Progress(False).stage("loading", "target t")
    assert capsys.readouterr().err == ""
    Progress(True).stage("loading", "target t")
    assert capsys.readouterr().err == "jaxspec: loading: target t\n"
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    Progress().stage("compiling")
    Progress(False).stage("compiling")
    assert terminal.getvalue() == "jaxspec: compiling\n"


def test_a_bar_is_redrawn_on_a_terminal_while_no_row_finishes(monkeypatch):
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.setattr(progress_lib, "REDRAW_S", 0.01)
    with Progress().bar("plain pass", 3) as bar:
        deadline = time.monotonic() + 30  # a bound on waiting, not a timing being tested
        while terminal.getvalue().count("plain pass:") < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert terminal.getvalue().count("plain pass:") >= 3  # drawn again and again, with no update
        bar.update(3)
    assert "3/3" in terminal.getvalue()
    assert not any(t.name == "jaxspec-progress" for t in threading.enumerate())  # stopped when the bar closed


def test_a_bar_off_a_terminal_is_not_redrawn(monkeypatch, capsys):
    monkeypatch.setattr(progress_lib, "REDRAW_S", 0.01)
    with Progress(True).bar("speculative pass", 2) as bar:  # asked for (a log file): drawn on updates only
        assert not any(t.name == "jaxspec-progress" for t in threading.enumerate())
        bar.update(2)
    assert "2/2" in capsys.readouterr().err
    with Progress(False).bar("speculative pass", 2) as bar:
        bar.update(2)
    assert capsys.readouterr().err == ""
