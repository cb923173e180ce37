"""A tree pass (``TreePositions``): the target over a round's root and its candidate nodes in one call gives each
node the logits of a chain pass over the prefix and that node's path, whatever stale entries the cache holds past
the prefix; moving the accepted path's slots leaves the cache a chain pass over that path would."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxspec.core.cache import TreePositions, move_slots
from jaxspec.models import llama
from tests.helpers import VOCAB, tiny_config

PARENTS = (-1, 0, 0, 1, 1, 2, 3)  # node 0 is the root; parents come before children
L, S = 7, 24  # prefix length (the root sits at position L), cache slots


def _path(node: int) -> list[int]:
    out = []
    while node >= 0:
        out.append(node)
        node = PARENTS[node]
    return out[::-1]


def _tree(base: int) -> TreePositions:
    n = len(PARENTS)
    depth = np.array([len(_path(i)) - 1 for i in range(n)])
    visible = np.zeros((n, n), bool)
    for i in range(n):
        visible[i, _path(i)] = True
    return TreePositions(
        jnp.asarray(base + depth, jnp.int32)[None],
        jnp.asarray(base + np.arange(n), jnp.int32)[None],
        jnp.asarray(visible)[None],
    )


def test_from_parents_walks_each_path():
    """Two rows, two trees (this file's and a chain), roots at different positions: depths, slots and ancestor
    sets as walked on the host."""
    chain = (-1, 0, 1, 2, 3, 4, 5)
    got = TreePositions.from_parents(jnp.asarray([PARENTS, chain], jnp.int32), jnp.asarray([L, 3]), max_depth=6)
    want = _tree(L)
    np.testing.assert_array_equal(got.rope[0], want.rope[0])
    np.testing.assert_array_equal(got.slots[0], want.slots[0])
    np.testing.assert_array_equal(got.visible[0], want.visible[0])
    np.testing.assert_array_equal(got.rope[1], 3 + np.arange(7))
    np.testing.assert_array_equal(got.visible[1], np.tril(np.ones((7, 7), bool)))
    short = TreePositions.from_parents(jnp.asarray([chain], jnp.int32), jnp.asarray([0]), max_depth=2)
    assert int(short.rope[0, -1]) == 2  # negative control: a walk shorter than the tree stops counting there


@pytest.mark.parametrize("cfg", [tiny_config(), tiny_config(sliding_window=3)], ids=["full", "sliding3"])
def test_tree_pass_matches_chain_passes(cfg):
    model = llama.init(cfg, seed=0)
    rng = np.random.default_rng(0)
    prefix = jnp.asarray(rng.integers(0, VOCAB, (1, L)), jnp.int32)
    nodes = jnp.asarray(rng.integers(0, VOCAB, (1, len(PARENTS))), jnp.int32)
    apply = jax.jit(model.apply_fn)
    # the cache after the prefix, with stale entries of an earlier round written past it
    cache = model.init_cache(1, S)
    stale = jnp.asarray(rng.integers(0, VOCAB, (1, S - L)), jnp.int32)
    _, cache = apply(model.params, stale, jnp.arange(L, S, dtype=jnp.int32)[None], cache)
    _, cache = apply(model.params, prefix, jnp.arange(L, dtype=jnp.int32)[None], cache)

    tree = _tree(L)
    logits, tree_cache = apply(model.params, nodes, tree, cache)
    for node in range(len(PARENTS)):
        path = _path(node)
        chain = nodes[:, path]
        want, _ = apply(model.params, chain, jnp.arange(L, L + len(path), dtype=jnp.int32)[None], cache)
        np.testing.assert_allclose(logits[0, node], want[0, -1], rtol=2e-5, atol=2e-5, err_msg=f"node {node}")

    # negative control: the same tokens in slot order under a causal mask (node 2 would see node 1, its sibling)
    causal, _ = apply(model.params, nodes, tree.slots, cache)
    assert np.abs(np.asarray(causal[0, 2] - logits[0, 2])).max() > 1e-3

    # accept the path 0 -> 1 -> 3 -> 6: its slots move to L .. L+3, as a chain pass over it would have written them
    path = _path(6)
    src = jnp.asarray(L + np.asarray(path), jnp.int32)[None]
    moved = move_slots(tree_cache, src, jnp.arange(L, L + len(path), dtype=jnp.int32)[None])
    _, chain_cache = apply(model.params, nodes[:, path], jnp.arange(L, L + len(path), dtype=jnp.int32)[None], cache)
    for got, want in ((moved.k, chain_cache.k), (moved.v, chain_cache.v)):
        np.testing.assert_allclose(got[:, :, : L + len(path)], want[:, :, : L + len(path)], rtol=2e-5, atol=2e-5)
