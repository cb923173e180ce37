"""Offline distillation (jaxspec.distill_offline): stored target outputs -> a trained draft."""

import json

import jax
import numpy as np
import pytest

import jaxspec
from helpers import tiny_config
from jaxspec import distill_offline as d
from jaxspec.models import llama


@pytest.fixture(scope="module")
def target():
    return llama.init(tiny_config(), seed=0, eos_token_id=1)


@pytest.fixture(scope="module")
def data(tmp_path_factory, target):
    """The target's own greedy continuations of 24 random prompts, stored like generate_distill_data.py."""
    rng = np.random.default_rng(0)
    prompts = [list(map(int, rng.integers(2, target.vocab_size, size=int(rng.integers(3, 12))))) for _ in range(24)]
    out = jaxspec.generate(target, prompts, max_new_tokens=24, temperature=0.0, eos_token_id=())
    path = tmp_path_factory.mktemp("data") / "data.jsonl"
    with open(path, "w") as f:
        for p, o in zip(prompts, out.tokens):
            f.write(json.dumps({"id": len(p), "prompt_ids": p, "output_ids": o}) + "\n")
    return path


def test_batch_selects_generated_then_prompt_positions():
    records = [([5, 6, 7, 8], [9, 10, 11]), ([3, 4], [12])]
    tokens, select, weight = d.batch_at(records, 0, seed=0, batch_size=6, prompt_weight=0.5, positions=8)
    again = d.batch_at(records, 0, seed=0, batch_size=6, prompt_weight=0.5, positions=8)
    assert all(np.array_equal(a, b) for a, b in zip((tokens, select, weight), again))  # pure in (seed, step)
    assert tokens.shape == (6, 64) and select.shape == weight.shape == (6, 8)
    for b in range(6):
        row = tokens[b][tokens[b] > 0].tolist()
        p, o = next(r for r in records if r[0] + r[1] == row)
        chosen = select[b][weight[b] > 0]
        generated = chosen[weight[b][weight[b] > 0] == 1.0]
        assert generated.tolist() == list(range(len(p) - 1, len(p) + len(o) - 1))  # every generated token
        assert [row[i + 1] for i in generated] == o
        prompt = chosen[weight[b][weight[b] > 0] == 0.5]
        assert sorted(prompt.tolist()) == list(range(len(p) - 1))  # the prompt positions, at prompt_weight
    _, _, w0 = d.batch_at(records, 0, seed=0, batch_size=6, prompt_weight=0.0, positions=8)
    assert set(np.unique(w0)) <= {0.0, 1.0}


def test_new_draft_shares_vocabulary_and_starts_from_the_targets_embedding(target):
    draft = d.new_draft(target, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)
    assert draft.vocab_size == target.vocab_size and draft.eos_token_id == target.eos_token_id
    assert draft.config.tie_embeddings and draft.config.hidden_size == 32
    e = np.asarray(target.params["embed"]["embedding"])
    p = np.asarray(draft.params["embed"]["embedding"])
    # the projection keeps the target's geometry: cosine similarities between tokens stay correlated
    cos = lambda m: (m / np.linalg.norm(m, axis=1, keepdims=True)) @ (m / np.linalg.norm(m, axis=1, keepdims=True)).T
    iu = np.triu_indices(len(e), 1)
    assert np.corrcoef(cos(e)[iu], cos(p)[iu])[0, 1] > 0.5
    assert d.parse_spec("hidden=32,layers=1") == {"hidden_size": 32, "num_layers": 1}
    with pytest.raises(ValueError, match="--new-draft"):
        d.parse_spec("width=3")


def test_training_fits_the_targets_outputs_and_resumes_exactly(tmp_path, target, data, monkeypatch):
    draft = d.new_draft(target, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1)
    records = d.read_data(data)

    def greedy_agreement(model):
        ok = n = 0
        for p, o in records[:8]:
            logits = np.asarray(model.logits(np.asarray([p + o])))[0]
            pred = logits[len(p) - 1: len(p) + len(o) - 1].argmax(-1)
            ok, n = ok + int((pred == np.asarray(o)).sum()), n + len(o)
        return ok / n

    kw = dict(batch_size=8, learning_rate=3e-3, prompt_weight=0.1, checkpoint_every=10, progress=False)
    full, log = d.distill_offline(draft, data, out_dir=tmp_path / "a", steps=40, **kw)
    assert log[-1]["loss"] < log[0]["loss"]
    assert greedy_agreement(full) > greedy_agreement(draft) + 0.1
    # killed at step 25 (last checkpoint: 20), resumed: the same parameters as the uninterrupted run
    real_batch = d.batch_at

    def dies_at_25(records, step, **k):
        if step == 25:
            raise KeyboardInterrupt
        return real_batch(records, step, **k)

    monkeypatch.setattr(d, "batch_at", dies_at_25)
    with pytest.raises(KeyboardInterrupt):
        d.distill_offline(draft, data, out_dir=tmp_path / "b", steps=40, **kw)
    monkeypatch.setattr(d, "batch_at", real_batch)
    resumed, log_b = d.distill_offline(draft, data, out_dir=tmp_path / "b", steps=40, **kw)
    assert log_b[0]["step"] == 30  # started from the step-20 checkpoint
    for x, y in zip(jax.tree.leaves(full.params), jax.tree.leaves(resumed.params)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-6)


def test_bad_data_is_a_clear_error(tmp_path, target):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "x"}\n')
    with pytest.raises(ValueError, match="line 1"):
        d.read_data(bad)
    bad.write_text(json.dumps({"prompt_ids": [1, 10**6], "output_ids": []}) + "\n")
    with pytest.raises(ValueError, match="outside the draft's vocabulary"):
        d.distill_offline(d.new_draft(target, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1), bad,
                          out_dir=tmp_path / "o", steps=1)


def test_cli_offline_distills_a_new_draft_and_saves_it(tmp_path, target, data, capsys):
    from jaxspec.distill import main

    jaxspec.save(target, tmp_path / "target")
    main(["--target", str(tmp_path / "target"), "--new-draft", "hidden=32,layers=1,heads=2,kv_heads=1",
          "--data", str(data), "--out", str(tmp_path / "run"), "--steps", "4", "--batch-size", "4",
          "--save-draft", str(tmp_path / "draft"), "--no-progress"])
    assert "final loss" in capsys.readouterr().out
    draft = jaxspec.load(tmp_path / "draft")
    assert draft.config.hidden_size == 32 and draft.vocab_size == target.vocab_size
