"""The family registry: every record's weight table covers its params exactly, with consistent axes and names, and
``register`` is the one step that makes a new model_type loadable."""

import dataclasses
import json
import shutil

import jax
import numpy as np
import pytest
from helpers import FIXTURES_DIR

import jaxspec
from jaxspec.models import families, gpt2, gpt_neox, llama, phi3
from jaxspec.models.families import Weight

FIXTURES = FIXTURES_DIR / "hf"
LLAMA = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=3, num_heads=4, num_kv_heads=2)
CONFIGS = {
    "llama": [
        llama.LlamaConfig(**LLAMA),
        llama.LlamaConfig(**LLAMA, qkv_bias=True, o_bias=True, tie_embeddings=True),
        llama.LlamaConfig(**LLAMA, qk_norm=True, head_dim=16, vocab_ids=(1, 5, 9)),
        # Gemma 3 style: per-layer sliding/full attention, a local RoPE base, sandwich norms, scaled and capped
        llama.LlamaConfig(
            **LLAMA,
            qk_norm=True,
            norm_offset=1.0,
            embed_scale=True,
            mlp_activation="gelu_tanh",
            tie_embeddings=True,
            sliding_window=3,
            layer_types=("sliding_attention", "full_attention", "sliding_attention"),
            local_rope_theta=100.0,
            sandwich_norms=True,
            query_pre_attn_scalar=12.0,
            attn_softcap=2.0,
            final_softcap=3.0,
        ),
    ],
    "phi3": [llama.LlamaConfig(**LLAMA, sliding_window=4), llama.LlamaConfig(**{**LLAMA, "num_kv_heads": 1})],
    "gpt2": [gpt2.GPT2Config(vocab_size=64, hidden_size=32, num_layers=3, num_heads=4)],
    "gpt_neox": [
        gpt_neox.GPTNeoXConfig(
            vocab_size=64, hidden_size=32, num_layers=3, num_heads=4, intermediate_size=48, rotary_dim=2
        ),
        gpt_neox.GPTNeoXConfig(
            vocab_size=64,
            hidden_size=32,
            num_layers=3,
            num_heads=2,
            intermediate_size=48,
            parallel_residual=False,
            attention_bias=False,
            tie_embeddings=True,
            rope_type="linear",
            rope_params=(("factor", 2.0),),
        ),
    ],
}


def _leaves(tree) -> dict:
    return {tuple(k.key for k in path): leaf for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}


def test_builtin_records():
    assert [f.name for f in families.registered()][:4] == ["llama", "gpt2", "gpt_neox", "phi3"]
    assert set(CONFIGS) == {f.name for f in families.registered()}
    assert families.family_for_model_type("qwen3") is llama.FAMILY
    assert families.family_for_model_type("phi3") is phi3.FAMILY
    assert phi3.FAMILY.layout_of == "llama" and phi3.FAMILY.config_class is llama.LlamaConfig
    assert families.family_of_config(CONFIGS["phi3"][0]) is llama.FAMILY  # phi3 is only another layout
    assert families.family_of_config(CONFIGS["gpt2"][0]) is gpt2.FAMILY
    assert families.family_for_model_type("gpt_neox") is families.family_of_config(CONFIGS["gpt_neox"][1])
    with pytest.raises(ValueError, match="unsupported model_type 'rwkv'; supported: .*'phi3'"):
        families.family_for_model_type("rwkv")
    with pytest.raises(ValueError, match="dict is not the config of a registered model family"):
        families.family_of_config({})


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_weight_table_covers_the_params_exactly(name):
    family = next(f for f in families.registered() if f.name == name)
    for cfg in CONFIGS[name]:
        abstract = _leaves(family.abstract_params(cfg))
        table = family.weights(cfg)
        assert sorted(w.path for w in table) == sorted(abstract)
        for w in table:
            assert len(abstract[w.path].shape) == len(w.axes) + w.stacked, w.path
            assert all(a is None or a in jaxspec.sharding.RULES for a in w.axes), w.path
        names = [(n, w.rows) for w in table for n in w.names(cfg.num_layers)]
        assert len(names) == len(set(names))  # no tensor (or rows of one) is read twice
        fused = {}
        for w in table:
            if w.rows is not None:
                fused.setdefault(w.hf, []).append(w.rows)
        for parts in fused.values():  # the parts of a fused tensor tile it: [0, a), [a, b), ...
            parts.sort()
            assert parts[0][0] == 0 and all(p[1] == q[0] for p, q in zip(parts, parts[1:]))
        assert family.param_axes(cfg) == family.from_params(cfg, family.abstract_params(cfg)).param_axes


def test_phi3_differs_from_llama_only_in_its_fused_tensors():
    cfg = CONFIGS["phi3"][1]
    plain, fused = llama.weights(cfg), phi3.weights(cfg)
    assert [(w.path, w.axes, w.transpose) for w in plain] == [(w.path, w.axes, w.transpose) for w in fused]
    changed = {w.path[-2]: (w.hf, w.rows) for w, v in zip(fused, plain) if w != v}
    assert changed == {
        "q_proj": ("model.layers.{i}.self_attn.qkv_proj.weight", (0, 32)),
        "k_proj": ("model.layers.{i}.self_attn.qkv_proj.weight", (32, 40)),
        "v_proj": ("model.layers.{i}.self_attn.qkv_proj.weight", (40, 48)),
        "gate_proj": ("model.layers.{i}.mlp.gate_up_proj.weight", (0, 48)),
        "up_proj": ("model.layers.{i}.mlp.gate_up_proj.weight", (48, 96)),
    }


def test_weight_transforms_invert_each_other():
    w = Weight(("layers", "attn", "k_proj", "kernel"), ("embed", "kv_heads"), "l.{i}.qkv", True, (2, 5))
    fused = np.arange(7 * 3).reshape(7, 3)
    assert w.names(2) == ("l.0.qkv", "l.1.qkv") and w.stacked
    np.testing.assert_array_equal(w.from_hf(fused), fused[2:5].T)
    np.testing.assert_array_equal(w.to_hf(w.from_hf(fused)), fused[2:5])
    assert w.get({"layers": {"attn": {"k_proj": {"kernel": 1}}}}) == 1 and w.get({"layers": {}}) is None
    with pytest.raises(ValueError, match="only.*has '\\{i\\}'"):
        Weight(("layers", "x"), (None,), "model.x")
    with pytest.raises(ValueError, match="only.*has '\\{i\\}'"):
        Weight(("x",), (None,), "model.{i}.x")


@pytest.fixture
def registry(monkeypatch):
    """The registry, restored after the test."""
    families.registered()
    monkeypatch.setattr(families, "_FAMILIES", dict(families._FAMILIES))
    monkeypatch.setattr(families, "_MODEL_TYPES", dict(families._MODEL_TYPES))


def test_register_makes_a_model_type_loadable(registry, tmp_path):
    """The one step a new family needs: a record. Here Llama's, under a made-up model_type."""
    path = tmp_path / "custom"
    shutil.copytree(FIXTURES / "llama_gqa", path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "model_type": "my_llama"}))
    with pytest.raises(ValueError, match="unsupported model_type 'my_llama'"):
        jaxspec.load(path)
    mine = dataclasses.replace(llama.FAMILY, name="my_llama", architectures={"my_llama": "X"}, layout_of="llama")
    record = families.register(mine)
    assert families.family_for_model_type("my_llama") is record
    assert families.family_of_config(llama.LlamaConfig(**LLAMA)) is llama.FAMILY  # my_llama is only a layout
    ref = np.load(FIXTURES / "llama_gqa" / "expected.npz")
    np.testing.assert_allclose(np.asarray(jaxspec.load(path).logits(ref["ids"])), ref["logits"], atol=1e-4)
    with pytest.raises(ValueError, match=r"model_type\(s\) \['llama'\] already belong to family \['llama'\]"):
        families.register(dataclasses.replace(record, architectures={"llama": "X"}))
    again = families.register(dataclasses.replace(record, architectures={"my_llama2": "X"}))  # replaces, in place
    assert [f.name for f in families.registered()][-1] == "my_llama" and families.registered()[-1] is again
    with pytest.raises(ValueError, match="unsupported model_type 'my_llama'"):
        families.family_for_model_type("my_llama")


@pytest.mark.parametrize(
    "module, cfg",
    [(llama, c) for c in CONFIGS["llama"]] + [(gpt2, CONFIGS["gpt2"][0]), (gpt_neox, CONFIGS["gpt_neox"][0])],
    ids=["plain", "biases-tied", "qk-norm-reduced-vocab", "gemma3-layer-types", "gpt2", "gpt-neox"],
)
def test_split_and_stacked_layouts_compute_the_same_model(tmp_path, monkeypatch, module, cfg):
    """``from_params`` holds a model's layers split (one tree per layer, its own arrays); ``apply_fn`` gives the same
    logits and caches from the stacked layout (``nn.scan``); the two layouts convert both ways exactly; a loader's
    own arrays are consumed as they are split; a checkpoint holds the stacked layout and loads back split, or stacked
    under ``$JAXSPEC_LAYERS=stacked`` (another value is refused); ``split_layers=False`` keeps the stack."""
    stacked = module.init_params(cfg, seed=3)
    model = module.from_params(cfg, stacked)
    layers = model.params["layers"]
    assert isinstance(layers, tuple) and len(layers) == cfg.num_layers
    for got, whole in zip(jax.tree.leaves(layers[1]), jax.tree.leaves(stacked["layers"]), strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(whole[1]))
    back = families.stack_layers(model.params)
    assert jax.tree.structure(back) == jax.tree.structure(stacked)
    for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(stacked), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert families.split_layers(model.params) is model.params and families.stack_layers(stacked) is stacked
    # a loader's own arrays are consumed as they are split (one copy of the weights at a time); a caller's are not
    assert not any(a.is_deleted() for a in jax.tree.leaves(stacked))
    owned = jax.tree.map(lambda a: a + 0, stacked)
    split = families.split_layers(owned, consume=True)
    assert all(a.is_deleted() for a in jax.tree.leaves(owned["layers"]))
    assert not any(a.is_deleted() for a in jax.tree.leaves(split))
    for got, want in zip(jax.tree.leaves(split), jax.tree.leaves(model.params), strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))

    tokens = np.asarray([[3, 1, 4, 1, 5, 9], [2, 6, 5, 3, 5, 8]])
    positions = np.broadcast_to(np.arange(6), tokens.shape)
    apply_fn, init_cache = module.model_fns(cfg)
    (split_logits, split_cache), (scan_logits, scan_cache) = (
        jax.jit(apply_fn)(p, tokens, positions, init_cache(2, 8)) for p in (model.params, stacked)
    )
    np.testing.assert_allclose(np.asarray(split_logits), np.asarray(scan_logits), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(split_cache.k), np.asarray(scan_cache.k), rtol=1e-5, atol=1e-5)

    kept = module.from_params(cfg, model.params, split_layers=False)
    assert not isinstance(kept.params["layers"], tuple)
    jaxspec.save(model, tmp_path / "ckpt")
    monkeypatch.delenv("JAXSPEC_LAYERS", raising=False)  # the default
    loaded = jaxspec.load(tmp_path / "ckpt", tokenizer=False)
    assert isinstance(loaded.params["layers"], tuple)
    np.testing.assert_allclose(np.asarray(loaded.logits(tokens)), np.asarray(split_logits), rtol=1e-5, atol=1e-5)
    monkeypatch.setenv("JAXSPEC_LAYERS", "stacked")
    loaded = jaxspec.load(tmp_path / "ckpt")
    assert not isinstance(loaded.params["layers"], tuple)
    np.testing.assert_allclose(np.asarray(loaded.logits(tokens)), np.asarray(split_logits), rtol=1e-5, atol=1e-5)
    monkeypatch.setenv("JAXSPEC_LAYERS", "scan")
    with pytest.raises(ValueError, match="JAXSPEC_LAYERS"):
        jaxspec.load(tmp_path / "ckpt")


RESIDUAL_OUTPUTS = {
    ("attn", "o_proj"),
    ("mlp", "down_proj"),
    ("attn", "c_proj"),
    ("mlp", "c_proj"),
    ("attention", "dense"),
    ("mlp", "dense_4h_to_h"),
}


@pytest.mark.parametrize(
    "module, cfg, split",
    [
        (llama, CONFIGS["llama"][1], True),
        (llama, CONFIGS["llama"][2], False),
        (llama, CONFIGS["llama"][3], False),
        (gpt2, CONFIGS["gpt2"][0], True),
        (gpt_neox, CONFIGS["gpt_neox"][1], False),
    ],
    ids=["llama-split", "llama-stacked-reduced-vocab", "gemma3-layer-types-stacked", "gpt2", "gpt-neox-stacked"],
)
def test_first_layers_is_the_model_with_its_later_layers_silenced(module, cfg, split):
    """``families.first_layers(model, k)`` (what ``gamma="auto"`` times for a deep model) computes what the whole
    model computes when its layers from k on add nothing to the residual stream (their output projections zeroed);
    it shares the model's weights (split layout), keeps its layout and a k-layer cache; None where it cannot be
    built."""
    types = {"layer_types": cfg.layer_types + ("full_attention",)} if getattr(cfg, "layer_types", ()) else {}
    cfg = dataclasses.replace(cfg, num_layers=4, **types)
    model = module.from_params(cfg, module.init_params(cfg, seed=5), split_layers=split)
    first = families.first_layers(model, 2)
    assert getattr(first.config, "layer_types", ()) == getattr(cfg, "layer_types", ())[:2]
    assert first.config.num_layers == 2 and isinstance(first.params["layers"], tuple) == split
    assert first.init_cache(1, 8).k.shape[0] == 2
    if split:
        assert all(
            a is b
            for a, b in zip(
                jax.tree.leaves(first.params),
                jax.tree.leaves({**model.params, "layers": model.params["layers"][:2]}),
                strict=True,
            )
        )

    def silence(path, leaf):
        keys = tuple(k.key for k in path)
        return leaf.at[2:].set(0) if keys[:1] == ("layers",) and keys[1:3] in RESIDUAL_OUTPUTS else leaf

    stacked = families.stack_layers(model.params)
    silenced = module.from_params(cfg, jax.tree_util.tree_map_with_path(silence, stacked), split_layers=split)
    tokens = np.asarray([[3, 1, 4, 1, 5, 9], [2, 6, 5, 3, 5, 8]])
    got = np.asarray(first.logits(tokens))
    np.testing.assert_allclose(got, np.asarray(silenced.logits(tokens)), rtol=1e-5, atol=1e-5)
    finite = np.isfinite(got)  # a reduced vocabulary's logits are -inf outside it
    # negative control: layers 2-3 do count
    assert np.abs(got[finite] - np.asarray(model.logits(tokens))[finite]).max() > 1e-2

    wrapped = model.replace(apply_fn=lambda *args: model.apply_fn(*args))
    assert families.first_layers(wrapped, 2) is None  # not the family's own forward
    assert families.first_layers(model, 0) is None and families.first_layers(model, 4) is None
    assert families.first_layers(model.replace(config=None), 2) is None
