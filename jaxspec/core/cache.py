"""Padded, preallocated KV cache with writes at per-row positions.

Slot ``s`` of row ``b`` holds the keys/values of the token at position ``s``. A query at position ``p`` sees
slots ``<= p``. Writes past the end of the cache are dropped (never clamped onto the last slot), so a row near
the end of its cache cannot corrupt earlier entries.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class KVCache:
    """Keys and values of every layer, stacked (a pytree).

    Attributes:
      k, v: ``[layers, batch, length, kv_heads, head_dim]``, same shape and dtype; slot ``s`` of row ``b`` holds
        the entry of the token at position ``s``.
    """

    k: jax.Array
    v: jax.Array

    @classmethod
    def zeros(cls, num_layers: int, batch: int, length: int, kv_heads: int, head_dim: int, dtype) -> KVCache:
        """An all-zero cache of the given sizes and dtype."""
        shape = (num_layers, batch, length, kv_heads, head_dim)
        return cls(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype))

    @property
    def length(self) -> int:
        """Slots per row (the most positions the cache holds)."""
        return self.k.shape[2]

    @property
    def nbytes(self) -> int:
        """Bytes of ``k`` and ``v`` together."""
        return 2 * self.k.size * self.k.dtype.itemsize


def write(layer_cache: jax.Array, new: jax.Array, positions: jax.Array) -> jax.Array:
    """Write ``new [B, T, H, D]`` into ``layer_cache [B, S, H, D]`` at ``positions [B, T]``; out-of-range drops."""
    rows = jnp.arange(new.shape[0])[:, None]
    return layer_cache.at[rows, positions].set(new.astype(layer_cache.dtype), mode="drop")


def write_layer(cache: jax.Array, layer: jax.Array, new: jax.Array, positions: jax.Array) -> jax.Array:
    """Like ``write`` into layer ``layer`` of a stacked ``cache [L, B, S, H, D]``, as one in-place scatter."""
    rows = jnp.arange(new.shape[0])[:, None]
    return cache.at[layer, rows, positions].set(new.astype(cache.dtype), mode="drop")


def causal_mask(positions: jax.Array, length: int) -> jax.Array:
    """``[B, T, S]`` bool: query at ``positions[b, t]`` may attend slot ``s`` iff ``s <= positions[b, t]``."""
    return jnp.arange(length, dtype=positions.dtype)[None, None, :] <= positions[:, :, None]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TreePositions:
    """Where the tokens of a tree pass sit (a pytree; given to a Llama-family model in place of ``positions``).

    A tree pass runs a round's root (the newest token, not yet in the cache) and its candidate continuations in one
    pass. Node ``t`` of row ``b`` is written to cache slot ``slots[b, t]`` and rotated at position ``rope[b, t]`` (the
    root's position plus its depth), and attends the committed prefix (every slot below the root's,
    ``slots[b, 0]``) and the nodes ``j`` with ``visible[b, t, j]`` (its ancestors and itself), nothing else: stale
    entries of earlier rounds and other branches stay unseen.

    A pass may also run only some nodes of a tree whose other nodes are in the cache already (a drafter growing its
    tree a level per pass): ``columns`` then names the slots of the nodes ``visible`` ranges over (with their
    ``column_rope``) and ``start`` the first slot past the committed prefix.

    Attributes:
      rope: ``[B, T]`` int32 positions for RoPE.
      slots: ``[B, T]`` int32 cache slots; node 0 is the root and ``slots[:, 0]`` the first slot past the prefix.
      visible: ``[B, T, N]`` bool: which nodes each query sees; without ``columns``, the pass's own (N = T).
      columns: ``[B, N]`` int32 slots of ``visible``'s nodes, or None (the pass's own: ``slots``).
      column_rope: ``[B, N]`` int32 their positions, or None (``rope``); given with ``columns``.
      start: ``[B]`` int32 the first slot past the committed prefix, or None (``slots[:, 0]``).
    """

    rope: jax.Array
    slots: jax.Array
    visible: jax.Array
    columns: jax.Array | None = None
    column_rope: jax.Array | None = None
    start: jax.Array | None = None

    def seen(self) -> tuple[jax.Array, jax.Array, jax.Array]:
        """``(columns, column_rope, start)`` with their defaults filled in."""
        columns = self.slots if self.columns is None else self.columns
        column_rope = self.rope if self.column_rope is None else self.column_rope
        return columns, column_rope, self.slots[:, 0] if self.start is None else self.start

    @classmethod
    def from_parents(cls, parent: jax.Array, base: jax.Array, max_depth: int) -> TreePositions:
        """The positions of a tree given each node's parent (``parent [B, N]`` int32, -1 for the root, node 0;
        parents listed before their children) with its root at position and slot ``base [B]``: node ``t`` at slot
        ``base + t``, rotated at ``base + depth(t)``, seeing its ancestors and itself. ``max_depth`` (static) bounds
        every node's depth."""
        n = parent.shape[1]
        node = jnp.broadcast_to(jnp.arange(n, dtype=parent.dtype), parent.shape)
        hops, depth = [node], jnp.zeros_like(parent)
        for _ in range(max_depth):  # walk up one generation per step; -1 once past the root
            up = jnp.take_along_axis(parent, jnp.maximum(hops[-1], 0), axis=1)
            up = jnp.where(hops[-1] >= 0, up, -1)
            depth = depth + (up >= 0)
            hops.append(up)
        ancestry = jnp.stack(hops, axis=-1)  # [B, N, max_depth + 1]
        visible = jnp.any(ancestry[:, :, None, :] == node[:, None, :, None], axis=-1)
        base = base.astype(jnp.int32)[:, None]
        return cls(base + depth.astype(jnp.int32), base + node.astype(jnp.int32), visible)


def rope_positions(positions) -> jax.Array:
    """The positions RoPE rotates by: ``positions`` itself, or a tree pass's ``rope``."""
    return positions.rope if isinstance(positions, TreePositions) else positions


def write_slots(positions) -> jax.Array:
    """The cache slots a pass writes: ``positions`` itself (slot = position), or a tree pass's ``slots``."""
    return positions.slots if isinstance(positions, TreePositions) else positions


def attention_mask(positions, length: int) -> jax.Array:
    """``[B, T, S]`` bool: ``causal_mask`` for positions; for ``TreePositions`` the prefix below the root's slot
    and the slots of the visible nodes."""
    if not isinstance(positions, TreePositions):
        return causal_mask(positions, length)
    columns, _, start = positions.seen()
    prefix = jnp.arange(length, dtype=columns.dtype)[None, None, :] < start[:, None, None]  # [B, 1, S]
    return prefix | _node_slots(positions.visible, columns, length)


def _node_slots(chosen: jax.Array, slots: jax.Array, length: int) -> jax.Array:
    """``[B, T, S]`` bool: for each query ``t``, the slots ``slots [B, N]`` of the nodes ``j`` with ``chosen[b, t,
    j]``."""
    at = slots[:, :, None] == jnp.arange(length, dtype=slots.dtype)[None, None, :]  # [B, N(node j), S]
    return jnp.einsum("btj,bjs->bts", chosen.astype(jnp.int32), at.astype(jnp.int32)) > 0


def window_mask(positions, length: int, window: int) -> jax.Array:
    """``[B, T, S]`` bool: the slots holding one of the ``window`` newest positions up to each query's (sliding-window
    attention); for ``TreePositions`` a node's slot holds its ``rope`` position, a prefix slot its own."""
    rope = rope_positions(positions)
    every = jnp.arange(length, dtype=rope.dtype)[None, None, :]
    recent = every > rope[:, :, None] - window
    if not isinstance(positions, TreePositions):
        return recent
    columns, column_rope, start = positions.seen()
    near = column_rope[:, None, :] > rope[:, :, None] - window  # [B, T(query), N(node j)]
    return jnp.where(every >= start[:, None, None], _node_slots(near, columns, length), recent)


def move_slots(cache: KVCache, src: jax.Array, dst: jax.Array) -> KVCache:
    """Copy every layer's entries at slots ``src [B, N]`` to slots ``dst [B, N]`` (all read before any is written;
    out-of-range destinations drop): how a tree pass's accepted path becomes a contiguous prefix."""
    rows = jnp.arange(src.shape[0])[:, None]

    def move(x):
        return x.at[:, rows, dst].set(x[:, rows, src], mode="drop")

    return KVCache(move(cache.k), move(cache.v))
