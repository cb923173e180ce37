"""Two forward-pass layouts tried for a cheaper verify on XLA:CPU, against jaxspec's own pass: SmolLM2-135M's real
weights, batch 1, a cache of 512 with the tokens at 200.

- ``feature-major``: activations ``[hidden, tokens]`` throughout, weights stored ``[out, in]`` as the left operand
  (``W @ x``), LM head ``embedding @ x``; ``feature-major-nohead`` stops at the final norm;
- ``fused``: token-major like jaxspec, with q/k/v in one ``[hidden, (heads + 2 kv_heads) head_dim]`` matmul and
  gate/up in one ``[hidden, 2 intermediate]``.

Each checks its logits against jaxspec's (``apply_fn``), then every layout runs over 1, 3 and 5 tokens,
interleaved, ``--iters`` times; the medians are printed in ms and as multiples of jaxspec's 1-token step.

    python scripts/studies/xla_cpu_layouts.py --iters 14

A one-off measurement, not a test: its figures are recorded in docs/history/cpu-costs.md.
"""

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import jaxspec
from jaxspec.core.cache import KVCache, causal_mask
from jaxspec.models.llama import model_fns
from jaxspec.models.rope import apply_rope, inverse_frequencies


def _transposed(a):
    return jnp.asarray(np.ascontiguousarray(np.asarray(a).T))


def layouts(cfg, params):
    """``{name: (apply(weights, tokens, positions, cache) -> (logits or hidden, cache), weights)}``."""
    h, kvh, d, inter = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.intermediate_size
    inv = inverse_frequencies(d, cfg.rope_theta, cfg.rope_type, **dict(cfg.rope_params))
    embed = params["embed"]["embedding"]

    def attention(q, k, v, positions, cache, i):
        batch, length = positions.shape
        rows = jnp.arange(batch)[:, None]
        q, k = apply_rope(q, positions, inv), apply_rope(k, positions, inv)
        kc = cache.k.at[i, rows, positions].set(k, mode="drop")
        vc = cache.v.at[i, rows, positions].set(v, mode="drop")
        s = jnp.einsum("btkgd,bskd->bkgts", q.reshape(batch, length, kvh, h // kvh, d), kc[i]) * d**-0.5
        s = jnp.where(causal_mask(positions, kc.shape[2])[:, None, None], s, jnp.finfo(jnp.float32).min)
        return jax.nn.softmax(s, axis=-1), vc[i], KVCache(kc, vc)

    def fm_norm(x, w):  # x [hidden, M]
        return x * jax.lax.rsqrt(jnp.mean(x * x, axis=0, keepdims=True) + cfg.rms_norm_eps) * w[:, None]

    def tm_norm(x, w):
        return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + cfg.rms_norm_eps) * w

    def feature_major(head: bool):
        def apply(w, tokens, positions, cache):
            batch, length = tokens.shape
            x = w["embed"][tokens.reshape(-1)].T
            for i, lw in enumerate(w["layers"]):
                a = fm_norm(x, lw["n1"])
                q = (lw["q"] @ a).T.reshape(batch, length, h, d)
                k = (lw["k"] @ a).T.reshape(batch, length, kvh, d)
                v = (lw["v"] @ a).T.reshape(batch, length, kvh, d)
                p, vi, cache = attention(q, k, v, positions, cache, i)
                x = x + lw["o"] @ jnp.einsum("bkgts,bskd->kgdbt", p, vi).reshape(h * d, batch * length)
                a = fm_norm(x, lw["n2"])
                x = x + lw["d"] @ (jax.nn.silu(lw["g"] @ a) * (lw["u"] @ a))
            x = fm_norm(x, w["final"])
            return ((w["embed"] @ x).T.reshape(batch, length, -1) if head else x), cache

        return apply

    def fused(w, tokens, positions, cache):
        batch, length = tokens.shape
        x = w["embed"][tokens]
        for i, lw in enumerate(w["layers"]):
            qkv = tm_norm(x, lw["n1"]) @ lw["qkv"]
            q = qkv[..., : h * d].reshape(batch, length, h, d)
            k = qkv[..., h * d : (h + kvh) * d].reshape(batch, length, kvh, d)
            v = qkv[..., (h + kvh) * d :].reshape(batch, length, kvh, d)
            p, vi, cache = attention(q, k, v, positions, cache, i)
            x = x + jnp.einsum("bkgts,bskd->btkgd", p, vi).reshape(batch, length, h * d) @ lw["o"]
            gu = tm_norm(x, lw["n2"]) @ lw["gu"]
            x = x + (jax.nn.silu(gu[..., :inter]) * gu[..., inter:]) @ lw["d"]
        return tm_norm(x, w["final"]) @ w["embed"].T, cache

    def kernel(layer, *path):
        for p in path:
            layer = layer[p]
        return layer["kernel"]

    def table(layer_weights):
        """The weights of one layout: embedding, final norm and per layer its norms plus ``layer_weights(layer)``."""
        layers = tuple(
            dict(n1=lw["input_norm"]["scale"], n2=lw["post_attn_norm"]["scale"], **layer_weights(lw))
            for lw in params["layers"]
        )
        return {"embed": embed, "final": params["final_norm"]["scale"], "layers": layers}

    fm_weights = table(
        lambda lw: {
            **{n: _transposed(kernel(lw, "attn", f"{n}_proj")) for n in "qkvo"},
            **{n[0]: _transposed(kernel(lw, "mlp", n)) for n in ("gate_proj", "up_proj", "down_proj")},
        }
    )
    fused_weights = table(
        lambda lw: dict(
            qkv=jnp.concatenate([kernel(lw, "attn", f"{n}_proj") for n in "qkv"], axis=1),
            o=kernel(lw, "attn", "o_proj"),
            gu=jnp.concatenate([kernel(lw, "mlp", "gate_proj"), kernel(lw, "mlp", "up_proj")], axis=1),
            d=kernel(lw, "mlp", "down_proj"),
        )
    )
    return {
        "feature-major": (feature_major(True), fm_weights),
        "feature-major-nohead": (feature_major(False), fm_weights),
        "fused": (fused, fused_weights),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=14)
    ap.add_argument("--cache", type=int, default=512)
    ap.add_argument("--position", type=int, default=200)
    args = ap.parse_args()
    model = jaxspec.load("smollm2-135m-instruct")
    cfg = model.config
    apply_fn, init_cache = model_fns(cfg)
    runs = {"jaxspec": (apply_fn, model.params), **layouts(cfg, model.params)}
    fns = {name: jax.jit(fn, donate_argnums=3) for name, (fn, _) in runs.items()}
    base = init_cache(1, args.cache)
    noise = (jax.random.normal(jax.random.key(0), base.k.shape), jax.random.normal(jax.random.key(1), base.k.shape))
    cache_np = (np.asarray(0.1 * noise[0]), np.asarray(0.1 * noise[1]))

    def fresh():
        return KVCache(jnp.asarray(cache_np[0]), jnp.asarray(cache_np[1]))

    def inputs(n):
        toks = jnp.asarray(np.random.default_rng(n).integers(0, cfg.vocab_size, (1, n)), jnp.int32)
        return toks, jnp.arange(args.position, args.position + n, dtype=jnp.int32)[None]

    for n in (1, 3, 5):
        ref, _ = fns["jaxspec"](model.params, *inputs(n), fresh())
        for name, (_, weights) in runs.items():
            if name in ("jaxspec", "feature-major-nohead"):
                continue
            out, _ = fns[name](weights, *inputs(n), fresh())
            err = float(jnp.abs(out - ref).max())
            same = bool((out.argmax(-1) == ref.argmax(-1)).all())
            print(f"{name} over {n} tokens: max |logit difference| {err:.1e}, same argmax {same}", flush=True)
    caches = {(name, n): fresh() for name in runs for n in (1, 3, 5)}
    times: dict = {}
    for it in range(args.iters + 1):
        for n in (1, 3, 5):
            toks, pos = inputs(n)
            for name, (_, weights) in runs.items():
                start = time.perf_counter()
                out, caches[name, n] = fns[name](weights, toks, pos, caches[name, n])
                jax.block_until_ready(out)
                if it:  # the first round compiles
                    times.setdefault((name, n), []).append(time.perf_counter() - start)
    step = statistics.median(times["jaxspec", 1])
    for name in runs:
        row = [statistics.median(times[name, n]) for n in (1, 3, 5)]
        cells = ", ".join(f"{n} tokens {t * 1e3:.1f} ms ({t / step:.2f})" for n, t in zip((1, 3, 5), row))
        print(f"{name:>22}: {cells}; over 3 tokens ÷ own 1-token step {row[1] / row[0]:.2f}")


if __name__ == "__main__":
    main()
