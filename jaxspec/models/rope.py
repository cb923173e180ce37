"""Rotary position embeddings (the rotate-half convention used by Llama, Qwen, Mistral and Gemma)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def inverse_frequencies(head_dim: int, theta: float) -> np.ndarray:
    """``[head_dim // 2]`` float32 inverse frequencies ``theta ** (-2i / head_dim)``."""
    return 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))


def apply_rope(x: jax.Array, positions: jax.Array, inv_freq: np.ndarray) -> jax.Array:
    """Rotate ``x [B, T, H, D]`` by ``positions [B, T]``; computed in float32, returned in ``x.dtype``."""
    angles = positions.astype(jnp.float32)[:, :, None] * jnp.asarray(inv_freq, jnp.float32)[None, None, :]
    cos = jnp.cos(angles)[:, :, None, :]
    sin = jnp.sin(angles)[:, :, None, :]
    xf = x.astype(jnp.float32)
    half = x.shape[-1] // 2
    x1, x2 = xf[..., :half], xf[..., half:]
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x.dtype)
