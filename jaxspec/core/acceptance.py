"""The vectorized rejection sampler: exact speculative acceptance for every row of a batch at once.

For draft tokens ``d_1..d_γ`` drawn from draft distributions ``q_0..q_{γ-1}`` and target distributions
``p_0..p_γ`` (both already warped by the same temperature/top-k/top-p):

  * draft token ``d_{i+1}`` is accepted with probability ``min(1, p_i(d) / q_i(d))``; ``n`` = leading accepts;
  * if ``n < γ`` the next token is drawn from ``normalize(max(0, p_n - q_n))``;
  * if ``n == γ`` (all accepted) a bonus token is drawn from ``p_γ``.

With one-hot (greedy) distributions this is exactly greedy verification. With ``γ = 0`` it is plain sampling.

A row may propose fewer drafts than the round verifies (``limit``, e.g. a drafter whose rows draft different
numbers of tokens, ``jaxspec.LookupFirst``): drafts from position ``limit`` on are never accepted, and
a row that accepts all its ``limit`` drafts draws its bonus token from ``p_limit``, so such a row is verified
exactly as a round of γ = ``limit`` would verify it.

``BlockVerifier`` decides the same round by block verification (Sun et al., "Block Verification Accelerates
Speculative Decoding", 2024): it judges each drafted prefix as a whole rather than token by token, which accepts
more drafts on average and never fewer, with the same exact output distribution. It is the loop's default; the
token-by-token rule stays available as ``RejectionSampler()``. A tree round is decided by recursive rejection
sampling under ``RejectionSampler`` and by traversal verification, block verification's rule for trees, under
``BlockVerifier`` (``jaxspec.core.tree_acceptance``).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxspec.core.sampling import sample
from jaxspec.core.tree_acceptance import accept_tree, traverse_tree


def _row_draws(key, draft_tokens, q, p):
    """What both chain rules draw and read first for one row: ``(u [γ], key_c, p_tok [γ], q_tok [γ])``, the
    uniforms that judge the drafts, the key of the correction (or bonus) draw, and ``p_i`` and ``q_i`` at each
    drafted token ``d_{i+1}``."""
    gamma = draft_tokens.shape[0]
    key_u, key_c = jax.random.split(key)
    u = jax.random.uniform(key_u, (gamma,), jnp.float32)
    p_tok = jnp.take_along_axis(p[:gamma], draft_tokens[:, None], axis=-1)[:, 0]
    q_tok = jnp.take_along_axis(q, draft_tokens[:, None], axis=-1)[:, 0]
    return u, key_c, p_tok, q_tok


@dataclasses.dataclass(frozen=True)
class RejectionSampler:
    """Acceptance rule as a static strategy (hashable, so it can be part of a compiled loop's key)."""

    def residual(self, p: jax.Array, q: jax.Array) -> jax.Array:
        """Unnormalized distribution of the correction token given target ``p`` and draft ``q`` (``[V]``)."""
        return jnp.maximum(p - q, 0.0)

    def accept_row(self, key, draft_tokens, q, p, limit=None):
        """One row: ``key``, ``draft_tokens [γ] int32``, ``q [γ, V]``, ``p [γ+1, V]`` -> ``(n, next)``, int32
        scalars: the number of leading accepted drafts and the correction (or bonus) token. A residual with no mass
        (``p_n <= q_n`` everywhere) falls back to drawing from ``p_n``. ``limit`` (an int32 scalar <= γ, or None
        for γ): the row's real drafts; the rest are never accepted (the module docstring)."""
        gamma = draft_tokens.shape[0]
        u, key_c, p_tok, q_tok = _row_draws(key, draft_tokens, q, p)
        accepted = u * q_tok < p_tok  # u < p/q without dividing; q_tok > 0 for a sampled token
        if limit is not None:
            accepted &= jnp.arange(gamma) < limit
        n = jnp.sum(jnp.cumprod(accepted.astype(jnp.int32)), dtype=jnp.int32)
        q_next = jnp.concatenate([q, jnp.zeros_like(p[:1])], axis=0)[n]  # zero q after the last draft: bonus
        if limit is not None:
            q_next = jnp.where(n < limit, q_next, 0.0)
        p_next = p[n]
        resid = self.residual(p_next, q_next)
        dist = jnp.where(jnp.sum(resid) > 0, resid, p_next)
        return n, sample(key_c, dist)

    def __call__(self, keys, draft_tokens, q, p, limits=None):
        """Batched ``accept_row``: ``keys [B]``, ``draft_tokens [B, γ]``, ``q [B, γ, V]``, ``p [B, γ+1, V]``,
        ``limits [B] int32`` or None -> ``n [B] int32, next [B] int32``."""
        if limits is None:
            return jax.vmap(self.accept_row)(keys, draft_tokens, q, p)
        return jax.vmap(self.accept_row)(keys, draft_tokens, q, p, limits)

    def tree(self, keys, parent, token, rank, q, p, *, depth: int, branch: int):
        """A tree round's acceptance (``jaxspec.core.tree_acceptance.accept_tree``: recursive rejection sampling of
        siblings drawn without replacement): ``(n [B], path [B, depth], next [B])``."""
        return accept_tree(keys, parent, token, rank, q, p, depth=depth, branch=branch)


@dataclasses.dataclass(frozen=True)
class BlockVerifier(RejectionSampler):
    """Block verification: the round's drafts judged as prefixes, each kept or dropped whole.

    With ``w_0 = 1`` and ``w_i = min(1, w_{i-1} p_{i-1}(d_i) / q_{i-1}(d_i))`` (the prefix's target-to-draft
    probability ratio, clipped at every step), ``r_i = max(0, w_i p_i - q_i)`` and ``R_i = Σ r_i``, the prefix of
    ``i`` drafts is a stopping point with probability ``h_i = R_i / (R_i + 1 - w_i)`` (``0 < i < γ``; 0 where that
    is 0 / 0) and ``h_γ = w_γ``; ``n`` is the longest prefix whose own uniform falls below its ``h_i`` (0 if none),
    and the next token is drawn from ``r_n`` (``n < γ``) or ``p_γ`` (``n = γ``). Only a prefix's ratio counts, so a
    draft the target undervalues can still be kept after tokens the draft undervalued, where the token rule would
    stop at it. The output has exactly the target's distribution, and for any draft model and target the expected
    number of accepted drafts is at least the token rule's (the paper's optimality result;
    ``tests/core/test_acceptance.py`` checks both against exact enumeration). Greedy (one-hot) rows accept exactly
    the longest matching prefix, as with the token rule. Trees are decided by the same rule carried to trees,
    traversal verification (``tree``).
    """

    def stop_probabilities(self, weight: jax.Array, mass: jax.Array) -> jax.Array:
        """``h_i`` for prefixes that end before the last draft: ``weight`` ``w_i`` and residual ``mass`` ``R_i``,
        both ``[γ]``, -> ``[γ]`` (only entries 1 .. γ-1 are used)."""
        denom = mass + (1.0 - weight)
        return jnp.where(denom > 0, mass / jnp.where(denom > 0, denom, 1.0), 0.0)

    def accept_row(self, key, draft_tokens, q, p, limit=None):
        """As ``RejectionSampler.accept_row`` (same arguments and results), by block verification."""
        gamma = draft_tokens.shape[0]
        if gamma <= 1:  # no drafts (a plain step), or one: the two rules are the same
            return super().accept_row(key, draft_tokens, q, p, limit)
        u, key_c, p_tok, q_tok = _row_draws(key, draft_tokens, q, p)
        ratio = jnp.where(q_tok > 0, p_tok / jnp.where(q_tok > 0, q_tok, 1.0), 0.0)
        weights = [jnp.float32(1.0)]  # w_0 .. w_γ; γ is static and small
        for i in range(gamma):  # a prefix the target rules out stays out, even before a ratio that overflows
            weights.append(jnp.where(weights[-1] > 0, jnp.minimum(weights[-1] * ratio[i], 1.0), 0.0))
        w = jnp.stack(weights)
        resid = self.residual(w[:gamma, None] * p[:gamma], q)  # [γ, V]: r_0 .. r_{γ-1}
        h = self.stop_probabilities(w[:gamma], jnp.sum(resid, axis=-1))
        last = jnp.int32(gamma) if limit is None else jnp.minimum(limit, gamma).astype(jnp.int32)
        steps = jnp.arange(1, gamma + 1)
        h_inner = jnp.concatenate([h[1:], jnp.zeros((1,), h.dtype)])  # h_1 .. h_{γ-1}, then a placeholder
        h = jnp.where(steps < last, h_inner, jnp.where(steps == last, w[1:], 0.0))
        n = jnp.max(jnp.where(u < h, steps, 0)).astype(jnp.int32)
        resid_next = jnp.concatenate([resid, jnp.zeros_like(p[:1])], axis=0)[n]
        p_next = p[n]
        dist = jnp.where((n < last) & (jnp.sum(resid_next) > 0), resid_next, p_next)
        return n, sample(key_c, dist)

    def tree(self, keys, parent, token, rank, q, p, *, depth: int, branch: int):
        """A tree round's acceptance by traversal verification (``jaxspec.core.tree_acceptance.traverse_tree``):
        each node judged by its path's clipped ratio, leaf to root; the same results as ``RejectionSampler.tree``."""
        return traverse_tree(keys, parent, token, rank, q, p, depth=depth, branch=branch)
