"""Multimodal checkpoints (Gemma 3 4B+, Mistral Small 3.1, LLaVA, Qwen2-VL, Qwen2.5-VL): their text model loads
alone. Logit parity with transformers runs in test_hf.py over every fixture (these included); here: transformers'
defaults for sparse published text configs, Qwen-VL's flat hub config, both tensor layouts, the tying rule, errors,
and a text-only draft for a multimodal target."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from helpers import FIXTURES_DIR
from safetensors.numpy import load_file, save_file

import jaxspec
from jaxspec.formats import hf_wrappers
from jaxspec.models import families

FIXTURES = FIXTURES_DIR / "hf"
WRAPPED = ["gemma3_multimodal", "mistral3_multimodal", "llava_llama", "qwen2_vl_untied", "qwen2_5_vl_tied"]
# Qwen-VL's text model runs as Qwen2's (M-RoPE on text-only ids is RoPE)
RUNS_AS = {"qwen2_vl_text": "qwen2", "qwen2_5_vl_text": "qwen2"}
DEFAULTS = json.loads((FIXTURES.parent / "multimodal_text_defaults.json").read_text())


def _config(text: dict):
    model_type = RUNS_AS.get(text["model_type"], text["model_type"])
    return families.family_for_model_type(model_type).config_from_hf(text, model_type, "float32")


@pytest.mark.parametrize("case", sorted(DEFAULTS))
def test_sparse_published_text_configs_take_transformers_defaults(case):
    """google/gemma-3-4b-it's, Mistral-Small-3.1's and llava-1.5-7b's text_config as published (and one with
    nothing but its model_type), and Qwen2.5-VL-7B-Instruct's whole config.json (flat, "mrope" rope_scaling): the
    config jaxspec builds equals the one built from transformers' filled-in dict."""
    sparse, full = DEFAULTS[case]["sparse"], DEFAULTS[case]["full"]
    hub = case.endswith("-hub")
    wrapper = sparse if hub else {"model_type": case.split("-")[0], "text_config": sparse}
    assert _config(hf_wrappers.text_config(wrapper)) == _config(full)
    if hub:  # the control: read as a plain Qwen2 config, its M-RoPE is an unknown rope type
        with pytest.raises(ValueError, match="unsupported rope type 'mrope'"):
            _config({**sparse, "model_type": "qwen2"})
    elif case != "mistral3":  # the control: without the defaults they do not build (Mistral's lacks nothing we read)
        with pytest.raises(ValueError, match="is missing"):
            _config(sparse)


def test_text_defaults_of_the_loader_are_transformers():
    """Every default in jaxspec's table is transformers' value for an empty text_config of that wrapper."""
    for case in ("gemma3-empty", "mistral3-empty", "llava-empty", "qwen2_vl-empty", "qwen2_5_vl-empty"):
        full = DEFAULTS[case]["full"]
        ours = hf_wrappers.TEXT_DEFAULTS[full["model_type"]]
        for key, value in ours.items():
            if key in ("rope_theta", "rope_local_base_freq", "sliding_window_pattern"):
                continue  # transformers 5 keeps these inside rope_parameters / layer_types (compared below)
            assert full[key] == value, (case, key)
        rope = full["rope_parameters"]
        assert (rope.get("full_attention") or rope)["rope_theta"] == ours["rope_theta"]
        assert (rope.get("sliding_attention") or {}).get("rope_theta") == ours.get("rope_local_base_freq")
        if full.get("layer_types") and "sliding_window_pattern" not in ours:  # Qwen-VL: every layer full
            assert set(full["layer_types"]) == {"full_attention"} and not full["use_sliding_window"]
        elif full.get("layer_types"):
            every = ours["sliding_window_pattern"]
            assert [t == "full_attention" for t in full["layer_types"]] == [
                (i + 1) % every == 0 for i in range(full["num_hidden_layers"])
            ]


def _rewrite(src: Path, dst: Path, rename) -> None:
    """A copy of the fixture ``src`` whose tensors are renamed by ``rename(name) -> name | None`` (None: dropped)."""
    shutil.copytree(src, dst)
    tensors = load_file(src / "model.safetensors")
    out = {}
    for name, value in tensors.items():
        new = rename(name)
        if new is not None:
            out[new] = value
    (dst / "model.safetensors").unlink()
    save_file(out, dst / "model.safetensors")


def _in_memory_layout(name: str) -> str:
    """transformers' in-memory names (``model.language_model.*``, ``lm_head.weight``, ``model.vision_tower.*``;
    Qwen-VL: ``model.*`` -> ``model.language_model.*``, ``visual.*`` -> ``model.visual.*``)."""
    if name.startswith("model."):
        return "model.language_model." + name[len("model.") :]
    if name.startswith("lm_head."):
        return name
    if name.startswith("language_model.model."):
        return "model.language_model." + name[len("language_model.model.") :]
    if name.startswith("language_model.lm_head."):
        return name[len("language_model.") :]
    return "model." + name


@pytest.mark.parametrize("fixture", WRAPPED)
def test_both_tensor_layouts_load_the_same_text_model(tmp_path, fixture):
    data = np.load(FIXTURES / fixture / "expected.npz")
    _rewrite(FIXTURES / fixture, tmp_path / fixture, _in_memory_layout)
    model = jaxspec.load(tmp_path / fixture)
    assert np.abs(np.asarray(model.logits(data["ids"])) - data["logits"]).max() <= 1e-4
    tied = fixture in ("gemma3_multimodal", "qwen2_5_vl_tied")
    assert model.config.tie_embeddings == tied and ("lm_head" in model.params) != tied


def test_the_head_tensor_decides_tying(tmp_path):
    """Mistral Small 3.1's config.json leaves tie_word_embeddings out (the wrapper's default is True) but ships its
    head: the head is used, as transformers does. The control: the same checkpoint without the head tensor ties."""
    data = np.load(FIXTURES / "mistral3_multimodal" / "expected.npz")
    path = tmp_path / "m3"
    shutil.copytree(FIXTURES / "mistral3_multimodal", path)
    config = json.loads((path / "config.json").read_text())
    config.pop("tie_word_embeddings")
    config["text_config"].pop("tie_word_embeddings")
    (path / "config.json").write_text(json.dumps(config))
    model = jaxspec.load(path)
    assert not model.config.tie_embeddings
    assert np.abs(np.asarray(model.logits(data["ids"])) - data["logits"]).max() <= 1e-4
    _rewrite(path, tmp_path / "headless", lambda n: None if "lm_head" in n else n)
    headless = jaxspec.load(tmp_path / "headless")
    assert headless.config.tie_embeddings
    assert np.abs(np.asarray(headless.logits(data["ids"])) - data["logits"]).max() > 0.1


def test_wrapper_errors(tmp_path):
    _rewrite(FIXTURES / "llava_llama", tmp_path / "vision_only", lambda n: n if n.startswith("vision_") else None)
    with pytest.raises(ValueError, match="no language-model tensors"):
        jaxspec.load(tmp_path / "vision_only")

    both = tmp_path / "both"
    _rewrite(FIXTURES / "llava_llama", both, lambda n: n)
    tensors = load_file(both / "model.safetensors")
    tensors["model.language_model.norm.weight"] = tensors["language_model.model.norm.weight"]
    save_file(tensors, both / "model.safetensors")
    with pytest.raises(ValueError, match="holds 'model.norm.weight' twice"):
        jaxspec.load(both)
    bad = tmp_path / "bad_text_config"
    shutil.copytree(FIXTURES / "llava_llama", bad)
    config = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**config, "text_config": "llama"}))
    with pytest.raises(ValueError, match="text_config must be an object"):
        jaxspec.load(bad)


def test_a_text_only_draft_for_a_multimodal_target():
    """Gemma 3 1B drafting for 4B, in small: the text-only Gemma 3 fixture drafts for the multimodal one; greedy
    speculative output is the target's plain output."""
    target = jaxspec.load(FIXTURES / "gemma3_multimodal")
    draft = jaxspec.load(FIXTURES / "gemma3_text_swa")
    prompts = [[5, 9, 11, 3], [40, 41, 42, 43, 44, 45]]
    plain = jaxspec.generate(target, prompts, max_new_tokens=20, temperature=0.0)
    spec = jaxspec.generate(target, prompts, draft=draft, gamma=3, max_new_tokens=20, temperature=0.0)
    assert spec.tokens == plain.tokens
    assert spec.stats.drafted > 0


def test_a_qwen_vl_hub_config_loads_as_published(tmp_path):
    """Qwen2.5-VL's config.json as the hub has it: the text model's keys at the top level, transformers 4's
    ``"rope_scaling": {"type": "mrope", ...}``; the same text model as the nested one transformers 5 writes. The
    control: another top-level rope_theta changes the logits (the flat keys are the ones read)."""
    data = np.load(FIXTURES / "qwen2_5_vl_tied" / "expected.npz")
    nested = json.loads((FIXTURES / "qwen2_5_vl_tied" / "config.json").read_text())
    text = nested.pop("text_config")
    rope = text.pop("rope_parameters")
    flat = {**nested, **text, "model_type": "qwen2_5_vl", "rope_theta": rope["rope_theta"]}
    flat["rope_scaling"] = {"type": "mrope", "mrope_section": rope["mrope_section"]}
    logits = {}
    for theta in (rope["rope_theta"], 10 * rope["rope_theta"]):
        path = tmp_path / f"theta{theta:g}"
        shutil.copytree(FIXTURES / "qwen2_5_vl_tied", path)
        (path / "config.json").write_text(json.dumps({**flat, "rope_theta": theta}))
        model = jaxspec.load(path)
        assert model.config.tie_embeddings and model.config.qkv_bias and model.config.rope_type == "default"
        logits[theta] = np.asarray(model.logits(data["ids"]))
    assert np.abs(logits[rope["rope_theta"]] - data["logits"]).max() <= 1e-4
    assert np.abs(logits[10 * rope["rope_theta"]] - data["logits"]).max() > 1e-2
