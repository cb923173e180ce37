"""Logit warping (temperature, top-k, top-p) and categorical draws, all with traced parameters.

The same ``warp`` is applied to the target's and the draft's logits, so speculative output equals plain
sampling from the warped target. Temperature 0 warps to a one-hot on the argmax: the rejection sampler then
reduces exactly to greedy verification (accept while the draft equals the target's argmax).

Filtering rule (applied in this order, on ``logits / temperature``):
  * top-k (k > 0): keep every token whose logit is >= the k-th largest logit (ties at the boundary are kept);
  * top-p (p < 1): on the top-k-filtered distribution, sort descending and keep the smallest prefix whose
    mass reaches p (a token is kept if the mass strictly before it is < p); ties with the last kept logit are
    kept too.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

NEG_INF = -jnp.inf


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """Traced sampling parameters (a pytree): changing their values never recompiles.

    Attributes:
      temperature: float32 scalar; ``<= 0`` means greedy (argmax of the raw logits; top-k and top-p unused).
      top_k: int32 scalar; ``<= 0`` means off, values above the vocabulary size keep every token.
      top_p: float32 scalar; ``>= 1`` means off.
    """

    temperature: jax.Array
    top_k: jax.Array
    top_p: jax.Array

    @classmethod
    def create(cls, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None):
        """Scalars from Python numbers; ``None`` turns top-k / top-p off. No validation (the host API checks)."""
        return cls(
            jnp.asarray(temperature, jnp.float32),
            jnp.asarray(0 if top_k is None else top_k, jnp.int32),
            jnp.asarray(1.0 if top_p is None else top_p, jnp.float32),
        )


def _filter(scaled: jax.Array, top_k: jax.Array, top_p: jax.Array) -> jax.Array:
    vocab = scaled.shape[-1]
    desc = -jnp.sort(-scaled, axis=-1)
    k = jnp.clip(jnp.where(top_k > 0, top_k, vocab), 1, vocab)
    kth = jnp.take(desc, k - 1, axis=-1)[..., None]
    desc_k = jnp.where(desc >= kth, desc, NEG_INF)
    probs_desc = jax.nn.softmax(desc_k, axis=-1)
    mass_before = jnp.cumsum(probs_desc, axis=-1) - probs_desc
    n_keep = jnp.maximum(jnp.sum(mass_before < top_p, axis=-1, keepdims=True), 1)
    pth = jnp.take_along_axis(desc_k, n_keep - 1, axis=-1)
    threshold = jnp.maximum(kth, pth)
    return jnp.where(scaled >= threshold, scaled, NEG_INF)


def warp(logits: jax.Array, params: SamplingParams) -> jax.Array:
    """Warped probabilities ``[..., V]`` float32 from logits ``[..., V]`` (any float dtype), by the module's rule;
    a one-hot on the argmax of ``logits`` when ``temperature <= 0``."""
    logits = logits.astype(jnp.float32)
    greedy = params.temperature <= 0
    scaled = logits / jnp.where(greedy, 1.0, params.temperature)
    needs_filter = (params.top_k > 0) | (params.top_p < 1.0)
    scaled = jax.lax.cond(needs_filter, lambda x: _filter(x, params.top_k, params.top_p), lambda x: x, scaled)
    probs = jax.nn.softmax(scaled, axis=-1)
    onehot = jax.nn.one_hot(jnp.argmax(logits, axis=-1), logits.shape[-1], dtype=jnp.float32)
    return jnp.where(greedy, onehot, probs)


_BLOCK = 256


def sample(key: jax.Array, probs: jax.Array) -> jax.Array:
    """One categorical draw from ``probs [V]`` (unnormalized is fine; zeros are never drawn): an int32 scalar.

    Two-level inverse CDF: a uniform picks a block of 256 tokens by block mass, a second uniform picks the token
    inside it (two random numbers per draw, see ``docs/design.md``). Cumulative sums stay short (≤ 256 terms or
    one per block), so rounding is small and a one-hot (greedy) distribution returns its index exactly. Vectorize
    over rows with ``jax.vmap``.
    """
    vocab = probs.shape[-1]
    num_blocks = -(-vocab // _BLOCK)
    blocks = jnp.pad(probs.astype(jnp.float32), (0, num_blocks * _BLOCK - vocab)).reshape(num_blocks, _BLOCK)
    u = jax.random.uniform(key, (2,), jnp.float32)
    block_end = jnp.cumsum(blocks.sum(axis=-1))
    block = jnp.minimum(jnp.sum(block_end <= _below(u[0], block_end[-1])), num_blocks - 1)
    inner = jnp.cumsum(blocks[block])
    index = jnp.minimum(jnp.sum(inner <= _below(u[1], inner[-1])), _BLOCK - 1)
    return (block * _BLOCK + index).astype(jnp.int32)


def _below(u: jax.Array, total: jax.Array) -> jax.Array:
    """``u * total`` kept strictly below ``total``, so the first cumulative sum above it has positive mass."""
    return jnp.minimum(u * total, jnp.nextafter(total, jnp.float32(0)))
