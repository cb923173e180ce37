"""Rotary position embeddings (the rotate-half convention used by Llama, Qwen, Mistral and Gemma).

The inverse frequencies come from a small registry keyed by the Hugging Face ``rope_type``:

- ``default``: ``theta ** (-2i / head_dim)``;
- ``linear``: the default frequencies divided by ``factor`` (positions interpolated by ``1 / factor``);
- ``llama3``: Llama 3.1's band rescaling: wavelengths shorter than ``original_max_position_embeddings /
  high_freq_factor`` are kept, those longer than ``original_max_position_embeddings / low_freq_factor`` are divided
  by ``factor``, and the band in between is interpolated smoothly;
- ``factors``: the default frequencies divided one by one by ``factors`` (``head_dim // 2`` numbers), as GGUF files
  store Llama 3.1's scaling (llama.cpp's ``rope_freqs`` tensor: the converter computes the ``llama3`` band
  rescaling once and keeps the per-dimension divisors);
- ``yarn`` (YaRN: Qwen2.5/Qwen3 long-context settings, Mistral, ...): the frequencies whose wavelengths fit
  ``original_max_position_embeddings`` many times (more than ``beta_fast`` rotations) are kept, those with fewer
  than ``beta_slow`` rotations are divided by ``factor``, and the dimensions in between blend linearly (bounds
  rounded outward unless ``truncate`` is false); cos and sin are scaled by ``attention_factor``, by default
  ``0.1 ln(factor) + 1`` (or the ratio of that with ``mscale`` to that with ``mscale_all_dim`` when both are set);
- ``longrope`` (LongRoPE: Phi-3 128k, Phi-3.5, Phi-4-mini): the default frequencies divided one by one by
  ``short_factor`` at positions below ``original_max_position_embeddings`` and by ``long_factor`` from there on;
  cos and sin scaled by ``attention_factor``, by default ``sqrt(1 + ln(factor) / ln(original))``. The choice is per
  position, so a token's rotation depends on its position only (a speculative round and plain decoding agree):
  this is what transformers does while it decodes token by token after a prompt within the original length; a
  single pass over a longer prompt transformers rotates all with the long factors, and llama.cpp picks one set
  for the whole context by its size.

These are transformers' definitions (``modeling_rope_utils``), checked against its logits. Add a type with
``register_rope("name", fn, required=(...))`` where ``fn(head_dim, theta, **params)`` returns the ``[head_dim //
2]`` inverse frequencies, or a ``Rotation``.
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
      fn: ``fn(head_dim, theta, **params) -> [head_dim // 2]`` inverse frequencies (or a ``Rotation``).
      required, optional: the names of the ``rope_scaling`` parameters ``fn`` needs and may take.
    """

    fn: Callable[..., np.ndarray | Rotation]
    required: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()


ROPE_TYPES: dict[str, RopeType] = {}


@dataclasses.dataclass(frozen=True)
class Rotation:
    """What ``apply_rope`` rotates by.

    Attributes:
      inv_freq: ``[head_dim // 2]`` inverse frequencies.
      attention_factor: cos and sin are multiplied by it (YaRN, LongRoPE), so attention logits by its square.
      long_inv_freq, long_from: the inverse frequencies used from position ``long_from`` on (LongRoPE), or None.
    """

    inv_freq: np.ndarray
    attention_factor: float = 1.0
    long_inv_freq: np.ndarray | None = None
    long_from: int | None = None


def register_rope(name: str, fn: Callable[..., np.ndarray | Rotation], required=(), optional=()) -> None:
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


def _divisors(head_dim: int, factors, name: str = "rope factors") -> np.ndarray:
    factors = np.asarray(factors, np.float64)
    if factors.shape != (head_dim // 2,) or not np.all(np.isfinite(factors)) or np.any(factors <= 0):
        raise ValueError(
            f"{name} must be {head_dim // 2} finite numbers > 0 (one per frequency: the rotated dimensions // 2), "
            f"got {factors!r}"
        )
    return factors


def _factors(head_dim: int, theta: float, *, factors: tuple) -> np.ndarray:
    return _default(head_dim, theta) / _divisors(head_dim, factors)


def _yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _yarn(
    head_dim: int,
    theta: float,
    *,
    factor: float,
    original_max_position_embeddings: int,
    beta_fast: float | None = None,
    beta_slow: float | None = None,
    mscale: float | None = None,
    mscale_all_dim: float | None = None,
    attention_factor: float | None = None,
    truncate: bool = True,
) -> Rotation:
    if not factor > 0:
        raise ValueError(f"yarn factor must be > 0, got {factor!r}")
    beta_fast, beta_slow = beta_fast or 32.0, beta_slow or 1.0

    def dimension(rotations):  # the dimension whose wavelength fits the original length `rotations` times
        return head_dim * math.log(original_max_position_embeddings / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = dimension(beta_fast), dimension(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001
    interpolated = np.clip((np.arange(head_dim // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
    base = _default(head_dim, theta)
    inv_freq = base / factor * interpolated + base * (1 - interpolated)
    if attention_factor is None:
        if mscale and mscale_all_dim:
            attention_factor = _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
        else:
            attention_factor = _yarn_mscale(factor)
    return Rotation(inv_freq, float(attention_factor))


def _longrope(
    head_dim: int,
    theta: float,
    *,
    short_factor: tuple,
    long_factor: tuple,
    original_max_position_embeddings: int,
    factor: float | None = None,
    attention_factor: float | None = None,
) -> Rotation:
    base = _default(head_dim, theta)
    short = _divisors(head_dim, short_factor, "longrope short_factor")
    long = _divisors(head_dim, long_factor, "longrope long_factor")
    if attention_factor is None:
        factor, original = 1.0 if factor is None else factor, original_max_position_embeddings
        attention_factor = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original))
    return Rotation(base / short, float(attention_factor), base / long, int(original_max_position_embeddings))


register_rope("default", _default)
register_rope("linear", _linear, required=("factor",))
register_rope("factors", _factors, required=("factors",))
register_rope(
    "llama3",
    _llama3,
    required=("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
)
register_rope(
    "yarn",
    _yarn,
    required=("factor", "original_max_position_embeddings"),
    optional=("beta_fast", "beta_slow", "mscale", "mscale_all_dim", "attention_factor", "truncate"),
)
register_rope(
    "longrope",
    _longrope,
    required=("short_factor", "long_factor", "original_max_position_embeddings"),
    optional=("factor", "attention_factor"),
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


def rope_from_hf(c: dict) -> tuple[str, dict, float, float]:
    """``(rope_type, params, theta, partial_rotary_factor)`` of a Hugging Face ``config.json`` dict, from either
    ``rope_theta`` + ``rope_scaling`` (transformers 4) or ``rope_parameters`` (transformers 5); ``ValueError`` for
    an unknown type or missing parameters."""
    raw = c.get("rope_parameters") or c.get("rope_scaling") or {}
    if not isinstance(raw, dict):
        raise ValueError(f"rope_scaling / rope_parameters must be a dict or null, got {raw!r}")
    if raw and all(isinstance(v, dict) for v in raw.values()):
        raise ValueError(f"per-layer-type RoPE parameters are not supported (got keys {sorted(raw)})")
    params = dict(raw)
    theta = params.pop("rope_theta", None) or c.get("rope_theta") or 10000.0
    rope_type = params.pop("rope_type", None) or params.pop("type", None) or "default"
    params.pop("type", None)
    rope_type = {"su": "longrope"}.get(rope_type, rope_type)  # early Phi-3 128k configs name LongRoPE "su"
    partial = float(params.pop("partial_rotary_factor", None) or c.get("partial_rotary_factor") or 1.0)
    if rope_type not in ROPE_TYPES:
        raise ValueError(f"unsupported rope type {rope_type!r}; supported: {sorted(ROPE_TYPES)}")
    if rope_type in ("llama3", "yarn", "longrope"):
        # transformers' order: a top-level original_max_position_embeddings (Phi-3) first, then the parameters',
        # then max_position_embeddings; YaRN's and LongRoPE's factor defaults to max / original
        original = c.get("original_max_position_embeddings") or params.get("original_max_position_embeddings")
        params["original_max_position_embeddings"] = original or c.get("max_position_embeddings")
        if rope_type in ("yarn", "longrope") and params.get("factor") is None and c.get("max_position_embeddings"):
            params["factor"] = c["max_position_embeddings"] / params["original_max_position_embeddings"]
        params = {k: v for k, v in params.items() if v is not None}  # transformers writes unset ones as null
    if rope_type == "default":
        params = {}
    check_rope(rope_type, params)
    return rope_type, params, float(theta), partial


def rotation(head_dim: int, theta: float, rope_type: str = "default", **params) -> Rotation:
    """The ``Rotation`` for ``rope_type`` (see the module docstring)."""
    check_rope(rope_type, params)
    out = ROPE_TYPES[rope_type].fn(head_dim, theta, **params)
    if not isinstance(out, Rotation):
        out = Rotation(out)
    long = None if out.long_inv_freq is None else np.asarray(out.long_inv_freq, np.float64)
    return dataclasses.replace(out, inv_freq=np.asarray(out.inv_freq, np.float64), long_inv_freq=long)


def inverse_frequencies(head_dim: int, theta: float, rope_type: str = "default", **params) -> np.ndarray:
    """``[head_dim // 2]`` inverse frequencies for ``rope_type`` (see the module docstring; LongRoPE: its short
    ones)."""
    return rotation(head_dim, theta, rope_type, **params).inv_freq


def apply_rope(x: jax.Array, positions: jax.Array, rot: Rotation | np.ndarray) -> jax.Array:
    """Rotate ``x [B, T, H, D]`` by ``positions [B, T]`` with ``rot`` (a ``Rotation``, or inverse frequencies);
    computed in float32, returned in ``x.dtype``. Frequencies for fewer than ``D`` dimensions (a partial rotary
    embedding) rotate the first ``2 × len(inv_freq)`` of them, rotate-half within those, and pass the rest."""
    if not isinstance(rot, Rotation):
        rot = Rotation(np.asarray(rot))
    inv_freq = jnp.asarray(rot.inv_freq, jnp.float32)[None, None, :]
    if rot.long_inv_freq is not None:  # per position: the long frequencies from `long_from` on
        assert rot.long_from is not None, "a Rotation with long_inv_freq needs long_from"
        long = (positions >= rot.long_from)[:, :, None]
        inv_freq = jnp.where(long, jnp.asarray(rot.long_inv_freq, jnp.float32)[None, None, :], inv_freq)
    angles = positions.astype(jnp.float32)[:, :, None] * inv_freq
    cos = jnp.cos(angles)[:, :, None, :]
    sin = jnp.sin(angles)[:, :, None, :]
    if rot.attention_factor != 1.0:
        cos, sin = cos * rot.attention_factor, sin * rot.attention_factor
    half = len(rot.inv_freq)
    xf = x.astype(jnp.float32)
    x1, x2, rest = xf[..., :half], xf[..., half : 2 * half], xf[..., 2 * half :]
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest], axis=-1)
    return out.astype(x.dtype)
