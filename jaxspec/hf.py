"""Load Hugging Face model directories (``config.json`` + ``*.safetensors``) as a ``jaxspec.CausalLM``.

Only JSON and safetensors are read: no pickle, no code from the checkpoint (never ``trust_remote_code``).
Architectures come from a registry keyed by the config's ``model_type``; each entry turns the HF config into one
of our configs, names the checkpoint tensor behind every leaf of our params tree, and builds the model::

    model = jaxspec.load("path/to/Llama-3.2-1B", dtype="bfloat16")

Supported now: the Llama family (``llama``, ``mistral``, ``qwen2``, ``qwen3``, ``gemma``) with RoPE types
``default``, ``linear`` and ``llama3``; GPT-2 (``gpt2``). Add a family with ``register_family``.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

from jaxspec.model import CausalLM
from jaxspec.models import gpt2, llama
from jaxspec.models.rope import ROPE_TYPES, check_rope

DTYPES = ("float32", "bfloat16", "float16")

_ST_DTYPES = {
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


# ----------------------------------------------------------------------------------------------- safetensors


class _SafetensorsFile:
    """A memory-mapped safetensors file: an 8-byte little-endian header size, a JSON header, raw tensor bytes."""

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
        self._data = None

    def keys(self):
        return self.header.keys()

    def get(self, name: str) -> np.ndarray:
        info = self.header[name]
        if info["dtype"] not in _ST_DTYPES:
            raise ValueError(f"{self.path}: tensor {name!r} has unsupported dtype {info['dtype']}")
        if self._data is None:
            self._data = np.memmap(self.path, dtype=np.uint8, mode="r")
        begin, end = info["data_offsets"]
        raw = self._data[self.offset + begin : self.offset + end]
        return raw.view(_ST_DTYPES[info["dtype"]]).reshape(info["shape"])


def _inside(root: Path, name: str) -> Path:
    path = (root / name).resolve()
    if root.resolve() not in path.parents:
        raise ValueError(f"checkpoint file {name!r} points outside {root}")
    return path


def _open_tensors(root: Path) -> dict[str, _SafetensorsFile]:
    """Tensor name -> the file holding it, for a single file or a sharded checkpoint with an index."""
    index = root / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text()).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ValueError(f"{index} has no 'weight_map'")
        shards = sorted(set(weight_map.values()))
        missing = [s for s in shards if not _inside(root, s).exists()]
        if missing:
            raise FileNotFoundError(f"{index} lists shard(s) missing from {root}: {missing}")
        files = {s: _SafetensorsFile(_inside(root, s)) for s in shards}
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
        f = _SafetensorsFile(p)
        for name in f.keys():
            out[name] = f
    return out


# ----------------------------------------------------------------------------------------------- registry


@dataclasses.dataclass(frozen=True)
class Tensor:
    """Leaf ``path`` of our params tree comes from ``names`` (one per layer, stacked on axis 0, when
    ``len(names) > 1`` or ``stacked``); ``transpose`` for torch Linear weights ([out, in] -> Flax [in, out])."""

    path: tuple[str, ...]
    names: tuple[str, ...]
    transpose: bool = False
    stacked: bool = False


@dataclasses.dataclass(frozen=True)
class Family:
    """How to load one architecture. ``config(hf_config, model_type, dtype) -> cfg``; ``tensors(cfg) -> [Tensor]``
    covering every leaf of ``abstract_params(cfg)``; ``ignored(name)``: checkpoint tensors to skip (buffers,
    a tied LM head); ``from_params(cfg, params, **kw) -> CausalLM``."""

    config: Callable[[dict, str, str], Any]
    tensors: Callable[[Any], list[Tensor]]
    abstract_params: Callable[[Any], Any]
    from_params: Callable[..., CausalLM]
    ignored: Callable[[Any, str], bool] = lambda cfg, name: False


FAMILIES: dict[str, Family] = {}


def register_family(model_types, family: Family) -> None:
    for t in [model_types] if isinstance(model_types, str) else model_types:
        FAMILIES[t] = family


# ----------------------------------------------------------------------------------------------- Llama family


def _rope_from_hf(c: dict) -> tuple[str, dict, float]:
    """``(rope_type, params, theta)`` from either ``rope_theta`` + ``rope_scaling`` (transformers 4) or
    ``rope_parameters`` (transformers 5)."""
    raw = c.get("rope_parameters") or c.get("rope_scaling") or {}
    if not isinstance(raw, dict):
        raise ValueError(f"rope_scaling / rope_parameters must be a dict or null, got {raw!r}")
    if raw and all(isinstance(v, dict) for v in raw.values()):
        raise ValueError(f"per-layer-type RoPE parameters are not supported (got keys {sorted(raw)})")
    params = dict(raw)
    theta = params.pop("rope_theta", None) or c.get("rope_theta") or 10000.0
    rope_type = params.pop("rope_type", None) or params.pop("type", None) or "default"
    params.pop("type", None)
    partial = params.pop("partial_rotary_factor", None) or c.get("partial_rotary_factor") or 1.0
    if partial != 1.0:
        raise ValueError(f"partial_rotary_factor={partial} is not supported (only 1.0)")
    if rope_type not in ROPE_TYPES:
        raise ValueError(f"unsupported rope type {rope_type!r}; supported: {sorted(ROPE_TYPES)}")
    if rope_type == "llama3" and params.get("original_max_position_embeddings") is None:
        params["original_max_position_embeddings"] = c.get("max_position_embeddings")
    if rope_type == "default":
        params = {}
    check_rope(rope_type, params)
    return rope_type, params, float(theta)


def _llama_config(c: dict, model_type: str, dtype: str) -> llama.LlamaConfig:
    def need(key):
        if c.get(key) is None:
            raise ValueError(f"config.json ({model_type}) is missing {key!r}")
        return c[key]

    gemma = model_type == "gemma"
    if gemma:
        # Gemma checkpoints carry a legacy hidden_act="gelu" that means the tanh approximation (transformers maps
        # it to gelu_pytorch_tanh); transformers 4 configs may set hidden_activation, which then takes precedence.
        act = c.get("hidden_activation") or c.get("hidden_act") or "gelu_pytorch_tanh"
        if act == "gelu" and not c.get("hidden_activation"):
            act = "gelu_pytorch_tanh"
        if act != "gelu_pytorch_tanh":
            raise ValueError(f"hidden_act={act!r} is not supported for gemma (only 'gelu_pytorch_tanh')")
        if c.get("use_bidirectional_attention"):
            raise ValueError("use_bidirectional_attention=True is not supported for gemma (causal attention only)")
    else:
        act = c.get("hidden_act", c.get("hidden_activation", "silu"))
        if act != "silu":
            raise ValueError(f"hidden_act={act!r} is not supported for {model_type} (only 'silu')")
    if c.get("mlp_bias"):
        raise ValueError(f"mlp_bias=True is not supported for {model_type}")
    layer_types = c.get("layer_types") or []
    if any(t != "full_attention" for t in layer_types) or (model_type != "mistral" and c.get("use_sliding_window")):
        raise ValueError(f"sliding-window layers are not supported for {model_type} (layer_types={layer_types})")
    heads = int(need("num_attention_heads"))
    attention_bias = bool(c.get("attention_bias", False))
    rope_type, rope_params, theta = _rope_from_hf(c)
    return llama.LlamaConfig(
        vocab_size=int(need("vocab_size")),
        hidden_size=int(need("hidden_size")),
        intermediate_size=int(need("intermediate_size")),
        num_layers=int(need("num_hidden_layers")),
        num_heads=heads,
        num_kv_heads=int(c.get("num_key_value_heads") or heads),
        head_dim=c.get("head_dim") or None,
        rope_theta=theta,
        rms_norm_eps=float(c.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(c.get("tie_word_embeddings", gemma)),
        dtype=dtype,
        qkv_bias=True if model_type == "qwen2" else attention_bias,
        o_bias=False if model_type == "qwen2" else attention_bias,
        qk_norm=model_type == "qwen3",
        rope_type=rope_type,
        rope_params=rope_params,
        sliding_window=c.get("sliding_window") if model_type == "mistral" else None,
        norm_offset=1.0 if gemma else 0.0,
        embed_scale=gemma,
        mlp_activation="gelu_tanh" if gemma else "silu",
    )


def _llama_tensors(cfg: llama.LlamaConfig) -> list[Tensor]:
    n = cfg.num_layers

    def per_layer(hf: str, path: tuple[str, ...], transpose=False) -> Tensor:
        return Tensor(("layers", *path), tuple(f"model.layers.{i}.{hf}" for i in range(n)), transpose, True)

    out = [
        Tensor(("embed", "embedding"), ("model.embed_tokens.weight",)),
        Tensor(("final_norm", "scale"), ("model.norm.weight",)),
        per_layer("input_layernorm.weight", ("input_norm", "scale")),
        per_layer("post_attention_layernorm.weight", ("post_attn_norm", "scale")),
    ]
    for p in ("q", "k", "v", "o"):
        out.append(per_layer(f"self_attn.{p}_proj.weight", ("attn", f"{p}_proj", "kernel"), True))
        if (p != "o" and cfg.qkv_bias) or (p == "o" and cfg.o_bias):
            out.append(per_layer(f"self_attn.{p}_proj.bias", ("attn", f"{p}_proj", "bias")))
    if cfg.qk_norm:
        for p in ("q", "k"):
            out.append(per_layer(f"self_attn.{p}_norm.weight", ("attn", f"{p}_norm", "scale")))
    for p in ("gate", "up", "down"):
        out.append(per_layer(f"mlp.{p}_proj.weight", ("mlp", f"{p}_proj", "kernel"), True))
    if not cfg.tie_embeddings:
        out.append(Tensor(("lm_head", "kernel"), ("lm_head.weight",), True))
    return out


def _llama_abstract(cfg: llama.LlamaConfig):
    _, init_cache = llama.model_fns(cfg)
    tokens = jnp.zeros((1, 1), jnp.int32)
    shapes = jax.eval_shape(llama.Llama(cfg).init, jax.random.key(0), tokens, tokens, init_cache(1, 1))
    return shapes["params"]


def _llama_ignored(cfg: llama.LlamaConfig, name: str) -> bool:
    return name.endswith("rotary_emb.inv_freq") or (cfg.tie_embeddings and name == "lm_head.weight")


register_family(
    ("llama", "mistral", "qwen2", "qwen3", "gemma"),
    Family(_llama_config, _llama_tensors, _llama_abstract, llama.from_params, _llama_ignored),
)


# ----------------------------------------------------------------------------------------------- GPT-2

_GPT2_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}


def _gpt2_config(c: dict, model_type: str, dtype: str) -> gpt2.GPT2Config:
    for key in ("vocab_size", "n_embd", "n_layer", "n_head"):
        if c.get(key) is None:
            raise ValueError(f"config.json ({model_type}) is missing {key!r}")
    act = c.get("activation_function", "gelu_new")
    if act not in _GPT2_ACTIVATIONS:
        raise ValueError(
            f"activation_function={act!r} is not supported for gpt2; supported: {sorted(_GPT2_ACTIVATIONS)}"
        )
    for key in ("scale_attn_by_inverse_layer_idx", "add_cross_attention"):
        if c.get(key):
            raise ValueError(f"{key}=True is not supported for gpt2")
    if c.get("tie_word_embeddings", True) is False:
        raise ValueError("tie_word_embeddings=False is not supported for gpt2 (the LM head is the token embedding)")
    return gpt2.GPT2Config(
        vocab_size=int(c["vocab_size"]),
        hidden_size=int(c["n_embd"]),
        num_layers=int(c["n_layer"]),
        num_heads=int(c["n_head"]),
        max_positions=int(c.get("n_positions") or 1024),
        intermediate_size=c.get("n_inner") or None,
        layer_norm_eps=float(c.get("layer_norm_epsilon", 1e-5)),
        activation=_GPT2_ACTIVATIONS[act],
        scale_attn_weights=bool(c.get("scale_attn_weights", True)),
        dtype=dtype,
    )


def _gpt2_tensors(cfg: gpt2.GPT2Config) -> list[Tensor]:
    """HF GPT-2 uses Conv1D, whose weights are already [in, out]: nothing is transposed."""

    def per_layer(hf: str, path: tuple[str, ...]) -> Tensor:
        return Tensor(("layers", *path), tuple(f"transformer.h.{i}.{hf}" for i in range(cfg.num_layers)), False, True)

    out = [
        Tensor(("wte", "embedding"), ("transformer.wte.weight",)),
        Tensor(("wpe", "embedding"), ("transformer.wpe.weight",)),
        Tensor(("ln_f", "scale"), ("transformer.ln_f.weight",)),
        Tensor(("ln_f", "bias"), ("transformer.ln_f.bias",)),
    ]
    for ln in ("ln_1", "ln_2"):
        out.append(per_layer(f"{ln}.weight", (ln, "scale")))
        out.append(per_layer(f"{ln}.bias", (ln, "bias")))
    for module, dense in (("attn", "c_attn"), ("attn", "c_proj"), ("mlp", "c_fc"), ("mlp", "c_proj")):
        out.append(per_layer(f"{module}.{dense}.weight", (module, dense, "kernel")))
        out.append(per_layer(f"{module}.{dense}.bias", (module, dense, "bias")))
    return out


def _gpt2_ignored(cfg: gpt2.GPT2Config, name: str) -> bool:
    # the tied LM head, and the causal-mask buffers older checkpoints saved (attn.bias, attn.masked_bias)
    return name == "lm_head.weight" or name.endswith((".attn.bias", ".attn.masked_bias"))


register_family("gpt2", Family(_gpt2_config, _gpt2_tensors, gpt2.abstract_params, gpt2.from_params, _gpt2_ignored))


# ----------------------------------------------------------------------------------------------- loading


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from None


def _normalize_dtype(dtype) -> str:
    try:
        name = dtype if isinstance(dtype, str) else jnp.dtype(dtype).name
    except TypeError:
        name = None
    if name not in DTYPES:
        raise ValueError(f"dtype must be one of {list(DTYPES)}, got {dtype!r}")
    return name


def _set(tree: dict, path: tuple[str, ...], value) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


def _get(tree, path):
    for key in path:
        if not isinstance(tree, dict) or key not in tree:
            return None
        tree = tree[key]
    return tree


def _stacked_slice(arrays: list[np.ndarray], stacked: bool, index: tuple, dtype) -> np.ndarray:
    """``np.stack(arrays)[index]`` (or ``arrays[0][index]``) reading only the needed part of each memory map."""
    if not stacked:
        return np.asarray(arrays[0][index], dtype=dtype)
    layers = range(len(arrays))[index[0]]
    return np.stack([np.asarray(arrays[i][index[1:]], dtype=dtype) for i in layers])


def load_params(root: Path, family: Family, cfg, shardings=None, tensors=None) -> dict:
    """Our params tree for ``cfg``, read from the safetensors in ``root`` and cast to ``cfg.dtype``.

    With ``shardings`` (a pytree of ``jax.sharding.Sharding`` like the params), each device's shard is read from
    the memory-mapped files straight into place: no process ever holds a whole tensor it does not need.
    ``tensors`` (HF tensor name -> an object whose ``get(name)`` returns the array in HF layout) replaces the
    safetensors in ``root``: the GGUF loader passes its dequantized tensors this way.
    """
    tensors = _open_tensors(root) if tensors is None else tensors
    abstract = family.abstract_params(cfg)
    target = np.dtype(cfg.jnp_dtype)
    params: dict = {}
    used = set()
    for spec in family.tensors(cfg):
        missing = [n for n in spec.names if n not in tensors]
        if missing:
            more = " ..." if len(missing) > 4 else ""
            raise ValueError(f"checkpoint in {root} is missing tensor(s) {missing[:4]}{more}")
        arrays = []
        for name in spec.names:
            a = tensors[name].get(name)
            arrays.append(a.T if spec.transpose else a)
            used.add(name)
        shape = ((len(arrays),) if spec.stacked else ()) + tuple(arrays[0].shape)
        want = _get(abstract, spec.path)
        if want is None:
            raise AssertionError(f"name map targets {spec.path}, which is not a parameter of this model")
        if shape != tuple(want.shape) or any(a.shape != arrays[0].shape for a in arrays):
            raise ValueError(
                f"tensor {spec.names[0]} has shape {tuple(arrays[0].shape)}, which does not match the config "
                f"(expected {tuple(want.shape[1:] if spec.stacked else want.shape)}"
                f"{' after transposing' if spec.transpose else ''})"
            )
        sharding = None if shardings is None else _get(shardings, spec.path)
        if sharding is None:
            value = jnp.asarray(_stacked_slice(arrays, spec.stacked, (slice(None),) * len(shape), target))
        else:
            value = jax.make_array_from_callback(
                shape, sharding, lambda index, a=arrays, s=spec.stacked: _stacked_slice(a, s, index, target)
            )
        _set(params, spec.path, value)
    leaves = {jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(abstract)}
    filled = {jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(params)}
    if leaves != filled:
        raise AssertionError(f"name map does not cover parameters {sorted(leaves - filled)}")
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
    path: str | os.PathLike, dtype="float32", *, tokenizer: Any = True, name: str | None = None, mesh=None
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

    Raises ``FileNotFoundError`` for a missing directory, config or shard and ``ValueError`` for an unsupported
    ``model_type`` / rope type / variant, a bad dtype, or tensors that do not match the config.
    """
    dtype = _normalize_dtype(dtype)
    root = Path(path)
    if not root.is_dir():
        raise FileNotFoundError(f"{root} is not a directory (expected a Hugging Face model directory)")
    if not (root / "config.json").exists():
        raise FileNotFoundError(f"no config.json in {root} (expected a Hugging Face model directory)")
    config = _read_json(root / "config.json")
    model_type = config.get("model_type")
    if model_type not in FAMILIES:
        raise ValueError(
            f"unsupported model_type {model_type!r} in {root / 'config.json'}; supported: {sorted(FAMILIES)}"
        )
    family = FAMILIES[model_type]
    cfg = family.config(config, model_type, dtype)
    shardings = None
    if mesh is not None:
        from jaxspec import sharding

        abstract = family.abstract_params(cfg)
        axes = family.from_params(cfg, abstract).param_axes
        shardings = sharding.plan_params(abstract, axes, cfg, sharding.make_mesh(mesh), name=root.name).shardings
    params = load_params(root, family, cfg, shardings)
    if tokenizer is True:
        tokenizer = _load_tokenizer(root)
    elif tokenizer is False:
        tokenizer = None
    return family.from_params(
        cfg, params, tokenizer=tokenizer, eos_token_id=_eos_ids(root, config, tokenizer), name=name or root.name
    )
