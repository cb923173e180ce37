"""Load GGUF files (llama.cpp's format) as a ``jaxspec.CausalLM``.

    model = jaxspec.load("SmolLM2-135M-Instruct.Q4_1.gguf", dtype="bfloat16")

Only the file's metadata and tensor data are read: the header, metadata and tensor table by
``jaxspec.formats.gguf.reader`` (a reader of the format over a memory map of the file, giving what the ``gguf``
package's ``GGUFReader`` gives, tested against it, and faster: it builds no object per vocabulary string); every tensor
is dequantized by ``gguf.quants.dequantize`` (every type that package knows: F32, F16, BF16, Q8_0, Q4_0/1, Q5_0/1,
Q2_K–Q6_K, IQ*, …) to float32 and cast to the requested dtype. A model split into shards
(``<name>-00001-of-00003.gguf``, ...: llama.cpp's ``gguf-split``) loads from any of its files. The metadata becomes a
Hugging Face style config and the tensors get their Hugging Face names, so the model is built by the same family record
(``jaxspec.models.families``) as ``jaxspec.formats.hf.load``:

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
- ``gpt2``: GPT-2's own names; its converter transposes the Conv1D weights to [out, in]: transposed back. An older
  converter's ``output.weight`` (a copy of the tied head) is ignored.
- ``gptneox`` (Pythia, GPT-NeoX-20B, Dolly v2): GPT-NeoX's own names; its converter reorders the fused q/k/v rows
  from per head (q, k, v) to all q, all k, all v: put back per head.

The metadata -> config part, per architecture, is ``jaxspec.formats.gguf.config``.

RoPE scaling: ``linear``; ``yarn`` (factor, original context length, beta_fast / beta_slow / attention factor where
written; DeepSeek's and Mistral's log multiplier is refused); Llama 3.1's ``rope_freqs`` divisors.

The tokenizer is rebuilt with the ``tokenizers`` library from the file's vocabulary
(``jaxspec.formats.gguf.tokenizer``): ``tokenizer.ggml.model == "gpt2"`` (byte-level BPE) from its merges, with the
pre-tokenizer named by ``tokenizer.ggml.pre``; ``"llama"`` (SentencePiece vocabularies: Llama 1/2, Mistral v0.1,
TinyLlama, Phi-3, Gemma 1/2) from its scores, as llama.cpp tokenizes them: spaces become ``▁`` (one prepended unless
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

from jaxspec.core import dtypes
from jaxspec.core.model import CausalLM
from jaxspec.formats import hf
from jaxspec.formats.gguf.config import ARCHITECTURES, ROPE_TENSORS, hf_config
from jaxspec.formats.gguf.reader import GGUFError, model_name, read
from jaxspec.formats.gguf.tokenizer import build_tokenizer, end_of_generation_ids
from jaxspec.models import families

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


def _with_biases(names: dict[str, str]) -> dict[str, str]:
    return {f"{g}.{kind}": f"{hf}.{kind}" for g, hf in names.items() for kind in ("weight", "bias")}


# GPT-2 and GPT-NeoX keep their own Hugging Face names (LayerNorms with biases, one fused q/k/v):
# architecture -> (global names, the layers' Hugging Face prefix, per-layer names)
_GPT_LAYOUTS = {
    "gpt2": (
        {
            "token_embd.weight": "transformer.wte.weight",
            "position_embd.weight": "transformer.wpe.weight",
            # older converters wrote the tied head as a copy of token_embd: lm_head is ignored by the family
            "output.weight": "lm_head.weight",
            **_with_biases({"output_norm": "transformer.ln_f"}),
        },
        "transformer.h",
        _with_biases(
            {
                "attn_norm": "ln_1",
                "ffn_norm": "ln_2",
                "attn_qkv": "attn.c_attn",
                "attn_output": "attn.c_proj",
                "ffn_up": "mlp.c_fc",
                "ffn_down": "mlp.c_proj",
            }
        ),
    ),
    "gptneox": (
        {
            "token_embd.weight": "gpt_neox.embed_in.weight",
            "output.weight": "embed_out.weight",
            **_with_biases({"output_norm": "gpt_neox.final_layer_norm"}),
        },
        "gpt_neox.layers",
        _with_biases(
            {
                "attn_norm": "input_layernorm",
                "ffn_norm": "post_attention_layernorm",
                "attn_qkv": "attention.query_key_value",
                "attn_output": "attention.dense",
                "ffn_up": "mlp.dense_h_to_4h",
                "ffn_down": "mlp.dense_4h_to_h",
            }
        ),
    ),
}
_LLAMA_LAYOUT = (_GLOBAL_NAMES, "model.layers", _LAYER_NAMES)


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
        if name in ROPE_TENSORS:  # read into the config (``_rope_freqs``, ``_longrope_scaling``), not weights
            return None
        global_names, prefix, layer_names = _GPT_LAYOUTS.get(arch, _LLAMA_LAYOUT)
        if name in global_names:
            return global_names[name]
        if name.startswith("blk."):
            _, index, rest = name.split(".", 2)
            hf = _ARCH_LAYER_NAMES.get(arch, {}).get(rest) or layer_names.get(rest)
            if hf is not None:
                return f"{prefix}.{index}.{hf}"
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
        if self.arch == "gptneox" and ".query_key_value." in name:
            # its converter reorders the rows from per head (q, k, v) to all of q, then k, then v
            heads = self.config["num_attention_heads"]
            w = w.reshape(3, heads, -1, *w.shape[1:]).swapaxes(0, 1).reshape(w.shape)
        if self.arch == "gpt2" and w.ndim == 2 and name.startswith("transformer.h."):
            w = w.T  # its converter transposes GPT-2's Conv1D [in, out] weights to llama.cpp's [out, in]
        return w


def read_config(path: str | os.PathLike) -> dict:
    """The Hugging Face style config the file's metadata describes (no tensor is dequantized)."""
    path = Path(path)
    reader = read(path)
    return hf_config(reader, _architecture(reader.fields, path), path)


def _architecture(meta: dict, path: Path) -> str:
    arch = meta.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise GGUFError(f"{path}: unsupported architecture {arch!r}; supported: {sorted(ARCHITECTURES)}")
    return arch


def load(
    path: str | os.PathLike,
    dtype="float32",
    *,
    tokenizer: Any = True,
    name: str | None = None,
    mesh=None,
    quantize: str | None = None,
) -> CausalLM:
    """Load a GGUF file as a ``CausalLM`` with weights in ``dtype`` (``"float32"``, ``"bfloat16"``,
    ``"float16"``); ``tokenizer=True`` builds the file's tokenizer and chat template, ``False`` attaches none,
    any other object is attached as is; ``mesh`` places every weight into its sharding and ``quantize`` makes
    each projection and embedding int8 as it is read (see ``jaxspec.formats.hf.load``).

    Raises ``FileNotFoundError`` for a missing file and ``GGUFError`` (a ``ValueError``) for a truncated or
    malformed file, an unsupported architecture, RoPE variant, tokenizer or quantization type.
    """
    dtype = dtypes.check(dtype)
    path = Path(path)
    reader = read(path)
    meta = reader.fields
    arch = _architecture(meta, path)
    config = hf_config(reader, arch, path)
    family = families.family_for_model_type(config["model_type"])
    try:
        cfg = family.config_from_hf(config, config["model_type"], dtype)
    except ValueError as err:
        raise GGUFError(f"{path}: {err}") from None
    tensors = _Tensors(reader, arch, config, path)
    shardings = None if mesh is None else family.shardings(cfg, mesh, name=path.stem)
    try:
        params = hf.load_params(path.parent, family, cfg, shardings, tensors=tensors, quantize=quantize)
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
        **families.loaded_layout(family),
    )
