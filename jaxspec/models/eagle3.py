"""An EAGLE-3 draft head (arXiv 2503.01840): drafts tokens from the fused hidden states of three of the target's
layers, and from its own hidden state at later draft steps.

At position ``j`` the head reads the embedding ``e`` of token ``j+1`` and a feature ``g``: on the first draft step
(and over the verified prefix) ``g = fc([h_low, h_mid, h_high])``, the target's hidden states entering the
``aux_layers`` at position ``j`` concatenated and projected to the head's width; on later steps ``g`` is the
head's own output at the step before. One decoder layer whose attention reads ``[input_norm(e), hidden_norm(g)]``
(twice the width; its query/key/value projections are ``2·hidden`` wide), with the residual ``g`` (or
``hidden_norm(g)`` with ``norm_before_residual``), then the usual post-attention norm and gated MLP; its output
``x`` is what the next step feeds back, and ``lm_head(final_norm(x))`` gives logits over the head's own draft
vocabulary, whose row ``d`` is target id ``vocab_ids[d]`` (EAGLE's ``d2t``: ``d + d2t[d]``). Outside the draft
vocabulary the logits are -inf, so q = 0 there and the rejection sampler stays exact.

Parameters: the head's own ``fc``, ``layer`` (``input_norm``, ``hidden_norm``, ``attn``, ``post_attn_norm``,
``mlp``), ``final_norm``, ``lm_head [hidden, draft vocab]``, and ``embed [vocab, hidden]``: the target's input
embedding unless a checkpoint brings its own. The layer config is a ``LlamaConfig`` (the head's sizes, one layer,
``vocab_size`` the target's).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.core.cache import KVCache
from jaxspec.models import llama, quant
from jaxspec.models.llama import LlamaConfig

OWN = ("fc", "layer", "final_norm", "lm_head")  # the head's own (trained, stored) parameters; embed is the target's


@dataclasses.dataclass(frozen=True)
class Eagle3Config:
    """An EAGLE-3 head's static configuration (hashable: part of compiled programs' keys).

    Attributes:
      layer: the decoder layer's ``LlamaConfig`` (head width, heads, MLP, RoPE, norms; ``num_layers`` 1;
        ``vocab_size`` the target's).
      aux_layers: the target layers whose entering hidden states are fused (Hugging Face's ``hidden_states``
        indices: 0 is the embedding output).
      target_hidden: the width of each of those hidden states (the target's ``hidden_size``).
      vocab_ids: the target id of each draft-vocabulary row (all distinct, in ``[0, vocab_size)``).
      norm_before_residual: the layer's residual is ``hidden_norm(g)`` rather than ``g``.
    """

    layer: LlamaConfig
    aux_layers: tuple[int, ...]
    target_hidden: int
    vocab_ids: tuple[int, ...]
    norm_before_residual: bool = False

    def __post_init__(self):
        ids = np.asarray(self.vocab_ids)
        if ids.ndim != 1 or not ids.size or len(set(self.vocab_ids)) != ids.size:
            raise ValueError("vocab_ids must be distinct target ids, one per draft-vocabulary row")
        if ids.min() < 0 or ids.max() >= self.layer.vocab_size:
            raise ValueError(f"vocab_ids must lie in [0, {self.layer.vocab_size}), got {ids.min()}..{ids.max()}")
        if not self.aux_layers:
            raise ValueError("aux_layers must name at least one target layer")
        if self.feature_size == self.layer.hidden_size:  # the head tells fused inputs from its own by width
            raise ValueError(
                f"the fused features ({len(self.aux_layers)} × {self.target_hidden}) must differ in width from the "
                f"head ({self.layer.hidden_size})"
            )

    @property
    def hidden_size(self) -> int:
        return self.layer.hidden_size

    @property
    def feature_size(self) -> int:
        """The width of the target features the head reads: the tapped hidden states concatenated."""
        return len(self.aux_layers) * self.target_hidden

    @property
    def jnp_dtype(self):
        return self.layer.jnp_dtype

    @property
    def vocab_size(self) -> int:
        return self.layer.vocab_size

    @property
    def draft_vocab_size(self) -> int:
        return len(self.vocab_ids)

    @property
    def num_layers(self) -> int:
        return self.layer.num_layers


def default_aux_layers(num_layers: int) -> tuple[int, int, int]:
    """EAGLE-3's low, middle and high layers of a ``num_layers``-layer target: (2, L // 2, L - 3)."""
    return 2, num_layers // 2, num_layers - 3


@functools.cache
def _row_of(cfg: Eagle3Config) -> np.ndarray:
    """Target id -> draft row, ``draft_vocab_size`` (a -inf column) for ids outside the draft vocabulary."""
    rows = np.full(cfg.vocab_size, cfg.draft_vocab_size, np.int32)
    rows[np.asarray(cfg.vocab_ids)] = np.arange(cfg.draft_vocab_size, dtype=np.int32)
    return rows


class Context(NamedTuple):
    """A round's context ids outside the draft vocabulary (``context``): ``ids [B, P]`` (``vocab_size`` pads a row
    with fewer) and ``rows [B, vocab_size]``, each target id's index into a row's logits ``[draft vocabulary, the
    P context ids, -inf]``; ``columns [B, P, hidden]``, their rows of the embedding table (the LM head's
    columns where the target ties the two)."""

    ids: jax.Array
    rows: jax.Array
    columns: jax.Array


def context(cfg: Eagle3Config, params, tokens: jax.Array, length: jax.Array, width: int) -> Context:
    """Each row's context ids outside the draft vocabulary: the distinct ids among ``tokens [B, S]``'s first
    ``length [B]`` that the draft vocabulary lacks, the ``width`` smallest of them, with their rows of the head's
    embedding table (``params["embed"]``)."""
    vocab, (batch, size) = cfg.vocab_size, tokens.shape
    base = jnp.asarray(_row_of(cfg))
    valid = (jnp.arange(size)[None] < length[:, None]) & (tokens >= 0) & (tokens < vocab)
    ids = jnp.where(valid, tokens, vocab)
    ids = jnp.sort(jnp.where(base[jnp.clip(ids, 0, vocab - 1)] < cfg.draft_vocab_size, vocab, ids), axis=-1)
    first = (ids < vocab) & (ids != jnp.concatenate([jnp.full((batch, 1), -1, ids.dtype), ids[:, :-1]], axis=-1))
    rank = jnp.where(first, jnp.cumsum(first, axis=-1) - 1, width)
    rows = jnp.arange(batch)[:, None]
    ids = jnp.full((batch, width + 1), vocab, ids.dtype).at[rows, jnp.minimum(rank, width)].set(ids)[:, :width]
    pad = cfg.draft_vocab_size + width  # the -inf column
    index = jnp.broadcast_to(jnp.where(base == cfg.draft_vocab_size, pad, base), (batch, vocab))
    index = index.at[rows, ids].set(cfg.draft_vocab_size + jnp.arange(width, dtype=index.dtype), mode="drop")
    scale, _ = quant.scale_of(params, "embed")
    columns = quant.lookup(params["embed"], scale, jnp.minimum(ids, vocab - 1), cfg.jnp_dtype)
    return Context(ids, index, columns)


def to_full_vocab(cfg: Eagle3Config, logits: jax.Array) -> jax.Array:
    """Draft-vocabulary logits ``[..., draft_vocab_size]`` -> ``[..., vocab_size]``, -inf outside it."""
    pad = jnp.full((*logits.shape[:-1], 1), -jnp.inf, logits.dtype)
    return jnp.take(jnp.concatenate([logits, pad], axis=-1), jnp.asarray(_row_of(cfg)), axis=-1)


class Eagle3Layer(nn.Module):
    """The head's decoder layer: ``(e, g, positions, k_all, v_all) -> (x, k_all, v_all)`` (module docstring)."""

    cfg: LlamaConfig
    norm_before_residual: bool = False

    @nn.compact
    def __call__(self, e, g, positions, k_all, v_all):
        cfg = self.cfg
        h = llama.rms_norm(cfg, "hidden_norm")(g)
        x_in = jnp.concatenate([llama.rms_norm(cfg, "input_norm")(e), h], axis=-1)
        attn, k_all, v_all = llama.Attention(cfg, name="attn")(x_in, positions, k_all, v_all, 0)
        x = (h if self.norm_before_residual else g) + attn
        x = x + llama.MLP(cfg, name="mlp")(llama.rms_norm(cfg, "post_attn_norm")(x))
        return x, k_all, v_all


class Eagle3Head(nn.Module):
    """``(tokens [B, T], feats [B, T, F], positions [B, T], cache)`` -> ``(logits [B, T, V] float32, hidden
    [B, T, hidden], cache)``: at position ``j``, ``tokens`` holds token ``j+1`` and ``feats`` either the target's
    tapped features at ``j`` (``F = feature_size``: fused by ``fc``) or the head's own hidden state (``F =
    hidden``). ``full_vocab=False`` returns the logits over the draft vocabulary (``[B, T, draft_vocab_size]``).
    With ``extra`` (a ``Context``) its ids outside the draft vocabulary get logits too, ``final_norm(x)`` times
    their ``columns``."""

    cfg: Eagle3Config

    @nn.compact
    def __call__(
        self, tokens, feats, positions, cache: KVCache, full_vocab: bool = True, last_only: bool = False, extra=None
    ):
        cfg, lc = self.cfg, self.cfg.layer
        dtype, width = lc.jnp_dtype, lc.hidden_size
        init = nn.initializers.normal(lc.init_std)
        table, table_scale, _ = quant.param_with_scale(self, "embed", init, (lc.vocab_size, width), dtype)
        e = quant.lookup(table, table_scale, tokens, dtype)
        if lc.embed_scale:  # the target's own input scaling (Gemma), as its embedding is read
            e = e * jnp.asarray(width**0.5, dtype)
        if lc.embedding_multiplier != 1.0:
            e = e * lc.embedding_multiplier
        fc = llama.dense(width, "fc", lc)  # declared whichever way this call goes: one parameter tree
        if feats.shape[-1] == width:
            g = feats.astype(dtype)
            if self.is_initializing():
                fc(jnp.zeros((*feats.shape[:-1], cfg.feature_size), dtype))
        elif feats.shape[-1] == cfg.feature_size:
            g = fc(feats.astype(dtype))
        else:
            raise ValueError(f"feats must be {cfg.feature_size} (target) or {width} (own) wide, got {feats.shape}")
        x, k, v = Eagle3Layer(lc, cfg.norm_before_residual, name="layer")(e, g, positions, cache.k, cache.v)
        f = llama.rms_norm(lc, "final_norm")(x[:, -1:] if last_only else x)
        head = self.param("lm_head", init, (width, cfg.draft_vocab_size), dtype)
        logits = quant.project(f, head, None, dtype, jnp.float32, min_rows=lc.min_rows)
        if not full_vocab:
            return logits, x, KVCache(k, v)
        if extra is None:
            return to_full_vocab(cfg, logits), x, KVCache(k, v)
        more = jnp.einsum("bth,bph->btp", f, extra.columns.astype(dtype), preferred_element_type=jnp.float32)
        pad = jnp.full((*logits.shape[:-1], 1), -jnp.inf, logits.dtype)
        logits = jnp.concatenate([logits, more, pad], axis=-1)
        return jnp.take_along_axis(logits, extra.rows[:, None], axis=-1), x, KVCache(k, v)


@functools.cache
def head_fns(cfg: Eagle3Config):
    """``(apply_fn, init_cache)`` of a head config (the same objects for equal configs)."""

    def apply_fn(params, tokens, feats, positions, cache, full_vocab=True, last_only=False, extra=None):
        head = Eagle3Head(cfg)
        return head.apply({"params": params}, tokens, feats, positions, cache, full_vocab, last_only, extra)

    def init_cache(batch_size: int, max_length: int) -> KVCache:
        lc = cfg.layer
        assert lc.head_dim is not None  # LlamaConfig.__post_init__ sets it
        return KVCache.zeros(1, batch_size, max_length, lc.num_kv_heads, lc.head_dim, lc.jnp_dtype)

    return apply_fn, init_cache


def head_config(
    target_cfg: LlamaConfig,
    vocab_ids,
    *,
    aux_layers: tuple[int, ...] | None = None,
    intermediate_size: int | None = None,
    norm_before_residual: bool = False,
) -> Eagle3Config:
    """The config of an EAGLE-3 head for ``target_cfg``: its width, heads and RoPE, one layer, draft vocabulary
    ``vocab_ids`` (target ids), the target's ``aux_layers`` (default ``default_aux_layers``)."""
    if not isinstance(target_cfg, LlamaConfig):
        raise ValueError(f"an EAGLE-3 head needs a Llama-family target, got {type(target_cfg).__name__}")
    if target_cfg.vocab_ids:
        raise ValueError("an EAGLE-3 head's target must have the full vocabulary (its config has vocab_ids)")
    fields = {f: getattr(target_cfg, f) for f in target_cfg.__dataclass_fields__}
    fields.update(num_layers=1, vocab_ids=(), layer_types=fields["layer_types"][-1:])
    if intermediate_size is not None:
        fields["intermediate_size"] = int(intermediate_size)
    aux = tuple(default_aux_layers(target_cfg.num_layers) if aux_layers is None else aux_layers)
    if any(not isinstance(a, (int, np.integer)) or not 0 <= a <= target_cfg.num_layers for a in aux):
        raise ValueError(f"aux_layers must be layer indices in [0, {target_cfg.num_layers}], got {aux!r}")
    return Eagle3Config(
        LlamaConfig(**fields),
        tuple(int(a) for a in aux),
        target_cfg.hidden_size,
        tuple(int(i) for i in vocab_ids),
        norm_before_residual,
    )


def init_own(cfg: Eagle3Config, seed: int = 0, lm_head=None) -> dict:
    """Random own parameters: normal(init_std) weights and unit norms; ``lm_head`` (``[hidden, draft vocab]``, e.g.
    the target's LM head at the draft vocabulary's columns) replaces the random one when given."""
    apply_fn, init_cache = head_fns(cfg)
    toks = jnp.zeros((1, 1), jnp.int32)
    feats = jnp.zeros((1, 1, cfg.feature_size), cfg.jnp_dtype)
    params = jax.jit(Eagle3Head(cfg).init)(jax.random.key(seed), toks, feats, toks, init_cache(1, 1))["params"]
    own = {k: params[k] for k in OWN}
    if lm_head is not None:
        own["lm_head"] = jnp.asarray(lm_head, cfg.jnp_dtype).reshape(own["lm_head"].shape)
    return own


def target_head_columns(cfg: Eagle3Config, target_cfg: LlamaConfig, target_params) -> jax.Array:
    """The target's LM head at the draft vocabulary's columns (``[hidden, draft vocab]``): a new head's LM head
    starts as the target's."""
    ids = jnp.asarray(np.asarray(cfg.vocab_ids))
    if target_cfg.tie_embeddings:
        embed = target_params["embed"]
        rows, (scale, _) = jnp.take(embed["embedding"], ids, axis=0), quant.scale_of(embed, "embedding")
        return rows.T if scale is None else quant.dequantize_table(rows, jnp.take(scale, ids), cfg.jnp_dtype).T
    head = target_params["lm_head"]
    columns, (scale, _) = jnp.take(head["kernel"], ids, axis=1), quant.scale_of(head, "kernel")
    return columns if scale is None else quant.dequantize_kernel(columns, jnp.take(scale, ids), cfg.jnp_dtype)
