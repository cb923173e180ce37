"""Export a jaxspec model as a Hugging Face directory (``config.json`` + ``model.safetensors`` + tokenizer).

The inverse of ``jaxspec.formats.hf.load``, through the same family record (``jaxspec.models.families``): its
``config_to_hf`` writes the config and its weight table names (and transposes, and fuses) every tensor, so a round trip
jaxspec -> HF directory -> jaxspec gives identical parameters. The Llama-family records export (``llama``,
``mistral``, ``qwen2``, ``qwen3``, ``gemma``, and ``phi3`` on request); GPT-2 does not.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import numpy as np

from jaxspec.core.model import CausalLM
from jaxspec.formats import safetensors_file
from jaxspec.models import families, llama, quant
from jaxspec.models.families import ModelFamily


def hf_tensors(family: ModelFamily, cfg, params) -> dict[str, np.ndarray]:
    """Hugging Face tensor name -> array, by the family's weight table (parts of a fused tensor concatenated)."""
    out: dict[str, np.ndarray] = {}
    parts: dict[str, list] = {}
    for w in family.weights(cfg):
        value = np.asarray(w.get(params))
        for name, part in zip(w.names(cfg.num_layers), value if w.stacked else [value]):
            if w.rows is None:
                out[name] = w.to_hf(part)
            else:
                parts.setdefault(name, []).append((w.rows, w.to_hf(part)))
    for name, pieces in parts.items():
        out[name] = np.concatenate([p for _, p in sorted(pieces, key=lambda piece: piece[0])])
    return out


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


def _family(cfg, model_type: str | None) -> ModelFamily:
    """The record that exports ``cfg``: the one of ``model_type``, or the first exporting family of its config."""
    exporters = [f for f in families.registered() if f.config_to_hf is not None]
    family: ModelFamily | None
    if model_type is None and getattr(cfg, "rotary_dim", None) is not None:
        model_type = "phi3"  # the Llama-layout model of transformers that rotates part of each head
    if model_type is not None:
        family = families.family_for_model_type(model_type)
    else:
        family = next((f for f in exporters if isinstance(cfg, f.config_class) and f.layout_of is None), None)
    if family is None or family not in exporters or not isinstance(cfg, family.config_class):
        supported = "; ".join(f"{f.config_class.__name__} as {'/'.join(f.architectures)}" for f in exporters)
        asked = f" as model_type={model_type!r}" if model_type is not None else ""
        raise ValueError(
            f"export_hf supports Llama-family models ({supported}); got a model whose config is "
            f"{type(cfg).__name__}{asked}"
        )
    return family


def export_hf(model: CausalLM, directory: str | os.PathLike, *, model_type: str | None = None) -> Path:
    """Write ``model`` (a built-in Llama-family model) as a Hugging Face directory that transformers loads.

    ``model_type`` None writes the ``model_type`` that describes the config (``llama``, ``mistral``, ``qwen2``,
    ``qwen3`` or ``gemma``); another layout of the same model may be asked for (``"phi3"``: fused q/k/v and
    gate/up tensors). A reduced-vocabulary draft is written over the full vocabulary (see ``_full_vocab``).
    Raises ``ValueError`` for a model or ``model_type`` that has no such export, ``FileExistsError`` for a
    non-empty ``directory``. A quantized model (``jaxspec.quantize``) is written with float weights, its int8
    weights times their scales.
    """
    cfg = model.config
    family = _family(cfg, model_type)
    directory = Path(directory)
    if directory.exists() and any(directory.iterdir()):
        raise FileExistsError(f"directory {directory} exists and is not empty; choose a new path")
    # the weight table's layout, in floats (a quantized model's int8 weights times their scales)
    params = quant.dequantize_params(families.stack_layers(model.params), cfg.jnp_dtype)
    if getattr(cfg, "vocab_ids", ()):
        cfg, params = _full_vocab(cfg, params)
    eos = model.eos_token_id
    assert family.config_to_hf is not None  # _family returns exporting families only
    config = {**family.config_to_hf(cfg, model_type), "eos_token_id": list(eos) if isinstance(eos, tuple) else eos}
    directory.mkdir(parents=True, exist_ok=True)
    safetensors_file.write(directory / "model.safetensors", hf_tensors(family, cfg, params))
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    if model.tokenizer is not None and hasattr(model.tokenizer, "save_pretrained"):
        model.tokenizer.save_pretrained(directory)
    return directory
