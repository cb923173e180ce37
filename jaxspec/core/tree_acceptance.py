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

``traverse_tree_row`` decides the same tree by traversal verification (Weng et al., "Traversal Verification for
Speculative Tree Decoding", 2025), block verification's rule carried to trees: a node is judged by its path's
clipped ratio, leaf to root, so a child the target values more than the drafter can make up for a parent it valued
less, and a node whose whole subtree was rejected can still be kept. It accepts more nodes on average, with the same
exact output.
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


def traverse_tree_row(key, parent, token, rank, q, p, *, depth: int, branch: int, wrong_rule: str | None = None):
    """As ``accept_tree_row`` (same arguments and results), by traversal verification: the tree is walked depth
    first, children in draw order, each node judged after its subtree (post-order).

    Every node on the walk's current path holds a weight ``w``, a target ``r`` and a proposal ``q'`` (the root:
    ``1, p[0], q[0]``). A child with token ``x`` enters with ``w_c = min(1, w r(x) / q'(x))`` and its own ``p``,
    ``q``. A node with no child left to try is kept with probability ``w`` (the root always): the round accepts its
    path and draws the next token from its ``r``. Otherwise it is given up, and its parent, with ``ρ = max(0, w r -
    q')`` and ``R = Σ ρ``, moves to ``w <- R / (R + 1 - w)``, ``r <- ρ / R``, and ``q'`` without ``x``,
    renormalized (the distribution its next child was drawn from). A child of weight 0 is given up without walking
    its subtree (every node in it has weight 0).

    Why it is exact, by induction over subtrees: a node of weight ``w`` whose remaining children are drawn from
    ``q'`` is kept-or-below with first-token measure ``w r`` and given up with probability ``1 - w``. A leaf does so
    by its rule. A child drawn from ``q'`` is kept-or-below with measure ``q'(x) w_c = min(q', w r)(x)`` and given up
    with probability ``F = 1 - w + R``, the same whatever its subtree's shape; what the node still owes is ``ρ``,
    which the rest (weight ``R / F``, target ``ρ / R``, the next sibling drawn from ``q'`` without ``x``) pays as
    ``F · (R / F) · ρ / R``, leaving ``F (1 - R / F) = 1 - w`` given up. With one child a node, this is
    ``jaxspec.core.acceptance.BlockVerifier``'s chain rule. With one-hot ``p`` (greedy) only the target's argmax
    child has weight above 0, and it has weight 1 (a greedy row's children are the drafter's top tokens, not draws,
    so its ``q'`` may be 0 there: the ratio is then taken as infinite), so it accepts the argmax path as
    ``accept_tree_row`` does.

    No vocabulary-wide state is kept: ``w r = max(0, A p - B(t) q)`` at every step, with scalars ``A`` and ``B`` for
    the tokens still in ``q'`` (``q' = q / s`` there, ``s`` the mass left) and one ``B`` per given-up child (by
    induction: ``ρ / F`` has that form with ``A / F`` and ``(B + 1 / s) / F``, or ``B / F`` for a given-up token).
    A step is scalar work and one sum over a row of ``p`` and ``q``; the drawn token's distribution is built once.

    ``wrong_rule`` (tests only: the negative controls): ``"with_replacement"`` keeps ``q'`` after a child is given
    up, ``"no_reweight"`` keeps the parent's ``w``."""
    nodes = parent.shape[0]
    index = jnp.arange(nodes)
    levels = depth + 1
    slots = jnp.arange(branch)

    def child(u, j):
        hit = (parent == u) & (rank == j) & (index > 0) & (j < branch)
        return jnp.where(jnp.any(hit), jnp.argmax(hit), -1)

    def safe_div(a, b):
        return jnp.where(b > 0, a / jnp.where(b > 0, b, 1.0), 0.0)

    def step(state):
        key, d, at, tried, w, a, b, s, lost, lost_b, done = state
        u = at[d]
        c = child(u, tried[d])
        has_child = c >= 0
        x = token[jnp.maximum(c, 0)]
        p_x, q_x = p[u, x], q[u, x]  # x is not a given-up token: siblings are distinct
        target_x = jnp.maximum(a[d] * p_x - b[d] * q_x, 0.0)  # w r(x)
        proposal_x = safe_div(q_x, s[d])
        # q'(x) = 0 only where the children were not drawn from q (a greedy row's top tokens): weight 1 if r(x) > 0
        w_c = jnp.where(
            proposal_x > 0, jnp.minimum(1.0, safe_div(target_x, proposal_x)), jnp.where(target_x > 0, 1.0, 0.0)
        )
        descend = has_child & (w_c > 0)
        key, k_keep = jax.random.split(key)
        keep = ~has_child & ((jax.random.uniform(k_keep, (), jnp.float32) < w[d]) | (d == 0))
        fail = (has_child & ~descend) | (~has_child & ~keep)
        # a child given up (weight 0, or its subtree walked and the child itself not kept): its parent moves on
        lv = jnp.where(has_child, d, jnp.maximum(d - 1, 0))
        x_lost = jnp.where(has_child, x, token[u])
        row_p, row_q = p[at[lv]], q[at[lv]]
        inv_s = safe_div(1.0, s[lv])
        if wrong_rule == "with_replacement":
            inv_s = jnp.where(s[lv] > 0, 1.0, 0.0)  # q' stays q: every token's B grows alike
        b_kept = b[lv] + inv_s  # ρ's B for the tokens still in q' (x_lost among them)
        mass = jnp.sum(jnp.maximum(a[lv] * row_p - b_kept * row_q, 0.0))
        # the given-up tokens, whose B did not grow: the children tried there, but for the one on the path below
        given_up = tried[lv] - (lv < d).astype(jnp.int32)
        g = lost[lv]
        live = slots < given_up
        if wrong_rule == "with_replacement":
            live = jnp.zeros_like(live)
        p_g, q_g = row_p[g], row_q[g]
        mass = mass + jnp.sum(
            jnp.where(
                live,
                jnp.maximum(a[lv] * p_g - lost_b[lv] * q_g, 0.0) - jnp.maximum(a[lv] * p_g - b_kept * q_g, 0.0),
                0.0,
            )
        )
        failed = 1.0 - w[lv] + mass
        scale = jnp.where(failed > 0, 1.0 / jnp.where(failed > 0, failed, 1.0), 1.0)
        w_lv = jnp.where(failed > 0, mass * scale, w[lv])
        if wrong_rule == "no_reweight":
            scale = jnp.where(mass > 0, w[lv] / jnp.where(mass > 0, mass, 1.0), 1.0)
            w_lv = w[lv]
        s_lv = s[lv] if wrong_rule == "with_replacement" else s[lv] - q[at[lv], x_lost]
        slot = jnp.minimum(given_up, branch - 1)
        lost_lv = lost[lv].at[slot].set(x_lost)
        lost_b_lv = (lost_b[lv] * scale).at[slot].set(b_kept * scale)

        def put(arr, at_level, value, when):
            return jnp.where(when, arr.at[at_level].set(value), arr)

        w = put(w, lv, w_lv, fail)
        a = put(a, lv, a[lv] * scale, fail)
        b = put(b, lv, b_kept * scale, fail)
        s = put(s, lv, s_lv, fail)
        lost = put(lost, lv, lost_lv, fail)
        lost_b = put(lost_b, lv, lost_b_lv, fail)
        tried = jnp.where(has_child, tried.at[d].add(1), tried)
        below = jnp.minimum(d + 1, levels - 1)  # a child entering: its own p and q, weight w_c, nothing given up
        at = put(at, below, c, descend)
        tried = put(tried, below, 0, descend)
        w = put(w, below, w_c, descend)
        a = put(a, below, w_c, descend)
        b = put(b, below, 0.0, descend)
        s = put(s, below, 1.0, descend)
        d = d + descend.astype(jnp.int32) - (~has_child & ~keep).astype(jnp.int32)
        return key, d, at, tried, w, a, b, s, lost, lost_b, done | keep

    key, k_next = jax.random.split(key)
    zeros = jnp.zeros((levels,), jnp.float32)
    start = (
        key,
        jnp.int32(0),
        jnp.zeros((levels,), jnp.int32),  # the path's nodes
        jnp.zeros((levels,), jnp.int32),  # children tried, per node on the path
        zeros.at[0].set(1.0),  # w
        zeros.at[0].set(1.0),  # A
        zeros,  # B
        jnp.ones((levels,), jnp.float32),  # s
        jnp.zeros((levels, branch), jnp.int32),  # the given-up children's tokens
        jnp.zeros((levels, branch), jnp.float32),  # and their B
        jnp.bool_(False),
    )
    _, n, at, tried, _, a, b, _, lost, lost_b, _ = jax.lax.while_loop(lambda st: ~st[-1], step, start)
    u = at[n]
    given_up = jnp.where(slots < tried[n], lost[n], p.shape[-1])  # unused slots point past the vocabulary
    b_row = jnp.full(p.shape[-1:], b[n]).at[given_up].set(lost_b[n], mode="drop")
    target = jnp.maximum(a[n] * p[u] - b_row * q[u], 0.0)  # the kept node's w r: p, or what its given-up children left
    path = jnp.where(jnp.arange(1, levels) <= n, at[1:], 0)
    return n, path, sample(k_next, _normalized(target, p[u]))


def greedy_tree(logits, parent, token, *, depth: int):
    """The round of rows that are all greedy, without warping: ``(n [B], path [B, depth], next [B])`` as both rules
    give them for one-hot ``p`` (``accept_tree``, ``traverse_tree``), from the target's logits ``[B, N+1, V]``. A
    node is on the target's argmax path when its token is its parent's argmax and its parent is on it (the root is);
    siblings are distinct, so those nodes form one path from the root, its deepest node the last accepted and its
    argmax the next token. No q is read: with one-hot ``p`` neither rule's choice depends on it."""
    top = jnp.argmax(logits, axis=-1).astype(jnp.int32)  # [B, N+1]: the one-hot p's token, as ``warp`` takes it
    index = jnp.arange(parent.shape[1])[None]
    up = jnp.maximum(parent, 0)
    match = (index > 0) & (parent >= 0) & (token == jnp.take_along_axis(top, up, axis=1))
    on_path, level = index == 0, jnp.zeros_like(parent)
    for _ in range(depth):  # a node of depth d is settled after d steps
        on_path = (index == 0) | (match & jnp.take_along_axis(on_path, up, axis=1))
        level = jnp.where(index == 0, 0, jnp.take_along_axis(level, up, axis=1) + 1)
    level = jnp.where(on_path, level, -1)
    n = jnp.max(level, axis=1)
    at = on_path[:, None, :] & (level[:, None, :] == jnp.arange(1, depth + 1)[None, :, None])  # [B, depth, N+1]
    path = jnp.where(jnp.any(at, axis=-1), jnp.argmax(at, axis=-1), 0).astype(jnp.int32)
    nxt = jnp.take_along_axis(top, jnp.argmax(level, axis=1)[:, None], axis=1)[:, 0]
    return n.astype(jnp.int32), path, nxt


def traverse_tree(keys, parent, token, rank, q, p, *, depth: int, branch: int):
    """Batched ``traverse_tree_row`` over a leading row axis of every argument: ``(n [B], path [B, depth], next
    [B])``."""
    return jax.vmap(lambda *a: traverse_tree_row(*a, depth=depth, branch=branch))(keys, parent, token, rank, q, p)
