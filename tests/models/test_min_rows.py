"""``min_rows`` (jaxspec.models.families.with_min_rows, ``jaxspec.load(min_rows=...)``): every weight product over
fewer rows computed over that many, zero rows appended. The lowered program's products have the padded rows (and
the unpadded model's have one, the control); logits and greedy speculation are unchanged; the loader's default
follows the backend; bad values and models that cannot be rebuilt are errors naming the argument."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import tiny_config

import jaxspec
from jaxspec.core.cache import KVCache
from jaxspec.core.model import CausalLM
from jaxspec.drafters.eagle import EagleDrafter
from jaxspec.models import eagle3, families, gpt2, llama

# a matrix product of two 2-D operands in StableHLO: (rows x in, in x out or out x in)
PRODUCT = re.compile(r"stablehlo\.dot_general .*: \(tensor<(\d+)x\d+x[a-z]+\d+>, tensor<\d+x\d+x[a-z]+\d+>\)")


def product_rows(model: CausalLM, tokens: int) -> list[int]:
    """The row count of every weight product in ``model``'s lowered forward pass over ``tokens`` new tokens."""
    cache = model.init_cache(1, 16)
    ids = jnp.zeros((1, tokens), jnp.int32)
    positions = jnp.arange(tokens, dtype=jnp.int32)[None]
    text = jax.jit(model.apply_fn).lower(model.params, ids, positions, cache).as_text()
    return [int(m.group(1)) for m in PRODUCT.finditer(text)]


MODELS = {
    "llama": lambda: llama.init(tiny_config(), seed=0),
    "llama-tied": lambda: llama.init(tiny_config(tie_embeddings=True), seed=0),
    "llama-w8a8": lambda: jaxspec.quantize(llama.init(tiny_config(), seed=0), "w8a8"),
    "llama-int8": lambda: jaxspec.quantize(llama.init(tiny_config(), seed=0), "int8"),
    "gpt2": lambda: gpt2.init(gpt2.GPT2Config(vocab_size=64, hidden_size=32, num_layers=2, num_heads=2), seed=0),
}


@pytest.mark.parametrize("name", list(MODELS))
def test_one_row_products_are_computed_over_two_rows_with_the_same_logits(name):
    model = MODELS[name]()
    padded = families.with_min_rows(model, 2)
    assert padded.config.min_rows == 2 and padded.params is model.params
    one = product_rows(model, 1)
    assert len(one) >= 7  # q, k, v, o, the MLP's, the LM head: every layer's and the head's products
    # the control: without padding a one-token pass multiplies one row, except w8a8's own two-row integer products
    assert set(one) == ({2} if name == "llama-w8a8" else {1})
    assert set(product_rows(padded, 1)) == {2}
    assert set(product_rows(padded, 3)) == set(product_rows(model, 3)) == {3}  # wider passes as they were
    tokens = jnp.asarray([[4, 9, 1, 33, 2]])
    np.testing.assert_allclose(
        np.asarray(padded.logits(tokens)), np.asarray(model.logits(tokens)), rtol=1e-5, atol=1e-5
    )
    step = model.apply_fn(model.params, tokens[:, :1], jnp.zeros((1, 1), jnp.int32), model.init_cache(1, 8))[0]
    step_pad = padded.apply_fn(padded.params, tokens[:, :1], jnp.zeros((1, 1), jnp.int32), padded.init_cache(1, 8))[0]
    np.testing.assert_allclose(np.asarray(step_pad), np.asarray(step), rtol=1e-5, atol=1e-5)


def test_speculation_with_padded_products_matches_plain_greedy(target):
    padded = families.with_min_rows(target, 2)
    cfg = eagle3.head_config(padded.config, tuple(range(0, target.vocab_size, 2)), aux_layers=(0, 1, 2))
    assert cfg.layer.min_rows == 2  # a head built for the target pads its own products too
    own = {k: v for k, v in eagle3.init_own(cfg, seed=3).items() if k != "lm_head"}
    head = EagleDrafter.for_target(padded, own, config=cfg)
    prompts = [[3, 7, 1, 9], [5]]
    want = jaxspec.generate(target, prompts, max_new_tokens=12, temperature=0.0).tokens
    for kw in ({}, {"draft": head, "gamma": 3}, {"draft": head, "tree": (3, 2, 4)}):
        got = jaxspec.generate(padded, prompts, max_new_tokens=12, temperature=0.0, **kw).tokens
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_the_loader_pads_on_a_gpu_and_not_elsewhere(target, tmp_path, monkeypatch):
    jaxspec.save(families.with_min_rows(target, 2), tmp_path / "m")  # a config saved padded is not kept padded
    assert jaxspec.load(tmp_path / "m").config.min_rows == families.default_min_rows() == 1  # this CPU
    assert jaxspec.load(tmp_path / "m", min_rows=3).config.min_rows == 3
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert families.default_min_rows() == 2
    assert jaxspec.load(tmp_path / "m").config.min_rows == 2
    assert jaxspec.load(tmp_path / "m", min_rows=1).config.min_rows == 1


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", True])
def test_bad_min_rows_is_an_error_naming_it_before_loading(bad, target):
    with pytest.raises(ValueError, match="min_rows must be an int >= 1"):
        jaxspec.load("/nonexistent/model", min_rows=bad)  # checked before the path is read
    with pytest.raises(ValueError, match="min_rows must be an int >= 1"):
        families.with_min_rows(target, bad)
    with pytest.raises(ValueError, match="min_rows must be an int >= 1"):
        tiny_config(min_rows=bad)


def test_a_model_its_family_did_not_build_is_left_as_it_is_or_refused(target):
    def apply_fn(params, tokens, positions, cache):  # a wrapped forward: not the family's own
        return target.apply_fn(params, tokens, positions, cache)

    wrapped = target.replace(apply_fn=apply_fn)
    assert families.with_min_rows(wrapped) is wrapped
    with pytest.raises(ValueError, match="min_rows: 'target' is not a built-in family's model"):
        families.with_min_rows(wrapped, 2)
    custom = CausalLM(apply_fn, target.params, lambda b, n: KVCache.zeros(2, b, n, 2, 16, jnp.float32), 64, name="c")
    assert families.with_min_rows(custom) is custom
    with pytest.raises(ValueError, match="min_rows: 'c' is not a built-in family's model"):
        families.with_min_rows(custom, 2)
