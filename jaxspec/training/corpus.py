"""The shipped pair's training corpus and tokenizer, from files any fresh machine can get through its registries.

Corpus: the Python standard library's own source (``sysconfig`` stdlib path, ``*.py``) plus the
reStructuredText sources of the Python documentation (Debian package ``python3-doc``:
``/usr/share/doc/python3.*/html/_sources``). Files are split into train / held-out by a hash of their name, so the
split is stable across machines and held-out prompts never appear in training.

Tokenizer: byte-level BPE trained with the ``tokenizers`` library and saved as ``tokenizer.json`` plus a
``tokenizer_config.json`` so ``transformers.AutoTokenizer.from_pretrained(dir)`` loads it.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import sysconfig
from pathlib import Path

import numpy as np

EOS = "<|endoftext|>"
HELD_OUT_PERCENT = 3
DOC_GLOB = "/usr/share/doc/python3*/html/_sources"


def _stdlib_files() -> list[tuple[str, Path]]:
    root = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(("site-packages/", "dist-packages/")) or "__pycache__" in rel:
            continue
        out.append((f"stdlib/{rel}", path))
    return out


def _doc_files() -> list[tuple[str, Path]]:
    roots = sorted(glob.glob(DOC_GLOB))
    if not roots:
        raise FileNotFoundError(
            f"no Python documentation sources under {DOC_GLOB}; install them with "
            "'apt-get install python3-doc' (Debian/Ubuntu)"
        )
    root = Path(roots[-1])
    return [(f"docs/{p.relative_to(root).as_posix()}", p) for p in sorted(root.rglob("*.rst.txt"))]


def is_heldout(name: str) -> bool:
    """Stable train/held-out assignment of a corpus file by the hash of its name."""
    return int(hashlib.sha1(name.encode()).hexdigest(), 16) % 100 < HELD_OUT_PERCENT


def stdlib_files(split: str) -> list[tuple[str, Path]]:
    """``(name, path)`` of the standard library's ``"train"`` or ``"heldout"`` source files (no documentation
    sources needed), in a stable order."""
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    return [f for f in _stdlib_files() if is_heldout(f[0]) == (split == "heldout")]


def corpus_files(split: str) -> list[tuple[str, Path]]:
    """``(name, path)`` of the ``"train"`` or ``"heldout"`` files, in a stable order (names ``stdlib/...``,
    ``docs/...``). Raises ``ValueError`` for another split, ``FileNotFoundError`` without the documentation sources."""
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    return [f for f in _stdlib_files() + _doc_files() if is_heldout(f[0]) == (split == "heldout")]


def read_text(path: Path) -> str:
    """A corpus file's text, decoded as UTF-8 with undecodable bytes replaced (U+FFFD)."""
    return path.read_text(encoding="utf-8", errors="replace")


def train_tokenizer(out_dir: str | os.PathLike, vocab_size: int = 4096) -> Path:
    """Train a byte-level BPE of ``vocab_size`` tokens (``EOS`` included) on the training split, save it in
    ``out_dir`` (created if missing) where ``AutoTokenizer`` finds it, and return that directory."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    files = corpus_files("train")
    tok.train_from_iterator((read_text(p) for _, p in files), trainer=trainer, length=len(files))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "eos_token": EOS,
                "bos_token": None,
                "unk_token": None,
                "pad_token": EOS,
                "model_max_length": 1 << 20,
                "clean_up_tokenization_spaces": False,
            },
            indent=2,
        )
    )
    return out


def encode_split(tokenizer_dir: str | os.PathLike, split: str) -> np.ndarray:
    """All files of a split as one ``[N] int32`` stream, each document followed by the EOS token."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(tokenizer_dir) / "tokenizer.json"))
    eos = tok.token_to_id(EOS)
    assert eos is not None  # train_tokenizer adds EOS as a special token
    texts = [read_text(p) for _, p in corpus_files(split)]
    ids: list[int] = []
    for enc in tok.encode_batch(texts, add_special_tokens=False):
        ids.extend(enc.ids)
        ids.append(eos)
    return np.asarray(ids, np.int32)
