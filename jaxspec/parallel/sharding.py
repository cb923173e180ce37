"""Sharding: logical axes -> mesh axes, in one table, and the placement of params, caches and loop state.

Every built-in weight declares its logical axes once (its ``jaxspec.models.families.Weight``, in its family's weight
table; ``CausalLM.param_axes`` holds them by path in the params tree); the KV cache is
``[layers, batch, cache_seq, cache_heads, head_dim]``. ``RULES`` maps logical axes to the two mesh axes: ``data``
(batch, so the KV cache too) and ``model`` (Megatron-style tensor parallelism: attention heads, kv heads, MLP
hidden, vocabulary).

A dimension that the mesh axis does not divide (e.g. 2 kv heads over ``model=4``) is *replicated* over that axis,
for that tensor only; ``plan(...).fallbacks`` lists every such case and ``strict=True`` turns them into errors.
The compiled batch is padded up to a multiple of the ``data`` axis, so any batch size works on any mesh.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxspec.core.cache import KVCache

MESH_AXES = ("data", "model")

# logical axis -> mesh axis (None: replicated). The one place that decides the layout.
RULES: dict[str, str | None] = {
    "batch": "data",
    "vocab": "model",
    "heads": "model",  # a dimension made of whole attention heads (num_heads * head_dim)
    "kv_heads": "model",  # ... of whole key/value heads (num_kv_heads * head_dim)
    "cache_heads": "model",  # the KV cache's head axis (one entry per kv head)
    "mlp": "model",
    "embed": None,
    "layers": None,
    "cache_seq": None,
    "head_dim": None,
}
_WHOLE_HEADS = ("heads", "kv_heads")  # split only at head boundaries

CACHE_AXES = ("layers", "batch", "cache_seq", "cache_heads", "head_dim")


def make_mesh(mesh: Mesh | Mapping[str, int] | None) -> Mesh | None:
    """A ``Mesh`` over all (global) devices from ``{"data": d, "model": m}`` (missing axes are 1), or the mesh as is.

    Raises ``ValueError`` naming the problem for unknown axis names, non-positive sizes or a device count that
    does not match.
    """
    if mesh is None:
        return None
    if isinstance(mesh, Mesh):
        unknown = [a for a in mesh.axis_names if a not in MESH_AXES]
        if unknown:
            raise ValueError(f"mesh has axis name(s) {unknown}; jaxspec meshes use the axes {list(MESH_AXES)}")
        auto = (jax.sharding.AxisType.Auto,) * len(mesh.axis_names)
        if tuple(mesh.axis_types) != auto:  # the loop relies on XLA's sharding propagation (Auto axes)
            mesh = Mesh(mesh.devices, mesh.axis_names, axis_types=auto)
        return mesh
    if not isinstance(mesh, Mapping):
        raise ValueError(
            f"mesh must be a jax.sharding.Mesh, a dict like {{'data': 2, 'model': 4}} or None, got {mesh!r}"
        )
    unknown = [a for a in mesh if a not in MESH_AXES]
    if unknown:
        raise ValueError(f"mesh has unknown axis name(s) {unknown}; use {list(MESH_AXES)}")
    sizes = {a: mesh.get(a, 1) for a in MESH_AXES}
    for a, n in sizes.items():
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"mesh axis {a!r} must have an int size >= 1, got {n!r}")
    count = jax.device_count()
    if math.prod(sizes.values()) != count:
        raise ValueError(
            f"mesh {sizes} has {math.prod(sizes.values())} devices but there are {count} "
            f"({jax.devices()[0].platform}); the axis sizes must multiply to the device count"
        )
    return jax.make_mesh(
        tuple(sizes.values()),
        MESH_AXES,
        devices=jax.devices(),
        axis_types=(jax.sharding.AxisType.Auto,) * len(MESH_AXES),
    )


def axis_size(mesh: Mesh | None, axis: str) -> int:
    """Devices along ``axis`` of ``mesh``; 1 without a mesh or when the mesh has no such axis."""
    return 1 if mesh is None or axis not in mesh.axis_names else int(mesh.shape[axis])


@dataclasses.dataclass(frozen=True)
class Fallback:
    """A tensor dimension left replicated because the mesh axis does not divide it."""

    tensor: str
    logical_axis: str
    mesh_axis: str
    dim: int
    shards: int

    def __str__(self):
        return (
            f"{self.tensor}: {self.logical_axis} ({self.dim}) is not divisible by mesh axis "
            f"{self.mesh_axis!r} (size {self.shards})"
        )


def partition_spec(
    shape,
    axes,
    mesh: Mesh | None,
    *,
    unit: int = 1,
    name: str = "tensor",
    fallbacks: list | None = None,
    strict: bool = False,
) -> P:
    """``PartitionSpec`` for one array of logical ``axes`` (None entries: replicated).

    ``unit`` is the head size, so head-axis dimensions split only between whole heads. Each mesh axis is used at
    most once per array (a later logical axis mapping to a used mesh axis stays replicated).
    """
    if len(axes) != len(shape):
        raise ValueError(f"{name}: logical axes {axes} do not match its shape {tuple(shape)}")
    used: set[str] = set()
    spec: list[str | None] = []
    for dim, logical in zip(shape, axes):
        target = RULES.get(logical) if logical is not None else None
        shards = axis_size(mesh, target) if target else 1
        if target is None or shards == 1 or target in used:
            spec.append(None)
            continue
        whole = unit if logical in _WHOLE_HEADS else 1
        if dim % whole or (dim // whole) % shards:
            fb = Fallback(name, logical, target, dim // whole, shards)
            if strict:
                raise ValueError(f"cannot shard {fb}; pick a mesh whose {target!r} size divides it")
            if fallbacks is not None:
                fallbacks.append(fb)
            spec.append(None)
            continue
        used.add(target)
        spec.append(target)
    return P(*spec)


def _path_names(path) -> tuple[str, ...]:
    return tuple(str(getattr(k, "key", getattr(k, "name", k))) for k in path)


def param_axes(table: Mapping[tuple[str, ...], tuple] | None, path: tuple[str, ...], ndim: int) -> tuple:
    """Logical axes of the leaf at ``path`` from a model's ``param_axes`` table (stacked layers add ``layers``; a
    split layer's weight, at ``("layers", "[i]", ...)``, has the table's axes as they are)."""
    if table is None:
        return (None,) * ndim
    if path and path[0] == "layers" and path[1:] in table:
        axes = ("layers", *table[path[1:]])
    elif len(path) > 1 and path[0] == "layers" and path[2:] in table:
        axes = table[path[2:]]
    else:
        axes = table.get(path, (None,) * ndim)
    return axes if len(axes) == ndim else (None,) * ndim


@dataclasses.dataclass(frozen=True)
class Plan:
    """Where each parameter goes on a mesh: ``specs`` (a pytree of ``PartitionSpec``), ``fallbacks``."""

    mesh: Mesh | None  # None: planned without a mesh (``plan(model, None)``: every tensor replicated)
    specs: Any
    fallbacks: tuple[Fallback, ...]

    @property
    def shardings(self):
        """``specs`` as ``NamedSharding``s on ``mesh`` (same tree)."""
        mesh = self.mesh
        if mesh is None:
            raise TypeError("a Plan made without a mesh has no shardings")
        return jax.tree.map(lambda s: NamedSharding(mesh, s), self.specs, is_leaf=lambda x: isinstance(x, P))


def _head_dim(config) -> int:
    return int(getattr(config, "head_dim", 1) or 1)


def plan_params(
    abstract_params,
    table,
    config,
    mesh: Mesh | None,
    *,
    replicate: bool = False,
    strict: bool = False,
    name: str = "model",
) -> Plan:
    """Shard plan for a params pytree (arrays or ``ShapeDtypeStruct``s) by the logical-axis table ``table``."""
    fallbacks: list[Fallback] = []
    unit = _head_dim(config)

    def one(path, leaf):
        names = _path_names(path)
        axes = (None,) * len(leaf.shape) if replicate else param_axes(table, names, len(leaf.shape))
        return partition_spec(
            leaf.shape, axes, mesh, unit=unit, name=f"{name}/{'/'.join(names)}", fallbacks=fallbacks, strict=strict
        )

    specs = jax.tree_util.tree_map_with_path(one, abstract_params)
    return Plan(mesh, specs, tuple(fallbacks))


def plan(model, mesh, *, replicate: bool = False, strict: bool = False) -> Plan:
    """The shard plan of ``model``'s parameters on ``mesh`` (a ``Mesh`` or a ``{"data", "model"}`` dict)."""
    return plan_params(
        model.params,
        getattr(model, "param_axes", None),
        model.config,
        make_mesh(mesh),
        replicate=replicate,
        strict=strict,
        name=model.name,
    )


def put(value, sharding: NamedSharding) -> jax.Array:
    """Place ``value`` with ``sharding``; across processes each process supplies its own addressable shards, so
    every process must pass the same value."""
    if isinstance(value, jax.Array) and value.sharding == sharding:
        return value
    if sharding.is_fully_addressable:
        return jax.device_put(value, sharding)
    host = np.asarray(value)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def shard(model, mesh, *, replicate: bool = False, strict: bool = False):
    """``model`` with its parameters placed on ``mesh`` by its plan (no-op for arrays already in place)."""
    p = plan(model, mesh, replicate=replicate, strict=strict)
    params = jax.tree.map(put, model.params, p.shardings)
    return model.replace(params=params)


def batch_spec(ndim: int) -> P:
    """``PartitionSpec`` of a per-row array of ``ndim`` dimensions: the leading (batch) axis over ``data``."""
    return P("data", *([None] * (ndim - 1)))


def cache_sharding(cache, mesh: Mesh):
    """``NamedSharding``s for a ``KVCache`` (``CACHE_AXES``); None for any other cache type (its layout is left
    to XLA's propagation from the parameters and inputs)."""
    if not isinstance(cache, KVCache):
        return None
    return jax.tree.map(lambda leaf: NamedSharding(mesh, partition_spec(leaf.shape, CACHE_AXES, mesh)), cache)


def constrain(tree, shardings):
    """``with_sharding_constraint`` where a sharding is given (inside jit)."""
    if shardings is None:
        return tree
    return jax.lax.with_sharding_constraint(tree, shardings)


def to_host(tree):
    """Fetch arrays to host NumPy; arrays spread over several processes are all-gathered first."""
    from jax.experimental import multihost_utils

    def one(x):
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            return np.asarray(multihost_utils.process_allgather(x, tiled=True))
        return np.asarray(jax.device_get(x))

    return jax.tree.map(one, tree)
