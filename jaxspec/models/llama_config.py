"""The Llama family's config: ``LlamaConfig`` (a frozen dataclass, static under jit) and its conversion from and to
a Hugging Face ``config.json`` for every model type the Llama module runs (llama, mistral, qwen2, qwen3, gemma;
phi3 through ``models.phi3``). ``jaxspec.models.llama`` re-exports every public name here.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from jaxspec.core import dtypes
from jaxspec.models import families
from jaxspec.models.rope import check_rope, rope_from_hf, rotation

ACTIVATIONS = ("silu", "gelu_tanh")  # the MLP activations the Llama module implements (``LlamaConfig.mlp_activation``)
ARCHITECTURES = {  # model_type -> the transformers class name an export writes
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gemma": "GemmaForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
    "granite": "GraniteForCausalLM",
}


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
    """A Llama-family decoder's static shape and switches (frozen, hashable: part of every compiled program's key).

    Attributes:
      vocab_size: ids of the full vocabulary (logits are ``[..., vocab_size]``).
      hidden_size, intermediate_size: model width and the gated MLP's width.
      num_layers: decoder layers (stacked under ``nn.scan``: every layer weight has a leading ``[layers]`` axis).
      num_heads, num_kv_heads: query heads and key/value heads (GQA; ``num_heads % num_kv_heads == 0``).
      head_dim: per-head width (default ``hidden_size // num_heads``; must be even for RoPE).
      rope_theta, rope_type, rope_params: RoPE base and scaling (``jaxspec.models.rope.ROPE_TYPES``).
      rms_norm_eps, norm_offset: RMSNorm epsilon; norms scale by ``norm_offset + w`` (Gemma: 1).
      tie_embeddings: the LM head is the embedding's transpose.
      dtype: name of the weights', activations' and caches' dtype (``jaxspec.core.dtypes``); logits are float32.
      init_std: standard deviation of random initialization.
      qkv_bias, o_bias, qk_norm, sliding_window, embed_scale, mlp_activation, rotary_dim, Gemma 2/3's and Granite's
        switches: family variants (comments below).
      vocab_ids: a reduced-vocabulary draft's ids in the full vocabulary (below); () for the full vocabulary.
      min_rows: every weight product over fewer rows (batch × new tokens) is computed over this many, zero rows
        appended: where a one-row product takes a slower path than a two-row one (a GPU), 2 makes a one-token
        step cheaper (``jaxspec.load``'s ``min_rows``; docs/guides/benchmarks.md).

    Raises ``ValueError`` naming the field for inconsistent values (heads, head_dim, RoPE, activation, ids).
    """

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
    rotary_dim: int | None = None  # RoPE on each head's first `rotary_dim` dimensions only (Phi-4-mini); None: all
    # Gemma 2/3: per-layer "sliding_attention" / "full_attention" (() = every layer slides when sliding_window is
    # set, as Mistral), the sliding layers' own RoPE base (Gemma 3; default RoPE), norms after attention and after
    # the MLP as well as before, attention scaled by query_pre_attn_scalar ** -0.5 (None: head_dim ** -0.5), and
    # tanh soft-capping of attention scores and final logits (None: none)
    layer_types: tuple[str, ...] = ()
    local_rope_theta: float | None = None
    sandwich_norms: bool = False
    query_pre_attn_scalar: float | None = None
    attn_softcap: float | None = None
    final_softcap: float | None = None
    # Granite: embeddings times embedding_multiplier, each sub-block's output times residual_multiplier before it
    # joins the residual stream, attention scores times attention_multiplier (None: query_pre_attn_scalar or
    # head_dim, to the power -0.5) and logits divided by logits_scaling
    embedding_multiplier: float = 1.0
    residual_multiplier: float = 1.0
    attention_multiplier: float | None = None
    logits_scaling: float = 1.0
    min_rows: int = 1  # weight products over fewer rows computed over this many (above)

    def __post_init__(self):
        if not isinstance(self.vocab_ids, tuple):
            object.__setattr__(self, "vocab_ids", tuple(int(i) for i in self.vocab_ids))
        if self.vocab_ids and (
            len(set(self.vocab_ids)) != len(self.vocab_ids) or not all(0 <= i < self.vocab_size for i in self.vocab_ids)
        ):
            raise ValueError(f"vocab_ids must be distinct ids in [0, vocab_size={self.vocab_size})")
        # sorted (name, value) pairs; a list value (per-dimension factors, or read back from JSON) as a tuple, so
        # the config stays hashable (it is a static argument of every compiled program)
        params = dict(self.rope_params)
        params = {k: tuple(map(float, v)) if isinstance(v, (list, tuple)) else v for k, v in params.items()}
        object.__setattr__(self, "rope_params", tuple(sorted(params.items())))
        check_rope(self.rope_type, dict(self.rope_params))
        if self.mlp_activation not in ACTIVATIONS:
            raise ValueError(f"mlp_activation must be one of {sorted(ACTIVATIONS)}, got {self.mlp_activation!r}")
        families.check_min_rows(self.min_rows)
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(f"sliding_window must be >= 1 or None, got {self.sliding_window}")
        object.__setattr__(self, "dtype", dtypes.check(self.dtype))
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")
        if self.head_dim is None:
            if self.hidden_size % self.num_heads:
                raise ValueError(f"hidden_size ({self.hidden_size}) must divide by num_heads ({self.num_heads})")
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
        assert self.head_dim is not None  # set just above when it was None
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")
        if self.rotary_dim == self.head_dim:
            object.__setattr__(self, "rotary_dim", None)
        if self.rotary_dim is not None and (self.rotary_dim % 2 or not 0 < self.rotary_dim < self.head_dim):
            raise ValueError(f"rotary_dim must be even and in (0, head_dim={self.head_dim}], got {self.rotary_dim}")
        rotation(self.rotary_dim or self.head_dim, self.rope_theta, self.rope_type, **params)  # every check, now
        object.__setattr__(self, "layer_types", tuple(self.layer_types))
        if self.layer_types and (
            len(self.layer_types) != self.num_layers
            or not set(self.layer_types) <= {"sliding_attention", "full_attention"}
        ):
            raise ValueError(
                f"layer_types must be {self.num_layers} of 'sliding_attention' / 'full_attention', "
                f"got {self.layer_types}"
            )

    @property
    def jnp_dtype(self):
        """The ``jnp`` dtype named by ``dtype``."""
        return dtypes.DTYPES[self.dtype]

    @property
    def embed_rows(self) -> int:
        """Rows of the embedding table: ``vocab_size``, or the reduced vocabulary plus its out-of-vocabulary row."""
        return len(self.vocab_ids) + 1 if self.vocab_ids else self.vocab_size


# ----------------------------------------------------------------------------------------------- Hugging Face


def build_config(
    c: dict,
    model_type: str,
    dtype: str,
    *,
    qkv_bias: bool,
    o_bias: bool,
    qk_norm=False,
    sliding=False,
    gemma=False,
    partial=False,
) -> LlamaConfig:
    """A ``config.json`` of a Llama-layout ``model_type`` -> ``LlamaConfig``, for a layout with these features
    (``sliding``: honours ``sliding_window``; ``gemma``: (1 + w) norms, scaled embeddings, GeGLU; ``partial``:
    honours ``partial_rotary_factor``, as transformers' Phi-3 does and its Llama, Mistral, Qwen and Gemma do not).
    Other families that run on this module (``models.phi3``) build their configs with it."""

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
    rope_type, rope_params, theta, partial_factor = rope_from_hf(c)
    if partial_factor != 1.0 and not partial:
        raise ValueError(f"partial_rotary_factor={partial_factor} is not supported for {model_type} (only phi3)")
    head_dim = int(c.get("head_dim") or int(need("hidden_size")) // heads)
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
        rope_params=tuple(rope_params.items()),  # sorted by __post_init__
        sliding_window=c.get("sliding_window") if sliding else None,
        norm_offset=1.0 if gemma else 0.0,
        embed_scale=gemma,
        mlp_activation="gelu_tanh" if gemma else "silu",
        rotary_dim=int(head_dim * partial_factor) if partial_factor != 1.0 else None,
    )


def _gemma23_config(c: dict, model_type: str, dtype: str) -> LlamaConfig:
    """Gemma 2 (``gemma2``) and Gemma 3's text model (``gemma3_text``): Gemma's module with sliding-window and
    full-attention layers (``layer_types``, else transformers' default pattern: every 2nd layer full for Gemma 2,
    every ``sliding_window_pattern``-th (6) for Gemma 3), norms after attention and after the MLP, attention scaled
    by ``query_pre_attn_scalar``, soft-capping (Gemma 2), q/k norm and the sliding layers' own RoPE base (Gemma 3:
    ``rope_parameters["sliding_attention"]`` or ``rope_local_base_freq``, default 10 000)."""
    gemma3 = model_type == "gemma3_text"
    layers = int(c.get("num_hidden_layers") or 0)
    every = 2 if not gemma3 else int(c.get("sliding_window_pattern") or 6)
    types = c.get("layer_types") or [
        "sliding_attention" if (i + 1) % every else "full_attention" for i in range(layers)
    ]
    if c.get("use_bidirectional_attention"):
        raise ValueError(f"use_bidirectional_attention=True is not supported for {model_type} (causal attention only)")
    plain = {k: v for k, v in c.items() if k not in ("layer_types", "sliding_window", "use_sliding_window")}
    rope = c.get("rope_parameters") or {}
    local_theta = c.get("rope_local_base_freq") or 10000.0
    if isinstance(rope.get("full_attention"), dict):  # transformers 5: per layer type
        local = dict(rope.get("sliding_attention") or {})
        if local.get("rope_type", "default") != "default":
            raise ValueError(f"{model_type}: sliding layers' rope type {local['rope_type']!r} is not supported")
        local_theta = local.get("rope_theta") or local_theta
        plain["rope_parameters"] = rope["full_attention"]
    if not gemma3:
        plain.setdefault("rope_theta", 10000.0)
    elif not plain.get("rope_theta") and not (plain.get("rope_parameters") or {}).get("rope_theta"):
        plain["rope_theta"] = 1_000_000.0  # Gemma 3's global default
    cfg = build_config(plain, model_type, dtype, qkv_bias=False, o_bias=False, qk_norm=gemma3, gemma=True)
    if c.get("attention_bias"):
        raise ValueError(f"attention_bias=True is not supported for {model_type}")
    return dataclasses.replace(
        cfg,
        sliding_window=c.get("sliding_window"),
        layer_types=tuple(types),
        local_rope_theta=float(local_theta) if gemma3 else None,
        sandwich_norms=True,
        query_pre_attn_scalar=c.get("query_pre_attn_scalar"),
        attn_softcap=c.get("attn_logit_softcapping"),
        final_softcap=c.get("final_logit_softcapping"),
    )


GRANITE_MULTIPLIERS = ("embedding_multiplier", "residual_multiplier", "attention_multiplier", "logits_scaling")


def config_from_hf(c: dict, model_type: str, dtype: str) -> LlamaConfig:
    """``llama`` (``attention_bias``: q/k/v/o biases), ``mistral`` (sliding window), ``qwen2`` (q/k/v biases),
    ``qwen3`` (q/k norm), ``gemma``, ``gemma2`` and ``gemma3_text`` (``_gemma23_config``), ``granite`` (Llama's
    with its four multipliers, each 1.0 when the config leaves it out, as in transformers)."""
    if model_type in ("gemma2", "gemma3_text"):
        return _gemma23_config(c, model_type, dtype)
    bias = bool(c.get("attention_bias", False))
    if model_type == "granite":
        cfg = build_config(c, model_type, dtype, qkv_bias=bias, o_bias=bias)
        multipliers: dict[str, Any] = {k: float(c.get(k) or 1.0) for k in GRANITE_MULTIPLIERS}
        return dataclasses.replace(cfg, **multipliers)
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
    gemma23: tuple = (cfg.layer_types, cfg.local_rope_theta, cfg.sandwich_norms, cfg.query_pre_attn_scalar)
    gemma23 += (cfg.attn_softcap, cfg.final_softcap)
    if gemma and cfg.sandwich_norms:
        if cfg.qkv_bias or cfg.o_bias or cfg.qk_norm != (cfg.local_rope_theta is not None):
            raise ValueError(
                "export_hf: a Gemma 2/3-style model with attention biases, or with only one of Gemma 3's q/k norm and "
                "local RoPE base, has no Hugging Face model_type"
            )
        return "gemma3_text" if cfg.qk_norm else "gemma2"
    granite = (cfg.embedding_multiplier, cfg.residual_multiplier, cfg.attention_multiplier, cfg.logits_scaling)
    if granite != (1.0, 1.0, None, 1.0):
        if (
            not llama_like
            or gemma23 != ((), None, False, None, None, None)
            or cfg.qk_norm
            or cfg.qkv_bias != cfg.o_bias
        ):
            raise ValueError(
                "export_hf: Granite's multipliers on a model with other family switches (Gemma's, q/k norm, q/k/v "
                "biases without an output bias) have no Hugging Face model_type"
            )
        if cfg.sliding_window is not None:
            raise ValueError("export_hf: transformers' Granite has no sliding window")
        return "granite"
    if gemma23 != ((), None, False, None, None, None):
        raise ValueError(
            "export_hf: per-layer attention types, a local RoPE base, soft-capping or query_pre_attn_scalar are "
            "Gemma 2/3 features (with its norms around each sub-block); this config has no Hugging Face model_type"
        )
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
    if cfg.rope_type == "factors":
        raise ValueError(
            "per-dimension RoPE factors (a GGUF file's rope_freqs, Llama 3.1's scaling as llama.cpp stores it) have "
            "no Hugging Face config equivalent; export a checkpoint loaded from Hugging Face instead"
        )
    assert cfg.head_dim is not None  # LlamaConfig.__post_init__ sets it
    partial = {} if cfg.rotary_dim is None else {"partial_rotary_factor": cfg.rotary_dim / cfg.head_dim}
    return partial | {
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
    """A transformers ``config.json`` dict for ``cfg``: as ``model_type`` (refused with ``ValueError`` if that
    type cannot describe the config), or the type ``cfg``'s switches imply when None."""
    if cfg.rotary_dim is not None:
        raise ValueError(
            "export_hf: a partial rotary embedding (rotary_dim) exports as model_type='phi3' only (transformers' "
            "Llama, Mistral, Qwen and Gemma rotate whole heads)"
        )
    inferred = _model_type(cfg)
    if model_type not in (None, inferred):
        raise ValueError(f"export_hf: this config is a {inferred!r} model, not model_type={model_type!r}")
    config = common_hf_config(cfg, inferred, ARCHITECTURES[inferred])
    if inferred in ("llama", "gemma", "granite"):
        config["attention_bias"] = cfg.o_bias
    if inferred == "granite":
        assert cfg.head_dim is not None  # LlamaConfig.__post_init__ sets it
        multiplier = cfg.attention_multiplier or (cfg.query_pre_attn_scalar or cfg.head_dim) ** -0.5
        config.update({k: getattr(cfg, k) for k in GRANITE_MULTIPLIERS}, attention_multiplier=multiplier)
    if inferred.startswith("gemma"):
        config["hidden_act"] = config["hidden_activation"] = "gelu_pytorch_tanh"
    if inferred in ("gemma2", "gemma3_text"):
        config.update(
            attention_bias=False,
            sliding_window=cfg.sliding_window,
            layer_types=list(cfg.layer_types),
            query_pre_attn_scalar=cfg.query_pre_attn_scalar or cfg.head_dim,
            attn_logit_softcapping=cfg.attn_softcap,
            final_logit_softcapping=cfg.final_softcap,
        )
    if inferred == "gemma3_text":
        config["rope_local_base_freq"] = cfg.local_rope_theta
    if inferred == "mistral":
        config["sliding_window"] = cfg.sliding_window
    if inferred == "qwen2":
        config["use_sliding_window"] = False
    return config
