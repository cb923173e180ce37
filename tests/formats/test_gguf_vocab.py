"""GGUF tokenizers against llama.cpp's own tokenizer test vectors.

llama.cpp ships, for several model families, a vocabulary-only GGUF file with an input file of test strings and
an output file of the ids its tokenizer gives them (``models/ggml-vocab-<name>.gguf{,.inp,.out}``, read by its
``test-tokenizer-0``). They come inside the source distribution of ``llama-cpp-python`` on PyPI (its vendored
llama.cpp); the archive is fetched once (pinned version, checked against its sha256) into the jaxspec cache
(``$JAXSPEC_CACHE`` or ``~/.cache/jaxspec``, under ``test-data/``), and only those files are unpacked. Nothing in it
is imported or run.

Families checked: SentencePiece vocabularies (``tokenizer.ggml.model`` llama: Llama 2's, Phi-3's) and byte-level
BPE ones, one per pre-tokenizer jaxspec builds (``tokenizer.ggml.pre``): GPT-2's and MPT's (GPT-2's split), Llama 3's
(whose pre-tokens that are tokens whole skip the merges), Qwen2's and Qwen3.5's, StarCoder's, Refact's and
Command-R's (digits one by one), DeepSeek LLM's, DeepSeek Coder's and Falcon's. The same files (and Llama 3's and
GPT-2's under the Tekken, GPT-4o, Seed-Coder, BLOOM and Viking pre-tokenizers) also tokenize 343 more strings as
llama.cpp's tokenizer itself does (ids in ``fixtures/gguf/llama_cpp_tokenization.json.gz``, from
``scripts/fixtures/make_llama_cpp_tokenization.py`` in a venv with llama-cpp-python built from the same archive).
"""

import functools
import gzip
import hashlib
import json
import os
import shutil
import tarfile
import urllib.request
from pathlib import Path

import gguf
import pytest
from helpers import FIXTURES_DIR

from jaxspec.formats import named
from jaxspec.formats.gguf import reader as gguf_reader
from jaxspec.formats.gguf import tokenizer as gguf_tokenizer

SDIST = "llama_cpp_python-0.3.36.tar.gz"
URL = (
    "https://files.pythonhosted.org/packages/ec/e9/"
    "e7de2b0463ea3ffbf0ede6cb21b58c1258a8f6521aae45ca773a59fe7cf3/" + SDIST
)
SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
MODELS = "llama_cpp_python-0.3.36/vendor/llama.cpp/models/"
SPM_VOCABS = ["llama-spm", "phi-3"]
BPE_VOCABS = [  # one per pre-tokenizer kind of gguf_tokenizer._PRE_NAMES (mpt: GPT-2's; refact, command-r: StarCoder's)
    "gpt-2",
    "llama-bpe",
    "qwen2",
    "qwen35",
    "starcoder",
    "refact",
    "command-r",
    "mpt",
    "deepseek-llm",
    "deepseek-coder",
    "falcon",
]
VOCABS = SPM_VOCABS + BPE_VOCABS
# pre-tokenizers without a vocabulary file of their own: "<vocabulary>@<tokenizer.ggml.pre>"
RENAMED = ["llama-bpe@tekken", "llama-bpe@gpt-4o", "llama-bpe@seed-coder", "gpt-2@bloom", "gpt-2@viking"]
SEPARATOR = "\n__ggml_vocab_test__\n"  # between the inputs of a .inp file (llama.cpp's test-tokenizer-0)

pytestmark = pytest.mark.network


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


@pytest.fixture(scope="module")
def vocab_dir() -> Path:
    """The unpacked vocabulary files (fetched and unpacked on first use, then read from the cache). Safe when
    several test processes (pytest -n) fetch at once: each downloads to a file of its own and moves finished files
    into place atomically."""
    out = named.cache_dir() / "test-data" / "llama-cpp-vocab-0.3.36"
    wanted = [f"ggml-vocab-{n}.gguf{ext}" for n in VOCABS for ext in ("", ".inp", ".out")]
    if all((out / w).is_file() for w in wanted):
        return out
    out.mkdir(parents=True, exist_ok=True)
    archive = out / f"{SDIST}.{os.getpid()}.part"
    try:
        with urllib.request.urlopen(URL, timeout=300) as response, open(archive, "wb") as f:
            shutil.copyfileobj(response, f)
        digest = _sha256(archive)
        assert digest == SHA256, f"{SDIST} has sha256 {digest}, expected {SHA256}"
        with tarfile.open(archive) as tar:
            for name in wanted:
                part = out / f"{name}.{os.getpid()}.part"
                with tar.extractfile(tar.getmember(MODELS + name)) as src, open(part, "wb") as dst:
                    shutil.copyfileobj(src, dst)
                os.replace(part, out / name)
    finally:
        archive.unlink(missing_ok=True)  # 77 MB: only the few files above are kept
    return out


def _cases(vocab_dir: Path, name: str) -> list[tuple[str, list[int]]]:
    inputs = (vocab_dir / f"ggml-vocab-{name}.gguf.inp").read_text(encoding="utf-8").split(SEPARATOR)
    outputs = (vocab_dir / f"ggml-vocab-{name}.gguf.out").read_text(encoding="utf-8").split("\n")
    assert len(outputs) >= len(inputs) > 40
    return [(text, [int(i) for i in ids.split()]) for text, ids in zip(inputs, outputs)]


@functools.cache
def _metadata(path: Path) -> dict:
    return gguf_reader.read(path).fields  # read once: the gguf reader takes 9 s over Llama 3's


def _tokenizer(vocab_dir: Path, name: str, **override):
    name, _, pre = name.partition("@")
    if pre:
        override = {"tokenizer.ggml.pre": pre, **override}
    path = vocab_dir / f"ggml-vocab-{name}.gguf"
    return gguf_tokenizer.build_tokenizer({**_metadata(path), **override}, path)


@pytest.mark.parametrize("name", VOCABS)
def test_ids_equal_llama_cpp_test_vectors(vocab_dir, name):
    tok = _tokenizer(vocab_dir, name)
    cases = _cases(vocab_dir, name)
    wrong = [(text, want, got) for text, want in cases if (got := tok.encode(text, add_special_tokens=False)) != want]
    assert not wrong, f"{len(wrong)} of {len(cases)} differ, first: {wrong[0]!r}"
    # decoding gives the text back: byte-level BPE always, SentencePiece but for the prefix space it adds
    for text, want in cases:
        if name in BPE_VOCABS or (text and not text.startswith(" ") and "\ufffd" not in text):
            assert tok.decode(want) == text


def test_negative_controls_differ_from_the_vectors(vocab_dir, monkeypatch):
    """The vectors catch a wrong tokenizer: SentencePiece without its prefix space, and Llama 3's BPE applying its
    merges to pre-tokens that are tokens whole (' Việt'), both disagree with llama.cpp on some inputs."""

    def wrong(tok, name):
        return sum(tok.encode(t, add_special_tokens=False) != ids for t, ids in _cases(vocab_dir, name))

    assert wrong(_tokenizer(vocab_dir, "llama-spm", **{"tokenizer.ggml.add_space_prefix": False}), "llama-spm") > 5
    # (each BPE pre-tokenizer against its nearest other: on llama.cpp's own output for 343 strings, below)
    monkeypatch.setattr(gguf_tokenizer, "_IGNORE_MERGES", ())
    assert wrong(_tokenizer(vocab_dir, "llama-bpe"), "llama-bpe") >= 1


@functools.cache
def _llama_cpp_ids() -> dict:
    with gzip.open(FIXTURES_DIR / "gguf" / "llama_cpp_tokenization.json.gz", "rt") as f:
        return json.load(f)


@pytest.mark.parametrize("name", VOCABS + RENAMED)
def test_ids_equal_llama_cpp_itself_on_a_few_hundred_strings(vocab_dir, name):
    """llama.cpp's tokenizer itself (``scripts/fixtures/make_llama_cpp_tokenization.py``: llama-cpp-python built from
    the same pinned archive, special tokens parsed) on 343 strings: code, numbers, whitespace runs, special tokens, chat
    text, eleven scripts. Every id equal, for every vocabulary, and for the pre-tokenizers llama.cpp has no vocabulary
    file of (Tekken, GPT-4o, Seed-Coder, BLOOM, Viking) on another family's vocabulary under that ``tokenizer.ggml.pre``
    (the fixture script rewrote the files' headers so)."""
    data = _llama_cpp_ids()
    tok = _tokenizer(vocab_dir, name)
    texts, ids = data["texts"], data["ids"][name]
    assert len(texts) == len(ids) > 300
    wrong = [(t, want) for t, want in zip(texts, ids) if tok.encode(t, add_special_tokens=False) != want]
    assert not wrong, f"{len(wrong)} of {len(texts)} differ, first: {wrong[0]!r}"


@pytest.mark.parametrize(
    "name, other, at_least",
    [
        ("deepseek-coder", "deepseek-llm", 10),
        ("deepseek-llm", "deepseek-coder", 10),
        ("deepseek-llm", "llama3", 5),
        ("starcoder", "gpt2", 5),
        ("command-r", "gpt2", 5),
        ("deepseek-coder", "gpt2", 5),
        ("falcon", "gpt2", 20),
        ("mpt", "starcoder", 20),
        ("llama-bpe", "qwen2", 20),
        ("qwen35", "qwen2", 1),  # they differ on combining marks only (Hindi, Thai)
        ("llama-bpe@tekken", "llama3", 20),
        ("llama-bpe@gpt-4o", "llama3", 5),
        ("llama-bpe@gpt-4o", "tekken", 20),
        ("llama-bpe@seed-coder", "qwen2", 20),
        ("gpt-2@viking", "bloom", 20),
        ("gpt-2@bloom", "gpt2", 20),
    ],
)
def test_another_pre_tokenizer_differs_from_llama_cpp_on_those_strings(vocab_dir, name, other, at_least):
    """Negative controls for the test above: each vocabulary under the pre-tokenizer nearest to its own."""
    data = _llama_cpp_ids()
    tok = _tokenizer(vocab_dir, name.partition("@")[0], **{"tokenizer.ggml.pre": other})
    wrong = sum(tok.encode(t, add_special_tokens=False) != ids for t, ids in zip(data["texts"], data["ids"][name]))
    assert wrong >= at_least


@pytest.mark.parametrize("name", ["llama-spm", "gpt-2"])
def test_reader_reads_vocabularies_as_the_gguf_package_does(vocab_dir, name):
    path = vocab_dir / f"ggml-vocab-{name}.gguf"
    ref = {k: f.contents() for k, f in gguf.GGUFReader(path, "r").fields.items() if not k.startswith("GGUF.")}
    assert _metadata(path) == ref


def test_llama_spm_ids_equal_transformers_on_a_few_hundred_strings(vocab_dir):
    """transformers' own GGUF tokenizer (``scripts/fixtures/make_gguf_fixtures.py --only spm``, torch venv) on 318
    strings: code, numbers, unicode, whitespace runs. Equal ids on every string that does not start with a space. On the
    152 that do, transformers drops one leading space (its ids for ' Hello' are ours for 'Hello'), where llama.cpp
    and SentencePiece keep it ('▁' then '▁Hello': llama.cpp's vectors above give 29871 15043 3186 for
    ' Hello world', as jaxspec does)."""
    data = json.loads((FIXTURES_DIR / "gguf" / "llama_spm_tokenization.json").read_text())
    assert data["source"] == "ggml-vocab-llama-spm.gguf" and len(data["strings"]) > 250
    tok = _tokenizer(vocab_dir, "llama-spm")

    def ours(text):
        return tok.encode(text, add_special_tokens=False)

    plain = [c for c in data["strings"] if not c["text"].startswith(" ")]
    spaced = [c for c in data["strings"] if c["text"].startswith(" ") and len(c["text"]) > 1]
    assert len(plain) > 150 and len(spaced) > 100
    wrong = [(c["text"], c["ids"]) for c in plain if ours(c["text"]) != c["ids"]]
    assert not wrong, f"{len(wrong)} of {len(plain)} differ, first: {wrong[0]!r}"
    wrong = [(c["text"], c["ids"]) for c in spaced if ours(c["text"][1:]) != c["ids"]]
    assert not wrong, f"{len(wrong)} of {len(spaced)} differ beyond the leading space, first: {wrong[0]!r}"
    assert ours(" Hello") == [29871, 15043] and ours("Hello") == [15043]


def test_a_llama_gguf_with_a_sentencepiece_vocabulary_loads_and_generates_text(vocab_dir, tmp_path):
    """A tiny random Llama written with Llama 2's vocabulary (32 000 SentencePiece tokens, as llama.cpp's converter
    stores them) loads with its tokenizer through ``jaxspec.load``; its prompts and outputs go through it."""
    import numpy as np

    import jaxspec

    meta = _metadata(vocab_dir / "ggml-vocab-llama-spm.gguf")
    tokens = meta["tokenizer.ggml.tokens"]
    vocab, hidden, ffn = len(tokens), 16, 32
    rng = np.random.default_rng(0)
    path = tmp_path / "tiny-llama2-vocab.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_context_length(128)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(2)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(meta["tokenizer.ggml.scores"])
    w.add_token_types(meta["tokenizer.ggml.token_type"])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)

    def t(name, *shape):  # numpy [out, in]: GGUF stores the dimensions reversed
        w.add_tensor(name, (rng.standard_normal(shape) * 0.2).astype(np.float32))

    t("token_embd.weight", vocab, hidden)
    t("output_norm.weight", hidden)
    for name, shape in {
        "attn_norm": (hidden,),
        "ffn_norm": (hidden,),
        "attn_q": (hidden, hidden),
        "attn_k": (hidden, hidden),
        "attn_v": (hidden, hidden),
        "attn_output": (hidden, hidden),
        "ffn_gate": (ffn, hidden),
        "ffn_up": (ffn, hidden),
        "ffn_down": (hidden, ffn),
    }.items():
        t(f"blk.0.{name}.weight", *shape)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    model = jaxspec.load(path)
    assert model.vocab_size == vocab and model.config.num_layers == 1
    # Llama 2's ids for " Hello world" (llama.cpp's vectors): prefix space, then BOS first
    assert model.tokenizer.encode("Hello world") == [1, 15043, 3186]
    out = jaxspec.generate(model, ["Hello world"], max_new_tokens=6, temperature=0.0)
    assert 1 <= len(out.tokens[0]) <= 6 and isinstance(out.texts[0], str)
    assert out.texts[0] == model.tokenizer.decode(out.tokens[0])


@pytest.mark.parametrize("name", VOCABS)
def test_end_of_generation_ids_are_llama_cpps(vocab_dir, name):
    """The ids a GGUF model stops on (``gguf_tokenizer.end_of_generation_ids``: EOS, EOT/EOM, end-of-turn markers
    such as Phi-3's ``<|end|>`` and Llama 3's ``<|eot_id|>``) against llama.cpp's ``llama_vocab_is_eog`` on the same
    files: equal, but for what llama.cpp adds and jaxspec leaves out on purpose: fill-in-the-middle padding/repository
    tokens, Command-R's ``<PAD>``, and ``</s>`` where it is not the file's EOS (an ordinary token in Qwen2's
    vocabulary)."""
    meta = _metadata(vocab_dir / f"ggml-vocab-{name}.gguf")
    ours = gguf_tokenizer.end_of_generation_ids(meta)
    theirs = set(_llama_cpp_ids()["end_of_generation"][name])
    assert ours[0] == meta["tokenizer.ggml.eos_token_id"] and set(ours) <= theirs
    left_out = {meta["tokenizer.ggml.tokens"][i] for i in theirs - set(ours)}
    assert left_out <= {"<fim_pad>", "<reponame>", "<PAD>", "</s>"}, left_out
    assert len(ours) >= {"llama-bpe": 2, "phi-3": 2, "qwen2": 2, "qwen35": 2}.get(name, 1)
