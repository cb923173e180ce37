"""Where a decode step of SmolLM2-135M-Instruct goes on XLA:CPU: stacked layers under ``scan`` vs per-layer buffers.

    python scripts/studies/xla_cpu_step.py                 # both cores
    taskset -c 0 python scripts/studies/xla_cpu_step.py    # one core: does XLA:CPU use the second?

Prints, for the real model (float32, batch 1, cache 512, position 200), the median time of

- ``stacked``: jaxspec's model over stacked params (``families.stack_layers``: ``nn.scan`` over weights with a
  leading ``[layers]`` axis), 1 and 5 tokens;
- ``per-layer``: the same model over split params (``families.split_layers``, ``from_params``' default: each
  layer's weights in their own arrays, applied layer by layer), same cache, same head;
- ``read``: summing every weight once (what streaming the weights costs, the floor of a memory-bound step);

and, on synthetic weights of the model's shapes, the three ways a layer loop can take its weights: ``scan`` over a
stacked array, a Python loop indexing the stack with a static index, and a Python loop over per-layer arrays.

A one-off measurement, not a test: its figures are recorded in docs/history/cpu-costs.md.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

import jaxspec
from jaxspec.models import families, llama


def _median_ms(fn, *args, n=30, warmup=1):
    for _ in range(warmup):
        jax.block_until_ready(fn(*args))
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) * 1e3


def _interleaved(calls, rounds=30):
    """Median ms of each ``name -> (fn, args)``, called in turn round after round (drift hits all alike)."""
    for fn, args in calls.values():
        jax.block_until_ready(fn(*args))
    times = {name: [] for name in calls}
    for _ in range(rounds):
        for name, (fn, args) in calls.items():
            t0 = time.perf_counter()
            jax.block_until_ready(fn(*args))
            times[name].append(time.perf_counter() - t0)
    return {name: float(np.median(t)) * 1e3 for name, t in times.items()}


def real_model(name="smollm2-135m-instruct", cache_len=512, position=200):
    target = jaxspec.load(name, "float32")
    cfg = target.config
    apply_fn, init_cache = llama.model_fns(cfg)
    cache = init_cache(1, cache_len)
    layouts = {"stacked": families.stack_layers(target.params), "per-layer": families.split_layers(target.params)}

    def step(T):
        return jax.jit(
            lambda p, c, pos: apply_fn(p, jnp.ones((1, T), jnp.int32), pos + jnp.arange(T, dtype=jnp.int32)[None], c)[0]
        )

    pos = jnp.int32(position)
    calls = {}
    for T in (1, 5):
        fn = step(T)
        for kind, params in layouts.items():
            calls[f"{kind}({T})"] = (fn, (params, cache, pos))
    out = _interleaved(calls)
    params = layouts["stacked"]
    total = jax.jit(lambda p: sum(jnp.sum(x) for x in jax.tree_util.tree_leaves(p)))
    out["read"] = _median_ms(total, params)
    nbytes = sum(x.nbytes for x in jax.tree_util.tree_leaves(params))
    print(
        f"{name}, float32, batch 1, cache {cache_len}: weights {nbytes / 1e6:.0f} MB, read once {out['read']:.1f} ms "
        f"({nbytes / out['read'] / 1e6:.1f} GB/s)"
    )
    for kind in layouts:
        t1, t5 = out[f"{kind}(1)"], out[f"{kind}(5)"]
        print(f"  {kind:9s}: step(1) {t1:5.1f} ms  step(5) {t5:5.1f} ms  v(5) = {t5 / t1:.2f}")
    return out


def synthetic(num_layers=30, hidden=576, kv=192, mlp=1536):
    key = jax.random.PRNGKey(0)
    shapes = dict(
        q=(hidden, hidden),
        k=(hidden, kv),
        v=(hidden, kv),
        o=(hidden, hidden),
        g=(hidden, mlp),
        u=(hidden, mlp),
        d=(mlp, hidden),
    )
    stack = {n: jax.random.normal(key, (num_layers, *s)) * 0.02 for n, s in shapes.items()}
    split = [{n: jnp.array(a[i]) for n, a in stack.items()} for i in range(num_layers)]

    def layer(x, w):
        a = x @ w["q"] + jnp.tile(jnp.concatenate([x @ w["k"], x @ w["v"]], -1), 2)[..., :hidden]
        x = x + jnp.tanh(a) @ w["o"]
        return x + (jax.nn.silu(x @ w["g"]) * (x @ w["u"])) @ w["d"]

    def static_index(x, s):
        for i in range(num_layers):
            x = layer(x, {n: a[i] for n, a in s.items()})
        return x

    def listed(x, ws):
        for w in ws:
            x = layer(x, w)
        return x

    x = jnp.ones((1, hidden))
    scan = _median_ms(jax.jit(lambda x, s: jax.lax.scan(lambda x, w: (layer(x, w), None), x, s)[0]), x, stack)
    sta = _median_ms(jax.jit(static_index), x, stack)
    lst = _median_ms(jax.jit(listed), x, split)
    mb = sum(a.nbytes for a in stack.values()) / 1e6
    print(
        f"synthetic {num_layers} layers ({mb:.0f} MB, matmuls only, 1 token): scan over the stack {scan:.1f} ms, "
        f"static index into the stack {sta:.1f} ms, per-layer arrays {lst:.1f} ms"
    )


if __name__ == "__main__":
    print(f"jax {jax.__version__}, {jax.devices()[0].platform}")
    real_model()
    synthetic()
