"""Exact acceptance over a draft tree: recursive rejection sampling of siblings drawn without replacement.

A row's tree has a root (node 0: the last verified token) and nodes ``1..N`` in topological order (``parent[i] <
i``). The children of a node were drawn from the drafter's warped distribution there, ``q[node]``, *without
replacement* (``draw_children``: Gumbel-top-k, so their ``rank`` 0, 1, ... is the order of sequential draws), and
the target's verify pass gives its warped distribution at every node, ``p[node]``.

From the root, at the current node ``u`` with residual ``r = p[u]`` and proposal ``q' = q[u]``, the children are
tried in rank order: child token ``x`` is accepted with probability ``min(1, r(x) / q'(x))``, and the walk moves to
that child; on a rejection ``r <- normalize(max(r - q', 0))`` and ``q' <- q'`` without ``x``, renormalized (the
distribution the next sibling was drawn from, given the earlier ones). When no child is accepted (or ``u`` has
none: a leaf) the next token is drawn from ``r``. Each sibling step is an ordinary speculative-sampling step with
target ``r`` and proposal ``q'``, so by induction the token leaving ``u`` is distributed exactly as ``p[u]`` and the
output (the accepted path's tokens, then the drawn token) is plain sampling from the target. With one-hot ``p``
(greedy) it accepts the child that is the target's argmax, whatever ``q``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxspec.core.sampling import sample


def draw_children(key, q, k: int):
    """``k`` distinct tokens drawn from ``q [..., V]`` without replacement, in the order sequential draws would give
    them (Gumbel-top-k), ``[..., k] int32``. Tokens with ``q = 0`` come last (and only when fewer than ``k`` have
    mass): the caller leaves such children out of the tree."""
    gumbel = jax.random.gumbel(key, q.shape, jnp.float32)
    scores = jnp.where(q > 0, jnp.log(jnp.maximum(q, 1e-38)) + gumbel, -jnp.inf)
    return jax.lax.top_k(scores, k)[1].astype(jnp.int32)


def _normalized(x, fallback):
    total = jnp.sum(x)
    return jnp.where(total > 0, x / jnp.where(total > 0, total, 1.0), fallback)


def accept_tree_row(key, parent, token, rank, q, p, *, depth: int, branch: int, wrong_rule: str | None = None):
    """One row. ``parent [N+1] int32`` (``parent[0]`` unused; ``-1`` marks a node that is not in the tree),
    ``token [N+1] int32`` (``token[0]`` unused), ``rank [N+1] int32`` (a node's place among its siblings, in draw
    order), ``q [N+1, V]``, ``p [N+1, V]`` (warped, float32); ``depth``: the deepest node's depth, ``branch``: the most
    children a node has (both static). Returns ``(n, path [depth] int32, next)``: the number of accepted nodes, their
    indices root-down (0 past ``n``), and the drawn token. ``wrong_rule`` (tests only: the negative controls):
    ``"with_replacement"`` keeps ``q'`` unchanged after a rejected sibling (the siblings taken for independent
    draws), ``"no_residual"`` keeps ``r = p[u]`` after a rejection."""
    nodes = parent.shape[0]
    index = jnp.arange(nodes)

    def child(u, j):
        hit = (parent == u) & (rank == j) & (index > 0)
        return jnp.where(jnp.any(hit), jnp.argmax(hit), -1)

    # one level per step of a loop, one sibling per step of an inner one: the program holds one level's work
    # whatever the tree's shape (unrolled, each level's vocabulary-wide steps compiled again)
    def level(d, carry):
        key, u, n, done, out, path = carry

        def sibling(j, inner):
            key, r, proposal, chosen = inner
            c = child(u, j)
            live = (c >= 0) & (chosen < 0) & ~done
            x = token[jnp.maximum(c, 0)]
            key, sub = jax.random.split(key)
            accept = live & (jax.random.uniform(sub, (), jnp.float32) * proposal[x] < r[x])
            chosen = jnp.where(accept, c, chosen)
            reject = live & ~accept
            if wrong_rule != "no_residual":
                r = jnp.where(reject, _normalized(jnp.maximum(r - proposal, 0.0), r), r)
            if wrong_rule != "with_replacement":
                proposal = jnp.where(reject, _normalized(proposal.at[x].set(0.0), proposal), proposal)
            return key, r, proposal, chosen

        key, r, _, chosen = jax.lax.fori_loop(0, branch, sibling, (key, p[u], q[u], jnp.int32(-1)))
        moved = (chosen >= 0) & ~done
        if depth > 0:  # the deepest level (d = depth) has no children: moved is False there
            path = jnp.where(moved, path.at[jnp.minimum(d, depth - 1)].set(chosen), path)
        key, sub = jax.random.split(key)
        stop = ~done & ~moved
        out = jnp.where(stop, sample(sub, r), out)
        n = n + moved.astype(jnp.int32)
        u = jnp.where(moved, chosen, u)
        return key, u, n, done | stop, out, path

    start = (key, jnp.int32(0), jnp.int32(0), jnp.bool_(False), jnp.int32(0), jnp.zeros((depth,), jnp.int32))
    _, _, n, _, out, path = jax.lax.fori_loop(0, depth + 1, level, start)
    return n, path, out


def accept_tree(keys, parent, token, rank, q, p, *, depth: int, branch: int):
    """Batched ``accept_tree_row`` over a leading row axis of every argument: ``(n [B], path [B, depth], next
    [B])``."""
    return jax.vmap(lambda *a: accept_tree_row(*a, depth=depth, branch=branch))(keys, parent, token, rank, q, p)
