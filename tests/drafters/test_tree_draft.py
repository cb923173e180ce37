"""An EAGLE head's draft tree (``EagleDrafter.draft_tree``): each node's q is the head's chain of steps along the
node's path, the tree keeps each node's children in draw order (a prefix of them), a tree of one branch is the
chain draft, and a sampled tree draws a node's children without replacement."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import tiny_config

from jaxspec.core.sampling import SamplingParams
from jaxspec.drafters import eagle
from jaxspec.models import eagle as eagle_model
from jaxspec.models import eagle3, llama

SEQ = [7, 3, 9, 12, 40, 41, 5, 6, 88, 2, 17, 23]
SIZE = 48


@pytest.fixture(scope="module")
def target():
    return llama.init(tiny_config(num_layers=4), seed=0)


def _heads(target):
    cfg1 = eagle_model.head_config(target.config)
    one = eagle.EagleDrafter.for_target(target, eagle_model.init_own(cfg1, seed=1), config=cfg1, name="e1")
    cfg3 = eagle3.head_config(target.config, tuple(range(0, target.vocab_size, 2)))  # a restricted draft vocabulary
    own = {k: v for k, v in eagle3.init_own(cfg3, seed=2).items() if k != "lm_head"}
    return one, eagle.EagleDrafter.for_target(target, own, config=cfg3, name="e3")


def _prefilled(target, head, length):
    seq = jnp.asarray([SEQ])
    positions = jnp.arange(len(SEQ))[None]
    _, feats, _ = head.target_features(target.params, seq, positions, target.init_cache(1, SIZE))
    tokens = jnp.zeros((1, SIZE), jnp.int32).at[:, : len(SEQ)].set(seq)
    # the verified prefix: features up to length-2 (the newest token, length-1, is the round's root)
    plen = length - 1
    state = head.observe(head.init_state(1, SIZE), feats[:, :plen], positions[:, :plen])
    state = head.prefill(head.params, seq[:, :plen], positions[:, :plen], state)
    return tokens, state


def _chain_q(head, state, tokens, length, path_tokens):
    """The head's q after each step of the chain ``path_tokens`` from the round's window (``draft``'s steps)."""
    apply_fn = jax.jit(eagle._head_fns(head.config)[0])
    reach = 3  # any window over verified pairs writes the same entries: one shape, one compile
    window = jnp.maximum(length - 2 - reach + jnp.arange(reach + 1, dtype=jnp.int32), 0)[None]
    following = tokens[0, jnp.minimum(window[0] + 1, SIZE - 1)][None]
    logits, feats, cache = apply_fn(head.params, following, state.feats[0, window[0]][None], window, state.cache)
    out = [jax.nn.softmax(logits[0, -1])]
    feat = feats[:, -1]
    for k, tok in enumerate(path_tokens):
        pos = jnp.asarray([[length - 1 + k]])
        logits, feats, cache = apply_fn(head.params, jnp.asarray([[tok]]), feat[:, None], pos, cache)
        out.append(jax.nn.softmax(logits[0, 0]))
        feat = feats[:, 0]
    return out


def _keys(seed, depth):
    return jax.random.split(jax.random.key(seed), depth)[None]


def _path(parent, node):
    out = []
    while node > 0:
        out.append(node)
        node = int(parent[node])
    return out[::-1]


@pytest.mark.parametrize("kind", ["eagle1", "eagle3"])
def test_tree_nodes_carry_their_paths_chain_q(target, kind):
    """At temperature 1 every node's q is the head's softmax after the chain of steps along its path (each level's
    tree pass sees the prefix and the node's ancestors only); greedy, the root's children are the head's most
    likely tokens, best first, and a tree of one branch is the chain draft."""
    head = _heads(target)[0 if kind == "eagle1" else 1]
    length, depth, branch, width = 9, 3, 2, 3
    tokens, state = _prefilled(target, head, length)
    draw = jax.jit(head.draft_tree, static_argnames=("vocab_size", "depth", "branch", "width"))
    shape = dict(depth=depth, branch=branch, width=width)
    args = (head.params, state, tokens, jnp.asarray([length]))
    tree = draw(*args, SamplingParams.create(1.0, batch=1), _keys(0, depth), target.vocab_size, **shape)
    parent, tok, rank = (np.asarray(x[0]) for x in (tree.parent, tree.tokens, tree.rank))
    nodes = branch + (depth - 1) * width
    assert parent.shape == (nodes + 1,) and parent[0] == -1 and all(0 <= parent[i] < i for i in range(1, nodes + 1))
    for i in range(1, nodes + 1):  # a node's kept children are its first ones: rank j > 0 has a sibling of rank j-1
        assert rank[i] == 0 or any(parent[j] == parent[i] and rank[j] == rank[i] - 1 for j in range(1, nodes + 1))
    for node in range(nodes + 1):
        path = _path(parent, node)
        if len(path) == depth:  # the deepest level has no children: q is zero there
            assert float(jnp.sum(tree.q[0, node])) == 0.0
            continue
        chain = _chain_q(head, state, tokens, length, [int(tok[n]) for n in path])
        np.testing.assert_allclose(np.asarray(tree.q[0, node]), np.asarray(chain[-1]), atol=2e-5, err_msg=str(path))

    greedy = SamplingParams.create(0.0, batch=1)
    tree = draw(*args, greedy, _keys(0, depth), target.vocab_size, **shape)
    want = np.argsort(-np.asarray(_chain_q(head, state, tokens, length, [])[0]), kind="stable")[:branch]
    np.testing.assert_array_equal(np.asarray(tree.tokens[0, 1 : branch + 1]), want)
    assert float(jnp.abs(tree.q).sum()) == 0.0  # every row greedy: nothing warped (greedy acceptance reads no q)
    # beside a sampled row (the general path: q warped, children drawn or taken per row) a greedy row's tree is the
    # same as the all-greedy path's
    two = jax.tree.map(lambda x: jnp.concatenate([x, x], axis=1 if x.ndim == 5 else 0), (state, tokens))
    mixed = draw(
        head.params,
        *two,
        jnp.asarray([length] * 2),
        SamplingParams(jnp.asarray([0.0, 1.0]), jnp.zeros(2, jnp.int32), jnp.ones(2)),
        jnp.concatenate([_keys(0, depth)] * 2),
        target.vocab_size,
        **shape,
    )
    for field in ("tokens", "parent", "rank"):
        np.testing.assert_array_equal(np.asarray(getattr(mixed, field)[0]), np.asarray(getattr(tree, field)[0]))
    assert float(jnp.abs(mixed.q[1]).sum()) > 0 and float(jnp.abs(mixed.q[0]).sum()) > 0
    keys = jax.random.split(jax.random.key(0), depth)[None]
    chain = head.draft(*args, greedy, keys, target.vocab_size)
    line = draw(*args, greedy, _keys(0, depth), target.vocab_size, depth=depth, branch=1, width=1)
    np.testing.assert_array_equal(np.asarray(line.tokens[0, 1:]), np.asarray(chain.tokens[0]))
    np.testing.assert_array_equal(np.asarray(line.parent[0]), [-1, 0, 1, 2])


def test_sampled_tree_draws_children_without_replacement(target):
    head = _heads(target)[1]
    length = 9
    tokens, state = _prefilled(target, head, length)
    sampled = SamplingParams.create(1.0, batch=1)
    draw = jax.jit(head.draft_tree, static_argnames=("vocab_size", "depth", "branch", "width"))
    firsts = []
    for seed in range(40):
        tree = draw(
            head.params,
            state,
            tokens,
            jnp.asarray([length]),
            sampled,
            _keys(seed, 2),
            target.vocab_size,
            depth=2,
            branch=3,
            width=4,
        )
        parent, tok = np.asarray(tree.parent[0]), np.asarray(tree.tokens[0])
        q = np.asarray(tree.q[0])
        for u in range(len(parent)):
            kids = [int(tok[i]) for i in range(1, len(parent)) if parent[i] == u]
            assert len(set(kids)) == len(kids) and all(q[u, k] > 0 for k in kids), (seed, u, kids)
        firsts.append(int(tok[1]))
    # the root's first child is a draw from q0 (not its argmax every time): several distinct tokens in 40 trees
    assert len(set(firsts)) > 3, firsts


def test_trees_draft_at_the_tree_temperature_scale_and_chains_at_the_other(target):
    """A head's trees draw from q at the call's temperature times its ``tree_temperature_scale`` (the same tree,
    q and tokens, as a head whose ``temperature_scale`` is that value); its chains keep ``temperature_scale``."""
    import dataclasses

    head = _heads(target)[1]
    length, shape = 9, dict(depth=3, branch=2, width=3)
    tokens, state = _prefilled(target, head, length)
    args = (state, tokens, jnp.asarray([length]), SamplingParams.create(1.0, batch=1))
    tree_sharp = dataclasses.replace(head, tree_temperature_scale=0.5)
    assert tree_sharp.tree_scale == 0.5 and head.tree_scale == head.temperature_scale == 1.0

    def tree(drafter):
        draw = jax.jit(drafter.draft_tree, static_argnames=("vocab_size", "depth", "branch", "width"))
        out = draw(drafter.params, *args, _keys(3, 3), target.vocab_size, **shape)
        return np.asarray(out.q), np.asarray(out.tokens), np.asarray(out.parent)

    def chain(drafter):
        out = jax.jit(drafter.draft, static_argnums=6)(drafter.params, *args, _keys(3, 3), target.vocab_size)
        return np.asarray(out.q), np.asarray(out.tokens)

    got, want = tree(tree_sharp), tree(dataclasses.replace(head, temperature_scale=0.5))
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[2], want[2])
    assert np.abs(got[0] - tree(head)[0]).max() > 1e-3  # the scale changes the tree's q
    for a, b in zip(chain(tree_sharp), chain(head)):  # and not the chain's
        np.testing.assert_array_equal(a, b)


def test_a_draft_models_tree_nodes_carry_their_paths_q(target):
    """A draft model's tree (``ModelDrafter.draft_tree``, a draft with a smaller vocabulary than the target's): at
    temperature 1 every node's q is the draft's softmax after the prefix and the node's path, as one plain forward
    pass over them gives it (zero past the draft's table; an id past it is read as its last id); its cache before
    the round holds the prefix only up to L-3, as a chain round leaves it."""
    from jaxspec.drafters import ModelDrafter

    small = llama.init(tiny_config(num_layers=2, vocab_size=target.vocab_size - 8), seed=7)
    drafter = ModelDrafter.of(small)
    length, depth, branch, width = 9, 3, 2, 3
    seq = jnp.asarray([SEQ])
    tokens = jnp.zeros((1, SIZE), jnp.int32).at[:, : len(SEQ)].set(seq)
    prefix = jnp.minimum(seq[:, : length - 2], small.vocab_size - 1)
    _, cache = small.apply_fn(small.params, prefix, jnp.arange(length - 2)[None], small.init_cache(1, SIZE))
    draw = jax.jit(drafter.draft_tree, static_argnames=("vocab_size", "depth", "branch", "width"))
    tree = draw(
        small.params,
        cache,
        tokens,
        jnp.asarray([length]),
        SamplingParams.create(1.0, batch=1),
        _keys(3, depth),
        target.vocab_size,
        depth=depth,
        branch=branch,
        width=width,
    )
    parent, tok = np.asarray(tree.parent[0]), np.asarray(tree.tokens[0])
    assert all(0 <= parent[i] < i for i in range(1, len(parent)))
    for node in range(len(parent)):
        path = _path(parent, node)
        if len(path) == depth:
            continue
        ids = [min(t, small.vocab_size - 1) for t in SEQ[:length] + [int(tok[n]) for n in path]]  # 88: past its table
        full = small.logits(jnp.asarray([ids]))[0, -1]
        want = np.zeros(target.vocab_size, np.float32)
        want[: small.vocab_size] = np.asarray(jax.nn.softmax(full))
        np.testing.assert_allclose(np.asarray(tree.q[0, node]), want, atol=2e-5, err_msg=str(path))
