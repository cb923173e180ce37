"""Growing a draft tree a level per pass, shared by the drafters that branch (``EagleDrafter``, ``ModelDrafter``):
EAGLE-2's dynamic tree in fixed shapes, with the allocation rule exact tree acceptance needs (either rule of
``jaxspec.core.tree_acceptance``).

From the root's distribution the root gets ``branch`` children; each further level offers every node of the level
above ``branch`` children and keeps the ``width`` most promising, down to ``depth`` levels (``branch + (depth - 1)
× width`` nodes, node ``i`` of level ``k``: ``1 .. branch`` for level 1, then ``width`` per level).

A node's children are the top ``branch`` tokens by the drafter's log-probability for a greedy row, and ``branch``
draws without replacement from the warped q for a sampled row (Gumbel-top-k, in draw order). Which of them a level
keeps is decided before they are drawn, from what the level above already fixed: a node's score (the sum of its
path's log-probabilities under the drafter) plus the log of the j-th largest probability of its distribution ranks
its j-th child, so a node keeps a prefix of its children in draw order, and how many it keeps does not depend on
which tokens they are. Greedy, that rank is the child's own cumulative log-probability, as EAGLE-2 ranks. A
candidate outside the drafter's vocabulary (greedy) or of zero q (sampled) is left out of the tree (parent -1), and
so are its descendants.

Each level's pass runs only that level's nodes (``TreePositions`` with ``columns``: a node sees the drafter's
verified prefix, the nodes of earlier levels that are its ancestors, in the cache from their own passes, and
itself); levels 2 .. depth-1 have the same shapes and run as one loop, compiled once.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec.core.cache import TreePositions
from jaxspec.core.sampling import warp
from jaxspec.drafters.base import bad_logits


def grow(
    root_logits: jax.Array,
    level_pass: Callable,
    carry,
    sampling,
    keys: jax.Array,
    base: jax.Array,
    *,
    depth: int,
    branch: int,
    width: int,
):
    """The tree grown from ``root_logits [B, V]`` (the drafter's logits after the round's root, over the target's
    vocabulary). ``level_pass(carry, tokens [B, count], parent [B, count], first, positions) -> (logits [B, count, V],
    carry)`` runs the drafter over one level's nodes ``first .. first + count - 1`` (``parent``: their parents'
    node indices, 0 the root, -1 for a node left out; ``positions``: node ``i`` at slot ``base + i - 1``, rotated at
    ``base`` + its level - 1, seeing the slots below ``base`` and its ancestors') and returns their logits over the
    target's vocabulary and the drafter's carry (its cache, ...). ``keys [B, depth]``: one per level and row.

    Returns ``(tokens, parent, rank, q, carry, bad)`` as ``TreeProposal`` holds them (``bad``: non-finite logits in
    a pass, at a node in the tree). When every row is greedy no distribution is warped or drawn from (a level's
    vocabulary-wide work is one log-softmax and one top-k) and ``q`` stays zeros."""
    batch = root_logits.shape[0]
    greedy = jnp.broadcast_to(jnp.asarray(sampling.temperature) <= 0, (batch,))[:, None, None]
    all_greedy = jnp.all(greedy)
    nodes = branch + (depth - 1) * width

    def expand(level_keys, logits_u, q_u):
        """Per node ``[B, F, ...]``: ``(tokens, own log-probability, ranking term)`` of its ``branch`` children, in
        draw order; the ranking term of the j-th is the log of the j-th largest probability (-inf where no such
        child exists)."""
        logp = jax.nn.log_softmax(logits_u.astype(jnp.float32), axis=-1)
        logq = jnp.log(jnp.maximum(q_u, 1e-38))
        gumbel = jax.vmap(lambda k: jax.random.gumbel(k, q_u.shape[1:], jnp.float32))(level_keys)
        allowed = jnp.where(greedy, jnp.isfinite(logp), q_u > 0)  # the drafter's vocabulary; the warped q's support
        own = jnp.where(allowed, jnp.where(greedy, logp, logq), -jnp.inf)
        _, tok = jax.lax.top_k(jnp.where(allowed, jnp.where(greedy, logp, logq + gumbel), -jnp.inf), branch)
        ranked = jax.lax.top_k(own, branch)[0]
        return tok.astype(jnp.int32), jnp.take_along_axis(own, tok, axis=-1), ranked

    def expand_greedy(logits_u):
        """``expand`` when every row is greedy: the top ``branch`` tokens by log-probability, whose ranking terms
        are their own log-probabilities; no draw, and no q (greedy acceptance reads only the target's argmax)."""
        logp = jax.nn.log_softmax(logits_u.astype(jnp.float32), axis=-1)
        own, tok = jax.lax.top_k(jnp.where(jnp.isfinite(logp), logp, -jnp.inf), branch)
        return tok.astype(jnp.int32), own, own

    def children(level_keys, logits_u, q, first):
        """``(tokens, own, ranked)`` of ``expand`` and ``q`` with the nodes' warped distributions written from node
        ``first`` on; when every row is greedy, ``expand_greedy`` and ``q`` unchanged (zeros)."""

        def drawn(logits_u, q):
            q_u = warp(logits_u, sampling)
            return *expand(level_keys, logits_u, q_u), jax.lax.dynamic_update_slice_in_dim(q, q_u, first, axis=1)

        return jax.lax.cond(all_greedy, lambda u, q: (*expand_greedy(u), q), drawn, logits_u, q)

    bad = bad_logits(root_logits)
    q = jnp.zeros((batch, nodes + 1, root_logits.shape[-1]), jnp.float32)
    tok1, own1, _, q = children(keys[:, 0], root_logits[:, None], q, 0)
    node_tok = jnp.zeros((batch, nodes + 1), jnp.int32).at[:, 1 : branch + 1].set(tok1[:, 0])
    live1 = jnp.isfinite(own1[:, 0])
    parent = jnp.full((batch, nodes + 1), -1, jnp.int32).at[:, 1 : branch + 1].set(jnp.where(live1, 0, -1))
    rank = jnp.zeros((batch, nodes + 1), jnp.int32).at[:, 1 : branch + 1].set(jnp.arange(branch, dtype=jnp.int32))
    score = jnp.full((batch, nodes + 1), -jnp.inf).at[:, 0].set(0.0).at[:, 1 : branch + 1].set(own1[:, 0])

    level_of = np.concatenate([[0], np.ones(branch), 2 + np.arange((depth - 1) * width) // width]).astype(np.int32)
    columns = base[:, None] + jnp.arange(nodes, dtype=jnp.int32)[None]  # the slots of nodes 1..N
    column_rope = base[:, None] + jnp.asarray(level_of[1:] - 1)[None]

    def positions_of(parent, at, level):
        hops = [jnp.broadcast_to(at[None], (batch, at.shape[0]))]
        for _ in range(depth - 2):  # a node of the deepest level with a pass (depth - 1) has depth - 2 ancestors
            up = jnp.take_along_axis(parent, jnp.maximum(hops[-1], 0), axis=1)
            hops.append(jnp.where(hops[-1] > 0, up, -1))
        ancestry = jnp.stack(hops, axis=-1)  # [B, count, hops]
        node = jnp.arange(1, nodes + 1, dtype=jnp.int32)
        visible = jnp.any(ancestry[:, :, None, :] == node[None, None, :, None], axis=-1)  # [B, count, N]
        rope = jnp.broadcast_to(base[:, None] + level - 1, hops[0].shape)
        return TreePositions(rope, base[:, None] + hops[0] - 1, visible, columns, column_rope, base)

    def level_step(state, level, first, count: int):
        """Level ``level``'s pass over its ``count`` nodes ``first ..`` and the ``width`` children of level
        ``level + 1`` it keeps."""
        node_tok, parent, rank, score, q, carry, bad = state
        take = functools.partial(jax.lax.dynamic_slice_in_dim, start_index=first, slice_size=count, axis=1)
        own_parent = take(parent)
        positions = positions_of(parent, first + jnp.arange(count, dtype=jnp.int32), level)
        out, carry = level_pass(carry, take(node_tok), own_parent, first, positions)
        live = own_parent >= 0
        bad = bad | jnp.any(bad_logits(out) & live, axis=1)
        tok, own, ranked, q = children(keys[:, level], out, q, first)  # [B, count, branch]
        above = take(score)[:, :, None]
        total = jnp.where(live[:, :, None], above + ranked, -jnp.inf)
        best, pick = jax.lax.top_k(total.reshape(batch, count * branch), width)
        owner, child_rank = pick // branch, pick % branch
        kept = jnp.isfinite(best)
        own_score = jnp.take_along_axis((above + own).reshape(batch, -1), pick, axis=1)

        def put(x, value):
            return jax.lax.dynamic_update_slice_in_dim(x, value.astype(x.dtype), first + count, axis=1)

        node_tok = put(node_tok, jnp.take_along_axis(tok.reshape(batch, -1), pick, axis=1))
        parent = put(parent, jnp.where(kept, first + owner, -1))
        rank = put(rank, child_rank)
        score = put(score, jnp.where(kept, own_score, -jnp.inf))
        return node_tok, parent, rank, score, q, carry, bad

    state = (node_tok, parent, rank, score, q, carry, bad)
    if depth > 1:
        state = level_step(state, 1, 1, branch)
    if depth > 2:  # levels 2 .. depth-1 have the same shapes: one loop, compiled once
        state = jax.lax.fori_loop(
            2, depth, lambda level, s: level_step(s, level, 1 + branch + (level - 2) * width, width), state
        )
    node_tok, parent, rank, _, q, carry, bad = state
    return node_tok, parent, rank, q, carry, bad


def check_tree(tree) -> tuple[int, int, int]:
    """``tree`` as ``(depth, branch, width)`` ints, or ``ValueError`` naming ``tree``: depth >= 1 levels, branch >= 1
    children offered per node, width >= 1 nodes kept per level below the first, at most the ``branch²`` the first
    level offers (the tree has ``branch + (depth - 1) × width`` nodes)."""
    parts = list(tree) if isinstance(tree, (tuple, list)) else []
    if len(parts) != 3 or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 1 for x in parts):
        raise ValueError(f"tree must be (depth, branch, width), three ints >= 1, got {tree!r}")
    depth, branch, width = parts
    if depth > 1 and width > branch * branch:
        raise ValueError(f"tree={tree!r}: width {width} is more than the {branch * branch} nodes level 2 can hold")
    return depth, branch, width


def parse_tree(text: str) -> tuple[int, int, int]:
    """``"DEPTH,BRANCH,WIDTH"`` as ``check_tree``'s shape (``ValueError`` naming ``tree`` otherwise)."""
    try:
        parts = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"tree must be DEPTH,BRANCH,WIDTH (three ints >= 1), got {text!r}") from None
    return check_tree(parts)
