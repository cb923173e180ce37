"""The host stages of ``generate`` one by one, without running a loop: the request (checks, tokenization, per-row
values), the buckets and traced inputs, and the fixed-γ decision. Nothing here compiles."""

import numpy as np
import pytest
from helpers import count_compiles, tiny_hf_tokenizer

import jaxspec
from jaxspec.generation import generate as gen
from jaxspec.generation import inputs
from jaxspec.generation.request import Request, is_int, is_real, make_request, per_row_ints, tokenize


def test_number_checks_refuse_bools():
    assert is_int(3) and is_int(np.int64(3)) and not is_int(True) and not is_int(3.0)
    assert is_real(0.5) and is_real(2) and not is_real(False) and not is_real("1")
    assert per_row_ints(5, "n", 3, 1).tolist() == [5, 5, 5]
    assert per_row_ints([1, 2], "n", 2, 1).tolist() == [1, 2]
    with pytest.raises(ValueError, match=r"n must be an int in \[0, 4\)"):
        per_row_ints([1, 4], "n", 2, 0, 4)
    with pytest.raises(ValueError, match="n has 1 entries but there are 2 prompts"):
        per_row_ints([1], "n", 2, 1)


def test_tokenize_prompt_forms(target):
    assert tokenize(target, [1, 2, 3]) == [[1, 2, 3]]
    assert tokenize(target, np.asarray([[1, 2], [3, 4]])) == [[1, 2], [3, 4]]
    assert tokenize(target, [[1], np.asarray([2, 3])]) == [[1], [2, 3]]


def test_blank_text_prompts_are_refused_by_every_entry_point(target):
    """An empty or whitespace-only string has nothing to continue (the tokenizer would still give it ids), so
    tokenize refuses it, naming prompts[i], for generate, stream and Engine alike, before anything compiles; a
    token-id list is never judged by what it decodes to."""
    tok = tiny_hf_tokenizer()
    tok.chat_template = "{% for m in messages %}user: {{ m['content'] }}\n{% endfor %}"
    model = target.replace(tokenizer=tok, eos_token_id=None)
    blank_ids = model.tokenizer.encode(" \n\t")  # the ids such a prompt would otherwise run with
    assert blank_ids and tokenize(model, [blank_ids]) == [blank_ids]
    with count_compiles() as counts:
        for prompts, index, what in ([" \n\t"], 0, "only whitespace"), (["def f", ""], 1, "empty"):
            for chat in (False, True):
                with pytest.raises(ValueError, match=rf"prompts\[{index}\] is {what}"):
                    tokenize(model, prompts, chat=chat)
            with pytest.raises(ValueError, match=rf"prompts\[{index}\] is {what}"):
                jaxspec.generate(model, prompts, max_new_tokens=2)
            with pytest.raises(ValueError, match=rf"prompts\[{index}\] is {what}"):
                jaxspec.stream(model, prompts, max_new_tokens=2)
            with pytest.raises(ValueError, match=rf"prompts\[{index}\] is {what}"):
                jaxspec.Engine(model, slots=2, max_new_tokens=2).run([dict(prompt=p) for p in prompts])
    assert counts["compiles"] == 0


def test_request_expands_per_row_values(target, small_draft):
    with count_compiles() as counts:
        one_seed = make_request(target, [[1, 2, 3], [4]], draft=small_draft, seed=7, max_new_tokens=[5, 6])
        per_row = make_request(target, [[1, 2, 3], [4]], seed=[7, 8], eos_token_id=[2, 3])
    assert counts["compiles"] == 0
    assert isinstance(one_seed, Request) and one_seed.num_rows == 2 and one_seed.lengths.tolist() == [3, 1]
    assert one_seed.max_new.tolist() == [5, 6] and one_seed.seeds.tolist() == [7, 7]
    assert one_seed.row_ids.tolist() == [0, 1]  # one seed: rows differ by their index
    assert per_row.seeds.tolist() == [7, 8] and per_row.row_ids.tolist() == [0, 0]  # a row's own seed only
    assert per_row.eos == (2, 3) and per_row.drafter is None and one_seed.drafter is small_draft
    lookup = make_request(target, [[1, 2]], draft="prompt_lookup", gamma="auto")
    assert lookup.draft is None and lookup.lookup is not None and lookup.auto


def test_buckets_and_padded_inputs(target):
    assert [inputs.bucket_batch(n) for n in (1, 3, 8, 9, 17)] == [1, 4, 8, 16, 24]
    assert [inputs.bucket_cache(n) for n in (1, 65, 2048, 2049)] == [64, 128, 2048, 3072]
    request = make_request(target, [[1, 2, 3], [4] * 9, [5]], max_new_tokens=[10, 60, 1], seed=3)
    shape = inputs.buckets(request)
    # the prefill reads one chunk of 64 positions (a cache of 128: chunks of max(64, 128 // 8))
    assert shape == inputs.Buckets(batch=4, cache_len=128, prompt_len=64)
    assert inputs.prefill_positions(128, 65) == 128 and inputs.prefill_positions(1024, 129) == 256
    x = inputs.loop_inputs(request, shape)
    # prompts padded to the cache length: their lengths select no program
    assert x.prompt.shape == (4, 128) and np.asarray(x.prompt)[1, :9].tolist() == [4] * 9
    assert np.asarray(x.prompt_len).tolist() == [3, 9, 1, 1]  # the padding row: one token, inactive
    assert np.asarray(x.active).tolist() == [True, True, True, False]
    assert np.asarray(x.max_new).tolist() == [10, 60, 1, 1]
    assert inputs.buckets(make_request(target, [[1, 2]], max_length=40)).cache_len == 40


def test_fixed_gamma_decision_and_prepared(target, small_draft):
    with_draft = make_request(target, [[1, 2]], draft=small_draft, gamma=3)
    plain = make_request(target, [[1, 2]], gamma=3)
    shape = inputs.buckets(with_draft)
    assert gen.choose_gamma(with_draft, shape) == (3, None, None)
    assert gen.choose_gamma(plain, shape) == (0, None, None)  # no drafter: plain decoding whatever γ says
    prep = gen.prepare(target, [[1, 2]], draft=small_draft, gamma=3, max_new_tokens=4)
    assert prep.spec.gamma == 3 and prep.draft is small_draft and prep.target is target and prep.num_rows == 1
    tparams, dparams = prep.placed_params()
    assert tparams is target.params and dparams is small_draft.params


def test_gamma_none_is_the_drafters_default(target, small_draft):
    """A call that names no γ gets its drafter's own (``Drafter.default_gamma``); a named γ wins."""
    from jaxspec.drafters import Drafter, PromptLookup

    class Short(PromptLookup):
        default_gamma = 2

    assert Drafter.default_gamma == 4
    assert make_request(target, [[1, 2]], draft=small_draft).gamma == 4  # a draft model: the base default
    assert make_request(target, [[1, 2]], draft="prompt_lookup").gamma == 4
    assert make_request(target, [[1, 2]], draft=Short()).gamma == 2
    assert make_request(target, [[1, 2]], draft=Short(), gamma=3).gamma == 3
    assert make_request(target, [[1, 2]], draft=Short(), gamma="auto").auto


def test_per_row_sampling_values(target):
    """temperature / top_k / top_p: one value for every prompt, or one per prompt (None: off), as [N] arrays; the
    traced inputs carry them per row, padding rows greedy and unfiltered."""
    one = make_request(target, [[1], [2]], temperature=0.5, top_k=4)
    assert one.temperature.tolist() == [0.5, 0.5] and one.top_k.tolist() == [4, 4] and one.top_p.tolist() == [1, 1]
    assert one.temperature.dtype == np.float64 and one.top_k.dtype == np.int64 and one.top_p.dtype == np.float64
    assert not one.greedy and make_request(target, [[1], [2]], temperature=0).greedy
    rows = make_request(
        target, [[1], [2], [3]], temperature=[0, 0.7, 1.0], top_k=(None, 0, 500), top_p=np.asarray([1.0, 0.5, 0.9])
    )
    assert rows.temperature.tolist() == [0, 0.7, 1.0] and not rows.greedy  # greedy: every row at temperature 0
    assert rows.top_k.tolist() == [0, 0, 500] and rows.top_p.tolist() == [1.0, 0.5, 0.9]
    assert make_request(target, [[1], [2]], temperature=[0.0, 0]).greedy
    x = inputs.loop_inputs(rows, inputs.buckets(rows)).sampling
    assert [(f.shape, f.dtype) for f in (x.temperature, x.top_k, x.top_p)] == [
        ((4,), np.float32),
        ((4,), np.int32),
        ((4,), np.float32),
    ]
    assert np.asarray(x.temperature).tolist() == pytest.approx([0, 0.7, 1.0, 0])
    assert np.asarray(x.top_k).tolist() == [0, 0, target.vocab_size, 0]  # k >= V keeps every token: clipped to V
    assert np.asarray(x.top_p).tolist() == pytest.approx([1.0, 0.5, 0.9, 1.0])


BAD_SAMPLING = [
    (dict(temperature=[1.0]), "temperature has 1 entries but there are 2 prompts"),
    (dict(top_p=[0.9, 0.9, 0.9]), "top_p has 3 entries but there are 2 prompts"),
    (dict(top_k=[]), "top_k has 0 entries but there are 2 prompts"),
    (dict(temperature=[1.0, -1.0]), r"temperature\[1\] must be a finite number >= 0 \(0 = greedy\), got -1.0"),
    (dict(temperature=[float("nan"), 1.0]), r"temperature\[0\] must be a finite number >= 0.*got nan"),
    (dict(temperature=np.asarray([0.5, np.inf])), r"temperature\[1\] must be a finite number >= 0.*got inf"),
    (dict(top_p=[0.5, 0.0]), r"top_p\[1\] must be None or a number in \(0, 1\], got 0.0"),
    (dict(top_p=[None, 1.5]), r"top_p\[1\] must be None or a number in \(0, 1\], got 1.5"),
    (dict(top_k=[-1, 3]), r"top_k\[0\] must be None or an int >= 0 \(0 = off\), got -1"),
    (dict(top_k=[2.0, 3]), r"top_k\[0\] must be None or an int >= 0 \(0 = off\), got 2.0"),
    (dict(temperature=[True, 1.0]), r"temperature\[0\] must be a finite number >= 0 \(0 = greedy\), got True"),
    (dict(top_k=[None, False]), r"top_k\[1\] must be None or an int >= 0 \(0 = off\), got False"),
    (dict(temperature=[None, 1.0]), r"temperature\[0\] must be a finite number >= 0 \(0 = greedy\), got None"),
    (dict(temperature=[[1.0, 1.0]]), r"temperature\[0\] must be a finite number >= 0 \(0 = greedy\), got \[1.0"),
    # one value for every prompt: the messages as before
    (dict(temperature=True), r"temperature must be a finite number >= 0 \(0 = greedy\), got True"),
    (dict(temperature="hot"), r"temperature must be a finite number >= 0 \(0 = greedy\), got 'hot'"),
    (dict(top_k=-1), r"top_k must be None or an int >= 0 \(0 = off\), got -1"),
    (dict(top_p=0), r"top_p must be None or a number in \(0, 1\], got 0"),
]


@pytest.mark.parametrize("kwargs,match", BAD_SAMPLING)
def test_bad_per_row_sampling_values(target, small_draft, kwargs, match):
    with count_compiles() as counts, pytest.raises(ValueError, match=match):
        make_request(target, [[1, 2, 3], [4, 5]], draft=small_draft, **kwargs)
    assert counts["compiles"] == 0


def test_one_config_object_or_its_keywords(target, small_draft):
    """``GenerationConfig`` holds the settings once: the object, its fields as keywords, or both (keywords win)
    make the same checked request, and Engine takes the same; a misspelt setting is a TypeError naming it."""
    import jaxspec
    from jaxspec import GenerationConfig

    config = GenerationConfig(draft=small_draft, gamma=3, max_new_tokens=[5, 6], temperature=0.0, seed=7)
    by_object = make_request(target, [[1, 2, 3], [4]], config)
    by_keywords = make_request(
        target, [[1, 2, 3], [4]], draft=small_draft, gamma=3, max_new_tokens=[5, 6], seed=7, temperature=0
    )
    for field in ("gamma", "max_new", "seeds", "temperature", "eos", "draft"):
        assert np.array_equal(getattr(by_object, field), getattr(by_keywords, field)), field
    overridden = make_request(target, [[1, 2, 3], [4]], config, gamma=2, temperature=[0.5, 1.0])
    assert (
        overridden.gamma == 2 and overridden.temperature.tolist() == [0.5, 1.0] and overridden.seeds.tolist() == [7, 7]
    )
    assert config.gamma == 3 and config.replace(seed=1).seed == 1 and config.seed == 7  # frozen: copies
    with count_compiles() as counts:
        with pytest.raises(TypeError, match=r"generate\(\) got unknown setting\(s\) \['temprature'\]"):
            jaxspec.generate(target, [[1, 2]], temprature=0.5)
        with pytest.raises(TypeError, match=r"Engine\(\) got unknown setting\(s\) \['gama'\]"):
            jaxspec.Engine(target, gama=2)
        with pytest.raises(TypeError, match="config must be a jaxspec.GenerationConfig"):
            jaxspec.generate(target, [[1, 2]], {"temperature": 0.5})
        with pytest.raises(ValueError, match="gamma must be"):
            jaxspec.Engine(target, config, gamma=0)  # checked at construction, as generate checks it
    assert counts["compiles"] == 0
    engine = jaxspec.Engine(target, config.replace(max_new_tokens=5), slots=2)
    assert engine.config.draft is small_draft and engine.config.gamma == 3 and engine.config.max_new_tokens == 5
