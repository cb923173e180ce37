"""GPT-NeoX decoder in Flax (transformers' ``GPTNeoXForCausalLM``, ``model_type: "gpt_neox"``): the Pythia suite
(70M to 12B, one tokenizer: the classic draft/target pairs of speculative-decoding papers), GPT-NeoX-20B, Dolly v2
and RedPajama-INCITE.

LayerNorm with bias before attention and before the MLP; the two branches added to the residual side by side
(``use_parallel_residual``, Pythia's) or one after the other; one fused q/k/v projection whose output holds each
head's q, k and v in turn; RoPE on the first ``partial_rotary_factor`` of each head (``rotary_pct``, 0.25 in
Pythia), rotate-half within those; a GELU MLP with biases; an untied LM head (``embed_out``) unless the config
ties it.

Same contract, parameter layouts and cache design as ``models.llama``: layers held split per layer by
``from_params`` or stacked (``nn.scan``; ``models.stack``), and one ``KVCache`` with ``[layers, B, S, heads,
head_dim]`` updated in place. The fused projection keeps Hugging Face's layout, so its output axis splits by
whole heads on a mesh whose model axis divides the head count.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax.numpy as jnp

from jaxspec.core import dtypes
from jaxspec.core.cache import KVCache
from jaxspec.models import families, stack
from jaxspec.models.families import Weight
from jaxspec.models.rope import apply_rope, check_rope, rope_from_hf, rotation
from jaxspec.models.stack import LayerNorm

_ACTIVATIONS = ("gelu", "gelu_tanh", "relu")  # of stack.ACTIVATIONS


@dataclasses.dataclass(frozen=True)
class GPTNeoXConfig(stack.MultiHeadShape):
    """GPT-NeoX's static shape (frozen, hashable).

    Attributes:
      vocab_size, hidden_size, num_layers, num_heads, intermediate_size: vocabulary (embedding rows), width, layers,
        heads (head_dim = hidden ÷ heads) and MLP width.
      rotary_dim: dimensions of each head RoPE rotates (even, at most head_dim; None: all of them).
      rope_theta, rope_type, rope_params: RoPE base and scaling (``jaxspec.models.rope.ROPE_TYPES``; params as
        sorted (name, value) pairs).
      parallel_residual: ``x + attn(ln1(x)) + mlp(ln2(x))`` (Pythia) instead of two residual steps.
      attention_bias: biases on the q/k/v and output projections (the MLP always has them).
      tie_embeddings: the LM head is the token embedding (GPT-NeoX checkpoints have their own ``embed_out``).
      layer_norm_eps, activation ("gelu" exact, "gelu_tanh", "relu"), dtype (weights, activations and cache; logits
        are float32), init_std (random initialization), min_rows (every weight product over fewer rows computed
        over this many: ``LlamaConfig.min_rows``).
    """

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    rotary_dim: int | None = None
    rope_theta: float = 10000.0
    rope_type: str = "default"
    rope_params: tuple[tuple[str, float], ...] = ()
    parallel_residual: bool = True
    attention_bias: bool = True
    tie_embeddings: bool = False
    layer_norm_eps: float = 1e-5
    activation: str = "gelu"
    dtype: str = "float32"
    init_std: float = 0.02
    min_rows: int = 1

    def __post_init__(self):
        object.__setattr__(self, "dtype", dtypes.check(self.dtype))
        families.check_min_rows(self.min_rows)
        stack.check_activation(self.activation, _ACTIVATIONS)
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size ({self.hidden_size}) must divide by num_heads ({self.num_heads})")
        if self.rotary_dim == self.head_dim:
            object.__setattr__(self, "rotary_dim", None)
        if self.rotary_dim is not None and (self.rotary_dim % 2 or not 0 < self.rotary_dim < self.head_dim):
            raise ValueError(f"rotary_dim must be even and in (0, head_dim={self.head_dim}], got {self.rotary_dim}")
        params = {
            k: tuple(map(float, v)) if isinstance(v, (list, tuple)) else v for k, v in dict(self.rope_params).items()
        }
        object.__setattr__(self, "rope_params", tuple(sorted(params.items())))
        check_rope(self.rope_type, params)
        rotation(self.rotary_dim or self.head_dim, self.rope_theta, self.rope_type, **params)  # every check, now


def _norm(cfg: GPTNeoXConfig, name: str) -> LayerNorm:
    return LayerNorm(cfg.layer_norm_eps, cfg.jnp_dtype, name=name)


class Attention(nn.Module):
    """Causal self-attention of one layer over ``x [B, T, hidden]`` at ``positions [B, T]``: the fused projection
    (per head: q, k, v), partial RoPE on q and k, the cache written at those positions."""

    cfg: GPTNeoXConfig

    @nn.compact
    def __call__(self, x, positions, k_all, v_all, layer):
        """``k_all, v_all [layers, B, S, heads, head_dim]`` are updated in place at ``layer``."""
        cfg = self.cfg
        batch, length, _ = x.shape
        h, d = cfg.num_heads, cfg.head_dim
        qkv = stack.dense(3 * cfg.hidden_size, "query_key_value", cfg, bias=cfg.attention_bias)(x)
        q, k, v = jnp.split(qkv.reshape(batch, length, h, 3 * d), 3, axis=-1)
        rot = rotation(cfg.rotary_dim or d, cfg.rope_theta, cfg.rope_type, **dict(cfg.rope_params))
        q, k = apply_rope(q, positions, rot), apply_rope(k, positions, rot)
        out, k_all, v_all = stack.cached_attention(q, k, v, k_all, v_all, layer, positions, d**-0.5, cfg.jnp_dtype)
        return stack.dense(cfg.hidden_size, "dense", cfg, bias=cfg.attention_bias)(out), k_all, v_all


class Layer(nn.Module):
    """One layer of ``models.stack``: attention and MLP on their own LayerNorms, side by side (parallel residual)
    or one after the other."""

    cfg: GPTNeoXConfig

    @nn.compact
    def __call__(self, carry, layer, positions):
        cfg = self.cfg
        x, k_all, v_all = carry
        attn, k_all, v_all = Attention(cfg, name="attention")(
            _norm(cfg, "input_layernorm")(x), positions, k_all, v_all, layer
        )
        mlp = stack.MLP(cfg, ("dense_h_to_4h", "dense_4h_to_h"), name="mlp")
        post_norm = _norm(cfg, "post_attention_layernorm")
        if cfg.parallel_residual:
            x = x + attn + mlp(post_norm(x))
        else:
            x = x + attn
            x = x + mlp(post_norm(x))
        return (x, k_all, v_all), None


class GPTNeoX(nn.Module):
    """The whole model: token embedding, the layers (stacked, or ``split`` one module each: ``models.stack``), final
    LayerNorm, LM head."""

    cfg: GPTNeoXConfig
    split: bool = False

    @nn.compact
    def __call__(self, tokens, positions, cache: KVCache):
        cfg = self.cfg
        embed = stack.embed(cfg.vocab_size, "embed_in", cfg, cfg.init_std)
        x, k, v = stack.apply_layers(Layer, cfg, (embed(tokens), cache.k, cache.v), positions, self.split)
        x = _norm(cfg, "final_layer_norm")(x)
        logits = embed.attend(x) if cfg.tie_embeddings else stack.dense(cfg.vocab_size, "embed_out", cfg, bias=False)(x)
        return logits.astype(jnp.float32), KVCache(k, v)


def weights(cfg: GPTNeoXConfig) -> list[Weight]:
    """Every weight of ``cfg``'s params tree, once: its path, logical axes (``jaxspec.sharding.RULES``), Hugging Face
    name and whether it is the transpose of torch's ``Linear`` weight."""

    def layer(path, axes, hf, transpose=False) -> Weight:
        return Weight(("layers", *path), axes, f"gpt_neox.layers.{{i}}.{hf}", transpose)

    out = [
        Weight(("embed_in", "embedding"), ("vocab", "embed"), "gpt_neox.embed_in.weight"),
        Weight(("final_layer_norm", "scale"), (None,), "gpt_neox.final_layer_norm.weight"),
        Weight(("final_layer_norm", "bias"), (None,), "gpt_neox.final_layer_norm.bias"),
    ]
    for ln in ("input_layernorm", "post_attention_layernorm"):
        out += [layer((ln, "scale"), (None,), f"{ln}.weight"), layer((ln, "bias"), (None,), f"{ln}.bias")]
    for module, name, axes, bias_axes, has_bias in (
        ("attention", "query_key_value", ("embed", "heads"), ("heads",), cfg.attention_bias),
        ("attention", "dense", ("heads", "embed"), (None,), cfg.attention_bias),
        ("mlp", "dense_h_to_4h", ("embed", "mlp"), ("mlp",), True),
        ("mlp", "dense_4h_to_h", ("mlp", "embed"), (None,), True),
    ):
        out.append(layer((module, name, "kernel"), axes, f"{module}.{name}.weight", True))
        if has_bias:
            out.append(layer((module, name, "bias"), bias_axes, f"{module}.{name}.bias"))
    if not cfg.tie_embeddings:
        out.append(Weight(("embed_out", "kernel"), ("embed", "vocab"), "embed_out.weight", True))
    return out


_BUILDER = stack.Builder(GPTNeoX, weights, "gpt_neox")
model_fns, init_params, from_params, init = (
    _BUILDER.model_fns,
    _BUILDER.init_params,
    _BUILDER.from_params,
    _BUILDER.init,
)


# ----------------------------------------------------------------------------------------------- Hugging Face

_HF_ACTIVATIONS = {
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "relu": "relu",
}


def config_from_hf(c: dict, model_type: str, dtype: str) -> GPTNeoXConfig:
    """``GPTNeoXConfig`` from a transformers ``config.json`` dict, written by transformers 4 (``rotary_pct``,
    ``rotary_emb_base``, ``rope_scaling``) or 5 (``rope_parameters`` with ``partial_rotary_factor``); a missing
    rotary fraction is 0.25, as in transformers. ``ValueError`` names a missing or unsupported key."""
    for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size"):
        if c.get(key) is None:
            raise ValueError(f"config.json ({model_type}) is missing {key!r}")
    act = c.get("hidden_act", "gelu")
    if act not in _HF_ACTIVATIONS:
        raise ValueError(f"hidden_act={act!r} is not supported for gpt_neox; supported: {sorted(_HF_ACTIVATIONS)}")
    rope = dict(c.get("rope_parameters") or c.get("rope_scaling") or {})
    theta = rope.get("rope_theta") or c.get("rotary_emb_base") or c.get("rope_theta") or 10000.0
    partial = rope.pop("partial_rotary_factor", None) or c.get("rotary_pct") or c.get("partial_rotary_factor") or 0.25
    rope_type, rope_params, theta, _ = rope_from_hf({**c, "rope_parameters": {**rope, "rope_theta": theta}})
    hidden, heads = int(c["hidden_size"]), int(c["num_attention_heads"])
    if hidden % heads:
        raise ValueError(f"config.json ({model_type}): hidden_size {hidden} must divide by num_attention_heads {heads}")
    rotary_dim = int(hidden // heads * float(partial))
    if rotary_dim < 2 or rotary_dim % 2:
        raise ValueError(
            f"config.json ({model_type}): partial_rotary_factor / rotary_pct {partial} gives {rotary_dim} rotary "
            f"dimensions of {hidden // heads}; jaxspec needs an even number, at least 2"
        )
    return GPTNeoXConfig(
        vocab_size=int(c["vocab_size"]),
        hidden_size=hidden,
        num_layers=int(c["num_hidden_layers"]),
        num_heads=heads,
        intermediate_size=int(c["intermediate_size"]),
        rotary_dim=rotary_dim,
        rope_theta=theta,
        rope_type=rope_type,
        rope_params=tuple(sorted(rope_params.items())),
        parallel_residual=bool(c.get("use_parallel_residual", True)),
        attention_bias=bool(c.get("attention_bias", True)),
        tie_embeddings=bool(c.get("tie_word_embeddings", False)),
        layer_norm_eps=float(c.get("layer_norm_eps", 1e-5)),
        activation=_HF_ACTIVATIONS[act],
        dtype=dtype,
    )


def _ignored(cfg: GPTNeoXConfig, name: str) -> bool:
    # a tied head, and the buffers older checkpoints saved (causal-mask bias, masked_bias, RoPE inv_freq)
    buffers = (".attention.bias", ".attention.masked_bias", ".rotary_emb.inv_freq")
    return (cfg.tie_embeddings and name == "embed_out.weight") or name.endswith(buffers)


FAMILY = families.register(
    families.ModelFamily(
        name="gpt_neox",
        config_class=GPTNeoXConfig,
        from_params=from_params,
        init_params=init_params,
        weights=weights,
        architectures={"gpt_neox": "GPTNeoXForCausalLM"},
        config_from_hf=config_from_hf,
        ignored=_ignored,
        splits_layers=True,
    )
)
