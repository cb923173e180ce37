"""The categorical sampler: draws follow the given probabilities; zeros are never drawn; one-hot is exact."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats

from jaxspec.sampling import sample

DRAWS = 200_000


def _probs(vocab=700, seed=0):
    """Peaked probabilities with zeros scattered inside blocks and a zero tail (vocab not a multiple of 256)."""
    p = np.random.default_rng(seed).random(vocab) ** 8
    p[::3] = 0
    p[650:] = 0
    return p / p.sum()


def _counts(sampler, probs, seed=0):
    keys = jax.random.split(jax.random.key(seed), DRAWS)
    draws = np.asarray(jax.jit(jax.vmap(sampler, in_axes=(0, None)))(keys, jnp.asarray(probs, jnp.float32)))
    return np.bincount(draws, minlength=len(probs))


def _p_value(counts, probs):
    keep = probs > 0
    return scipy.stats.chisquare(counts[keep], probs[keep] * counts.sum()).pvalue


def test_draws_follow_the_probabilities():
    probs = _probs()
    counts = _counts(sample, probs)
    assert counts[probs == 0].sum() == 0
    assert _p_value(counts, probs) > 1e-3


def test_negative_control_is_rejected():
    """The same test rejects a sampler that is subtly off (probabilities flattened by a square root)."""
    probs = _probs()
    counts = _counts(lambda key, p: sample(key, jnp.sqrt(p)), probs)
    assert counts[probs == 0].sum() == 0
    assert _p_value(counts, probs) < 1e-10


@pytest.mark.parametrize("vocab,hot", [(5, 3), (700, 437), (512, 511), (256, 0)])
def test_one_hot_is_exact(vocab, hot):
    probs = np.zeros(vocab)
    probs[hot] = 1
    keys = jax.random.split(jax.random.key(1), 2000)
    draws = np.asarray(jax.vmap(sample, in_axes=(0, None))(keys, jnp.asarray(probs, jnp.float32)))
    assert set(draws.tolist()) == {hot}


def test_unnormalized_input():
    probs = _probs(vocab=300, seed=2)
    counts = _counts(sample, probs * 37.0, seed=3)
    assert _p_value(counts, probs) > 1e-3
