"""Orbax save/load of whole models: round trip, dtype, tokenizer, sharding target, corrupted checkpoints."""

import json
import os

import jax
import numpy as np
import pytest
from helpers import FIXTURES_DIR, tiny_hf_tokenizer

import jaxspec
from jaxspec.formats import orbax
from jaxspec.models import llama

CFG = llama.LlamaConfig(
    vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2, init_std=0.2
)


@pytest.fixture(scope="module")
def model():
    return llama.init(CFG, seed=0, eos_token_id=(3, 5), name="tiny")


@pytest.fixture(scope="module")
def saved(model, tmp_path_factory):
    return orbax.save(model, tmp_path_factory.mktemp("ckpt") / "model")


def test_round_trip(model, saved):
    back = orbax.load(saved)
    assert back.config == model.config and back.name == "tiny" and back.eos_token_id == (3, 5)
    for a, b in zip(jax.tree.leaves(model.params), jax.tree.leaves(back.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    ids = np.asarray([[1, 2, 3, 4, 5]])
    np.testing.assert_array_equal(np.asarray(model.logits(ids)), np.asarray(back.logits(ids)))
    kw = dict(max_new_tokens=6, temperature=0.0)
    assert jaxspec.generate(back, [[1, 2]], **kw).tokens == jaxspec.generate(model, [[1, 2]], **kw).tokens


def test_dtype_on_load(saved):
    back = orbax.load(saved, dtype="bfloat16")
    assert {x.dtype.name for x in jax.tree.leaves(back.params)} == {"bfloat16"}
    assert back.config.dtype == "bfloat16"
    with pytest.raises(ValueError, match="dtype"):
        orbax.load(saved, dtype="float8")


def test_restore_into_a_sharding(saved):
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[-1])
    back = orbax.load(saved, sharding=sharding)
    assert all(x.sharding == sharding for x in jax.tree.leaves(back.params))


def test_tokenizer_travels_with_the_model(model, tmp_path):
    tok = tiny_hf_tokenizer()
    path = orbax.save(model.replace(tokenizer=tok), tmp_path / "with_tok")
    back = orbax.load(path)
    text = "def f(x): return x"
    assert back.tokenizer.encode(text) == tok.encode(text)


def test_refuses_to_overwrite(model, saved):
    with pytest.raises(FileExistsError, match="not empty"):
        orbax.save(model, saved)


def _copy(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_truncated_data_is_a_clear_error(saved, tmp_path):
    broken = _copy(saved, tmp_path / "broken")
    data = [os.path.join(r, f) for r, _, fs in os.walk(broken / "params") for f in fs]
    biggest = max(data, key=os.path.getsize)
    with open(biggest, "r+b") as f:
        f.truncate(os.path.getsize(biggest) // 2)
    with pytest.raises(ValueError, match="incomplete or corrupted"):
        orbax.load(broken)


def test_missing_params_is_a_clear_error(saved, tmp_path):
    import shutil

    broken = _copy(saved, tmp_path / "noparams")
    shutil.rmtree(broken / "params")
    with pytest.raises(ValueError, match="incomplete or corrupted"):
        orbax.load(broken)


def test_bad_metadata(saved, tmp_path):
    broken = _copy(saved, tmp_path / "badmeta")
    (broken / "jaxspec.json").write_text("{not json")
    with pytest.raises(ValueError, match="corrupted"):
        orbax.load(broken)
    meta = json.loads((saved / "jaxspec.json").read_text())
    (broken / "jaxspec.json").write_text(json.dumps({**meta, "family": "rwkv"}))
    with pytest.raises(ValueError, match="unknown model family 'rwkv'.*llama"):
        orbax.load(broken)
    with pytest.raises(FileNotFoundError, match="not a jaxspec model directory"):
        orbax.load(tmp_path)


def test_jaxspec_load_dispatches(saved, tmp_path):

    assert jaxspec.load(saved).name == "tiny"  # orbax
    hf_dir = FIXTURES_DIR / "hf" / "qwen2_bias_tied"
    hf_model = jaxspec.load(hf_dir)  # Hugging Face
    back = jaxspec.load(jaxspec.save(hf_model, tmp_path / "from_hf"))  # and through orbax again
    ids = np.asarray([[1, 2, 3, 4]])
    np.testing.assert_array_equal(np.asarray(hf_model.logits(ids)), np.asarray(back.logits(ids)))
    assert back.config == hf_model.config
    with pytest.raises(ValueError, match="sharding"):
        jaxspec.load(hf_dir, sharding=jax.sharding.SingleDeviceSharding(jax.devices()[0]))


def test_gpt2_round_trip(tmp_path):
    from jaxspec.models import gpt2

    cfg = gpt2.GPT2Config(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, max_positions=32, init_std=0.2)
    model = gpt2.init(cfg, seed=1, eos_token_id=2, name="tiny-gpt2")
    path = orbax.save(model, tmp_path / "gpt2")
    assert json.loads((path / "jaxspec.json").read_text())["family"] == "gpt2"
    back = jaxspec.load(path)
    assert back.config == cfg and back.eos_token_id == 2 and back.name == "tiny-gpt2"
    for a, b in zip(jax.tree.leaves(model.params), jax.tree.leaves(back.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    ids = np.arange(20).reshape(1, 20) % 64
    np.testing.assert_array_equal(np.asarray(model.logits(ids)), np.asarray(back.logits(ids)))
    half = orbax.load(path, dtype="bfloat16")
    assert all(x.dtype == jax.numpy.bfloat16 for x in jax.tree.leaves(half.params))
