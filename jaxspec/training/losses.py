"""Losses of draft training, shared by ``distill`` (online) and ``distill_offline``.

- ``divergence``: forward KL, reverse KL or total variation between the target's (p) and the draft's (q)
  temperature-warped next-token distributions, per position.
- ``token_nll``: the negative log-likelihood of given next tokens (cross-entropy against stored outputs).
- ``weighted_mean``: a per-position loss averaged under a weight mask (0 = not trained on).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

LOSSES = ("fkl", "rkl", "tvd")
"""The ``divergence`` kinds: forward KL(p‖q), reverse KL(q‖p), total variation ½Σ|p−q| (1 − TVD is the acceptance
probability of one draft token)."""


def divergence(kind: str, target_logits, draft_logits, temperature) -> jax.Array:
    """Per-position divergence ``[...]`` between the temperature-warped target (p) and draft (q) distributions.

    ``target_logits`` and ``draft_logits`` are ``[..., V]`` (any float dtype; computed in float32); ``temperature``
    is a positive scalar (may be traced); ``kind`` is one of ``LOSSES``.
    """
    log_p = jax.nn.log_softmax(target_logits.astype(jnp.float32) / temperature, axis=-1)
    log_q = jax.nn.log_softmax(draft_logits.astype(jnp.float32) / temperature, axis=-1)
    p, q = jnp.exp(log_p), jnp.exp(log_q)
    if kind == "fkl":
        return jnp.sum(p * (log_p - log_q), axis=-1)
    if kind == "rkl":
        return jnp.sum(q * (log_q - log_p), axis=-1)
    if kind == "tvd":
        return 0.5 * jnp.sum(jnp.abs(p - q), axis=-1)
    raise ValueError(f"loss must be one of {list(LOSSES)}, got {kind!r}")


def token_nll(logits, labels) -> jax.Array:
    """``-log softmax(logits)[labels]``: ``logits [..., V]``, ``labels [...]`` int (row indices into ``V``) ->
    ``[...]`` float."""
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.take_along_axis(logp, labels[..., None], axis=-1)[..., 0]


def weighted_mean(values, weight) -> jax.Array:
    """``Σ values·weight / max(Σ weight, 1)``, a scalar: the mean of a per-position loss over the positions
    trained on (``weight`` 1, or fractional for down-weighted ones; 0 for padding), 0 when there are none."""
    return jnp.sum(values * weight) / jnp.maximum(jnp.sum(weight), 1.0)
