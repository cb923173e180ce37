"""The layer stack every built-in family shares, in both parameter layouts (``jaxspec.models.families.split_layers``).

Stacked: one ``nn.scan`` over ``layer_cls`` (params ``layers``, each weight with a leading ``[layers]`` axis), so
compile time does not grow with depth. The whole KV cache rides in the scan carry and each layer scatters its new
entries into it in place: passing it as scanned inputs/outputs would make XLA build a second full cache every step.
Split: one ``layer_cls`` module per layer (params ``layers_0`` ...), each weight in its own array, which decodes
faster where XLA copies each layer's slice out of a stack (XLA:CPU does).

``Builder`` turns a family's top-level module class and weight table into the functions every family module
exports (``model_fns``, ``init_params``, ``from_params``, ``init``), so a new family writes only its modules. The
building blocks more than one family uses live here too: ``dense``, ``ACTIVATIONS``, ``LayerNorm``, ``MLP``
(GPT-style, with biases) and ``cached_attention``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxspec.core import dtypes
from jaxspec.core.cache import KVCache, causal_mask, write_layer
from jaxspec.core.model import CausalLM
from jaxspec.models import families, quant

ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "silu": nn.silu,
    "gelu": functools.partial(nn.gelu, approximate=False),
    "gelu_tanh": functools.partial(nn.gelu, approximate=True),
    "relu": nn.relu,
}
"""Activation functions by the name configs use (each family accepts its own subset)."""


def embed(rows: int, name: str, cfg, std: float) -> quant.Embed:
    """A ``rows × cfg.hidden_size`` embedding table in ``cfg``'s dtype, normal(``std``) init, float or int8
    (``jaxspec.models.quant``); ``attend`` is the tied LM head."""
    return quant.Embed(
        rows,
        cfg.hidden_size,
        dtype=cfg.jnp_dtype,
        param_dtype=cfg.jnp_dtype,
        embedding_init=nn.initializers.normal(std),
        min_rows=getattr(cfg, "min_rows", 1),
        name=name,
    )


def check_activation(name: str, allowed: tuple[str, ...]) -> None:
    """``ValueError`` unless ``name`` is one of a family's ``allowed`` activations."""
    if name not in allowed:
        raise ValueError(f"activation must be one of {sorted(allowed)}, got {name!r}")


def dense(features: int, name: str, cfg, *, bias: bool, std: float | None = None) -> quant.Dense:
    """A ``features``-wide projection in ``cfg``'s dtype (``cfg.jnp_dtype``), normal(``std`` or ``cfg.init_std``)
    init, with or without bias; its kernel float or int8 (``jaxspec.models.quant``)."""
    return quant.Dense(
        features,
        use_bias=bias,
        dtype=cfg.jnp_dtype,
        param_dtype=cfg.jnp_dtype,
        kernel_init=nn.initializers.normal(cfg.init_std if std is None else std),
        min_rows=getattr(cfg, "min_rows", 1),
        name=name,
    )


class LayerNorm(nn.Module):
    """Layer normalization over the last axis with scale and bias, computed in float32."""

    eps: float
    dtype: Any

    @nn.compact
    def __call__(self, x):
        scale = self.param("scale", nn.initializers.ones, (x.shape[-1],), self.dtype)
        bias = self.param("bias", nn.initializers.zeros, (x.shape[-1],), self.dtype)
        xf = x.astype(jnp.float32)
        mean = jnp.mean(xf, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(xf - mean), axis=-1, keepdims=True)
        y = (xf - mean) * jax.lax.rsqrt(var + self.eps)
        return (y * scale.astype(jnp.float32) + bias.astype(jnp.float32)).astype(self.dtype)


class MLP(nn.Module):
    """A GPT-style MLP with biases: ``names[1](act(names[0](x)))``, ``cfg.intermediate_size`` wide, activation
    ``cfg.activation``; ``names`` are the two projections' parameter names (GPT-2's ``c_fc``/``c_proj``, GPT-NeoX's
    ``dense_h_to_4h``/``dense_4h_to_h``)."""

    cfg: Any
    names: tuple[str, str]

    @nn.compact
    def __call__(self, x):
        cfg, (up, down) = self.cfg, self.names
        hidden = ACTIVATIONS[cfg.activation](dense(cfg.intermediate_size, up, cfg, bias=True)(x))
        return dense(cfg.hidden_size, down, cfg, bias=True)(hidden)


def apply_layers(layer_cls, cfg, carry, positions, split: bool, taps: tuple[int, ...] = ()):
    """Run ``cfg.num_layers`` of ``layer_cls(cfg)`` (called as ``(carry, layer, positions) -> (carry, None)``) over
    ``carry``, inside the calling module's ``nn.compact`` method; returns the final carry. With ``taps`` (layer
    indices), returns ``(carry, tapped)``: ``tapped[i]`` is the hidden state ``carry[0]`` *entering* layer
    ``taps[i]`` (Hugging Face's ``hidden_states[taps[i]]``: index 0 is the embedding output, ``num_layers`` the
    last layer's output before the final norm)."""
    if any(not 0 <= t <= cfg.num_layers for t in taps):
        raise ValueError(f"taps must be layer indices in [0, {cfg.num_layers}], got {taps!r}")
    if split:
        tapped = {}
        for i in range(cfg.num_layers):
            if i in taps:
                tapped[i] = carry[0]
            carry, _ = layer_cls(cfg, name=f"layers_{i}")(carry, i, positions)
        if cfg.num_layers in taps:
            tapped[cfg.num_layers] = carry[0]
        return (carry, [tapped[t] for t in taps]) if taps else carry
    cls = _Tapped(layer_cls) if taps else layer_cls
    layers = nn.scan(
        cls,
        variable_axes={"params": 0},
        split_rngs={"params": True},
        in_axes=(0, nn.broadcast),
        out_axes=0,
        length=cfg.num_layers,
    )(cfg, name="layers")
    out, entering = layers(carry, jnp.arange(cfg.num_layers), positions)
    if not taps:
        return out
    return out, [out[0] if t == cfg.num_layers else entering[t] for t in taps]


@functools.cache
def _Tapped(layer_cls):  # noqa: N802 (a class factory)
    """``layer_cls`` that also returns the hidden state entering it (the stacked layout's taps)."""

    class Tapped(layer_cls):  # type: ignore[misc, valid-type]
        def __call__(self, carry, layer, positions):
            out, _ = super().__call__(carry, layer, positions)
            return out, carry[0]

    Tapped.__name__ = layer_cls.__name__  # the same parameter names as the untapped stack
    return Tapped


def cached_attention(q, k, v, k_all, v_all, layer, positions, scale: float, dtype):
    """Multi-head attention over the cache for the GPT families (one KV head per query head): writes this pass's
    ``k, v [B, T, heads, head_dim]`` into ``k_all, v_all [layers, B, S, heads, head_dim]`` at ``layer`` and
    ``positions``, then attends causally with scores in float32 times ``scale``. Returns ``(out [B, T, heads *
    head_dim] in dtype, k_all, v_all)``."""
    batch, length, h, d = q.shape
    k_all, v_all = write_layer(k_all, layer, k, positions), write_layer(v_all, layer, v, positions)
    k_cache, v_cache = k_all[layer], v_all[layer]
    scores = jnp.einsum("bthd,bshd->bhts", q, k_cache, preferred_element_type=jnp.float32) * scale
    mask = causal_mask(positions, k_cache.shape[1])[:, None]
    scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(scores, axis=-1).astype(dtype)
    return jnp.einsum("bhts,bshd->bthd", probs, v_cache).reshape(batch, length, h * d), k_all, v_all


def bind(module_cls, cfg, params) -> tuple[nn.Module, dict]:
    """``(module, variables)`` for ``params`` in either layout: a tuple under ``"layers"`` (split) becomes the
    ``layers_i`` entries of ``module_cls(cfg, split=True)``; a stacked tree goes to ``module_cls(cfg)`` as is."""
    layers = params.get("layers")
    if isinstance(layers, tuple):
        named = {k: v for k, v in params.items() if k != "layers"}
        named.update({f"layers_{i}": p for i, p in enumerate(layers)})
        return module_cls(cfg, split=True), {"params": named}
    return module_cls(cfg), {"params": params}


class MultiHeadShape:
    """The derived shape fields of a config with ``hidden_size``, ``num_heads`` and ``dtype`` and no grouped-query
    attention (GPT-2, GPT-NeoX), as ``LlamaConfig`` has them."""

    # declared for the type checker only (no defaults: the dataclass config that subclasses this declares the fields)
    hidden_size: int
    num_heads: int
    dtype: str

    @property
    def head_dim(self) -> int:
        """``hidden_size // num_heads``."""
        return self.hidden_size // self.num_heads

    @property
    def num_kv_heads(self) -> int:
        """``num_heads``: every head has its own keys and values."""
        return self.num_heads

    @property
    def jnp_dtype(self):
        """The ``jnp`` dtype named by ``dtype``."""
        return dtypes.DTYPES[self.dtype]


@functools.cache
def _model_fns(module_cls, cfg):
    def apply_fn(params, tokens, positions, cache):
        module, variables = bind(module_cls, cfg, params)
        return module.apply(variables, tokens, positions, cache)

    def init_cache(batch_size: int, max_length: int) -> KVCache:
        return KVCache.zeros(cfg.num_layers, batch_size, max_length, cfg.num_kv_heads, cfg.head_dim, cfg.jnp_dtype)

    return apply_fn, init_cache


@dataclasses.dataclass(frozen=True)
class Builder:
    """A family's model functions from its top-level module class (``module_cls(cfg, split=...)``, called as
    ``(tokens, positions, cache) -> (logits, cache)``), its weight table and its default model name. The config
    must have ``num_layers``, ``num_kv_heads``, ``head_dim`` and ``jnp_dtype``."""

    module_cls: type[nn.Module]
    weights: Callable[[Any], list[families.Weight]]
    name: str

    def model_fns(self, cfg) -> tuple[Callable, Callable]:
        """``(apply_fn, init_cache)`` for a config; the same objects for equal configs, so compiled code is shared.
        ``apply_fn`` takes the params stacked (``init_params``) or split per layer (``from_params``' default)."""
        # a class is hashable; mypy reads flax's per-instance Module.__hash__ as the class object's
        return _model_fns(self.module_cls, cfg)  # type: ignore[arg-type]

    def init_params(self, cfg, seed: int = 0):
        """Random parameters, stacked (each module's own initializers: normal(init_std) weights, unit norm scales,
        zero biases)."""
        _, init_cache = self.model_fns(cfg)
        tokens = jnp.zeros((1, 1), jnp.int32)
        return jax.jit(self.module_cls(cfg).init)(jax.random.key(seed), tokens, tokens, init_cache(1, 1))["params"]

    def from_params(
        self, cfg, params, *, tokenizer=None, eos_token_id=None, name: str | None = None, split_layers: bool = True
    ) -> CausalLM:
        """A ``CausalLM`` over ``params`` (the tree ``init_params`` makes, or one already split) with this family's
        apply and cache functions. ``split_layers`` (default): hold each layer's weights in their own arrays
        (``families.split_layers``), which decodes faster where XLA copies slices out of stacked weights (XLA:CPU
        does: docs/history/cpu-costs.md) and compiles each layer once per program instead of once; False keeps the
        stack (``nn.scan``: compile time independent of depth)."""
        params = families.split_layers(params) if split_layers else families.stack_layers(params)
        return CausalLM.from_config(
            self.model_fns(cfg),
            cfg,
            params,
            tokenizer=tokenizer,
            eos_token_id=eos_token_id,
            name=self.name if name is None else name,
            param_axes=families.axes_table(self.weights(cfg)),
        )

    def init(self, cfg, seed: int = 0, **kwargs) -> CausalLM:
        """A randomly initialized ``CausalLM`` (``from_params``' keywords)."""
        return self.from_params(cfg, self.init_params(cfg, seed), **kwargs)
