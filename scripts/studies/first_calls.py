"""First-call times of SmolLM2-135M-Instruct, each in a fresh process: cold (an empty compilation cache directory,
so every program compiles and ``gamma="auto"`` times its standalone steps) and warm (the same directory again: the
programs and auto's measured costs are loaded).

    python scripts/studies/first_calls.py [--modes plain,head,head-auto,lookup] [--repeats 2] [--prompt N]

One HumanEval chat prompt (problem N), 64 new tokens, batch 1, greedy. Per mode and repeat: cold then warm, modes
taken in turn. Prints, per process, the load (dequantize and place), the compile figure the call reports
(``stats.compile_time_s``) and the whole first call; then the median per mode.

A one-off measurement, not a test: its figures are recorded in docs/history/cpu-costs.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

CHILD = r"""
import json, sys, time
mode, cache, prompt_index = sys.argv[1], sys.argv[2], int(sys.argv[3])
import jaxspec
from jaxspec.bench import humaneval
jaxspec.enable_compilation_cache(cache)
start = time.perf_counter()
target = jaxspec.load("smollm2-135m-instruct")
head = jaxspec.eagle.load("jaxspec/smollm2-eagle3", target) if mode.startswith("head") else None
load_s = time.perf_counter() - start
prompt = humaneval.prompt_ids(target, humaneval.load_problems(prompt_index + 1))[prompt_index]
kwargs = {
    "plain": dict(draft=None),
    "head": dict(draft=head, gamma=2),
    "head-auto": dict(draft=head, gamma="auto"),
    "lookup": dict(draft="prompt_lookup", gamma=4),
}[mode]
start = time.perf_counter()
res = jaxspec.generate(target, [prompt], max_new_tokens=64, temperature=0.0, **kwargs)
call_s = time.perf_counter() - start
policy = res.stats.policy or {}
print(json.dumps(dict(load_s=load_s, compile_s=res.stats.compile_time_s, call_s=call_s, gamma=res.stats.gamma,
                      reason=policy.get("reason"))))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modes", default="plain,head,head-auto,lookup")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=0, help="HumanEval problem index")
    args = ap.parse_args()
    modes = args.modes.split(",")
    env = {**os.environ, "JAXSPEC_COMPILATION_CACHE": "off"}  # the child turns its own directory on
    rows = {(m, w): [] for m in modes for w in ("cold", "warm")}
    for r in range(args.repeats):
        for mode in modes:
            with tempfile.TemporaryDirectory() as cache:
                for which in ("cold", "warm"):
                    out = subprocess.run(
                        [sys.executable, "-c", CHILD, mode, cache, str(args.prompt)],
                        env=env,
                        capture_output=True,
                        text=True,
                        check=True,
                    )
                    row = json.loads(out.stdout.strip().splitlines()[-1])
                    rows[(mode, which)].append(row)
                    why = f"; {row['reason']}" if row["reason"] else ""
                    print(
                        f"repeat {r} {mode:9s} {which}: load {row['load_s']:.1f} s, compile {row['compile_s']:.1f} s, "
                        f"first call {row['call_s']:.1f} s (γ {row['gamma']}{why})",
                        flush=True,
                    )
    print("\nmedians: mode, cold compile / call, warm compile / call, load")
    for mode in modes:
        cold, warm = rows[(mode, "cold")], rows[(mode, "warm")]

        def med(rs, k):
            return statistics.median(r[k] for r in rs)

        print(
            f"{mode:9s} cold {med(cold, 'compile_s'):.1f} / {med(cold, 'call_s'):.1f} s, "
            f"warm {med(warm, 'compile_s'):.1f} / {med(warm, 'call_s'):.1f} s, load {med(cold + warm, 'load_s'):.1f} s"
        )


if __name__ == "__main__":
    main()
