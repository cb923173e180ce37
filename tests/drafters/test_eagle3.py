"""EAGLE-3 heads (jaxspec.models.eagle3 through jaxspec.eagle): the target's tapped layers, the draft vocabulary's
map to target ids, exact greedy output through the loop and the engine, saving and loading, and clear errors.

Parity with the reference implementation and loading published layouts: test_eagle3_formats.py. The statistical
exactness of sampling with an EAGLE-3 head is in tests/generation/test_exactness.py (with its negative control)."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import check_window_logits_at_last_only, tiny_config

import jaxspec
from jaxspec.core.sampling import SamplingParams
from jaxspec.drafters import eagle
from jaxspec.models import eagle as eagle_model
from jaxspec.models import eagle3, families, llama

PROMPTS = [[5, 9, 11, 3, 7, 21, 40, 2, 8], [3], [60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73], [17, 4]]
VOCAB_IDS = tuple(range(95, 0, -3))  # a draft vocabulary whose rows are not in target-id order


@pytest.fixture(scope="module")
def target():
    return llama.init(tiny_config(num_layers=4), seed=0, eos_token_id=1)


@pytest.fixture(scope="module")
def head(target):
    cfg = eagle3.head_config(target.config, VOCAB_IDS, aux_layers=(1, 2, 4))
    own = eagle3.init_own(cfg, seed=1)
    return eagle.EagleDrafter.for_target(target, own, config=cfg, name="head3")


def test_taps_are_the_hidden_states_entering_those_layers_in_both_layouts(target):
    """Tap 0 is the embedding output, tap L the last layer's output (before the final norm, whose application gives
    the final-norm features), tap i the output of layer i-1: checked against the model run with 1 and 2 of its
    layers; the stacked layout taps the same states as the split one."""
    cfg = target.config
    tokens = jnp.asarray([PROMPTS[0]])
    positions = jnp.arange(tokens.shape[1])[None]
    cache = target.init_cache(1, 16)
    _, taps, _ = llama.taps_fn(cfg, (0, 1, 2, 4))(target.params, tokens, positions, cache)
    taps = np.asarray(taps).reshape(1, tokens.shape[1], 4, cfg.hidden_size)
    np.testing.assert_allclose(taps[:, :, 0], np.asarray(target.params["embed"]["embedding"])[np.asarray(tokens)])
    for k in (1, 2):  # the first k layers alone, their output before the final norm
        part = families.first_layers(target, k)
        _, x, _ = llama.taps_fn(part.config, (k,))(part.params, tokens, positions, part.init_cache(1, 16))
        np.testing.assert_allclose(taps[:, :, k], np.asarray(x), rtol=1e-5, atol=1e-5)
    _, final, _ = llama.features_fn(cfg)(target.params, tokens, positions, cache)
    normed = llama.RMSNorm(cfg.rms_norm_eps, cfg.jnp_dtype).apply(
        {"params": target.params["final_norm"]}, jnp.asarray(taps[:, :, 3])
    )
    np.testing.assert_allclose(np.asarray(normed), np.asarray(final), rtol=1e-5, atol=1e-5)
    stacked = families.stack_layers(target.params)
    _, taps_stacked, _ = llama.taps_fn(cfg, (0, 1, 2, 4))(stacked, tokens, positions, cache)
    np.testing.assert_allclose(np.asarray(taps_stacked).reshape(taps.shape), taps, rtol=1e-6, atol=1e-6)


def test_draft_rows_map_to_their_target_ids_and_nothing_else(head):
    """Row d of the head's logits is target id vocab_ids[d]; every id outside the draft vocabulary gets -inf (q =
    0 there). Negative control: reading the rows in target-id order (the wrong map) differs."""
    apply_fn, init_cache = eagle3.head_fns(head.config)
    tokens = jnp.asarray([[4, 7, 9]])
    feats = jax.random.normal(jax.random.key(2), (1, 3, head.config.feature_size))
    positions = jnp.arange(3)[None]
    rows, _, _ = apply_fn(head.params, tokens, feats, positions, init_cache(1, 8), False)
    full, _, _ = apply_fn(head.params, tokens, feats, positions, init_cache(1, 8))
    rows, full = np.asarray(rows), np.asarray(full)
    assert rows.shape[-1] == len(VOCAB_IDS) and full.shape[-1] == head.config.vocab_size
    np.testing.assert_array_equal(full[..., list(VOCAB_IDS)], rows)
    outside = np.setdiff1d(np.arange(head.config.vocab_size), VOCAB_IDS)
    assert np.all(np.isneginf(full[..., outside]))
    assert not np.allclose(full[..., sorted(VOCAB_IDS)], rows)  # negative control: the wrong order


def test_a_window_pass_may_compute_its_last_logits_alone(head):
    """``last_only``: the last position's logits alone, as the whole pass gives them (helpers)."""
    apply_fn, init_cache = eagle3.head_fns(head.config)
    check_window_logits_at_last_only(
        apply_fn, init_cache, head.params, head.config.feature_size, head.config.vocab_size
    )


def test_later_steps_read_the_heads_own_hidden_state(head):
    """A step reads fused target features (feature_size wide, through fc) or the head's own output (hidden wide,
    as is): the same hidden state given both ways, fc's output and the raw state, gives the same logits."""
    apply_fn, init_cache = eagle3.head_fns(head.config)
    tokens, positions = jnp.asarray([[4]]), jnp.asarray([[0]])
    feats = jax.random.normal(jax.random.key(3), (1, 1, head.config.feature_size))
    fused = feats @ head.params["fc"]["kernel"]
    a, _, _ = apply_fn(head.params, tokens, feats, positions, init_cache(1, 4))
    b, _, _ = apply_fn(head.params, tokens, fused, positions, init_cache(1, 4))
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="feats must be"):
        apply_fn(head.params, tokens, feats[..., :5], positions, init_cache(1, 4))


@pytest.mark.parametrize("gamma", [1, None])
def test_greedy_with_an_eagle3_head_equals_plain(target, head, gamma):
    """None: the head's default γ, 3 for an EAGLE-3 head (an EAGLE-1-style head's is 2)."""
    kwargs = dict(max_new_tokens=30, temperature=0.0, eos_token_id=())
    plain = jaxspec.generate(target, PROMPTS, **kwargs)
    spec = jaxspec.generate(target, PROMPTS, draft=head, gamma=gamma, **kwargs)
    assert spec.tokens == plain.tokens
    assert spec.stats.mode == "speculative" and spec.stats.drafted > 0
    assert spec.stats.gamma == (gamma or 3) == (gamma or head.default_gamma)
    assert head.default_gamma in jaxspec.policy.AutoGamma().gammas  # gamma="auto" can choose what None runs


def test_engine_with_an_eagle3_head_equals_plain(target, head):
    prompts = PROMPTS * 3
    kwargs = dict(max_new_tokens=24, temperature=0.0, eos_token_id=())
    plain = jaxspec.generate(target, prompts, **kwargs)
    engine = jaxspec.Engine(target, draft=head, gamma=3, slots=4, **kwargs)
    rows = sorted(engine.run(prompts), key=lambda r: r.index)
    assert [r.tokens for r in rows] == plain.tokens
    assert sum(r.stats.drafted for r in rows) > 0


def test_save_and_load_round_trip(tmp_path, target, head):
    path = eagle.save(head, tmp_path / "h3")
    back = eagle.load(path, target)
    assert back.config == head.config and back.eagle3
    for a, b in zip(jax.tree.leaves(head.params), jax.tree.leaves(back.params)):  # stored as float16
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-3, atol=2e-3)
    kwargs = dict(max_new_tokens=12, temperature=0.0, eos_token_id=())
    assert jaxspec.generate(target, PROMPTS, draft=back, gamma=2, **kwargs).tokens == (
        jaxspec.generate(target, PROMPTS, **kwargs).tokens
    )


def test_a_head_that_does_not_fit_its_target_is_refused(target, head):
    other = llama.init(tiny_config(num_layers=2), seed=0, eos_token_id=1)  # aux layer 4 does not exist there
    with pytest.raises(ValueError, match="aux_layers"):
        eagle.EagleDrafter.for_target(other, eagle3.init_own(head.config), config=head.config)
    with pytest.raises(ValueError, match="draft: the EAGLE head"):
        jaxspec.generate(other, PROMPTS, draft=head, max_new_tokens=4)
    with pytest.raises(ValueError, match="vocab_ids"):
        eagle3.head_config(target.config, (1, 1, 2))
    with pytest.raises(ValueError, match="vocab_ids"):
        eagle3.head_config(target.config, (1, target.config.vocab_size))
    with pytest.raises(ValueError, match="aux_layers"):
        eagle3.head_config(target.config, VOCAB_IDS, aux_layers=(1, 9))


def test_training_time_test_computes_what_drafting_computes(target, head):
    """ttt_logits' step k at position i equals the head drafting with its cache: a window pass over the fused
    features up to i, then k-1 steps each reading the head's own output with the next (teacher-forced) token.
    Negative control: step 2 attending to step 1's keys past its chain start (plain causal attention over the
    window) differs."""
    from jaxspec.training import eagle3 as train3

    cfg = head.config
    apply_fn, init_cache = eagle3.head_fns(cfg)
    rng = np.random.default_rng(5)
    length, steps = 9, 3
    tokens = jnp.asarray(rng.integers(2, 96, size=(2, length + steps)), jnp.int32)
    feats = jnp.asarray(rng.normal(size=(2, length, cfg.feature_size)), jnp.float32)
    positions = jnp.broadcast_to(jnp.arange(length), (2, length))  # the cache attends to every slot up to a position
    got = np.asarray(train3.ttt_logits(cfg, head.params, tokens, feats, positions, steps))
    for i in (0, 3, length - 1):
        cache = init_cache(2, 32)
        logits, x, cache = apply_fn(
            head.params, tokens[:, : i + 1], feats[:, : i + 1], positions[:, : i + 1], cache, False
        )
        np.testing.assert_allclose(got[0, :, i], np.asarray(logits[:, -1]), rtol=2e-4, atol=2e-4)
        own = x[:, -1:]
        for k in range(1, steps):
            pos = positions[:, i : i + 1] + k
            logits, x, cache = apply_fn(head.params, tokens[:, i + k : i + k + 1], own, pos, cache, False)
            np.testing.assert_allclose(got[k, :, i], np.asarray(logits[:, 0]), rtol=2e-4, atol=2e-4)
            own = x
    # negative control: step 2 as one causal pass over the step-1 outputs in a fresh cache (each position seeing
    # the earlier chains' step-2 keys, not step 1's) is not what drafting computes
    _, x, _ = apply_fn(head.params, tokens[:, :length], feats, positions, init_cache(2, 32), False)
    naive, _, _ = apply_fn(head.params, tokens[:, 1 : length + 1], x, positions + 1, init_cache(2, 32), False)
    assert np.abs(np.asarray(naive[:, 1:]) - got[1, :, 1:]).max() > 1e-2


def test_total_variation_loss_is_the_chains_rejection_and_training_lowers_it(target, head):
    """``loss="tvd"``: the step's loss is Σ_k 0.8^(k-1) × the mean over valid chains of ½Σ|p − q| between the
    target's distribution at the token step k predicts (its final-norm state through the draft vocabulary's LM
    head columns) and the head's draft distribution there (one minus a sampled draft's acceptance), written out
    here chain by chain; the cross-entropy of the default loss is another number (the control); one optimizer step
    on it lowers it on the same batch."""
    from jaxspec.training import eagle3 as train3
    from jaxspec.training.common import make_optimizer

    cfg, hidden, n_aux, steps = head.config, target.config.hidden_size, len(head.config.aux_layers), 3
    rng = np.random.default_rng(7)
    batch, width = 2, 10
    tokens = jnp.asarray(rng.integers(2, 96, size=(batch, width + 1)), jnp.int32)
    feats = jnp.asarray(rng.normal(size=(batch, width + 1, (n_aux + 1) * hidden)), jnp.float32)
    positions = jnp.broadcast_to(jnp.arange(width + 1, dtype=jnp.int32), (batch, width + 1))
    mask = np.ones((batch, width + 1), np.float32)
    mask[1, 7:] = 0  # the second row ends early
    top = jnp.zeros((batch, width + 1), jnp.int32)
    shared = {
        "embed": target.params["embed"]["embedding"],
        "head": eagle3.target_head_columns(cfg, target.config, target.params),
    }
    own = {k: head.params[k] for k in eagle3.OWN}
    schedule = jnp.asarray([1e-4, 0, 10], jnp.float32)
    args = (shared, tokens, feats, top, positions, jnp.asarray(mask), schedule)

    step = train3.train_step_fn(cfg, steps, "tvd")
    new_own, _, loss, _ = step(own, make_optimizer(*schedule).init(own), *args)
    params = {"lm_head": shared["head"], **own, "embed": shared["embed"]}
    tok = jnp.pad(tokens[:, 1:], ((0, 0), (0, steps)))
    q = np.asarray(
        jax.nn.softmax(
            train3.ttt_logits(cfg, params, tok, feats[:, :width, : n_aux * hidden], positions[:, :width], steps), -1
        )
    )
    final = np.asarray(feats[:, :, n_aux * hidden :]) @ np.asarray(shared["head"])
    p = np.exp(final - final.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    want = 0.0
    for k in range(steps):  # step k+1 of chain i predicts token i+k+2, the target's distribution at index i+k+1
        tv, count = 0.0, 0
        for b in range(batch):
            for i in range(width):
                if i + k + 1 <= width and mask[b, i] and mask[b, i + k + 1]:
                    tv += 0.5 * np.abs(p[b, i + k + 1] - q[k, b, i]).sum()
                    count += 1
        want += 0.8**k * tv / count
    np.testing.assert_allclose(float(loss), want, rtol=1e-4)
    _, _, ce, _ = train3.train_step_fn(cfg, steps, "fkl")(own, make_optimizer(*schedule).init(own), *args)
    assert abs(float(ce) - want) > 0.1
    _, _, after, _ = step(new_own, make_optimizer(*schedule).init(new_own), *args)
    assert float(after) < float(loss)
    with pytest.raises(ValueError, match="loss must be one of"):
        train3.train_step_fn(cfg, steps, "kl")


def test_training_raises_agreement_and_resumes(tmp_path, target):
    """A few hundred steps on the target's own greedy continuations raise every step's teacher-forced agreement
    above the untrained head's; a run killed at step 40 and resumed ends with the parameters of one unbroken run."""
    from jaxspec.training import eagle3 as train3

    rng = np.random.default_rng(0)
    prompts = [list(map(int, rng.integers(2, 96, size=int(rng.integers(3, 12))))) for _ in range(24)]
    out = jaxspec.generate(target, prompts, max_new_tokens=40, temperature=0.0, eos_token_id=())
    records = list(zip(prompts, out.tokens))
    kw = dict(steps_ahead=3, vocab=64, batch_size=8, window=32, learning_rate=5e-3, progress=False, log_every=5)
    trained, log = train3.train_head(target, records, out_dir=tmp_path / "a", steps=60, **kw)
    first, last = log[0]["agreement"], log[-1]["agreement"]
    assert all(b > a + 0.1 for a, b in zip(first, last)), (first, last)
    assert trained.eagle3 and trained.config.draft_vocab_size == 64
    _, part = train3.train_head(target, records, out_dir=tmp_path / "b", steps=60, stop_at=20, **kw)
    assert part[-1]["step"] == 20
    resumed, rest = train3.train_head(target, records, out_dir=tmp_path / "b", steps=60, **kw)
    assert rest[0]["step"] == 25  # went on from the step-20 checkpoint
    for a, b in zip(jax.tree.leaves(resumed.params), jax.tree.leaves(trained.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # greedy acceptance with the trained head against the untrained one (its LM head is already the target's)
    untrained = eagle.EagleDrafter.for_target(
        target,
        eagle3.init_own(
            trained.config, lm_head=eagle3.target_head_columns(trained.config, target.config, target.params)
        ),
        config=trained.config,
    )
    kwargs = dict(max_new_tokens=40, temperature=0.0, eos_token_id=())
    plain = jaxspec.generate(target, prompts[:8], **kwargs).tokens
    alphas = []
    for h in (untrained, trained):
        spec = jaxspec.generate(target, prompts[:8], draft=h, gamma=1, **kwargs)
        assert spec.tokens == plain
        alphas.append(spec.stats.acceptance_rate)
    print("agreement", first, last, "greedy alpha untrained, trained", alphas)
    assert alphas[1] > max(2 * alphas[0], 0.1), alphas


def test_an_eagle3_head_on_a_mesh_under_lookup_first_and_with_auto_gamma(target, head):
    """Where today's head works, the EAGLE-3 head does: on a data × model mesh, behind prompt lookup
    (``LookupFirst``), and with ``gamma="auto"`` (its steps timed as a model's), greedy output equal to plain."""
    kwargs = dict(max_new_tokens=16, temperature=0.0, eos_token_id=())
    plain = jaxspec.generate(target, PROMPTS, **kwargs).tokens
    meshed = jaxspec.generate(target, PROMPTS, draft=head, gamma=2, mesh={"data": 4, "model": 2}, **kwargs)
    assert meshed.tokens == plain and meshed.stats.drafted > 0
    assert jaxspec.generate(target, PROMPTS, draft=jaxspec.LookupFirst(head), gamma=3, **kwargs).tokens == plain
    policy = jaxspec.policy.AutoGamma()
    assert jaxspec.generate(target, PROMPTS, draft=head, gamma="auto", policy=policy, **kwargs).tokens == plain
    (costs,) = policy._costs.values()
    assert costs.c > 0


def test_going_on_a_head_that_reads_the_target_lm_head_can_train_its_own(tmp_path, target):
    """``train_lm_head=True`` on a head that reads the target's LM head gives it its own, starting at the target's
    columns and trained from there (saved and loaded as its own); a head with its own cannot go back."""
    from jaxspec.training import eagle3 as train3

    rng = np.random.default_rng(1)
    prompts = [list(map(int, rng.integers(2, 96, size=int(rng.integers(3, 12))))) for _ in range(8)]
    out = jaxspec.generate(target, prompts, max_new_tokens=24, temperature=0.0, eos_token_id=())
    records = list(zip(prompts, out.tokens))
    kw = dict(steps_ahead=2, batch_size=4, window=16, learning_rate=5e-3, progress=False)
    shared, _ = train3.train_head(target, records, out_dir=tmp_path / "a", steps=4, vocab=48, train_lm_head=False, **kw)
    assert shared.shared_lm_head and eagle.load(eagle.save(shared, tmp_path / "s"), target).shared_lm_head
    columns = np.asarray(eagle3.target_head_columns(shared.config, target.config, target.params))
    stopped, _ = train3.train_head(
        target, records, out_dir=tmp_path / "b", steps=8, stop_at=1, init=shared, train_lm_head=True, **kw
    )
    own, _ = train3.train_head(target, records, out_dir=tmp_path / "b", steps=8, init=shared, train_lm_head=True, **kw)
    assert not stopped.shared_lm_head and not own.shared_lm_head
    first = np.abs(np.asarray(stopped.params["lm_head"], np.float32) - columns).mean()
    moved = np.abs(np.asarray(own.params["lm_head"], np.float32) - columns).mean()
    assert first < moved / 2 and moved > 1e-3, (first, moved)  # started at the columns, then trained
    back = eagle.load(eagle.save(own, tmp_path / "o"), target)
    assert not back.shared_lm_head
    np.testing.assert_allclose(back.params["lm_head"], own.params["lm_head"], rtol=1e-3, atol=1e-4)  # as float16
    with pytest.raises(ValueError, match="train_lm_head=False: the head .* has its own LM head"):
        train3.train_head(target, records, out_dir=tmp_path / "c", steps=2, init=own, train_lm_head=False, **kw)


def test_cli_trains_an_eagle3_head_saves_it_and_generates_with_it(tmp_path, target, capsys):
    import json

    from jaxspec.cli.distill import main

    jaxspec.save(target, tmp_path / "target")
    rng = np.random.default_rng(1)
    with open(tmp_path / "data.jsonl", "w") as f:
        for _ in range(12):
            ids = list(map(int, rng.integers(2, 96, size=20)))
            f.write(json.dumps({"prompt_ids": ids[:5], "output_ids": ids[5:]}) + "\n")
    flags = [
        "--target",
        str(tmp_path / "target"),
        "--new-draft",
        "eagle3=2,vocab=40,lm_head=0,aux=1:4",  # the target's LM head: neither trained nor stored
        "--data",
        str(tmp_path / "data.jsonl"),
    ]
    flags += ["--out", str(tmp_path / "run"), "--steps", "3", "--batch-size", "2", "--window", "16", "--no-progress"]
    held = ["--heldout-data", str(tmp_path / "data.jsonl")]
    main([*flags, *held, "--tree-temperature-scale", "auto", "--save-draft", str(tmp_path / "head3")])
    out = capsys.readouterr().out
    assert "final loss" in out and "held-out agreement (teacher-forced, per draft step)" in out
    chosen = [line for line in out.splitlines() if line.endswith("<- chosen")]
    assert "by tree temperature scale" in out and len(chosen) == 1
    reloaded = jaxspec.load(tmp_path / "target")
    loaded = eagle.load(tmp_path / "head3", reloaded)
    assert loaded.tree_temperature_scale == float(chosen[0].split(":")[0]) and loaded.temperature_scale == 1.0
    with pytest.raises(SystemExit):  # auto needs held-out records to choose on
        main([*flags, "--tree-temperature-scale", "auto"])
    assert loaded.eagle3 and loaded.name == "head3" and loaded.config.draft_vocab_size == 40
    assert loaded.config.aux_layers == (1, 4)  # tap 4: the last layer's output
    assert loaded.shared_lm_head and "lm_head" not in np.load(tmp_path / "head3" / "model.npz").files
    columns = eagle3.target_head_columns(loaded.config, reloaded.config, reloaded.params)
    np.testing.assert_allclose(np.asarray(loaded.params["lm_head"]), np.asarray(columns), atol=1e-6)
    meta = json.loads((tmp_path / "head3" / "jaxspec.json").read_text())
    (tmp_path / "head3" / "jaxspec.json").write_text(json.dumps({**meta, "lm_head": "own"}))
    with pytest.raises(ValueError, match="lm_head 'own' but the weights lack one"):
        eagle.load(tmp_path / "head3", target)
    (tmp_path / "head3" / "jaxspec.json").write_text(json.dumps(meta))
    # the generate command's --draft takes a saved EAGLE-3 head and a published checkpoint alike
    from jaxspec.cli.models import _load_draft

    assert _load_draft(str(tmp_path / "head3"), target, None).eagle3
    for spec in ("eagle3=2,layers=2", "eagle3=2,aux=1:1", "eagle=1,aux=1:2"):  # other sizes, repeated or misplaced taps
        with pytest.raises(SystemExit):
            main(["--target", str(tmp_path / "target"), "--new-draft", spec, "--data", "d", "--out", "o"])
    # --loss tvd trains an EAGLE-3 head on the total variation (its log says so); an EAGLE-1-style head refuses it
    main([*flags, "--out", str(tmp_path / "tvd"), "--loss", "tvd"])  # the later --out counts
    log = (tmp_path / "tvd" / "distill_log.jsonl").read_text().splitlines()
    kinds = {json.loads(line)["loss_kind"] for line in log}
    assert kinds == {"eagle3-tvd"}
    eagle1 = ["--new-draft", "eagle=1", "--data", str(tmp_path / "data.jsonl"), "--out", str(tmp_path / "e1")]
    with pytest.raises(SystemExit, match="--loss tvd trains EAGLE-3 heads"):
        main(["--target", str(tmp_path / "target"), *eagle1, "--loss", "tvd", "--no-progress"])
    offline = ["--new-draft", "target_layers=1", "--data", str(tmp_path / "data.jsonl"), "--out", str(tmp_path / "d")]
    with pytest.raises(SystemExit, match="--data trains by cross-entropy"):  # a draft model's offline distillation
        main(["--target", str(tmp_path / "target"), *offline, "--loss", "rkl", "--no-progress"])


def test_a_killed_feature_pass_goes_on_from_its_last_flush(tmp_path, target, monkeypatch):
    """The training's feature pass, killed after 5 batches (flushed every 2), goes on from batch 4 and ends with
    the features and top tokens of an unbroken pass, bit for bit; the unbroken pass's result is then reused."""
    from jaxspec.training import eagle3 as train3

    rng = np.random.default_rng(3)
    records = [
        (list(map(int, rng.integers(2, 96, size=4))), list(map(int, rng.integers(2, 96, size=n))))
        for n in range(3, 59, 4)
    ]

    class Killed(list):  # reading records for the 6th batch of 2 kills the pass
        reads = 0

        def __getitem__(self, i):
            Killed.reads += 1
            if Killed.reads > 2 * 2 * 5:
                raise KeyboardInterrupt("killed")
            return super().__getitem__(i)

    monkeypatch.setattr(train3, "FLUSH_EVERY", 2)
    with pytest.raises(KeyboardInterrupt):
        train3.extract_features(target, Killed(records), (1, 2), tmp_path / "run", batch_size=2, progress=False)
    assert json.loads((tmp_path / "run" / train3.PROGRESS).read_text())["batches_done"] == 4
    resumed = train3.extract_features(target, records, (1, 2), tmp_path / "run", batch_size=2, progress=False)
    whole = train3.extract_features(target, records, (1, 2), tmp_path / "whole", batch_size=2, progress=False)
    np.testing.assert_array_equal(np.asarray(resumed[0]), np.asarray(whole[0]))
    np.testing.assert_array_equal(resumed[1], whole[1])
    assert not (tmp_path / "run" / train3.PROGRESS).exists()
    again = train3.extract_features(target, records, (1, 2), tmp_path / "run", batch_size=2, progress=False)
    np.testing.assert_array_equal(np.asarray(again[0]), np.asarray(whole[0]))


def test_a_new_eagle3_head_starts_near_an_eagle_head(tmp_path, target, capsys):
    """from_eagle_head: an EAGLE-3 head that drafts its first step as the EAGLE head does (whose embedding half
    is small here, the part of its input EAGLE-3's residual cannot hold), on a target and head whose norm scales
    are not ones, so each scale's place in the mapping matters. Negative controls: a random EAGLE-3 head, and the
    mapping with the target's last layer read from the wrong tap. Then the CLI trains it (--draft with
    --new-draft)."""
    import dataclasses

    from jaxspec.cli.distill import main
    from jaxspec.models import eagle as eagle_model
    from jaxspec.training import eagle3 as train3

    rng = np.random.default_rng(3)
    params = jax.tree.map(lambda x: x, target.params)
    params["final_norm"] = {"scale": jnp.asarray(rng.uniform(0.5, 1.5, target.config.hidden_size), jnp.float32)}
    tgt = dataclasses.replace(target, params=params)
    cfg1 = eagle_model.head_config(tgt.config)
    own1 = eagle_model.init_own(cfg1, seed=2)
    width = cfg1.hidden_size
    own1["fc"]["kernel"] = own1["fc"]["kernel"].at[:width].multiply(0.05)
    for norm in ("input_norm", "post_attn_norm"):
        shape = own1["layers"][norm]["scale"].shape
        own1["layers"][norm]["scale"] = jnp.asarray(rng.uniform(0.5, 1.5, shape), jnp.float32)
    own1["final_norm"]["scale"] = jnp.asarray(rng.uniform(0.5, 1.5, width), jnp.float32)
    head1 = eagle.EagleDrafter.for_target(tgt, own1, config=cfg1, name="e1")
    records = [(p[:1], p[1:] * 3) for p in PROMPTS]
    with pytest.raises(ValueError, match="must hold 4"):
        train3.from_eagle_head(tgt, head1, records, aux_layers=(1, 2, 3))
    warm = train3.from_eagle_head(tgt, head1, records, aux_layers=(1, 2, 4))
    assert warm.eagle3 and warm.shared_lm_head and warm.config.norm_before_residual

    seqs = jnp.asarray(rng.integers(2, 96, size=(4, 33)), jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(32), (4, 32))
    _, taps, _ = llama.taps_fn(tgt.config, (1, 2, 4))(tgt.params, seqs[:, :32], positions, tgt.init_cache(4, 32))
    h = taps[..., 2 * width :]
    f = h * jax.lax.rsqrt(jnp.mean(h * h, -1, keepdims=True) + tgt.config.rms_norm_eps) * params["final_norm"]["scale"]
    apply1, cache1 = eagle_model.head_fns(cfg1)
    want = np.asarray(apply1(head1.params, seqs[:, 1:], f, positions, cache1(4, 32))[0]).argmax(-1)

    def agree(drafter, feats):
        apply3, cache3 = eagle3.head_fns(drafter.config)
        logits = apply3(drafter.params, seqs[:, 1:], feats, positions, cache3(4, 32))[0]
        return float((np.asarray(logits).argmax(-1) == want).mean())

    assert agree(warm, taps) >= 0.9
    random_head = eagle.EagleDrafter.for_target(tgt, eagle3.init_own(warm.config, 1), config=warm.config)
    assert agree(random_head, taps) < 0.3
    wrong_tap = jnp.concatenate([h, taps[..., width : 2 * width], taps[..., :width]], -1)  # tap 4 where tap 1 goes
    assert agree(warm, wrong_tap) < 0.5

    tgt_dir, head_dir = tmp_path / "target", tmp_path / "e1"
    jaxspec.save(tgt, tgt_dir)
    eagle.save(head1, head_dir)
    with open(tmp_path / "data.jsonl", "w") as fh:
        for p, o in records:
            fh.write(json.dumps({"prompt_ids": p, "output_ids": o}) + "\n")
    flags = ["--target", str(tgt_dir), "--draft", str(head_dir), "--data", str(tmp_path / "data.jsonl")]
    flags += ["--out", str(tmp_path / "run"), "--steps", "2", "--batch-size", "2", "--window", "16", "--no-progress"]
    main([*flags, "--new-draft", "eagle3=2,aux=1:2:4", "--save-draft", str(tmp_path / "e3")])
    assert "final loss" in capsys.readouterr().out
    loaded = eagle.load(tmp_path / "e3", jaxspec.load(tgt_dir))
    assert loaded.eagle3 and loaded.config.aux_layers == (1, 2, 4) and loaded.config.norm_before_residual
    with pytest.raises(SystemExit):  # vocab comes from the EAGLE head
        main([*flags, "--new-draft", "eagle3=2,vocab=40"])


# --------------------------------------------------------------------------------------------- context ids
# VOCAB_IDS are the ids ≡ 2 (mod 3) below 96: in CONTEXT's first 6 ids, 6 and 7 lie outside (51 is past the length).
CONTEXT = [5, 95, 6, 5, 7, 92, 50, 51]
OTHER = [10, 12, 11, 10, 0, 0, 0, 0]  # 10 and 12 outside in its first 4


@pytest.fixture(scope="module")
def tied():
    return llama.init(tiny_config(num_layers=4, tie_embeddings=True), seed=0, eos_token_id=1)


def _shared_own(cfg):
    return {k: v for k, v in eagle3.init_own(cfg, seed=1).items() if k != "lm_head"}


@pytest.fixture(scope="module")
def shared(tied):
    """A head whose LM head is its tied target's at the draft vocabulary's columns: it drafts context ids."""
    cfg = eagle3.head_config(tied.config, VOCAB_IDS, aux_layers=(1, 2, 4))
    return eagle.EagleDrafter.for_target(tied, _shared_own(cfg), config=cfg, name="shared3")


def test_context_ids_are_a_rows_distinct_ids_outside_the_draft_vocabulary(target, head, shared):
    """The ids, smallest first, padded with vocab_size, cut at the width; set by default only where their columns
    are the LM head's (its own LM head, or a target whose LM head is not its embedding: none)."""
    assert shared.context_vocab == eagle.CONTEXT_VOCAB and head.context_vocab == 0
    own = {k: head.params[k] for k in ("fc", "layer", "final_norm")}
    assert eagle.EagleDrafter.for_target(target, own, config=head.config).context_vocab == 0  # untied target
    tokens, length, vocab = jnp.asarray([CONTEXT, OTHER]), jnp.asarray([6, 4]), shared.config.vocab_size
    ctx = eagle3.context(shared.config, shared.params, tokens, length, 3)
    np.testing.assert_array_equal(np.asarray(ctx.ids), [[6, 7, vocab], [10, 12, vocab]])
    cut = eagle3.context(shared.config, shared.params, tokens, length, 1)
    np.testing.assert_array_equal(np.asarray(cut.ids), [[6], [10]])
    for bad in (-1, True, 2.0):
        with pytest.raises(ValueError, match="context_vocab"):
            dataclasses.replace(shared, context_vocab=bad)
    one_cfg = eagle_model.head_config(target.config)
    one = eagle.EagleDrafter.for_target(target, eagle_model.init_own(one_cfg, seed=1), config=one_cfg)
    with pytest.raises(ValueError, match="context_vocab"):
        dataclasses.replace(one, context_vocab=4)


def test_context_ids_get_the_logits_a_vocabulary_holding_them_gives(tied, shared):
    """Each row's context ids get the logits of a head whose draft vocabulary also holds them (its LM head the
    target's columns, so the same weights); every other id outside the draft vocabulary, another row's context
    ids included, stays -inf. Negative control: without the context those ids are -inf."""
    tokens, length = jnp.asarray([CONTEXT, OTHER]), jnp.asarray([6, 4])
    ctx = eagle3.context(shared.config, shared.params, tokens, length, 4)
    wide_cfg = eagle3.head_config(tied.config, VOCAB_IDS + (6, 7, 10, 12), aux_layers=(1, 2, 4))
    wide = eagle.EagleDrafter.for_target(tied, _shared_own(wide_cfg), config=wide_cfg)
    apply_fn, init_cache = eagle3.head_fns(shared.config)
    feats = jax.random.normal(jax.random.key(5), (2, 3, shared.config.feature_size))
    toks, positions = jnp.asarray([[4, 7, 9]] * 2), jnp.asarray([[0, 1, 2]] * 2)
    got = np.asarray(apply_fn(shared.params, toks, feats, positions, init_cache(2, 8), extra=ctx)[0])
    want = np.asarray(eagle3.head_fns(wide_cfg)[0](wide.params, toks, feats, positions, init_cache(2, 8))[0])
    for row, ids in ((0, [6, 7]), (1, [10, 12])):
        keep = list(VOCAB_IDS) + ids
        np.testing.assert_allclose(got[row][..., keep], want[row][..., keep], rtol=1e-5, atol=1e-5)
        assert np.isneginf(np.delete(got[row], keep, axis=-1)).all()
    without = np.asarray(apply_fn(shared.params, toks, feats, positions, init_cache(2, 8))[0])
    assert np.isneginf(without[0][..., [6, 7]]).all() and np.isneginf(without[1][..., [10, 12]]).all()


def test_chains_and_trees_draft_context_ids(tied, shared):
    """A round's q gives the row's context ids mass, in a chain and in a tree; with context_vocab 0, none."""
    size, length = 16, 6
    seq = jnp.asarray([CONTEXT])
    positions = jnp.arange(len(CONTEXT))[None]
    _, feats, _ = shared.target_features(tied.params, seq, positions, tied.init_cache(1, size))
    tokens = jnp.zeros((1, size), jnp.int32).at[:, : len(CONTEXT)].set(seq)
    state = shared.observe(shared.init_state(1, size), feats[:, : length - 1], positions[:, : length - 1])
    state = shared.prefill(shared.params, seq[:, : length - 1], positions[:, : length - 1], state)
    sampling, keys = SamplingParams.create(1.0, batch=1), jax.random.split(jax.random.key(0), 2)[None]
    for drafter, has in ((shared, True), (dataclasses.replace(shared, context_vocab=0), False)):
        args = (drafter.params, state, tokens, jnp.asarray([length]), sampling, keys, tied.vocab_size)
        chain = drafter.draft(*args)
        tree = drafter.draft_tree(*args, depth=2, branch=2, width=2)
        for q in (chain.q, tree.q[:, :3]):  # the tree's root and first level (the deepest level's q is zero)
            mass = np.asarray(q)[..., [6, 7]].sum(-1)
            assert (mass > 0).all() if has else (mass == 0).all()
            assert (np.asarray(q)[..., [51]] == 0).all()  # past the row's length: not context


def test_greedy_with_context_ids_equals_plain(tied, shared):
    """Through generate (chains, a tree, a data × model mesh, behind prompt lookup) and the engine."""
    kwargs = dict(max_new_tokens=24, temperature=0.0, eos_token_id=())
    plain = jaxspec.generate(tied, PROMPTS, **kwargs)
    assert jaxspec.generate(tied, PROMPTS, draft=shared, gamma=3, **kwargs).tokens == plain.tokens
    assert jaxspec.generate(tied, PROMPTS, draft=shared, tree=(3, 2, 2), **kwargs).tokens == plain.tokens
    meshed = jaxspec.generate(tied, PROMPTS, draft=shared, gamma=2, mesh={"data": 4, "model": 2}, **kwargs)
    assert meshed.tokens == plain.tokens
    assert jaxspec.generate(tied, PROMPTS, draft=jaxspec.LookupFirst(shared), gamma=3, **kwargs).tokens == plain.tokens
    engine = jaxspec.Engine(tied, draft=shared, gamma=3, slots=2, **kwargs)
    assert [r.tokens for r in sorted(engine.run(PROMPTS), key=lambda r: r.index)] == plain.tokens
