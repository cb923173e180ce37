"""GGUF metadata -> a Hugging Face style ``config.json`` dict, per llama.cpp architecture
(``jaxspec.formats.gguf.loader`` builds the model from it with the same family record as ``jaxspec.formats.hf.load``).

Each architecture's keys are read as llama.cpp's converter writes them and llama.cpp reads them: the head size from
``attention.key_length`` where written, RoPE scaling (``linear``, ``yarn``, Llama 3.1's ``rope_freqs`` divisors,
Phi-3's LongRoPE tensors), Gemma 2/3's sliding layers and soft-capping, Granite's multipliers, GPT-NeoX's partial
RoPE and residual layout. What has no transformers equivalent is a ``GGUFError`` naming the key.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from jaxspec.formats.gguf.reader import GGUFContents, GGUFError

# GGUF architecture -> the Hugging Face model_type whose family builds it
ARCHITECTURES = {
    "llama": "llama",
    "qwen2": "qwen2",
    "qwen2vl": "qwen2",  # Qwen2-VL / Qwen2.5-VL's text model: M-RoPE, which is RoPE on text (formats.hf_wrappers)
    "qwen3": "qwen3",
    "gemma": "gemma",
    "gemma2": "gemma2",
    "gemma3": "gemma3_text",
    "phi3": "phi3",
    "granite": "granite",
    "gpt2": "gpt2",
    "gptneox": "gpt_neox",
}
ROPE_TENSORS = ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight")


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
        if t.name in ROPE_TENSORS[1:]:
            factors[t.name] = [float(x) for x in np.ravel(gguf.quants.dequantize(t.data, t.tensor_type))]
    for name in ROPE_TENSORS[1:]:
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


def _needer(meta: dict, arch: str, path: Path):
    def need(key):
        full = f"{arch}.{key}"
        if meta.get(full) is None:
            raise GGUFError(f"{path}: metadata has no {full!r}")
        return meta[full]

    return need


def _rope_scaling(contents: GGUFContents, arch: str, path: Path) -> dict | None:
    """transformers' ``rope_scaling`` of the file: linear, YaRN, LongRoPE (Phi-3's two factor tensors) or Llama
    3.1's ``rope_freqs`` divisors (jaxspec's ``factors``); None for plain RoPE."""
    meta, need = contents.fields, _needer(contents.fields, arch, path)
    rope_freqs = _rope_freqs(contents)
    scaling = meta.get(f"{arch}.rope.scaling.type")
    longrope = sorted(set(ROPE_TENSORS[1:]) & {t.name for t in contents.tensors})
    if scaling not in (None, "none", "linear", "yarn", "longrope"):
        raise GGUFError(f"{path}: RoPE scaling type {scaling!r} is not supported (linear, yarn, longrope)")
    if rope_freqs is not None and (scaling not in (None, "none") or longrope):
        raise GGUFError(f"{path}: both RoPE scaling ({scaling or longrope}) and rope_freqs.weight: which applies?")
    if scaling == "linear":
        return {"rope_type": "linear", "factor": float(need("rope.scaling.factor"))}
    if scaling == "yarn":
        return _yarn_scaling(meta, arch, path, need)
    if scaling == "longrope" or longrope:  # Phi-3's converter writes the two tensors, not always the type
        return _longrope_scaling(contents, arch, path, need)
    if rope_freqs is not None:  # Llama 3.1's band rescaling, stored as one divisor per frequency
        return {"rope_type": "factors", "factors": rope_freqs}
    return None


def _vocab_size(meta: dict, arch: str, path: Path) -> int:
    vocab = meta.get(f"{arch}.vocab_size") or len(meta.get("tokenizer.ggml.tokens") or [])
    if not vocab:
        raise GGUFError(f"{path}: metadata has neither {arch}.vocab_size nor tokenizer.ggml.tokens")
    return int(vocab)


def _gpt_config(contents: GGUFContents, arch: str, path: Path) -> dict:
    """GPT-2's and GPT-NeoX's transformers fields. llama.cpp's GPT-2 converter writes ``feed_forward_length`` as
    4 × the width whatever ``n_inner`` is: the MLP width is read from ``blk.0.ffn_up.weight``. The activation is
    their checkpoints' (GPT-2's ``gelu_new``, GPT-NeoX's exact ``gelu``, as Pythia, GPT-NeoX-20B and Dolly set it):
    the file does not say, and llama.cpp computes both with its tanh approximation."""
    meta, need = contents.fields, _needer(contents.fields, arch, path)
    shapes = {t.name: tuple(int(n) for n in reversed(t.shape)) for t in contents.tensors}
    hidden, heads, layers = int(need("embedding_length")), int(need("attention.head_count")), int(need("block_count"))
    eps = float(meta.get(f"{arch}.attention.layer_norm_epsilon", 1e-5))
    if arch == "gpt2":
        if "blk.0.ffn_up.weight" not in shapes:
            raise GGUFError(f"{path}: the file has no tensor 'blk.0.ffn_up.weight'")
        return {
            "model_type": "gpt2",
            "vocab_size": _vocab_size(meta, arch, path),
            "n_embd": hidden,
            "n_layer": layers,
            "n_head": heads,
            "n_positions": int(need("context_length")),
            "n_inner": shapes["blk.0.ffn_up.weight"][0],
            "layer_norm_epsilon": eps,
            "activation_function": "gelu_new",
        }
    config = {
        "model_type": "gpt_neox",
        "vocab_size": _vocab_size(meta, arch, path),
        "hidden_size": hidden,
        "intermediate_size": int(need("feed_forward_length")),
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        # llama.cpp rotates the first rope.dimension_count of each head, in the NeoX (rotate-half) layout
        "rotary_pct": int(meta.get(f"{arch}.rope.dimension_count") or hidden // heads) / (hidden // heads),
        "rope_theta": float(meta.get(f"{arch}.rope.freq_base", 10000.0)),
        "use_parallel_residual": bool(meta.get(f"{arch}.use_parallel_residual", True)),
        "layer_norm_eps": eps,
        "max_position_embeddings": int(meta.get(f"{arch}.context_length", 2048)),
        "tie_word_embeddings": "output.weight" not in shapes,
        "attention_bias": "blk.0.attn_qkv.bias" in shapes,
        "hidden_act": "gelu",
    }
    scaling = _rope_scaling(contents, arch, path)
    if scaling is not None:
        config["rope_scaling"] = scaling
    return config


def hf_config(contents: GGUFContents, arch: str, path: Path) -> dict:
    """A Hugging Face style ``config.json`` dict from the GGUF metadata and tensor table."""
    if arch in ("gpt2", "gptneox"):
        return _gpt_config(contents, arch, path)
    meta, need = contents.fields, _needer(contents.fields, arch, path)
    tensor_names = {t.name for t in contents.tensors}
    heads = int(need("attention.head_count"))
    kv = meta.get(f"{arch}.attention.head_count_kv", heads)
    if isinstance(kv, list):
        raise GGUFError(f"{path}: per-layer head_count_kv is not supported")
    hidden = int(need("embedding_length"))
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
        "vocab_size": _vocab_size(meta, arch, path),
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
    scaling = _rope_scaling(contents, arch, path)
    if scaling is not None:
        config["rope_scaling"] = scaling
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
    if arch == "qwen2vl":
        # M-RoPE's sections (temporal, height, width, and a fourth llama.cpp reserves): on text every token has one
        # position in the first three, so they rotate as plain RoPE; a fourth section would rotate by another
        sections = list(meta.get("qwen2vl.rope.dimension_sections") or [])
        if any(sections[3:]):
            raise GGUFError(
                f"{path}: qwen2vl.rope.dimension_sections {sections} with a fourth section is not supported"
            )
    if arch in ("qwen2", "qwen2vl"):
        config["attention_bias"] = True
    elif "blk.0.attn_q.bias" in tensor_names or "blk.0.attn_output.bias" in tensor_names:
        config["attention_bias"] = True
    return config
