"""Export a jaxspec model as a Hugging Face directory (``config.json`` + ``model.safetensors`` + tokenizer).

The inverse of ``jaxspec.hf.load`` for the Llama family (Gemma included), through the same name map, so a round trip
jaxspec -> HF directory -> jaxspec gives identical parameters.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import numpy as np

from jaxspec.hf import _ST_DTYPES, _get, _llama_tensors
from jaxspec.model import CausalLM
from jaxspec.models import llama

_ST_NAMES = {np.dtype(v): k for k, v in _ST_DTYPES.items()}
_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gemma": "GemmaForCausalLM",
}


def write_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    """Write arrays (any dtype in the safetensors table, bfloat16 included) as one safetensors file."""
    header, offset, blobs = {}, 0, []
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        blob = a.tobytes()
        header[name] = {
            "dtype": _ST_NAMES[a.dtype],
            "shape": list(a.shape),
            "data_offsets": [offset, offset + len(blob)],
        }
        offset += len(blob)
        blobs.append(blob)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(len(head).to_bytes(8, "little"))
        f.write(head)
        for blob in blobs:
            f.write(blob)


def _model_type(cfg: llama.LlamaConfig) -> str:
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


def _hf_config(cfg: llama.LlamaConfig, eos) -> dict:
    model_type = _model_type(cfg)
    rope = dict(cfg.rope_params)
    config = {
        "architectures": [_ARCHITECTURES[model_type]],
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
        "eos_token_id": list(eos) if isinstance(eos, tuple) else eos,
    }
    if model_type in ("llama", "gemma"):
        config["attention_bias"] = cfg.o_bias
    if model_type == "gemma":
        config["hidden_act"] = config["hidden_activation"] = "gelu_pytorch_tanh"
    if model_type == "mistral":
        config["sliding_window"] = cfg.sliding_window
    if model_type == "qwen2":
        config["use_sliding_window"] = False
    return config


def _full_vocab(cfg: llama.LlamaConfig, params) -> tuple[llama.LlamaConfig, dict]:
    """A reduced-vocabulary model over the full vocabulary, as transformers can hold it: every id embeds as its row
    (others as the out-of-vocabulary row) and an untied LM head is zero outside ``vocab_ids``, so those ids get
    logit 0 instead of -inf (an approximation: such a draft may propose them where its best logit is negative)."""
    rows = np.full(cfg.vocab_size, len(cfg.vocab_ids), np.int64)
    rows[np.asarray(cfg.vocab_ids)] = np.arange(len(cfg.vocab_ids))
    emb = np.asarray(params["embed"]["embedding"])
    head = (emb if cfg.tie_embeddings else np.asarray(params["lm_head"]["kernel"]).T)[rows]
    head[rows == len(cfg.vocab_ids)] = 0
    params = {**params, "embed": {"embedding": emb[rows]}, "lm_head": {"kernel": head.T}}
    return dataclasses.replace(cfg, vocab_ids=(), tie_embeddings=False), params


def export_hf(model: CausalLM, directory: str | os.PathLike) -> Path:
    """Write ``model`` (a built-in Llama-family model) as a Hugging Face directory that transformers loads.
    A reduced-vocabulary draft is written over the full vocabulary (see ``_full_vocab``)."""
    cfg = model.config
    if not isinstance(cfg, llama.LlamaConfig):
        raise ValueError(f"export_hf supports Llama-family models (config LlamaConfig), got {type(cfg).__name__}")
    directory = Path(directory)
    if directory.exists() and any(directory.iterdir()):
        raise FileExistsError(f"directory {directory} exists and is not empty; choose a new path")
    directory.mkdir(parents=True, exist_ok=True)
    if cfg.vocab_ids:
        cfg, params = _full_vocab(cfg, model.params)
        model = model.replace(config=cfg, params=params)
    tensors = {}
    for spec in _llama_tensors(cfg):
        value = np.asarray(_get(model.params, spec.path))
        parts = list(value) if spec.stacked else [value]
        for name, part in zip(spec.names, parts):
            tensors[name] = part.T if spec.transpose else part
    write_safetensors(directory / "model.safetensors", tensors)
    (directory / "config.json").write_text(json.dumps(_hf_config(cfg, model.eos_token_id), indent=2))
    if model.tokenizer is not None and hasattr(model.tokenizer, "save_pretrained"):
        model.tokenizer.save_pretrained(directory)
    return directory
