"""Cold compiles of a 24-prompt job: how many programs compile, and for how long, when SmolLM2-135M-Instruct
generates 64 new tokens for each of ``checkpoints/chat_prompts.jsonl`` at batch 1, through the batch job
(``jaxspec generate --input ... --batch-size 1``) or through one ``jaxspec.generate`` call per prompt.

    python scripts/studies/job_compiles.py {cli,generate} {plain,fixed,auto} [CACHE_DIR]

plain: no draft; fixed: the EAGLE head ``jaxspec/smollm2-eagle3`` at its default γ (the CLI's default drafter);
auto: the head with ``gamma="auto"``. Greedy, chat template. The persistent compilation cache points at a new empty
directory (so every program compiles; the job itself may load nothing). Counted: every XLA backend compile
(``jax.monitoring``'s ``/jax/core/compile/backend_compile_duration`` events: their number and seconds), those over
1 s (the programs that hold the model), and the entries JAX wrote into the empty cache directory (one per program
that took at least 0.1 s). Run from the repository root, once per (way, mode), each in its own process.

A one-off measurement, not a test: its figures are recorded in docs/history/cpu-costs.md.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

WHAT, MODE = sys.argv[1], sys.argv[2]
# a third argument: that cache directory (run once into an empty one, then again into the filled one: the second
# run's wall time, less the first's, is what the first job paid for compiling and the policy's calibration)
CACHE = sys.argv[3] if len(sys.argv) > 3 else tempfile.mkdtemp(prefix=f"jaxspec-xla-{WHAT}-{MODE}-")
os.environ["JAXSPEC_COMPILATION_CACHE"] = CACHE

import jax  # noqa: E402
import jax.monitoring  # noqa: E402

EVENTS: list[tuple[str, float]] = []
jax.monitoring.register_event_duration_secs_listener(lambda name, seconds, **kw: EVENTS.append((name, seconds)))

import jaxspec  # noqa: E402
from jaxspec import cli  # noqa: E402

PROMPTS = "checkpoints/chat_prompts.jsonl"


def main() -> None:
    start = time.perf_counter()
    tokens = 0
    if WHAT == "cli":
        out = CACHE + ".jsonl"
        argv = ["generate", "--input", PROMPTS, "--output", out, "--batch-size", "1", "--max-new-tokens", "64"]
        argv += {"plain": ["--draft", "none"], "fixed": [], "auto": ["--gamma", "auto"]}[MODE] + ["--no-progress"]
        assert cli.main(argv) == 0
        with open(out) as f:
            tokens = sum(json.loads(line)["new_tokens"] for line in f)
    else:
        jaxspec.enable_compilation_cache(CACHE)  # what a process that chose nothing gets by default
        target = jaxspec.load("smollm2-135m-instruct")
        head = jaxspec.eagle.load("jaxspec/smollm2-eagle3", target)
        kw = {"plain": dict(draft=None), "fixed": dict(draft=head), "auto": dict(draft=head, gamma="auto")}[MODE]
        with open(PROMPTS) as f:
            prompts = [json.loads(line)["prompt"] for line in f]
        for prompt in prompts:
            result = jaxspec.generate(target, [prompt], max_new_tokens=64, temperature=0.0, chat=True, **kw)
            tokens += result.stats.generated_tokens
    compiles = [s for name, s in EVENTS if name == "/jax/core/compile/backend_compile_duration"]
    big = sorted((s for s in compiles if s > 1.0), reverse=True)
    entries = sorted(n.rsplit("-", 2)[0] for n in os.listdir(CACHE) if n.endswith("-cache"))
    doc = {
        "way": WHAT,
        "mode": MODE,
        "backend_compiles": len(compiles),
        "compile_s": round(sum(compiles), 1),
        "programs_over_1s": len(big),
        "their_s": [round(s, 1) for s in big],
        "cache_entries": len(entries),
        "entry_names": entries,
        "tokens": tokens,
        "wall_s": round(time.perf_counter() - start, 1),
    }
    print("RESULT", json.dumps(doc), flush=True)


if __name__ == "__main__":
    main()
