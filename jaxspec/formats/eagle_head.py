"""The files of a saved EAGLE head: its own weights (``model.npz``, float16, stacked layers) and ``jaxspec.json``
(``"kind": "eagle-head"``, its layers, draft vocabulary, width and temperature scale). The target's embedding and
LM head are not stored: a head is only valid with its target (``jaxspec.drafters.eagle`` builds the drafter)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax
import numpy as np

from jaxspec.formats.paths import EAGLE_HEAD, META, is_head, read_meta, resolve

WEIGHTS = "model.npz"


def write(path: str | Path, own, meta: dict) -> Path:
    """Write the head's own weights ``own`` (a pytree of arrays, stacked layers) as float16 and ``meta`` (its
    ``kind`` is set here) to directory ``path``."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    leaves = jax.tree_util.tree_flatten_with_path(own)[0]
    flat: dict[str, Any] = {
        "/".join(str(k.key) for k in p): np.asarray(v, np.float32).astype(np.float16) for p, v in leaves
    }
    np.savez(path / WEIGHTS, **flat)
    (path / META).write_text(json.dumps({"kind": EAGLE_HEAD, **meta}) + "\n")
    return path


def read(path: str | Path) -> tuple[Path, dict, dict]:
    """``(directory, meta, own weights)`` of the head at ``path`` (a directory, or ``jaxspec/<name>``); the
    weights are nested dicts of NumPy arrays as saved (no pickled objects are read). ``ValueError`` for a
    directory that is not a head."""
    path = resolve(path)
    if not is_head(path):
        raise ValueError(f"{path} is not an EAGLE head (no {META} with kind {EAGLE_HEAD!r})")
    meta = read_meta(path)
    assert meta is not None  # is_head read it
    own: dict = {}
    with np.load(path / WEIGHTS) as data:
        for key in data.files:
            *parents, leaf = key.split("/")
            node = own
            for p in parents:
                node = node.setdefault(p, {})
            node[leaf] = data[key]
    return path, meta, own
