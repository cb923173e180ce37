"""Offline distillation (jaxspec.training.offline): stored target outputs -> a trained draft."""

import json

import jax
import numpy as np
import pytest
from helpers import tiny_config

import jaxspec
from jaxspec.models import llama
from jaxspec.training import offline as d


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
            pred = logits[len(p) - 1 : len(p) + len(o) - 1].argmax(-1)
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
        d.distill_offline(
            d.new_draft(target, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1),
            bad,
            out_dir=tmp_path / "o",
            steps=1,
        )


@pytest.mark.parametrize("spec", ["hidden=32,layers=1,heads=2,kv_heads=1", "target_layers=1,vocab=30"])
def test_cli_offline_distills_a_new_draft_and_saves_it(tmp_path, target, data, capsys, spec):
    from jaxspec.cli.distill import main

    jaxspec.save(target, tmp_path / "target")
    main(
        [
            "--target",
            str(tmp_path / "target"),
            "--new-draft",
            spec,
            "--data",
            str(data),
            "--out",
            str(tmp_path / "run"),
            "--steps",
            "4",
            "--batch-size",
            "4",
            "--save-draft",
            str(tmp_path / "draft"),
            "--no-progress",
        ]
    )
    assert "final loss" in capsys.readouterr().out
    draft = jaxspec.load(tmp_path / "draft")
    assert draft.vocab_size == target.vocab_size
    if spec.startswith("hidden"):
        assert draft.config.hidden_size == 32 and not draft.config.vocab_ids
    else:
        assert draft.config.num_layers == 1 and len(draft.config.vocab_ids) == 30


def test_choose_vocab_keeps_the_most_frequent_ids_and_eos():
    records = [([7, 7, 8], [3, 3, 3, 4]), ([8, 9], [3, 5])]
    # generated: 3 x4, 4, 5; prompt (weight 0.2): 7 x2, 8 x2, 9
    assert d.choose_vocab(records, 3, vocab_size=20, always=[1]) == (1, 3, 4)  # ties (4, 5) broken by id
    assert d.choose_vocab(records, 5, vocab_size=20, always=[1]) == (1, 3, 4, 5, 7)
    assert d.choose_vocab(records, 4, vocab_size=20, prompt_weight=0.0) == (0, 3, 4, 5)  # unseen: lowest ids fill
    assert d.choose_vocab(records, 9, vocab_size=20, always=[1]) == (0, 1, 2, 3, 4, 5, 7, 8, 9)
    with pytest.raises(ValueError, match="vocab_size"):
        d.choose_vocab(records, 21, vocab_size=20)


def test_draft_from_target_copies_its_layers_and_restricts_the_vocabulary(target):
    ids = tuple(range(0, target.vocab_size, 3))
    draft = d.draft_from_target(target, [0], vocab_ids=ids)
    assert draft.config.num_layers == 1 and draft.config.embed_rows == len(ids) + 1
    t_layers, d_layers = target.params["layers"], draft.params["layers"]  # split per layer (from_params)
    assert len(d_layers) == 1 and len(t_layers) == target.config.num_layers
    for a, b in zip(jax.tree.leaves(t_layers[0]), jax.tree.leaves(d_layers[0]), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    emb = np.asarray(target.params["embed"]["embedding"])
    np.testing.assert_array_equal(np.asarray(draft.params["embed"]["embedding"])[:-1], emb[list(ids)])
    # a one-layer target truncated to the same layer, full vocabulary: identical logits on the kept ids
    full = d.draft_from_target(target, [0])
    seq = np.asarray([[3, 9, 6, 30, 12]])  # all in ids (others embed as the out-of-vocabulary row)
    lf, lr = np.asarray(full.logits(seq)), np.asarray(draft.logits(seq))
    np.testing.assert_allclose(lr[..., list(ids)], lf[..., list(ids)], rtol=1e-5, atol=1e-5)
    outside = np.setdiff1d(np.arange(target.vocab_size), ids)
    assert np.isneginf(lr[..., outside]).all()
    with pytest.raises(ValueError, match="layers"):
        d.draft_from_target(target, [5])


def test_reduced_vocabulary_draft_trains_and_speculates_exactly_greedy(tmp_path, target, data):
    records = d.read_data(data)
    draft = d.make_draft(target, records, **d.parse_spec("target_layers=1,vocab=40"))
    assert len(draft.config.vocab_ids) == 40 and target.eos_token_id in draft.config.vocab_ids
    covered = np.mean([t in draft.config.vocab_ids for _, o in records for t in o])
    assert covered < 1.0  # some labels fall outside the vocabulary: they must be skipped, not break the loss
    kw = dict(batch_size=8, learning_rate=3e-3, prompt_weight=0.1, checkpoint_every=100, progress=False)
    trained, log = d.distill_offline(draft, records, out_dir=tmp_path / "r", steps=30, **kw)
    assert np.isfinite([r["loss"] for r in log]).all() and log[-1]["loss"] < log[0]["loss"]
    prompts = [p for p, _ in records[:6]]
    plain = jaxspec.generate(target, prompts, max_new_tokens=16, temperature=0.0)
    spec = jaxspec.generate(target, prompts, draft=trained, gamma=3, max_new_tokens=16, temperature=0.0)
    assert spec.tokens == plain.tokens and spec.stats.acceptance_rate > 0.2
    # saved and loaded (bf16 storage), the vocabulary ids survive exactly
    jaxspec.save(trained, tmp_path / "saved", storage_dtype="bfloat16")
    back = jaxspec.load(tmp_path / "saved")
    assert back.config.vocab_ids == trained.config.vocab_ids
    with pytest.raises(ValueError, match="target_layers"):
        d.parse_spec("target_layers=2,hidden=64")
    with pytest.raises(ValueError, match="--data"):
        d.make_draft(target, None, vocab=10)


def test_training_loss_is_the_models_own_soft_capped_nll():
    """The offline loss computes the LM head at chosen positions itself; for a soft-capped model (Gemma 2) it
    caps as the model's forward does: at learning rate 0 it equals the NLL of the model's own logits. Negative
    control: the same weights without the cap give another loss."""
    import dataclasses

    import jax.numpy as jnp

    from jaxspec.models import families

    cfg = tiny_config(final_softcap=0.5, init_std=0.3)
    model = llama.init(cfg, seed=0)
    params = families.stack_layers(model.params)
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, cfg.vocab_size, (1, 16)), jnp.int32)
    select, weight = jnp.arange(15)[None], jnp.ones((1, 15))
    schedule = jnp.asarray([0.0, 1.0, 10.0], jnp.float32)

    def loss(c):
        opt_state = d.make_optimizer(0.0, 1.0, 10.0).init(params)
        return float(d.train_step_fn(c)(params, opt_state, tokens, select, weight, schedule)[2])

    logp = np.asarray(jax.nn.log_softmax(model.logits(tokens), -1))[0]
    nll = -np.mean([logp[t, int(tokens[0, t + 1])] for t in range(15)])
    assert loss(cfg) == pytest.approx(nll, rel=1e-5)
    assert abs(loss(dataclasses.replace(cfg, final_softcap=None)) - nll) > 0.1
