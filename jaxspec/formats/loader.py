"""``jaxspec.load``: one front door for every model format jaxspec reads.

It recognizes, in this order: a named model (``jaxspec.formats.named``), a Hugging Face Hub id
(``jaxspec.formats.hub``), a shipped name (``jaxspec/<name>``, ``jaxspec.formats.paths``), a jaxspec checkpoint
directory (``jaxspec.formats.orbax``), a GGUF file (``jaxspec.formats.gguf``) and a Hugging Face directory
(``jaxspec.formats.hf``). EAGLE heads are drafters, not models: ``jaxspec.eagle.load`` reads them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from jaxspec.core.model import CausalLM
from jaxspec.formats import hf, hub, named, orbax
from jaxspec.formats.gguf import loader as gguf
from jaxspec.formats.paths import SHIPPED_PREFIX, is_orbax_model, resolve
from jaxspec.models import families, quant


def _has_magic(path: Path, magic: bytes) -> bool:
    if not path.is_file():
        return False
    with open(path, "rb") as f:
        return f.read(len(magic)) == magic


def load(
    path: str | Path,
    dtype: str | None = None,
    *,
    sharding: Any = None,
    mesh: Any = None,
    revision: str | None = None,
    gguf_file: str | None = None,
    quantize: str | None = None,
    min_rows: int | None = None,
    **hf_kwargs,
) -> CausalLM:
    """Load a model: a named model (``"smollm2-135m-instruct"``), a shipped name (``"jaxspec/code-target"``,
    ``"jaxspec/code-draft"``), a jaxspec checkpoint directory (``jaxspec.save``), a GGUF file, a Hugging Face
    directory or a Hugging Face Hub id (``"Qwen/Qwen2.5-0.5B-Instruct"``: from the Hugging Face cache, downloaded
    there once if missing).

    ``dtype`` None keeps a jaxspec checkpoint's dtype and loads Hugging Face and GGUF weights as float32. ``mesh``
    places every weight straight into its sharding on that mesh (``jaxspec.sharding``); ``sharding`` (jaxspec
    checkpoints only) gives the shardings explicitly. ``revision``: a Hub id's branch, tag or commit. ``gguf_file``:
    the GGUF file to load in a Hub repository or a local directory. Other keywords (``name``, ``tokenizer``, ...)
    go to the Hugging Face and GGUF readers. ``quantize="int8"`` keeps the projections and embeddings as int8 with
    float scales (``jaxspec.quantize``; ``"w8a8"`` also multiplies in integers), each weight of a Hugging Face or
    GGUF file quantized as it is read (the whole float model is never held). ``min_rows``: every weight product
    over fewer rows is computed over this many (``jaxspec.models.families.with_min_rows``); None (default): 2 on a
    GPU, where a one-token step over two rows is faster than over one, 1 elsewhere (``default_min_rows``).
    """
    quant.check_format(quantize)
    if min_rows is not None:
        families.check_min_rows(min_rows)
    if quantize is not None:  # the Hugging Face and GGUF readers quantize each weight as they read it
        hf_kwargs["quantize"] = quantize
    model = _load(path, dtype, sharding, mesh, revision, gguf_file, hf_kwargs)
    model = model if quantize is None else quant.quantize(model, quantize, consume=True)
    return families.with_min_rows(model, min_rows)


def _load(path, dtype, sharding, mesh, revision, gguf_file, hf_kwargs) -> CausalLM:
    if named.names_model(path):
        path = named.path(path)
    if hub.is_repo_id(path) and not str(path).startswith(SHIPPED_PREFIX):
        hf_kwargs.setdefault("name", str(path).split("/")[1])
        path = hub.snapshot(str(path), revision=revision, gguf_file=gguf_file)
    elif revision is not None:
        raise ValueError(f"revision= is for Hugging Face Hub ids ('owner/name'), not the local path {str(path)!r}")
    elif gguf_file is not None:
        path = Path(path) / gguf_file
    path = resolve(path)
    if is_orbax_model(path):
        hf_kwargs.pop("quantize", None)  # a checkpoint is read whole, then quantized
        return orbax.load(path, dtype, sharding, mesh)
    if sharding is not None:
        raise ValueError("sharding= is supported for jaxspec (orbax) checkpoints only; use mesh= for any directory")
    if path.suffix == ".gguf" or _has_magic(path, b"GGUF"):
        return gguf.load(path, dtype or "float32", mesh=mesh, **hf_kwargs)
    return hf.load(path, dtype or "float32", mesh=mesh, **hf_kwargs)
