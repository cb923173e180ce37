"""Regenerate the README's measured figures from the commands that make them.

    python scripts/tools/readme_figures.py main-job             # runs the README's main job (a few minutes)
    python scripts/tools/readme_figures.py humaneval --json F   # renders a HumanEval bench run (F from --json)
    python scripts/tools/readme_figures.py humaneval --run      # runs that bench first (about 25 min on 2 cores)
    python scripts/tools/readme_figures.py check                # every figure block names its command

Each figure block of README.md sits between ``<!-- figures: NAME -->`` and ``<!-- /figures -->``; this script
replaces what is between them, with a line naming the command and the machine it ran on (git's history says when).
Run it on a quiet machine: the speed-ups are ratios of interleaved passes, but a busy machine still moves them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"

MAIN_JOB = (
    "jaxspec generate --input checkpoints/chat_prompts.jsonl --output out.jsonl --batch-size 1 --max-new-tokens 64 "
    "--compare --plot acceptance.png"
)
HUMANEVAL = (
    "python -m jaxspec.bench --humaneval --humaneval-modes plain,eagle,eagle-auto,lookup --eagle-gamma 3 --gamma 4 "
    "--batches 1 --temperatures 0 --max-new-tokens 64 --step-iters 3 --ttft --json bench.json --prompts-out ids.jsonl"
)
BLOCK = re.compile(r"(<!-- figures: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- /figures -->)", re.S)


def machine() -> str:
    """``N-core CPU model, jax X`` (the backend and its device when it is not the CPU), from
    ``jaxspec.bench.measure.machine``."""
    import jax

    from jaxspec.bench.measure import machine as host_machine

    host = host_machine()
    cpu = host.get("cpu") or platform.processor() or platform.machine()
    device = "" if host["backend"] == "cpu" else f", {jax.devices()[0].device_kind}"
    return f"{host.get('cpu_cores') or os.cpu_count()}-core {cpu}{device}, jax {host['jax']}"


def replace_block(text: str, name: str, body: str) -> str:
    """``text`` with the figure block ``name``'s body replaced by ``body``; ``KeyError`` if there is none."""
    for m in BLOCK.finditer(text):
        if m.group("name") == name:
            return text[: m.start("body")] + body.rstrip("\n") + "\n" + text[m.end("body") :]
    raise KeyError(f"README.md has no <!-- figures: {name} --> block")


def main_job_body(records: list[dict], seconds: float) -> str:
    """The main job's figure block: its command, the run, and the per-category table the job prints."""
    from jaxspec.cli.records import summary_table

    head = (
        f"Measured with the command above on a {machine()}, nothing else running: {len(records)} records in "
        f"{seconds / 60:.1f} min (loading, compiling into an empty compilation cache, both passes; the model already "
        "fetched):"
    )
    return "\n".join(textwrap.wrap(head, 116)) + f"\n\n```text\n{summary_table(records)}\n```\n"


def humaneval_body(doc: dict) -> str:
    """The HumanEval table from a ``python -m jaxspec.bench --humaneval --json`` document."""
    rows = doc["rows"]
    by = {(r["temperature"], r["batch"], r["mode"]): r for r in rows}
    keys = sorted({(r["temperature"], r["batch"]) for r in rows})

    def f(x, spec):
        return "-" if x is None else format(x, spec)

    gamma = next((r["gamma"] for r in rows if r["mode"] == "eagle"), None)
    out = [
        f'| T | batch | plain tok/s | head γ = {gamma}: α, τ, round | head vs plain (bound) | `gamma="auto"` (choices) '
        "| prompt lookup γ = 4: α, τ | lookup vs plain |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for t, b in keys:
        plain, head = by.get((t, b, "plain")), by.get((t, b, "eagle"))
        auto, look = by.get((t, b, "eagle-auto")), by.get((t, b, "lookup"))
        cells = [f"{t:g}", str(b), f((plain or {}).get("tok_s"), ".1f")]
        cells.append("-" if head is None else f"{f(head['alpha'], '.3f')}, {head['tau']:.2f}, {head['round_cost']:.2f}")
        cells.append("-" if head is None else f"{head['ratio']:.2f}× ({f(head.get('bound'), '.2f')})")
        if auto is None:
            cells.append("-")
        else:
            picked = ", ".join(f"{k} ×{n}" for k, n in sorted(auto.get("auto_choices", {}).items()))
            cells.append(f"{auto['ratio']:.2f}× ({picked})")
        cells.append("-" if look is None else f"{f(look['alpha'], '.3f')}, {look['tau']:.2f}")
        cells.append("-" if look is None else f"{look['ratio']:.2f}×")
        out.append("| " + " | ".join(cells) + " |")
    heads = [by[k] for k in sorted(by) if k[2] == "eagle" and by[k].get("c") is not None]
    costs = ""
    if heads:
        c = span([r["c"] for r in heads], ".3f")
        v = span([r["v"] for r in heads], ".2f")
        costs = (
            f"\nHead c {c} (a head step ÷ a target step), v {v} (a verify pass over γ + 1 tokens ÷ a target step);\n"
            "round = a round's cost in plain steps; bound = τ/(γc+v).\n"
        )
    phases = []  # --ttft: the first token and the decode phase after it, by mode
    for t, b in keys:
        timed = [
            (name, by.get((t, b, m))) for name, m in (("plain", "plain"), ("the head", "eagle"), ("lookup", "lookup"))
        ]
        timed = [(name, r) for name, r in timed if r and r.get("decode_ratio") is not None]
        if len(timed) > 1:
            first = ", ".join(f"{name} {1e3 * r['ttft_s']:.0f} ms" for name, r in timed)
            after = ", ".join(f"{name} {r['decode_ratio']:.2f}×" for name, r in timed if name != "plain")
            lead = f"At T = {t:g}, batch {b}: first token" if len(keys) > 1 else "First token"
            phases.append(
                f"{lead} {first} a call (the prompt's prefill; a speculative mode's first round too); "
                f"the decode phase after it vs plain's: {after}."
            )
    phase = ("\n".join(textwrap.wrap(" ".join(phases), 116)) + "\n") if phases else ""
    intro = f"One run on a {machine()}, nothing else running, with the command above:\n\n"
    return intro + "\n".join(out) + "\n" + costs + phase


def span(values: list[float], spec: str) -> str:
    """``low–high`` of ``values`` formatted with ``spec``; one figure when they agree at that precision."""
    low, high = format(min(values), spec), format(max(values), spec)
    return low if low == high else f"{low}–{high}"


def _run(command: str, cwd: Path, env: dict | None = None) -> float:
    start = time.perf_counter()
    subprocess.run(shlex.split(command), cwd=cwd, check=True, env=None if env is None else {**os.environ, **env})
    return time.perf_counter() - start


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=["main-job", "humaneval", "check"])
    ap.add_argument("--json", type=Path, help="humaneval: a bench --json document to render")
    ap.add_argument("--run", action="store_true", help="humaneval: run the bench first")
    ap.add_argument("--readme", type=Path, default=README)
    args = ap.parse_args(argv)
    text = args.readme.read_text()
    if args.what == "check":
        names = [m.group("name") for m in BLOCK.finditer(text)]
        missing = [n for n in ("main-job", "humaneval") if n not in names]
        if missing:
            print(f"README.md lacks the figure blocks {missing}", file=sys.stderr)
            return 1
        print(f"figure blocks: {names}")
        return 0
    if args.what == "main-job":
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "out.jsonl"
            command = MAIN_JOB.replace("out.jsonl", str(out)).replace("acceptance.png", f"{tmp}/a.png")
            # a first run's compiles: an empty compilation cache (the fetched model file is kept)
            seconds = _run(command, ROOT, {"JAXSPEC_COMPILATION_CACHE": f"{tmp}/xla"})
            records = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
        text = replace_block(text, "main-job", main_job_body(records, seconds))
    else:
        path = args.json
        if args.run:
            path = path or Path(tempfile.mkdtemp()) / "bench.json"
            _run(
                HUMANEVAL.replace("bench.json", str(path)).replace("ids.jsonl", str(path.with_suffix(".ids.jsonl"))),
                ROOT,
            )
        if path is None:
            ap.error("humaneval needs --json FILE (from the bench's --json) or --run")
        text = replace_block(text, "humaneval", humaneval_body(json.loads(path.read_text())))
    args.readme.write_text(text)
    print(f"updated {args.readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
