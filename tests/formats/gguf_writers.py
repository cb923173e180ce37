"""GGUF files written as llama.cpp's converter lays out a Hugging Face checkpoint, apart from jaxspec (only gguf,
numpy and safetensors: ``scripts/fixtures/make_llama_cpp_logits.py`` runs this in the llama.cpp venv too)."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
from safetensors.numpy import load_file

# Hugging Face module -> llama.cpp's tensor name (its converter's gguf tensor map), per layer and global
_LAYERS = {
    "gpt2": {
        "ln_1": "attn_norm",
        "ln_2": "ffn_norm",
        "attn.c_attn": "attn_qkv",
        "attn.c_proj": "attn_output",
        "mlp.c_fc": "ffn_up",
        "mlp.c_proj": "ffn_down",
    },
    "gptneox": {
        "input_layernorm": "attn_norm",
        "post_attention_layernorm": "ffn_norm",
        "attention.query_key_value": "attn_qkv",
        "attention.dense": "attn_output",
        "mlp.dense_h_to_4h": "ffn_up",
        "mlp.dense_4h_to_h": "ffn_down",
    },
}
_GLOBALS = {
    "gpt2": {"transformer.wte": "token_embd", "transformer.wpe": "position_embd", "transformer.ln_f": "output_norm"},
    "gptneox": {"gpt_neox.embed_in": "token_embd", "gpt_neox.final_layer_norm": "output_norm", "embed_out": "output"},
}
_PREFIX = {"gpt2": "transformer.h.", "gptneox": "gpt_neox.layers."}


def add_vocab(w: gguf.GGUFWriter, size: int) -> None:
    """A small SentencePiece vocabulary (pad, eos, bos, unk, then w0, w1, ...): llama.cpp loads no model without
    one."""
    tokens = ["<pad>", "<eos>", "<bos>", "<unk>"] + [f"w{i}" for i in range(size - 4)]
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * len(tokens))
    w.add_token_types([3, 3, 3, 2] + [1] * (len(tokens) - 4))  # control, control, control, unknown, normal ...
    w.add_pad_token_id(0)
    w.add_eos_token_id(1)
    w.add_bos_token_id(2)
    w.add_unk_token_id(3)


def finish(w: gguf.GGUFWriter) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_gpt(hf_dir: Path, arch: str, path: Path, *, faithful=True, converter_ffn=True, head_copy=False) -> Path:
    """A GPT-2 (``arch="gpt2"``) or GPT-NeoX (``"gptneox"``) checkpoint in ``hf_dir`` as llama.cpp's converter
    (conversion/gpt2.py, gptneox.py) writes it: GPT-2's Conv1D weights transposed to [out, in] and its
    ``feed_forward_length`` written as 4 × the width whatever ``n_inner`` is (``converter_ffn=False``: the real
    width, which llama.cpp itself needs to load the file); GPT-NeoX's fused q/k/v rows reordered from per head
    (q, k, v) to all q, all k, all v, its rotary dimensions, RoPE base, linear scaling and residual layout.
    ``head_copy``: GPT-2's tied head also written as ``output.weight`` (older converters). ``faithful=False``
    leaves out one step, for negative controls: GPT-NeoX's q/k/v reorder; GPT-2's transpose of the (square)
    attention output projection."""
    cfg = json.loads((hf_dir / "config.json").read_text())
    w = gguf.GGUFWriter(str(path), arch)
    if arch == "gpt2":
        hidden, heads = cfg["n_embd"], cfg["n_head"]
        w.add_block_count(cfg["n_layer"])
        w.add_context_length(cfg["n_positions"])
        w.add_feed_forward_length(4 * hidden if converter_ffn else cfg["n_inner"] or 4 * hidden)
        w.add_layer_norm_eps(cfg["layer_norm_epsilon"])
    else:
        hidden, heads = cfg["hidden_size"], cfg["num_attention_heads"]
        rope = cfg["rope_parameters"]
        w.add_block_count(cfg["num_hidden_layers"])
        w.add_context_length(cfg["max_position_embeddings"])
        w.add_feed_forward_length(cfg["intermediate_size"])
        w.add_rope_dimension_count(int(rope["partial_rotary_factor"] * (hidden // heads)))
        w.add_rope_freq_base(rope["rope_theta"])
        if rope["rope_type"] == "linear":
            w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(rope["factor"])
        w.add_parallel_residual(cfg["use_parallel_residual"])
        w.add_layer_norm_eps(cfg["layer_norm_eps"])
    w.add_embedding_length(hidden)
    w.add_head_count(heads)
    add_vocab(w, cfg["vocab_size"])
    for name, x in load_file(hf_dir / "model.safetensors").items():
        x = np.asarray(x, np.float32)
        stem, kind = name.rsplit(".", 1)
        if stem in _GLOBALS[arch]:
            w.add_tensor(f"{_GLOBALS[arch][stem]}.{kind}", x)
            if head_copy and stem == "transformer.wte":
                w.add_tensor("output.weight", x)
            continue
        layer, rest = stem[len(_PREFIX[arch]) :].split(".", 1)
        if arch == "gpt2" and kind == "weight" and x.ndim == 2 and (faithful or rest != "attn.c_proj"):
            x = x.T
        if rest == "attention.query_key_value" and faithful:
            x = x.reshape(heads, 3, hidden // heads, *x.shape[1:]).swapaxes(0, 1).reshape(x.shape)
        w.add_tensor(f"blk.{layer}.{_LAYERS[arch][rest]}.{kind}", x)
    finish(w)
    return path
