"""export_hf: jaxspec -> Hugging Face directory -> jaxspec gives identical parameters and logits."""

import dataclasses
import json

import jax
import numpy as np
import pytest
from helpers import FIXTURES_DIR

import jaxspec
from jaxspec.formats.hf_export import export_hf
from jaxspec.models import llama

FIXTURES = FIXTURES_DIR / "hf"
BASE = dict(
    vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2, init_std=0.2
)
VARIANTS = {
    "llama_untied": {},
    "llama_tied_bias_llama3": dict(
        tie_embeddings=True,
        qkv_bias=True,
        o_bias=True,
        rope_type="llama3",
        rope_params={
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        },
    ),
    "qwen2": dict(qkv_bias=True, tie_embeddings=True),
    "qwen3": dict(qk_norm=True, head_dim=16, num_kv_heads=1),
    "mistral": dict(sliding_window=8),
    "bf16_linear": dict(dtype="bfloat16", rope_type="linear", rope_params={"factor": 4.0}),
    "gemma": dict(norm_offset=1.0, embed_scale=True, mlp_activation="gelu_tanh", tie_embeddings=True, head_dim=16),
}


def _perturbed(cfg, seed):
    """Random weights with non-trivial norms and biases (init gives ones/zeros there)."""
    model = llama.init(cfg, seed=seed, eos_token_id=(2, 3), name="m")
    leaves, tree = jax.tree.flatten(model.params)
    rng = np.random.default_rng(seed)
    noisy = [np.asarray(x) + rng.normal(0, 0.1, x.shape).astype(x.dtype) for x in leaves]
    return model.replace(params=jax.tree.unflatten(tree, noisy))


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_round_trip(variant, tmp_path):
    model = _perturbed(llama.LlamaConfig(**{**BASE, **VARIANTS[variant]}), seed=len(variant))
    back = jaxspec.load(export_hf(model, tmp_path / variant), dtype=model.config.dtype)
    assert back.config == dataclasses.replace(model.config, init_std=back.config.init_std)  # init_std: not saved
    assert back.eos_token_id == (2, 3)
    for a, b in zip(jax.tree.leaves(model.params), jax.tree.leaves(back.params)):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    ids = np.arange(40).reshape(1, 40) % 64  # past the llama3 / sliding-window thresholds
    np.testing.assert_array_equal(np.asarray(model.logits(ids)), np.asarray(back.logits(ids)))


# the multimodal fixtures' text models are the text-only fixtures' modules: exported the same way; GPT-2 and
# GPT-NeoX have no export (test_refuses_other_families)
LEFT_OUT = ("gemma3_multimodal", "mistral3_multimodal", "llava_llama", "gpt2_tied")


@pytest.mark.parametrize(
    "fixture",
    sorted(p.name for p in FIXTURES.iterdir() if p.is_dir() and p.name not in LEFT_OUT and "neox" not in p.name),
)
def test_reexported_fixture_matches_the_reference_logits(fixture, tmp_path):
    """A transformers checkpoint, loaded and exported again, still gives transformers' logits."""
    model = jaxspec.load(FIXTURES / fixture)
    back = jaxspec.load(export_hf(model, tmp_path / fixture))
    ref = np.load(FIXTURES / fixture / "expected.npz")
    np.testing.assert_allclose(np.asarray(back.logits(ref["ids"])), ref["logits"], atol=1e-4)
    if model.tokenizer is not None:
        assert back.tokenizer.encode("def f(x):") == model.tokenizer.encode("def f(x):")


@pytest.mark.parametrize("fixture, config", [("gpt2_tied", "GPT2Config"), ("gpt_neox_parallel", "GPTNeoXConfig")])
def test_refuses_other_families(tmp_path, fixture, config):
    with pytest.raises(ValueError, match=f"Llama-family.*{config}"):
        export_hf(jaxspec.load(FIXTURES / fixture), tmp_path / fixture)


def test_refuses_non_llama_and_non_empty(tmp_path):
    table_model = jaxspec.CausalLM(
        apply_fn=lambda p, t, pos, c: (p[t], c), params=np.zeros((4, 4)), init_cache=lambda b, n: None, vocab_size=4
    )
    with pytest.raises(ValueError, match="Llama-family"):
        export_hf(table_model, tmp_path / "x")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "f").write_text("x")
    with pytest.raises(FileExistsError):
        export_hf(_perturbed(llama.LlamaConfig(**BASE), 0), tmp_path / "full")


def test_refuses_configs_without_a_model_type(tmp_path):
    mixed = llama.LlamaConfig(**BASE, norm_offset=1.0)  # Gemma norms with a SwiGLU MLP: no HF architecture
    with pytest.raises(ValueError, match="match no Hugging Face model_type"):
        export_hf(_perturbed(mixed, 0), tmp_path / "mixed")
    gemma_qk = llama.LlamaConfig(**BASE, norm_offset=1.0, embed_scale=True, mlp_activation="gelu_tanh", qk_norm=True)
    with pytest.raises(ValueError, match="Gemma-style"):
        export_hf(_perturbed(gemma_qk, 0), tmp_path / "gemma_qk")
    for i, extra in enumerate([dict(qk_norm=True), dict(sliding_window=8)]):
        granite = llama.LlamaConfig(**BASE, logits_scaling=2.0, **extra)
        with pytest.raises(ValueError, match="Granite"):
            export_hf(_perturbed(granite, 0), tmp_path / f"granite{i}")


@pytest.mark.parametrize("tied", [True, False])
def test_reduced_vocabulary_exports_over_the_full_vocabulary(tied, tmp_path):
    """transformers has no -inf logits: the export keeps the kept ids' logits and gives the others logit 0."""
    ids = tuple(range(0, 64, 4))
    model = _perturbed(llama.LlamaConfig(**BASE, tie_embeddings=tied, vocab_ids=ids), seed=3)
    back = jaxspec.load(export_hf(model, tmp_path / "reduced"), dtype=model.config.dtype)
    assert back.config.vocab_ids == () and back.vocab_size == 64 and not back.config.tie_embeddings
    seq = np.asarray([[0, 8, 4, 60, 13, 7]])  # 13 and 7 are outside: both embed as the out-of-vocabulary row
    want, got = np.asarray(model.logits(seq)), np.asarray(back.logits(seq))
    np.testing.assert_allclose(got[..., list(ids)], want[..., list(ids)], rtol=1e-5, atol=1e-5)
    outside = np.setdiff1d(np.arange(64), ids)
    assert np.isneginf(want[..., outside]).all() and (got[..., outside] == 0).all()


def test_phi3_fixture_exports_as_phi3_with_the_same_fused_tensors(tmp_path):
    """Import splits qkv_proj / gate_up_proj by the weight table, export concatenates them back: bit for bit."""
    from jaxspec.formats import safetensors_file

    model = jaxspec.load(FIXTURES / "phi3_fused_swa")
    out = export_hf(model, tmp_path / "phi3", model_type="phi3")
    config = json.loads((out / "config.json").read_text())
    assert (config["model_type"], config["architectures"], config["sliding_window"]) == (
        "phi3",
        ["Phi3ForCausalLM"],
        16,
    )
    original = safetensors_file.open_dir(FIXTURES / "phi3_fused_swa")
    written = safetensors_file.open_dir(out)
    assert set(written) == set(original) and "model.layers.1.self_attn.qkv_proj.weight" in written
    for name in original:
        np.testing.assert_array_equal(written[name].get(name), original[name].get(name))
    back = jaxspec.load(out)
    assert back.config == model.config
    ref = np.load(FIXTURES / "phi3_fused_swa" / "expected.npz")
    np.testing.assert_allclose(np.asarray(back.logits(ref["ids"])), ref["logits"], atol=1e-4)


@pytest.mark.parametrize("variant", ["llama_untied", "mistral", "tied_mqa_bf16"])
def test_phi3_layout_round_trip(variant, tmp_path):
    extra = {"llama_untied": {}, "mistral": dict(sliding_window=8)}
    extra["tied_mqa_bf16"] = dict(tie_embeddings=True, num_kv_heads=1, dtype="bfloat16")
    model = _perturbed(llama.LlamaConfig(**{**BASE, **extra[variant]}), seed=5)
    back = jaxspec.load(export_hf(model, tmp_path / variant, model_type="phi3"), dtype=model.config.dtype)
    assert back.config == dataclasses.replace(model.config, init_std=back.config.init_std)
    for a, b in zip(jax.tree.leaves(model.params), jax.tree.leaves(back.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_model_type_that_cannot_describe_the_model(tmp_path):
    qwen2 = _perturbed(llama.LlamaConfig(**BASE, qkv_bias=True), 0)
    with pytest.raises(ValueError, match=r"Phi-3 has .*this config has \{'qkv_bias': True\}"):
        export_hf(qwen2, tmp_path / "a", model_type="phi3")
    with pytest.raises(ValueError, match="this config is a 'qwen2' model, not model_type='llama'"):
        export_hf(qwen2, tmp_path / "b", model_type="llama")
    with pytest.raises(ValueError, match="unsupported model_type 'mamba'"):
        export_hf(qwen2, tmp_path / "c", model_type="mamba")
    with pytest.raises(ValueError, match="Llama-family.*GPT2Config as model_type='phi3'"):
        export_hf(jaxspec.load(FIXTURES / "gpt2_tied"), tmp_path / "d", model_type="phi3")
    assert not any((tmp_path / d).exists() for d in "abcd")  # refused before writing anything
