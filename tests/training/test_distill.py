"""Draft distillation: α goes up, a killed run resumes to the same parameters, each loss is what it says and
goes down, bad input fails before compiling, JSONL prompts parse, the CLI runs end to end."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import SMALL_DRAFT, VOCAB, count_compiles, tiny_config

import jaxspec
from jaxspec.cli import distill as distill_cli
from jaxspec.models import llama
from jaxspec.training import distill as D
from jaxspec.training.common import learning_rate_at


def _prompts(n, length=8, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, VOCAB, size=length).tolist() for _ in range(n)]


def _bigram_apply(params, tokens, positions, cache):
    return params["table"][tokens], cache


def _bigram_cache(batch, length):
    return jnp.zeros((batch, length))


def _bigram(seed, scale=3.0, name="bigram"):
    """A random bigram model with peaked rows: cheap to compile, and learnable by a small Llama."""
    table = jnp.asarray(np.random.default_rng(seed).standard_normal((VOCAB, VOCAB)) * scale, jnp.float32)
    return jaxspec.CausalLM(
        apply_fn=_bigram_apply, params={"table": table}, init_cache=_bigram_cache, vocab_size=VOCAB, name=name
    )


def _same(a, b):
    return all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def test_distillation_improves_alpha(tmp_path, small_draft):
    """A learnable synthetic target (a random bigram table, peaked rows) and the small Llama draft: 30 steps of
    forward KL on the target's samples lift greedy α from ~0 to ~0.4 and α at temperature 1 about threefold."""
    target = _bigram(0)
    result = D.distill(
        target,
        small_draft,
        _prompts(40),
        out_dir=tmp_path,
        steps=30,
        batch_size=8,
        max_new_tokens=24,
        learning_rate=1e-2,
        loss="fkl",
        progress=False,
    )
    print(f"alpha before {result.alpha_before}, after {result.alpha_after}, loss {result.loss:.3f}")
    # observed: greedy 0.003 -> 0.401, t1 0.057 -> 0.177
    assert result.alpha_after["greedy"] > result.alpha_before["greedy"] + 0.25
    assert result.alpha_after["t1"] > 2 * result.alpha_before["t1"]
    assert result.steps == 30 and result.draft.config == small_draft.config
    assert result.draft.apply_fn is small_draft.apply_fn and not _same(result.draft.params, small_draft.params)
    log = [json.loads(line) for line in (tmp_path / D.LOG_FILE).read_text().splitlines()]
    assert [r["step"] for r in log] == [10, 20, 30] and log[-1]["loss"] < 0.6 * log[0]["loss"]
    assert log[-1]["tok_s"] > 0 and log == result.log


def test_resume_reproduces_uninterrupted_run(tmp_path, small_draft, monkeypatch):
    """Half of each batch on-policy, so the data depends on the restored draft too. (Shapes as in the test
    above: in one process the compiled programs are shared.)"""
    target = _bigram(0)
    path = tmp_path / "prompts.jsonl"  # also exercises JSONL prompts given as token ids
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in _prompts(40)))
    kw = dict(
        steps=4,
        batch_size=8,
        max_new_tokens=24,
        checkpoint_every=2,
        log_every=1,
        on_policy=0.5,
        learning_rate=1e-2,
        seed=3,
        progress=False,
    )
    straight = D.distill(target, small_draft, path, out_dir=tmp_path / "a", **kw)

    original = D._batch_at
    seen, die_at = [], [3]  # steps 0..2 trained, only the step-2 checkpoint saved: step 2's work is lost

    def batch_then_die(*args, **kwargs):
        seen.append(args[3])
        if args[3] in die_at:
            raise KeyboardInterrupt
        return original(*args, **kwargs)

    monkeypatch.setattr(D, "_batch_at", batch_then_die)
    with pytest.raises(KeyboardInterrupt):
        D.distill(target, small_draft, path, out_dir=tmp_path / "b", **kw)
    assert seen == [0, 1, 2, 3]
    seen.clear()
    die_at.clear()
    resumed = D.distill(target, small_draft, path, out_dir=tmp_path / "b", **kw)  # the same call again
    assert seen == [2, 3]  # resumed at the checkpoint, not from scratch
    assert resumed.steps == 4 and [r["step"] for r in resumed.log] == [3, 4]
    assert _same(straight.draft.params, resumed.draft.params)
    assert not _same(straight.draft.params, small_draft.params)
    assert resumed.loss == straight.loss and resumed.alpha_after == straight.alpha_after
    # a finished run has nothing left to do: same parameters, no data generated
    again = D.distill(target, small_draft, path, out_dir=tmp_path / "b", **kw)
    assert seen == [2, 3] and _same(again.draft.params, straight.draft.params) and again.loss == straight.loss
    with pytest.raises(ValueError, match="holds a checkpoint .step 4. that does not match this draft"):
        D.distill(target, _bigram(1, name="other draft"), path, out_dir=tmp_path / "b", **kw)


def test_batches_are_pure_and_masked_on_generated_tokens():
    target, draft = _bigram(0), _bigram(1, name="draft")
    prompts = _prompts(6, length=5) + _prompts(2, length=11, seed=1)
    kw = dict(seed=0, batch_size=4, on_policy=0.5, max_new_tokens=8, temperature=1.0)
    tokens, mask = D._batch_at(target, draft, prompts, 7, **kw)
    again, mask2 = D._batch_at(target, draft, prompts, 7, **kw)
    other, _ = D._batch_at(target, draft, prompts, 8, **kw)
    assert np.array_equal(tokens, again) and np.array_equal(mask, mask2) and not np.array_equal(tokens, other)
    assert tokens.shape[1] == 32 and tokens.dtype == np.int32  # 11 + 8 tokens -> a power-of-two bucket
    for row, m in zip(tokens, mask):
        start = int(np.argmax(m))  # the last prompt position predicts the first generated token
        assert m.sum() == 8 and m[start : start + 8].all()
        assert any(row[: start + 1].tolist() == p for p in prompts)
        assert (row[start + 9 :] == 0).all()


def test_losses_are_divergences_and_each_goes_down():
    rng = np.random.default_rng(0)
    a, b = (jnp.asarray(rng.standard_normal((3, VOCAB)) * 2, jnp.float32) for _ in range(2))
    p, q = jax.nn.softmax(a / 0.7), jax.nn.softmax(b / 0.7)
    np.testing.assert_allclose(D.divergence("fkl", a, b, 0.7), (p * np.log(p / q)).sum(-1), rtol=1e-4)
    np.testing.assert_allclose(D.divergence("rkl", a, b, 0.7), (q * np.log(q / p)).sum(-1), rtol=1e-4)
    np.testing.assert_allclose(D.divergence("tvd", a, b, 0.7), 0.5 * np.abs(p - q).sum(-1), rtol=1e-4)
    for kind in D.LOSSES:
        np.testing.assert_allclose(D.divergence(kind, a, a, 0.7), 0.0, atol=1e-6)

    target, draft = _bigram(0), _bigram(1, scale=1.0, name="draft")
    tokens, mask = D._batch_at(
        target, draft, _prompts(4), 0, seed=0, batch_size=4, on_policy=0.0, max_new_tokens=8, temperature=1.0
    )
    schedule = jnp.asarray([0.2, 0, 10], jnp.float32)  # learning rate, warmup, steps
    for kind in D.LOSSES:
        step = D.train_step_fn((target.apply_fn, target.init_cache), (draft.apply_fn, draft.init_cache), kind)
        params, opt_state = draft.params, D.optimizer(*schedule).init(draft.params)
        losses = []
        for _ in range(6):
            params, opt_state, loss = step(params, opt_state, target.params, tokens, mask, jnp.float32(1.0), schedule)
            losses.append(float(loss))
        print(kind, [round(x, 4) for x in losses])
        assert np.isfinite(losses).all() and np.all(np.diff(losses) < 0) and losses[-1] < 0.85 * losses[0]


def test_learning_rate_schedule_is_optax_warmup_cosine():
    import optax

    reference = optax.warmup_cosine_decay_schedule(0.0, 3e-3, 5, 40, 3e-4)
    for count in (0, 1, 4, 5, 6, 20, 39, 40, 50):
        np.testing.assert_allclose(learning_rate_at(count, 3e-3, 5, 40), reference(count), rtol=1e-5, atol=1e-9)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(loss="kl"), r"loss must be one of \['fkl', 'rkl', 'tvd'\]"),
        (dict(on_policy=1.5), "on_policy must be a number in"),
        (dict(on_policy=-0.1), "on_policy"),
        (dict(steps=0), "steps must be an int >= 1"),
        (dict(batch_size=0), "batch_size must be an int >= 1"),
        (dict(max_new_tokens=0), "max_new_tokens must be an int >= 1"),
        (dict(temperature=0.0), "temperature must be a finite number > 0 for distillation"),
        (dict(temperature=-1.0), "temperature"),
        (dict(prompts=[]), "prompts must be a non-empty list"),
        (dict(prompts=["some text"]), "prompts: .*string but .* has no tokenizer"),
        (dict(prompts=[[1, 2], []]), r"prompts\[1\] is empty"),
        (dict(prompts=[[1, VOCAB]]), r"prompts\[0\] has a token id outside the vocabulary"),
        (dict(prompts=[[1, 2]]), "at least 2 prompts when heldout=None"),
        (dict(heldout=[]), "heldout must be a non-empty list"),
        (dict(vocab=64), r"draft vocab_size \(64\) != target vocab_size \(96\)"),
    ],
)
def test_bad_input_fails_before_compiling(tmp_path, target, small_draft, kwargs, match):
    kwargs = dict(kwargs)
    prompts = kwargs.pop("prompts", _prompts(4))
    draft = small_draft.replace(vocab_size=kwargs.pop("vocab")) if "vocab" in kwargs else small_draft
    with count_compiles() as counts:
        with pytest.raises(ValueError, match=match):
            D.distill(target, draft, prompts, out_dir=tmp_path / "out", progress=False, **kwargs)
    assert counts["compiles"] == 0 and not (tmp_path / "out").exists()


def test_jsonl_prompts(tmp_path, target, small_draft):
    path = tmp_path / "p.jsonl"
    path.write_text(
        '{"prompt": "hello"}\n\n{"turns": ["first turn", "second"], "question_id": 3}\n{"prompt": [1, 2, 3]}\n'
    )
    assert D.read_prompts(path) == ["hello", "first turn", [1, 2, 3]]

    path.write_text('{"prompt": "a"}\n{"prompt": "b"}\n{"prompt": "c"\n')
    with pytest.raises(ValueError, match="line 3 is not valid JSON"):
        D.read_prompts(path)
    path.write_text('{"prompt": "a"}\n{"text": "b"}\n')
    with pytest.raises(ValueError, match='line 2 has neither "prompt" nor a non-empty "turns"'):
        D.read_prompts(path)
    path.write_text('{"turns": []}\n')
    with pytest.raises(ValueError, match="line 1"):
        D.read_prompts(path)
    path.write_text('{"prompt": 7}\n')
    with pytest.raises(ValueError, match="line 1: the prompt must be"):
        D.read_prompts(path)
    with count_compiles() as counts:
        with pytest.raises(FileNotFoundError, match="missing.jsonl does not exist"):
            D.distill(target, small_draft, tmp_path / "missing.jsonl", out_dir=tmp_path / "out")
        with pytest.raises(ValueError, match="line 1"):
            D.distill(target, small_draft, str(path), out_dir=tmp_path / "out")
    assert counts["compiles"] == 0


def test_cli_distills_and_saves_the_draft(tmp_path, small_draft, capsys):
    target = llama.init(tiny_config(**SMALL_DRAFT), seed=7, name="small-target")  # cheap to compile
    jaxspec.save(target, tmp_path / "target")
    jaxspec.save(small_draft, tmp_path / "draft")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"turns": [p]}) + "\n" for p in _prompts(40)))
    result = distill_cli.main(
        [
            "--target",
            str(tmp_path / "target"),
            "--draft",
            str(tmp_path / "draft"),
            "--prompts",
            str(prompts),
            "--out",
            str(tmp_path / "run"),
            "--steps",
            "4",
            "--batch-size",
            "8",
            "--max-new-tokens",
            "24",
            "--loss",
            "tvd",
            "--on-policy",
            "0.5",
            "--learning-rate",
            "1e-2",
            "--seed",
            "3",
            "--checkpoint-every",
            "2",
            "--no-progress",
            "--save-draft",
            str(tmp_path / "distilled"),
        ]
    )
    out = capsys.readouterr().out
    assert "alpha greedy:" in out and "alpha t1:" in out and "steps 4" in out
    saved = jaxspec.load(tmp_path / "distilled")
    assert saved.config == small_draft.config and _same(saved.params, result.draft.params)


def test_prompt_weight_marks_the_prompt_positions():
    target, draft = _bigram(0), _bigram(1, name="draft")
    kw = dict(seed=0, batch_size=3, on_policy=0.0, max_new_tokens=6, temperature=1.0)
    prompts = _prompts(3)
    tokens, plain_mask = D._batch_at(target, draft, prompts, 2, **kw)
    same, mask = D._batch_at(target, draft, prompts, 2, prompt_weight=0.25, **kw)
    assert np.array_equal(tokens, same)
    assert np.all(mask[plain_mask == 1] == 1)  # generated positions keep weight 1
    inside = mask == 0.25
    assert inside.any() and not np.any(plain_mask[inside])  # the prompt's own positions, new in the loss
    for m in mask:
        first_generated = int(np.argmax(m == 1))
        assert np.all(m[:first_generated] == 0.25)  # every position that predicts a prompt token
    with pytest.raises(ValueError, match="prompt_weight must be a finite number >= 0"):
        D.distill(target, draft, prompts, out_dir="unused", prompt_weight=-1)
