"""Generate tests/fixtures/gguf/llama_cpp_tokenization.json.gz: llama.cpp's own tokenizer on a few hundred strings,
for every vocabulary-only GGUF file that tests/test_gguf_vocab.py checks.

llama.cpp's test vectors (47 strings per vocabulary) cannot tell some pre-tokenizers apart (DeepSeek Coder's and
DeepSeek LLM's give the same ids on all of them). This fixture runs llama.cpp's tokenizer itself, through the
``llama-cpp-python`` bindings built from the same pinned source archive, on the strings of
``smollm2_tokenization.json`` (code, numbers, whitespace runs, special tokens, chat text) plus the multilingual
strings below, with ``parse_special=True`` (special tokens in the text become their ids, as transformers' and
jaxspec's tokenizers do); and, per vocabulary, the ids llama.cpp ends generation on (``llama_vocab_is_eog``).
It needs a separate venv (llama.cpp is compiled there, a few minutes on 2 cores, and is never a jaxspec
dependency):

    python3.11 -m venv /tmp/lcppvenv
    CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF" \\
        /tmp/lcppvenv/bin/pip install llama-cpp-python==0.3.36
    pytest -m network tests/test_gguf_vocab.py        # fetches the vocabulary files into the jaxspec cache
    /tmp/lcppvenv/bin/python scripts/make_llama_cpp_fixtures.py

Only the standard library and ``llama_cpp`` are imported (no jaxspec).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import struct
import tempfile
from importlib.metadata import version
from pathlib import Path

import llama_cpp

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "gguf" / "llama_cpp_tokenization.json.gz"
STRINGS = ROOT / "tests" / "fixtures" / "gguf" / "smollm2_tokenization.json"
# pre-tokenizers without a vocabulary file of their own among llama.cpp's: a vocabulary under another
# tokenizer.ggml.pre ("<vocabulary>@<pre>"), which llama.cpp's tokenizer takes as it takes any file's
RENAMED = ["llama-bpe@tekken", "llama-bpe@gpt-4o", "llama-bpe@seed-coder", "gpt-2@bloom", "gpt-2@viking"]
# scripts, marks and classes the pre-tokenizers treat differently (DeepSeek LLM's letter ranges, CJK runs,
# Qwen3.5's combining marks, full-width forms, CR/LF)
MULTILINGUAL = [
    "Ελληνικά γράμματα και ΚΕΦΑΛΑΙΑ",
    "Русский текст, цифры 12345",
    "中文文本测试，标点。",
    "日本語のテキスト",
    "한국어 텍스트 123",
    "emoji 😀🎉 and ❤️",
    "mixed 漢字abcДЖ123",
    "tabs\tand\u3000ideographic space",
    "math: ∑ x² ≤ ∞",
    "µ-law and Å and ß",
    "ａｂｃ ＡＢＣ １２３ full width",
    "‘quotes’ “double” — dash",
    "a\r\nb\rc\nd",
    "trailing newline\n",
    "   ",
    "x   \n  y",
    "price: $1,234.56 (approx.)",
    "2024-11-25T09:30:00Z",
    "0x1F 0b1010 1e-9 3.14159",
    "’s ’t 'S 'T 'Re",
    "def f(x):\n    return x**2  # square\n",
    "العربية نص",
    "עברית טקסט",
    "हिन्दी पाठ",
    "ไทย ข้อความ",
]


def with_pre(src: Path, pre: str, out: Path) -> Path:
    """A copy of the vocabulary-only file ``src`` whose ``tokenizer.ggml.pre`` is ``pre`` (the header rewritten;
    such files hold no tensors, so nothing after the metadata moves)."""
    data = src.read_bytes()
    assert struct.unpack_from("<Q", data, 8)[0] == 0, f"{src} holds tensors"
    key = b"tokenizer.ggml.pre"
    at = data.index(struct.pack("<Q", len(key)) + key) + 8 + len(key)
    kind, n = struct.unpack_from("<IQ", data, at)
    assert kind == 8, "tokenizer.ggml.pre is not a string"
    value = pre.encode()
    start = at + 12
    out.write_bytes(data[:at] + struct.pack("<IQ", 8, len(value)) + value + data[start + n :])
    return out


def main() -> None:
    cache = Path(os.environ.get("JAXSPEC_CACHE", Path.home() / ".cache" / "jaxspec"))
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab-dir", default=str(cache / "test-data" / "llama-cpp-vocab-0.3.36"))
    args = ap.parse_args()
    texts = [c["text"] for c in json.loads(STRINGS.read_text())["strings"]] + MULTILINGUAL
    ids, eog = {}, {}
    tmp = Path(tempfile.mkdtemp())
    # every vocabulary the test fetched (ggml-vocab-<name>.gguf with llama.cpp's test inputs beside it)
    vocabs = sorted(p.name[len("ggml-vocab-") : -len(".gguf.inp")] for p in Path(args.vocab_dir).glob("*.gguf.inp"))
    assert vocabs, f"no vocabulary files in {args.vocab_dir}"
    for name in vocabs + RENAMED:
        vocab, _, pre = name.partition("@")
        path = Path(args.vocab_dir) / f"ggml-vocab-{vocab}.gguf"
        if pre:
            path = with_pre(path, pre, tmp / f"{vocab}-{pre}.gguf")
        llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
        ids[name] = [llm.tokenize(t.encode("utf-8"), add_bos=False, special=True) for t in texts]
        if not pre:  # the tokens that end generation (llama_vocab_is_eog)
            vocab_ = llama_cpp.llama_model_get_vocab(llm.model)
            n = llama_cpp.llama_vocab_n_tokens(vocab_)
            eog[name] = [i for i in range(n) if llama_cpp.llama_vocab_is_eog(vocab_, i)]
        print(f"{name:20s} {sum(map(len, ids[name])):6d} tokens")
    data = {
        "source": f"llama-cpp-python {version('llama-cpp-python')}: Llama.tokenize(add_bos=False, special=True)",
        "texts": texts,
        "ids": ids,
        "end_of_generation": eog,
    }
    with gzip.open(OUT, "wt", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False, separators=(",", ":"))
    n = len(vocabs) + len(RENAMED)
    print(f"{OUT.relative_to(ROOT)}: {len(texts)} strings x {n} vocabularies, {OUT.stat().st_size} bytes")


if __name__ == "__main__":
    main()
