"""Prompt-lookup drafting: proposals against a brute-force reference, argument checks, and where it wins."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import VOCAB, count_compiles

import jaxspec
from jaxspec.core.sampling import SamplingParams, sample, warp
from jaxspec.drafters import ModelDrafter, PromptLookup, Proposal


def reference_propose(row: list[int], length: int, gamma: int, max_n: int, min_n: int) -> list[int]:
    """Plain-Python prompt lookup: the latest earlier occurrence of the longest matching suffix n-gram."""
    toks = row[:length]
    for n in range(max_n, min_n - 1, -1):
        if length <= n:
            continue
        suffix = toks[length - n :]
        for j in range(length - n - 1, -1, -1):  # latest window that ends before the last token
            if toks[j : j + n] == suffix:
                seg = toks[j + n : length]  # what followed, repeated if it runs out
                return [seg[k % len(seg)] for k in range(gamma)]
    return [toks[-1]] * gamma


@pytest.mark.parametrize("max_n,min_n", [(3, 1), (2, 2), (4, 2)])
def test_proposals_match_reference(max_n, min_n):
    rng = np.random.default_rng(max_n * 10 + min_n)
    lookup = PromptLookup(max_n, min_n)
    size, gamma = 40, 5
    tokens = rng.integers(0, 4, (64, size)).astype(np.int32)  # 4 symbols: matches of every length happen
    lengths = rng.integers(1, size + 1, 64).astype(np.int32)
    got = np.asarray(lookup.propose(tokens, lengths, gamma))
    drafts, found = (np.asarray(x) for x in lookup.lookup(tokens, lengths, gamma))
    np.testing.assert_array_equal(drafts, got)
    for b in range(64):
        assert got[b].tolist() == reference_propose(tokens[b].tolist(), int(lengths[b]), gamma, max_n, min_n), b
        row = tokens[b, : lengths[b]].tolist()
        windows = {tuple(row[j : j + n]) for n in range(min_n, max_n + 1) for j in range(len(row) - n)}
        has_match = any(len(row) > n and tuple(row[-n:]) in windows for n in range(min_n, max_n + 1))
        assert bool(found[b]) == has_match, b
    assert 0 < found.sum() < 64  # both cases occur


def test_bad_drafter_arguments(target):
    with pytest.raises(ValueError, match="max_ngram"):
        PromptLookup(max_ngram=0)
    with pytest.raises(ValueError, match="min_ngram \\(3\\) > max_ngram \\(2\\)"):
        PromptLookup(max_ngram=2, min_ngram=3)
    with pytest.raises(ValueError, match="abstain"):
        PromptLookup(abstain="yes")
    with count_compiles() as counts:
        with pytest.raises(TypeError, match="draft must be a jaxspec.CausalLM, 'prompt_lookup'"):
            jaxspec.generate(target, [[1, 2]], draft="prompt-lookup")
    assert counts["compiles"] == 0


def test_lookup_beats_a_random_draft_on_repetitive_text(target, small_draft):
    """Where the output repeats its context (a random tiny model's greedy output falls into loops), copying is
    accepted far more often than an unrelated draft model's guesses (~0.1 vs ~0.001 here)."""
    rng = np.random.default_rng(1)
    prompts = [np.tile(rng.integers(0, 96, 6), 4).tolist() for _ in range(6)]
    kw = dict(max_new_tokens=48, temperature=0.0, gamma=4)
    lookup = jaxspec.generate(target, prompts, draft=jaxspec.PromptLookup(3, 1), **kw)
    model = jaxspec.generate(target, prompts, draft=small_draft, **kw)
    assert lookup.tokens == jaxspec.generate(target, prompts, **kw).tokens
    assert lookup.stats.acceptance_rate > max(0.05, 10 * model.stats.acceptance_rate)
    assert lookup.stats.tokens_per_round > 1.3 > model.stats.tokens_per_round


def test_lookup_abstains_where_it_finds_no_ngram(target):
    """Without a match a row proposes nothing; a round in which no row proposes is a plain step (one target
    pass over one token), counted in ``rounds`` but not in ``drafted`` or the histogram. Output is unchanged, and
    the drafter that verifies its fallback proposals instead (``abstain=False``) is the negative control: every
    one of its rounds verifies."""
    rng = np.random.default_rng(2)
    prompts = [rng.permutation(VOCAB)[:8].tolist(), np.tile(rng.integers(0, VOCAB, 5), 3).tolist()]
    kw = dict(max_new_tokens=24, temperature=0.0, gamma=3)
    plain = jaxspec.generate(target, prompts, **kw)
    runs = {}
    for batch in ([prompts[0]], prompts):
        runs[len(batch)] = by_abstain = {
            abstain: jaxspec.generate(target, batch, draft=PromptLookup(3, 2, abstain=abstain), **kw)
            for abstain in (True, False)
        }
        for run in by_abstain.values():
            assert run.tokens == plain.tokens[: len(batch)]
        verified = {a: sum(sum(row.accept_hist) for row in run.stats.rows) for a, run in by_abstain.items()}
        assert verified[False] == by_abstain[False].stats.rounds  # the control: every round verified
        assert by_abstain[False].stats.drafted == 3 * verified[False]
        assert 0 < verified[True] < by_abstain[True].stats.rounds  # plain steps where no row had a match
        assert by_abstain[True].stats.drafted == 3 * verified[True]
    # the repeating prompt matches from its first round, so beside it the non-repeating prompt verifies in every
    # round where the other is running; alone it abstains more often
    alone, beside = runs[1][True].stats.rows[0], runs[2][True].stats.rows[0]
    assert sum(alone.accept_hist) / alone.rounds < sum(beside.accept_hist) / beside.rounds


# --------------------------------------------------------------------------------------------- the protocol


@dataclasses.dataclass(frozen=True)
class BigramDrafter(jaxspec.Drafter):
    """A drafter written outside the package: samples each draft from a [V, V] table of bigram logits (its
    weights, passed in traced as ``params``), warped like the target; no state."""

    params: object = dataclasses.field(default=None, compare=False)
    name: str = "bigram"

    def draft(self, params, state, tokens, length, sampling, keys, vocab_size):
        rows = jnp.arange(tokens.shape[0])
        tok = tokens[rows, length - 1]
        drafts, qs = [], []
        for i in range(keys.shape[1]):
            q = warp(params["table"][tok], sampling)
            tok = jax.vmap(sample)(keys[:, i], q)
            drafts.append(tok)
            qs.append(q)
        bad = jnp.zeros((tokens.shape[0],), bool)
        return Proposal(jnp.stack(drafts, axis=1), jnp.stack(qs, axis=1), state, bad)


def test_a_new_drafter_plugs_in_without_touching_the_loop(target):
    """A ``Drafter`` subclass defined here drives the loop (``generate``; the engine runs the same loop): greedy
    output equals plain decoding,
    its drafts are accepted (its table holds the transitions of the plain output), and new weights do not
    recompile."""
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, VOCAB, 5).tolist() for _ in range(3)]
    kw = dict(max_new_tokens=12, temperature=0.0, gamma=3)
    plain = jaxspec.generate(target, prompts, **kw).tokens
    table = np.zeros((VOCAB, VOCAB), np.float32)
    for p, out in zip(prompts, plain):
        seq = p + out
        table[seq[:-1], seq[1:]] = 10.0
    drafter = BigramDrafter(params={"table": jnp.asarray(table)})
    got = jaxspec.generate(target, prompts, draft=drafter, **kw)
    assert got.tokens == plain
    assert got.stats.acceptance_rate > 0.3
    other = BigramDrafter(params={"table": jnp.asarray(np.zeros_like(table))})
    with count_compiles() as counts:
        again = jaxspec.generate(target, prompts, draft=other, **kw)
    assert counts["compiles"] == 0 and again.tokens == got.tokens


# --------------------------------------------------------------------------------------------- LookupFirst


def _lookup_rounds(row) -> int:
    """A row's rounds that verified copied drafts: only rows verified over all γ drafts enter the histogram."""
    return sum(row.accept_hist)


@pytest.mark.parametrize("draft_gamma", [1, 2])
def test_lookup_first_copies_where_it_matches_and_drafts_elsewhere(target, perturbed_draft, draft_gamma):
    """Greedy output equals plain decoding, alone and beside other rows; rounds of both kinds happen; each row
    counts γ drafts per copied round and the fallback's γ per other round (rows that differ in drafts within
    one verify pass); the negative control, the draft model alone, verifies γ drafts every round."""
    rng = np.random.default_rng(5)
    prompts = [np.tile(rng.integers(0, VOCAB, 5), 3).tolist(), rng.permutation(VOCAB)[:9].tolist(), [7, 8]]
    kw = dict(max_new_tokens=32, temperature=0.0, gamma=3)
    plain = jaxspec.generate(target, prompts, **kw).tokens
    drafter = jaxspec.LookupFirst(perturbed_draft, draft_gamma=draft_gamma)
    fallback_gamma = draft_gamma
    assert drafter.verify_widths(3) == (draft_gamma, 3)
    assert jaxspec.LookupFirst(perturbed_draft).fallback_gamma(3) == 3  # its default γ (4), capped at the call's
    for batch in (prompts[:1], prompts):
        got = jaxspec.generate(target, batch, draft=drafter, **kw)
        assert got.tokens == plain[: len(batch)]
        for row in got.stats.rows:
            copied = _lookup_rounds(row)
            assert row.drafted == 3 * copied + fallback_gamma * (row.rounds - copied)
        assert sum(_lookup_rounds(r) for r in got.stats.rows) > 0
        assert 0 < got.stats.accepted < got.stats.drafted
    assert any(_lookup_rounds(r) < r.rounds for r in got.stats.rows)  # rows drafted by the model too
    alone = jaxspec.generate(target, prompts, draft=perturbed_draft, **kw).stats
    assert all(r.drafted == 3 * r.rounds == 3 * sum(r.accept_hist) for r in alone.rows)


def test_lookup_first_with_an_eagle_head_equals_plain(target):
    from jaxspec.drafters import eagle
    from jaxspec.models import eagle as eagle_model

    cfg = eagle_model.head_config(target.config)
    head = eagle.EagleDrafter.for_target(target, eagle_model.init_own(cfg, seed=1), config=cfg, name="head")
    rng = np.random.default_rng(6)
    prompts = [np.tile(rng.integers(0, VOCAB, 4), 4).tolist(), rng.permutation(VOCAB)[:7].tolist()]
    kw = dict(max_new_tokens=24, temperature=0.0)
    drafter = jaxspec.LookupFirst(head)
    assert drafter.features and drafter.params is head.params and drafter.name == "lookup+head"
    got = jaxspec.generate(target, prompts, draft=drafter, **kw)  # γ: LookupFirst's default 4, the head's 2
    plain = jaxspec.generate(target, prompts, **kw).tokens
    assert got.tokens == plain
    assert got.stats.gamma == 4
    assert any(0 < _lookup_rounds(r) < r.rounds for r in got.stats.rows)
    # the engine (slots refilled as rows finish, the head's state inserted per slot) runs the same drafter
    engine = jaxspec.Engine(target, draft=drafter, slots=2, **kw)
    rows = sorted(engine.run(prompts * 2), key=lambda r: r.index)
    assert [r.tokens for r in rows] == plain * 2
    assert sum(_lookup_rounds(r.stats) for r in rows) > 0


def test_lookup_first_arguments_are_checked_before_compiling(target, small_draft):
    for bad, match in [
        (dict(drafter="prompt_lookup"), "LookupFirst\\(drafter=...\\)"),
        (dict(drafter=jaxspec.PromptLookup()), "LookupFirst\\(drafter=...\\)"),
        (dict(drafter=small_draft, lookup="x"), "LookupFirst\\(lookup=...\\)"),
        (dict(drafter=small_draft, draft_gamma=0), "LookupFirst\\(draft_gamma=...\\)"),
    ]:
        with pytest.raises(ValueError, match=match):
            jaxspec.LookupFirst(**bad)
    with count_compiles() as counts:
        with pytest.raises(ValueError, match="gamma='auto' is not supported with a LookupFirst"):
            jaxspec.generate(target, [[1, 2]], draft=jaxspec.LookupFirst(small_draft), gamma="auto")
    assert counts["compiles"] == 0


@pytest.mark.parametrize("catch_up", [True, False])
def test_a_draft_model_catches_up_on_a_long_round(target, small_draft, catch_up):
    """After a round that verified more tokens than γ+1 (a copied round of ``LookupFirst``), the draft model's first
    draft must still come from its cache over every verified token: equal to the model run over the whole
    sequence. ``catching_up`` makes its first step feed them; without it (the negative control) the draft's cache
    misses tokens and its q differs."""
    seq = jnp.asarray([[7, 3, 9, 12, 40, 41, 5, 6, 88, 2, 17, 23, 54, 33, 60, 61, 62, 9, 9, 1, 4, 8]])
    size, gamma, longest = 32, 2, 4  # rounds of up to 4 accepted + 1 = 5 new tokens, the drafter drafts 2
    positions = jnp.arange(seq.shape[1])[None]
    full, _ = small_draft.apply_fn(small_draft.params, seq, positions, small_draft.init_cache(1, size))
    drafter = ModelDrafter.of(small_draft)
    if catch_up:
        drafter = drafter.catching_up(longest + 1)
    tokens = jnp.zeros((1, size), jnp.int32).at[:, : seq.shape[1]].set(seq)
    length = 5
    state = drafter.prefill(small_draft.params, seq[:, :length], positions[:, :length], drafter.init_state(1, size))
    sampling = SamplingParams.create(1.0, batch=1)
    keys = jax.random.split(jax.random.key(0), gamma)[None]
    errors, draft = [], jax.jit(drafter.draft, static_argnums=6)  # one compile, not op by op
    for accepted in (4, 0, 4, 2, 4):
        proposal = draft(small_draft.params, state, tokens, jnp.asarray([length]), sampling, keys, VOCAB)
        want = jax.nn.softmax(full[0, length - 1])
        errors.append(float(jnp.max(jnp.abs(proposal.q[0, 0] - want))))
        state = proposal.state
        length += accepted + 1
    if catch_up:
        assert max(errors) < 2e-6, errors
    else:
        assert max(errors) > 1e-3, errors
