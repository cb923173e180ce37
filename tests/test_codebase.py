"""Habits of the codebase that a linter does not check: no private name of one jaxspec module used by another
(a private name another module needs is a sign of a missing public helper)."""

from __future__ import annotations

import ast
from pathlib import Path

import jaxspec

PACKAGE = Path(jaxspec.__file__).parent


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def private_uses(source: str) -> list[str]:
    """Uses in ``source`` of a private name of a jaxspec module: ``from jaxspec.x import _y`` and ``x._y`` where
    ``x`` was imported from jaxspec (``import jaxspec.x as x``, ``from jaxspec import x``, ``jaxspec.x._y``)."""
    tree = ast.parse(source)
    modules, found = {"jaxspec"}, []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "jaxspec":
            for alias in node.names:
                if _private(alias.name):
                    found.append(f"line {node.lineno}: from {node.module} import {alias.name}")
                else:
                    modules.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "jaxspec":
                    modules.add(alias.asname or alias.name.split(".")[0])
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            base = node.value
            while isinstance(base, ast.Attribute):
                base = base.value
            if isinstance(base, ast.Name) and base.id in modules:
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def test_the_checker_finds_private_uses():  # negative control: the test below could fail
    assert private_uses("from jaxspec.hf import _get, load\n") == ["line 1: from jaxspec.hf import _get"]
    assert private_uses("from jaxspec import generate\ngenerate._tokenize(m, p)\n") == ["line 2: generate._tokenize"]
    assert private_uses("import jaxspec.loop\njaxspec.loop._draft\n") == ["line 2: jaxspec.loop._draft"]
    assert private_uses("from jaxspec import loop\nloop.round_step\nself._x\nloop.__name__\n") == []


def test_no_private_name_is_used_across_modules():
    found = {
        str(path.relative_to(PACKAGE)): uses
        for path in sorted(PACKAGE.rglob("*.py"))
        if (uses := private_uses(path.read_text()))
    }
    assert not found, f"private names used across modules (give them a public home): {found}"


# The packages in the order data flows, each importing only those before it (its own modules included). The root's
# __init__ (the public API) sits above the implementation; bench and the command line use it.
LAYERS = (
    "version",
    "core",
    "parallel",
    "models",
    "formats",
    "drafters",
    "loop",
    "policy",
    "generation",
    "training",
    "__init__",
    "bench",
    "cli",
)
ROOT_MODULES = {"__init__.py", "version.py"}


def layer_of(module: str) -> str:
    """``jaxspec.loop.state`` -> ``loop``; ``jaxspec`` -> ``__init__``; ``jaxspec.version`` -> ``version``."""
    parts = module.split(".")
    return "__init__" if len(parts) == 1 else parts[1]


def imports_of(module: str, source: str, is_module) -> set[str]:
    """The jaxspec modules ``source`` (the code of ``module``) imports, at module level or inside functions alike.
    ``from jaxspec.p import name`` counts as importing ``jaxspec.p.name`` when that is a module (``is_module``), else
    ``jaxspec.p``."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "jaxspec")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] != "jaxspec":
                continue
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if is_module(sub) else node.module)
    found.discard(module)
    return found


def layering_violations(sources: dict[str, str]) -> tuple[list[str], list[list[str]]]:
    """``(upward, circles)`` over ``sources`` (module name -> code): imports of a later layer than the importer's,
    and sets of modules that import each other in a loop (strongly connected components of more than one)."""
    order = {name: i for i, name in enumerate(LAYERS)}
    graph = {m: imports_of(m, src, sources.__contains__) for m, src in sources.items()}
    upward = [
        f"{m} ({layer_of(m)}) imports {t} ({layer_of(t)})"
        for m, targets in sorted(graph.items())
        for t in sorted(targets)
        if order.get(layer_of(t), len(LAYERS)) > order.get(layer_of(m), -1)
    ]
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return upward, circles


def package_sources() -> dict[str, str]:
    sources = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        sources[name] = path.read_text()
    return sources


def test_the_layering_check_finds_upward_imports_and_circles():  # negative control: the test below could fail
    sources = {
        "jaxspec": "from jaxspec.generation import engine\n",
        "jaxspec.core.model": "def f():\n    from jaxspec.loop import rounds\n",  # hidden inside a function
        "jaxspec.loop.rounds": "from jaxspec.core import model\n",
        "jaxspec.drafters.a": "from jaxspec.drafters.b import x\n",
        "jaxspec.drafters.b": "import jaxspec.drafters.a\n",
        "jaxspec.generation.engine": "import jaxspec\nfrom jaxspec import loop\n",
    }
    upward, circles = layering_violations(sources)
    assert upward == [
        "jaxspec.core.model (core) imports jaxspec.loop.rounds (loop)",
        "jaxspec.generation.engine (generation) imports jaxspec (__init__)",
    ]
    assert sorted(circles) == [
        ["jaxspec", "jaxspec.generation.engine"],
        ["jaxspec.core.model", "jaxspec.loop.rounds"],
        ["jaxspec.drafters.a", "jaxspec.drafters.b"],
    ]
    assert layering_violations({"jaxspec.loop.rounds": "from jaxspec.core import model\n"}) == ([], [])


def test_packages_import_only_the_layers_below_them():
    sources = package_sources()
    assert {layer_of(m) for m in sources} <= set(LAYERS), "a package missing from LAYERS"
    upward, circles = layering_violations(sources)
    assert not upward, f"imports that run up the layers ({' < '.join(LAYERS)}): {upward}"
    assert not circles, f"modules that import each other in a loop: {circles}"


def test_the_package_root_holds_only_the_public_api():
    assert {p.name for p in PACKAGE.glob("*.py")} == ROOT_MODULES


def function_level_imports(source: str) -> list[str]:
    """Imports of jaxspec made inside a function or method of ``source`` (``line N: import ...``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for inner in ast.walk(node):
            if isinstance(inner, ast.Import) and any(a.name.split(".")[0] == "jaxspec" for a in inner.names):
                found.append(f"line {inner.lineno}: {ast.unparse(inner)}")
            elif isinstance(inner, ast.ImportFrom) and inner.module and inner.module.split(".")[0] == "jaxspec":
                found.append(f"line {inner.lineno}: {ast.unparse(inner)}")
    return sorted(set(found))


def test_the_checker_finds_imports_inside_functions():  # negative control: the test below could fail
    source = "import jaxspec\n\ndef f():\n    from jaxspec.loop import rounds\n    import numpy\n"
    assert function_level_imports(source) == ["line 4: from jaxspec.loop import rounds"]
    assert function_level_imports("from jaxspec import loop\n\ndef f():\n    return loop\n") == []


def test_jaxspec_is_imported_at_module_level_only():
    """An import inside a function hides a dependency from the layering check's reader and is the usual way to dodge
    a circle; the forwarded subcommands (``jaxspec.cli.FORWARDED``) are the one on-use import, by module name."""
    found = {
        str(path.relative_to(PACKAGE)): uses
        for path in sorted(PACKAGE.rglob("*.py"))
        if (uses := function_level_imports(path.read_text()))
    }
    assert not found, f"jaxspec imported inside functions (import at the top of the module): {found}"


def test_the_suites_longest_files_exist():
    """conftest.LONGEST schedules these files first; a moved file would silently drop out of it."""
    from conftest import LONGEST

    for path in LONGEST:
        assert (PACKAGE.parent / path).is_file(), path
