"""Read and write safetensors files (an 8-byte little-endian header size, a JSON header, raw tensor bytes).

Reading memory-maps the file: a tensor's bytes are touched only when (and where) they are used, so a loader can
read each device's shard of a weight without holding the whole tensor. No pickle is ever read.
"""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np

# safetensors dtype code -> numpy dtype
CODES = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "BF16": ml_dtypes.bfloat16,
    "I64": np.int64,
    "I32": np.int32,
    "I16": np.int16,
    "I8": np.int8,
    "U8": np.uint8,
    "BOOL": np.bool_,
}
_NAMES = {np.dtype(v): k for k, v in CODES.items()}


class SafetensorsFile:
    """One safetensors file: its header is read now, ``get(name)`` returns a tensor as a view of the memory map."""

    def __init__(self, path: Path):
        self.path = path
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) != 8:
                raise ValueError(f"{path} is not a safetensors file (too short)")
            n = int.from_bytes(head, "little")
            if n > 100 * 2**20:
                raise ValueError(f"{path} is not a safetensors file (header size {n})")
            try:
                header = json.loads(f.read(n))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path} is not a safetensors file (bad header: {e})") from None
        header.pop("__metadata__", None)
        self.header = header
        self.offset = 8 + n
        self._data: np.memmap | None = None

    def keys(self):
        """Names of the tensors in the file."""
        return self.header.keys()

    def get(self, name: str) -> np.ndarray:
        """Tensor ``name`` as a NumPy array read from the memory-mapped file; ``ValueError`` for a dtype jaxspec
        cannot read."""
        info = self.header[name]
        if info["dtype"] not in CODES:
            raise ValueError(f"{self.path}: tensor {name!r} has unsupported dtype {info['dtype']}")
        if self._data is None:
            self._data = np.memmap(self.path, dtype=np.uint8, mode="r")
        begin, end = info["data_offsets"]
        raw = self._data[self.offset + begin : self.offset + end]
        return raw.view(CODES[info["dtype"]]).reshape(info["shape"])


def _inside(root: Path, name: str) -> Path:
    path = (root / name).resolve()
    if root.resolve() not in path.parents:
        raise ValueError(f"checkpoint file {name!r} points outside {root}")
    return path


def open_dir(root: Path) -> dict[str, SafetensorsFile]:
    """Tensor name -> the file holding it, for the ``*.safetensors`` in ``root`` or the shards its
    ``model.safetensors.index.json`` lists."""
    index = root / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text()).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ValueError(f"{index} has no 'weight_map'")
        shards = sorted(set(weight_map.values()))
        missing = [s for s in shards if not _inside(root, s).exists()]
        if missing:
            raise FileNotFoundError(f"{index} lists shard(s) missing from {root}: {missing}")
        files = {s: SafetensorsFile(_inside(root, s)) for s in shards}
        out = {}
        for name, shard in weight_map.items():
            if name not in files[shard].header:
                raise ValueError(f"{index} places tensor {name!r} in {shard}, which does not contain it")
            out[name] = files[shard]
        return out
    paths = sorted(root.glob("*.safetensors"))
    if not paths:
        raise FileNotFoundError(
            f"no *.safetensors in {root} (only safetensors checkpoints are loaded, never pickled .bin files)"
        )
    out = {}
    for p in paths:
        f = SafetensorsFile(p)
        for name in f.keys():
            out[name] = f
    return out


def write(path: Path, tensors: dict[str, np.ndarray]) -> None:
    """Write arrays (any dtype in the safetensors table, bfloat16 included) as one safetensors file."""
    header, offset, blobs = {}, 0, []
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        blob = a.tobytes()
        header[name] = {
            "dtype": _NAMES[a.dtype],
            "shape": list(a.shape),
            "data_offsets": [offset, offset + len(blob)],
        }
        offset += len(blob)
        blobs.append(blob)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(len(head).to_bytes(8, "little"))
        f.write(head)
        for blob in blobs:
            f.write(blob)
