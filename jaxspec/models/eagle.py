"""An EAGLE-style draft head: a small decoder that drafts from the target's own hidden features.

At position ``j`` the head reads the target's final-norm feature ``f_j`` (the LM head's input, from which the
target predicted token ``j+1``) and the embedding of token ``j+1``, and predicts the next feature ``f_{j+1}``; the
target's own LM head (restricted to the draft vocabulary, ``vocab_ids``) turns it into the draft's distribution
over token ``j+2``. Later draft steps feed back the head's own predicted features. The input embedding and the
LM head are the target's (passed in ``params`` as ``embed [V, hidden]`` and ``head [hidden, rows]``, not trained
or stored with the head), and so are the target's scalings around them (Gemma's embedding scale, Granite's
embedding multiplier and logit scaling, Gemma 2's final soft-capping), so the head's own weights are one
projection ``fc [2·hidden, hidden]``, its decoder layer(s) (``jaxspec.models.llama.DecoderLayer``, a KV cache of
their own) and a final RMSNorm.

The head's config is a ``LlamaConfig`` of the target's width (``num_layers`` the head's layers, ``vocab_ids`` the
draft vocabulary, ``vocab_size`` the target's).
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.core.cache import KVCache
from jaxspec.models import llama, quant, stack
from jaxspec.models.llama import LlamaConfig


class EagleHead(nn.Module):
    """``(tokens [B, T], feats [B, T, hidden], positions [B, T], cache)`` -> ``(logits [B, T, V] float32, predicted
    features [B, T, hidden], cache)``: at position ``j``, ``tokens`` holds token ``j+1`` and ``feats`` ``f_j``.
    ``full_vocab=False`` returns the logits over the head's rows (``[B, T, rows]``, training's loss);
    ``last_only=True`` the logits at the last position alone (``[B, 1, ...]``: a drafting window's)."""

    cfg: LlamaConfig
    split: bool = False

    @nn.compact
    def __call__(self, tokens, feats, positions, cache: KVCache, full_vocab: bool = True, last_only: bool = False):
        cfg = self.cfg
        dtype, width = cfg.jnp_dtype, cfg.hidden_size
        init = nn.initializers.normal(cfg.init_std)
        table, table_scale, _ = quant.param_with_scale(self, "embed", init, (cfg.vocab_size, width), dtype)
        head, head_scale, a8 = quant.param_with_scale(self, "head", init, (width, cfg.embed_rows), dtype)
        e = quant.lookup(table, table_scale, tokens, dtype)
        if cfg.embed_scale:  # the target's own input scaling: Gemma's sqrt(hidden), Granite's multiplier
            e = e * jnp.asarray(width**0.5, dtype)
        if cfg.embedding_multiplier != 1.0:
            e = e * cfg.embedding_multiplier
        x = llama.dense(width, "fc", cfg)(jnp.concatenate([e, feats.astype(dtype)], axis=-1))
        x, k, v = stack.apply_layers(llama.DecoderLayer, cfg, (x, cache.k, cache.v), positions, self.split)
        f = llama.rms_norm(cfg, "final_norm")(x)
        # finished as the target finishes its logits (Granite's logits_scaling, Gemma 2's soft-capping)
        rows = f[:, -1:] if last_only else f
        logits = llama.soft_cap(
            cfg, quant.project(rows, head, head_scale, dtype, jnp.float32, a8, min_rows=cfg.min_rows)
        )
        return (llama.to_full_vocab(cfg, logits) if full_vocab else logits), f, KVCache(k, v)


OWN = ("fc", "final_norm", "layers")  # the head's own (trained, stored) parameters; embed and head are the target's


@functools.cache
def head_fns(cfg: LlamaConfig):
    """``(apply_fn, init_cache)`` of a head config (the same objects for equal configs)."""

    def apply_fn(params, tokens, feats, positions, cache, full_vocab=True, last_only=False):
        module, variables = stack.bind(EagleHead, cfg, params)
        return module.apply(variables, tokens, feats, positions, cache, full_vocab, last_only)

    def init_cache(batch_size: int, max_length: int) -> KVCache:
        assert cfg.head_dim is not None  # LlamaConfig.__post_init__ sets it
        return KVCache.zeros(cfg.num_layers, batch_size, max_length, cfg.num_kv_heads, cfg.head_dim, cfg.jnp_dtype)

    return apply_fn, init_cache


def head_config(target_cfg: LlamaConfig, *, num_layers: int = 1, vocab_ids=()) -> LlamaConfig:
    """The config of a head for ``target_cfg``: its width, heads and MLP, ``num_layers`` layers, draft vocabulary
    ``vocab_ids`` (() for the target's whole vocabulary)."""
    if not isinstance(target_cfg, LlamaConfig):
        raise ValueError(f"an EAGLE head needs a Llama-family target, got {type(target_cfg).__name__}")
    if target_cfg.vocab_ids:
        raise ValueError("an EAGLE head's target must have the full vocabulary (its config has vocab_ids)")
    fields = {**_fields(target_cfg), "num_layers": int(num_layers), "vocab_ids": tuple(vocab_ids)}
    fields["layer_types"] = fields["layer_types"][-1:] * int(num_layers)  # Gemma 2/3: as the target's last layer
    return LlamaConfig(**fields)


def _fields(cfg: LlamaConfig) -> dict:
    return {f: getattr(cfg, f) for f in cfg.__dataclass_fields__}


def shared_params(cfg: LlamaConfig, target_params) -> dict:
    """The target's parameters the head reads: ``embed`` (its input embedding, ``[V, hidden]``) and ``head`` (its
    LM head restricted to ``cfg.vocab_ids``, plus the masked out-of-vocabulary column, ``[hidden, rows]``)."""
    embed = target_params["embed"]
    table = embed["embedding"]
    if cfg.tie_embeddings:
        full = table.T
        scale, suffix = quant.scale_of(embed, "embedding")
    else:
        full = target_params["lm_head"]["kernel"]
        scale, suffix = quant.scale_of(target_params["lm_head"], "kernel")
    if cfg.vocab_ids:
        ids = jnp.asarray(np.asarray(cfg.vocab_ids))
        full = jnp.concatenate([jnp.take(full, ids, axis=1), jnp.zeros_like(full[:, :1])], axis=1)
        if scale is not None:
            scale = jnp.concatenate([jnp.take(scale, ids), jnp.ones_like(scale[:1])])
    out = {"embed": table, "head": full}
    if scale is not None:  # a quantized target (jaxspec.models.quant): its tables stay int8 in the head too
        table_scale, table_suffix = quant.scale_of(embed, "embedding")
        out.update({"embed" + table_suffix: table_scale, "head" + suffix: scale})
    return out


def init_own(cfg: LlamaConfig, seed: int = 0) -> dict:
    """Random own parameters (stacked layers): normal(init_std) weights, unit norms; ``fc`` starts as the identity on
    the feature half plus small noise on the embedding half, so an untrained head passes ``f_j`` through."""
    apply_fn, init_cache = head_fns(cfg)
    toks = jnp.zeros((1, 1), jnp.int32)
    feats = jnp.zeros((1, 1, cfg.hidden_size), cfg.jnp_dtype)
    params = jax.jit(EagleHead(cfg).init)(jax.random.key(seed), toks, feats, toks, init_cache(1, 1))["params"]
    kernel = params["fc"]["kernel"]
    eye = jnp.eye(cfg.hidden_size, dtype=kernel.dtype)
    params["fc"]["kernel"] = kernel.at[cfg.hidden_size :].set(eye)
    return {k: params[k] for k in OWN}
