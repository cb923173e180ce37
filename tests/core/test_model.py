"""Model contract and the Llama decoder: cached decoding equals the full-sequence pass; user models plug in."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import VOCAB, decode_in_chunks, tiny_config

import jaxspec
from jaxspec.core.cache import KVCache, write
from jaxspec.models import llama


@pytest.mark.parametrize("chunk", [1, 4])
@pytest.mark.parametrize("kv_heads", [1, 2, 4])
def test_cached_decoding_matches_full_pass(kv_heads, chunk):
    model = llama.init(tiny_config(num_kv_heads=kv_heads), seed=kv_heads)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, VOCAB, size=(3, 20))
    full = np.asarray(model.logits(tokens))
    # prompts of different lengths: the padded prefill writes garbage past each prompt, which must be overwritten
    cached = decode_in_chunks(model, tokens, [3, 9, 1], chunk)
    np.testing.assert_allclose(cached, full, atol=1e-4, rtol=1e-4)


def test_stale_cache_slots_are_masked():
    """Writing junk past the current position (a rejected draft) must not change later logits."""
    model = llama.init(tiny_config(), seed=0)
    tokens = jnp.asarray([[5, 6, 7, 8]])
    pos = jnp.arange(4)[None]
    cache = model.init_cache(1, 16)
    _, cache = model.apply_fn(model.params, tokens, pos, cache)
    _, dirty = model.apply_fn(model.params, jnp.asarray([[1, 2, 3]]), jnp.asarray([[4, 5, 6]]), cache)
    clean_logits, _ = model.apply_fn(model.params, jnp.asarray([[9]]), jnp.asarray([[4]]), cache)
    dirty_logits, _ = model.apply_fn(model.params, jnp.asarray([[9]]), jnp.asarray([[4]]), dirty)
    np.testing.assert_allclose(clean_logits, dirty_logits, atol=1e-6)


def test_out_of_range_writes_are_dropped():
    layer = jnp.zeros((2, 4, 1, 1))
    new = jnp.ones((2, 3, 1, 1))
    out = write(layer, new, jnp.asarray([[2, 3, 4], [3, 4, 5]]))
    assert out[0, :, 0, 0].tolist() == [0, 0, 1, 1]
    assert out[1, :, 0, 0].tolist() == [0, 0, 0, 1]


def test_tied_embeddings_and_bf16():
    cfg = tiny_config(tie_embeddings=True, dtype="bfloat16")
    model = llama.init(cfg, seed=0)
    assert "lm_head" not in model.params
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(model.params))
    cache = model.init_cache(2, 32)
    assert isinstance(cache, KVCache) and cache.k.dtype == jnp.bfloat16
    logits = model.logits(np.asarray([[1, 2, 3]]))
    assert logits.dtype == jnp.float32 and np.isfinite(np.asarray(logits)).all()
    res = jaxspec.generate(model, [[1, 2, 3], [4, 5]], draft=model, gamma=3, max_new_tokens=10, temperature=0.0)
    assert res.stats.acceptance_rate > 0.9  # bf16 ties may cost a rare acceptance, never correctness
    assert [len(t) for t in res.tokens] == [10, 10]


def test_same_config_shares_compiled_functions():
    a = llama.init(tiny_config(), seed=0)
    b = llama.init(tiny_config(), seed=1)
    assert a.apply_fn is b.apply_fn and a.init_cache is b.init_cache


def test_bad_configs():
    with pytest.raises(ValueError, match="num_kv_heads"):
        tiny_config(num_heads=4, num_kv_heads=3)
    with pytest.raises(ValueError, match="dtype"):
        tiny_config(dtype="float64")
    with pytest.raises(ValueError, match="vocab_size"):
        jaxspec.CausalLM(apply_fn=lambda *a: a, params={}, init_cache=lambda b, n: None, vocab_size=0)


# A user's own model, written without Flax: a bigram table plus a running "memory" kept in the cache.
def _bigram_apply(params, tokens, positions, cache):
    logits = params["table"][tokens]
    return logits, cache


def _bigram_cache(batch, length):
    return jnp.zeros((batch, length), jnp.float32)


def test_user_model_plugs_in():
    rng = np.random.default_rng(0)
    table = jnp.asarray(rng.normal(size=(VOCAB, VOCAB)) * 3, jnp.float32)
    target = jaxspec.CausalLM(
        apply_fn=_bigram_apply, params={"table": table}, init_cache=_bigram_cache, vocab_size=VOCAB, name="bigram"
    )
    draft = target.replace(params={"table": table + jnp.asarray(rng.normal(size=table.shape), jnp.float32)})
    plain = jaxspec.generate(target, [[1], [2, 3]], max_new_tokens=12, temperature=0.0)
    spec = jaxspec.generate(target, [[1], [2, 3]], draft=draft, gamma=3, max_new_tokens=12, temperature=0.0)
    assert spec.tokens == plain.tokens
    expected = [1]
    for _ in range(12):
        expected.append(int(np.argmax(table[expected[-1]])))
    assert plain.tokens[0] == expected[1:]
    np.testing.assert_allclose(np.asarray(target.logits([1, 2])), np.asarray(table[jnp.asarray([1, 2])]))
