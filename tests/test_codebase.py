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
