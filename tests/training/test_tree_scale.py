"""Choosing an EAGLE-3 head's ``tree_temperature_scale`` (``jaxspec.training.eagle3``): the Monte Carlo acceptance
of a node's sibling set, by the trees' own recursive rejection sampling, against exact enumeration (with the
with-replacement rule as the negative control), and the teacher-forced table against the chain's exact one."""

import jax
import numpy as np
import pytest
from helpers import tiny_config

from jaxspec.drafters import eagle
from jaxspec.models import eagle3, llama
from jaxspec.training import eagle3 as eagle3_training


def _exact(q, p, replacement: bool):
    """P(one of two children accepted): the first drawn from q, the second from q without the first (or from q
    again, ``replacement``), tried in turn against p with the residual after a rejection. ``q [V]`` (zero at the
    last index, the mass it never draws), ``p [V]``."""
    total = 0.0
    for x1 in np.flatnonzero(q):
        a1 = min(1.0, p[x1] / q[x1])
        r = np.maximum(p - q, 0.0)
        r = r / r.sum() if r.sum() > 0 else p
        second = q.copy()
        if not replacement:
            second[x1] = 0.0
            second = second / second.sum()
        a2 = sum(second[x2] * min(1.0, r[x2] / second[x2]) for x2 in np.flatnonzero(second))
        total += q[x1] * (a1 + (1.0 - a1) * a2)
    return total


def test_sibling_acceptance_matches_exact_enumeration_and_not_the_wrong_rule():
    rng = np.random.default_rng(0)
    rows, n = 5, 4
    logits = rng.normal(0.0, 1.0, (n, rows))
    logits[:, 0] += 3.5  # a sharp q: drawing its peak twice (with replacement) would waste the second child
    p = rng.dirichlet(np.full(rows + 1, 0.7), n)
    p[:, 0] *= 0.1  # that the target rarely takes
    p = p / p.sum(1, keepdims=True)
    got1 = np.asarray(eagle3_training.sibling_acceptance(jax.random.key(1), logits, p, 1.0, branch=1, samples=6000))
    got2 = np.asarray(eagle3_training.sibling_acceptance(jax.random.key(2), logits, p, 1.0, branch=2, samples=6000))
    for i in range(n):
        q = np.append(np.exp(logits[i] - logits[i].max()), 0.0)
        q = q / q.sum()
        assert got1[i] == pytest.approx(np.minimum(p[i], q).sum(), abs=0.025)  # one child: speculative sampling
        want, wrong = _exact(q, p[i], replacement=False), _exact(q, p[i], replacement=True)
        assert got2[i] == pytest.approx(want, abs=0.025), i
        assert want - wrong > 0.06  # the negative control is far enough to be caught
        assert abs(got2[i] - wrong) > 0.04, i


def test_sibling_acceptance_follows_qs_temperature():
    """q is the head's softmax at temperature ``scale``: exact enumeration at two scales agrees at each."""
    rng = np.random.default_rng(3)
    logits, p = rng.normal(0.0, 1.5, (3, 4)), rng.dirichlet(np.full(5, 0.5), 3)
    for scale in (0.5, 2.0):
        got = np.asarray(
            eagle3_training.sibling_acceptance(jax.random.key(4), logits, p, scale, branch=2, samples=6000)
        )
        for i in range(3):
            q = np.append(np.exp((logits[i] - logits[i].max()) / scale), 0.0)
            assert got[i] == pytest.approx(_exact(q / q.sum(), p[i], replacement=False), abs=0.025)


@pytest.fixture(scope="module")
def pair():
    target = llama.init(tiny_config(num_layers=4), seed=0, eos_token_id=1)
    cfg = eagle3.head_config(target.config, tuple(range(95, 0, -3)), aux_layers=(1, 2, 4))
    head = eagle.EagleDrafter.for_target(target, eagle3.init_own(cfg, seed=1), config=cfg, name="head3")
    rng = np.random.default_rng(5)
    records = [
        ([int(x) for x in rng.integers(2, 96, 7 + i)], [int(x) for x in rng.integers(2, 96, 20 + 3 * i)])
        for i in range(5)
    ]
    return target, head, records


def test_one_child_per_node_is_the_chains_exact_acceptance(pair):
    """With one child a node, the tree's table is the chain's: ``agreement``'s sum_v min(p_v, q_v) per step and
    scale, up to the Monte Carlo's error."""
    target, head, records = pair
    scales = (0.6, 1.0, 1.7)
    chain = eagle3_training.agreement(target, head, records, steps=2, scales=scales)["by_scale"]
    tree = eagle3_training.tree_acceptance(target, head, records, branch=1, scales=scales, steps=2, samples=200)
    for s in scales:
        np.testing.assert_allclose(tree[s], chain[s], atol=0.02)
    best, table = eagle3_training.tune_tree_temperature_scale(
        target, head, records, branch=3, scales=scales, samples=50
    )
    assert best in scales and set(table) == set(scales)
    for s in scales:  # three children accept at least what one does
        assert all(t >= c - 0.03 for t, c in zip(table[s], chain[s]))


def test_tree_tuning_errors_name_the_argument(pair):
    target, head, records = pair
    with pytest.raises(ValueError, match="scales must be finite numbers > 0"):
        eagle3_training.tune_tree_temperature_scale(target, head, records, scales=(0.5, 0))
    with pytest.raises(ValueError, match="branch must be an int >= 1"):
        eagle3_training.tree_acceptance(target, head, records, branch=0)
    with pytest.raises(ValueError, match="head must be an EAGLE-3 head"):
        eagle3_training.tree_acceptance(target, target, records, branch=2)
