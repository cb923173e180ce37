"""Host API: bad input errors before compiling, non-finite logits, streaming, tokenizers, result and stats."""

import jax.numpy as jnp
import numpy as np
import pytest
from helpers import VOCAB, count_compiles, resized

import jaxspec


class CharTokenizer:
    """A minimal tokenizer: one id per character code (mod vocab), decode maps back."""

    def encode(self, text):
        return [ord(c) % VOCAB for c in text]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i + 32) for i in ids)


BAD_INPUTS = [
    (dict(gamma=0), "gamma"),
    (dict(gamma=-2), "gamma"),
    (dict(gamma=2.5), "gamma"),
    (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(max_new_tokens=[4, 0]), "max_new_tokens"),
    (dict(max_new_tokens=[4]), "max_new_tokens"),
    (dict(temperature=-0.1), "temperature"),
    (dict(temperature=float("nan")), "temperature"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(top_k=-1), "top_k"),
    (dict(seed=-1), "seed"),
    (dict(eos_token_id=VOCAB + 3), "eos_token_id"),
    (dict(max_length=6), "max_length"),  # prompt [1..8] does not fit
]


@pytest.mark.parametrize("kwargs,name", BAD_INPUTS)
def test_bad_arguments_raise_before_compiling(target, small_draft, kwargs, name):
    prompts = [[1, 2, 3], [1, 2, 3, 4, 5, 6, 7, 8]]
    with count_compiles() as counts, pytest.raises(ValueError, match=name):
        jaxspec.generate(target, prompts, draft=small_draft, **kwargs)
    assert counts["compiles"] == 0


@pytest.mark.parametrize(
    "prompts,match",
    [
        ([[1, 2], []], r"prompts\[1\] is empty"),
        ([[1, VOCAB]], r"prompts\[0\].*outside the vocabulary"),
        ([], "prompts"),
        (["hello"], r"prompts\[0\] is a string"),
        ([[1.5, 2]], r"prompts\[0\]"),
    ],
)
def test_bad_prompts(target, prompts, match):
    with count_compiles() as counts, pytest.raises(ValueError, match=match):
        jaxspec.generate(target, prompts)
    assert counts["compiles"] == 0


@pytest.mark.parametrize("vocab", [VOCAB - 16, VOCAB + 5])
def test_draft_with_another_vocab_size_equals_plain(target, perturbed_draft, vocab):
    """A draft whose table has fewer or more ids than the target's: greedy speculative output is the plain
    output, ids past a smaller draft's table among it (the target emits them; the draft is fed its last id)."""
    draft = resized(perturbed_draft, vocab)
    prompts = [[1, 2, 3], [80, 90, 95, 4], [7] * 9]
    plain = jaxspec.generate(target, prompts, max_new_tokens=24, temperature=0.0)
    spec = jaxspec.generate(target, prompts, draft=draft, gamma=3, max_new_tokens=24, temperature=0.0)
    assert spec.tokens == plain.tokens
    assert 0 < spec.stats.acceptance_rate < 1
    if vocab < VOCAB:  # the case exercises ids the draft has no row for (fed to it as its last id)
        assert max(t for row in plain.tokens for t in row) >= vocab
    else:  # rows past the target's ids are cut before drafting: the same drafts as without them
        same = jaxspec.generate(target, prompts, draft=perturbed_draft, gamma=3, max_new_tokens=24, temperature=0.0)
        assert spec.stats.accept_hist == same.stats.accept_hist


def test_wrong_model_types(target):
    with pytest.raises(TypeError, match="target"):
        jaxspec.generate("not a model", [[1]])
    with pytest.raises(TypeError, match="draft"):
        jaxspec.generate(target, [[1]], draft=object())


def _nan_model(base, bad_after: int):
    """``base`` whose logits turn NaN once a position >= bad_after is processed."""

    def apply_fn(params, tokens, positions, cache):
        logits, cache = base.apply_fn(params, tokens, positions, cache)
        return jnp.where((positions >= bad_after)[..., None], jnp.nan, logits), cache

    return base.replace(apply_fn=apply_fn, name="nan-model")


def test_non_finite_target_logits_are_reported(target, small_draft):
    bad = _nan_model(target, bad_after=6)
    with pytest.raises(jaxspec.NonFiniteLogitsError, match="target model 'nan-model'") as err:
        jaxspec.generate(bad, [[1, 2, 3], [4, 5]], draft=small_draft, max_new_tokens=8)
    assert err.value.rows == [0, 1]
    assert err.value.result is not None
    with pytest.raises(jaxspec.NonFiniteLogitsError):
        jaxspec.generate(bad, [[1, 2, 3]], max_new_tokens=8, temperature=0.0)


def test_non_finite_draft_logits_are_reported(target, small_draft):
    with pytest.raises(jaxspec.NonFiniteLogitsError, match="draft model 'nan-model'"):
        jaxspec.generate(target, [[1, 2, 3]], draft=_nan_model(small_draft, 4), max_new_tokens=8)


def test_finite_run_reports_nothing(target, small_draft):
    res = jaxspec.generate(target, [[1, 2, 3]], draft=small_draft, max_new_tokens=8)
    assert len(res.tokens[0]) == 8


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_stream_yields_the_same_tokens_as_generate(target, perturbed_draft, mixed_prompts, temperature):
    kw = dict(draft=perturbed_draft, gamma=3, max_new_tokens=20, temperature=temperature, seed=8, eos_token_id=7)
    full = jaxspec.generate(target, mixed_prompts[:5], **kw)
    stream = jaxspec.stream(target, mixed_prompts[:5], **kw)
    pieces = [[] for _ in range(5)]
    steps = 0
    with count_compiles() as counts:
        for step in stream:
            steps += 1
            if steps == 1:
                compiles_after_first = counts["compiles"]
            assert len(step.tokens) == 5
            for acc, new in zip(pieces, step.tokens):
                assert len(new) <= 4  # at most gamma + 1 verified tokens per round
                acc.extend(new)
    assert counts["compiles"] == compiles_after_first  # no compile per round
    assert pieces == full.tokens
    assert steps == max(r.rounds for r in full.stats.rows)
    assert stream.result.tokens == full.tokens
    assert stream.result.stats.accepted == full.stats.accepted


def test_strings_in_texts_out(target, small_draft):
    model = target.replace(tokenizer=CharTokenizer())
    res = jaxspec.generate(model, ["hello there", "hi"], draft=small_draft, max_new_tokens=6, temperature=0.0)
    assert res.texts == [CharTokenizer().decode(t) for t in res.tokens]
    ids = jaxspec.generate(
        model,
        [CharTokenizer().encode("hello there"), CharTokenizer().encode("hi")],
        draft=small_draft,
        max_new_tokens=6,
        temperature=0.0,
    )
    assert ids.tokens == res.tokens
    streamed = "".join(
        step.texts[1]
        for step in jaxspec.stream(model, ["hello there", "hi"], draft=small_draft, max_new_tokens=6, temperature=0.0)
    )
    assert streamed == res.texts[1]


def test_prompt_forms(target):
    as_lists = jaxspec.generate(target, [[1, 2, 3], [4, 5, 6]], max_new_tokens=4, temperature=0.0)
    as_array = jaxspec.generate(target, np.asarray([[1, 2, 3], [4, 5, 6]]), max_new_tokens=4, temperature=0.0)
    single = jaxspec.generate(target, [4, 5, 6], max_new_tokens=4, temperature=0.0)
    assert as_lists.tokens == as_array.tokens
    assert single.tokens == [as_lists.tokens[1]]


def test_stats(target, perturbed_draft, mixed_prompts):
    res = jaxspec.generate(target, mixed_prompts, draft=perturbed_draft, gamma=4, max_new_tokens=16, seed=2)
    s = res.stats
    assert s.mode == "speculative" and s.gamma == 4 and s.batch_size == len(mixed_prompts)
    assert s.compiled_batch_size >= s.batch_size
    assert s.generated_tokens == sum(map(len, res.tokens)) == sum(r.generated_tokens for r in s.rows)
    assert s.rounds == sum(s.accept_hist) == sum(r.rounds for r in s.rows)
    assert s.drafted == 4 * s.rounds
    assert s.accepted == sum(n * c for n, c in enumerate(s.accept_hist))
    assert 0 < s.acceptance_rate < 1
    assert s.tokens_per_round == pytest.approx(s.generated_tokens / s.rounds)
    assert s.wall_time_s > 0 and s.tokens_per_s > 0 and s.compile_time_s >= 0
    pos = s.position_acceptance
    assert len(pos) == 4 and all(p is None or 0 <= p <= 1 for p in pos)
    hist = np.asarray(s.accept_hist)
    assert pos[0] == pytest.approx(hist[1:].sum() / hist.sum())
    assert "α=" in s.summary()
    plain = jaxspec.generate(target, mixed_prompts, max_new_tokens=16)
    assert plain.stats.mode == "plain" and plain.stats.acceptance_rate is None
    assert plain.stats.rounds == plain.stats.generated_tokens


def test_draft_tokenizer_must_match(target, small_draft):
    from helpers import tiny_hf_tokenizer

    tok = tiny_hf_tokenizer()
    same = jaxspec.generate(
        target.replace(tokenizer=tok), ["def f"], draft=small_draft.replace(tokenizer=tok), max_new_tokens=3
    )
    assert len(same.tokens[0]) == 3
    other = tiny_hf_tokenizer("print('hello world')\n")
    with count_compiles() as counts, pytest.raises(ValueError, match="draft tokenizer .* not compatible"):
        jaxspec.generate(target.replace(tokenizer=tok), ["def f"], draft=small_draft.replace(tokenizer=other))
    assert counts["compiles"] == 0


def test_draft_tokenizer_is_compared_over_the_ids_both_models_have(target, perturbed_draft):
    """A target's tokenizer with a token past the draft's table (Gemma 3 4B's image token beside 1B's table): the
    shared ids decide. The same extra token inside both tables is a real difference and is refused."""
    from helpers import tiny_hf_tokenizer

    tok, extended = tiny_hf_tokenizer(), tiny_hf_tokenizer()
    n = len(tok)
    extended.add_tokens(["<image>"])
    assert extended.get_vocab()["<image>"] == n
    big = target.replace(tokenizer=extended)
    out = jaxspec.generate(big, ["def f"], draft=resized(perturbed_draft, n).replace(tokenizer=tok), max_new_tokens=3)
    assert len(out.tokens[0]) == 3
    inside = resized(perturbed_draft, n + 1).replace(tokenizer=tok)
    with count_compiles() as counts, pytest.raises(ValueError, match="draft tokenizer .* not compatible"):
        jaxspec.generate(big, ["def f"], draft=inside)
    assert counts["compiles"] == 0


def test_chat_template(target):
    from helpers import tiny_hf_tokenizer

    tok = tiny_hf_tokenizer()
    with pytest.raises(ValueError, match="no chat template"):
        jaxspec.generate(target.replace(tokenizer=tok), ["def f"], chat=True)
    tok.chat_template = (
        "{% for m in messages %}<eos>{{ m['content'] }}<eos>{% endfor %}{% if add_generation_prompt %}def{% endif %}"
    )
    model = target.replace(tokenizer=tok)
    chat = jaxspec.generate(model, ["x + 1"], chat=True, max_new_tokens=4, temperature=0.0)
    expected_prompt = tok.encode("<eos>x + 1<eos>def")
    plain = jaxspec.generate(model, [expected_prompt], max_new_tokens=4, temperature=0.0)
    assert chat.tokens == plain.tokens
    with pytest.raises(ValueError, match="chat"):
        jaxspec.generate(model, ["x"], chat="yes")


@pytest.mark.parametrize("speculative", [True, False], ids=["speculative", "plain"])
def test_per_row_sampling_in_one_call(target, perturbed_draft, mixed_prompts, speculative):
    """Greedy and sampled rows share a call: each greedy row's tokens equal those of an all-greedy call with the same
    prompts, and calls that differ only in per-row values (same shapes) reuse one compiled loop. (The shapes of
    test_loop's greedy-equality calls, so the suite compiles these loops once.)"""
    n = len(mixed_prompts)
    kw = dict(
        draft=perturbed_draft if speculative else None,
        gamma=3,
        max_new_tokens=[40 - (i % 4) * 7 for i in range(n)],
        eos_token_id=7,
        seed=8,
    )
    mixed = jaxspec.generate(
        target,
        mixed_prompts,
        temperature=[0.0 if i % 3 == 0 else 0.8 + 0.2 * (i % 2) for i in range(n)],
        top_k=[(3, None, 5, 0)[i % 4] for i in range(n)],  # greedy rows ignore their top-k and top-p
        top_p=[(None, 0.9, 1.0, 0.7, None)[i % 5] for i in range(n)],
        **kw,
    )
    compiled = jaxspec.loop.generate_program.compiles
    with count_compiles() as counts:
        greedy = jaxspec.generate(target, mixed_prompts, temperature=0.0, **kw)
        other = jaxspec.generate(
            target,
            mixed_prompts,
            temperature=[0.0 if i % 3 == 1 else 1.3 for i in range(n)],
            top_k=[(0, 4, None)[i % 3] for i in range(n)],
            top_p=0.95,
            **kw,
        )
    assert counts["compiles"] == 0 and counts["traces"] == 0, counts
    assert jaxspec.loop.generate_program.compiles == compiled
    for result, greedy_rows in ((mixed, range(0, n, 3)), (other, range(1, n, 3))):
        assert [result.tokens[b] for b in greedy_rows] == [greedy.tokens[b] for b in greedy_rows]
        assert [result.finish_reasons[b] for b in greedy_rows] == [greedy.finish_reasons[b] for b in greedy_rows]
    assert any(mixed.tokens[b] != greedy.tokens[b] for b in range(1, n, 3))  # the sampled rows did sample
