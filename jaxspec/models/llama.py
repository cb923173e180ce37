"""Llama-family decoder in Flax: RMSNorm, RoPE, grouped-query attention, SwiGLU (or GeGLU).

Config switches cover the Llama-family variants ``jaxspec.load`` reads: q/k/v (and output) projection biases
(Qwen2, ``attention_bias``), per-head q/k RMSNorm before RoPE (Qwen3), RoPE types from ``models.rope`` (linear,
llama3), a sliding attention window (Mistral) and Gemma's (1 + w) RMSNorm, sqrt(hidden)-scaled embeddings and
GeGLU MLP.

Layers are stacked with ``nn.scan`` so compile time does not grow with depth; every layer weight carries a
leading ``[layers]`` axis and the KV cache is one ``KVCache`` with ``[layers, B, S, kv_heads, head_dim]``,
carried through the scan and updated in place.
"""

from __future__ import annotations

import dataclasses
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxspec import dtypes, families
from jaxspec.cache import KVCache, causal_mask, write_layer
from jaxspec.families import Weight
from jaxspec.model import CausalLM
from jaxspec.models.rope import ROPE_TYPES, apply_rope, check_rope, inverse_frequencies

_ACTIVATIONS = {"silu": nn.silu, "gelu_tanh": functools.partial(nn.gelu, approximate=True)}


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int | None = None
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    tie_embeddings: bool = False
    dtype: str = "float32"  # weights, activations and cache; logits are always float32
    init_std: float = 0.02
    qkv_bias: bool = False  # biases on q/k/v projections (Qwen2; Llama/Qwen3 with attention_bias)
    o_bias: bool = False  # bias on the output projection (Llama/Qwen3 with attention_bias)
    qk_norm: bool = False  # RMSNorm over head_dim on q and k, per head, before RoPE (Qwen3)
    rope_type: str = "default"  # a key of jaxspec.models.rope.ROPE_TYPES
    rope_params: tuple[tuple[str, float], ...] = ()  # that type's parameters as sorted (name, value) pairs
    sliding_window: int | None = None  # attend to the last `sliding_window` positions only (Mistral)
    norm_offset: float = 0.0  # RMSNorm scales by (norm_offset + w), computed in float32 (Gemma: 1.0)
    embed_scale: bool = False  # multiply embeddings by sqrt(hidden_size), in the activation dtype (Gemma)
    mlp_activation: str = "silu"  # gated-MLP activation: "silu" (SwiGLU) or "gelu_tanh" (GeGLU, Gemma)
    # A reduced-vocabulary model (a draft): the ids, in the full vocabulary of `vocab_size`, of its embedding rows.
    # Its logits stay [..., vocab_size] with -inf outside these ids (a draft's q = 0 there, which the rejection
    # sampler handles exactly); an input id outside them embeds as one extra learned row. () = the full vocabulary.
    vocab_ids: tuple[int, ...] = dataclasses.field(default=(), repr=False)

    def __post_init__(self):
        if not isinstance(self.vocab_ids, tuple):
            object.__setattr__(self, "vocab_ids", tuple(int(i) for i in self.vocab_ids))
        if self.vocab_ids and (
            len(set(self.vocab_ids)) != len(self.vocab_ids) or not all(0 <= i < self.vocab_size for i in self.vocab_ids)
        ):
            raise ValueError(f"vocab_ids must be distinct ids in [0, vocab_size={self.vocab_size})")
        if isinstance(self.rope_params, dict):
            object.__setattr__(self, "rope_params", tuple(sorted(self.rope_params.items())))
        check_rope(self.rope_type, dict(self.rope_params))
        if self.mlp_activation not in _ACTIVATIONS:
            raise ValueError(f"mlp_activation must be one of {sorted(_ACTIVATIONS)}, got {self.mlp_activation!r}")
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(f"sliding_window must be >= 1 or None, got {self.sliding_window}")
        object.__setattr__(self, "dtype", dtypes.check(self.dtype))
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")
        if self.head_dim is None:
            if self.hidden_size % self.num_heads:
                raise ValueError(f"hidden_size ({self.hidden_size}) must divide by num_heads ({self.num_heads})")
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")

    @property
    def jnp_dtype(self):
        return dtypes.DTYPES[self.dtype]

    @property
    def embed_rows(self) -> int:
        """Rows of the embedding table: ``vocab_size``, or the reduced vocabulary plus its out-of-vocabulary row."""
        return len(self.vocab_ids) + 1 if self.vocab_ids else self.vocab_size


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


def to_rows(cfg: LlamaConfig, tokens: jax.Array) -> jax.Array:
    """Full-vocabulary ids -> embedding rows (identity without vocab_ids)."""
    return jnp.take(jnp.asarray(_row_of(cfg)), tokens, axis=0) if cfg.vocab_ids else tokens


class RMSNorm(nn.Module):
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


def _norm(cfg: LlamaConfig, name: str) -> RMSNorm:
    return RMSNorm(cfg.rms_norm_eps, cfg.jnp_dtype, cfg.norm_offset, name=name)


def _dense(features: int, name: str, cfg: LlamaConfig, std: float | None = None, bias: bool = False) -> nn.Dense:
    return nn.Dense(
        features,
        use_bias=bias,
        dtype=cfg.jnp_dtype,
        param_dtype=cfg.jnp_dtype,
        kernel_init=nn.initializers.normal(cfg.init_std if std is None else std),
        name=name,
    )


class Attention(nn.Module):
    cfg: LlamaConfig

    @nn.compact
    def __call__(self, x, positions, k_all, v_all, layer):
        """``k_all, v_all [layers, B, S, kv_heads, head_dim]`` are updated in place at ``layer``."""
        cfg = self.cfg
        batch, length, _ = x.shape
        h, kvh, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        q = _dense(h * d, "q_proj", cfg, bias=cfg.qkv_bias)(x).reshape(batch, length, h, d)
        k = _dense(kvh * d, "k_proj", cfg, bias=cfg.qkv_bias)(x).reshape(batch, length, kvh, d)
        v = _dense(kvh * d, "v_proj", cfg, bias=cfg.qkv_bias)(x).reshape(batch, length, kvh, d)
        if cfg.qk_norm:
            q = _norm(cfg, "q_norm")(q)
            k = _norm(cfg, "k_norm")(k)
        inv_freq = inverse_frequencies(d, cfg.rope_theta, cfg.rope_type, **dict(cfg.rope_params))
        q, k = apply_rope(q, positions, inv_freq), apply_rope(k, positions, inv_freq)
        k_all, v_all = write_layer(k_all, layer, k, positions), write_layer(v_all, layer, v, positions)
        k_cache, v_cache = k_all[layer], v_all[layer]

        q = q.reshape(batch, length, kvh, h // kvh, d)
        scores = jnp.einsum("btkgd,bskd->bkgts", q, k_cache, preferred_element_type=jnp.float32) * d**-0.5
        mask = causal_mask(positions, k_cache.shape[1])
        if cfg.sliding_window is not None:
            slots = jnp.arange(k_cache.shape[1], dtype=positions.dtype)[None, None, :]
            mask = mask & (slots > positions[:, :, None] - cfg.sliding_window)
        mask = mask[:, None, None]
        scores = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
        probs = jax.nn.softmax(scores, axis=-1).astype(cfg.jnp_dtype)
        out = jnp.einsum("bkgts,bskd->btkgd", probs, v_cache).reshape(batch, length, h * d)
        return _dense(cfg.hidden_size, "o_proj", cfg, bias=cfg.o_bias)(out), k_all, v_all


class MLP(nn.Module):
    cfg: LlamaConfig

    @nn.compact
    def __call__(self, x):
        cfg = self.cfg
        gate = _dense(cfg.intermediate_size, "gate_proj", cfg)(x)
        up = _dense(cfg.intermediate_size, "up_proj", cfg)(x)
        return _dense(cfg.hidden_size, "down_proj", cfg)(_ACTIVATIONS[cfg.mlp_activation](gate) * up)


class DecoderLayer(nn.Module):
    cfg: LlamaConfig

    @nn.compact
    def __call__(self, carry, layer, positions):
        cfg = self.cfg
        x, k_all, v_all = carry
        attn, k_all, v_all = Attention(cfg, name="attn")(_norm(cfg, "input_norm")(x), positions, k_all, v_all, layer)
        x = x + attn
        x = x + MLP(cfg, name="mlp")(_norm(cfg, "post_attn_norm")(x))
        return (x, k_all, v_all), None


class Llama(nn.Module):
    cfg: LlamaConfig

    @nn.compact
    def __call__(self, tokens, positions, cache: KVCache, hidden: bool = False):
        """``(logits [B, T, V] float32, cache)``; ``hidden=True`` returns the final-norm hidden states
        ``[B, T, hidden_size]`` instead of logits (training computes the LM head at chosen positions only)."""
        cfg = self.cfg
        embed = nn.Embed(
            cfg.embed_rows,
            cfg.hidden_size,
            dtype=cfg.jnp_dtype,
            param_dtype=cfg.jnp_dtype,
            embedding_init=nn.initializers.normal(cfg.init_std),
            name="embed",
        )
        x = embed(to_rows(cfg, tokens))
        if cfg.embed_scale:  # like transformers: sqrt(hidden) rounded to the activation dtype first
            x = x * jnp.asarray(cfg.hidden_size**0.5, cfg.jnp_dtype)
        layers = nn.scan(
            DecoderLayer,
            variable_axes={"params": 0},
            split_rngs={"params": True},
            in_axes=(0, nn.broadcast),
            out_axes=0,
            length=cfg.num_layers,
        )(cfg, name="layers")
        # The whole cache rides in the scan carry and each layer scatters its new entries in place: passing it as
        # scanned inputs/outputs would make XLA build a second full cache every step.
        (x, k, v), _ = layers((x, cache.k, cache.v), jnp.arange(cfg.num_layers), positions)
        x = _norm(cfg, "final_norm")(x)
        if hidden:
            return x, KVCache(k, v)
        if cfg.tie_embeddings:
            logits = embed.attend(x)
        else:
            logits = _dense(cfg.embed_rows, "lm_head", cfg)(x)
        return to_full_vocab(cfg, logits.astype(jnp.float32)), KVCache(k, v)


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
        layer(("post_attn_norm", "scale"), (None,), "post_attention_layernorm.weight"),
    ]
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


@functools.cache
def model_fns(cfg: LlamaConfig):
    """``(apply_fn, init_cache)`` for a config; the same objects for equal configs, so compiled code is shared."""
    module = Llama(cfg)

    def apply_fn(params, tokens, positions, cache):
        return module.apply({"params": params}, tokens, positions, cache)

    def init_cache(batch_size: int, max_length: int) -> KVCache:
        return KVCache.zeros(cfg.num_layers, batch_size, max_length, cfg.num_kv_heads, cfg.head_dim, cfg.jnp_dtype)

    return apply_fn, init_cache


def hidden_and_head(cfg: LlamaConfig, params, tokens, positions, cache):
    """``(hidden [B, T, D], head [D, embed_rows])``: the final hidden states and the LM head matrix (the transposed
    embedding when tied), so a caller can compute logits at a subset of positions (over the embedding rows: map
    labels with ``to_rows``)."""
    x, _ = Llama(cfg).apply({"params": params}, tokens, positions, cache, True)
    head = params["embed"]["embedding"].T if cfg.tie_embeddings else params["lm_head"]["kernel"]
    return x, head


def init_params(cfg: LlamaConfig, seed: int = 0):
    """Random parameters (normal(init_std) weights, unit norms)."""
    apply_fn, init_cache = model_fns(cfg)
    tokens = jnp.zeros((1, 1), jnp.int32)
    variables = jax.jit(Llama(cfg).init)(jax.random.key(seed), tokens, tokens, init_cache(1, 1))
    return variables["params"]


def from_params(cfg: LlamaConfig, params, *, tokenizer=None, eos_token_id=None, name="llama") -> CausalLM:
    return CausalLM.from_config(
        model_fns(cfg),
        cfg,
        params,
        tokenizer=tokenizer,
        eos_token_id=eos_token_id,
        name=name,
        param_axes=families.axes_table(weights(cfg)),
    )


def init(cfg: LlamaConfig, seed: int = 0, **kwargs) -> CausalLM:
    """A randomly initialized Llama ``CausalLM``."""
    return from_params(cfg, init_params(cfg, seed), **kwargs)


# ----------------------------------------------------------------------------------------------- Hugging Face


def _rope_from_hf(c: dict) -> tuple[str, dict, float]:
    """``(rope_type, params, theta)`` from either ``rope_theta`` + ``rope_scaling`` (transformers 4) or
    ``rope_parameters`` (transformers 5)."""
    raw = c.get("rope_parameters") or c.get("rope_scaling") or {}
    if not isinstance(raw, dict):
        raise ValueError(f"rope_scaling / rope_parameters must be a dict or null, got {raw!r}")
    if raw and all(isinstance(v, dict) for v in raw.values()):
        raise ValueError(f"per-layer-type RoPE parameters are not supported (got keys {sorted(raw)})")
    params = dict(raw)
    theta = params.pop("rope_theta", None) or c.get("rope_theta") or 10000.0
    rope_type = params.pop("rope_type", None) or params.pop("type", None) or "default"
    params.pop("type", None)
    partial = params.pop("partial_rotary_factor", None) or c.get("partial_rotary_factor") or 1.0
    if partial != 1.0:
        raise ValueError(f"partial_rotary_factor={partial} is not supported (only 1.0)")
    if rope_type not in ROPE_TYPES:
        raise ValueError(f"unsupported rope type {rope_type!r}; supported: {sorted(ROPE_TYPES)}")
    if rope_type == "llama3" and params.get("original_max_position_embeddings") is None:
        params["original_max_position_embeddings"] = c.get("max_position_embeddings")
    if rope_type == "default":
        params = {}
    check_rope(rope_type, params)
    return rope_type, params, float(theta)


def build_config(
    c: dict, model_type: str, dtype: str, *, qkv_bias: bool, o_bias: bool, qk_norm=False, sliding=False, gemma=False
) -> LlamaConfig:
    """A ``config.json`` of a Llama-layout ``model_type`` -> ``LlamaConfig``, for a layout with these features
    (``sliding``: honours ``sliding_window``; ``gemma``: (1 + w) norms, scaled embeddings, GeGLU). Other families
    that run on this module (``models.phi3``) build their configs with it."""

    def need(key):
        if c.get(key) is None:
            raise ValueError(f"config.json ({model_type}) is missing {key!r}")
        return c[key]

    if gemma:
        # Gemma checkpoints carry a legacy hidden_act="gelu" that means the tanh approximation (transformers maps
        # it to gelu_pytorch_tanh); transformers 4 configs may set hidden_activation, which then takes precedence.
        act = c.get("hidden_activation") or c.get("hidden_act") or "gelu_pytorch_tanh"
        if act == "gelu" and not c.get("hidden_activation"):
            act = "gelu_pytorch_tanh"
        if act != "gelu_pytorch_tanh":
            raise ValueError(f"hidden_act={act!r} is not supported for gemma (only 'gelu_pytorch_tanh')")
        if c.get("use_bidirectional_attention"):
            raise ValueError("use_bidirectional_attention=True is not supported for gemma (causal attention only)")
    else:
        act = c.get("hidden_act", c.get("hidden_activation", "silu"))
        if act != "silu":
            raise ValueError(f"hidden_act={act!r} is not supported for {model_type} (only 'silu')")
    if c.get("mlp_bias"):
        raise ValueError(f"mlp_bias=True is not supported for {model_type}")
    layer_types = c.get("layer_types") or []
    if any(t != "full_attention" for t in layer_types) or (not sliding and c.get("use_sliding_window")):
        raise ValueError(f"sliding-window layers are not supported for {model_type} (layer_types={layer_types})")
    heads = int(need("num_attention_heads"))
    rope_type, rope_params, theta = _rope_from_hf(c)
    return LlamaConfig(
        vocab_size=int(need("vocab_size")),
        hidden_size=int(need("hidden_size")),
        intermediate_size=int(need("intermediate_size")),
        num_layers=int(need("num_hidden_layers")),
        num_heads=heads,
        num_kv_heads=int(c.get("num_key_value_heads") or heads),
        head_dim=c.get("head_dim") or None,
        rope_theta=theta,
        rms_norm_eps=float(c.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(c.get("tie_word_embeddings", gemma)),
        dtype=dtype,
        qkv_bias=qkv_bias,
        o_bias=o_bias,
        qk_norm=qk_norm,
        rope_type=rope_type,
        rope_params=rope_params,
        sliding_window=c.get("sliding_window") if sliding else None,
        norm_offset=1.0 if gemma else 0.0,
        embed_scale=gemma,
        mlp_activation="gelu_tanh" if gemma else "silu",
    )


def config_from_hf(c: dict, model_type: str, dtype: str) -> LlamaConfig:
    """``llama`` (``attention_bias``: q/k/v/o biases), ``mistral`` (sliding window), ``qwen2`` (q/k/v biases),
    ``qwen3`` (q/k norm), ``gemma``."""
    bias = bool(c.get("attention_bias", False))
    return build_config(
        c,
        model_type,
        dtype,
        qkv_bias=True if model_type == "qwen2" else bias,
        o_bias=False if model_type == "qwen2" else bias,
        qk_norm=model_type == "qwen3",
        sliding=model_type == "mistral",
        gemma=model_type == "gemma",
    )


def _model_type(cfg: LlamaConfig) -> str:
    """The Hugging Face ``model_type`` that describes ``cfg`` exactly."""
    gemma = (cfg.norm_offset, cfg.embed_scale, cfg.mlp_activation) == (1.0, True, "gelu_tanh")
    llama_like = (cfg.norm_offset, cfg.embed_scale, cfg.mlp_activation) == (0.0, False, "silu")
    if gemma:
        if cfg.qk_norm or cfg.sliding_window is not None or cfg.qkv_bias != cfg.o_bias:
            raise ValueError(
                "export_hf: a Gemma-style model (norm_offset=1, embed_scale, gelu_tanh MLP) with qk_norm, a sliding "
                "window or q/k/v biases without an output bias has no Hugging Face model_type"
            )
        return "gemma"
    if not llama_like:
        raise ValueError(
            f"export_hf: norm_offset={cfg.norm_offset}, embed_scale={cfg.embed_scale}, "
            f"mlp_activation={cfg.mlp_activation!r} match no Hugging Face model_type (Llama family: 0.0/False/'silu'; "
            "Gemma: 1.0/True/'gelu_tanh')"
        )
    if cfg.qk_norm:
        return "qwen3"
    if cfg.qkv_bias and not cfg.o_bias:
        return "qwen2"
    if cfg.sliding_window is not None:
        return "mistral"
    return "llama"


def common_hf_config(cfg: LlamaConfig, model_type: str, architecture: str) -> dict:
    """The ``config.json`` fields every Llama-layout ``model_type`` shares."""
    rope = dict(cfg.rope_params)
    return {
        "architectures": [architecture],
        "model_type": model_type,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": None if cfg.rope_type == "default" else {"rope_type": cfg.rope_type, **rope},
        "max_position_embeddings": int(rope.get("original_max_position_embeddings", 4096)) * int(rope.get("factor", 1)),
        "tie_word_embeddings": cfg.tie_embeddings,
        "torch_dtype": cfg.dtype,
    }


def config_to_hf(cfg: LlamaConfig, model_type: str | None = None) -> dict:
    inferred = _model_type(cfg)
    if model_type not in (None, inferred):
        raise ValueError(f"export_hf: this config is a {inferred!r} model, not model_type={model_type!r}")
    config = common_hf_config(cfg, inferred, FAMILY.architectures[inferred])
    if inferred in ("llama", "gemma"):
        config["attention_bias"] = cfg.o_bias
    if inferred == "gemma":
        config["hidden_act"] = config["hidden_activation"] = "gelu_pytorch_tanh"
    if inferred == "mistral":
        config["sliding_window"] = cfg.sliding_window
    if inferred == "qwen2":
        config["use_sliding_window"] = False
    return config


def _ignored(cfg: LlamaConfig, name: str) -> bool:
    return name.endswith("rotary_emb.inv_freq") or (cfg.tie_embeddings and name == "lm_head.weight")


FAMILY = families.register(
    families.ModelFamily(
        name="llama",
        config_class=LlamaConfig,
        from_params=from_params,
        init_params=init_params,
        weights=weights,
        architectures={
            "llama": "LlamaForCausalLM",
            "mistral": "MistralForCausalLM",
            "qwen2": "Qwen2ForCausalLM",
            "qwen3": "Qwen3ForCausalLM",
            "gemma": "GemmaForCausalLM",
        },
        config_from_hf=config_from_hf,
        config_to_hf=config_to_hf,
        ignored=_ignored,
    )
)
