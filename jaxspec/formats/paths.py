"""Where models are: shipped names (``jaxspec/<name>``), and what a jaxspec model directory holds.

A jaxspec directory has a metadata file, ``jaxspec.json`` (``META``): a whole model saved by ``jaxspec.save``
(``jaxspec.formats.orbax``), or an EAGLE head (``jaxspec.formats.eagle_head``, ``"kind": "eagle-head"``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

META = "jaxspec.json"  # the metadata file of every directory jaxspec writes
EAGLE_HEAD = "eagle-head"  # META's "kind" for a saved EAGLE head (a whole model has no "kind")
SHIPPED_PREFIX = "jaxspec/"


def read_meta(directory: str | Path) -> dict | None:
    """``directory``'s metadata (``META``), or None when it has none or it cannot be read."""
    meta = Path(directory) / META
    try:
        return json.loads(meta.read_text()) if meta.is_file() else None
    except (OSError, ValueError):
        return None


def is_orbax_model(directory: str | Path) -> bool:
    """Whether ``directory`` holds a model saved by ``jaxspec.save`` (it has the metadata file)."""
    return (Path(directory) / META).is_file()


def is_head(directory: str | Path) -> bool:
    """Whether ``directory`` holds an EAGLE head (``jaxspec.eagle.save``)."""
    meta = read_meta(directory)
    return meta is not None and meta.get("kind") == EAGLE_HEAD


def shipped_dir() -> Path:
    """Where the shipped models live: ``$JAXSPEC_CHECKPOINTS`` or the repository's ``checkpoints/``."""
    env = os.environ.get("JAXSPEC_CHECKPOINTS")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "checkpoints"


def shipped_models() -> list[str]:
    """Names (``jaxspec/<name>``) of the models (and EAGLE heads) shipped in ``checkpoints/``, sorted."""
    root = shipped_dir()
    if not root.is_dir():
        return []
    return sorted(SHIPPED_PREFIX + p.name for p in root.iterdir() if is_orbax_model(p) or is_head(p))


def resolve(path: str | Path) -> Path:
    """A directory, or a shipped model's name such as ``"jaxspec/code-target"``."""
    if isinstance(path, str) and path.startswith(SHIPPED_PREFIX) and not Path(path).exists():
        found = shipped_dir() / path[len(SHIPPED_PREFIX) :]
        if not (is_orbax_model(found) or is_head(found)):
            raise FileNotFoundError(
                f"no shipped model named {path!r} in {shipped_dir()}; available: {shipped_models() or 'none'} "
                "(set JAXSPEC_CHECKPOINTS to the repository's checkpoints/ directory if jaxspec is not installed "
                "from a clone)"
            )
        return found
    return Path(path)
