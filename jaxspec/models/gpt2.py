"""GPT-2 decoder in Flax: learned position embeddings, pre-LayerNorm (with bias), fused q/k/v projection, GELU MLP,
biases everywhere and an LM head tied to the token embeddings.

Same contract, parameter layouts and cache design as ``models.llama``: layers held split per layer by
``from_params`` or stacked (``nn.scan``, every layer weight with a leading ``[layers]`` axis; ``models.stack``), and
one ``KVCache`` with ``[layers, B, S, heads, head_dim]`` updated in place.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax.numpy as jnp

from jaxspec.core import dtypes
from jaxspec.core.cache import KVCache
from jaxspec.models import families, stack
from jaxspec.models.families import Weight
from jaxspec.models.stack import LayerNorm

_ACTIVATIONS = ("gelu_tanh", "gelu")  # of stack.ACTIVATIONS


@dataclasses.dataclass(frozen=True)
class GPT2Config(stack.MultiHeadShape):
    """GPT-2's static shape (frozen, hashable).

    Attributes:
      vocab_size, hidden_size, num_layers, num_heads: vocabulary, width, blocks and heads (head_dim = hidden ÷ heads).
      max_positions: rows of the learned position table; intermediate_size: MLP width (default 4 × hidden).
      layer_norm_eps, activation, scale_attn_weights: as the comments below; dtype: weights', activations' and
      caches' dtype name (logits are float32); init_std: standard deviation of random initialization;
      min_rows: every weight product over fewer rows computed over this many (``LlamaConfig.min_rows``).
    """

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    max_positions: int = 1024  # rows of the learned position table (n_positions)
    intermediate_size: int | None = None  # None: 4 * hidden_size (n_inner)
    layer_norm_eps: float = 1e-5
    activation: str = "gelu_tanh"  # "gelu_tanh" (HF gelu_new / gelu_pytorch_tanh) or "gelu" (exact)
    scale_attn_weights: bool = True  # scores / sqrt(head_dim)
    dtype: str = "float32"  # weights, activations and cache; logits are always float32
    init_std: float = 0.02
    min_rows: int = 1

    def __post_init__(self):
        object.__setattr__(self, "dtype", dtypes.check(self.dtype))
        families.check_min_rows(self.min_rows)
        stack.check_activation(self.activation, _ACTIVATIONS)
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size ({self.hidden_size}) must divide by num_heads ({self.num_heads})")
        if self.intermediate_size is None:
            object.__setattr__(self, "intermediate_size", 4 * self.hidden_size)


class Attention(nn.Module):
    """Multi-head causal self-attention of one block (fused q/k/v projection) over the cache at ``positions``."""

    cfg: GPT2Config

    @nn.compact
    def __call__(self, x, positions, k_all, v_all, layer):
        """``k_all, v_all [layers, B, S, heads, head_dim]`` are updated in place at ``layer``."""
        cfg = self.cfg
        batch, length, _ = x.shape
        h, d = cfg.num_heads, cfg.head_dim
        qkv = stack.dense(3 * cfg.hidden_size, "c_attn", cfg, bias=True)(x)
        q, k, v = (t.reshape(batch, length, h, d) for t in jnp.split(qkv, 3, axis=-1))
        scale = d**-0.5 if cfg.scale_attn_weights else 1.0
        out, k_all, v_all = stack.cached_attention(q, k, v, k_all, v_all, layer, positions, scale, cfg.jnp_dtype)
        return stack.dense(cfg.hidden_size, "c_proj", cfg, bias=True)(out), k_all, v_all


class Block(nn.Module):
    """One pre-norm block (attention then MLP, each with a residual): one layer of ``models.stack``."""

    cfg: GPT2Config

    @nn.compact
    def __call__(self, carry, layer, positions):
        cfg = self.cfg
        x, k_all, v_all = carry
        attn, k_all, v_all = Attention(cfg, name="attn")(
            LayerNorm(cfg.layer_norm_eps, cfg.jnp_dtype, name="ln_1")(x), positions, k_all, v_all, layer
        )
        x = x + attn
        x = x + stack.MLP(cfg, ("c_fc", "c_proj"), name="mlp")(
            LayerNorm(cfg.layer_norm_eps, cfg.jnp_dtype, name="ln_2")(x)
        )
        return (x, k_all, v_all), None


class GPT2(nn.Module):
    """The whole model: token + learned position embeddings, the blocks (stacked, or ``split`` one module each:
    ``models.stack``), final norm, tied LM head."""

    cfg: GPT2Config
    split: bool = False

    @nn.compact
    def __call__(self, tokens, positions, cache: KVCache):
        cfg = self.cfg

        wte = stack.embed(cfg.vocab_size, "wte", cfg, cfg.init_std)
        # Positions past the table (only reachable beyond max_positions) clamp to its last row.
        x = wte(tokens) + stack.embed(cfg.max_positions, "wpe", cfg, cfg.init_std / 2)(
            jnp.minimum(positions, cfg.max_positions - 1)
        )
        x, k, v = stack.apply_layers(Block, cfg, (x, cache.k, cache.v), positions, self.split)
        x = LayerNorm(cfg.layer_norm_eps, cfg.jnp_dtype, name="ln_f")(x)
        return wte.attend(x).astype(jnp.float32), KVCache(k, v)


def weights(cfg: GPT2Config) -> list[Weight]:
    """Every weight of ``cfg``'s params tree, once: its path, logical axes (``jaxspec.sharding.RULES``) and Hugging
    Face name. HF GPT-2 uses Conv1D, whose weights are already [in, out]: nothing is transposed. The fused q/k/v
    projection stays replicated: splitting its output axis evenly would cut across q, k and v."""

    def layer(path, axes, hf) -> Weight:
        return Weight(("layers", *path), axes, f"transformer.h.{{i}}.{hf}")

    out = [
        Weight(("wte", "embedding"), ("vocab", "embed"), "transformer.wte.weight"),
        Weight(("wpe", "embedding"), (None, "embed"), "transformer.wpe.weight"),
        Weight(("ln_f", "scale"), (None,), "transformer.ln_f.weight"),
        Weight(("ln_f", "bias"), (None,), "transformer.ln_f.bias"),
    ]
    for ln in ("ln_1", "ln_2"):
        out += [layer((ln, "scale"), (None,), f"{ln}.weight"), layer((ln, "bias"), (None,), f"{ln}.bias")]
    for module, name, axes, bias_axes in (
        ("attn", "c_attn", ("embed", None), (None,)),
        ("attn", "c_proj", ("heads", "embed"), (None,)),
        ("mlp", "c_fc", ("embed", "mlp"), ("mlp",)),
        ("mlp", "c_proj", ("mlp", "embed"), (None,)),
    ):
        out.append(layer((module, name, "kernel"), axes, f"{module}.{name}.weight"))
        out.append(layer((module, name, "bias"), bias_axes, f"{module}.{name}.bias"))
    return out


_BUILDER = stack.Builder(GPT2, weights, "gpt2")
model_fns, init_params, from_params, init = (
    _BUILDER.model_fns,
    _BUILDER.init_params,
    _BUILDER.from_params,
    _BUILDER.init,
)


# ----------------------------------------------------------------------------------------------- Hugging Face

_HF_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}


def config_from_hf(c: dict, model_type: str, dtype: str) -> GPT2Config:
    """``GPT2Config`` from a transformers ``config.json`` dict; ``ValueError`` names a missing or unsupported key."""
    for key in ("vocab_size", "n_embd", "n_layer", "n_head"):
        if c.get(key) is None:
            raise ValueError(f"config.json ({model_type}) is missing {key!r}")
    act = c.get("activation_function", "gelu_new")
    if act not in _HF_ACTIVATIONS:
        raise ValueError(f"activation_function={act!r} is not supported for gpt2; supported: {sorted(_HF_ACTIVATIONS)}")
    for key in ("scale_attn_by_inverse_layer_idx", "add_cross_attention"):
        if c.get(key):
            raise ValueError(f"{key}=True is not supported for gpt2")
    if c.get("tie_word_embeddings", True) is False:
        raise ValueError("tie_word_embeddings=False is not supported for gpt2 (the LM head is the token embedding)")
    return GPT2Config(
        vocab_size=int(c["vocab_size"]),
        hidden_size=int(c["n_embd"]),
        num_layers=int(c["n_layer"]),
        num_heads=int(c["n_head"]),
        max_positions=int(c.get("n_positions") or 1024),
        intermediate_size=c.get("n_inner") or None,
        layer_norm_eps=float(c.get("layer_norm_epsilon", 1e-5)),
        activation=_HF_ACTIVATIONS[act],
        scale_attn_weights=bool(c.get("scale_attn_weights", True)),
        dtype=dtype,
    )


def _ignored(cfg: GPT2Config, name: str) -> bool:
    # the tied LM head, and the causal-mask buffers older checkpoints saved (attn.bias, attn.masked_bias)
    return name == "lm_head.weight" or name.endswith((".attn.bias", ".attn.masked_bias"))


FAMILY = families.register(
    families.ModelFamily(
        name="gpt2",
        config_class=GPT2Config,
        from_params=from_params,
        init_params=init_params,
        weights=weights,
        architectures={"gpt2": "GPT2LMHeadModel"},
        config_from_hf=config_from_hf,
        ignored=_ignored,
        splits_layers=True,
    )
)
