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
