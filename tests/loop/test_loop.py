"""Engine behaviour: greedy equality with plain decoding, draft bookkeeping, ragged stopping, seeds, no recompiles."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import count_compiles

import jaxspec
from jaxspec import loop
from jaxspec.generation.generate import prepare

MAX_NEW = 40
EOS = 7


def per_row_max_new(prompts):
    return [MAX_NEW - (i % 4) * 7 for i in range(len(prompts))]


@pytest.fixture(scope="module")
def plain_greedy(target, mixed_prompts):
    return jaxspec.generate(
        target, mixed_prompts, max_new_tokens=per_row_max_new(mixed_prompts), temperature=0.0, eos_token_id=EOS
    )


@pytest.mark.parametrize("gamma", [1, 3, 7])
@pytest.mark.parametrize("draft_name", ["same", "unrelated", "small", "perturbed", "prompt_lookup"])
def test_greedy_speculative_equals_plain(request, target, mixed_prompts, plain_greedy, gamma, draft_name):
    if draft_name in ("same", "prompt_lookup"):
        draft = target if draft_name == "same" else "prompt_lookup"
    else:
        draft = request.getfixturevalue(f"{draft_name}_draft")
    spec = jaxspec.generate(
        target,
        mixed_prompts,
        draft=draft,
        gamma=gamma,
        max_new_tokens=per_row_max_new(mixed_prompts),
        temperature=0.0,
        eos_token_id=EOS,
    )
    assert len(spec.tokens) == len(mixed_prompts) >= 20
    mismatched = [i for i, (a, b) in enumerate(zip(spec.tokens, plain_greedy.tokens)) if a != b]
    assert mismatched == [], f"rows differing from plain greedy: {mismatched}"
    assert spec.finish_reasons == plain_greedy.finish_reasons
    for a, b in zip(spec.logprobs, plain_greedy.logprobs):
        np.testing.assert_allclose(a, b, atol=2e-4)
    alpha = spec.stats.acceptance_rate
    if draft_name == "same":
        assert alpha == 1.0  # any draft-cache misalignment after a rejection or bonus token shows up here
        assert spec.stats.accept_hist[-1] == spec.stats.rounds
    elif draft_name == "perturbed":
        assert 0.1 < alpha < 0.95  # partial acceptance: rollback paths are exercised
    # every row's stats add up: the histogram counts verify rounds; prompt lookup abstains where it finds no
    # n-gram, and those rounds are plain steps (counted in rounds only)
    for row, toks in zip(spec.stats.rows, spec.tokens):
        assert row.generated_tokens == len(toks)
        if draft_name == "prompt_lookup":
            assert sum(row.accept_hist) <= row.rounds
        else:
            assert sum(row.accept_hist) == row.rounds
        assert row.drafted == gamma * sum(row.accept_hist)
        assert row.accepted == sum(n * c for n, c in enumerate(row.accept_hist))
    if draft_name == "prompt_lookup":
        verified = sum(sum(row.accept_hist) for row in spec.stats.rows)
        assert 0 < verified < spec.stats.rounds  # both kinds of round ran


def test_greedy_run_stops_raggedly(plain_greedy, mixed_prompts):
    limits = per_row_max_new(mixed_prompts)
    reasons = set(plain_greedy.finish_reasons)
    assert reasons == {"eos", "length"}, reasons  # the fixture really mixes both kinds of stop
    for toks, reason, limit in zip(plain_greedy.tokens, plain_greedy.finish_reasons, limits):
        assert 1 <= len(toks) <= limit
        if reason == "eos":
            assert toks[-1] == EOS and EOS not in toks[:-1]
        else:
            assert len(toks) == limit and EOS not in toks


def test_logprobs_come_from_the_target(target, perturbed_draft, mixed_prompts):
    res = jaxspec.generate(target, mixed_prompts[:4], draft=perturbed_draft, gamma=3, max_new_tokens=12, seed=5)
    for prompt, toks, lps in zip(mixed_prompts[:4], res.tokens, res.logprobs):
        full = np.asarray(jax.nn.log_softmax(target.logits(np.asarray([prompt + toks]))[0], axis=-1))
        expected = full[np.arange(len(prompt) - 1, len(prompt) + len(toks) - 1), toks]
        np.testing.assert_allclose(lps, expected, atol=2e-4)


def test_draft_equal_to_target_sampling_alpha(target, mixed_prompts):
    res = jaxspec.generate(target, mixed_prompts, draft=target, gamma=4, max_new_tokens=32, temperature=1.0, seed=1)
    assert res.stats.acceptance_rate >= 0.99


def test_only_verified_tokens_are_emitted(target, unrelated_draft, mixed_prompts):
    """With top_k=2 every emitted token must be one of the target's top-2 at its position: an unverified
    token from the unrelated draft would almost never be."""
    res = jaxspec.generate(
        target, mixed_prompts, draft=unrelated_draft, gamma=3, max_new_tokens=16, temperature=1.0, top_k=2, seed=3
    )
    assert res.stats.acceptance_rate < 0.9
    for prompt, toks in zip(mixed_prompts, res.tokens):
        logits = np.asarray(target.logits(np.asarray([prompt + toks]))[0])
        for j, tok in enumerate(toks):
            row = logits[len(prompt) - 1 + j]
            assert row[tok] >= np.sort(row)[-2] - 1e-5


def test_cache_end_stops_rows(target, perturbed_draft):
    prompts = [[1, 2, 3], [4] * 10]
    res = jaxspec.generate(
        target, prompts, draft=perturbed_draft, gamma=4, max_new_tokens=100, max_length=16, temperature=0.0
    )
    assert res.finish_reasons == ["cache", "cache"]
    assert [len(t) for t in res.tokens] == [13, 6]
    plain = jaxspec.generate(target, prompts, max_new_tokens=100, max_length=16, temperature=0.0)
    assert plain.tokens == res.tokens


def test_same_seed_same_tokens_different_seed_different(target, small_draft, mixed_prompts):
    kw = dict(draft=small_draft, gamma=3, max_new_tokens=24, temperature=1.0)
    a = jaxspec.generate(target, mixed_prompts, seed=11, **kw)
    b = jaxspec.generate(target, mixed_prompts, seed=11, **kw)
    c = jaxspec.generate(target, mixed_prompts, seed=12, **kw)
    assert a.tokens == b.tokens
    differing = sum(x != y for x, y in zip(a.tokens, c.tokens))
    assert differing >= len(mixed_prompts) // 2


def test_row_sample_does_not_depend_on_the_batch(target, small_draft, mixed_prompts):
    kw = dict(draft=small_draft, gamma=3, max_new_tokens=24, temperature=1.0)
    # int seed: row b uses (seed, b); appending rows changes nothing for the first rows
    five = jaxspec.generate(target, mixed_prompts[:5], seed=4, **kw)
    eight = jaxspec.generate(target, mixed_prompts[:8], seed=4, **kw)
    assert eight.tokens[:5] == five.tokens
    # per-row seeds: a row can be re-batched anywhere
    seeds = list(range(100, 108))
    batch = jaxspec.generate(target, mixed_prompts[:8], seed=seeds, **kw)
    alone = jaxspec.generate(target, [mixed_prompts[6]], seed=[seeds[6]], **kw)
    assert alone.tokens[0] == batch.tokens[6]


def test_no_recompilation_for_new_prompts_seed_temperature(target, small_draft, mixed_prompts):
    kw = dict(draft=small_draft, gamma=3)
    jaxspec.generate(target, mixed_prompts[:6], max_new_tokens=20, temperature=0.7, seed=0, **kw)
    before = jaxspec.loop.generate_program.compiles
    with count_compiles() as counts:
        rng = np.random.default_rng(9)
        new_prompts = [rng.integers(0, 96, size=int(rng.integers(3, 20))).tolist() for _ in range(5)]
        for temperature, top_k, top_p, seed, max_new in [
            (1.0, None, None, 1, 24),
            (0.0, None, None, 2, 17),
            (0.6, 5, 0.9, 3, 30),
            (1.3, 0, 0.5, 4, 8),
        ]:
            jaxspec.generate(
                target,
                new_prompts,
                max_new_tokens=max_new,
                temperature=temperature,
                top_k=top_k,
                top_p=top_p,
                seed=seed,
                **kw,
            )
    assert counts["compiles"] == 0 and counts["traces"] == 0, counts
    assert jaxspec.loop.generate_program.compiles == before


@pytest.mark.parametrize("drafter", ["plain", "model"])
def test_chunked_prefill_writes_the_entries_of_one_pass(target, small_draft, drafter):
    """The prefill reads prompts in chunks (here of 8 positions: prompts of 3 to 30 tokens take 1 to 4 chunks, as
    many as the longest needs): every cache entry of a prompt position, the target's and a draft model's, is the
    one a single pass over the whole prompt writes."""
    draft = small_draft if drafter == "model" else None
    rng = np.random.default_rng(4)
    prompts = [rng.integers(0, 96, n).tolist() for n in (3, 30, 17, 8)]
    prep = prepare(target, prompts, draft=draft, gamma=2, max_length=48, temperature=0.0)
    spec = dataclasses.replace(prep.spec, prefill_chunk=8)
    tparams, dparams = prep.placed_params()
    state = jax.jit(loop.prefill, static_argnums=0)(spec, tparams, dparams, prep.inputs)
    tokens = jnp.asarray([p + [0] * (30 - len(p)) for p in prompts])
    positions = jnp.broadcast_to(jnp.arange(30), tokens.shape)
    models = [(target, state.target_cache)] + ([(small_draft, state.draft_state)] if draft else [])
    for model, got in models:
        _, want = jax.jit(model.apply_fn)(model.params, tokens, positions, model.init_cache(4, 48))
        for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
            for row, p in enumerate(prompts):  # [layers, B, S, ...]: the row's prompt positions
                np.testing.assert_allclose(np.asarray(a)[:, row, : len(p)], np.asarray(b)[:, row, : len(p)], atol=1e-5)
    assert np.asarray(state.tokens)[1, :30].tolist() == prompts[1]


def test_prompt_lengths_select_no_program(target):
    """Prompts are padded to the cache and read in chunks whose count is traced: calls whose prompts need one or
    two chunks of a cache of 128 (chunks of 64) run one compiled program."""
    kw = dict(max_new_tokens=3, max_length=128, temperature=0.0)
    jaxspec.generate(target, [[1, 2, 3]], **kw)
    before = jaxspec.loop.generate_program.compiles
    with count_compiles() as counts:
        for n in (9, 65, 120):
            assert len(jaxspec.generate(target, [[i % 90 for i in range(n)]], **kw).tokens[0]) >= 1
    assert counts["compiles"] == 0 and jaxspec.loop.generate_program.compiles == before
