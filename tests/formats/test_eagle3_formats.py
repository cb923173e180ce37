"""Published EAGLE-3 checkpoints (jaxspec.formats.eagle3 through jaxspec.eagle.load): both layouts load as they
are and compute what the reference implementation computes.

The fixtures in tests/fixtures/eagle3/ were written by vLLM's ``speculators`` package (its Eagle3DraftModel, a
tiny random head: hidden 64, 4 / 2 KV heads, vocab 256, draft vocabulary 96, fused layers 2, 5, 7) and the
reference outputs by that model's own forward pass, in a separate torch environment
(scripts/fixtures/make_eagle3_fixtures.py). ``eagle/`` is the same head in the EAGLE authors' layout, without the
embedding (the target's is read)."""

import dataclasses
import json
import shutil
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import jaxspec
from jaxspec.drafters import eagle
from jaxspec.models import eagle3, llama
from jaxspec.training import eagle3 as train3

FIXTURES = Path(__file__).parent.parent / "fixtures" / "eagle3"
REF = load_file(str(FIXTURES / "reference.safetensors"))


@pytest.fixture(scope="module")
def target():
    """A random 10-layer Llama of the head's sizes (EAGLE-3's default fused layers: 2, 5, 7) whose input
    embedding is the one the reference head read."""
    cfg = llama.LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_layers=10,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
    )
    params = llama.init_params(cfg, seed=0)
    params["embed"]["embedding"] = jnp.asarray(REF["embed"])
    return llama.FAMILY.from_params(cfg, params, name="tiny-target")


@pytest.mark.parametrize("layout", ["speculators", "eagle"])
def test_both_layouts_match_the_reference_within_1e4(target, layout):
    """Step 1 (fused target features in) and step 2 (the head's own hidden state fed back, attending to step 1's
    keys and its own) give the reference's draft-vocabulary logits and hidden states within 1e-4; the full-vocabulary
    argmax is the reference's draft token mapped through d2t."""
    head = eagle.load(FIXTURES / layout, target)
    assert head.eagle3 and head.config.aux_layers == (2, 5, 7) and head.config.draft_vocab_size == 96
    apply_fn, init_cache = eagle3.head_fns(head.config)
    ids, aux, pos = (jnp.asarray(REF[k]) for k in ("input_ids", "aux_hidden", "positions"))
    logits, hidden, _ = apply_fn(head.params, ids, aux, pos, init_cache(1, 16), False)
    np.testing.assert_allclose(np.asarray(logits), REF["logits"], atol=1e-4, rtol=0)
    np.testing.assert_allclose(np.asarray(hidden), REF["hidden_out"], atol=1e-4, rtol=0)
    full, _, _ = apply_fn(head.params, ids, aux, pos, init_cache(1, 16))
    np.testing.assert_array_equal(np.argmax(np.asarray(full), -1), REF["target_tokens"])
    tokens = jnp.concatenate([ids, jnp.asarray(REF["input_ids_step2"][:, -1:])], 1)
    steps = train3.ttt_logits(head.config, head.params, tokens, aux, pos, 2)
    np.testing.assert_allclose(np.asarray(steps[0]), REF["logits"], atol=1e-4, rtol=0)
    np.testing.assert_allclose(np.asarray(steps[1]), REF["logits_step2"], atol=1e-4, rtol=0)


def test_a_wrongly_mapped_head_is_caught(target):
    """Negative control: the same weights with the two input norms swapped (the embedding half normed by
    hidden_norm) are off by far more than the tolerance."""
    head = eagle.load(FIXTURES / "speculators", target)
    layer = dict(head.params["layer"])
    layer["input_norm"], layer["hidden_norm"] = layer["hidden_norm"], layer["input_norm"]
    apply_fn, init_cache = eagle3.head_fns(head.config)
    ids, aux, pos = (jnp.asarray(REF[k]) for k in ("input_ids", "aux_hidden", "positions"))
    logits, _, _ = apply_fn({**head.params, "layer": layer}, ids, aux, pos, init_cache(1, 16), False)
    assert np.abs(np.asarray(logits) - REF["logits"]).max() > 1e-2


def test_greedy_with_a_published_head_equals_plain(target):
    head = eagle.load(FIXTURES / "eagle", target)
    prompts = [[5, 9, 11, 3, 7], [3], [60, 61, 62, 63, 64, 65, 66, 67]]
    kwargs = dict(max_new_tokens=16, temperature=0.0, eos_token_id=())
    spec = jaxspec.generate(target, prompts, draft=head, gamma=3, **kwargs)
    assert spec.tokens == jaxspec.generate(target, prompts, **kwargs).tokens and spec.stats.drafted > 0
    from jaxspec.cli.models import _load_draft  # the generate command's --draft reads it as it is too

    assert _load_draft(str(FIXTURES / "speculators"), target, None).eagle3


def _copy(tmp_path, layout) -> Path:
    out = tmp_path / layout
    shutil.copytree(FIXTURES / layout, out)
    return out


def test_loading_errors_name_the_problem(tmp_path, target):
    # a missing tensor
    d = _copy(tmp_path, "eagle")
    tensors = load_file(str(d / "model.safetensors"))
    save_file({k: v for k, v in tensors.items() if k != "midlayer.hidden_norm.weight"}, str(d / "model.safetensors"))
    with pytest.raises(ValueError, match="midlayer.hidden_norm.weight.*missing"):
        eagle.load(d, target)
    # a tensor of the wrong shape
    d = _copy(tmp_path / "s", "speculators")
    tensors = load_file(str(d / "model.safetensors"))
    tensors["fc.weight"] = np.zeros((64, 128), np.float32)
    save_file(tensors, str(d / "model.safetensors"))
    with pytest.raises(ValueError, match="fc.weight"):
        eagle.load(d, target)
    # pickled weights only: refused, never read
    d = tmp_path / "pickled"
    d.mkdir()
    shutil.copy(FIXTURES / "eagle" / "config.json", d / "config.json")
    (d / "pytorch_model.bin").write_bytes(b"\x80\x04not really a pickle")
    with pytest.raises(ValueError, match="pickled.*never unpickles"):
        eagle.load(d, target)
    # a target the head does not fit: 6 layers cannot give layer 7
    small = llama.init(dataclasses.replace(target.config, num_layers=6), seed=1)
    with pytest.raises(ValueError, match="aux_layers"):
        eagle.load(FIXTURES / "speculators", small)
    # another vocabulary
    other = llama.init(dataclasses.replace(target.config, vocab_size=300), seed=1)
    with pytest.raises(ValueError, match="vocabulary"):
        eagle.load(FIXTURES / "eagle", other)
    # an option this reader does not implement
    d = _copy(tmp_path / "o", "speculators")
    config = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**config, "norm_output": True}))
    with pytest.raises(ValueError, match="norm_output"):
        eagle.load(d, target)
