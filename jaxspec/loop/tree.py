"""A tree round: the drafter's tree of candidate continuations (``Drafter.draft_tree``), one target pass over the
round's root and every node (``jaxspec.core.cache.TreePositions``: each node sees the committed prefix and its
ancestors, rotated at its depth), exact acceptance over the tree (``jaxspec.core.tree_acceptance``), then the
accepted path's cache entries moved into place so the next round sees a contiguous prefix.

Invariants are the chain round's (``jaxspec.loop.rounds``): with ``L`` tokens, the target cache holds positions
``0 .. L-2`` and the round's root is token ``L-1``, written by this pass at slot ``L-1``; node ``t`` is written at
slot ``L-1+t``. The accepted nodes ``path[0..n-1]`` (depths 1..n) then move to slots ``L .. L+n-1`` and the drafter
observes the target's features at the root and along the path, at their positions. A node whose slot would fall
past the cache's end is left out of the tree before acceptance (with its descendants): it could not see itself.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxspec.core.cache import KVCache, TreePositions, move_slots
from jaxspec.core.sampling import warp
from jaxspec.core.tree_acceptance import greedy_tree
from jaxspec.drafters.base import bad_logits
from jaxspec.loop.commit import commit, target_pass
from jaxspec.loop.state import LoopSpec, State


def tree_round(spec: LoopSpec, target_params, draft_params, state: State) -> State:
    """One tree round for every row (``spec.drafter.tree = (depth, branch, width)``, ``spec.gamma = depth``): the
    emitted tokens are the accepted path's then one drawn token, as a chain round's; ``drafted`` counts ``depth``
    per round (the longest path), so α is the accepted length over the tree's depth."""
    shape = spec.drafter.tree
    assert shape is not None  # round_step runs a tree round only for a drafter with a tree
    depth, branch, width = shape
    size, batch = spec.cache_len, state.tokens.shape[0]
    rows = jnp.arange(batch)
    active = ~state.done
    keys = jax.vmap(lambda k, r: jax.random.split(jax.random.fold_in(k, r), depth + 1))(state.row_keys, state.rounds)
    tree = spec.drafter.draft_tree(
        draft_params,
        state.draft_state,
        state.tokens,
        state.length,
        state.sampling,
        keys[:, :depth],
        spec.vocab_size,
        depth=depth,
        branch=branch,
        width=width,
    )
    nodes = tree.tokens.shape[1]  # N + 1, the root included
    base = state.length - 1  # the root's position and slot
    fits = base[:, None] + jnp.arange(nodes, dtype=jnp.int32)[None] < size
    parent = jnp.where(fits, tree.parent, -1)

    tokens = tree.tokens.at[:, 0].set(state.tokens[rows, base])
    positions = TreePositions.from_parents(parent, base, max_depth=depth)
    if not isinstance(state.target_cache, KVCache):
        raise TypeError("a tree round needs a target with a KVCache (a Llama-family model)")
    logits, feats, target_cache = target_pass(spec, target_params, tokens, positions, state.target_cache)
    logits = logits.astype(jnp.float32)

    def judged(logits):  # the acceptance rule over the warped distributions
        p = warp(logits, state.sampling)
        n, path, nxt = spec.acceptance.tree(
            keys[:, depth], parent, tree.tokens, tree.rank, tree.q, p, depth=depth, branch=branch
        )
        return n.astype(jnp.int32), path.astype(jnp.int32), nxt.astype(jnp.int32)

    # every row greedy: the argmax path, as any exact rule accepts it, without vocabulary-wide work per node
    all_greedy = jnp.all(jnp.broadcast_to(jnp.asarray(state.sampling.temperature) <= 0, (batch,)))
    n, path, nxt = jax.lax.cond(
        all_greedy, lambda logits: greedy_tree(logits, parent, tree.tokens, depth=depth), judged, logits
    )

    steps = jnp.arange(depth + 1, dtype=jnp.int32)
    accepted = steps[None, :depth] < n[:, None]
    # the node each emitted token comes from (the root, then the path), and the emitted tokens
    before = jnp.concatenate([jnp.zeros((batch, 1), jnp.int32), path], axis=1)  # [B, depth + 1]
    path_tokens = jnp.take_along_axis(tree.tokens, path, axis=1)
    cand = jnp.where(steps[None] < n[:, None], jnp.concatenate([path_tokens, nxt[:, None]], axis=1), nxt[:, None])
    decided = jnp.take_along_axis(logits, before[:, :, None], axis=1)  # the logits each emitted token came from
    token_logprobs = jnp.take_along_axis(jax.nn.log_softmax(decided, axis=-1), cand[:, :, None], axis=-1)[..., 0]
    used = steps[None] <= n[:, None]
    bad_target = active & jnp.any(bad_logits(decided) & used, axis=1)

    # the accepted nodes' entries to the slots after the root's; the rest of the tree's slots stay stale
    src = base[:, None] + path
    dst = jnp.where(accepted & active[:, None], base[:, None] + 1 + steps[None, :depth], size)
    target_cache = move_slots(target_cache, src, dst)
    draft_state = tree.state
    if feats is not None:
        seen = jnp.take_along_axis(feats, before[:, :, None], axis=1)
        at = jnp.where(used & active[:, None], base[:, None] + steps[None], size)
        draft_state = spec.drafter.observe(draft_state, seen, at)
    return commit(
        spec,
        state,
        cand,
        n,
        token_logprobs,
        drafted=jnp.full((batch,), depth, jnp.int32),
        full_rows=active,
        full=True,
        bad_target=bad_target,
        bad_draft=active & tree.bad,
        target_cache=target_cache,
        draft_state=draft_state,
    )
