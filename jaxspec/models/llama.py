"""Llama-family decoder in Flax: RMSNorm, RoPE, grouped-query attention, SwiGLU (or GeGLU).

Config switches cover the Llama-family variants ``jaxspec.load`` reads: q/k/v (and output) projection biases
(Qwen2, ``attention_bias``), per-head q/k RMSNorm before RoPE (Qwen3), RoPE types from ``models.rope`` (linear,
llama3), a sliding attention window (Mistral), Gemma's (1 + w) RMSNorm, sqrt(hidden)-scaled embeddings and
GeGLU MLP, and Granite's embedding, residual, attention and logit multipliers.

Parameters come in two layouts that ``apply_fn`` both takes: stacked (``init_params``, checkpoints, training, the
weight table: every layer weight carries a leading ``[layers]`` axis, applied with ``nn.scan``, so compile time
does not grow with depth) and split (``from_params``' default: ``params["layers"]`` a tuple of per-layer trees,
applied layer by layer, which decodes faster where XLA copies slices out of a stack). The KV cache is one
``KVCache`` with ``[layers, B, S, kv_heads, head_dim]`` either way, updated in place.
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.core.cache import KVCache, attention_mask, rope_positions, window_mask, write_layer, write_slots
from jaxspec.models import families, quant, stack
from jaxspec.models.families import Weight
from jaxspec.models.llama_config import (  # re-exported: jaxspec.models.llama is the family's public module
    ARCHITECTURES,
    LlamaConfig,
    config_from_hf,
    config_to_hf,
)
from jaxspec.models.rope import apply_rope, rotation


@functools.lru_cache(maxsize=8)
def _row_of(cfg: LlamaConfig) -> np.ndarray:
    """``[vocab_size]`` int32: the embedding row of every full-vocabulary id (the last row when not in vocab_ids)."""
    rows = np.full(cfg.vocab_size, len(cfg.vocab_ids), np.int32)
    rows[np.asarray(cfg.vocab_ids, np.int64)] = np.arange(len(cfg.vocab_ids), dtype=np.int32)
    return rows


def to_full_vocab(cfg: LlamaConfig, logits: jax.Array) -> jax.Array:
    """Logits over a reduced model's rows ``[..., embed_rows]`` -> ``[..., vocab_size]``, -inf outside vocab_ids."""
    if not cfg.vocab_ids:
        return logits
    logits = logits.at[..., -1].set(-jnp.inf)  # the out-of-vocabulary row is an input embedding only
    return jnp.take(logits, jnp.asarray(_row_of(cfg)), axis=-1)


def soft_cap(cfg: LlamaConfig, logits: jax.Array) -> jax.Array:
    """Logits over the embedding rows as the model finishes them: divided by ``cfg.logits_scaling`` (Granite), tanh
    soft-capped by ``cfg.final_softcap`` (Gemma 2), else as they are."""
    if cfg.logits_scaling != 1.0:
        logits = logits / cfg.logits_scaling
    if cfg.final_softcap is None:
        return logits
    return jnp.tanh(logits / cfg.final_softcap) * cfg.final_softcap


def to_rows(cfg: LlamaConfig, tokens: jax.Array) -> jax.Array:
    """Full-vocabulary ids -> embedding rows (identity without vocab_ids)."""
    return jnp.take(jnp.asarray(_row_of(cfg)), tokens, axis=0) if cfg.vocab_ids else tokens


class RMSNorm(nn.Module):
    """RMS normalization over the last axis, computed in float32, scaled by ``w`` (or ``offset + w``)."""

    eps: float
    dtype: jnp.dtype
    offset: float = 0.0  # 0: Llama's w * y.astype(dtype); else Gemma's ((offset + w) * y in float32).astype(dtype)

    @nn.compact
    def __call__(self, x):
        init = nn.initializers.zeros if self.offset else nn.initializers.ones  # either way the init scale is 1
        scale = self.param("scale", init, (x.shape[-1],), self.dtype)
        xf = x.astype(jnp.float32)
        y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + self.eps)
        if self.offset:
            return (y * (self.offset + scale.astype(jnp.float32))).astype(self.dtype)
        return (y.astype(self.dtype) * scale).astype(self.dtype)


def rms_norm(cfg: LlamaConfig, name: str) -> RMSNorm:
    """The family's RMSNorm module for ``cfg`` (epsilon, dtype, Gemma's offset), named ``name``."""
    return RMSNorm(cfg.rms_norm_eps, cfg.jnp_dtype, cfg.norm_offset, name=name)


def dense(features: int, name: str, cfg: LlamaConfig, std: float | None = None, bias: bool = False) -> quant.Dense:
    """A ``features``-wide projection in ``cfg``'s dtype, normal(``std`` or ``init_std``) init, no bias unless asked
    (``stack.dense`` with Llama's default)."""
    return stack.dense(features, name, cfg, bias=bias, std=std)


def sliding_layer(cfg: LlamaConfig, layer):
    """Whether ``layer`` attends through the sliding window: a Python bool (every layer alike, or ``layer`` a
    Python int: the split layout), or a traced bool (``layer`` traced under the stacked layout's scan)."""
    if cfg.sliding_window is None:
        return False
    if not cfg.layer_types:
        return True
    flags = tuple(t == "sliding_attention" for t in cfg.layer_types)
    if isinstance(layer, int):
        return flags[layer]
    return jnp.asarray(flags)[layer]


class Attention(nn.Module):
    """Grouped-query self-attention of one layer over ``x [B, T, hidden]`` at ``positions [B, T]``: RoPE, optional
    biases and q/k norm, causal (and sliding-window) mask over the cache written at those positions. ``positions``
    may be a tree pass's ``TreePositions`` (rotation, slots and mask from it)."""

    cfg: LlamaConfig

    @nn.compact
    def __call__(self, x, positions, k_all, v_all, layer):
        """``k_all, v_all [layers, B, S, kv_heads, head_dim]`` are updated in place at ``layer``."""
        cfg = self.cfg
        batch, length, _ = x.shape
        h, kvh, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        assert d is not None  # LlamaConfig.__post_init__ sets head_dim
        q = dense(h * d, "q_proj", cfg, bias=cfg.qkv_bias)(x).reshape(batch, length, h, d)
        k = dense(kvh * d, "k_proj", cfg, bias=cfg.qkv_bias)(x).reshape(batch, length, kvh, d)
        v = dense(kvh * d, "v_proj", cfg, bias=cfg.qkv_bias)(x).reshape(batch, length, kvh, d)
        if cfg.qk_norm:
            q = rms_norm(cfg, "q_norm")(q)
            k = rms_norm(cfg, "k_norm")(k)
        rot = rotation(cfg.rotary_dim or d, cfg.rope_theta, cfg.rope_type, **dict(cfg.rope_params))
        sliding = sliding_layer(cfg, layer)  # a Python bool, or a traced one under the stacked layers' scan
        rope = rope_positions(positions)  # positions, or a tree pass's (TreePositions)
        if cfg.local_rope_theta is not None and sliding is not False:  # Gemma 3: sliding layers' own RoPE base
            local = rotation(cfg.rotary_dim or d, cfg.local_rope_theta)
            if sliding is True:
                q, k = apply_rope(q, rope, local), apply_rope(k, rope, local)
            else:
                q, k = (jnp.where(sliding, apply_rope(t, rope, local), apply_rope(t, rope, rot)) for t in (q, k))
        else:
            q, k = apply_rope(q, rope, rot), apply_rope(k, rope, rot)
        slots = write_slots(positions)
        k_all, v_all = write_layer(k_all, layer, k, slots), write_layer(v_all, layer, v, slots)
        k_cache, v_cache = k_all[layer], v_all[layer]

        q = q.reshape(batch, length, kvh, h // kvh, d)
        scale = cfg.attention_multiplier or (cfg.query_pre_attn_scalar or d) ** -0.5
        scores = jnp.einsum("btkgd,bskd->bkgts", q, k_cache, preferred_element_type=jnp.float32) * scale
        if cfg.attn_softcap is not None:
            scores = jnp.tanh(scores / cfg.attn_softcap) * cfg.attn_softcap
        mask = attention_mask(positions, k_cache.shape[1])
        if cfg.sliding_window is not None and sliding is not False:
            window = window_mask(positions, k_cache.shape[1], cfg.sliding_window)
            mask = mask & (window if sliding is True else window | ~sliding)
        mask = mask[:, None, None]
        scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
        probs = jax.nn.softmax(scores, axis=-1).astype(cfg.jnp_dtype)
        out = jnp.einsum("bkgts,bskd->btkgd", probs, v_cache).reshape(batch, length, h * d)
        return dense(cfg.hidden_size, "o_proj", cfg, bias=cfg.o_bias)(out), k_all, v_all


class MLP(nn.Module):
    """The gated MLP: ``down(act(gate(x)) * up(x))`` (SwiGLU or GeGLU)."""

    cfg: LlamaConfig

    @nn.compact
    def __call__(self, x):
        cfg = self.cfg
        gate = dense(cfg.intermediate_size, "gate_proj", cfg)(x)
        up = dense(cfg.intermediate_size, "up_proj", cfg)(x)
        return dense(cfg.hidden_size, "down_proj", cfg)(stack.ACTIVATIONS[cfg.mlp_activation](gate) * up)


class DecoderLayer(nn.Module):
    """One pre-norm decoder layer (attention then MLP, each with a residual), one layer of ``models.stack``:
    ``carry = (x [B, T, hidden], k_all, v_all)``, ``layer`` the layer index (traced under the scan)."""

    cfg: LlamaConfig

    @nn.compact
    def __call__(self, carry, layer, positions):
        cfg = self.cfg
        x, k_all, v_all = carry
        attn, k_all, v_all = Attention(cfg, name="attn")(rms_norm(cfg, "input_norm")(x), positions, k_all, v_all, layer)
        if cfg.sandwich_norms:  # Gemma 2/3: each sub-block's output normalized before the residual
            attn = rms_norm(cfg, "attn_out_norm")(attn)
        if cfg.residual_multiplier != 1.0:  # Granite
            attn = attn * cfg.residual_multiplier
        x = x + attn
        mlp = MLP(cfg, name="mlp")(rms_norm(cfg, "post_attn_norm")(x))
        if cfg.sandwich_norms:
            mlp = rms_norm(cfg, "mlp_out_norm")(mlp)
        if cfg.residual_multiplier != 1.0:
            mlp = mlp * cfg.residual_multiplier
        x = x + mlp
        return (x, k_all, v_all), None


class Llama(nn.Module):
    """The whole decoder: embedding, ``num_layers`` ``DecoderLayer``, final norm, LM head. The layers are stacked
    under ``nn.scan`` (params ``layers``, every weight with a leading ``[layers]`` axis) or, with ``split``, one
    module each (params ``layers_0`` ...; ``model_fns``'s ``apply_fn`` maps ``families.split_layers``' tuple there)."""

    cfg: LlamaConfig
    split: bool = False

    @nn.compact
    def __call__(self, tokens, positions, cache: KVCache, hidden: bool | str = False):
        """``(logits [B, T, V] float32, cache)``; ``hidden=True`` returns the final-norm hidden states
        ``[B, T, hidden_size]`` instead of logits (training computes the LM head at chosen positions only);
        ``hidden="both"`` returns ``((logits, hidden), cache)`` (an EAGLE head drafts from the hidden states);
        ``hidden`` a tuple of layer indices returns ``((logits, taps [B, T, len × hidden_size]), cache)``: the hidden
        states entering those layers, concatenated (``stack.apply_layers``' taps; an EAGLE-3 head drafts from them)."""
        cfg = self.cfg
        embed = stack.embed(cfg.embed_rows, "embed", cfg, cfg.init_std)
        x = embed(to_rows(cfg, tokens))
        if cfg.embed_scale:  # like transformers: sqrt(hidden) rounded to the activation dtype first
            x = x * jnp.asarray(cfg.hidden_size**0.5, cfg.jnp_dtype)
        if cfg.embedding_multiplier != 1.0:  # Granite (a Python float: the product keeps the activation dtype)
            x = x * cfg.embedding_multiplier
        taps = hidden if isinstance(hidden, tuple) else ()
        out = stack.apply_layers(DecoderLayer, cfg, (x, cache.k, cache.v), positions, self.split, taps)
        (x, k, v), tapped = out if taps else (out, None)
        x = rms_norm(cfg, "final_norm")(x)
        if hidden is True:
            return x, KVCache(k, v)
        if cfg.tie_embeddings:
            logits = embed.attend(x)
        else:
            logits = dense(cfg.embed_rows, "lm_head", cfg)(x)
        logits = to_full_vocab(cfg, soft_cap(cfg, logits.astype(jnp.float32)))
        if taps:
            return (logits, jnp.concatenate(tapped, axis=-1)), KVCache(k, v)
        return ((logits, x) if hidden == "both" else logits), KVCache(k, v)


def weights(cfg: LlamaConfig) -> list[Weight]:
    """Every weight of ``cfg``'s params tree, once: its path, logical axes (``jaxspec.sharding.RULES``), Hugging Face
    name (Llama layout) and whether it is the transpose of torch's ``Linear`` weight."""

    def layer(path, axes, hf, transpose=False) -> Weight:
        return Weight(("layers", *path), axes, f"model.layers.{{i}}.{hf}", transpose)

    heads = {"q": "heads", "k": "kv_heads", "v": "kv_heads"}
    out = [
        Weight(("embed", "embedding"), ("vocab", "embed"), "model.embed_tokens.weight"),
        Weight(("final_norm", "scale"), (None,), "model.norm.weight"),
        layer(("input_norm", "scale"), (None,), "input_layernorm.weight"),
    ]
    if cfg.sandwich_norms:  # Gemma 2/3 name the pre-MLP norm pre_feedforward (post_attention is after attention)
        out += [
            layer(("post_attn_norm", "scale"), (None,), "pre_feedforward_layernorm.weight"),
            layer(("attn_out_norm", "scale"), (None,), "post_attention_layernorm.weight"),
            layer(("mlp_out_norm", "scale"), (None,), "post_feedforward_layernorm.weight"),
        ]
    else:
        out.append(layer(("post_attn_norm", "scale"), (None,), "post_attention_layernorm.weight"))
    for p, axis in heads.items():
        out.append(layer(("attn", f"{p}_proj", "kernel"), ("embed", axis), f"self_attn.{p}_proj.weight", True))
        if cfg.qkv_bias:
            out.append(layer(("attn", f"{p}_proj", "bias"), (axis,), f"self_attn.{p}_proj.bias"))
    out.append(layer(("attn", "o_proj", "kernel"), ("heads", "embed"), "self_attn.o_proj.weight", True))
    if cfg.o_bias:
        out.append(layer(("attn", "o_proj", "bias"), (None,), "self_attn.o_proj.bias"))
    if cfg.qk_norm:
        out += [layer(("attn", f"{p}_norm", "scale"), (None,), f"self_attn.{p}_norm.weight") for p in "qk"]
    out += [
        layer(("mlp", "gate_proj", "kernel"), ("embed", "mlp"), "mlp.gate_proj.weight", True),
        layer(("mlp", "up_proj", "kernel"), ("embed", "mlp"), "mlp.up_proj.weight", True),
        layer(("mlp", "down_proj", "kernel"), ("mlp", "embed"), "mlp.down_proj.weight", True),
    ]
    if not cfg.tie_embeddings:
        out.append(Weight(("lm_head", "kernel"), ("embed", "vocab"), "lm_head.weight", True))
    return out


_BUILDER = stack.Builder(Llama, weights, "llama")
model_fns, init_params, from_params, init = (
    _BUILDER.model_fns,
    _BUILDER.init_params,
    _BUILDER.from_params,
    _BUILDER.init,
)


@functools.cache
def features_fn(cfg: LlamaConfig):
    """``apply(params, tokens, positions, cache) -> (logits [B, T, V] float32, hidden [B, T, D], cache)``: the
    forward pass of ``model_fns``' ``apply_fn`` that also returns the final-norm hidden states (the same object for
    equal configs)."""

    def apply(params, tokens, positions, cache):
        module, variables = stack.bind(Llama, cfg, params)
        (logits, x), cache = module.apply(variables, tokens, positions, cache, "both")
        return logits, x, cache

    return apply


@functools.cache
def taps_fn(cfg: LlamaConfig, taps: tuple[int, ...]):
    """``apply(params, tokens, positions, cache) -> (logits [B, T, V] float32, taps [B, T, len(taps) × hidden],
    cache)``: the forward pass that also returns the hidden states entering layers ``taps`` (an EAGLE-3 head's
    target features), concatenated in that order (the same object for equal arguments)."""

    def apply(params, tokens, positions, cache):
        module, variables = stack.bind(Llama, cfg, params)
        (logits, x), cache = module.apply(variables, tokens, positions, cache, tuple(taps))
        return logits, x, cache

    return apply


def hidden_and_head(cfg: LlamaConfig, params, tokens, positions, cache):
    """``(hidden [B, T, D], head [D, embed_rows])``: the final hidden states and the LM head matrix (the transposed
    embedding when tied), so a caller can compute logits at a subset of positions (over the embedding rows: map
    labels with ``to_rows``; ``soft_cap`` them as the model does)."""
    module, variables = stack.bind(Llama, cfg, params)
    x, _ = module.apply(variables, tokens, positions, cache, True)
    head = params["embed"]["embedding"].T if cfg.tie_embeddings else params["lm_head"]["kernel"]
    return x, head


def _ignored(cfg: LlamaConfig, name: str) -> bool:
    return name.endswith("rotary_emb.inv_freq") or (cfg.tie_embeddings and name == "lm_head.weight")


FAMILY = families.register(
    families.ModelFamily(
        name="llama",
        config_class=LlamaConfig,
        from_params=from_params,
        init_params=init_params,
        weights=weights,
        architectures=ARCHITECTURES,
        config_from_hf=config_from_hf,
        config_to_hf=config_to_hf,
        ignored=_ignored,
        splits_layers=True,
    )
)
