"""Rotary position embeddings (the rotate-half convention used by Llama, Qwen, Mistral and Gemma).

The inverse frequencies come from a small registry keyed by the Hugging Face ``rope_type``:

- ``default``: ``theta ** (-2i / head_dim)``;
- ``linear``: the default frequencies divided by ``factor`` (positions interpolated by ``1 / factor``);
- ``llama3``: Llama 3.1's band rescaling: wavelengths shorter than ``original_max_position_embeddings /
  high_freq_factor`` are kept, those longer than ``original_max_position_embeddings / low_freq_factor`` are divided
  by ``factor``, and the band in between is interpolated smoothly;
- ``factors``: the default frequencies divided one by one by ``factors`` (``head_dim // 2`` numbers), as GGUF files
  store Llama 3.1's scaling (llama.cpp's ``rope_freqs`` tensor: the converter computes the ``llama3`` band
  rescaling once and keeps the per-dimension divisors).

Add a type with ``register_rope("name", fn, required=(...))`` where ``fn(head_dim, theta, **params)`` returns the
``[head_dim // 2]`` inverse frequencies.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class RopeType:
    """A registered rope type.

    Attributes:
      fn: ``fn(head_dim, theta, **params) -> [head_dim // 2]`` inverse frequencies.
      required, optional: the names of the ``rope_scaling`` parameters ``fn`` needs and may take.
    """

    fn: Callable[..., np.ndarray]
    required: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()


ROPE_TYPES: dict[str, RopeType] = {}


def register_rope(name: str, fn: Callable[..., np.ndarray], required=(), optional=()) -> None:
    """Add (or replace) the rope type ``name`` in ``ROPE_TYPES`` (see ``RopeType``)."""
    ROPE_TYPES[name] = RopeType(fn, tuple(required), tuple(optional))


def _default(head_dim: int, theta: float) -> np.ndarray:
    return 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))


def _linear(head_dim: int, theta: float, *, factor: float) -> np.ndarray:
    return _default(head_dim, theta) / factor


def _llama3(
    head_dim: int,
    theta: float,
    *,
    factor: float,
    low_freq_factor: float,
    high_freq_factor: float,
    original_max_position_embeddings: int,
) -> np.ndarray:
    inv_freq = _default(head_dim, theta)
    low_freq_wavelen = original_max_position_embeddings / low_freq_factor
    high_freq_wavelen = original_max_position_embeddings / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (original_max_position_embeddings / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return np.where(medium, smoothed, scaled)


def _factors(head_dim: int, theta: float, *, factors: tuple) -> np.ndarray:
    factors = np.asarray(factors, np.float64)
    if factors.shape != (head_dim // 2,) or not np.all(np.isfinite(factors)) or np.any(factors <= 0):
        raise ValueError(f"rope factors must be head_dim // 2 = {head_dim // 2} finite numbers > 0, got {factors!r}")
    return _default(head_dim, theta) / factors


register_rope("default", _default)
register_rope("linear", _linear, required=("factor",))
register_rope("factors", _factors, required=("factors",))
register_rope(
    "llama3",
    _llama3,
    required=("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
)


def check_rope(rope_type: str, params: dict) -> None:
    """Raise ``ValueError`` for an unknown rope type, a missing parameter or an unexpected one."""
    if rope_type not in ROPE_TYPES:
        raise ValueError(f"unsupported rope type {rope_type!r}; supported: {sorted(ROPE_TYPES)}")
    spec = ROPE_TYPES[rope_type]
    missing = [k for k in spec.required if params.get(k) is None]
    if missing:
        raise ValueError(f"rope type {rope_type!r} needs parameter(s) {missing}, got {sorted(params)}")
    extra = sorted(set(params) - set(spec.required) - set(spec.optional))
    if extra:
        raise ValueError(f"rope type {rope_type!r} does not take parameter(s) {extra}")


def inverse_frequencies(head_dim: int, theta: float, rope_type: str = "default", **params) -> np.ndarray:
    """``[head_dim // 2]`` inverse frequencies for ``rope_type`` (see the module docstring)."""
    check_rope(rope_type, params)
    return np.asarray(ROPE_TYPES[rope_type].fn(head_dim, theta, **params), np.float64)


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
