"""Load GGUF files (llama.cpp's format) as a ``jaxspec.CausalLM``.

    model = jaxspec.load("SmolLM2-135M-Instruct.Q4_1.gguf", dtype="bfloat16")

Only the file's metadata and tensor data are read: the header, metadata and tensor table by ``jaxspec.gguf_reader`` (a
reader of the format over a memory map of the file, giving what the ``gguf`` package's ``GGUFReader`` gives, tested
against it, 25-30× faster on large vocabularies); every tensor is dequantized by ``gguf.quants.dequantize`` (every type
that package knows: F32, F16, BF16, Q8_0, Q4_0/1, Q5_0/1, Q2_K–Q6_K, IQ*, …) to float32 and cast to the requested dtype.
A model split into shards (``<name>-00001-of-00003.gguf``, ...: llama.cpp's ``gguf-split``) loads from any of its files.
The metadata becomes a Hugging Face style config and the tensors get their Hugging Face names, so the model is built by
the same family record (``jaxspec.families``) as ``jaxspec.hf.load``:

- ``llama`` (Llama, Mistral and SmolLM conversions): llama.cpp's converter permutes the rows of the q and k
  projections for its interleaved RoPE; they are permuted back.
- ``qwen2`` (q/k/v biases), ``qwen3`` (q/k RMSNorm): not permuted (llama.cpp uses the NeoX RoPE layout there).
- ``gemma``: llama.cpp stores RMSNorm weights as 1 + w; w is recovered.
- ``gemma2``, ``gemma3`` (text): the same, with norms after each sub-block, read as llama.cpp reads them
  (``_gemma23_fields``: the sliding layers, window, soft-capping, the attention scale from the head size, Gemma 3's
  sliding layers' RoPE base).
- ``phi3`` (Phi-3 mini/medium, Phi-3.5, Phi-4, Phi-4-mini): q/k/v and gate/up stay fused, as in Phi-3's own
  checkpoints; the sliding window from ``phi3.attention.sliding_window`` (0: none); LongRoPE (128k files:
  ``rope_factors_short`` and ``rope_factors_long`` tensors, ``rope.scaling.attn_factor``) as transformers'
  ``longrope``; a ``rope.dimension_count`` below the head size as a partial rotary factor (Phi-4-mini).
- ``granite`` (IBM Granite 3.x): permuted as ``llama``; its multipliers from ``embedding_scale``,
  ``residual_scale``, ``attention.scale`` and ``logit_scale``.

RoPE scaling: ``linear``; ``yarn`` (factor, original context length, beta_fast / beta_slow / attention factor where
written; DeepSeek's and Mistral's log multiplier is refused); Llama 3.1's ``rope_freqs`` divisors.

The tokenizer is rebuilt with the ``tokenizers`` library from the file's vocabulary (``jaxspec.gguf_tokenizer``):
``tokenizer.ggml.model == "gpt2"`` (byte-level BPE) from its merges, with the pre-tokenizer named by
``tokenizer.ggml.pre``; ``"llama"`` (SentencePiece vocabularies: Llama 1/2, Mistral v0.1, TinyLlama, Phi-3, Gemma 1/2)
from its scores, as llama.cpp tokenizes them: spaces become ``▁`` (one prepended unless
``tokenizer.ggml.add_space_prefix`` is false), then the adjacent pair whose concatenation is the highest-scoring token
is merged until none is left, and a character outside the vocabulary falls back to its UTF-8 bytes (``<0xXX>`` tokens).
Control tokens are special tokens; BOS (and EOS) are added on encode where the file asks for them; the chat template
comes from ``tokenizer.chat_template``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from jaxspec import dtypes, families
from jaxspec.gguf_reader import GGUFContents, GGUFError, model_name, read
from jaxspec.gguf_tokenizer import build_tokenizer, end_of_generation_ids
from jaxspec.model import CausalLM

# GGUF architecture -> the Hugging Face model_type whose family builds it
ARCHITECTURES = {
    "llama": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "gemma": "gemma",
    "gemma2": "gemma2",
    "gemma3": "gemma3_text",
    "phi3": "phi3",
    "granite": "granite",
}
_PERMUTED_QK = {"llama", "granite"}  # converters that reorder q/k rows for llama.cpp's interleaved RoPE

# per-layer GGUF tensor name -> Hugging Face name (after "model.layers.{i}.")
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.bias": "self_attn.o_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
# per-architecture exceptions to _LAYER_NAMES: Phi-3 keeps q/k/v and gate/up fused, as its checkpoints do
# Gemma 2/3 normalize each sub-block's output too: their ffn_norm is the norm before the MLP
_GEMMA23_NAMES = {
    "ffn_norm.weight": "pre_feedforward_layernorm.weight",
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
}
_ARCH_LAYER_NAMES = {
    "phi3": {"attn_qkv.weight": "self_attn.qkv_proj.weight", "ffn_up.weight": "mlp.gate_up_proj.weight"},
    "gemma2": _GEMMA23_NAMES,
    "gemma3": _GEMMA23_NAMES,
}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def _rope_freqs(contents: GGUFContents) -> list[float] | None:
    """The per-dimension RoPE divisors of a ``rope_freqs.weight`` tensor (Llama 3.1's scaling, as llama.cpp's
    converter stores it), or None."""
    import gguf

    for t in contents.tensors:
        if t.name == "rope_freqs.weight":
            return [float(x) for x in np.ravel(gguf.quants.dequantize(t.data, t.tensor_type))]
    return None


def _yarn_scaling(meta: dict, arch: str, path: Path, need) -> dict:
    """transformers' ``yarn`` parameters from llama.cpp's keys: its converter writes the factor, the original
    context length, and beta_fast / beta_slow / attention_factor where the config sets them. DeepSeek's and
    Mistral's log multiplier and an extrapolation factor have no transformers equivalent: refused."""
    for key, neutral in (("rope.scaling.yarn_log_multiplier", 0.0), ("rope.scaling.yarn_ext_factor", 1.0)):
        value = meta.get(f"{arch}.{key}")
        if value is not None and float(value) != neutral:
            raise GGUFError(f"{path}: YaRN with {arch}.{key} = {value} is not supported")
    out = {
        "rope_type": "yarn",
        "factor": float(need("rope.scaling.factor")),
        "original_max_position_embeddings": int(need("rope.scaling.original_context_length")),
    }
    for key, name in (
        ("yarn_beta_fast", "beta_fast"),
        ("yarn_beta_slow", "beta_slow"),
        ("yarn_attn_factor", "attention_factor"),
    ):
        if meta.get(f"{arch}.rope.scaling.{key}") is not None:
            out[name] = float(meta[f"{arch}.rope.scaling.{key}"])
    return out


def _longrope_scaling(contents: GGUFContents, arch: str, path: Path, need) -> dict:
    """transformers' ``longrope`` parameters from a Phi-3 128k / Phi-3.5 file: the per-frequency factors of
    ``rope_factors_short.weight`` and ``rope_factors_long.weight``, the original context length, the factor (the
    context length over it) and the attention factor llama.cpp's converter computed (``rope.scaling.attn_factor``)."""
    import gguf

    factors = {}
    for t in contents.tensors:
        if t.name in _ROPE_TENSORS[1:]:
            factors[t.name] = [float(x) for x in np.ravel(gguf.quants.dequantize(t.data, t.tensor_type))]
    for name in _ROPE_TENSORS[1:]:
        if name not in factors:
            raise GGUFError(f"{path}: LongRoPE needs both rope_factors_long.weight and rope_factors_short.weight")
    original = int(need("rope.scaling.original_context_length"))
    out = {
        "rope_type": "longrope",
        "short_factor": factors["rope_factors_short.weight"],
        "long_factor": factors["rope_factors_long.weight"],
        "original_max_position_embeddings": original,
        "factor": int(need("context_length")) / original,
    }
    if contents.fields.get(f"{arch}.rope.scaling.attn_factor") is not None:
        out["attention_factor"] = float(contents.fields[f"{arch}.rope.scaling.attn_factor"])
    return out


def _gemma23_fields(meta: dict, arch: str, config: dict, path: Path) -> dict:
    """Gemma 2/3's transformers fields as llama.cpp reads its file: the window (``attention.sliding_window``;
    Gemma 3 without one: no sliding layers), the sliding layers from ``attention.sliding_window_pattern`` (a flag per
    layer, or every n-th layer full) or llama.cpp's default (every 2nd layer full for Gemma 2, every 6th for Gemma
    3), soft-capping, the attention scale llama.cpp derives from the size (1/sqrt(head size), 1/sqrt(hidden /
    heads) for the 27B models: Gemma 2 of 46 layers, Gemma 3 of 62), and Gemma 3's sliding layers' RoPE base
    (``rope.freq_base_swa``, default 10 000) beside the global one and its scaling."""
    layers, window = config["num_hidden_layers"], meta.get(f"{arch}.attention.sliding_window")
    pattern = meta.get(f"{arch}.attention.sliding_window_pattern")
    if isinstance(pattern, list):
        if len(pattern) != layers:
            raise GGUFError(f"{path}: attention.sliding_window_pattern has {len(pattern)} flags for {layers} layers")
        sliding = [bool(f) for f in pattern]
    else:
        every = int(pattern or (2 if arch == "gemma2" else 6))
        sliding = [every == 0 or i % every < every - 1 for i in range(layers)]
    if arch == "gemma2":
        window = window or 4096  # llama.cpp's default for Gemma 2
    if not window:
        sliding = [False] * layers
    big = (arch, layers) in (("gemma2", 46), ("gemma3", 62))
    out = {
        "sliding_window": int(window) if window else None,
        "layer_types": ["sliding_attention" if f else "full_attention" for f in sliding],
        "query_pre_attn_scalar": config["hidden_size"] // config["num_attention_heads"] if big else config["head_dim"],
        "attn_logit_softcapping": meta.get(f"{arch}.attn_logit_softcapping") if arch == "gemma2" else None,
        "final_logit_softcapping": meta.get(f"{arch}.final_logit_softcapping") or None,
    }
    base, swa = config["rope_theta"], meta.get(f"{arch}.rope.freq_base_swa")
    if arch == "gemma2" and swa is not None and float(swa) != base:
        raise GGUFError(f"{path}: Gemma 2 with its own sliding layers' RoPE base ({swa}) is not supported")
    if arch == "gemma3":
        full = {**(config.get("rope_scaling") or {"rope_type": "default"}), "rope_theta": base}
        local = {"rope_type": "default", "rope_theta": float(swa) if swa is not None else 10000.0}
        # the scaling read above applies to the full-attention layers only: it moves into their parameters
        out["rope_parameters"] = {"full_attention": full, "sliding_attention": local}
        out["rope_scaling"] = None
    return out


def _hf_config(contents: GGUFContents, arch: str, path: Path) -> dict:
    """A Hugging Face style ``config.json`` dict from the GGUF metadata and tensor table."""
    meta = contents.fields
    tensor_names = {t.name for t in contents.tensors}
    rope_freqs = _rope_freqs(contents)

    def need(key):
        full = f"{arch}.{key}"
        if meta.get(full) is None:
            raise GGUFError(f"{path}: metadata has no {full!r}")
        return meta[full]

    heads = int(need("attention.head_count"))
    kv = meta.get(f"{arch}.attention.head_count_kv", heads)
    if isinstance(kv, list):
        raise GGUFError(f"{path}: per-layer head_count_kv is not supported")
    hidden = int(need("embedding_length"))
    vocab = meta.get(f"{arch}.vocab_size") or len(meta.get("tokenizer.ggml.tokens") or [])
    if not vocab:
        raise GGUFError(f"{path}: metadata has neither {arch}.vocab_size nor tokenizer.ggml.tokens")
    # the head size: attention.key_length where the converter wrote one (Mistral NeMo, Qwen3, Gemma: not hidden /
    # heads), else hidden / heads; RoPE must rotate all of it
    head_dim = int(meta.get(f"{arch}.attention.key_length") or hidden // heads)
    value_dim = int(meta.get(f"{arch}.attention.value_length") or head_dim)
    rope_dims = int(meta.get(f"{arch}.rope.dimension_count") or head_dim)
    if value_dim != head_dim:
        raise GGUFError(f"{path}: attention.value_length {value_dim} != key_length {head_dim} is not supported")
    if rope_dims != head_dim and arch != "phi3":  # Phi-4-mini rotates part of each head, as transformers' Phi-3
        raise GGUFError(
            f"{path}: rope.dimension_count {rope_dims} != the head size {head_dim} (partial RoPE is supported for "
            "phi3 only)"
        )
    config = {
        "model_type": ARCHITECTURES[arch],
        "vocab_size": int(vocab),
        "hidden_size": hidden,
        "intermediate_size": int(need("feed_forward_length")),
        "num_hidden_layers": int(need("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(kv),
        "head_dim": head_dim,
        "rope_theta": float(meta.get(f"{arch}.rope.freq_base", 10000.0)),
        "rms_norm_eps": float(meta.get(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)),
        "max_position_embeddings": int(meta.get(f"{arch}.context_length", 4096)),
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "hidden_act": "gelu_pytorch_tanh" if arch.startswith("gemma") else "silu",
    }
    scaling = meta.get(f"{arch}.rope.scaling.type")
    longrope = sorted(set(_ROPE_TENSORS[1:]) & tensor_names)
    if scaling not in (None, "none", "linear", "yarn", "longrope"):
        raise GGUFError(f"{path}: RoPE scaling type {scaling!r} is not supported (linear, yarn, longrope)")
    if rope_freqs is not None and (scaling not in (None, "none") or longrope):
        raise GGUFError(f"{path}: both RoPE scaling ({scaling or longrope}) and rope_freqs.weight: which applies?")
    if scaling == "linear":
        config["rope_scaling"] = {"rope_type": "linear", "factor": float(need("rope.scaling.factor"))}
    elif scaling == "yarn":
        config["rope_scaling"] = _yarn_scaling(meta, arch, path, need)
    elif scaling == "longrope" or longrope:  # Phi-3's converter writes the two tensors, not always the type
        config["rope_scaling"] = _longrope_scaling(contents, arch, path, need)
    elif rope_freqs is not None:  # Llama 3.1's band rescaling, stored as one divisor per frequency
        config["rope_scaling"] = {"rope_type": "factors", "factors": rope_freqs}
    if arch == "phi3":
        if rope_dims != head_dim:
            config["partial_rotary_factor"] = rope_dims / head_dim
        window = int(meta.get("phi3.attention.sliding_window") or 0)  # 0: none (llama.cpp's mark for Phi-4)
        config["sliding_window"] = window or None
    if arch in ("gemma2", "gemma3"):
        config.update(_gemma23_fields(meta, arch, config, path))
    if arch == "granite":  # its converter writes transformers' multipliers as *_scale; without attention.scale
        # llama.cpp scales attention by head_dim ** -0.5 (transformers' Granite default would be 1.0)
        config.update(
            embedding_multiplier=meta.get("granite.embedding_scale"),
            residual_multiplier=meta.get("granite.residual_scale"),
            attention_multiplier=meta.get("granite.attention.scale") or head_dim**-0.5,
            logits_scaling=meta.get("granite.logit_scale"),
        )
    if arch == "qwen2":
        config["attention_bias"] = True
    elif "blk.0.attn_q.bias" in tensor_names or "blk.0.attn_output.bias" in tensor_names:
        config["attention_bias"] = True
    return config


_ROPE_TENSORS = ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight")
_PERMUTED_NAMES = ("q_proj.weight", "k_proj.weight", "q_proj.bias", "k_proj.bias")


def _unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row order: within each head it stores the even rotary rows, then the odd ones
    interleaved as (h, d/2, 2); Hugging Face's rotate-half layout is (h, 2, d/2)."""
    rows = w.shape[0]
    return w.reshape(heads, rows // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


class _Tensors:
    """Hugging Face tensor name -> dequantized float32 array in Hugging Face layout, read lazily."""

    def __init__(self, reader, arch: str, config: dict, path: Path):
        import gguf

        self._gguf = gguf
        self.path = path
        self.arch = arch
        self.config = config
        self.by_hf: dict[str, Any] = {}
        known = {int(t) for t in gguf.GGMLQuantizationType}
        for t in reader.tensors:
            if int(t.tensor_type) not in known:
                raise GGUFError(f"{path}: tensor {t.name!r} has an unknown quantization type {int(t.tensor_type)}")
            hf = self._hf_name(t.name, arch)
            if hf is not None:
                self.by_hf[hf] = t

    @staticmethod
    def _hf_name(name: str, arch: str) -> str | None:
        if name in _ROPE_TENSORS:  # read into the config (``_rope_freqs``, ``_longrope_scaling``), not weights
            return None
        if name in _GLOBAL_NAMES:
            return _GLOBAL_NAMES[name]
        if name.startswith("blk."):
            _, index, rest = name.split(".", 2)
            hf = _ARCH_LAYER_NAMES.get(arch, {}).get(rest) or _LAYER_NAMES.get(rest)
            if hf is not None:
                return f"model.layers.{index}.{hf}"
        return f"gguf:{name}"  # an unknown tensor: reported as unused by the loader

    def __contains__(self, name: str) -> bool:
        return name in self.by_hf

    def __iter__(self):
        return iter(self.by_hf)

    def __getitem__(self, name: str):
        return self

    def get(self, name: str) -> np.ndarray:
        t = self.by_hf[name]
        try:
            w = self._gguf.quants.dequantize(t.data, t.tensor_type)
        except NotImplementedError as err:
            raise GGUFError(
                f"{self.path}: tensor {t.name!r} has quantization type {t.tensor_type.name}, which the "
                f"installed gguf package cannot dequantize ({err})"
            ) from None
        w = np.asarray(w, np.float32).reshape(tuple(int(n) for n in reversed(t.shape)))
        # llama.cpp's converter permutes the q/k biases as it does the weights' rows
        if self.arch in _PERMUTED_QK and name.endswith(_PERMUTED_NAMES):
            heads = self.config["num_attention_heads" if "q_proj" in name else "num_key_value_heads"]
            w = _unpermute(w, heads)
        if self.arch.startswith("gemma") and name.endswith("norm.weight"):
            w = w - 1.0  # llama.cpp folds Gemma's (1 + w) into the stored weight
        return w


def read_config(path: str | os.PathLike) -> dict:
    """The Hugging Face style config the file's metadata describes (no tensor is dequantized)."""
    path = Path(path)
    reader = read(path)
    return _hf_config(reader, _architecture(reader.fields, path), path)


def _architecture(meta: dict, path: Path) -> str:
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise GGUFError(f"{path}: unsupported architecture {arch!r}; supported: {sorted(ARCHITECTURES)}")
    return arch


def load(
    path: str | os.PathLike, dtype="float32", *, tokenizer: Any = True, name: str | None = None, mesh=None
) -> CausalLM:
    """Load a GGUF file as a ``CausalLM`` with weights in ``dtype`` (``"float32"``, ``"bfloat16"``,
    ``"float16"``); ``tokenizer=True`` builds the file's tokenizer and chat template, ``False`` attaches none,
    any other object is attached as is; ``mesh`` places every weight into its sharding (see ``jaxspec.hf.load``).

    Raises ``FileNotFoundError`` for a missing file and ``GGUFError`` (a ``ValueError``) for a truncated or
    malformed file, an unsupported architecture, RoPE variant, tokenizer or quantization type.
    """
    from jaxspec import hf

    dtype = dtypes.check(dtype)
    path = Path(path)
    reader = read(path)
    meta = reader.fields
    arch = _architecture(meta, path)
    config = _hf_config(reader, arch, path)
    family = families.family_for_model_type(config["model_type"])
    try:
        cfg = family.config_from_hf(config, config["model_type"], dtype)
    except ValueError as err:
        raise GGUFError(f"{path}: {err}") from None
    tensors = _Tensors(reader, arch, config, path)
    shardings = None if mesh is None else family.shardings(cfg, mesh, name=path.stem)
    try:
        params = hf.load_params(path.parent, family, cfg, shardings, tensors=tensors)
    except ValueError as err:
        raise GGUFError(f"{path}: {err}".replace(f"checkpoint in {path.parent}", "the file")) from None
    if tokenizer is True:
        tokenizer = build_tokenizer(meta, path)
    elif tokenizer is False:
        tokenizer = None
    eos = end_of_generation_ids(meta)
    return family.from_params(
        cfg,
        families.loaded_params(family, params),
        tokenizer=tokenizer,
        eos_token_id=None if not eos else eos[0] if len(eos) == 1 else eos,
        name=name or model_name(path),
    )
