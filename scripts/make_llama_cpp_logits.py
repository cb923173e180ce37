"""Generate the Gemma 2 / Gemma 3, GPT-2 and GPT-NeoX GGUF fixtures and llama.cpp's own logits on them
(tests/fixtures/gguf/).

llama.cpp reads a few things of these architectures from the model size rather than from the file (the attention
scale: 1/sqrt(head size), except 1/sqrt(hidden / heads) for the 27B models; the sliding-window pattern unless the
file has one), so transformers' logits are not the reference for a GGUF file of them: llama.cpp's are. This
script writes the HF parity fixtures ``gemma2_softcap_swa`` and ``gemma3_text_swa`` (tests/fixtures/hf/) as
llama.cpp's converter lays them out (``conversion/gemma.py`` of the pinned source archive: norms stored as 1 + w,
``post_attention_norm`` / ``ffn_norm`` / ``post_ffw_norm``, key and value lengths, soft-capping, window, the
global and sliding layers' RoPE bases, Gemma 3's linear scaling of the global layers), plus a small SentencePiece
vocabulary llama.cpp needs to load a model and, for Gemma 3 (three layers that do not follow its default pattern of
six), the per-layer ``attention.sliding_window_pattern``; then runs them through llama.cpp (float32 KV cache, no
flash attention, one thread) on the fixtures' token ids and saves the logits to ``llama_cpp_logits.npz``.

GPT-2 (``gpt2_tied``) and GPT-NeoX (``gpt_neox_parallel``) are written by ``tests/gguf_writers.write_gpt``, the
writer the tests use: llama.cpp's logits on them check that writer's layout (GPT-2's transposed Conv1D weights,
GPT-NeoX's reordered q/k/v rows) against llama.cpp's own reading, so transformers' logits are a valid reference
for the variants the tests write with it. They agree with transformers' to 1e-3 / 2e-3 (llama.cpp's GELU).

It needs the llama.cpp venv of ``scripts/make_llama_cpp_fixtures.py`` with ``gguf`` and ``safetensors``:

    /tmp/lcppvenv/bin/pip install gguf==0.19.0 safetensors
    /tmp/lcppvenv/bin/python scripts/make_llama_cpp_logits.py
"""

from __future__ import annotations

import json
import sys
from importlib.metadata import version
from pathlib import Path

import gguf
import llama_cpp
import numpy as np
from safetensors.numpy import load_file

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from gguf_writers import add_vocab, finish, write_gpt  # noqa: E402  (gguf, numpy and safetensors only)

HF = ROOT / "tests" / "fixtures" / "hf"
OUT = ROOT / "tests" / "fixtures" / "gguf"
# HF fixture -> llama.cpp architecture
MODELS = {
    "gemma2_softcap_swa": "gemma2",
    "gemma3_text_swa": "gemma3",
    "gpt2_tied": "gpt2",
    "gpt_neox_parallel": "gptneox",
}
NAMES = {  # transformers' layer tensor names -> llama.cpp's (conversion/gemma.py via gguf's tensor map)
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
}


def write(fixture: str, arch: str, path: Path) -> None:
    cfg = json.loads((HF / fixture / "config.json").read_text())
    rope = cfg["rope_parameters"]
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_sliding_window(cfg["sliding_window"])
    if arch == "gemma2":
        w.add_attn_logit_softcapping(cfg["attn_logit_softcapping"])
        w.add_final_logit_softcapping(cfg["final_logit_softcapping"])
        w.add_rope_freq_base(rope["rope_theta"])
    else:
        full, local = rope["full_attention"], rope["sliding_attention"]
        w.add_rope_freq_base(full["rope_theta"])
        w.add_rope_freq_base_swa(local["rope_theta"])
        if full["rope_type"] == "linear":
            w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(full["factor"])
        w.add_array(f"{arch}.attention.sliding_window_pattern", [t == "sliding_attention" for t in cfg["layer_types"]])
    add_vocab(w, cfg["vocab_size"])
    for name, x in load_file(HF / fixture / "model.safetensors").items():
        x = np.asarray(x, np.float32)
        if name.endswith("norm.weight"):  # Gemma's RMSNorm scales by 1 + w; llama.cpp stores 1 + w
            x = x + 1.0
        if name == "model.embed_tokens.weight":
            w.add_tensor("token_embd.weight", x)
        elif name == "model.norm.weight":
            w.add_tensor("output_norm.weight", x)
        else:
            _, _, layer, rest = name.split(".", 3)
            w.add_tensor(f"blk.{layer}.{NAMES[rest]}", x)
    finish(w)


def logits(path: Path, ids: np.ndarray) -> np.ndarray:
    llm = llama_cpp.Llama(
        str(path), n_ctx=128, logits_all=True, verbose=False, n_threads=1, type_k=0, type_v=0, flash_attn=False
    )
    out = []
    for row in ids:
        llm.reset()
        llm.eval([int(t) for t in row])
        out.append(np.array(llm.scores[: len(row)], np.float32))
    return np.stack(out)


def main() -> None:
    arrays = {}
    for fixture, arch in MODELS.items():
        path = OUT / f"{arch}_f32.gguf"
        if arch.startswith("gpt"):  # the MLP's real width: llama.cpp sizes it from feed_forward_length
            write_gpt(HF / fixture, arch, path, converter_ffn=False)
        else:
            write(fixture, arch, path)
        data = np.load(HF / fixture / "expected.npz")
        arrays[arch] = logits(path, data["ids"])
        diff = np.abs(arrays[arch] - data["logits"]).max()
        print(f"{path.name}: {path.stat().st_size / 1024:.0f} KiB; llama.cpp vs transformers max diff {diff:.3f}")
    np.savez_compressed(OUT / "llama_cpp_logits.npz", **arrays)
    print(f"llama-cpp-python {version('llama-cpp-python')}, gguf {version('gguf')}")


if __name__ == "__main__":
    main()
