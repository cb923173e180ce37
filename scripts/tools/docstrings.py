"""List public definitions in jaxspec/ that have no docstring.

Walks every ``.py`` file under the package with ``ast`` (nothing is imported) and reports, per file:

- public module-level functions and classes (name without a leading underscore) lacking a docstring;
- public methods of those public classes (no leading underscore, so dunders such as ``__init__`` are not
  counted) lacking a docstring, counted separately.

Usage: ``python scripts/tools/docstrings.py [PATH ...] [-v]``. Each PATH is a ``.py`` file or a directory walked for
them; the default is the ``jaxspec`` package of this checkout. ``-v`` also prints the missing names with their line
numbers. The exit status is always 0: this is a report, not a gate.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def missing(tree: ast.Module) -> tuple[int, list[str], int, list[str]]:
    """Return (public top-level count, missing top-level, public method count, missing methods) for one module."""
    top, top_missing, meth, meth_missing = 0, [], 0, []
    for node in tree.body:
        if not isinstance(node, DEFS) or node.name.startswith("_"):
            continue
        top += 1
        if ast.get_docstring(node) is None:
            top_missing.append(f"{node.name}:{node.lineno}")
        if isinstance(node, ast.ClassDef):
            for sub in node.body:
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)) and not sub.name.startswith("_"):
                    meth += 1
                    if ast.get_docstring(sub) is None:
                        meth_missing.append(f"{node.name}.{sub.name}:{sub.lineno}")
    return top, top_missing, meth, meth_missing


def main(argv: list[str]) -> None:
    verbose = "-v" in argv
    args = [a for a in argv if a != "-v"]
    roots = [Path(a) for a in args] or [Path(__file__).resolve().parents[2] / "jaxspec"]
    files = sorted({f for r in roots for f in ([r] if r.is_file() else r.rglob("*.py"))})
    totals = [0, 0, 0, 0]
    print(f"{'file':40s} {'defs':>5s} {'undoc':>5s} {'meths':>5s} {'undoc':>5s}")
    for path in files:
        top, top_missing, meth, meth_missing = missing(ast.parse(path.read_text(), filename=str(path)))
        row = (top, len(top_missing), meth, len(meth_missing))
        totals = [t + r for t, r in zip(totals, row)]
        print(f"{_shown(path):40s} {row[0]:5d} {row[1]:5d} {row[2]:5d} {row[3]:5d}")
        if verbose:
            for name in top_missing + meth_missing:
                print(f"    {name}")
    print(f"{'total':40s} {totals[0]:5d} {totals[1]:5d} {totals[2]:5d} {totals[3]:5d}")
    print(
        f"public definitions without a docstring: {totals[1]} of {totals[0]}; "
        f"public methods of public classes: {totals[3]} of {totals[2]}"
    )


def _shown(path: Path) -> str:
    """``path`` relative to the working directory when it is below it, else as given."""
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


if __name__ == "__main__":
    main(sys.argv[1:])
