"""Published EAGLE-3 checkpoints, read as they are: ``config.json`` + ``*.safetensors`` in either layout.

  * **speculators** (vLLM's ``speculators`` package; ``"speculators_model_type": "eagle3"``): the decoder layer's
    config nested as ``transformer_layer_config``, the fused target layers as ``eagle_aux_hidden_state_layer_ids``,
    tensors ``layers.0.*``, the embedding ``embed_tokens.weight`` usually stored.
  * **EAGLE** (the EAGLE authors' ``EAGLE3-*`` heads, SpecForge's): a flat Llama config with ``draft_vocab_size``,
    tensors ``midlayer.*``, the embedding usually left to the target's; the fused layers are EAGLE-3's default
    (``jaxspec.models.eagle3.default_aux_layers`` of the target's depth).

Both: ``fc.weight [H, n·H]``, the layer's ``self_attn.{q,k,v,o}_proj``, ``mlp.{gate,up,down}_proj``,
``input_layernorm`` (the embedding half), ``hidden_norm`` (the feature half), ``post_attention_layernorm``,
``norm.weight`` (final), ``lm_head.weight [draft vocab, H]``, and ``d2t [draft vocab]`` (draft row ``d`` is target
id ``d + d2t[d]``) with ``t2d [vocab]`` (the same set as a mask). Only safetensors are read: a directory holding
only pickled weights (``*.bin``, ``*.pt``, ``*.pth``) is refused, never unpickled.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from jaxspec.formats import safetensors_file
from jaxspec.models import eagle3
from jaxspec.models.llama_config import LlamaConfig, config_from_hf

PICKLED = ("*.bin", "*.pt", "*.pth", "*.ckpt")
_LAYER = {  # our path under "layer" -> the checkpoint's name under the layer prefix, and whether torch-transposed
    ("attn", "q_proj", "kernel"): ("self_attn.q_proj.weight", True),
    ("attn", "k_proj", "kernel"): ("self_attn.k_proj.weight", True),
    ("attn", "v_proj", "kernel"): ("self_attn.v_proj.weight", True),
    ("attn", "o_proj", "kernel"): ("self_attn.o_proj.weight", True),
    ("mlp", "gate_proj", "kernel"): ("mlp.gate_proj.weight", True),
    ("mlp", "up_proj", "kernel"): ("mlp.up_proj.weight", True),
    ("mlp", "down_proj", "kernel"): ("mlp.down_proj.weight", True),
    ("input_norm", "scale"): ("input_layernorm.weight", False),
    ("hidden_norm", "scale"): ("hidden_norm.weight", False),
    ("post_attn_norm", "scale"): ("post_attention_layernorm.weight", False),
}
_QK_NORM = {
    ("attn", "q_norm", "scale"): "self_attn.q_norm.weight",
    ("attn", "k_norm", "scale"): "self_attn.k_norm.weight",
}
_UNSUPPORTED = ("norm_before_fc", "fc_norm", "norm_output")  # speculators options this reader does not implement


def _read_config(root: Path) -> dict:
    path = root / "config.json"
    if not path.is_file():
        raise ValueError(f"{root} is not an EAGLE-3 checkpoint: it has no config.json")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from None


def is_eagle3(root) -> bool:
    """Whether directory ``root`` holds a published EAGLE-3 checkpoint's config (either layout)."""
    path = Path(root) / "config.json"
    if not path.is_file():
        return False
    try:
        c = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return False
    archs = " ".join(c.get("architectures") or [])
    return c.get("speculators_model_type") == "eagle3" or "Eagle3" in archs or "draft_vocab_size" in c


def read(root, target_cfg: LlamaConfig) -> tuple[eagle3.Eagle3Config, dict]:
    """``(config, params)`` of the EAGLE-3 checkpoint in directory ``root`` for a target of ``target_cfg``:
    ``params`` holds ``fc``, ``layer``, ``final_norm``, ``lm_head`` (NumPy, float32) and ``embed`` when the
    checkpoint stores one. ``ValueError`` naming the problem for pickled-only weights, a missing tensor, a tensor
    of the wrong shape, an unsupported option, or a head that does not fit the target's sizes."""
    root = Path(root)
    c = _read_config(root)
    if not any(root.glob("*.safetensors")):
        pickled = sorted(p.name for pattern in PICKLED for p in root.glob(pattern))
        if pickled:
            raise ValueError(
                f"{root} holds only pickled weights ({', '.join(pickled)}); jaxspec never unpickles files: convert "
                "them to safetensors (e.g. safetensors.torch.save_file in a torch environment you trust)"
            )
    speculators = c.get("speculators_model_type") is not None
    if speculators and c.get("speculators_model_type") != "eagle3":
        raise ValueError(f"{root}: speculators_model_type {c['speculators_model_type']!r} is not 'eagle3'")
    layer_c = c.get("transformer_layer_config") if speculators else c
    if not isinstance(layer_c, dict):
        raise ValueError(f"{root}/config.json has no transformer_layer_config")
    for flag in _UNSUPPORTED:
        if c.get(flag):
            raise ValueError(f"{root}: EAGLE-3 option {flag}=true is not supported")
    if int(layer_c.get("num_hidden_layers", 1)) != 1:
        raise ValueError(f"{root}: EAGLE-3 heads of {layer_c['num_hidden_layers']} layers are not supported (only 1)")
    model_type = layer_c.get("model_type", "llama")
    if model_type not in ("llama", "qwen3"):
        raise ValueError(f"{root}: an EAGLE-3 layer of model_type {model_type!r} is not supported (llama, qwen3)")
    layer = config_from_hf({**layer_c, "num_hidden_layers": 1}, model_type, "float32")
    if layer.qkv_bias or layer.o_bias:
        raise ValueError(f"{root}: an EAGLE-3 layer with attention biases is not supported")
    aux = c.get("eagle_aux_hidden_state_layer_ids") or eagle3.default_aux_layers(target_cfg.num_layers)
    tensors = safetensors_file.open_dir(root)
    prefix = "layers.0." if any(k.startswith("layers.0.") for k in tensors) else "midlayer."

    def get(name: str, shape: tuple) -> np.ndarray:
        if name not in tensors:
            raise ValueError(f"{root}: tensor {name!r} is missing from the checkpoint")
        x = np.asarray(tensors[name].get(name))
        if x.shape != shape:
            raise ValueError(f"{root}: tensor {name!r} has shape {list(x.shape)}, expected {list(shape)}")
        return x

    hidden = layer.hidden_size
    fc = tensors.get("fc.weight")
    if fc is None:
        raise ValueError(f"{root}: tensor 'fc.weight' is missing from the checkpoint")
    fc_in = int(fc.header["fc.weight"]["shape"][1])
    if fc_in % len(aux):
        raise ValueError(f"{root}: fc.weight takes {fc_in} inputs, not a multiple of {len(aux)} fused layers")
    lm_head = tensors.get("lm_head.weight")
    if lm_head is None:
        raise ValueError(f"{root}: tensor 'lm_head.weight' is missing from the checkpoint")
    draft_vocab = int(c.get("draft_vocab_size") or lm_head.header["lm_head.weight"]["shape"][0])
    if "d2t" in tensors:
        d2t = get("d2t", (draft_vocab,)).astype(np.int64)
        vocab_ids = np.arange(draft_vocab) + d2t
    elif draft_vocab == layer.vocab_size:
        vocab_ids = np.arange(draft_vocab)
    else:
        raise ValueError(f"{root}: tensor 'd2t' is missing (a draft vocabulary of {draft_vocab} needs its map)")
    if "t2d" in tensors:
        t2d = get("t2d", (layer.vocab_size,)).astype(bool)
        if t2d.sum() != draft_vocab or not np.all(t2d[np.clip(vocab_ids, 0, layer.vocab_size - 1)]):
            raise ValueError(f"{root}: t2d and d2t name different draft vocabularies")
    cfg = eagle3.Eagle3Config(
        layer,
        tuple(int(a) for a in aux),
        fc_in // len(aux),
        tuple(int(i) for i in vocab_ids),
        bool(c.get("norm_before_residual", False)),
    )
    params: dict = {"layer": {}}
    for path, (name, transposed) in _LAYER.items():
        shape = _shape(layer, path)
        x = get(prefix + name, shape[::-1] if transposed else shape)
        _put(params["layer"], path, x.T if transposed else x)
    if layer.qk_norm:
        for path, name in _QK_NORM.items():
            _put(params["layer"], path, get(prefix + name, (layer.head_dim,)))
    params["fc"] = {"kernel": get("fc.weight", (hidden, fc_in)).T}
    params["final_norm"] = {"scale": get("norm.weight", (hidden,))}
    params["lm_head"] = get("lm_head.weight", (draft_vocab, hidden)).T
    if "embed_tokens.weight" in tensors:
        params["embed"] = get("embed_tokens.weight", (layer.vocab_size, hidden))
    params = _as_float32(params)
    return cfg, params


def _shape(cfg: LlamaConfig, path: tuple) -> tuple[int, ...]:
    """Our (JAX, input-major) shape of a layer parameter."""
    h, d, heads, kv, inter = cfg.hidden_size, cfg.head_dim, cfg.num_heads, cfg.num_kv_heads, cfg.intermediate_size
    assert d is not None
    return {
        ("attn", "q_proj", "kernel"): (2 * h, heads * d),
        ("attn", "k_proj", "kernel"): (2 * h, kv * d),
        ("attn", "v_proj", "kernel"): (2 * h, kv * d),
        ("attn", "o_proj", "kernel"): (heads * d, h),
        ("mlp", "gate_proj", "kernel"): (h, inter),
        ("mlp", "up_proj", "kernel"): (h, inter),
        ("mlp", "down_proj", "kernel"): (inter, h),
    }.get(path, (h,))


def _put(tree: dict, path: tuple, value) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


def _as_float32(tree):
    if isinstance(tree, dict):
        return {k: _as_float32(v) for k, v in tree.items()}
    return np.asarray(tree, np.float32)
