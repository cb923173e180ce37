"""Quantized weights (jaxspec.models.quant): the scheme against a NumPy reference, every family's forward pass over
int8 params, speculation over a quantized target equal to its plain decoding, EAGLE heads on quantized targets,
meshes, loading and errors. The sampling exactness over quantized models is in tests/generation/test_exactness.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import tiny_config

import jaxspec
from jaxspec.models import eagle as eagle_model
from jaxspec.models import families, gpt2, gpt_neox, llama, quant
from jaxspec.parallel import sharding


def np_quantize_columns(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The reference of the int8 scheme: per output column (last axis), absmax to ±127, round half to even."""
    amax = np.abs(w).max(axis=-2)
    scale = np.where(amax > 0, amax / 127.0, 1.0)
    return np.clip(np.round(w / scale[..., None, :]), -127, 127).astype(np.int8), scale


def np_project(x: np.ndarray, q: np.ndarray, scale: np.ndarray, a8: bool) -> np.ndarray:
    """The reference product: float x times the dequantized kernel, or (w8a8) x's rows quantized by their absmax."""
    if not a8:
        return x.astype(np.float64) @ (q.astype(np.float64) * scale)
    amax = np.abs(x).max(axis=-1, keepdims=True)
    xs = np.where(amax > 0, amax / 127.0, 1.0)
    xq = np.clip(np.round(x / xs), -127, 127).astype(np.int64)
    return (xq @ q.astype(np.int64)).astype(np.float64) * xs * scale


def test_round_trip_error_is_within_half_a_step_per_column():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((3, 40, 24)).astype(np.float32) * rng.uniform(0.01, 5, (3, 1, 24)).astype(np.float32)
    w[1, :, 5] = 0.0  # an all-zero column
    q, scale = quant.quantize_kernel(jnp.asarray(w))
    ref_q, ref_scale = np_quantize_columns(w)
    assert q.dtype == jnp.int8 and q.shape == w.shape and scale.shape == (3, 24)
    np.testing.assert_allclose(np.asarray(scale), ref_scale, rtol=1e-6)
    assert np.abs(np.asarray(q, np.int32) - ref_q).max() <= 1  # a rounding tie may fall either way in float32
    back = np.asarray(quant.dequantize_kernel(q, scale, jnp.float32))
    assert np.all(np.abs(back - w) <= scale[:, None, :] * 0.5 + 1e-6)
    assert np.all(back[1, :, 5] == 0)
    table = rng.standard_normal((30, 8)).astype(np.float32)
    tq, ts = quant.quantize_table(jnp.asarray(table))
    assert tq.shape == (30, 8) and ts.shape == (30,)
    back = np.asarray(quant.dequantize_table(tq, ts, jnp.float32))
    assert np.all(np.abs(back - table) <= np.asarray(ts)[:, None] * 0.5 + 1e-6)
    # the control: a coarser grid (int4's 7 steps) breaks the bound
    coarse = np.round(table / (np.asarray(ts)[:, None] * 127 / 7)) * (np.asarray(ts)[:, None] * 127 / 7)
    assert not np.all(np.abs(coarse - table) <= np.asarray(ts)[:, None] * 0.5 + 1e-6)


@pytest.mark.parametrize("a8", [False, True], ids=["int8", "w8a8"])
@pytest.mark.parametrize("rows", [1, 3])
def test_products_match_the_numpy_reference(a8, rows):
    rng = np.random.default_rng(rows)
    x = rng.standard_normal((1, rows, 48)).astype(np.float32)
    x[0, 0, 7] = 9.0  # an outlier feature: the row's scale follows it
    w = rng.standard_normal((48, 20)).astype(np.float32)
    q, scale = np_quantize_columns(w)
    got = np.asarray(quant.project(jnp.asarray(x), jnp.asarray(q), jnp.asarray(scale), jnp.float32, a8=a8))
    want = np_project(x[0], q, scale, a8)[None]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    # the transposed layout (a tied embedding's attend) gives the same product
    got_t = quant.project(jnp.asarray(x), jnp.asarray(q.T), jnp.asarray(scale), jnp.float32, a8=a8, contract=1)
    np.testing.assert_allclose(np.asarray(got_t), want, rtol=1e-5, atol=1e-4)
    # w8a8 differs from the weight-only product by the activations' rounding, which the reference reproduces
    other = np_project(x[0], q, scale, not a8)[None]
    assert np.abs(other - want).max() > 1e-3


FAMILIES = {
    "llama": lambda: llama.init(tiny_config(), seed=0),
    "gemma3": lambda: llama.init(
        tiny_config(embed_scale=True, norm_offset=1.0, sandwich_norms=True, qk_norm=True, tie_embeddings=True), seed=0
    ),
    "gpt2": lambda: gpt2.init(gpt2.GPT2Config(vocab_size=64, hidden_size=32, num_layers=2, num_heads=2), seed=0),
    "gpt_neox": lambda: gpt_neox.init(
        gpt_neox.GPTNeoXConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2),
        seed=0,
    ),
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_every_family_computes_with_its_int8_weights(family):
    """int8 logits equal the float model's run on the dequantized weights (the same numbers, products taken in
    another order), and differ from the float model's by the quantization error only."""
    model = FAMILIES[family]()
    q = jaxspec.quantize(model, "int8")
    kinds = {path[-1].key for path, x in jax.tree_util.tree_leaves_with_path(q.params) if x.dtype == jnp.int8}
    assert kinds == {"kernel", "embedding"}
    assert q.param_bytes < 0.45 * model.param_bytes  # tiny models: norms and biases weigh more than in real ones
    tokens = jnp.asarray([[1, 5, 9, 2, 30, 7]])
    deq = model.replace(params=quant.dequantize_params(q.params, jnp.float32))
    np.testing.assert_allclose(np.asarray(q.logits(tokens)), np.asarray(deq.logits(tokens)), rtol=1e-4, atol=1e-4)
    err = np.abs(np.asarray(q.logits(tokens)) - np.asarray(model.logits(tokens))).max()
    assert 0 < err < 0.05 * np.abs(np.asarray(model.logits(tokens))).max()
    # quantizing twice changes nothing; the stacked layout reads int8 leaves too
    assert jax.tree.all(jax.tree.map(lambda a, b: bool((a == b).all()), jaxspec.quantize(q).params, q.params))
    stacked = q.replace(params=families.stack_layers(q.params))
    np.testing.assert_allclose(np.asarray(stacked.logits(tokens)), np.asarray(q.logits(tokens)), atol=1e-5)


def test_greedy_speculation_over_quantized_models_equals_their_plain_decoding(target, small_draft, mixed_prompts):
    """generate, Engine and a 2x4 mesh over a w8a8 target with an int8 draft: greedy speculative == plain."""
    qt, qd = jaxspec.quantize(target, "w8a8"), jaxspec.quantize(small_draft, "int8")
    kw = dict(max_new_tokens=12, temperature=0.0)
    plain = jaxspec.generate(qt, mixed_prompts[:4], **kw)
    spec = jaxspec.generate(qt, mixed_prompts[:4], draft=qd, gamma=3, **kw)
    assert spec.tokens == plain.tokens and spec.stats.mode == "speculative"
    engine = jaxspec.Engine(qt, draft=qd, gamma=3, slots=2, max_length=64, temperature=0.0)
    rows = {r.index: r.tokens for r in engine.run([{"prompt": p, "max_new_tokens": 12} for p in mixed_prompts[:4]])}
    assert [rows[i] for i in range(4)] == plain.tokens
    meshed = jaxspec.generate(qt, mixed_prompts[:4], draft=qd, gamma=3, mesh={"data": 2, "model": 4}, **kw)
    assert meshed.tokens == plain.tokens
    placed = jaxspec.shard(qt, sharding.make_mesh({"data": 2, "model": 4})).params
    q_proj = placed["layers"][0]["attn"]["q_proj"]
    assert q_proj["kernel"].dtype == jnp.int8
    assert q_proj["kernel"].sharding.spec == jax.sharding.PartitionSpec(None, "model")
    assert q_proj["kernel_scale_a8"].sharding.spec == jax.sharding.PartitionSpec("model")


def test_an_eagle_head_drafts_on_a_quantized_target(target, mixed_prompts):
    """A head over a draft vocabulary (every other id) reads the target's int8 embedding and LM head columns: as the
    float head reads their dequantized copies (int8), and drafting exactly (w8a8: greedy speculative == plain)."""
    cfg = eagle_model.head_config(target.config, vocab_ids=tuple(range(0, target.config.vocab_size, 2)))
    own = eagle_model.init_own(cfg, seed=3)
    qt = jaxspec.quantize(target, "int8")
    head = jaxspec.eagle.EagleDrafter.for_target(qt, own, config=cfg)
    assert head.params["embed"].dtype == jnp.int8 and head.params["head"].dtype == jnp.int8
    deq = jaxspec.eagle.EagleDrafter.for_target(
        qt.replace(params=quant.dequantize_params(qt.params, jnp.float32)), own, config=cfg
    )
    tokens = jnp.asarray([[3, 8, 1, 40]])
    got, want = np.asarray(head.as_model().logits(tokens)), np.asarray(deq.as_model().logits(tokens))
    assert np.array_equal(np.isfinite(want), np.isfinite(got))  # ids outside the draft vocabulary stay -inf
    np.testing.assert_allclose(got[np.isfinite(want)], want[np.isfinite(want)], atol=2e-3)
    qt = jaxspec.quantize(target, "w8a8")
    head = jaxspec.quantize(jaxspec.eagle.EagleDrafter.for_target(qt, own, config=cfg), "w8a8")
    assert "head_scale_a8" in head.params and head.params["fc"]["kernel"].dtype == jnp.int8
    kw = dict(max_new_tokens=10, temperature=0.0)
    plain = jaxspec.generate(qt, mixed_prompts[:3], **kw)
    assert jaxspec.generate(qt, mixed_prompts[:3], draft=head, gamma=2, **kw).tokens == plain.tokens


def test_errors_name_the_argument(target, tmp_path):
    with pytest.raises(ValueError, match="quantize must be one of"):
        jaxspec.load(tmp_path / "nothing-here", quantize="int3")  # refused before anything is read
    with pytest.raises(ValueError, match="fmt must be one of"):
        jaxspec.quantize(target, "fp8")
    custom = jaxspec.CausalLM(target.apply_fn, target.params, target.init_cache, target.vocab_size, name="mine")
    with pytest.raises(ValueError, match="'mine' is not a built-in family"):
        jaxspec.quantize(custom)
    with pytest.raises(TypeError, match="expected a CausalLM"):
        jaxspec.quantize("smollm2")


@pytest.mark.parametrize("fmt", quant.FORMATS)
def test_checkpoints_save_and_restore_quantized_params(target, fmt, tmp_path):
    q = jaxspec.quantize(target, fmt)
    tokens = jnp.asarray([[4, 9, 1, 33, 2]])
    jaxspec.save(q, tmp_path / "plain")
    back = jaxspec.load(tmp_path / "plain")
    assert quant.format_of(back.params) == fmt
    np.testing.assert_array_equal(np.asarray(back.logits(tokens)), np.asarray(q.logits(tokens)))
    # a bfloat16 store halves the float leaves only: int8 weights and float32 scales are kept as they are
    jaxspec.save(q, tmp_path / "bf16", storage_dtype="bfloat16")
    small = jaxspec.load(tmp_path / "bf16")
    leaf = small.params["layers"][0]["attn"]["q_proj"]
    assert leaf["kernel"].dtype == jnp.int8 and next(v for k, v in leaf.items() if "scale" in k).dtype == jnp.float32
    np.testing.assert_array_equal(
        np.asarray(leaf["kernel"]), np.asarray(q.params["layers"][0]["attn"]["q_proj"]["kernel"])
    )
    meshed = jaxspec.load(tmp_path / "plain", mesh={"data": 2, "model": 4})
    assert meshed.params["layers"][0]["attn"]["q_proj"]["kernel"].sharding.spec == jax.sharding.PartitionSpec(
        None, "model"
    )
    np.testing.assert_allclose(np.asarray(meshed.logits(tokens)), np.asarray(q.logits(tokens)), atol=1e-4)


def test_export_hf_writes_the_dequantized_weights(target, tmp_path):
    q = jaxspec.quantize(target, "int8")
    jaxspec.export_hf(q, tmp_path / "hf")
    back = jaxspec.load(tmp_path / "hf")
    tokens = jnp.asarray([[4, 9, 1, 33, 2]])
    np.testing.assert_allclose(np.asarray(back.logits(tokens)), np.asarray(q.logits(tokens)), atol=1e-4)


def test_training_refuses_quantized_weights_it_would_misread(target, small_draft, tmp_path):
    from jaxspec.training import eagle3 as train3

    with pytest.raises(ValueError, match="no gradients: distill its float weights"):
        jaxspec.distill(target, jaxspec.quantize(small_draft), [[1, 2, 3]], out_dir=tmp_path / "d", steps=1)
    with pytest.raises(ValueError, match="train the head on the float target"):
        train3.train_head(jaxspec.quantize(target), [], out_dir=tmp_path / "h", steps=1)
