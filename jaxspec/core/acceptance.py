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
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxspec.core.sampling import sample
from jaxspec.core.tree_acceptance import accept_tree


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
        key_u, key_c = jax.random.split(key)
        u = jax.random.uniform(key_u, (gamma,), jnp.float32)
        p_tok = jnp.take_along_axis(p[:gamma], draft_tokens[:, None], axis=-1)[:, 0]
        q_tok = jnp.take_along_axis(q, draft_tokens[:, None], axis=-1)[:, 0]
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
