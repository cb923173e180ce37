"""Load GGUF files (llama.cpp's format) as a ``jaxspec.CausalLM``.

    model = jaxspec.load("SmolLM2-135M-Instruct.Q4_1.gguf", dtype="bfloat16")

Only the file's metadata and tensor data are read: the header, metadata and tensor table by ``GGUFContents`` (a
reader of the format over a memory map of the file, giving what the ``gguf`` package's ``GGUFReader`` gives, tested
against it, 25-30× faster on large vocabularies); every tensor is dequantized by ``gguf.quants.dequantize`` (every
type that package knows: F32, F16, BF16, Q8_0, Q4_0/1, Q5_0/1, Q2_K–Q6_K, IQ*, …) to float32 and cast to the
requested dtype. A model split into shards (``<name>-00001-of-00003.gguf``, ...: llama.cpp's ``gguf-split``)
loads from any of its files. The metadata becomes a Hugging Face style config and the tensors get their Hugging
Face names, so the model is built by the same family record (``jaxspec.families``) as ``jaxspec.hf.load``:

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

RoPE scaling: ``linear``; ``yarn`` (factor, original context length, beta_fast / beta_slow / attention factor where
written; DeepSeek's and Mistral's log multiplier is refused); Llama 3.1's ``rope_freqs`` divisors.

The tokenizer is rebuilt with the ``tokenizers`` library from the file's vocabulary: ``tokenizer.ggml.model ==
"gpt2"`` (byte-level BPE) from its merges, with the pre-tokenizer named by ``tokenizer.ggml.pre``; ``"llama"``
(SentencePiece vocabularies: Llama 1/2, Mistral v0.1, TinyLlama, Phi-3, Gemma 1/2) from its scores, as llama.cpp
tokenizes them: spaces become ``▁`` (one prepended unless ``tokenizer.ggml.add_space_prefix`` is false), then the
adjacent pair whose concatenation is the highest-scoring token is merged until none is left, and a character
outside the vocabulary falls back to its UTF-8 bytes (``<0xXX>`` tokens). Control tokens are special tokens;
BOS (and EOS) are added on encode where the file asks for them; the chat template comes from
``tokenizer.chat_template``.
"""

from __future__ import annotations

import dataclasses
import os
import re
import struct
from pathlib import Path
from typing import Any

import numpy as np

from jaxspec import dtypes, families
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
}
_PERMUTED_QK = {"llama"}  # converters that reorder q/k rows for llama.cpp's interleaved RoPE

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


class GGUFError(ValueError):
    """A GGUF file that cannot be loaded: truncated, malformed, or of an unsupported architecture/type."""


# GGUF value types (the format's numbering) -> numpy dtypes; 7 is bool, 8 a string, 9 an array
_SCALARS = {0: "u1", 1: "i1", 2: "u2", 3: "i2", 4: "u4", 5: "i4", 6: "f4", 10: "u8", 11: "i8", 12: "f8"}
_FORMATS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 10: "Q", 11: "q", 12: "d"}  # struct's
_BOOL, _STRING, _ARRAY = 7, 8, 9


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """One tensor of a GGUF file: ``shape`` in GGUF order (innermost first), ``tensor_type`` a
    ``gguf.GGMLQuantizationType``; ``data`` its bytes (read from the file on first use), rows of the last
    dimension's bytes, as ``gguf.quants.dequantize`` takes them."""

    name: str
    tensor_type: Any
    shape: tuple[int, ...]
    data_offset: int
    n_bytes: int
    file: Any

    @property
    def data(self) -> np.ndarray:
        raw = self.file[self.data_offset : self.data_offset + self.n_bytes]
        rows = int(np.prod(self.shape[1:], dtype=np.int64)) if len(self.shape) > 1 else 1
        return raw.reshape(rows, -1) if self.n_bytes else raw


class GGUFContents:
    """A GGUF file's metadata (``fields``: key -> Python value, arrays as lists) and tensor table
    (``tensors``: ``TensorInfo``s), parsed with ``struct`` and numpy over a memory map of the file: what
    ``gguf.GGUFReader`` gives, read in a fraction of its time (it builds a numpy view for every string of the
    vocabulary: 1.6 s for SmolLM2's metadata, 9 s for Llama 3's, against 0.1-0.5 s here). Tensor data stays in
    the file until a tensor is read."""

    def __init__(self, path: Path):
        import gguf

        self.path = path
        self.shards = [path]  # every file of a split model (``_reader``)
        self.file = np.memmap(path, dtype=np.uint8, mode="r")
        buf = memoryview(self.file)
        self._buf, self._pos = buf, 4
        (version,) = struct.unpack_from("<I", buf, 4)
        self._end = "<" if version < 0x10000 else ">"  # a big-endian file reads its version byte-swapped
        version = self._u32()
        if version not in (2, 3):
            raise GGUFError(f"{path}: GGUF version {version} is not supported (2 and 3 are)")
        n_tensors, n_fields = self._u64(), self._u64()
        self.fields: dict[str, Any] = {}
        for _ in range(n_fields):
            key = self._str()
            self.fields[key] = self._value(self._u32())
        known = {int(t): t for t in gguf.GGMLQuantizationType}
        infos = []
        for _ in range(n_tensors):
            name = self._str()
            dims = tuple(self._u64() for _ in range(self._u32()))
            raw, offset = self._u32(), self._u64()
            if raw not in known:
                raise GGUFError(f"{path}: tensor {name!r} has an unknown quantization type {raw}")
            infos.append((name, known[raw], dims, offset))
        align = int(self.fields.get("general.alignment", 32))
        start = -(-self._pos // align) * align
        self.tensors = []
        for name, qtype, dims, offset in infos:
            block, size = gguf.GGML_QUANT_SIZES[qtype]
            n_bytes = int(np.prod(dims, dtype=np.int64)) * size // block
            self.tensors.append(TensorInfo(name, qtype, dims, start + offset, n_bytes, self.file))
        del self._buf

    def _take(self, fmt: str):
        out = struct.unpack_from(self._end + fmt, self._buf, self._pos)
        self._pos += struct.calcsize(fmt)
        return out[0]

    def _u32(self) -> int:
        return self._take("I")

    def _u64(self) -> int:
        return self._take("Q")

    def _str(self) -> str:
        n = self._u64()
        if self._pos + n > len(self._buf):
            raise struct.error("string past the end of the file")
        text = bytes(self._buf[self._pos : self._pos + n]).decode("utf-8")
        self._pos += n
        return text

    def _value(self, kind: int):
        if kind in _SCALARS:
            return self._take(_FORMATS[kind])
        if kind == _BOOL:
            return bool(self._take("B"))
        if kind == _STRING:
            return self._str()
        if kind == _ARRAY:
            sub, count = self._u32(), self._u64()
            if sub in _SCALARS:  # numbers: one numpy read
                dtype = np.dtype(_SCALARS[sub]).newbyteorder(self._end)
                n = count * dtype.itemsize
                if self._pos + n > len(self._buf):
                    raise struct.error("array past the end of the file")
                values = np.frombuffer(self._buf, dtype, count, self._pos).tolist()
                self._pos += n
                return values
            return [self._value(sub) for _ in range(count)]
        raise ValueError(f"unknown metadata value type {kind}")


_SHARD = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


def _reader(path: Path) -> GGUFContents:
    """The file's contents; a model split into shards (llama.cpp's ``gguf-split``: ``<prefix>-00001-of-00003.gguf``
    ..., metadata ``split.no``/``split.count``/``split.tensors.count``), given by any of its shards, as one: the
    first shard's metadata and every shard's tensors, each shard checked to belong to the set."""
    contents = _read_one(path)
    count = int(contents.fields.get("split.count") or 1)
    if count <= 1:
        return contents
    match = _SHARD.match(path.name)
    if match is None or int(match["count"]) != count:
        raise GGUFError(
            f"{path} is shard {contents.fields.get('split.no', 0) + 1} of {count}, but its name does not follow "
            "'<prefix>-00001-of-000NN.gguf', so the other shards cannot be found"
        )
    shards = [path.with_name(f"{match['prefix']}-{i + 1:05d}-of-{count:05d}.gguf") for i in range(count)]
    missing = [s.name for s in shards if not s.is_file()]
    if missing:
        raise GGUFError(f"{path}: the model is split into {count} files and {', '.join(missing)} is missing")
    first = contents if shards[0] == path else _read_one(shards[0])
    tensors = []
    for i, shard in enumerate(shards):
        part = first if i == 0 else (contents if shard == path else _read_one(shard))
        if part.fields.get("split.no", -1) != i or int(part.fields.get("split.count") or 1) != count:
            raise GGUFError(
                f"{shard}: split.no {part.fields.get('split.no')} / split.count {part.fields.get('split.count')}; "
                f"expected shard {i} of {count}"
            )
        tensors += part.tensors
    expected = first.fields.get("split.tensors.count")
    if expected is not None and int(expected) != len(tensors):
        raise GGUFError(f"{path}: the {count} shards hold {len(tensors)} tensors; split.tensors.count is {expected}")
    first.tensors = tensors
    first.shards = shards
    return first


def _read_one(path: Path) -> GGUFContents:
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file {path} does not exist")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise GGUFError(f"{path} is not a GGUF file (magic {magic!r}, expected b'GGUF')")
    try:
        contents = GGUFContents(path)
    except GGUFError:
        raise
    except Exception as err:  # struct errors, bad UTF-8, unknown value types: a damaged file
        raise GGUFError(f"{path} is truncated or malformed and cannot be read ({type(err).__name__}: {err})") from None
    size = path.stat().st_size
    for t in contents.tensors:
        if t.data_offset + t.n_bytes > size:
            raise GGUFError(f"{path} is truncated: tensor {t.name!r} ends past the end of the file")
    return contents


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


# ----------------------------------------------------------------------------------------------- tokenizer

# The pre-tokenizers of byte-level BPE vocabularies, by ``tokenizer.ggml.pre``: the regular expressions that split
# the text in turn (each match isolated, the text between matches kept), as the model's own tokenizer.json does and
# llama.cpp reproduces (llama-vocab.cpp; its case-insensitive groups written out there, kept as (?i:...) here),
# then GPT-2's byte-to-unicode mapping.
_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_CONTRACTIONS = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)"
_LLAMA3_SPLIT = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_QWEN35_SPLIT = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_CJK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"  # CJK ideographs (and what lies below them), Hangul
_DEEPSEEK_LLM_LETTERS = (  # the letters DeepSeek LLM's tokenizer keeps together (Latin, Greek, Cyrillic, ...)
    "A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af\u0370-\u0373"
    "\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f"
    "\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77"
    "\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d"
    "\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4"
    "\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139"
    "\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d"
    "\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a"
    "\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2"
    "\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943"
)
# case-aware words (an upper-case run then lower case), as tiktoken's o200k and Mistral's Tekken split them
_UPPER, _LOWER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]", r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"
_TEKKEN_SPLIT = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*|\p{{N}}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT4O_SPLIT = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+{_CONTRACTIONS}?|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*{_CONTRACTIONS}?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_SEED_CODER_SPLIT = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+"
_BLOOM_SPLIT = (
    " ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+"  # words up to a space or . , ! ? … 。 ， 、 । ۔ ،
)
_STARCODER = (r"\p{N}", _GPT2_SPLIT)  # digits one by one, then GPT-2's split
_PRE_TOKENIZERS = {
    "gpt2": (_GPT2_SPLIT,),
    "llama3": (_LLAMA3_SPLIT,),
    "qwen2": (_QWEN2_SPLIT,),
    "qwen35": (_QWEN35_SPLIT,),
    "starcoder": _STARCODER,
    "deepseek-llm": (
        r"[\r\n]",
        rf"\s?[{_DEEPSEEK_LLM_LETTERS}]+",
        "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
        r"\s+$",
        _CJK,
        r"\p{N}+",
    ),
    "deepseek-coder": (r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK, r"\p{N}"),
    "falcon": (r"[\p{P}\$\+<=>\^~\|`]+", _GPT2_SPLIT, "[0-9][0-9][0-9]"),
    "tekken": (_TEKKEN_SPLIT,),
    "gpt-4o": (_GPT4O_SPLIT,),
    "seed-coder": (_SEED_CODER_SPLIT,),
    "bloom": (_BLOOM_SPLIT,),
    "viking": (_BLOOM_SPLIT, r"\p{N}"),
}
# llama.cpp's names for each (tokenizer.ggml.pre); the names in one entry share its splits exactly
_PRE_NAMES = {
    "gpt2": ("default", "gpt2", "gpt-2", "phi-2", "mpt", "olmo", "jais", "trillion", "exaone4", "roberta-bpe"),
    "llama3": ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "dbrx", "smaug-bpe"),
    "qwen2": ("qwen2", "deepseek-r1-qwen", "stablelm2", "megrez"),
    "qwen35": ("qwen35",),
    "starcoder": ("starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b"),
    "deepseek-llm": ("deepseek-llm",),
    "deepseek-coder": ("deepseek-coder",),
    "falcon": ("falcon",),
    "tekken": ("tekken",),  # Mistral NeMo, Ministral, Mistral Small 3, Pixtral 12B
    "gpt-4o": ("gpt-4o", "llama4"),
    "seed-coder": ("seed-coder",),
    "bloom": ("bloom", "poro-chat", "gpt3-finnish"),
    "viking": ("viking",),
}
_PRE_KIND = {name: kind for kind, names in _PRE_NAMES.items() for name in names}
# pre-tokenizers whose pre-token that is a token whole is taken before any merge (llama.cpp's ignore_merges):
# Llama 3's ' Việt' is one token there, not ' Vi' 'ệ' 't'
_IGNORE_MERGES = ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "tekken")


def _pre_tokenizer(pre: str | None, path: Path):
    from tokenizers import Regex
    from tokenizers import pre_tokenizers as pt

    kind = _PRE_KIND.get("default" if pre is None else pre)
    if kind is None:
        raise GGUFError(
            f"{path}: tokenizer pre-tokenizer {pre!r} is not supported (supported: {', '.join(sorted(_PRE_KIND))}); "
            "load with tokenizer=False and attach your own"
        )
    splits = [pt.Split(Regex(expr), behavior="isolated") for expr in _PRE_TOKENIZERS[kind]]
    return pt.Sequence([*splits, pt.ByteLevel(add_prefix_space=False, use_regex=False)])


def _bpe_model(meta: dict, tokens: list, types: list, path: Path):
    """(model, pre-tokenizer, normalizer, decoder) of a byte-level BPE vocabulary (``tokenizer.ggml.model`` gpt2)."""
    from tokenizers import decoders, models

    merges = meta.get("tokenizer.ggml.merges")
    if merges is None:
        raise GGUFError(f"{path}: tokenizer metadata lacks tokenizer.ggml.merges (needed by a 'gpt2' tokenizer)")
    vocab = {tok: i for i, tok in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    pre = meta.get("tokenizer.ggml.pre")
    model = models.BPE(
        vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False, ignore_merges=pre in _IGNORE_MERGES
    )
    return model, _pre_tokenizer(pre, path), None, decoders.ByteLevel()


_MERGEABLE = (1, 2, 4, 5)  # token types a SentencePiece merge may produce: normal, unknown, user-defined, unused


def _spm_merges(tokens: list, scores: list, types: list, ids: dict) -> list[tuple[str, str]]:
    """BPE merges equivalent to llama.cpp's SentencePiece tokenization: every split of a token into two tokens
    (``ids``: token -> id) is a merge, ranked by the score of the token it makes (highest first; ties by that
    token's id). Applying the lowest-ranked adjacent pair first is then merging the highest-scoring pair first, as
    llama.cpp does."""
    ranked = []
    for i, piece in enumerate(tokens):
        if types[i] not in _MERGEABLE or len(piece) < 2:
            continue
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in ids and right in ids:
                ranked.append((-float(scores[i]), i, ids[left], left, right))
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]


def _spm_model(meta: dict, tokens: list, types: list, path: Path):
    """(model, pre-tokenizer, normalizer, decoder) of a SentencePiece vocabulary (``tokenizer.ggml.model`` llama)."""
    from tokenizers import decoders, models, normalizers

    scores = meta.get("tokenizer.ggml.scores")
    if scores is None or len(scores) != len(tokens):
        raise GGUFError(
            f"{path}: a 'llama' (SentencePiece) tokenizer needs tokenizer.ggml.scores, one per token "
            f"({len(tokens)} tokens, {'no' if scores is None else len(scores)} scores)"
        )
    vocab = {}
    for i, tok in enumerate(tokens):
        vocab.setdefault(tok, i)  # a duplicated piece keeps its first id, as llama.cpp's lookup does
    unk_id = meta.get("tokenizer.ggml.unknown_token_id")
    unk = tokens[unk_id] if unk_id is not None and 0 <= unk_id < len(tokens) else None
    model = models.BPE(
        vocab=vocab, merges=_spm_merges(tokens, scores, types, vocab), unk_token=unk, fuse_unk=True, byte_fallback=True
    )
    prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
    space = [normalizers.Replace(" ", "\u2581")]
    normalizer = normalizers.Sequence(([normalizers.Prepend("\u2581")] if prefix else []) + space)
    steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    if prefix:
        steps.append(decoders.Strip(" ", 1, 0))
    return model, None, normalizer, decoders.Sequence(steps)


_TOKENIZER_MODELS = {"gpt2": _bpe_model, "llama": _spm_model}


def build_tokenizer(meta: dict, path: Path):
    """A ``transformers`` fast tokenizer (tokenizers backend, no torch) from the GGUF tokenizer metadata."""
    from tokenizers import AddedToken, Tokenizer, processors
    from transformers import PreTrainedTokenizerFast

    kind = meta.get("tokenizer.ggml.model")
    if kind not in _TOKENIZER_MODELS:
        raise GGUFError(
            f"{path}: tokenizer model {kind!r} is not supported (supported: 'gpt2', byte-level BPE; 'llama', "
            "SentencePiece); load with tokenizer=False and attach your own"
        )
    tokens = meta.get("tokenizer.ggml.tokens")
    if not tokens:
        raise GGUFError(f"{path}: tokenizer metadata lacks tokenizer.ggml.tokens")
    types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    model, pre_tokenizer, normalizer, decoder = _TOKENIZER_MODELS[kind](meta, tokens, types, path)
    tok = Tokenizer(model)
    if pre_tokenizer is not None:
        tok.pre_tokenizer = pre_tokenizer
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.decoder = decoder
    post = [processors.ByteLevel(trim_offsets=False)] if kind == "gpt2" else []
    # llama.cpp adds BOS (and EOS) to every encoded text where the file asks: encode(..., add_special_tokens=True)
    # does the same
    ends = {}
    for key in ("bos", "eos"):
        i = meta.get(f"tokenizer.ggml.{key}_token_id")
        if meta.get(f"tokenizer.ggml.add_{key}_token") and i is not None and 0 <= i < len(tokens):
            ends[key] = (tokens[i], i)
    if ends:
        bos = f"{ends['bos'][0]} " if "bos" in ends else ""
        eos = f" {ends['eos'][0]}" if "eos" in ends else ""
        post.append(
            processors.TemplateProcessing(
                single=f"{bos}$A{eos}", pair=f"{bos}$A{eos} {bos}$B{eos}", special_tokens=list(set(ends.values()))
            )
        )
    if post:
        tok.post_processor = processors.Sequence(post) if len(post) > 1 else post[0]
    control = [AddedToken(t, special=True, normalized=False) for t, k in zip(tokens, types) if k == 3]
    user = [AddedToken(t, special=False, normalized=False) for t, k in zip(tokens, types) if k == 4]
    tok.add_special_tokens(control)
    if user:
        tok.add_tokens(user)

    def token(key):
        i = meta.get(f"tokenizer.ggml.{key}_token_id")
        return tokens[i] if i is not None and 0 <= i < len(tokens) else None

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=token("bos"),
        eos_token=token("eos"),
        unk_token=token("unknown"),
        pad_token=token("padding"),
    )
    template = meta.get("tokenizer.chat_template")
    if template:
        fast.chat_template = template
    return fast


# ----------------------------------------------------------------------------------------------- loading


# tokens that end a chat turn or a text, by their text, whatever id a vocabulary gives them (the subset of llama.cpp's
# end-of-generation list for the families jaxspec loads: Llama 3, ChatML, Phi-3, Gemma, DeepSeek, CodeLlama, ...)
_END_TOKENS = (
    "<|eot_id|>",
    "<|eom_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "<\uff5cend\u2581of\u2581sentence\uff5c>",  # DeepSeek's, written with full-width bars and ▁
)


def end_of_generation_ids(meta: dict) -> tuple[int, ...]:
    """The ids that end a row, as llama.cpp decides them: ``tokenizer.ggml.eos_token_id`` first, then the
    ``eot_token_id`` / ``eom_token_id`` the file names, then every token whose text is a known end-of-turn marker
    (``<|im_end|>``, ``<|eot_id|>``, ``<|end|>``, ``<end_of_turn>``, ...). A chat model's turn often ends in a token
    other than its EOS (Phi-3: ``<|end|>`` with EOS ``<|endoftext|>``; Gemma: ``<end_of_turn>`` with ``<eos>``), so
    its replies stop where its chat template ends them."""
    ids = []
    for key in ("eos_token_id", "eot_token_id", "eom_token_id"):
        value = meta.get(f"tokenizer.ggml.{key}")
        if value is not None and int(value) >= 0 and int(value) not in ids:
            ids.append(int(value))
    tokens = meta.get("tokenizer.ggml.tokens") or []
    wanted = set(_END_TOKENS)
    ids += [i for i, tok in enumerate(tokens) if tok in wanted and i not in ids]
    return tuple(ids)


def read_config(path: str | os.PathLike) -> dict:
    """The Hugging Face style config the file's metadata describes (no tensor is dequantized)."""
    path = Path(path)
    reader = _reader(path)
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
    reader = _reader(path)
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
        name=name or (m["prefix"] if (m := _SHARD.match(path.name)) else path.stem),
    )
