"""Orbax save/restore of whole models (``jaxspec.save``): parameters, architecture config and tokenizer in one
directory.

Layout of a saved model directory::

    jaxspec.json        {"format": 1, "family": "llama", "config": {...}, "eos_token_id": ..., "name": ...}
    params/             orbax checkpoint of the parameter pytree
    tokenizer/          (optional) a Hugging Face tokenizer saved with save_pretrained
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp

from jaxspec.core import dtypes
from jaxspec.core.model import CausalLM
from jaxspec.formats.paths import EAGLE_HEAD, META
from jaxspec.models import families, quant
from jaxspec.parallel import sharding as parallel_sharding

FORMAT = 1


def save(model: CausalLM, directory: str | Path, *, storage_dtype: str | None = None) -> Path:
    """Save ``model`` (a built-in family with its ``config``) to ``directory`` (must not exist yet).

    ``storage_dtype`` (e.g. "bfloat16") stores the weights in that dtype to halve the files; loading casts them
    back to the config's dtype.
    """
    directory = Path(directory).resolve()
    if directory.exists() and any(directory.iterdir()):
        raise FileExistsError(f"directory {directory} exists and is not empty; choose a new path")
    if storage_dtype is not None:
        storage_dtype = dtypes.check(storage_dtype, "storage_dtype")
    try:
        family = families.family_of_config(model.config).name
    except ValueError as err:
        raise ValueError(f"cannot save this model: {err}") from None
    directory.mkdir(parents=True, exist_ok=True)
    params = families.stack_layers(model.params)  # checkpoints hold the stacked layout
    if storage_dtype is not None:  # float weights only: int8 weights and their scales are stored as they are
        params = jax.tree.map(
            lambda x: jnp.asarray(x, dtypes.DTYPES[storage_dtype]) if x.dtype != jnp.int8 and x.ndim > 0 else x,
            params,
        )
        params = _keep_scales(params, families.stack_layers(model.params))
    with ocp.StandardCheckpointer() as checkpointer:  # leaving it waits for the save and stops its threads
        checkpointer.save(directory / "params", params)
        checkpointer.wait_until_finished()
    eos = model.eos_token_id
    meta = {
        "format": FORMAT,
        "family": family,
        "config": dataclasses.asdict(model.config),
        "eos_token_id": list(eos) if isinstance(eos, tuple) else eos,
        "name": model.name,
    }
    fmt = quant.format_of(params)
    if fmt is not None:
        meta["quantize"] = fmt
    if model.tokenizer is not None and hasattr(model.tokenizer, "save_pretrained"):
        model.tokenizer.save_pretrained(directory / "tokenizer")
    (directory / META).write_text(json.dumps(meta, indent=2))
    return directory


def _tuples(value):
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def load(directory: str | Path, dtype: str | None = None, sharding: Any = None, mesh: Any = None) -> CausalLM:
    """Restore a model saved by ``save``.

    ``dtype`` casts the parameters ("float32", "bfloat16", "float16"); ``sharding`` is a pytree of
    ``jax.sharding.Sharding`` matching the parameters (or one sharding for all), used as the restore target so
    every array lands directly in its layout. ``mesh`` (a ``Mesh`` or ``{"data": d, "model": m}``) computes that
    pytree from the family's logical axes (``jaxspec.sharding``).
    """
    directory = Path(directory).resolve()
    if dtype is not None:
        dtype = dtypes.check(dtype)
    try:
        meta = json.loads((directory / META).read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{directory} is not a jaxspec model directory (no {META})") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"{directory / META} is corrupted: {err}") from None
    known = {f.name: f for f in families.registered()}
    if meta.get("kind") == EAGLE_HEAD:
        raise ValueError(
            f"{directory} is an EAGLE head, not a model: it drafts from its target's features, so load it with "
            "jaxspec.eagle.load(path, target) and pass it as draft= (on the command line, --draft takes it as is)"
        )
    if meta.get("family") not in known:
        raise ValueError(
            f"unknown model family {meta.get('family')!r} in {directory / META}; supported: {sorted(known)}"
        )
    family = known[meta["family"]]
    fields = {k: _tuples(v) for k, v in meta["config"].items()}  # JSON turned tuples into lists
    config = family.config_class(**{**fields, **({"dtype": dtype} if dtype else {})})
    abstract = family.abstract_params(config)
    fmt = meta.get("quantize")
    if fmt is not None:  # int8 weights with float32 scales (jaxspec.quantize); placed on a mesh once restored
        fmt = str(quant.check_format(fmt, "quantize"))
        abstract = jax.eval_shape(functools.partial(quant.quantize_params, fmt=fmt), abstract)
        placed, mesh, sharding = (mesh, sharding), None, None
    if mesh is not None:
        if sharding is not None:
            raise ValueError("pass either sharding= or mesh=, not both")
        sharding = family.shardings(config, mesh, name=meta.get("name", "model"))
    if sharding is not None:
        shardings = sharding if isinstance(sharding, dict) else jax.tree.map(lambda _: sharding, abstract)
        abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)
    try:
        with ocp.StandardCheckpointer() as checkpointer:  # closed at once: no threads left behind
            params = checkpointer.restore(directory / "params", abstract)
    except Exception as err:  # orbax raises many kinds; all mean the same to a user
        raise ValueError(
            f"the checkpoint in {directory / 'params'} is incomplete or corrupted and cannot be restored "
            f"({type(err).__name__}: {str(err)[:300]})"
        ) from err
    tokenizer = None
    if (directory / "tokenizer").is_dir():
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(directory / "tokenizer")
    eos = meta.get("eos_token_id")
    model = family.from_params(
        config,
        families.loaded_params(family, params),
        tokenizer=tokenizer,
        eos_token_id=tuple(eos) if isinstance(eos, list) else eos,
        name=meta.get("name", "model"),
        **families.loaded_layout(family),
    )
    if fmt is None:
        return model
    model = model.replace(param_axes=quant.scale_axes(model.param_axes))
    mesh, sharding = placed
    if sharding is not None:
        return model.replace(params=jax.device_put(model.params, sharding))
    return model if mesh is None else parallel_sharding.shard(model, mesh)


def _keep_scales(params, original):
    """``params`` with the quantization scales of ``original`` restored (they stay float32 at any storage dtype)."""
    if isinstance(params, dict):
        return {k: original[k] if quant.is_scale(k) else _keep_scales(v, original[k]) for k, v in params.items()}
    if isinstance(params, (tuple, list)):
        return type(params)(_keep_scales(v, o) for v, o in zip(params, original))
    return params
