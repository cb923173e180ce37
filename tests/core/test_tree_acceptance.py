"""Exact acceptance over a draft tree (``jaxspec.core.tree_acceptance``): the output follows the target.

A target and a drafter over 5 tokens are tables of distributions by prefix (up to 3 tokens). Each sample drafts a
fixed-shape tree (the root's 3 children, 2 under the first, 1 under the second, 1 under the first's first: depth
3) with ``draw_children`` from the drafter's distribution at each node's prefix, then accepts it against the
target's. The first output token must follow the target at the root, the second (when the first was an accepted
node) the target after the first; a chi-square test of each at α = 1e-3, and the same tests must catch the
negative controls (siblings treated as independent draws: the proposal not renormalized after a rejection; the
residual not taken after a rejection).
Greedy (one-hot target) accepts the path of the target's argmax tokens.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats

from jaxspec.core.tree_acceptance import accept_tree_row, draw_children

V = 5
PARENT = np.array([-1, 0, 0, 0, 1, 1, 2, 4], np.int32)  # node i's parent (node 0: the root)
RANK = np.array([0, 0, 1, 2, 0, 1, 0, 0], np.int32)  # its place among its siblings
DEPTH, BRANCH = 3, 3
SAMPLES = 20_000
ALPHA = 1e-3


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
def _sampler(wrong: str | None):
    def one(key, p_table, q_table):
        k_tree, k_accept = jax.random.split(key)
        token, q, p = _draft_tree(k_tree, p_table, q_table)
        parent, rank = jnp.asarray(PARENT), jnp.asarray(RANK)
        n, path, nxt = accept_tree_row(
            k_accept, parent, token, rank, q, p, depth=DEPTH, branch=BRANCH, wrong_rule=wrong
        )
        return n, jnp.concatenate([token[path], nxt[None]])  # accepted tokens (past n: ignored), the drawn one

    return jax.jit(jax.vmap(one, in_axes=(0, None, None)))


def _run(p_table, q_table, seed, wrong=None):
    keys = jax.random.split(jax.random.key(seed), SAMPLES)
    n, seq = _sampler(wrong)(keys, jnp.asarray(p_table), jnp.asarray(q_table))
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


def test_tree_output_follows_the_target():
    p_table, q_table = _tables(1, 1.5), _tables(2, 3.0)  # a peaky drafter that often disagrees
    n, seq = _run(p_table, q_table, seed=11)
    p_first, p_second = _p_values(p_table, n, seq)
    assert p_first > ALPHA and p_second > ALPHA, (p_first, p_second)
    assert 0.3 < np.mean(n >= 1) < 0.99 and np.mean(n >= 2) > 0.03  # siblings and depth both used


@pytest.mark.parametrize("wrong", ["with_replacement", "no_residual"])
def test_negative_controls_are_caught(wrong):
    """Siblings verified as if drawn with replacement; the residual not taken after a rejection."""
    p_table, q_table = _tables(1, 1.5), _tables(2, 3.0)
    n, seq = _run(p_table, q_table, seed=11, wrong=wrong)
    p_first, p_second = _p_values(p_table, n, seq)
    assert min(p_first, p_second) < 1e-6, (p_first, p_second)


def test_greedy_accepts_the_targets_argmax_path():
    p_table = np.eye(V, dtype=np.float32)[np.argmax(_tables(1, 1.5), -1)]  # one-hot: temperature 0
    q_table = _tables(2, 3.0)
    n, seq = _run(p_table, q_table, seed=5)
    for i in range(200):
        prefix = 0
        out = list(seq[i, : n[i]]) + [seq[i, DEPTH]]
        for tok in out:  # every output token is the target's argmax after the ones before it
            assert tok == np.argmax(p_table[prefix])
            prefix = _code(prefix, tok)
