"""Probe for weight-only and weight+activation int8 on the real SmolLM2-135M-Instruct forward (issue 48's first
question): every projection of the 30 layers gets an int8 kernel with per-output-channel scales (the tied LM head
stays float32), and each pass is timed against float32 with ``jaxspec.policy.timing.time_step`` (batch 1, cache
256, median of 15 calls after a warm-up), widths interleaved per width.

    python scripts/studies/int8_probe.py {w8,w8a8} [WIDTHS]     # e.g. w8a8 1,2,4

w8: the kernel converted to float32 inside the jitted step, then a float32 dot. w8a8: the activations quantized
per row to int8 too, an int8 x int8 -> int32 dot, both scales applied after. A probe, not the feature: it swaps
``jaxspec.models.stack.dense`` for a module that reads an int8 kernel where the params hold one. Figures:
docs/history/cpu-costs.md.
"""

import collections.abc
import sys
import types

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

import jaxspec
from jaxspec.models import stack
from jaxspec.policy import timing

MODE = sys.argv[1] if len(sys.argv) > 1 else "w8"
WIDTHS = tuple(int(w) for w in sys.argv[2].split(",")) if len(sys.argv) > 2 else (1, 3, 5, 9)


class ProbeDense(nn.Module):
    """A projection that reads an int8 kernel and its scales where the params hold them, else a float one."""

    features: int
    use_bias: bool
    dtype: object

    @nn.compact
    def __call__(self, x):
        if self.has_variable("params", "scale"):
            k = self.param("kernel", nn.initializers.zeros, (x.shape[-1], self.features), jnp.int8)
            s = self.param("scale", nn.initializers.ones, (self.features,), jnp.float32).astype(self.dtype)
            if MODE == "w8a8":
                ax = jnp.maximum(jnp.max(jnp.abs(x), -1, keepdims=True), 1e-12) / 127.0
                xq = jnp.round(x / ax).astype(jnp.int8)
                dims = (((x.ndim - 1,), (0,)), ((), ()))
                y = jax.lax.dot_general(xq, k, dims, preferred_element_type=jnp.int32).astype(self.dtype) * ax * s
            else:
                y = jnp.einsum("...i,io->...o", x, k.astype(self.dtype)) * s
        else:
            k = self.param("kernel", nn.initializers.zeros, (x.shape[-1], self.features), self.dtype)
            y = jnp.einsum("...i,io->...o", x, k)
        if self.use_bias:
            y = y + self.param("bias", nn.initializers.zeros, (self.features,), self.dtype)
        return y


def quantize(tree):
    """Every 2-D ``kernel`` as int8 with per-output-channel scales (max |w| / 127)."""
    if isinstance(tree, collections.abc.Mapping):
        if "kernel" in tree and np.ndim(tree["kernel"]) == 2:
            w = np.asarray(tree["kernel"], np.float32)
            scale = np.abs(w).max(0) / 127.0
            scale = np.where(scale > 0, scale, 1.0)
            return {**tree, "kernel": jnp.asarray(np.round(w / scale).astype(np.int8)), "scale": jnp.asarray(scale)}
        return {k: quantize(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(quantize(v) for v in tree)
    return tree


def main():
    target = jaxspec.load("smollm2-135m-instruct")
    qparams = quantize(target.params)
    stack.dense = lambda features, name, cfg, *, bias, std=None: ProbeDense(features, bias, cfg.jnp_dtype, name=name)
    f32 = types.SimpleNamespace(params=target.params, apply_fn=target.apply_fn, init_cache=target.init_cache)
    q8 = types.SimpleNamespace(params=qparams, apply_fn=target.apply_fn, init_cache=target.init_cache)
    size = lambda tree: sum(np.asarray(x).nbytes for x in jax.tree.leaves(tree)) / 1e6  # noqa: E731
    print(f"{MODE}: weights float32 {size(target.params):.0f} MB, int8 {size(qparams):.0f} MB (LM head float32)")
    text = 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'
    toks = jnp.asarray([target.tokenizer.encode(text)], jnp.int32)
    pos = jnp.arange(toks.shape[1], dtype=jnp.int32)[None]
    lf, _ = target.apply_fn(target.params, toks, pos, target.init_cache(1, 128))
    lq, _ = target.apply_fn(qparams, toks, pos, target.init_cache(1, 128))
    agree = float(jnp.mean(jnp.argmax(lf, -1) == jnp.argmax(lq, -1)))
    print(f"top-1 agreement with float32 over the prompt's {toks.shape[1]} positions: {agree:.3f}")
    base = None
    for width in WIDTHS:
        t = {name: timing.time_step(m, 1, 256, width, iters=15) for name, m in (("f32", f32), ("int8", q8))}
        base = base or t
        print(
            f"width {width}: float32 {t['f32'] * 1e3:.1f} ms ({t['f32'] / base['f32']:.2f} steps), "
            f"int8 {t['int8'] * 1e3:.1f} ms ({t['int8'] / base['f32']:.2f} float32 steps)",
            flush=True,
        )


if __name__ == "__main__":
    main()
