"""EAGLE heads (jaxspec.eagle, jaxspec.models.eagle, jaxspec.training.eagle): exact greedy output through the loop
and the engine, the feature window, saving and loading, clear errors, and training that raises acceptance.

The statistical exactness of sampling with a head is in test_exactness.py (with its negative control)."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import check_window_logits_at_last_only, count_compiles, tiny_config

import jaxspec
from jaxspec.core.sampling import SamplingParams
from jaxspec.drafters import eagle
from jaxspec.models import eagle as eagle_model
from jaxspec.models import families, llama
from jaxspec.training import eagle as distill_eagle
from jaxspec.training.offline import parse_spec

PROMPTS = [[5, 9, 11, 3, 7, 21, 40, 2, 8], [3], [60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73], [17, 4]]


@pytest.fixture(scope="module")
def target():
    return llama.init(tiny_config(), seed=0, eos_token_id=1)


@pytest.fixture(scope="module")
def head(target):
    cfg = eagle_model.head_config(target.config, vocab_ids=tuple(range(0, 96, 3)))
    return eagle.EagleDrafter.for_target(target, eagle_model.init_own(cfg, seed=1), config=cfg, name="head")


@pytest.fixture(scope="module")
def data(tmp_path_factory, target):
    """The target's own greedy continuations of 32 random prompts (generate_distill_data.py's records)."""
    rng = np.random.default_rng(0)
    prompts = [list(map(int, rng.integers(2, 96, size=int(rng.integers(3, 12))))) for _ in range(32)]
    out = jaxspec.generate(target, prompts, max_new_tokens=40, temperature=0.0, eos_token_id=())
    path = tmp_path_factory.mktemp("data") / "data.jsonl"
    with open(path, "w") as f:
        for p, o in zip(prompts, out.tokens):
            f.write(json.dumps({"prompt_ids": p, "output_ids": o}) + "\n")
    return path, prompts


def test_features_fn_matches_apply_fn(target):
    tokens = jnp.asarray([PROMPTS[0]])
    positions = jnp.arange(tokens.shape[1])[None]
    logits, _ = target.apply_fn(target.params, tokens, positions, target.init_cache(1, 16))
    logits2, hidden, _ = llama.features_fn(target.config)(target.params, tokens, positions, target.init_cache(1, 16))
    np.testing.assert_array_equal(np.asarray(logits), np.asarray(logits2))
    # the hidden states are the LM head's input: the head applied to them gives the logits
    head = np.asarray(target.params["lm_head"]["kernel"])
    np.testing.assert_allclose(np.asarray(hidden) @ head, np.asarray(logits), rtol=1e-4, atol=1e-4)


SCALED = {
    "granite": dict(embedding_multiplier=3.0, residual_multiplier=0.5, attention_multiplier=0.1, logits_scaling=2.5),
    "gemma2": dict(embed_scale=True, final_softcap=2.0),
}


@pytest.mark.parametrize("kind", sorted(SCALED))
def test_a_head_scales_its_input_and_logits_as_its_target_does(kind):
    """A head whose fc passes the token embedding through, with the target's one layer and final norm, computes the
    target's own forward pass: on a Granite target (embedding, residual, attention and logit multipliers) and a
    Gemma 2 style one (sqrt(hidden) embedding scale, final soft-capping) its logits are the target's over the
    same tokens. Negative control: the same head with the target's input and logit scalings set to 1 is not."""
    cfg = tiny_config(num_layers=1, **SCALED[kind])
    params = llama.init_params(cfg, seed=3)
    tokens = jnp.asarray([PROMPTS[2]])
    positions = jnp.arange(tokens.shape[1])[None]
    want, _ = llama.model_fns(cfg)[0](params, tokens, positions, llama.model_fns(cfg)[1](1, 16))
    width = cfg.hidden_size
    own = {
        "fc": {"kernel": jnp.concatenate([jnp.eye(width), jnp.zeros((width, width))])},
        "final_norm": params["final_norm"],
        "layers": params["layers"],
    }
    feats = jnp.ones((1, tokens.shape[1], width))

    def head_logits(head_cfg):
        apply_fn, init_cache = eagle_model.head_fns(head_cfg)
        both = {**own, **eagle_model.shared_params(head_cfg, params)}
        return apply_fn(both, tokens, feats, positions, init_cache(1, 16))[0]

    head_cfg = eagle_model.head_config(cfg)
    np.testing.assert_allclose(np.asarray(head_logits(head_cfg)), np.asarray(want), rtol=1e-5, atol=1e-5)
    unscaled = dataclasses.replace(
        head_cfg, embedding_multiplier=1.0, logits_scaling=1.0, embed_scale=False, final_softcap=None
    )
    assert np.abs(np.asarray(head_logits(unscaled)) - np.asarray(want)).max() > 0.1


@pytest.mark.parametrize("gamma", [1, 4])
def test_greedy_with_a_head_equals_plain(target, head, gamma):
    plain = jaxspec.generate(target, PROMPTS, max_new_tokens=30, temperature=0.0, eos_token_id=())
    kwargs = dict(max_new_tokens=30, temperature=0.0, eos_token_id=())
    spec = jaxspec.generate(target, PROMPTS, draft=head, gamma=gamma, **kwargs)
    assert spec.tokens == plain.tokens
    assert spec.stats.mode == "speculative" and spec.stats.drafted > 0


def test_a_head_drafts_two_tokens_unless_told(target, head):
    assert head.default_gamma == 2  # its acceptance falls along a draft (docs/history/humaneval.md)
    assert head.default_gamma in jaxspec.policy.AutoGamma().gammas  # gamma="auto" can choose what None runs
    kwargs = dict(max_new_tokens=30, temperature=0.0, eos_token_id=())  # the greedy test's: its γ = 4 loop is reused
    assert jaxspec.generate(target, PROMPTS, draft=head, **kwargs).stats.gamma == 2
    assert jaxspec.generate(target, PROMPTS, draft=head, gamma=4, **kwargs).stats.gamma == 4


def test_engine_with_a_head_equals_plain(target, head):
    """The batch job's ``--gamma auto`` with a head, made to speculate, equals plain decoding (the engine at a fixed
    γ with a head: test_eagle3.py's engine test, through the same EagleDrafter)."""
    prompts = PROMPTS * 3
    plain = jaxspec.generate(target, prompts, max_new_tokens=24, temperature=0.0, eos_token_id=())
    policy = jaxspec.policy.AutoGamma(gammas=(2,), margin=0.0)
    policy.set_alpha(target, head, True, 0.95)
    auto = jaxspec.Engine(
        target, draft=head, gamma="auto", policy=policy, slots=4, max_new_tokens=24, temperature=0.0, eos_token_id=()
    )
    run = auto.run(prompts)
    assert [r.tokens for r in sorted(run, key=lambda r: r.index)] == plain.tokens
    assert run.stats.gamma == run.stats.policy["gamma"] == 2 and run.stats.drafted > 0


def test_observe_writes_features_at_their_positions(head):
    state = head.init_state(2, 8)
    feats = jnp.arange(2 * 3 * head.config.hidden_size, dtype=jnp.float32).reshape(2, 3, -1)
    out = head.observe(state, feats, jnp.asarray([[0, 1, 2], [6, 7, 8]]))  # position 8 is past the end: dropped
    got = np.asarray(out.feats)
    np.testing.assert_array_equal(got[0, :3], np.asarray(feats[0]))
    np.testing.assert_array_equal(got[1, 6:], np.asarray(feats[1, :2]))
    assert not got[0, 3:].any() and not got[1, :6].any()


def test_save_and_load_round_trip(tmp_path, target, head):
    path = eagle.save(head, tmp_path / "head")
    assert eagle.is_head(path) and not eagle.is_head(tmp_path)
    loaded = eagle.load(path, target)
    assert loaded.config == head.config and loaded == head  # equal statics: the same compiled programs
    for key in eagle_model.OWN:  # stored as float16
        for a, b in zip(jaxspec_leaves(loaded.params[key]), jaxspec_leaves(head.params[key])):
            np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-4)
    a = jaxspec.generate(target, PROMPTS, draft=head, max_new_tokens=12, temperature=0.0)
    b = jaxspec.generate(target, PROMPTS, draft=loaded, max_new_tokens=12, temperature=0.0)
    assert a.tokens == b.tokens


def test_temperature_scale_is_checked_saved_and_loaded(tmp_path, target, head):
    for bad in (0, -0.5, float("inf"), float("nan"), "0.8", True, None):
        with pytest.raises(ValueError, match="temperature_scale must be a finite number > 0"):
            dataclasses.replace(head, temperature_scale=bad)
    sharp = dataclasses.replace(head, temperature_scale=0.7)
    assert sharp != head  # another compiled program
    assert eagle.load(eagle.save(sharp, tmp_path / "sharp"), target) == sharp
    assert eagle.load(tmp_path / "sharp", target, temperature_scale=1.3).temperature_scale == 1.3
    path = eagle.save(head, tmp_path / "old")  # a head saved before the scale existed drafts at 1
    meta = json.loads((path / "jaxspec.json").read_text())
    del meta["temperature_scale"]
    (path / "jaxspec.json").write_text(json.dumps(meta))
    assert eagle.load(path, target).temperature_scale == 1.0
    with pytest.raises(ValueError, match="temperature_scale"):
        eagle.load(path, target, temperature_scale=0)


def test_tree_temperature_scale_is_checked_saved_and_loaded(tmp_path, target, head):
    for bad in (0, -0.5, float("inf"), float("nan"), "0.8", True):
        with pytest.raises(ValueError, match="tree_temperature_scale must be a finite number > 0"):
            dataclasses.replace(head, tree_temperature_scale=bad)
    sharp = dataclasses.replace(head, temperature_scale=0.9, tree_temperature_scale=0.6)
    assert sharp != dataclasses.replace(head, temperature_scale=0.9)  # another compiled program
    path = eagle.save(sharp, tmp_path / "sharp")
    assert json.loads((path / "jaxspec.json").read_text())["tree_temperature_scale"] == 0.6
    assert eagle.load(path, target) == sharp
    assert eagle.load(path, target, tree_temperature_scale=0.4).tree_scale == 0.4
    plain = eagle.load(eagle.save(head, tmp_path / "plain"), target)  # saved without one: trees use the chains'
    assert plain.tree_temperature_scale is None and plain.tree_scale == plain.temperature_scale
    assert "tree_temperature_scale" not in json.loads((tmp_path / "plain" / "jaxspec.json").read_text())
    with pytest.raises(ValueError, match="tree_temperature_scale"):
        eagle.load(path, target, tree_temperature_scale=-1)


def test_a_head_drafts_at_the_calls_temperature_times_its_scale(target, head):
    """q of a head at scale s and temperature T equals q of the same head at scale 1 and temperature s·T (same
    drafts from the same keys); greedy drafting is unchanged."""
    prompt = jnp.asarray([PROMPTS[0], PROMPTS[0][::-1]])
    n = prompt.shape[1]
    pos = jnp.broadcast_to(jnp.arange(n), prompt.shape)
    _, feats, _ = llama.features_fn(target.config)(target.params, prompt, pos, target.init_cache(2, 32))
    state = head.prefill(head.params, prompt, pos, head.observe(head.init_state(2, 32), feats, pos))
    tokens = jnp.zeros((2, 32), jnp.int32).at[:, :n].set(prompt)
    length = jnp.full((2,), n, jnp.int32)
    keys = jax.random.split(jax.random.key(0), 6).reshape(2, 3)
    sharp = dataclasses.replace(head, temperature_scale=0.5)

    jitted = {}  # one compile per drafter, not op by op

    def q(drafter, temperature):
        draft = jitted.setdefault(id(drafter), jax.jit(drafter.draft, static_argnums=6))
        out = draft(drafter.params, state, tokens, length, SamplingParams.create(temperature), keys, 96)
        return np.asarray(out.q), np.asarray(out.tokens)

    (q_sharp, d_sharp), (q_half, d_half), (q_one, _) = q(sharp, 1.0), q(head, 0.5), q(head, 1.0)
    np.testing.assert_allclose(q_sharp, q_half, rtol=1e-5, atol=1e-7)
    assert (d_sharp == d_half).all()
    assert np.abs(q_sharp - q_one).max() > 1e-3  # the scale changes q
    np.testing.assert_array_equal(q(sharp, 0.0)[0], q(head, 0.0)[0])  # greedy: one-hot either way


def jaxspec_leaves(tree):
    return [np.asarray(x, np.float32) for x in jax.tree.leaves(tree)]


def test_load_errors(tmp_path, target, head):
    with pytest.raises(ValueError, match="not an EAGLE head"):
        eagle.load(tmp_path, target)
    path = eagle.save(head, tmp_path / "head")
    wider = llama.init(tiny_config(hidden_size=128), seed=0)
    with pytest.raises(ValueError, match="hidden_size 64.*made for another target"):
        eagle.load(path, wider)
    with pytest.raises(ValueError, match=r"is an EAGLE head, not a model.*jaxspec\.eagle\.load\(path, target\)"):
        jaxspec.load(path)  # a model loader given a head says which loader takes it


def test_a_head_for_another_target_is_refused_before_compiling(head):
    other = llama.init(tiny_config(num_layers=3), seed=0)
    with count_compiles() as c, pytest.raises(ValueError, match="draft: the EAGLE head 'head' was made for another"):
        jaxspec.generate(other, PROMPTS, draft=head, max_new_tokens=4)
    assert c["compiles"] == 0


def test_a_window_pass_may_compute_its_last_logits_alone(head):
    """``last_only``: the last position's logits alone, as the whole pass gives them (helpers)."""
    apply_fn, init_cache = eagle_model.head_fns(head.config)
    check_window_logits_at_last_only(apply_fn, init_cache, head.params, head.config.hidden_size, head.config.vocab_size)


def test_head_config_needs_a_llama_target_with_its_full_vocabulary(target):
    with pytest.raises(ValueError, match="Llama-family"):
        eagle_model.head_config(object())
    reduced = llama.LlamaConfig(**{**tiny_config().__dict__, "vocab_ids": (1, 2, 3)})
    with pytest.raises(ValueError, match="full vocabulary"):
        eagle_model.head_config(reduced)


def test_new_draft_spec_for_eagle():
    assert parse_spec("eagle=1,vocab=500") == {"eagle_layers": 1, "vocab": 500}
    with pytest.raises(ValueError, match="eagle=K"):
        parse_spec("eagle=1,hidden=64")


def test_batches_are_pure_and_keep_true_positions():
    records = [([5, 6, 7], [8, 9, 10, 11, 12, 13]), ([3, 4], [14])]
    offsets = distill_eagle._offsets(records)
    feats = np.arange(offsets[-1] * 2, dtype=np.float16).reshape(-1, 2)
    a = distill_eagle.batch_at(records, feats, offsets, 3, seed=0, batch_size=4, window=4)
    b = distill_eagle.batch_at(records, feats, offsets, 3, seed=0, batch_size=4, window=4)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    tokens, f, positions, mask = a
    for row in range(4):
        n = int(mask[row].sum())
        seq = tokens[row, :n].tolist()
        i = 0 if seq[0] >= 5 else 1
        full = records[i][0] + records[i][1]
        start = int(positions[row, 0])
        assert full[start : start + n] == seq  # the window's tokens at their true positions
        np.testing.assert_array_equal(f[row, :n], feats[offsets[i] + start : offsets[i] + start + n])


@pytest.mark.slow
def test_training_raises_acceptance_and_resumes(tmp_path, target, data):
    """Trained on the target's own greedy outputs, the head's greedy α on those prompts rises well above the
    untrained head's (the negative control: same prompts, same γ, seed-0 random weights)."""
    path, prompts = data
    untrained = eagle.EagleDrafter.for_target(target, eagle_model.init_own(eagle_model.head_config(target.config), 0))
    kwargs = dict(out_dir=tmp_path / "run", batch_size=8, window=32, learning_rate=1e-2, progress=False)
    half, _ = distill_eagle.train_head(target, path, steps=60, checkpoint_every=30, **kwargs)
    assert (tmp_path / "run" / "features.npy").is_file()
    trained, log = distill_eagle.train_head(target, path, steps=120, checkpoint_every=30, **kwargs)
    assert log[0]["step"] > 60  # resumed from the step-60 checkpoint
    assert all(np.isfinite(r["loss"]) for r in log)  # soft cross-entropy: its floor is the target's entropy

    def alpha(head):
        kwargs = dict(max_new_tokens=40, temperature=0.0, eos_token_id=())
        return jaxspec.generate(target, prompts, draft=head, gamma=3, **kwargs).stats.acceptance_rate

    before, after = alpha(untrained), alpha(trained)
    print(f"greedy alpha untrained {before:.3f}, after 60 steps {alpha(half):.3f}, after 120 {after:.3f}")
    assert after > max(4 * before, 0.06), (before, after)
    held = distill_eagle.agreement(target, untrained, path), distill_eagle.agreement(target, trained, path)
    assert held[1]["step1"] > max(2 * held[0]["step1"], 0.1), held  # teacher-forced agreement follows α


def test_first_draft_is_the_heads_prediction_from_real_features(target, head):
    """Whatever was accepted before, a round's first draft comes from the head's cache over real features only:
    the head applied teacher-forced to the whole sequence (pairs ``(f_j, token j+1)``) gives the same q."""
    seq = jnp.asarray([[7, 3, 9, 12, 40, 41, 5, 6, 88, 2, 17, 23, 54, 33, 60, 61, 62, 9, 9, 1, 4, 8]])
    n, plen, size, gamma = seq.shape[1], 5, 32, 3
    positions = jnp.arange(n)[None]
    _, feats, _ = llama.features_fn(target.config)(target.params, seq, positions, target.init_cache(1, size))
    apply_fn, init_cache = eagle_model.head_fns(head.config)
    following = jnp.concatenate([seq[:, 1:], seq[:, -1:]], axis=1)
    expected, _, _ = apply_fn(head.params, following, feats, positions, init_cache(1, size))

    tokens = jnp.zeros((1, size), jnp.int32).at[:, :n].set(seq)
    state = head.observe(head.init_state(1, size), feats[:, :plen], positions[:, :plen])
    state = head.prefill(head.params, seq[:, :plen], positions[:, :plen], state)
    sampling = SamplingParams.create(1.0, batch=1)
    keys = jax.random.split(jax.random.key(0), gamma)[None]
    length = plen
    draft, observe = jax.jit(head.draft, static_argnums=6), jax.jit(head.observe)  # one compile, not op by op
    for accepted in (0, 3, 1, 2, 0, 3):  # rounds that accepted this many drafts, then one more token
        proposal = draft(head.params, state, tokens, jnp.asarray([length]), sampling, keys, target.vocab_size)
        want = jax.nn.softmax(expected[0, length - 2])
        np.testing.assert_allclose(np.asarray(proposal.q[0, 0]), np.asarray(want), atol=2e-6, err_msg=str(length))
        # the verify pass's features over [last, drafts] (here the sequence's own tokens, as if accepted)
        verify = jnp.arange(length - 1, length + gamma)[None]
        state = observe(proposal.state, feats[:, length - 1 : length + gamma], verify)
        length += accepted + 1


def test_a_heads_prefill_in_chunks_writes_the_pairs_of_one_pass(target, head):
    """The loop hands a head the prompt in chunks (each after ``observe`` of its features): its cache holds, at
    every pair ``(f_j, token j+1)`` of the prompt, the entry of one teacher-forced pass over the whole prompt, the
    pairs across a chunk boundary included."""
    seq = jnp.asarray([[7, 3, 9, 12, 40, 41, 5, 6, 88, 2, 17, 23, 54, 33, 60, 61, 62, 9, 9, 1, 4, 8]])
    n, size, chunk = seq.shape[1], 32, 8
    positions = jnp.arange(n)[None]
    _, feats, _ = llama.features_fn(target.config)(target.params, seq, positions, target.init_cache(1, size))
    apply_fn, init_cache = eagle_model.head_fns(head.config)
    following = jnp.concatenate([seq[:, 1:], seq[:, -1:]], axis=1)
    _, _, expected = apply_fn(head.params, following, feats, positions, init_cache(1, size))

    def within_chunk(params, prompt, pos, state):  # negative control: pairs (f_j, token j+1) inside the chunk only
        pairs = jnp.concatenate([prompt[:, 1:], prompt[:, -1:]], axis=1)
        _, _, cache = apply_fn(params, pairs, state.feats[:, pos[0]], pos, state.cache)
        return dataclasses.replace(state, cache=cache)

    def errors(prefill):
        state, observe, prefill = head.init_state(1, size), jax.jit(head.observe), jax.jit(prefill)
        for start in range(0, n, chunk):
            part = slice(start, min(n, start + chunk))
            state = observe(state, feats[:, part], positions[:, part])
            state = prefill(head.params, seq[:, part], positions[:, part], state)
        return [
            float(np.abs(np.asarray(got)[:, :, : n - 1] - np.asarray(want)[:, :, : n - 1]).max())
            for got, want in zip(jax.tree.leaves(state.cache), jax.tree.leaves(expected))
        ]

    assert max(errors(head.prefill)) < 1e-5
    assert max(errors(within_chunk)) > 1e-3  # the pair across each chunk boundary is wrong


@pytest.mark.parametrize("catch_up", [True, False])
def test_a_head_catches_up_on_rounds_longer_than_its_own(target, head, catch_up):
    """Under ``LookupFirst`` a round may verify up to Γ = 4 copied drafts while the head drafts γ = 2: its next
    window must still cover every newly verified pair. With ``catching_up(Γ + 1)`` the first draft equals the
    head's teacher-forced prediction from real features; without it (the negative control) it does not."""
    seq = jnp.asarray([[7, 3, 9, 12, 40, 41, 5, 6, 88, 2, 17, 23, 54, 33, 60, 61, 62, 9, 9, 1, 4, 8, 30, 31]])
    n, plen, size, gamma, longest = seq.shape[1], 5, 32, 2, 4
    positions = jnp.arange(n)[None]
    _, feats, _ = llama.features_fn(target.config)(target.params, seq, positions, target.init_cache(1, size))
    apply_fn, init_cache = eagle_model.head_fns(head.config)
    following = jnp.concatenate([seq[:, 1:], seq[:, -1:]], axis=1)
    expected, _, _ = apply_fn(head.params, following, feats, positions, init_cache(1, size))
    drafter = head.catching_up(longest + 1) if catch_up else head
    tokens = jnp.zeros((1, size), jnp.int32).at[:, :n].set(seq)
    state = drafter.observe(drafter.init_state(1, size), feats[:, :plen], positions[:, :plen])
    state = drafter.prefill(head.params, seq[:, :plen], positions[:, :plen], state)
    sampling = SamplingParams.create(1.0, batch=1)
    keys = jax.random.split(jax.random.key(0), gamma)[None]
    length, errors = plen, []
    draft, observe = jax.jit(drafter.draft, static_argnums=6), jax.jit(drafter.observe)
    for accepted, width in ((4, 4), (1, 2), (4, 4), (3, 4), (2, 2)):  # copied rounds verify 4, the head's 2
        proposal = draft(head.params, state, tokens, jnp.asarray([length]), sampling, keys, target.vocab_size)
        want = jax.nn.softmax(expected[0, length - 2])
        errors.append(float(jnp.max(jnp.abs(proposal.q[0, 0] - want))))
        verify = jnp.arange(length - 1, length + width)[None]
        state = observe(proposal.state, feats[:, length - 1 : length + width], verify)
        length += accepted + 1
    if catch_up:
        assert max(errors) < 2e-6, errors
    else:
        assert max(errors) > 1e-4, errors


def test_auto_gamma_with_a_head_times_the_head_and_stays_exact(target, head):
    policy = jaxspec.policy.AutoGamma()
    plain = jaxspec.generate(target, PROMPTS, max_new_tokens=16, temperature=0.0, eos_token_id=())
    auto = jaxspec.generate(
        target, PROMPTS, draft=head, gamma="auto", policy=policy, max_new_tokens=16, temperature=0.0, eos_token_id=()
    )
    assert auto.tokens == plain.tokens
    (costs,) = policy._costs.values()  # the head is timed as a model, not as a drafter without one (c = 0)
    assert costs.c > 0


def test_cli_trains_an_eagle_head_and_saves_it(tmp_path, target, data, capsys):
    from jaxspec.cli.distill import main

    jaxspec.save(target, tmp_path / "target")
    flags = ["--target", str(tmp_path / "target"), "--new-draft", "eagle=1,vocab=30", "--data", str(data[0])]
    flags += ["--out", str(tmp_path / "run"), "--steps", "3", "--batch-size", "2", "--window", "16", "--no-progress"]
    main([*flags, "--save-draft", str(tmp_path / "head")])
    assert "final loss" in capsys.readouterr().out
    loaded = eagle.load(tmp_path / "head", jaxspec.load(tmp_path / "target"))
    assert loaded.name == "head" and len(loaded.config.vocab_ids) == 30 and loaded.config.num_layers == 1
    with pytest.raises(SystemExit):  # eagle=K trains offline only
        main(["--target", str(tmp_path / "target"), "--new-draft", "eagle=1", "--prompts", "p.jsonl", "--out", "o"])


def test_training_goes_on_from_a_given_head(tmp_path, target, head, data):
    """``init``: the head's weights, layers and vocabulary are where training starts (a step at a negligible
    learning rate leaves them as they were; a new head starts elsewhere); wrong combinations are refused."""
    kwargs = dict(steps=1, batch_size=2, window=16, learning_rate=1e-12, progress=False)
    tuned, _ = distill_eagle.train_head(target, data[0], out_dir=tmp_path / "a", init=head, **kwargs)
    fresh, _ = distill_eagle.train_head(
        target, data[0], out_dir=tmp_path / "b", vocab=len(head.config.vocab_ids), **kwargs
    )
    assert tuned.config == head.config and tuned.name == head.name

    def gap(a, b):
        own = [families.stack_layers({k: d.params[k] for k in eagle_model.OWN}) for d in (a, b)]
        return max(float(jnp.max(jnp.abs(x - y))) for x, y in zip(*map(jax.tree.leaves, own)))

    assert gap(tuned, head) < 1e-6 < 1e-3 < gap(fresh, head)
    with pytest.raises(ValueError, match="init"):
        distill_eagle.train_head(target, data[0], out_dir=tmp_path / "c", init=head, vocab=30, **kwargs)
    other = llama.init(tiny_config(hidden_size=48), seed=0)
    with pytest.raises(ValueError, match="init"):
        distill_eagle.train_head(other, data[0], out_dir=tmp_path / "d", init=head, **kwargs)


def test_cli_goes_on_training_a_saved_head(tmp_path, target, head, data, capsys):
    from jaxspec.cli.distill import main

    jaxspec.save(target, tmp_path / "target")
    eagle.save(head, tmp_path / "head")
    base = ["--target", str(tmp_path / "target"), "--draft", str(tmp_path / "head"), "--data", str(data[0])]
    base += ["--steps", "2", "--batch-size", "2", "--window", "16", "--no-progress"]
    flags = [*base, "--out", str(tmp_path / "run")]
    held = ["--heldout-data", str(data[0])]
    main([*flags, *held, "--temperature-scale", "auto", "--save-draft", str(tmp_path / "tuned")])
    out = capsys.readouterr().out
    assert "final loss" in out
    assert "held-out agreement (teacher-forced, draft step 1 / 2): " in out and " -> " in out  # before -> after
    assert "held-out acceptance at temperature 1 (teacher-forced, draft step 1 / 2): " in out
    tuned = eagle.load(tmp_path / "tuned", jaxspec.load(tmp_path / "target"))
    assert tuned.config == head.config
    chosen = [line for line in out.splitlines() if line.endswith("<- chosen")]  # one row of the printed table
    assert len(chosen) == 1 and float(chosen[0].split(":")[0]) == tuned.temperature_scale
    assert f"temperature scale: {tuned.temperature_scale:g}" in out
    t2 = ["--temperature-scale", "0.8", "--tree-temperature-scale", "0.6", "--save-draft", str(tmp_path / "t2")]
    main([*base, "--out", str(tmp_path / "run3"), *t2])
    saved = eagle.load(tmp_path / "t2", jaxspec.load(tmp_path / "target"))
    assert saved.temperature_scale == 0.8 and saved.tree_temperature_scale == 0.6
    for bad in (
        ["--temperature-scale", "auto"],
        ["--temperature-scale", "0"],
        ["--temperature-scale", "x"],
        ["--tree-temperature-scale", "-1"],
        [*held, "--tree-temperature-scale", "auto"],  # the tree tuner measures EAGLE-3 heads
    ):
        with pytest.raises(SystemExit):  # auto needs held-out records; a scale is a finite number > 0
            main([*base, "--out", str(tmp_path / "run4"), *bad])
    with pytest.raises(SystemExit):  # a draft model samples at the call's temperature
        main(
            ["--target", str(tmp_path / "target"), "--draft", str(tmp_path / "target"), "--data", str(data[0])]
            + ["--out", str(tmp_path / "run5"), "--temperature-scale", "0.8"]
        )
    with pytest.raises(SystemExit):
        main(
            ["--target", str(tmp_path / "target"), "--draft", str(tmp_path / "target"), "--data", str(data[0])]
            + ["--out", str(tmp_path / "run6"), "--tree-temperature-scale", "0.8"]
        )
    with pytest.raises(SystemExit):  # agreement is a head's measure: refused for a draft model
        main(
            ["--target", str(tmp_path / "target"), "--draft", str(tmp_path / "target"), "--data", str(data[0])]
            + ["--out", str(tmp_path / "run2"), "--heldout-data", str(data[0])]
        )
    with pytest.raises(SystemExit):  # a head trains offline only
        main(
            [
                "--target",
                str(tmp_path / "target"),
                "--draft",
                str(tmp_path / "head"),
                "--prompts",
                "p.jsonl",
                "--out",
                "o",
            ]
        )


def _padded(tokens, length=64):
    """``tokens`` as a [1, length] array, zeros after them (one compiled shape for every record: the models are
    causal, so what follows position n - 1 does not change the outputs up to it), and n = len(tokens)."""
    assert len(tokens) <= length
    return jnp.asarray([list(tokens) + [0] * (length - len(tokens))]), len(tokens)


def test_agreement_counts_the_heads_top1_against_the_targets_on_the_outputs(target, head, data):
    """``distill_eagle.agreement`` against a per-position count written from its definition (one record at a time,
    no padding): step 1 drafts token i+2 from (f_i, token i+1), step 2 token i+3 from (f^_{i+1}, token i+2);
    a hit is the target's own top-1 there, counted only for drafted tokens inside the output."""
    records = distill_eagle.read_data(data[0])[:6]
    features = llama.features_fn(target.config)
    apply_fn, init_cache = eagle_model.head_fns(head.config)
    hits, counted = [0, 0], [0, 0]
    for prompt, output in records:
        seq, n = _padded(prompt + output)
        pos = jnp.arange(seq.shape[1])[None]
        logits, feats, _ = features(target.params, seq, pos, target.init_cache(1, seq.shape[1]))
        d1, f1, _ = apply_fn(head.params, seq[:, 1:], feats[:, :-1], pos[:, :-1], init_cache(1, seq.shape[1]))
        d2, _, _ = apply_fn(head.params, seq[:, 2:], f1[:, :-1], pos[:, 1:-1], init_cache(1, seq.shape[1]))
        top = np.asarray(jnp.argmax(logits[0], -1))
        for step, d in enumerate((d1, d2)):
            drafts = np.asarray(jnp.argmax(d[0], -1))
            for i in range(d.shape[1]):
                drafted = i + 2 + step
                if len(prompt) <= drafted < n:
                    counted[step] += 1
                    hits[step] += int(drafts[i] == top[drafted - 1])
    got = distill_eagle.agreement(target, head, records, batch_size=4)  # padded to 64, two rows empty
    assert got["tokens"] == counted[0] == sum(len(o) for _, o in records)
    assert (got["step1"], got["step2"]) == (hits[0] / counted[0], hits[1] / counted[1])
    assert 0 < got["accept1"] < 1 and 0 < got["accept2"] < 1
    assert 0 < hits[0] < counted[0]  # neither all nor none: the count can tell heads apart
    assert distill_eagle.agreement(target, head, records, batch_size=1) == pytest.approx(got, rel=1e-5)
    with pytest.raises(ValueError, match="head"):
        distill_eagle.agreement(target, target, records)
    with pytest.raises(ValueError, match="batch_size"):
        distill_eagle.agreement(target, head, records, batch_size=0)


def test_acceptance_and_the_tuned_scale_match_a_per_position_reference(target, head, data):
    """``tune_temperature_scale``'s table against sum_v min(p_v, q_v) computed position by position (p the
    target's softmax at temperature 1, q the head's softmax over its vocabulary at logits / scale), and the best
    scale as the most accepted drafts of a two-draft round; ``agreement``'s acceptance is the head's own scale's."""
    records = distill_eagle.read_data(data[0])[:5]
    features = llama.features_fn(target.config)
    apply_fn, init_cache = eagle_model.head_fns(head.config)
    ids = np.asarray(head.config.vocab_ids)
    scales = (0.5, 1.0, 2.0)
    sums, counted = np.zeros((2, 3)), 0
    for prompt, output in records:
        seq, n = _padded(prompt + output)
        pos = jnp.arange(seq.shape[1])[None]
        logits, feats, _ = features(target.params, seq, pos, target.init_cache(1, seq.shape[1]))
        p = np.asarray(jax.nn.softmax(logits[0].astype(jnp.float32), -1))
        d1, f1, _ = apply_fn(head.params, seq[:, 1:], feats[:, :-1], pos[:, :-1], init_cache(1, seq.shape[1]))
        d2, _, _ = apply_fn(head.params, seq[:, 2:], f1[:, :-1], pos[:, 1:-1], init_cache(1, seq.shape[1]))
        for step, d in enumerate((d1, d2)):
            rows = np.asarray(d[0], np.float64)[:, ids]  # full-vocabulary logits, the draft ids' columns
            for i in range(rows.shape[0]):
                drafted = i + 2 + step
                if len(prompt) <= drafted < n:
                    counted += step == 0
                    for j, s in enumerate(scales):
                        q = np.exp((rows[i] - rows[i].max()) / s)
                        sums[step, j] += np.minimum(p[drafted - 1, ids], q / q.sum()).sum()
    ref = sums / counted
    best, table = distill_eagle.tune_temperature_scale(target, head, records, scales=scales)
    np.testing.assert_allclose([table[s] for s in scales], ref.T, rtol=1e-4)
    assert best == scales[int(np.argmax(ref[0] * (1 + ref[1])))]
    assert len({round(a, 4) for a, _ in table.values()}) == 3  # the scale matters on these records
    got = distill_eagle.agreement(target, dataclasses.replace(head, temperature_scale=2.0), records)
    assert (got["accept1"], got["accept2"]) == pytest.approx(tuple(ref[:, 2]), rel=1e-4)
    for bad in ((), (0.0,), (1.0, float("inf")), "ab", None):
        with pytest.raises(ValueError, match="scales"):
            distill_eagle.tune_temperature_scale(target, head, records, scales=bad)
