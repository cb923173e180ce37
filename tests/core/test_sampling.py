"""The categorical sampler: draws follow the given probabilities; zeros are never drawn; one-hot is exact.
Warping with per-row parameters: each row is warped exactly (bitwise) as a scalar-parameter call would warp it,
and scalar parameters give the values they gave before parameters could vary per row. (``warp`` against the
documented rule: ``tests/test_exactness.py``.)"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats

from jaxspec.core.sampling import SamplingParams, sample, warp

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


# --------------------------------------------------------------------------------------------- per-row warping

MIXED_ROWS = [  # (temperature, top_k, top_p), one row each
    (0.0, None, None),  # greedy
    (0.7, None, None),  # plain temperature: no filter
    (1.0, 3, None),  # top-k
    (1.0, None, 0.8),  # top-p
    (0.6, 5, 0.7),  # top-k then top-p
]
UNFILTERED_ROWS = [(0.0, None, None), (0.7, None, None), (1.3, 0, 1.0), (1.0, None, None), (0.0, 4, None)]
# (no row filters in UNFILTERED_ROWS, so the sort is skipped; the greedy row's top-k is unused)


def _bits(x) -> np.ndarray:
    return np.asarray(x, np.float32).view(np.uint32)


def _logits(shape, kind, seed=0) -> jnp.ndarray:
    rng = np.random.default_rng(seed)
    if kind == "ties":  # small integers: exact ties, including at the top-k / top-p boundaries
        return jnp.asarray(rng.integers(0, 4, size=shape).astype(np.float32))
    return jnp.asarray(rng.normal(0.0, 2.0, size=shape).astype(np.float32))


def _per_row(rows):
    temperature, top_k, top_p = zip(*rows)
    return SamplingParams.create(temperature, [k or 0 for k in top_k], [1.0 if p is None else p for p in top_p])


_warp = jax.jit(warp)


@pytest.mark.parametrize("rows", [MIXED_ROWS, UNFILTERED_ROWS], ids=["mixed", "unfiltered"])
@pytest.mark.parametrize("middle", [(), (4,)], ids=["BV", "BGV"])
def test_per_row_warp_is_row_by_row_scalar_warp(rows, middle):
    """Row b of a per-row call equals row b of the scalar call with row b's parameters, bit for bit, for logits
    [B, V] and [B, γ+1, V] (Gaussian, and small integers with exact ties at the top-k / top-p boundaries)."""
    for kind in ("gaussian", "ties"):
        logits = _logits((len(rows), *middle, 50), kind)
        got = np.asarray(_warp(logits, _per_row(rows)))
        assert got.shape == logits.shape
        for b, (temperature, top_k, top_p) in enumerate(rows):
            want = np.asarray(_warp(logits, SamplingParams.create(temperature, top_k, top_p)))[b]
            np.testing.assert_array_equal(_bits(got[b]), _bits(want), err_msg=f"{kind} row {b}: {rows[b]}")
        if rows is MIXED_ROWS:  # the greedy row is one-hot on the raw argmax; every row sums to 1
            np.testing.assert_array_equal(got[0], np.eye(50, dtype=np.float32)[np.argmax(logits[0], axis=-1)])
            np.testing.assert_allclose(got.sum(-1), 1.0, atol=1e-5)


def test_fields_may_mix_scalars_and_rows():
    rows = MIXED_ROWS
    logits = _logits((len(rows), 50), "gaussian", seed=1)
    temperature = _per_row(rows).temperature
    got = np.asarray(_warp(logits, SamplingParams(temperature, jnp.int32(3), jnp.float32(1.0))))
    for b, (t, _, _) in enumerate(rows):
        want = np.asarray(_warp(logits, SamplingParams.create(t, 3)))[b]
        np.testing.assert_array_equal(_bits(got[b]), _bits(want))


def _warp_before_per_row(logits, params):
    """``jaxspec.core.sampling.warp`` as it was when parameters were scalars only (verbatim): the oracle for
    "scalar parameters give the old values"."""
    logits = logits.astype(jnp.float32)
    greedy = params.temperature <= 0
    scaled = logits / jnp.where(greedy, 1.0, params.temperature)

    def filt(scaled):
        vocab = scaled.shape[-1]
        desc = -jnp.sort(-scaled, axis=-1)
        k = jnp.clip(jnp.where(params.top_k > 0, params.top_k, vocab), 1, vocab)
        kth = jnp.take(desc, k - 1, axis=-1)[..., None]
        desc_k = jnp.where(desc >= kth, desc, -jnp.inf)
        probs_desc = jax.nn.softmax(desc_k, axis=-1)
        mass_before = jnp.cumsum(probs_desc, axis=-1) - probs_desc
        n_keep = jnp.maximum(jnp.sum(mass_before < params.top_p, axis=-1, keepdims=True), 1)
        pth = jnp.take_along_axis(desc_k, n_keep - 1, axis=-1)
        return jnp.where(scaled >= jnp.maximum(kth, pth), scaled, -jnp.inf)

    needs_filter = (params.top_k > 0) | (params.top_p < 1.0)
    scaled = jax.lax.cond(needs_filter, filt, lambda x: x, scaled)
    probs = jax.nn.softmax(scaled, axis=-1)
    onehot = jax.nn.one_hot(jnp.argmax(logits, axis=-1), logits.shape[-1], dtype=jnp.float32)
    return jnp.where(greedy, onehot, probs)


@pytest.mark.parametrize("shape", [(50,), (5, 50), (5, 4, 50)], ids=["V", "BV", "BGV"])
def test_scalar_params_give_the_old_values(shape):
    logits = _logits(shape, "gaussian", seed=3)
    old = jax.jit(_warp_before_per_row)
    for setting in MIXED_ROWS + [(1.7, 50, None), (1.0, None, 1e-4), (1.0, 0, 1.0)]:
        params = SamplingParams.create(*setting)
        assert params.temperature.shape == params.top_k.shape == params.top_p.shape == ()
        np.testing.assert_array_equal(_bits(_warp(logits, params)), _bits(old(logits, params)), err_msg=str(setting))


@pytest.mark.parametrize("vocab", [5, 1000, 49152])
def test_the_filter_without_a_sort_keeps_what_the_sorted_rule_keeps(vocab):
    """warp finds its top-k and top-p thresholds by bisection, not by sorting the vocabulary: the same probabilities,
    bit for bit, as the sort-based rule (``_warp_before_per_row``), on Gaussian logits, small integers (ties at the
    thresholds), a third of the vocabulary at -inf, and signed zeros (-0.0 ties +0.0), at SmolLM2's vocabulary."""
    rng = np.random.default_rng(vocab)
    old = jax.jit(_warp_before_per_row)
    for kind in ("gaussian", "ties", "masked", "zeros"):
        x = rng.normal(0.0, 2.0, size=(3, vocab)).astype(np.float32)
        if kind == "ties":
            x = np.round(x)
        elif kind == "masked":
            x[:, : vocab // 3] = -np.inf
        elif kind == "zeros":
            x = np.round(x * 0.3)  # many -0.0 and +0.0
            assert np.signbit(x[x == 0]).any() and not np.signbit(x[x == 0]).all()
        for setting in [(1.0, 3, None), (0.8, None, 0.05), (1.0, None, 0.3), (1.3, None, 0.9), (0.7, vocab // 2, 0.5)]:
            params = SamplingParams.create(*setting)
            got, want = _warp(jnp.asarray(x), params), old(jnp.asarray(x), params)
            np.testing.assert_array_equal(_bits(got), _bits(want), err_msg=f"{kind} {setting}")
            assert np.all(np.asarray(got > 0).sum(-1) >= 1)


def test_create_shapes_and_bad_shapes():
    one = SamplingParams.create(0.5, 4, None)
    assert [x.shape for x in (one.temperature, one.top_k, one.top_p)] == [(), (), ()]
    rows = SamplingParams.create([0.0, 1.0, 0.8], top_p=[1.0, 0.9, 0.5])
    assert rows.temperature.shape == (3,) and rows.top_k.shape == () and rows.top_p.shape == (3,)
    full = SamplingParams.create(0.5, None, [0.9, 1.0], batch=2)
    assert [(x.shape, x.dtype) for x in (full.temperature, full.top_k, full.top_p)] == [
        ((2,), jnp.float32),
        ((2,), jnp.int32),
        ((2,), jnp.float32),
    ]
    assert np.asarray(full.top_k).tolist() == [0, 0] and np.asarray(full.top_p).tolist() == pytest.approx([0.9, 1.0])
    with pytest.raises(ValueError, match=r"SamplingParams.temperature must be a scalar or \[B\]"):
        warp(jnp.zeros((2, 8)), SamplingParams.create([1.0, 1.0, 1.0]))
    with pytest.raises(ValueError, match="SamplingParams.top_k"):
        warp(jnp.zeros((8,)), SamplingParams.create(top_k=[1] * 8))
