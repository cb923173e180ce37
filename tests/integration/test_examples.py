"""Every example in the README and the documentation site runs as written, and so does the quickstart notebook.

Python blocks: each page's blocks run in order in one namespace (later blocks use what earlier ones defined), in a
scratch working directory, on the real model the examples name (SmolLM2-135M-Instruct and its shipped head). A
block may be followed by a ``text`` block introduced by ``<!-- prints -->``: what the block prints, compared line by
line with every number masked (figures vary from machine to machine, the words and their order do not). A block that
cannot run here says why on the line before it, ``<!-- not run: REASON -->``, and the test holds the list of such
blocks: a new one fails until it is named below.

Command lines: every ``jaxspec ...`` and ``python -m jaxspec.bench ...`` line of a ``bash`` block is parsed by the
command's own parser (every flag and value checked as a run would check them); the main job itself runs, small, in
test_shipped.py. ``docs/history/`` holds dated records, not instructions, and is not run.
"""

from __future__ import annotations

import ast
import contextlib
import io
import re
import shlex
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import ROOT, run_optimised

PAGES = sorted(
    [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")],
    key=lambda p: str(p),
)
PAGES = [p for p in PAGES if "history" not in p.relative_to(ROOT).parts]
NOT_RUN = {  # (page, first line of the block): why it cannot run in the test suite
    ("docs/guides/sharding.md", "import jax, jaxspec"): "several processes (tests/parallel/test_sharding.py runs it)",
    ("docs/guides/extending.md", "# jaxspec/models/myfamily.py"): "a template (models/phi3.py is a complete family)",
    ("docs/guides/extending.md", "@dataclasses.dataclass(frozen=True)"): "a template (RepeatLast, the next, runs)",
    ("docs/guides/loading.md", "# a published EAGLE-3 head for Llama 3.1 8B, both from the Hugging Face Hub"): (
        "a published 8B model and head from the Hub (unreachable here)"
    ),
}

FENCE = re.compile(r"^```(\w*)\s*$")
MARK = re.compile(r"^<!--\s*(prints|not run:\s*(?P<why>.+?))\s*-->$")


@dataclass
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    prints: str | None = None  # the text block introduced by <!-- prints --> right after it
    not_run: str | None = None  # the reason given by <!-- not run: ... --> right before it

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of ``page`` with their marks."""
    lines = page.read_text().splitlines()
    out: list[Block] = []
    mark, i = None, 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            if lines[i].strip():
                mark = MARK.match(lines[i].strip())
            i += 1
            continue
        start, body = i, []
        i += 1
        while i < len(lines) and not lines[i].startswith("```"):
            body.append(lines[i])
            i += 1
        code = "\n".join(body) + "\n"
        i += 1
        if mark and mark.group(1) == "prints" and out and m.group(1) == "text":
            out[-1].prints = code
        else:
            why = mark.group("why") if mark and mark.group("why") else None
            out.append(Block(page, start + 1, m.group(1), code, not_run=why))
        mark = None
    return out


def _masked(text: str) -> list[str]:
    return [re.sub(r"\d+(\.\d+)?", "#", line).rstrip() for line in text.strip().splitlines()]


def test_the_block_reader_and_the_output_check(tmp_path):  # negative control: the page tests could fail
    page = tmp_path / "page.md"
    page.write_text(
        "x\n\n```python\nprint(1)\n```\n<!-- prints -->\n```text\n7\n```\n\n<!-- not run: needs a TPU -->\n"
        "```python\nimport tpu\n```\n```bash\njaxspec generate x\n```\n"
    )
    found = blocks(page)
    assert [(b.lang, b.line, b.prints, b.not_run) for b in found] == [
        ("python", 3, "7\n", None),
        ("python", 12, None, "needs a TPU"),
        ("bash", 15, None, None),
    ]
    assert _masked("speculative, 128 tokens, α=0.612") == _masked("speculative, 64 tokens, α=0.5")
    assert _masked("speculative, 128 tokens") != _masked("plain, 128 tokens")
    # what a block takes from the blocks before it: read before bound, in evaluation order
    assert _reads("x = x + 1\nimport a\ny = a.f(z)\nfor i in y: n += i\ndef g(): return w\n") == {"x", "z", "n", "w"}


def test_the_notebook_runner_runs_cells_in_order_and_could_fail(tmp_path, monkeypatch):
    import nbformat

    def notebook(*cells):
        path = tmp_path / "n.ipynb"
        nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells]), path)
        return path

    _run_notebook(notebook("x = 'α'", "print('backend', x)"), monkeypatch)  # the second cell reads the first's x
    for cells, error in (
        (["print('backend')"], AssertionError),  # no α reported
        (["print('backend α')", "%time 1"], AssertionError),  # IPython syntax
        (["print('backend α')", "1 / 0"], ZeroDivisionError),
    ):
        with pytest.raises(error):
            _run_notebook(notebook(*cells), monkeypatch)


def _python_pages() -> list[Path]:
    return [p for p in PAGES if any(b.lang == "python" for b in blocks(p))]


def _reads(source: str) -> set[str]:
    """The names a block may read before it binds them (what it takes from the blocks before it), visited in the
    order Python evaluates them (an assignment's value before its targets); names bound inside functions count as
    bound, which only matters for a name a later top-level line reads."""
    first: dict[str, bool] = {}  # name -> whether its first use binds it

    def use(name: str, binds: bool) -> None:
        first.setdefault(name, binds)

    def visit(node) -> None:
        if isinstance(node, ast.Name):
            use(node.id, not isinstance(node.ctx, ast.Load))
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            if node.value is not None:
                visit(node.value)
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                visit(target)
        elif isinstance(node, ast.AugAssign):
            if isinstance(node.target, ast.Name):
                use(node.target.id, False)
            visit(node.value)
            visit(node.target)
        elif isinstance(node, (ast.For, ast.AsyncFor)):
            visit(node.iter)
            visit(node.target)
            for child in node.body + node.orelse:
                visit(child)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                use((alias.asname or alias.name).split(".")[0], True)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            use(node.name, True)
            for child in ast.iter_child_nodes(node):
                visit(child)
        else:
            for child in ast.iter_child_nodes(node):
                visit(child)

    visit(ast.parse(source))
    return {name for name, binds in first.items() if not binds}


def _run_page(page: Path, monkeypatch, ran: dict | None = None) -> None:
    """Run ``page``'s Python blocks in order in one namespace. ``ran``: what the blocks run so far (on earlier
    pages) printed, by their code and the objects they were given: a block whose code is exactly an earlier one's
    and whose names are bound to the very same objects (the shared loads of ``_shared_loads``) computes the same
    thing, so it is not run again: the names it bound are bound here too, and what it says it prints is checked
    against what the first one printed."""
    module = types.ModuleType("__example__")  # a real module: dataclasses look their class's module up
    monkeypatch.setitem(sys.modules, module.__name__, module)
    namespace = module.__dict__
    ran = {} if ran is None else ran
    for block in [b for b in blocks(page) if b.lang == "python"]:
        if block.not_run:
            assert (str(block.page.relative_to(ROOT)), block.code.splitlines()[0]) in NOT_RUN, (
                f"{block.name} is marked not run ({block.not_run}): name it in NOT_RUN with its reason"
            )
            continue
        # dont_inherit: the block runs under its own future imports, not this file's
        code = compile(block.code, block.name, "exec", dont_inherit=True)
        given = [(n, namespace[n]) for n in sorted(_reads(block.code)) if n in namespace]
        key = (block.code, tuple((n, id(v)) for n, v in given))
        if key in ran:
            printed, bound, _ = ran[key]
            namespace.update(bound)  # what it defined, for the blocks after it
        else:
            before, out = dict(namespace), io.StringIO()
            with contextlib.redirect_stdout(out):
                exec(code, namespace)  # noqa: S102
            printed = out.getvalue()
            bound = {n: v for n, v in namespace.items() if n not in before or before[n] is not v}
            ran[key] = (printed, bound, given)  # the objects stay alive, so their ids are not reused
        if block.prints is not None:
            assert _masked(printed) == _masked(block.prints), (block.name, printed)


def _shared_loads(monkeypatch) -> None:
    """``jaxspec.load`` and ``jaxspec.eagle.load`` called again with the same arguments return the model or head
    the first call loaded (they are immutable), as one session of a user's would keep it, instead of reading the
    file again."""
    import jaxspec

    for owner in (jaxspec, jaxspec.eagle):
        loaded: dict = {}

        def load(*args, _load=owner.load, _loaded=loaded, **kwargs):
            key = repr([a if isinstance(a, (str, Path)) else id(a) for a in args]) + repr(sorted(kwargs.items()))
            if key not in _loaded:
                _loaded[key] = (_load(*args, **kwargs), args)  # the args stay alive, so their ids are not reused
            return _loaded[key][0]

        monkeypatch.setattr(owner, "load", load)


def run_all_pages(work: Path | str) -> None:
    """Every page in one process, each in its own namespace and directory under ``work``: pages that run the same
    model at the same shapes share its compiled programs, and loads and blocks that repeat an earlier page's share
    its result (``_shared_loads``, ``_run_page``), as a user's session would."""
    work = Path(work)
    with pytest.MonkeyPatch.context() as monkeypatch:
        _shared_loads(monkeypatch)
        ran: dict = {}
        for page in _python_pages():
            directory = work / page.stem
            directory.mkdir()
            monkeypatch.chdir(directory)  # examples that write files write them here
            _run_page(page, monkeypatch, ran)
        for notebook in NOTEBOOKS:
            directory = work / notebook.stem
            directory.mkdir()
            monkeypatch.chdir(directory)
            _run_notebook(notebook, monkeypatch)


# Notebooks on the real model run here too, after the pages, whose loads and compiled programs they share (in a
# Jupyter kernel of their own they took 36 s of the suite): their code cells in order, in one namespace, as the
# kernel runs them. acceptance.ipynb (the toy pair) runs in a kernel: tests/integration/test_notebooks.py.
NOTEBOOKS = [ROOT / "notebooks" / "quickstart.ipynb"]


def _run_notebook(path: Path, monkeypatch) -> None:
    """Run the code cells of the notebook at ``path`` in order in one namespace (valid nbformat, no IPython magics
    or shell escapes); what they print must name the backend and report α."""
    import nbformat

    notebook = nbformat.read(path, as_version=4)
    nbformat.validate(notebook)
    module = types.ModuleType("__notebook__")
    monkeypatch.setitem(sys.modules, module.__name__, module)
    out = io.StringIO()
    for n, cell in enumerate(c for c in notebook.cells if c.cell_type == "code"):
        lines = [line.strip() for line in cell.source.splitlines()]
        assert not any(line[:1] in ("%", "!") for line in lines), f"{path.name} cell {n}: IPython syntax"
        code = compile(cell.source, f"{path.name}:cell{n}", "exec", dont_inherit=True)
        with contextlib.redirect_stdout(out):
            exec(code, module.__dict__)  # noqa: S102
    printed = out.getvalue()
    assert "α" in printed and "backend" in printed, printed[-3000:]


@pytest.mark.real
@pytest.mark.slow
def test_python_examples_run_as_written(tmp_path):
    """``run_all_pages`` in a process of its own with optimised programs (``helpers.run_optimised``) rather than the
    suite's cheapest (tests/conftest.py): these examples decode the real model for hundreds of tokens. Eight
    simulated CPU devices, as the suite has, for the sharding examples."""
    done = run_optimised(Path(__file__).parent, "test_examples", "run_all_pages", str(tmp_path))
    assert done.returncode == 0, done.stderr[-6000:]


def _commands(page: Path) -> list[tuple[str, list[str]]]:
    """``(where, argv)`` of every jaxspec command line in the bash blocks of ``page`` (continuations joined)."""
    found = []
    for block in blocks(page):
        if block.lang != "bash" or block.not_run:
            continue
        text = block.code.replace("\\\n", " ")
        for n, line in enumerate(text.splitlines()):
            line = line.split(" #")[0].strip()
            for part in line.split("&&"):
                argv = shlex.split(part.strip())
                if argv[:1] == ["jaxspec"] or argv[:3] == ["python", "-m", "jaxspec.bench"]:
                    found.append((f"{block.name}+{n}", argv))
    return found


COMMANDS = [c for p in PAGES for c in _commands(p)]


def test_there_are_commands_to_check():
    assert len(COMMANDS) >= 10, COMMANDS


@pytest.mark.parametrize("where, argv", COMMANDS, ids=[w for w, _ in COMMANDS])
def test_command_lines_parse(where, argv):
    from jaxspec import cli
    from jaxspec.bench.__main__ import parse_args as bench_args
    from jaxspec.cli import distill, train

    if argv[0] == "python":  # python -m jaxspec.bench ...
        bench_args(argv[3:])
        return
    command, rest = argv[1] if len(argv) > 1 else "", argv[2:]
    if command == "bench":
        bench_args(rest)
    elif command == "distill":
        distill.build_parser().parse_args(rest)
    elif command == "train":
        train.build_parser().parse_args(rest)
    else:
        cli.build_parser().parse_args(argv[1:])
