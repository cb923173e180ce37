"""Structured output: constraints compiled to device automata (``jaxspec.generation.constraints``,
``jaxspec.core.grammar``), greedy speculation under a constraint equal to constrained plain decoding (generate,
stream, the engine), and the errors a request gets before anything compiles. The statistical exactness of sampling
under a constraint, with its negative control, is tests/generation/test_exactness.py's; a JSON schema on the real
model with its EAGLE head runs in docs/guides/generation.md (tests/integration/test_examples.py)."""

from __future__ import annotations

import dataclasses
import itertools
import re

import jax.numpy as jnp
import numpy as np
import pytest
from helpers import five_token_tokenizer, tiny_config

import jaxspec
from jaxspec import llama
from jaxspec.core.grammar import Grammar
from jaxspec.generation import constraints
from jaxspec.policy import AutoGamma

EOS = 4


@pytest.fixture(scope="module")
def tokenizer():
    return five_token_tokenizer()


@pytest.fixture(scope="module")
def pair(tokenizer):
    """A 5-id target (peaked: greedy paths differ by state) and a smaller draft, both with the 5-token tokenizer."""
    cfg = tiny_config(vocab_size=5, init_std=0.5)
    target = llama.init(cfg, seed=3, name="target")
    draft = llama.init(dataclasses.replace(cfg, hidden_size=32, num_layers=1), seed=4, name="draft")
    extra = dict(tokenizer=tokenizer, eos_token_id=EOS)
    return dataclasses.replace(target, **extra), dataclasses.replace(draft, **extra)


def test_the_automaton_is_the_regex(tokenizer):
    """(a|b)+c? over a, b, c, ab, </s>: every token sequence is accepted exactly when the regex matches its text
    and the EOS comes only at the end (checked against Python's ``re`` over all sequences of up to 4 tokens)."""
    a = constraints.compile_constraint(jaxspec.Regex("(a|b)+c?"), tokenizer, 5, (EOS,), "constraint")
    text = {0: "a", 1: "b", 2: "c", 3: "ab"}
    assert a.min_tokens == 2  # one letter, then the EOS
    for n in range(1, 5):
        for seq in itertools.product(range(5), repeat=n):
            state, ok = 0, True
            for t in seq:
                nxt = a.next_state[state, a.token_class[t]]
                if nxt < 0:
                    ok = False
                    break
                state = nxt
            body = seq[:-1] if seq[-1] == EOS else seq
            if EOS in body:
                continue  # a row ends at its first EOS
            if seq[-1] == EOS:
                assert ok == (re.fullmatch("(a|b)+c?", "".join(text[t] for t in body)) is not None), seq
            else:  # a prefix: allowed while some completion exists
                assert ok == any(re.fullmatch("(a|b)+c?", "".join(text[t] for t in seq) + s) for s in ("", "a", "c")), (
                    seq
                )


def test_grammar_masks_steps_and_forces_on_device():
    """``Grammar`` against a hand-written table: 2 states, 3 classes over 4 ids."""
    token_class = jnp.asarray([[0, 1, 2, 2]])  # ids 2 and 3 share a class
    table = jnp.asarray([[[1, -1, 0], [-1, 1, -1]]])  # state 0: ids 0 -> 1, 2/3 -> 0; state 1: only id 1 -> 1
    g = Grammar(token_class, table, jnp.asarray([0]))
    np.testing.assert_array_equal(g.allowed(), [[True, False, True, True]])
    np.testing.assert_array_equal(g.advanced(jnp.asarray([0])).allowed(), [[False, True, False, False]])
    np.testing.assert_array_equal(g.step(jnp.asarray([3])), [0])
    np.testing.assert_array_equal(g.step(jnp.asarray([1])), [0])  # not allowed: the state stays
    np.testing.assert_array_equal(g.path(jnp.asarray([[2, 0, 1]])), [[0, 0, 1, 1]])
    only, token = g.at(jnp.asarray([[0, 1]])).forced()
    np.testing.assert_array_equal(only, [[False, True]])
    assert int(token[0, 1]) == 1
    masked = g.mask(jnp.asarray([[0.5, 2.0, -jnp.inf, -jnp.inf]]))
    np.testing.assert_array_equal(masked, [[0.5, -np.inf, -np.inf, -np.inf]])
    # no allowed token with a finite logit (a drafter without those ids): the allowed ones get 0 (uniform)
    np.testing.assert_array_equal(g.mask(jnp.asarray([[-jnp.inf, 1.0, -jnp.inf, -jnp.inf]])), [[0, -np.inf, 0, 0]])


def test_device_tables_pad_and_free_rows(tokenizer):
    a = constraints.compile_constraint(jaxspec.Choice(["ab", "c"]), tokenizer, 5, (EOS,), "constraint")
    token_class, next_state = constraints.device_tables([a, None], 5)
    assert next_state.shape[1:] == (constraints.bucket(a.num_states), constraints.bucket(a.num_classes))
    g = Grammar(jnp.asarray(token_class), jnp.asarray(next_state), jnp.zeros(2, jnp.int32))
    allowed = np.asarray(g.allowed())
    assert allowed[1].all()  # the free row allows everything
    np.testing.assert_array_equal(allowed[0], [True, False, True, True, False])  # a (of ab), c, ab


@pytest.mark.parametrize("draft_kind", ["model", "lookup", "lookup-first", "auto"])
def test_greedy_speculation_under_constraints_equals_plain(pair, draft_kind):
    """Mixed rows (a regex, choices, none) in one call: speculative greedy == plain greedy, every constrained
    output matches its constraint, and the forced EOS after ``c`` is counted. Drafters: a draft model, prompt
    lookup, ``LookupFirst`` (lookup's copies, the model elsewhere) and ``gamma="auto"`` (a policy that speculates
    whatever this machine's timings, over chains: constraints rule trees out)."""
    target, draft = pair
    drafter, gamma = {
        "model": (draft, 3),
        "lookup": ("prompt_lookup", 3),
        "lookup-first": (jaxspec.LookupFirst(draft, draft_gamma=2), 3),
        "auto": (draft, "auto"),
    }[draft_kind]
    prompts = [[0, 1, 3], [3, 3, 0, 1], [2, 0], [1]]
    rules = [jaxspec.Regex("(a|b)+c?"), {"choices": ["abc", "ca"]}, None, jaxspec.Regex("(ab)*c")]
    kw = dict(max_new_tokens=6, temperature=0.0, constraint=rules)
    plain = jaxspec.generate(target, prompts, **kw)
    policy = AutoGamma(margin=0.0, keep_costs=False) if gamma == "auto" else None
    spec = jaxspec.generate(target, prompts, draft=drafter, gamma=gamma, policy=policy, **kw)
    assert spec.tokens == plain.tokens
    assert spec.stats.mode == "speculative" and spec.stats.drafted > 0
    if gamma == "auto":
        assert spec.stats.policy["tree"] is None and "tree:4,2,4" not in spec.stats.policy["expected_speedup"]
    text = {0: "a", 1: "b", 2: "c", 3: "ab"}
    patterns = ["(a|b)+c?", "(abc|ca)", None, "(ab)*c"]
    for tokens, reason, row, pattern in zip(spec.tokens, spec.finish_reasons, spec.stats.rows, patterns):
        if pattern is None:
            assert row.complete is None
            continue
        body = tokens[:-1] if reason == "eos" else tokens
        assert EOS not in body
        matches = re.fullmatch(pattern, "".join(text[t] for t in body)) is not None
        assert row.complete == matches, (pattern, tokens, reason)  # complete: the output matches in full
        if reason == "eos":
            assert matches, (pattern, tokens)
    assert spec.stats.forced_tokens == plain.stats.forced_tokens > 0


def test_stream_and_engine_under_constraints_equal_generate(pair):
    target, draft = pair
    prompts = [[0, 1, 3], [3, 3, 0, 1], [2, 0]]
    rules = [jaxspec.Regex("(a|b)+c?"), None, jaxspec.Choice(["abc", "ca"])]
    kw = dict(max_new_tokens=6, temperature=0.0)
    alone = jaxspec.generate(target, prompts, draft=draft, gamma=2, constraint=rules, **kw)
    stream = jaxspec.stream(target, prompts, draft=draft, gamma=2, constraint=rules, **kw)
    for _ in stream:
        pass
    assert stream.result is not None and stream.result.tokens == alone.tokens
    engine = jaxspec.Engine(target, draft=draft, gamma=2, slots=2, **kw)
    requests = [{"prompt": p, "constraint": r} for p, r in zip(prompts, rules)]
    rows = sorted(engine.run(requests), key=lambda r: r.index)
    assert [r.tokens for r in rows] == alone.tokens
    assert [r.stats.complete for r in rows] == [r.complete for r in alone.stats.rows]


def test_errors_name_the_request_before_anything_compiles(pair, tokenizer):
    target, draft = pair
    with pytest.raises(ValueError, match=r"constraint\[1\] must be None"):
        jaxspec.generate(target, [[0], [1]], constraint=[None, "a+"])
    with pytest.raises(ValueError, match="one constraint .* per prompt: 2, got 1"):
        jaxspec.generate(target, [[0], [1]], constraint=[jaxspec.Regex("a")])
    with pytest.raises(ValueError, match="cannot be compiled: The vocabulary provided is incompatible"):
        jaxspec.generate(target, [[0]], constraint=jaxspec.Regex("z"))
    with pytest.raises(ValueError, match=r"prompts\[0\]: its constraint needs at least 4 tokens"):
        jaxspec.generate(target, [[0]], constraint=jaxspec.Regex("abab(a|c)"), max_new_tokens=3)
    with pytest.raises(ValueError, match="draft trees do not take constraints"):
        jaxspec.generate(target, [[0]], draft=draft, tree=(2, 2, 2), constraint=jaxspec.Regex("a+"))
    with pytest.raises(ValueError, match="needs the target's tokenizer"):
        jaxspec.generate(dataclasses.replace(target, tokenizer=None), [[0]], constraint=jaxspec.Regex("a"))
    with pytest.raises(ValueError, match="JsonSchema cannot be compiled"):
        jaxspec.generate(target, [[0]], constraint=jaxspec.JsonSchema("{not json"))
    with pytest.raises(ValueError, match=r"requests\[0\]: a constrained request ends with"):
        jaxspec.Engine(target, max_new_tokens=4).run([{"prompt": [0], "constraint": {"regex": "a"}, "eos_token_id": 2}])


def test_budget_refuses_a_huge_automaton(tokenizer, monkeypatch):
    monkeypatch.setattr(constraints, "MAX_TABLE", 4)
    with pytest.raises(ValueError, match="more than the device budget"):
        constraints.compile_constraint(jaxspec.Regex("(a|b)+c?"), tokenizer, 5, (EOS,), "constraint")


def _replay(automaton, tokens: list[int]) -> tuple[int, int]:
    """(state, forced tokens) after ``tokens`` from the initial state, on the host table."""
    state, forced = 0, 0
    for t in tokens:
        row = automaton.next_state[state]
        forced += int(np.sum(row[automaton.token_class] >= 0) == 1)
        state = int(row[automaton.token_class[t]])
        assert state >= 0
    return state, forced


def test_state_after_rejections_equals_a_replay_of_the_emitted_tokens(pair):
    """Sampled rows with a random draft (many rejections): each row's device state at the end, and its count of
    forced tokens, equal a from-scratch replay of its emitted tokens."""
    from jaxspec.generation import generate as gen

    target, draft = pair
    prompts = [[0, 1], [3], [2, 2, 0], [1, 1, 1]]
    rule = jaxspec.Regex("((a|b)+c)+")
    prep = gen.prepare(
        target, prompts, draft=draft, gamma=3, max_new_tokens=12, temperature=1.0, seed=5, constraint=rule
    )
    state, _, _ = gen.run(prep)
    result = gen.finish(prep, state, 0.0, 0.0)
    assert 0 < result.stats.acceptance_rate < 1  # rejections happened
    automaton = prep.automata[0]
    device = np.asarray(state.grammar.state)
    assert set(result.finish_reasons) == {"eos", "length"}  # rows cut at max_new_tokens, some inside a round
    for b, tokens in enumerate(result.tokens):
        replayed, forced = _replay(automaton, tokens)  # the EOS, allowed in a final state only, keeps it
        assert device[b] == replayed, (b, tokens)
        assert result.stats.rows[b].forced_tokens == forced
        assert result.stats.rows[b].complete == bool(automaton.final[replayed])


def test_forced_tokens_are_accepted_for_certain(pair):
    """``c`` is the only id that writes "c": under c{5} every token is forced (the EOS last), so a random draft's
    every draft is accepted (q = 1 on the forced token, and the masked target puts all its mass there)."""
    target, draft = pair
    res = jaxspec.generate(
        target, [[0], [1, 3]], draft=draft, gamma=2, max_new_tokens=8, temperature=1.0, constraint=jaxspec.Regex("c{5}")
    )
    assert res.tokens == [[2] * 5 + [EOS]] * 2
    assert res.stats.accepted == res.stats.drafted > 0
    assert res.stats.forced_tokens == 12


def test_a_new_constraint_of_the_same_bucket_compiles_nothing(pair):
    from helpers import count_compiles

    target, draft = pair
    kw = dict(draft=draft, gamma=2, max_new_tokens=6, temperature=0.0)
    jaxspec.generate(target, [[0, 1]], constraint=jaxspec.Regex("(a|b)+c?"), **kw)
    with count_compiles() as counts:
        res = jaxspec.generate(target, [[0, 1]], constraint=jaxspec.Choice(["abc", "ca"]), **kw)
    assert counts["compiles"] == 0
    assert res.stats.rows[0].complete is not None
