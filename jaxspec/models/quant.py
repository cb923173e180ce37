"""Quantized weights: int8 with a float scale per output channel, applied inside the products.

A quantized weight is stored as two leaves of the params tree: the integer array under the float weight's own name
(``kernel`` of a projection, ``embedding`` of a table) and its scales beside it (``kernel_scale``: one per output
column, ``[..., out]``; ``embedding_scale``: one per row, ``[rows]``, which is an output channel both when the
table embeds and when it is a tied LM head). The modules here read either form, so a model is quantized by
changing its params alone: ``apply_fn``, configs and parameter names stay as they are, and the float model and its
quantized copy share compiled code paths (only the argument dtypes differ).

Two formats store the same weights and differ in the product. ``"int8"`` (weight-only): the integer weight is
converted to the activation dtype inside the product and the product scaled per output channel
(``x @ (q · s) = (x @ q) · s``); the float weight is never stored, though a backend may write it out inside a call
(XLA:CPU does). ``"w8a8"`` (scales named ``*_scale_a8``): each product's input rows are rounded to int8 by their
own absmax too and the product runs in integers (int32 sums), scaled by both; a one-row product is computed over
two rows (XLA:CPU's one-row integer product is ~20× slower; two rows cost what one does elsewhere). Norm scales,
biases and other vectors stay float. Measurements: docs/history/quantization.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxspec.core.model import CausalLM
from jaxspec.models import families

FORMATS = ("int8", "w8a8")
"""The weight formats ``quantize_params`` makes."""

_QMAX = 127.0
_SCALE = "_scale"  # a quantized leaf's scales sit beside it under its name plus this suffix ...
_SCALE_A8 = "_scale_a8"  # ... or this one, where its products quantize their inputs too ("w8a8")


def check_format(fmt, arg: str = "quantize") -> str | None:
    """``fmt`` if it is one of ``FORMATS`` (or None: no quantization); ``ValueError`` naming ``arg`` otherwise."""
    if fmt is None or fmt in FORMATS:
        return fmt
    raise ValueError(f"{arg} must be one of {list(FORMATS)} or None, got {fmt!r}")


def is_quantized(w) -> bool:
    """Whether the weight array ``w`` is stored as integers (its scales are its ``_scale`` sibling)."""
    return jnp.issubdtype(w.dtype, jnp.integer)


@jax.jit
def _int8_columns(w):
    """``(q int8 [..., in, out], scale float32 [..., out])`` with ``w ≈ q * scale``: the largest magnitude of each
    output column maps to ±127 (an all-zero column gets scale 1)."""
    wf = w.astype(jnp.float32)
    amax = jnp.max(jnp.abs(wf), axis=-2)
    scale = jnp.where(amax > 0, amax / _QMAX, 1.0)
    q = jnp.clip(jnp.round(wf / scale[..., None, :]), -_QMAX, _QMAX).astype(jnp.int8)
    return q, scale


def quantize_kernel(w) -> tuple[jax.Array, jax.Array]:
    """A projection's ``[..., in, out]`` weight as int8 with one float32 scale per output column (``[..., out]``)."""
    return _int8_columns(w)


def quantize_table(w) -> tuple[jax.Array, jax.Array]:
    """An embedding table ``[rows, width]`` as int8 with one float32 scale per row (``[rows]``)."""
    q, scale = _int8_columns(jnp.swapaxes(w, -1, -2))
    return jnp.swapaxes(q, -1, -2), scale


def dequantize_kernel(q, scale, dtype) -> jax.Array:
    """The float ``[..., in, out]`` weight of an int8 kernel and its column scales, in ``dtype``."""
    return (q.astype(jnp.float32) * scale[..., None, :]).astype(dtype)


def dequantize_table(q, scale, dtype) -> jax.Array:
    """The float ``[rows, width]`` table of an int8 table and its row scales, in ``dtype``."""
    return (q.astype(jnp.float32) * scale[..., :, None]).astype(dtype)


def param_with_scale(module: nn.Module, name: str, init: Callable, shape, dtype) -> tuple[jax.Array, Any, bool]:
    """``(weight, scale or None, int8 products)``: ``module``'s parameter ``name`` (declared as a float ``shape``
    weight, created by ``init`` when the module is initialized) and, when the stored weight is integer, its scales:
    ``name_scale`` (weight-only: float products) or ``name_scale_a8`` (``"w8a8"``: integer products)."""
    w = module.param(name, init, shape, dtype)
    if not is_quantized(w):
        return w, None, False
    for suffix, a8 in ((_SCALE, False), (_SCALE_A8, True)):
        if module.has_variable("params", name + suffix):
            return w, module.get_variable("params", name + suffix), a8
    raise ValueError(f"{module.name}: the integer weight {name!r} has no {name + _SCALE!r} beside it")


def _int8_rows(x):
    """``(q int8 [rows, n], scale float32 [rows, 1])``: each row of ``x [rows, n]`` scaled to ±127 by its absmax."""
    amax = jnp.max(jnp.abs(x), axis=-1, keepdims=True)
    scale = jnp.where(amax > 0, amax / _QMAX, 1.0)
    return jnp.clip(jnp.round(x / scale), -_QMAX, _QMAX).astype(jnp.int8), scale


def pad_rows(rows, min_rows: int):
    """``rows [n, width]`` with zero rows appended up to ``min_rows`` (as it is when ``n >= min_rows``)."""
    n = rows.shape[0]
    return rows if n >= min_rows else jnp.concatenate([rows, jnp.zeros((min_rows - n, rows.shape[1]), rows.dtype)])


def project(
    x, kernel, scale, dtype, preferred_element_type=None, a8: bool = False, contract: int = 0, min_rows: int = 1
):
    """``x [..., in]`` times ``kernel`` (``[in, out]``, or ``[out, in]`` with ``contract=1``) in ``dtype``: an int8
    kernel is converted inside the product and the product scaled per output column; with ``a8`` each row of ``x``
    is quantized to int8 by its own absmax and the product runs in integers (int32 sums), then scaled by both.
    ``min_rows``: a product over fewer rows of ``x`` is computed over that many, zero rows appended (a one-row
    product takes a slower path than a two-row one on some backends: ``LlamaConfig.min_rows``)."""
    lead, width = x.shape[:-1], x.shape[-1]
    rows = x.reshape(-1, width)
    n = rows.shape[0]
    if not a8:
        y = jax.lax.dot_general(
            pad_rows(rows.astype(dtype), min_rows),
            kernel.astype(dtype),
            (((1,), (contract,)), ((), ())),
            preferred_element_type=preferred_element_type,
        )[:n].reshape(*lead, -1)
        return y if scale is None else y * scale.astype(y.dtype)
    # products over one row take a far slower path on some backends (XLA:CPU): two rows cost as one
    q, row_scale = _int8_rows(pad_rows(rows.astype(jnp.float32), max(min_rows, 2)))
    acc = jax.lax.dot_general(q, kernel, (((1,), (contract,)), ((), ())), preferred_element_type=jnp.int32)
    y = (acc[:n].astype(jnp.float32) * row_scale[:n] * scale).reshape(*lead, -1)
    return y.astype(preferred_element_type or dtype)


def lookup(table, scale, ids, dtype):
    """Rows ``ids`` of ``table [rows, width]`` in ``dtype`` (dequantized by their row scales when int8)."""
    rows = jnp.take(table, ids, axis=0).astype(dtype)
    return rows if scale is None else rows * jnp.take(scale, ids, axis=0)[..., None].astype(dtype)


class Dense(nn.Module):
    """``flax.linen.Dense``'s projection and parameter names (``kernel [in, out]``, optional ``bias``), reading an
    int8 ``kernel`` with its ``kernel_scale`` as well as a float one."""

    features: int
    use_bias: bool = True
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32
    kernel_init: Callable = nn.initializers.lecun_normal()
    min_rows: int = 1  # ``project``'s

    @nn.compact
    def __call__(self, x):
        shape = (x.shape[-1], self.features)
        kernel, scale, a8 = param_with_scale(self, "kernel", self.kernel_init, shape, self.param_dtype)
        y = project(x, kernel, scale, self.dtype, a8=a8, min_rows=self.min_rows)
        if self.use_bias:
            y = y + self.param("bias", nn.initializers.zeros, (self.features,), self.param_dtype).astype(self.dtype)
        return y


class Embed(nn.Module):
    """``flax.linen.Embed``'s lookup and ``attend`` (the tied LM head) over ``embedding [rows, width]``, reading an
    int8 table with its per-row ``embedding_scale`` as well as a float one."""

    num_embeddings: int
    features: int
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32
    embedding_init: Callable = nn.initializers.normal(1.0)
    min_rows: int = 1  # ``project``'s, for ``attend``

    def setup(self):
        shape = (self.num_embeddings, self.features)
        self.embedding, self.scale, self.a8 = param_with_scale(
            self, "embedding", self.embedding_init, shape, self.param_dtype
        )

    def __call__(self, ids):
        return lookup(self.embedding, self.scale, ids, self.dtype)

    def attend(self, x):
        """``x [..., width] @ embedding.T``: logits over the rows."""
        return project(x, self.embedding, self.scale, self.dtype, a8=self.a8, contract=1, min_rows=self.min_rows)


def is_scale(key: str) -> bool:
    """Whether a params key names a quantized weight's scales."""
    return key.endswith((_SCALE, _SCALE_A8))


def quantizes(path: tuple[str, ...], leaf) -> bool:
    """Whether ``quantize_params`` quantizes the float leaf at ``path`` (a projection kernel, an embedding table)."""
    return _quantizes(path, leaf) is not None


def _quantizes(path: tuple[str, ...], leaf) -> str | None:
    """Which quantizer a params leaf takes: ``"kernel"`` (a projection), ``"table"`` (an embedding), or None."""
    if not path or getattr(leaf, "ndim", 0) < 2 or not jnp.issubdtype(leaf.dtype, jnp.floating):
        return None
    if path[-1] == "kernel":
        return "kernel"
    if path[-1] == "embedding" and leaf.ndim == 2:
        return "table"
    return None


def quantize_params(params, fmt: str = "int8", *, consume: bool = False):
    """``params`` with every projection kernel and embedding table in ``fmt`` (``FORMATS``: int8 with a float
    scale per output channel; ``"w8a8"`` also quantizes each product's input rows, per row, at run time), each
    beside its scales; other leaves (norm scales, biases) as they are. Either layout (stacked or split layers).
    ``consume`` deletes each float weight once its quantized copy exists (peak memory: the float model plus one
    weight)."""
    check_format(fmt, "fmt")

    def walk(node, path):
        if isinstance(node, dict):
            out = {}
            for key, value in node.items():
                kind = _quantizes((*path, key), value)
                if kind is None:
                    out[key] = walk(value, (*path, key))
                    continue
                q, scale = (quantize_kernel if kind == "kernel" else quantize_table)(value)
                out[key], out[key + (_SCALE_A8 if fmt == "w8a8" else _SCALE)] = q, scale
                if consume and isinstance(value, jax.Array):
                    value.delete()
            return out
        if isinstance(node, (tuple, list)):
            return type(node)(walk(v, (*path, str(i))) for i, v in enumerate(node))
        return node

    return walk(params, ())


def scale_of(node: dict, name: str) -> tuple[Any, str]:
    """``(scales, suffix)`` of weight ``name`` in the params dict ``node``: its scales and their name's suffix
    (``"_scale"`` or ``"_scale_a8"``), or ``(None, "")`` for a float weight."""
    for suffix in (_SCALE, _SCALE_A8):
        if name + suffix in node:
            return node[name + suffix], suffix
    return None, ""


def format_of(params) -> str | None:
    """The format ``params`` were quantized in (``"int8"``, ``"w8a8"``), or None for float params."""
    suffixes = {str(getattr(path[-1], "key", "")) for path, _ in jax.tree_util.tree_leaves_with_path(params) if path}
    if any(k.endswith(_SCALE_A8) for k in suffixes):
        return "w8a8"
    return "int8" if any(k.endswith(_SCALE) for k in suffixes) else None


def dequantize_params(params, dtype):
    """``params`` with every int8 weight turned back into a ``dtype`` float weight and its scales dropped."""

    def walk(node):
        if isinstance(node, dict):
            out = {}
            for key, value in node.items():
                if any(key.endswith(x) and key[: -len(x)] in node for x in (_SCALE, _SCALE_A8)):
                    continue
                scale, _ = scale_of(node, key)
                if scale is not None and is_quantized(value):
                    deq = dequantize_kernel if key != "embedding" else dequantize_table
                    out[key] = deq(value, scale, dtype)
                else:
                    out[key] = walk(value)
            return out
        if isinstance(node, (tuple, list)):
            return type(node)(walk(v) for v in node)
        return node

    return walk(params)


def scale_axes(param_axes: dict | None) -> dict | None:
    """A model's ``param_axes`` (``{path: logical axes}``) with the scales' axes added: a kernel's scales lie along
    its output axis, a table's along its rows."""
    if param_axes is None:
        return None
    out = dict(param_axes)
    for path, axes in param_axes.items():
        for suffix in (_SCALE, _SCALE_A8):
            if path and path[-1] == "kernel":
                out[tuple(path[:-1]) + ("kernel" + suffix,)] = (axes[-1],)
            elif path and path[-1] == "embedding":
                out[tuple(path[:-1]) + ("embedding" + suffix,)] = (axes[0],)
    return out


def _builtin(cfg) -> bool:
    try:
        family = families.family_of_config(cfg)
    except ValueError:
        return False
    return family.config_class.__module__.startswith("jaxspec.")


def quantize(model, fmt: str = "int8", *, consume: bool = False):
    """A copy of ``model`` with its weights in ``fmt`` (``FORMATS``): a built-in family's ``CausalLM`` (target or
    draft) or an EAGLE drafter (its own weights; the target's embedding and LM head it reads are quantized with
    the target). The quantized model is a model of its own: speculation over it is exact to *its* distribution.
    Already-quantized weights stay as they are; ``consume`` frees each float weight once quantized (``model`` is
    unusable after). ``ValueError`` for an unknown ``fmt`` or a ``CausalLM`` whose
    forward pass is not a built-in family's (its modules may not read integer weights)."""
    check_format(fmt, "fmt")
    if isinstance(model, CausalLM):
        if not _builtin(model.config):
            raise ValueError(
                f"quantize: {model.name!r} is not a built-in family's model (config "
                f"{type(model.config).__name__}); its forward pass may not read int8 weights"
            )
        params = quantize_params(model.params, fmt, consume=consume)
        return model.replace(params=params, param_axes=scale_axes(model.param_axes))
    if dataclasses.is_dataclass(model) and hasattr(model, "params"):
        return dataclasses.replace(model, params=quantize_params(model.params, fmt, consume=consume))  # type: ignore[type-var]
    raise TypeError(f"quantize: expected a CausalLM or an EAGLE drafter, got {type(model).__name__}")
