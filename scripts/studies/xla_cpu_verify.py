"""Why a verify pass over 5 tokens costs 1.6-1.7 steps of SmolLM2-135M-Instruct on XLA:CPU.

    python scripts/studies/xla_cpu_verify.py

Prints

- the real model's forward (float32, batch 1, cache 512, layers split) over 1, 2, 3, 5 and 7 tokens, each a
  ratio to 1 token;
- a profile of the 1- and 5-token passes: XLA:CPU's thunks (one per fused op) from ``jax.profiler``'s trace,
  summed by kind (``dot``, ``ynn_fusion``, copies, ...), in ms per call and count per call (the profiler slows
  every thunk a little: compare kinds, not totals);
- a chain of 30 gate/down matmuls of the model's MLP shapes (576 x 1536, 1536 x 576) at M = 1..32 rows: how the
  cost of a matmul grows with its rows once M > 1.

A one-off measurement, not a test: its figures are recorded in docs/history/cpu-costs.md.
"""

from __future__ import annotations

import collections
import glob
import gzip
import json
import re
import tempfile

import jax
import jax.numpy as jnp
from xla_cpu_step import _median_ms  # scripts/studies/ is on the path when run as a script

import jaxspec


def median_ms(fn, *args, reps: int = 20) -> float:
    """Median ms of ``fn(*args)`` after 8 untimed calls (compile and settle: a fresh executable's first calls run
    slow on this CPU)."""
    return _median_ms(fn, *args, n=reps, warmup=8)


def thunk_profile(fn, *args, calls: int = 10) -> dict:
    """``{kind: (ms per call, count per call)}`` of XLA:CPU's thunks over ``calls`` calls of ``fn``."""
    for _ in range(5):
        jax.block_until_ready(fn(*args))
    with tempfile.TemporaryDirectory() as tmp:
        with jax.profiler.trace(tmp, create_perfetto_trace=True):
            for _ in range(calls):
                jax.block_until_ready(fn(*args))
        (path,) = glob.glob(f"{tmp}/**/perfetto_trace.json.gz", recursive=True)
        with gzip.open(path) as f:
            trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    skip = ("$", "Thunk", "Pjit", "Parse", "Common", "Slinky", "end:", "Handle")
    total, count = collections.Counter(), collections.Counter()
    for e in events:
        if e.get("ph") == "X" and not e["name"].startswith(skip):
            kind = re.sub(r"\.\d+$", "", e["name"])
            total[kind] += e.get("dur", 0)
            count[kind] += 1
    return {k: (total[k] / calls / 1e3, count[k] // calls) for k, _ in total.most_common(8)}


def main() -> None:
    target = jaxspec.load("smollm2-135m-instruct")
    cache = target.init_cache(1, 512)
    forward = jax.jit(target.apply_fn)

    def inputs(n):
        return target.params, jnp.zeros((1, n), jnp.int32), jnp.arange(200, 200 + n, dtype=jnp.int32)[None], cache

    one = median_ms(forward, *inputs(1))
    print(f"SmolLM2 forward, batch 1, cache 512: 1 token {one:.1f} ms")
    for n in (2, 3, 5, 7):
        ms = median_ms(forward, *inputs(n))
        print(f"  {n} tokens {ms:.1f} ms = {ms / one:.2f} steps")
    for n in (1, 5):
        profile = thunk_profile(forward, *inputs(n))
        print(
            f"thunks of the {n}-token pass (ms per call, count): "
            + ", ".join(f"{k} {ms:.2f} ms x{c}" for k, (ms, c) in profile.items())
        )

    layers = 30
    key = jax.random.key(0)
    gate = [jax.random.normal(jax.random.fold_in(key, i), (576, 1536)) for i in range(layers)]
    down = [jax.random.normal(jax.random.fold_in(key, 100 + i), (1536, 576)) for i in range(layers)]

    @jax.jit
    def chain(x, gate, down):
        for g, d in zip(gate, down):
            x = (jnp.tanh(x @ g) @ d) * 0.01
        return x

    base = median_ms(chain, jnp.ones((1, 576)), gate, down, reps=100)
    row = [f"M=1 {base:.2f} ms"]
    for m in (2, 4, 5, 8, 16, 32):
        row.append(f"M={m} {median_ms(chain, jnp.ones((m, 576)), gate, down, reps=100) / base:.2f}x")
    print("30 x (576x1536, 1536x576) matmuls: " + ", ".join(row))


if __name__ == "__main__":
    main()
