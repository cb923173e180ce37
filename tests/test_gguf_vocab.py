"""GGUF tokenizers against llama.cpp's own tokenizer test vectors.

llama.cpp ships, for several model families, a vocabulary-only GGUF file with an input file of test strings and
an output file of the ids its tokenizer gives them (``models/ggml-vocab-<name>.gguf{,.inp,.out}``, read by its
``test-tokenizer-0``). They come inside the source distribution of ``llama-cpp-python`` on PyPI (its vendored
llama.cpp); the archive is fetched once (pinned version, checked against its sha256) into the jaxspec cache
(``$JAXSPEC_CACHE`` or ``~/.cache/jaxspec``, under ``test-data/``), and only those files are unpacked. Nothing in it
is imported or run.

Families checked: SentencePiece vocabularies (``tokenizer.ggml.model`` llama: Llama 2's, Phi-3's) and byte-level
BPE ones (GPT-2's; Llama 3's, whose pre-tokens that are tokens whole skip the merges).
"""

import functools
import hashlib
import shutil
import tarfile
import urllib.request
from pathlib import Path

import gguf
import pytest

from jaxspec import gguf_file, named

SDIST = "llama_cpp_python-0.3.36.tar.gz"
URL = (
    "https://files.pythonhosted.org/packages/ec/e9/"
    "e7de2b0463ea3ffbf0ede6cb21b58c1258a8f6521aae45ca773a59fe7cf3/" + SDIST
)
SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
MODELS = "llama_cpp_python-0.3.36/vendor/llama.cpp/models/"
VOCABS = ["llama-spm", "phi-3", "gpt-2", "llama-bpe"]
SEPARATOR = "\n__ggml_vocab_test__\n"  # between the inputs of a .inp file (llama.cpp's test-tokenizer-0)

pytestmark = pytest.mark.network


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@pytest.fixture(scope="module")
def vocab_dir() -> Path:
    """The unpacked vocabulary files (fetched and unpacked on first use, then read from the cache)."""
    out = named.cache_dir() / "test-data" / "llama-cpp-vocab-0.3.36"
    wanted = [f"ggml-vocab-{n}.gguf{ext}" for n in VOCABS for ext in ("", ".inp", ".out")]
    if all((out / w).is_file() for w in wanted):
        return out
    out.mkdir(parents=True, exist_ok=True)
    archive = out / SDIST
    if not archive.is_file() or _sha256(archive) != SHA256:
        partial = out / (SDIST + ".part")
        with urllib.request.urlopen(URL, timeout=300) as response, open(partial, "wb") as f:
            shutil.copyfileobj(response, f)
        digest = _sha256(partial)
        assert digest == SHA256, f"{SDIST} has sha256 {digest}, expected {SHA256}"
        partial.rename(archive)
    with tarfile.open(archive) as tar:
        for name in wanted:
            member = tar.getmember(MODELS + name)
            with tar.extractfile(member) as src, open(out / name, "wb") as dst:
                shutil.copyfileobj(src, dst)
    archive.unlink()  # 77 MB: only the few files above are kept
    return out


def _cases(vocab_dir: Path, name: str) -> list[tuple[str, list[int]]]:
    inputs = (vocab_dir / f"ggml-vocab-{name}.gguf.inp").read_text(encoding="utf-8").split(SEPARATOR)
    outputs = (vocab_dir / f"ggml-vocab-{name}.gguf.out").read_text(encoding="utf-8").split("\n")
    assert len(outputs) >= len(inputs) > 40
    return [(text, [int(i) for i in ids.split()]) for text, ids in zip(inputs, outputs)]


@functools.cache
def _metadata(path: Path) -> dict:
    return gguf_file._fields(gguf_file._reader(path))  # read once: the gguf reader takes 9 s over Llama 3's


def _tokenizer(vocab_dir: Path, name: str, **override):
    path = vocab_dir / f"ggml-vocab-{name}.gguf"
    return gguf_file.build_tokenizer({**_metadata(path), **override}, path)


@pytest.mark.parametrize("name", VOCABS)
def test_ids_equal_llama_cpp_test_vectors(vocab_dir, name):
    tok = _tokenizer(vocab_dir, name)
    cases = _cases(vocab_dir, name)
    wrong = [(text, want, got) for text, want in cases if (got := tok.encode(text, add_special_tokens=False)) != want]
    assert not wrong, f"{len(wrong)} of {len(cases)} differ, first: {wrong[0]!r}"
    if name in ("llama-spm", "phi-3"):  # decoding gives the text back (SentencePiece keeps spaces exactly)
        for text, want in cases:
            if text and not text.startswith(" ") and "\ufffd" not in text:
                assert tok.decode(want) == text


def test_negative_controls_differ_from_the_vectors(vocab_dir, monkeypatch):
    """The vectors catch a wrong tokenizer: SentencePiece without its prefix space, and Llama 3's BPE applying its
    merges to pre-tokens that are tokens whole (' Việt'), both disagree with llama.cpp on some inputs."""

    def wrong(tok, name):
        return sum(tok.encode(t, add_special_tokens=False) != ids for t, ids in _cases(vocab_dir, name))

    assert wrong(_tokenizer(vocab_dir, "llama-spm", **{"tokenizer.ggml.add_space_prefix": False}), "llama-spm") > 5
    monkeypatch.setattr(gguf_file, "_IGNORE_MERGES", ())
    assert wrong(_tokenizer(vocab_dir, "llama-bpe"), "llama-bpe") >= 1


@pytest.mark.parametrize("name", ["llama-spm", "gpt-2"])
def test_reader_reads_vocabularies_as_the_gguf_package_does(vocab_dir, name):
    path = vocab_dir / f"ggml-vocab-{name}.gguf"
    ref = {k: f.contents() for k, f in gguf.GGUFReader(path, "r").fields.items() if not k.startswith("GGUF.")}
    assert _metadata(path) == ref
