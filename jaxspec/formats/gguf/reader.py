"""GGUF files (llama.cpp's format): the header, metadata and tensor table, read over a memory map.

``read(path)`` gives a ``GGUFContents``: what the ``gguf`` package's ``GGUFReader`` gives (tested against it), in a
fraction of its time on large vocabularies; a model split into shards (``<name>-00001-of-00003.gguf``, ...:
llama.cpp's ``gguf-split``) is read as one from any of its files. ``jaxspec.formats.gguf.loader`` builds models from it,
``jaxspec.formats.gguf.tokenizer`` tokenizers.
"""

from __future__ import annotations

import dataclasses
import re
import struct
from pathlib import Path
from typing import Any, Literal

import numpy as np


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
        buf = memoryview(self.file)  # type: ignore[arg-type]  # numpy's stubs declare __buffer__ for Python 3.12+ only
        self._buf, self._pos = buf, 4
        (version,) = struct.unpack_from("<I", buf, 4)
        # a big-endian file reads its version byte-swapped
        self._end: Literal["<", ">"] = "<" if version < 0x10000 else ">"
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


def read(path: Path) -> GGUFContents:
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


def model_name(path: Path) -> str:
    """A file's model name: the shard set's prefix for a shard, else the file's stem."""
    match = _SHARD.match(path.name)
    return match["prefix"] if match else path.stem
