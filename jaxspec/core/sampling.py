"""Logit warping (temperature, top-k, top-p) and categorical draws, all with traced parameters.

The same ``warp`` is applied to the target's and the draft's logits, so speculative output equals plain
sampling from the warped target. Each parameter is either one value shared by every row or one value per row
(the leading axis of the logits), so greedy and sampled rows share a batch and new values never recompile.

Rule, per row (applied in this order):
  * temperature <= 0: a one-hot on the argmax of the raw logits (top-k and top-p unused); the rejection sampler
    then reduces exactly to greedy verification (accept while the draft equals the target's argmax);
  * otherwise, on ``logits / temperature``:
      - top-k (k > 0): keep every token whose logit is >= the k-th largest logit (ties at the boundary are kept);
      - top-p (p < 1): on the top-k-filtered distribution, sorted descending, keep the smallest prefix whose
        mass reaches p (a token is kept if the mass strictly before it is < p); ties with the last kept logit
        are kept too;
    then the softmax. A row with neither filter on (k <= 0 and p >= 1) gets the plain softmax of
    ``logits / temperature``; the filter runs only when some row of the call turns it on.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

NEG_INF = -jnp.inf


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """Traced sampling parameters (a pytree): changing their values never recompiles (changing their shapes does).

    Each field is a scalar (one value for every row) or ``[B]`` (one value per row of the logits given to
    ``warp``); fields may mix the two.

    Attributes:
      temperature: float32 ``[]`` or ``[B]``; ``<= 0`` means greedy (argmax of the raw logits; top-k and top-p
        unused).
      top_k: int32 ``[]`` or ``[B]``; ``<= 0`` means off, values above the vocabulary size keep every token.
      top_p: float32 ``[]`` or ``[B]``; ``>= 1`` means off.
      grammar: None, or the rows' constraint automata standing at the state of each row (``[B, V]`` logits) or of
        each position (``[B, T, V]``): tokens a state does not allow are masked before warping
        (``jaxspec.core.grammar``). The loop attaches it for the calls it makes; a drafter that draws several
        tokens in turn advances it along its own draws (``Grammar.advanced``).
    """

    temperature: jax.Array
    top_k: jax.Array
    top_p: jax.Array
    grammar: Any = None

    @classmethod
    def create(cls, temperature=1.0, top_k=None, top_p=None, batch: int | None = None) -> SamplingParams:
        """From Python numbers or per-row sequences/arrays; ``None`` turns top-k / top-p off (0 / 1.0).

        With ``batch=N`` every field is broadcast to ``[N]``; without it, numbers stay scalars and sequences
        become 1-D arrays. No validation (the host API checks).
        """

        def field(value, off, dtype):
            x = jnp.asarray(off if value is None else value, dtype)
            return x if batch is None else jnp.broadcast_to(x, (batch,))

        return cls(field(temperature, 1.0, jnp.float32), field(top_k, 0, jnp.int32), field(top_p, 1.0, jnp.float32))

    def advanced(self, tokens: jax.Array) -> SamplingParams:
        """These parameters after each row drew ``tokens [B]``: the grammar (if any) advanced along them."""
        return self if self.grammar is None else dataclasses.replace(self, grammar=self.grammar.advanced(tokens))


def _per_row(x: jax.Array, ndim: int) -> jax.Array:
    """A scalar or ``[B]`` parameter shaped to broadcast over logits of ``ndim`` axes: ``[1, ..]`` or ``[B, 1, ..]``."""
    return jnp.reshape(x, jnp.shape(x) + (1,) * (ndim - jnp.ndim(x)))


def _check_shapes(params: SamplingParams, logits_shape: tuple) -> None:
    for field in dataclasses.fields(params):
        if field.name == "grammar":
            continue
        shape = jnp.shape(getattr(params, field.name))
        if shape == () or (len(shape) == 1 and len(logits_shape) >= 2 and shape[0] == logits_shape[0]):
            continue
        raise ValueError(
            f"SamplingParams.{field.name} must be a scalar or [B] with B = logits.shape[0]; got shape {shape} for "
            f"logits of shape {logits_shape}"
        )


_ITERATIONS = 32  # bisection steps over float32's 2**32 ordered keys: the exact threshold


def _keys(x: jax.Array) -> jax.Array:
    """uint32 keys ordered as the float32 values ``x`` are (-0.0 and +0.0 one key; NaNs at the ends)."""
    bits = jax.lax.bitcast_convert_type(jnp.where(x == 0, 0.0, x), jnp.uint32)  # -0.0 becomes +0.0
    return jnp.where(bits >> 31 == 1, ~bits, bits | jnp.uint32(0x80000000))


def _bisect(holds, shape: tuple) -> jax.Array:
    """The largest key ``t`` with ``holds(t)``, for a ``holds`` true at key 0 and false from some key on (one per
    row: ``shape``), in ``_ITERATIONS`` halvings of ``[0, 2**32)``."""

    def step(_, bounds):
        lo, hi = bounds
        mid = lo + (hi - lo) // 2
        ok = holds(mid)
        return jnp.where(ok, mid, lo), jnp.where(ok, hi, mid)

    start = (jnp.zeros(shape, jnp.uint32), jnp.full(shape, 0xFFFFFFFF, jnp.uint32))
    return jax.lax.fori_loop(0, _ITERATIONS, step, start)[0]


def _filter(scaled: jax.Array, top_k: jax.Array, top_p: jax.Array) -> jax.Array:
    """Top-k then top-p on ``scaled [..., V]``; ``top_k`` / ``top_p`` broadcast against it (last axis 1).

    No sort (on XLA:CPU, sorting a 49k vocabulary at every position of a verify cost more than the target's pass): both
    thresholds are found by bisection over the values' order-preserving integer keys, each step one masked count or
    sum over the vocabulary. The k-th largest logit is the largest key that at least k logits reach. The top-p
    threshold is the smallest key whose strictly larger logits hold mass < p: in the module's sorted-order rule,
    the last token whose mass strictly before it is < p."""
    vocab = scaled.shape[-1]
    keys = _keys(scaled)
    rows = scaled.shape[:-1] + (1,)
    k = jnp.clip(jnp.where(top_k > 0, top_k, vocab), 1, vocab)
    kth = _bisect(lambda t: jnp.sum(keys >= t, axis=-1, keepdims=True) >= k, rows)
    probs = jax.nn.softmax(jnp.where(keys >= kth, scaled, NEG_INF), axis=-1)
    # the last key whose larger logits hold mass >= p (the mass at key 0 is the whole); the threshold is the next
    above = _bisect(lambda t: jnp.sum(jnp.where(keys > t, probs, 0.0), axis=-1, keepdims=True) >= top_p, rows)
    pth = jnp.where(top_p < 1.0, above + 1, 0)  # p >= 1: off, whatever the rounding of the mass
    return jnp.where(keys >= jnp.maximum(kth, pth), scaled, NEG_INF)


def warp(logits: jax.Array, params: SamplingParams) -> jax.Array:
    """Warped probabilities ``[B, ..., V]`` float32 from logits ``[B, ..., V]`` (any float dtype), by the module's
    rule. Each field of ``params`` is a scalar or ``[B]`` (row b's value applies to ``logits[b]``, whatever the
    middle axes, e.g. ``[B, V]`` or ``[B, γ+1, V]``); with scalars only, ``logits`` may have any shape ``[..., V]``.

    The filter (``_filter``) runs (``lax.cond``) only when some row has top-k or top-p on; the other rows take the
    plain softmax, selected per row. Raises ``ValueError`` (at trace time) for a field of another shape.
    """
    logits = logits.astype(jnp.float32)
    _check_shapes(params, logits.shape)
    if params.grammar is not None:
        logits = params.grammar.mask(logits)
    temperature, top_k, top_p = (_per_row(x, logits.ndim) for x in (params.temperature, params.top_k, params.top_p))
    greedy = temperature <= 0
    scaled = logits / jnp.where(greedy, 1.0, temperature)
    needs_filter = (top_k > 0) | (top_p < 1.0)
    filtered = jax.lax.cond(jnp.any(needs_filter), lambda x: _filter(x, top_k, top_p), lambda x: x, scaled)
    probs = jax.nn.softmax(jnp.where(needs_filter, filtered, scaled), axis=-1)
    onehot = jax.nn.one_hot(jnp.argmax(logits, axis=-1), logits.shape[-1], dtype=jnp.float32)
    return jnp.where(greedy, onehot, probs)


_BLOCK = 256


def sample(key: jax.Array, probs: jax.Array) -> jax.Array:
    """One categorical draw from ``probs [V]`` (unnormalized is fine; zeros are never drawn): an int32 scalar.

    Two-level inverse CDF: a uniform picks a block of 256 tokens by block mass, a second uniform picks the token
    inside it (two random numbers per draw, see ``docs/guides/design.md``). Cumulative sums stay short (≤ 256 terms or
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
