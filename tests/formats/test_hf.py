"""Hugging Face checkpoints: parity with transformers' logits (fixtures from scripts/fixtures/make_hf_fixtures.py),
cached decoding, bf16, the RoPE registry and clear errors for what is not supported. No torch needed."""

import json
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import FIXTURES_DIR, decode_in_chunks

import jaxspec
from jaxspec.models import rope

FIXTURES = FIXTURES_DIR / "hf"
NAMES = sorted(p.name for p in FIXTURES.iterdir() if (p / "expected.npz").exists())
SHARDED = "llama_linear_bf16_sharded"
PHI3 = "phi3_fused_swa"
WRAPPED = ("gemma3_multimodal", "mistral3_multimodal", "llava_llama")  # multimodal checkpoints (test_hf_wrappers)


def _expected(name):
    data = np.load(FIXTURES / name / "expected.npz")
    return data["ids"], data["logits"]


_CACHE = {}


def _load(name, dtype="float32"):
    if (name, dtype) not in _CACHE:
        _CACHE[name, dtype] = jaxspec.load(FIXTURES / name, dtype=dtype)
    return _CACHE[name, dtype]


def test_fixtures_present():
    assert len(NAMES) == 23, NAMES
    total = sum(p.stat().st_size for p in FIXTURES.rglob("*") if p.is_file())
    assert total < 3.5 * 2**20


@pytest.mark.parametrize("name", NAMES)
def test_logits_match_transformers(name):
    ids, expected = _expected(name)
    model = _load(name)
    assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(model.params))
    out = np.asarray(model.logits(ids))
    assert out.shape == expected.shape
    assert np.abs(out - expected).max() <= 1e-4


@pytest.mark.parametrize("name", [n for n in NAMES if n not in WRAPPED])  # wrappers: the text fixtures' modules
def test_cached_decoding_matches_full_pass(name):
    ids, expected = _expected(name)
    model = _load(name)
    for chunk in (1, 4):  # one token at a time, and γ + 1 = 4 at a time, after ragged prompts
        cached = decode_in_chunks(model, ids, [11, 4], chunk)
        np.testing.assert_allclose(cached, expected, atol=1e-4, rtol=0)


@pytest.mark.parametrize(
    "name", ["llama_gqa", "qwen3_qknorm", SHARDED, "gemma_gqa_tied", "gpt2_tied", PHI3, "gpt_neox_parallel"]
)
def test_bfloat16(name):
    ids, expected = _expected(name)
    model = _load(name, "bfloat16")
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(model.params))
    assert model.init_cache(1, 4).k.dtype == jnp.bfloat16
    out = np.asarray(model.logits(ids))
    assert out.dtype == np.float32
    assert np.abs(out - expected).max() < 0.25
    assert np.corrcoef(out.ravel(), expected.ravel())[0, 1] > 0.995


def test_config_mapping():
    q3 = _load("qwen3_qknorm").config
    assert (q3.qk_norm, q3.head_dim, q3.num_kv_heads, q3.tie_embeddings, q3.qkv_bias) == (True, 16, 1, False, False)
    q2 = _load("qwen2_bias_tied").config
    assert (q2.qkv_bias, q2.o_bias, q2.tie_embeddings, q2.rope_theta) == (True, False, True, 1e6)
    assert "lm_head" not in _load("qwen2_bias_tied").params
    l3 = _load("llama3_rope_mqa_tied").config
    assert l3.rope_type == "llama3" and dict(l3.rope_params)["original_max_position_embeddings"] == 64
    assert (l3.qkv_bias, l3.o_bias) == (True, True)
    assert _load("mistral_swa").config.sliding_window == 16
    assert _load(SHARDED).config.rope_type == "linear"
    g = _load("gemma_gqa_tied").config
    assert (g.norm_offset, g.embed_scale, g.mlp_activation, g.tie_embeddings, g.head_dim) == (
        1.0,
        True,
        "gelu_tanh",
        True,
        16,
    )
    assert (l3.norm_offset, l3.embed_scale, l3.mlp_activation) == (0.0, False, "silu")
    assert "lm_head" not in _load("gemma_gqa_tied").params


def test_gpt2_config_and_variants(tmp_path):
    model = _load("gpt2_tied")
    c = model.config
    assert (c.hidden_size, c.num_layers, c.num_heads, c.intermediate_size, c.max_positions, c.activation) == (
        32,
        2,
        4,
        64,
        128,
        "gelu_tanh",
    )
    assert set(model.params) == {"wte", "wpe", "layers", "ln_f"} and model.eos_token_id == 2
    for i, changes in enumerate(
        [dict(activation_function="relu"), dict(scale_attn_by_inverse_layer_idx=True), dict(tie_word_embeddings=False)]
    ):
        path = _copy("gpt2_tied", tmp_path / str(i))
        _edit_config(path, **changes)
        with pytest.raises(ValueError, match="not supported for gpt2"):
            jaxspec.load(path)


def test_gpt_neox_config_spellings_and_errors(tmp_path):
    """Pythia's config.json as transformers 4 wrote it (``rotary_pct``, ``rotary_emb_base``, ``rope_scaling``
    null) reads as transformers 5's ``rope_parameters``: the same config and logits; without any rotary fraction
    a quarter of each head rotates, as in transformers; what the module does not run is refused by name."""
    ids, expected = _expected("gpt_neox_parallel")
    model = _load("gpt_neox_parallel")
    c = model.config
    assert (c.rotary_dim, c.parallel_residual, c.attention_bias, c.tie_embeddings, c.activation) == (
        4,
        True,
        True,
        False,
        "gelu",
    )
    assert set(model.params) == {"embed_in", "embed_out", "final_layer_norm", "layers"}
    seq = _load("gpt_neox_sequential_linear").config
    assert (seq.rotary_dim, seq.rope_type, seq.rope_params, seq.parallel_residual, seq.tie_embeddings) == (
        8,
        "linear",
        (("factor", 2.0),),
        False,
        True,
    )
    legacy = _copy("gpt_neox_parallel", tmp_path / "legacy")
    _edit_config(legacy, rope_parameters=None, rotary_pct=0.25, rotary_emb_base=10000, attention_bias=None)
    default = _copy("gpt_neox_parallel", tmp_path / "default")
    _edit_config(default, rope_parameters=None)
    for path in (legacy, default):
        loaded = jaxspec.load(path)
        assert loaded.config == c
        assert np.abs(np.asarray(loaded.logits(ids)) - expected).max() <= 1e-4
    for i, (changes, match) in enumerate(
        [
            (dict(hidden_act="silu"), "hidden_act='silu' is not supported for gpt_neox"),
            (dict(rope_parameters=None, rotary_pct=0.1), "rotary_pct 0.1 gives 1 rotary dimensions"),
            (dict(rope_parameters=None, rope_scaling={"type": "dynamic", "factor": 2.0}), "rope type 'dynamic'"),
            (dict(num_attention_heads=3), "must divide by num_attention_heads 3"),
        ]
    ):
        path = _copy("gpt_neox_parallel", tmp_path / str(i))
        _edit_config(path, **changes)
        with pytest.raises(ValueError, match=match):
            jaxspec.load(path)


def test_granite_multipliers_and_their_defaults(tmp_path):
    """Granite's four multipliers are read; left out, each is 1.0 (transformers' default), which the reference
    logits then tell apart (the control that they count)."""
    ids, expected = _expected("granite_multipliers")
    c = _load("granite_multipliers").config
    assert (c.embedding_multiplier, c.residual_multiplier, c.attention_multiplier, c.logits_scaling) == (
        3.0,
        0.5,
        0.1,
        2.5,
    )
    assert (c.tie_embeddings, c.num_kv_heads, c.qkv_bias) == (True, 2, False)
    keys = ("embedding_multiplier", "residual_multiplier", "attention_multiplier", "logits_scaling")
    for key in keys:
        path = _copy("granite_multipliers", tmp_path / key)
        _edit_config(path, **{key: None})
        model = jaxspec.load(path)
        assert getattr(model.config, key) == 1.0
        assert np.abs(np.asarray(model.logits(ids)) - expected).max() > 0.05, key


def test_gemma_activation_spellings(tmp_path):
    """Hub Gemma configs carry the legacy hidden_act="gelu" (meaning tanh) and/or hidden_activation."""
    ids, expected = _expected("gemma_gqa_tied")
    for i, changes in enumerate(
        [dict(hidden_act="gelu"), dict(hidden_act="gelu", hidden_activation="gelu_pytorch_tanh"), dict(hidden_act=None)]
    ):
        path = _copy("gemma_gqa_tied", tmp_path / str(i))
        _edit_config(path, **changes)
        assert np.abs(np.asarray(jaxspec.load(path).logits(ids)) - expected).max() <= 1e-4
    for i, changes in enumerate(
        [dict(hidden_act="silu"), dict(hidden_activation="gelu"), dict(use_bidirectional_attention=True)]
    ):
        path = _copy("gemma_gqa_tied", tmp_path / f"bad{i}")
        _edit_config(path, **changes)
        with pytest.raises(ValueError, match="not supported for gemma"):
            jaxspec.load(path)


def test_phi3_fused_tensors_and_sliding_window(tmp_path):
    """Phi-3 runs on the Llama module: its fused qkv_proj / gate_up_proj become Llama's params, its window counts."""
    model = _load(PHI3)
    c = model.config
    assert (c.sliding_window, c.qkv_bias, c.o_bias, c.num_kv_heads, c.head_dim, c.tie_embeddings) == (
        16,
        False,
        False,
        2,
        8,
        False,
    )
    assert jax.tree.structure(model.params) == jax.tree.structure(_load("llama_gqa").params)
    assert model.param_axes == _load("llama_gqa").param_axes
    # negative control: without the window (SEQ = 56 > 16) the same weights give other logits
    ids, expected = _expected(PHI3)
    path = _copy(PHI3, tmp_path)
    _edit_config(path, sliding_window=None)
    assert np.abs(np.asarray(jaxspec.load(path).logits(ids)) - expected).max() > 1e-2


def test_phi3_fused_tensor_with_extra_rows(tmp_path):
    from jaxspec.formats import safetensors_file

    path = _copy(PHI3, tmp_path)
    tensors = {n: np.asarray(f.get(n)) for n, f in safetensors_file.open_dir(path).items()}
    qkv = tensors["model.layers.1.self_attn.qkv_proj.weight"]
    tensors["model.layers.1.self_attn.qkv_proj.weight"] = np.concatenate([qkv, qkv[:8]])  # 8 rows nothing takes
    (path / "model.safetensors").unlink()
    safetensors_file.write(path / "model.safetensors", tensors)
    with pytest.raises(ValueError, match=r"qkv_proj.weight has 72 rows, which does not match the config"):
        jaxspec.load(path)
    _edit_config(path, rope_parameters={"rope_type": "longrope", "rope_theta": 1e4, "short_factor": [1.0] * 4})
    with pytest.raises(ValueError, match=r"rope type 'longrope' needs parameter\(s\) \['long_factor'\]"):
        jaxspec.load(path)
    _edit_config(path, rope_parameters={"rope_type": "su", "short_factor": [1.0] * 4, "long_factor": [2.0] * 3})
    with pytest.raises(ValueError, match=r"longrope long_factor must be 4 finite numbers"):
        jaxspec.load(path)


def test_tokenizer_and_eos():
    model = _load(SHARDED)
    assert model.tokenizer is not None
    assert model.tokenizer.encode("w1 w2", add_special_tokens=False) == [5, 6]
    assert model.eos_token_id == 2
    assert _load("llama3_rope_mqa_tied").eos_token_id == (2, 3)  # a list in generation_config.json
    assert _load("llama_gqa").tokenizer is None
    assert jaxspec.load(FIXTURES / SHARDED, tokenizer=False).tokenizer is None


def test_generate_with_loaded_models():
    target, draft = _load(SHARDED), _load("qwen3_qknorm")
    plain = jaxspec.generate(target, ["w1 w2 w3"], max_new_tokens=6, temperature=0.0)
    spec = jaxspec.generate(target, ["w1 w2 w3"], draft=draft, gamma=3, max_new_tokens=6, temperature=0.0)
    assert spec.tokens == plain.tokens and 1 <= len(plain.tokens[0]) <= 6
    expected = np.asarray(target.logits([target.tokenizer.encode("w1 w2 w3")]))[0, -1].argmax()
    assert plain.tokens[0][0] == expected
    assert isinstance(plain.texts[0], str)


def _copy(name, tmp_path) -> Path:
    dst = tmp_path / name
    shutil.copytree(FIXTURES / name, dst)
    return dst


def _edit_config(path: Path, **changes):
    cfg = json.loads((path / "config.json").read_text())
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (path / "config.json").write_text(json.dumps(cfg))


def test_legacy_rope_scaling_format(tmp_path):
    """transformers 4 configs (and most Hub checkpoints) use top-level rope_theta + rope_scaling."""
    path = _copy("llama3_rope_mqa_tied", tmp_path)
    params = json.loads((path / "config.json").read_text())["rope_parameters"]
    theta = params.pop("rope_theta")
    params["type"] = params.pop("rope_type")  # the oldest spelling
    _edit_config(path, rope_parameters=None, rope_theta=theta, rope_scaling=params)
    ids, expected = _expected("llama3_rope_mqa_tied")
    assert np.abs(np.asarray(jaxspec.load(path).logits(ids)) - expected).max() <= 1e-4


def test_missing_config(tmp_path):
    path = _copy("llama_gqa", tmp_path)
    (path / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="config.json"):
        jaxspec.load(path)
    with pytest.raises(FileNotFoundError, match="not a directory"):
        jaxspec.load(tmp_path / "nope")


def test_unknown_model_type(tmp_path):
    path = _copy("llama_gqa", tmp_path)
    _edit_config(path, model_type="mamba")
    with pytest.raises(ValueError, match=r"unsupported model_type 'mamba'.*'gemma'.*'llama'.*'qwen3'"):
        jaxspec.load(path)


@pytest.mark.parametrize("rope_type", ["dynamic", "mrope"])
def test_unknown_rope_type(tmp_path, rope_type):
    path = _copy("llama_gqa", tmp_path)
    _edit_config(path, rope_parameters={"rope_type": rope_type, "rope_theta": 10000.0, "factor": 2.0})
    with pytest.raises(ValueError, match=rf"unsupported rope type '{rope_type}'.*'linear', 'llama3', 'longrope'"):
        jaxspec.load(path)


def test_partial_rotary_factor_only_where_transformers_honours_it(tmp_path):
    """A partial rotary factor loads for Phi-3 (the ``phi3_partial_longrope`` fixture: logits above) and is refused
    for the model types whose transformers code rotates whole heads; such a model exports as Phi-3."""
    assert _load("phi3_partial_longrope").config.rotary_dim == 8
    path = _copy("llama_gqa", tmp_path)
    _edit_config(path, partial_rotary_factor=0.5)
    with pytest.raises(ValueError, match=r"partial_rotary_factor=0.5 is not supported for llama \(only phi3\)"):
        jaxspec.load(path)
    with pytest.raises(ValueError, match="exports as model_type='phi3' only"):
        jaxspec.export_hf(_load("phi3_partial_longrope"), tmp_path / "as_llama", model_type="llama")


def test_rope_missing_parameter(tmp_path):
    path = _copy("llama_gqa", tmp_path)
    _edit_config(path, rope_parameters={"rope_type": "linear", "rope_theta": 10000.0})
    with pytest.raises(ValueError, match="'linear' needs parameter.*factor"):
        jaxspec.load(path)


def test_rope_registry_yarn_and_longrope_by_hand():
    """YaRN's blend and attention factor, and LongRoPE's per-position switch, worked out by hand (the fixtures
    check them against transformers' logits)."""
    base = rope.inverse_frequencies(16, 100.0)
    # dimension with r rotations over 32 positions: 16 ln(32 / (2π r)) / (2 ln 100): beta_fast 32 -> -1.6 -> 0,
    # beta_slow 1 -> 2.83 -> 3 (rounded outward); the blend runs over dimensions 0..3
    yarn = rope.rotation(16, 100.0, "yarn", factor=4.0, original_max_position_embeddings=32)
    blend = np.array([0, 1 / 3, 2 / 3, 1, 1, 1, 1, 1])
    np.testing.assert_allclose(yarn.inv_freq, base * (1 - blend) + base / 4 * blend, rtol=1e-12)
    assert yarn.attention_factor == pytest.approx(0.1 * np.log(4.0) + 1) and yarn.long_inv_freq is None
    # mscale / mscale_all_dim: the ratio of the two scales; an explicit attention_factor wins
    scaled = rope.rotation(
        16, 100.0, "yarn", factor=8.0, original_max_position_embeddings=32, mscale=1.0, mscale_all_dim=0.5
    )
    assert scaled.attention_factor == pytest.approx((0.1 * np.log(8) + 1) / (0.05 * np.log(8) + 1))
    fixed = rope.rotation(16, 100.0, "yarn", factor=8.0, original_max_position_embeddings=32, attention_factor=0.7)
    assert fixed.attention_factor == 0.7

    short, long = (1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.0, 3.5), (1.0, 1.5, 2.5, 4.0, 6.0, 8.0, 10.0, 12.0)
    lr = rope.rotation(
        16, 100.0, "longrope", short_factor=short, long_factor=long, original_max_position_embeddings=24, factor=4.0
    )
    np.testing.assert_allclose(lr.inv_freq, base / np.array(short), rtol=1e-12)
    np.testing.assert_allclose(lr.long_inv_freq, base / np.array(long), rtol=1e-12)
    assert lr.long_from == 24 and lr.attention_factor == pytest.approx(np.sqrt(1 + np.log(4) / np.log(24)))
    x = np.random.default_rng(0).standard_normal((1, 2, 1, 16)).astype(np.float32)
    got = np.asarray(rope.apply_rope(jnp.asarray(x), jnp.asarray([[23, 24]]), lr))
    for t, (position, inv) in enumerate([(23, lr.inv_freq), (24, lr.long_inv_freq)]):  # short at 23, long at 24
        want = rope.apply_rope(jnp.asarray(x[:, t : t + 1]), jnp.asarray([[position]]), inv) * lr.attention_factor
        np.testing.assert_allclose(got[:, t : t + 1], np.asarray(want), rtol=1e-5, atol=1e-6)
    wrong = rope.apply_rope(jnp.asarray(x[:, 1:]), jnp.asarray([[24]]), lr.inv_freq) * lr.attention_factor
    assert np.abs(got[:, 1:] - np.asarray(wrong)).max() > 1e-2  # negative control: the short factors at 24


def test_missing_shard(tmp_path):
    path = _copy(SHARDED, tmp_path)
    (path / "model-00002-of-00003.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="model-00002-of-00003.safetensors"):
        jaxspec.load(path)


def test_no_safetensors(tmp_path):
    path = _copy("llama_gqa", tmp_path)
    (path / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="safetensors"):
        jaxspec.load(path)


@pytest.mark.parametrize("dtype", ["float64", "fp32", "int8"])
def test_wrong_dtype(dtype):
    with pytest.raises(ValueError, match=r"dtype must be one of \['float32', 'bfloat16'"):
        jaxspec.load(FIXTURES / "llama_gqa", dtype=dtype)


def test_config_that_does_not_match_tensors(tmp_path):
    path = _copy("llama_gqa", tmp_path)
    _edit_config(path, intermediate_size=48)
    with pytest.raises(ValueError, match="does not match the config"):
        jaxspec.load(path)
    path = _copy("qwen2_bias_tied", tmp_path / "q")
    _edit_config(path, model_type="llama")  # llama without attention_bias: the q/k/v biases would be dropped
    with pytest.raises(ValueError, match="does not use.*bias"):
        jaxspec.load(path)


def test_unsupported_variants(tmp_path):
    path = _copy("qwen2_bias_tied", tmp_path)
    _edit_config(path, layer_types=["sliding_attention", "full_attention"], use_sliding_window=True, sliding_window=8)
    with pytest.raises(ValueError, match="sliding-window"):
        jaxspec.load(path)
    path = _copy("llama_gqa", tmp_path / "a")
    _edit_config(path, hidden_act="gelu")
    with pytest.raises(ValueError, match="hidden_act"):
        jaxspec.load(path)


def test_rope_registry_llama3_bands():
    head_dim, theta = 64, 500000.0
    params = dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192)
    base = rope.inverse_frequencies(head_dim, theta)
    scaled = rope.inverse_frequencies(head_dim, theta, "llama3", **params)
    wavelen = 2 * np.pi / base
    high = wavelen < 8192 / 4
    low = wavelen > 8192 / 1
    medium = ~high & ~low
    assert high.any() and low.any() and medium.any()
    np.testing.assert_array_equal(scaled[high], base[high])
    np.testing.assert_allclose(scaled[low], base[low] / 8.0, rtol=1e-12)
    assert np.all(scaled[medium] < base[medium]) and np.all(scaled[medium] > base[medium] / 8.0)
    np.testing.assert_allclose(rope.inverse_frequencies(head_dim, theta, "linear", factor=4.0), base / 4.0)
    np.testing.assert_allclose(rope.inverse_frequencies(head_dim, theta, "default"), base)
    assert {"default", "linear", "llama3"} <= set(rope.ROPE_TYPES)
    with pytest.raises(ValueError, match="unsupported rope type 'dynamic'"):
        rope.inverse_frequencies(head_dim, theta, "dynamic", factor=2.0)
    with pytest.raises(ValueError, match="does not take"):
        rope.inverse_frequencies(head_dim, theta, "linear", factor=2.0, beta_fast=32)
    # per-frequency divisors (a GGUF file's rope_freqs): llama3's bands expressed as base / scaled
    divisors = tuple(base / scaled)
    np.testing.assert_allclose(rope.inverse_frequencies(head_dim, theta, "factors", factors=divisors), scaled)
    with pytest.raises(ValueError, match="must be 32 finite numbers > 0"):
        rope.inverse_frequencies(head_dim, theta, "factors", factors=divisors[:-1])
    with pytest.raises(ValueError, match="must be 32 finite numbers > 0"):
        rope.inverse_frequencies(head_dim, theta, "factors", factors=(0.0,) * 32)


def test_gpt_neox_speculative_greedy_equals_plain_and_shards_by_heads():
    """A GPT-NeoX target verifying drafts of noisy copies of itself (α high and low): greedy output is plain
    decoding's. On a mesh the fused q/k/v projection splits over the model axis (by whole heads here)."""
    from jaxspec.models import gpt_neox

    target = _load("gpt_neox_parallel")
    ids, _ = _expected("gpt_neox_parallel")
    prompts = [ids[0, :9].tolist(), ids[1, :4].tolist()]
    kw = dict(max_new_tokens=12, temperature=0.0, eos_token_id=())
    plain = jaxspec.generate(target, prompts, **kw)
    leaves, tree = jax.tree.flatten(target.params)
    keys = jax.random.split(jax.random.key(0), len(leaves))
    alphas = []
    for scale in (0.1, 0.3):
        noisy = [x + scale * jnp.std(x) * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)]
        draft = target.replace(params=jax.tree.unflatten(tree, noisy), name=f"noisy-{scale}")
        spec = jaxspec.generate(target, prompts, draft=draft, gamma=3, **kw)
        assert spec.tokens == plain.tokens
        alphas.append(spec.stats.acceptance_rate)
    assert alphas[0] > 0.5 > alphas[1] > 0, alphas  # both accepting and correcting rounds
    shardings = gpt_neox.FAMILY.shardings(target.config, {"data": 4, "model": 2})
    assert shardings["layers"]["attention"]["query_key_value"]["kernel"].spec == jax.sharding.PartitionSpec(
        None, None, "model"
    )
