"""Load Hugging Face model directories (``config.json`` + ``*.safetensors``) as a ``jaxspec.CausalLM``.

Only JSON and safetensors are read: no pickle, no code from the checkpoint (never ``trust_remote_code``).
The config's ``model_type`` picks a ``jaxspec.models.families.ModelFamily``, whose record turns the config into one of
our configs, names the checkpoint tensor behind every leaf of our params tree (``Weight``) and builds the model::

    model = jaxspec.load("path/to/Llama-3.2-1B", dtype="bfloat16")

Supported now: the Llama family (``llama``, ``mistral``, ``qwen2``, ``qwen3``, ``gemma``, ``gemma2``,
``gemma3_text``, ``granite``; ``phi3`` with its fused projections) with the RoPE types of ``jaxspec.models.rope``;
GPT-2 (``gpt2``); GPT-NeoX (``gpt_neox``: Pythia); the text model of multimodal ``gemma3``, ``mistral3``,
``llava``, ``qwen2_vl`` and ``qwen2_5_vl`` checkpoints (``jaxspec.formats.hf_wrappers``). Add a family with
``jaxspec.models.families.register``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.core import dtypes
from jaxspec.core.model import CausalLM
from jaxspec.formats import hf_wrappers, safetensors_file
from jaxspec.models import families, quant
from jaxspec.models.families import ModelFamily


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from None


def _set(tree: dict, path: tuple[str, ...], value) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


def _stacked_slice(arrays: list[np.ndarray], stacked: bool, index: tuple, dtype) -> np.ndarray:
    """``np.stack(arrays)[index]`` (or ``arrays[0][index]``) reading only the needed part of each memory map."""
    if not stacked:
        return np.asarray(arrays[0][index], dtype=dtype)
    layers = range(len(arrays))[index[0]]
    return np.stack([np.asarray(arrays[i][index[1:]], dtype=dtype) for i in layers])


def _check_fused(fused: dict[str, tuple[int, list]]) -> None:
    """Each fused tensor (name -> (its rows, the row ranges weights took)) is split into parts that tile it."""
    for name, (rows, parts) in fused.items():
        parts = sorted(parts)
        bounds = [0] + [stop for _, stop in parts]
        if [start for start, _ in parts] != bounds[:-1] or bounds[-1] != rows:
            raise ValueError(
                f"tensor {name} has {rows} rows, which does not match the config (its parts take rows {sorted(parts)})"
            )


def load_params(root: Path, family: ModelFamily, cfg, shardings=None, tensors=None, quantize=None) -> dict:
    """Our params tree for ``cfg``, read from the safetensors in ``root`` by ``family.weights(cfg)`` and cast to
    ``cfg.dtype``.

    With ``shardings`` (a pytree of ``jax.sharding.Sharding`` like the params), each device's shard is read from
    the memory-mapped files straight into place: no process ever holds a whole tensor it does not need.
    ``tensors`` (HF tensor name -> an object whose ``get(name)`` returns the array in HF layout) replaces the
    safetensors in ``root``: the GGUF loader passes its dequantized tensors this way. ``quantize`` (a
    ``jaxspec.models.quant`` format) turns each projection and embedding into int8 as soon as it is read, so the
    whole float model is never held.
    """
    tensors = safetensors_file.open_dir(root) if tensors is None else tensors
    abstract = family.abstract_params(cfg)
    target = np.dtype(cfg.jnp_dtype)
    params: dict = {}
    used: set[str] = set()
    fused: dict[str, tuple[int, list]] = {}
    for w in family.weights(cfg):
        names = w.names(cfg.num_layers)
        missing = [n for n in names if n not in tensors]
        if missing:
            more = " ..." if len(missing) > 4 else ""
            raise ValueError(f"checkpoint in {root} is missing tensor(s) {missing[:4]}{more}")
        arrays = []
        for name in names:
            raw = tensors[name].get(name)
            if w.rows is not None:
                fused.setdefault(name, (raw.shape[0], []))[1].append(w.rows)
            arrays.append(w.from_hf(raw))
        used.update(names)
        shape = ((len(arrays),) if w.stacked else ()) + tuple(arrays[0].shape)
        want = w.get(abstract)
        if want is None:
            raise AssertionError(f"weight table targets {w.path}, which is not a parameter of this model")
        if shape != tuple(want.shape) or any(a.shape != arrays[0].shape for a in arrays):
            raise ValueError(
                f"tensor {names[0]} has shape {tuple(arrays[0].shape)}, which does not match the config "
                f"(expected {tuple(want.shape[1:] if w.stacked else want.shape)}"
                f"{' after transposing' if w.transpose else ''})"
            )
        sharding = None if shardings is None else w.get(shardings)
        if sharding is None:
            value = jnp.asarray(_stacked_slice(arrays, w.stacked, (slice(None),) * len(shape), target))
        else:

            def data(index, a=arrays, s=w.stacked):
                return _stacked_slice(a, s, index, target)

            value = jax.make_array_from_callback(shape, sharding, data)
        if quantize is not None and quant.quantizes(w.path, value):
            for path, leaf in quant.quantize_params({w.path[-1]: value}, quantize, consume=True).items():
                _set(params, (*w.path[:-1], path), leaf)
            continue
        _set(params, w.path, value)
    _check_fused(fused)
    leaves = {jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(abstract)}
    filled = {
        jax.tree_util.keystr(p)
        for p, _ in jax.tree_util.tree_leaves_with_path(params)
        if not quant.is_scale(str(getattr(p[-1], "key", "")))
    }
    if leaves != filled:
        raise AssertionError(f"weight table does not cover parameters {sorted(leaves - filled)}")
    unused = sorted(n for n in tensors if n not in used and not family.ignored(cfg, n))
    if unused:
        raise ValueError(
            f"checkpoint in {root} has tensor(s) this config does not use: {unused[:6]}"
            f"{' ...' if len(unused) > 6 else ''} (an architecture variant that is not supported?)"
        )
    return params


def _eos_ids(root: Path, config: dict, tokenizer) -> int | tuple[int, ...] | None:
    sources = []
    if (root / "generation_config.json").exists():
        sources.append(_read_json(root / "generation_config.json").get("eos_token_id"))
    sources.append(config.get("eos_token_id"))
    if tokenizer is not None:
        sources.append(getattr(tokenizer, "eos_token_id", None))
    for eos in sources:
        if eos is None or eos == []:
            continue
        if isinstance(eos, (list, tuple)):
            return tuple(int(e) for e in eos) if len(eos) > 1 else int(eos[0])
        return int(eos)
    return None


def _load_tokenizer(root: Path):
    if not ((root / "tokenizer.json").exists() or (root / "tokenizer_config.json").exists()):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(root), local_files_only=True, trust_remote_code=False)


def load(
    path: str | os.PathLike,
    dtype="float32",
    *,
    tokenizer: Any = True,
    name: str | None = None,
    mesh=None,
    quantize: str | None = None,
) -> CausalLM:
    """Load a Hugging Face model directory as a ``CausalLM``.

    Args:
      path: a directory with ``config.json`` and ``model.safetensors`` (or shards + ``model.safetensors.index.json``).
      dtype: ``"float32"``, ``"bfloat16"`` or ``"float16"``: weights, activations and KV cache (logits are float32).
      tokenizer: ``True`` attaches ``AutoTokenizer.from_pretrained(path)`` when the directory has a tokenizer
        (local files only, no remote code); ``False``/``None`` attaches none; any other object is attached as is.
      name: the model's name in messages (default: the directory name).
      mesh: a ``jax.sharding.Mesh`` or ``{"data": d, "model": m}``: each weight is read straight into its
        sharding by ``jaxspec.sharding``'s rules (every process reads only its own shards).
      quantize: None, or a ``jaxspec.models.quant`` format: each projection and embedding becomes int8 (with its
        scales) as soon as it is read.

    Raises ``FileNotFoundError`` for a missing directory, config or shard and ``ValueError`` for an unsupported
    ``model_type`` / rope type / variant, a bad dtype, or tensors that do not match the config.
    """
    dtype = dtypes.check(dtype)
    root = Path(path)
    if not root.is_dir():
        raise FileNotFoundError(f"{root} is not a directory (expected a Hugging Face model directory)")
    if not (root / "config.json").exists():
        raise FileNotFoundError(f"no config.json in {root} (expected a Hugging Face model directory)")
    config = _read_json(root / "config.json")
    tensors = None
    if hf_wrappers.is_wrapper(config):  # a multimodal checkpoint: its text model alone
        wrapper, config = config["model_type"], hf_wrappers.text_config(config)
        tensors = hf_wrappers.text_tensors(safetensors_file.open_dir(root), root, wrapper)
        config["tie_word_embeddings"] = "lm_head.weight" not in tensors
    model_type = config.get("model_type")
    try:
        family = families.family_for_model_type(model_type)
    except ValueError as err:
        raise ValueError(f"{err} (in {root / 'config.json'})") from None
    assert model_type is not None  # family_for_model_type refuses None
    cfg = family.config_from_hf(config, model_type, dtype)
    shardings = None if mesh is None else family.shardings(cfg, mesh, name=root.name)
    params = load_params(root, family, cfg, shardings, tensors, quantize)
    if tokenizer is True:
        tokenizer = _load_tokenizer(root)
    elif tokenizer is False:
        tokenizer = None
    return family.from_params(
        cfg,
        families.loaded_params(family, params),
        tokenizer=tokenizer,
        eos_token_id=_eos_ids(root, config, tokenizer),
        name=name or root.name,
        **families.loaded_layout(family),
    )
