"""Exact acceptance over a draft tree (``jaxspec.core.tree_acceptance``): the output follows the target, under both
rules (recursive rejection sampling, ``accept_tree_row``; traversal verification, ``traverse_tree_row``).

A target and a drafter over 5 tokens are tables of distributions by prefix (up to 3 tokens). Each sample drafts a
fixed-shape tree (the root's 3 children, 2 under the first, 1 under the second, 1 under the first's first: depth
3) with ``draw_children`` from the drafter's distribution at each node's prefix, then accepts it against the
target's. The first output token must follow the target at the root, the second (when the first was an accepted
node) the target after the first; a chi-square test of each at α = 1e-3, and the same tests must catch each rule's
negative controls (siblings treated as independent draws: the proposal not renormalized after a rejection; the
residual not taken after a rejection; a node's weight kept after its child is given up).
Each rule's mean accepted count matches its expectation, computed exactly by a recursion written here, and
traversal's is the higher. Greedy (one-hot target) accepts the path of the target's argmax tokens.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats

from jaxspec.core.tree_acceptance import accept_tree_row, draw_children, greedy_tree, traverse_tree_row

V = 5
PARENT = np.array([-1, 0, 0, 0, 1, 1, 2, 4], np.int32)  # node i's parent (node 0: the root)
RANK = np.array([0, 0, 1, 2, 0, 1, 0, 0], np.int32)  # its place among its siblings
DEPTH, BRANCH = 3, 3
SAMPLES = 20_000
ALPHA = 1e-3
RULES = {"recursive": accept_tree_row, "traversal": traverse_tree_row}
WRONG = {"recursive": ("with_replacement", "no_residual"), "traversal": ("with_replacement", "no_reweight")}


def _tables(seed: int, peak: float):
    """``[prefix code] -> [V]`` distributions for prefixes of 0..3 tokens (code: 1 + base-V digits, offset by
    length), Dirichlet draws sharpened by ``peak``."""
    rng = np.random.default_rng(seed)
    count = sum(V**k for k in range(DEPTH + 1))
    x = rng.dirichlet(np.ones(V), size=count) ** peak
    return (x / x.sum(-1, keepdims=True)).astype(np.float32)


def _code(prefix_codes, token):
    """The code of a prefix extended by ``token`` (prefix codes: 0 for the empty prefix)."""
    return prefix_codes * V + 1 + token


def _draft_tree(key, p_table, q_table):
    """One sampled tree: ``(token, q, p)`` per node, the children of each node drawn without replacement from
    the drafter's distribution at its prefix."""
    code = [jnp.int32(0)]
    token = [jnp.int32(0)]
    keys = jax.random.split(key, len(PARENT))
    for node in range(1, len(PARENT)):
        u = int(PARENT[node])
        siblings = int(np.sum(PARENT[1:] == u))
        tok = draw_children(keys[u], q_table[code[u]], siblings)[RANK[node]]
        token.append(tok)
        code.append(_code(code[u], tok))
    codes = jnp.stack(code)
    return jnp.stack(token), q_table[codes], p_table[codes]


@functools.cache
def _sampler(rule: str, wrong: str | None):
    def one(key, p_table, q_table):
        k_tree, k_accept = jax.random.split(key)
        token, q, p = _draft_tree(k_tree, p_table, q_table)
        parent, rank = jnp.asarray(PARENT), jnp.asarray(RANK)
        if rule == "greedy":  # the all-greedy round's rule: the target's argmax path, from logits (here log p)
            n, path, nxt = (x[0] for x in greedy_tree(jnp.log(p)[None], parent[None], token[None], depth=DEPTH))
            return n, jnp.concatenate([token[path], nxt[None]])
        n, path, nxt = RULES[rule](k_accept, parent, token, rank, q, p, depth=DEPTH, branch=BRANCH, wrong_rule=wrong)
        return n, jnp.concatenate([token[path], nxt[None]])  # accepted tokens (past n: ignored), the drawn one

    return jax.jit(jax.vmap(one, in_axes=(0, None, None)))


def _run(p_table, q_table, seed, rule, wrong=None):
    keys = jax.random.split(jax.random.key(seed), SAMPLES)
    n, seq = _sampler(rule, wrong)(keys, jnp.asarray(p_table), jnp.asarray(q_table))
    return np.asarray(n), np.asarray(seq)


def _p_values(p_table, n, seq):
    """Chi-square p-values of the first output token against the target at the root, and of the second against the
    target after the first (over the samples whose first token was an accepted node, by first token)."""
    # the output: the n accepted tokens, then the drawn one (at index DEPTH)
    first = np.where(n >= 1, seq[:, 0], seq[:, DEPTH])
    second = np.where(n >= 2, seq[:, 1], seq[:, DEPTH])
    p_table = p_table.astype(np.float64) / p_table.sum(-1, keepdims=True, dtype=np.float64)
    p_first = scipy.stats.chisquare(np.bincount(first, minlength=V), p_table[0] * len(first)).pvalue
    stat, dof = 0.0, 0
    for x in range(V):
        rows = second[(n >= 1) & (first == x)]
        if len(rows) < 200:
            continue
        expected = p_table[_code(0, x)] * len(rows)
        stat += scipy.stats.chisquare(np.bincount(rows, minlength=V), expected).statistic
        dof += V - 1
    assert dof >= 2 * (V - 1)  # the second token is tested after at least two first tokens
    return p_first, scipy.stats.chi2.sf(stat, dof)


def _children(node: int) -> list:
    """The subtree under ``node`` as nested lists of children, each node's in rank order (from PARENT and RANK)."""
    return [_children(int(c)) for c in sorted(np.flatnonzero(PARENT == node), key=lambda c: RANK[c])]


SHAPE = _children(0)  # node 1 (children 4, 5; 4 has 7), node 2 (child 6), node 3: [[[[]], []], [[]], []]


def _expected_accepted(p_table, q_table, rule: str) -> float:
    """E[n] over the tree's draws and the rule's uniforms, by recursion over the children still to try (each drawn
    from the proposal left by the earlier ones): a child ``x`` is drawn with ``q'(x)``; traversal keeps at or below
    it with its weight ``w_c = min(1, w r(x) / q'(x))`` (the node's rule: ``w`` for a node without children left,
    after which its parent moves to ``R / (R + 1 - w)``, ``ρ / R``), recursive rejection sampling keeps it with
    ``min(1, r(x) / q'(x))`` and then for sure."""
    p_table = p_table.astype(np.float64) / p_table.sum(-1, keepdims=True, dtype=np.float64)
    q_table = q_table.astype(np.float64) / q_table.sum(-1, keepdims=True, dtype=np.float64)

    def value(code, level, w, r, proposal, children):
        """E[n · 1{kept at this node or below}] for a node at ``level`` kept-or-below with probability ``w``."""
        if not children:
            return w * level
        total = 0.0
        for x in range(V):
            if proposal[x] == 0:
                continue
            ratio = r[x] / proposal[x]
            kept = min(1.0, w * ratio) if rule == "traversal" else min(1.0, ratio)
            child = _code(code, x)
            inside = value(
                child, level + 1, kept if rule == "traversal" else 1.0, p_table[child], q_table[child], children[0]
            )
            total += proposal[x] * (inside if rule == "traversal" else kept * inside)
            rest = proposal.copy()
            rest[x] = 0.0
            rest /= rest.sum()
            rho = np.maximum(w * r - proposal, 0.0) if rule == "traversal" else np.maximum(r - proposal, 0.0)
            mass = rho.sum()
            w_rest = mass / (mass + 1.0 - w) if rule == "traversal" else 1.0
            r_rest = rho / mass if mass > 0 else r
            total += proposal[x] * (1.0 - kept) * value(code, level, w_rest, r_rest, rest, children[1:])
        return total

    return value(0, 0, 1.0, p_table[0], q_table[0], SHAPE)


@pytest.mark.parametrize("rule", list(RULES))
def test_tree_output_follows_the_target(rule):
    p_table, q_table = _tables(1, 1.5), _tables(2, 3.0)  # a peaky drafter that often disagrees
    n, seq = _run(p_table, q_table, seed=11, rule=rule)
    p_first, p_second = _p_values(p_table, n, seq)
    assert p_first > ALPHA and p_second > ALPHA, (p_first, p_second)
    assert 0.3 < np.mean(n >= 1) < 0.99 and np.mean(n >= 2) > 0.03  # siblings and depth both used


@pytest.mark.parametrize("rule, wrong", [(rule, wrong) for rule in RULES for wrong in WRONG[rule]])
def test_negative_controls_are_caught(rule, wrong):
    """Siblings verified as if drawn with replacement; the residual not taken after a rejection (recursive); the
    weight kept after a child is given up (traversal)."""
    p_table, q_table = _tables(1, 1.5), _tables(2, 3.0)
    n, seq = _run(p_table, q_table, seed=11, rule=rule, wrong=wrong)
    p_first, p_second = _p_values(p_table, n, seq)
    assert min(p_first, p_second) < 1e-6, (p_first, p_second)


def test_traversal_accepts_more_than_recursive_rejection(seed=4):
    """Each rule's mean accepted count matches its exact expectation, and traversal's is higher. The drafter is
    flatter than the target here, so a child the target values more than the drafter follows a parent it valued less
    (where the two rules differ)."""
    p_table, q_table = _tables(seed, 2.0), _tables(seed + 10, 0.7)
    expected = {rule: _expected_accepted(p_table, q_table, rule) for rule in RULES}
    for rule in RULES:
        n, _ = _run(p_table, q_table, seed=seed, rule=rule)
        assert abs(n.mean() - expected[rule]) < 5 * n.std() / np.sqrt(len(n)), (rule, n.mean(), expected[rule])
    assert expected["traversal"] > expected["recursive"] + 0.02, expected


@pytest.mark.parametrize("drafter", ["sampled", "one-hot"])
def test_greedy_accepts_the_targets_argmax_path(drafter):
    """Both rules keep the deepest node on the target's argmax path, the same trees giving the same depths, and so
    does ``greedy_tree`` (the all-greedy round's rule) from the target's logits, without q. With the drafter
    one-hot, the tree's other children have q = 0 (a greedy row's children are the drafter's top tokens, not draws):
    the target's argmax among them is still accepted (here the root's argmax, 0, is its second child, after the
    drafter's 4)."""
    p_table = np.eye(V, dtype=np.float32)[np.argmax(_tables(6 if drafter == "sampled" else 4, 1.5), -1)]
    q_table = _tables(2, 3.0)
    if drafter == "one-hot":
        q_table = np.eye(V, dtype=np.float32)[np.argmax(q_table, -1)]
    runs = {rule: _run(p_table, q_table, seed=5, rule=rule) for rule in RULES}
    (n, seq), (n_traversal, seq_traversal) = runs["recursive"], runs["traversal"]
    if drafter == "sampled":  # paths of every length
        assert min(np.bincount(n, minlength=DEPTH + 1)[1:]) > 100, np.bincount(n)
    else:
        assert (n == 1).all(), np.bincount(n)
    np.testing.assert_array_equal(n_traversal, n)
    np.testing.assert_array_equal(seq_traversal, seq)
    n_greedy, seq_greedy = _run(p_table, q_table, seed=5, rule="greedy")
    np.testing.assert_array_equal(n_greedy, n)
    np.testing.assert_array_equal(seq_greedy[:, DEPTH], seq[:, DEPTH])
    for k in range(DEPTH):  # past n, path entries are unused
        kept = n > k
        np.testing.assert_array_equal(seq_greedy[kept, k], seq[kept, k])
    for i in range(200):
        prefix = 0
        out = list(seq[i, : n[i]]) + [seq[i, DEPTH]]
        for tok in out:  # every output token is the target's argmax after the ones before it
            assert tok == np.argmax(p_table[prefix])
            prefix = _code(prefix, tok)
