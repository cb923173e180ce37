"""The dtypes jaxspec models compute in: one table, read by every config, loader and checkpoint."""

from __future__ import annotations

import jax.numpy as jnp

# name -> JAX dtype of weights, activations and KV cache (logits are always float32)
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def check(dtype, arg: str = "dtype") -> str:
    """The name in ``DTYPES`` of ``dtype`` (a name, or a dtype such as ``jnp.bfloat16``); ``ValueError`` naming
    ``arg`` and the allowed names otherwise."""
    try:
        name = dtype if isinstance(dtype, str) else jnp.dtype(dtype).name
    except TypeError:
        name = None
    if name not in DTYPES:
        raise ValueError(f"{arg} must be one of {list(DTYPES)}, got {dtype!r}")
    return name
