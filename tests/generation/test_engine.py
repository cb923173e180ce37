"""Continuous batching (``jaxspec.Engine``): every request's output equals ``generate`` on that prompt alone (same
seed, same cache length), whatever slot it ran in and whenever it was inserted; refills after EOS, after
``max_new_tokens`` and at the cache end; no recompilation across refills or runs; a mesh run equals one device;
bad requests fail before anything compiles; ``gamma="auto"`` compiles only the loop it runs."""

import numpy as np
import pytest
from helpers import VOCAB, count_compiles, resized

import jaxspec
from jaxspec.generation.engine import Engine

S = 64  # every slot's cache length (generate gets the same max_length)
GAMMA = 3


def requests_of(n: int, seed: int = 0) -> list[dict]:
    """``n`` requests with prompts of 1..8 tokens (one prompt bucket) and mixed ``max_new_tokens``."""
    rng = np.random.default_rng(seed)
    return [
        dict(prompt=rng.integers(0, VOCAB, int(rng.integers(1, 9))).tolist(), max_new_tokens=int(rng.integers(1, 24)))
        for _ in range(n)
    ]


def alone(target, draft, req: dict, **kw):
    """``generate`` on the one prompt of ``req`` (its own seed when it has one)."""
    seed = [req["seed"]] if "seed" in req else kw.pop("seed", 0)
    params = {k: req[k] for k in ("temperature", "top_k", "top_p", "eos_token_id") if k in req}
    kw = {**kw, **params}
    return jaxspec.generate(
        target,
        [req["prompt"]],
        draft=draft,
        gamma=GAMMA,
        max_new_tokens=req["max_new_tokens"],
        max_length=S,
        seed=seed,
        **kw,
    )


# a draft model with fewer ids than the target covers the draft model's path and the vocabulary mapping at once
@pytest.mark.parametrize("drafter", ["plain", "lookup", "model-smaller-vocab"])
def test_greedy_rows_equal_generate_alone(target, perturbed_draft, drafter):
    draft = {"plain": None, "model": perturbed_draft, "lookup": "prompt_lookup"}.get(drafter)
    if drafter == "model-smaller-vocab":  # ids 80..95 have no row in the draft's table
        draft = resized(perturbed_draft, VOCAB - 16)
    reqs = requests_of(10)
    run = Engine(target, draft=draft, gamma=GAMMA, slots=4, max_length=S, temperature=0.0).run(reqs)
    got = list(run)
    assert sorted(r.index for r in got) == list(range(10))  # every request once
    for r in got:
        ref = alone(target, draft, reqs[r.index], temperature=0.0)
        assert r.tokens == ref.tokens[0], r.index
        assert r.finish_reason == ref.finish_reasons[0]
        np.testing.assert_allclose(r.logprobs, ref.logprobs[0], atol=1e-5)
        assert r.stats.generated_tokens == len(r.tokens) == ref.stats.rows[0].generated_tokens
    assert {r.slot for r in got} == set(range(4))  # slots were reused
    stats = run.stats
    assert stats.rows == 10 and stats.refills >= 3 and 0 < stats.occupancy <= 1
    assert stats.generated_tokens == sum(len(r.tokens) for r in got)
    assert stats.row_rounds == sum(r.stats.rounds for r in got) <= stats.rounds * 4
    assert sum(r.wall_time_s for r in got) == pytest.approx(stats.wall_time_s, rel=1e-6)
    verified = sum(sum(r.stats.accept_hist) for r in got)
    if drafter.startswith("model"):
        assert stats.drafted == GAMMA * stats.row_rounds == GAMMA * verified
    elif drafter == "lookup":  # rounds in which no slot had an n-gram match were plain steps
        assert stats.drafted == GAMMA * verified and 0 < verified < stats.row_rounds


def test_sampled_mixed_rows_equal_generate_alone(target, perturbed_draft):
    """Per-request seeds and sampling parameters (greedy, plain T, top-k, top-p rows in one run)."""
    settings = [dict(temperature=0.0), dict(temperature=1.0), dict(temperature=0.8, top_k=5), dict(top_p=0.7)]
    reqs = [dict(r, seed=100 + i, **settings[i % 4]) for i, r in enumerate(requests_of(8, seed=1))]
    got = list(Engine(target, draft=perturbed_draft, gamma=GAMMA, slots=3, max_length=S).run(reqs))
    assert sorted(r.index for r in got) == list(range(8))
    for r in got:
        assert r.tokens == alone(target, perturbed_draft, reqs[r.index]).tokens[0], r.index


def test_default_seed_is_generate_over_all_requests(target):
    """Without per-request seeds, request i draws as row i of one ``generate`` call over all of them (sampled,
    plain decoding: the cheapest programs)."""
    reqs = requests_of(4, seed=2)
    engine = Engine(target, slots=2, max_length=S, schedule="fifo", seed=5)
    got = {r.index: r for r in engine.run(reqs)}
    ref = jaxspec.generate(
        target,
        [r["prompt"] for r in reqs],
        max_new_tokens=[r["max_new_tokens"] for r in reqs],
        max_length=S,
        seed=5,
    )
    assert [got[i].tokens for i in range(4)] == ref.tokens


def test_refills_after_eos_length_and_cache_end(target, perturbed_draft):
    """Two slots, requests that end by EOS, by ``max_new_tokens`` and at the cache end; the requests inserted into
    the freed slots after each are still exact."""
    probe = requests_of(1, seed=3)[0]
    first = alone(target, perturbed_draft, dict(probe, max_new_tokens=6), temperature=0.0).tokens[0]
    eos = first[3]
    rng = np.random.default_rng(4)
    long_prompt = rng.integers(0, VOCAB, S - 5).tolist()
    reqs = [
        dict(probe, max_new_tokens=20, eos_token_id=eos),  # EOS at its 4th token (or earlier)
        dict(prompt=[1, 2, 3], max_new_tokens=5),  # max_new_tokens
        dict(prompt=long_prompt, max_new_tokens=40),  # the cache end: 5 slots left
        *requests_of(5, seed=5),
    ]
    got = {
        r.index: r
        for r in Engine(target, draft=perturbed_draft, gamma=GAMMA, slots=2, max_length=S, temperature=0.0).run(reqs)
    }
    assert [got[i].finish_reason for i in range(3)] == ["eos", "length", "cache"]
    assert got[0].tokens[-1] == eos and len(got[2].tokens) == 5
    for i, req in enumerate(reqs):
        assert got[i].tokens == alone(target, perturbed_draft, req, temperature=0.0).tokens[0], i


def test_queued_straggler_counts_only_rounds_while_requests_wait(target):
    """Two slots, three requests, plain decoding: while the third waits, the loop runs until a row finishes
    (``refill_at=1``), both slots busy every round, so the queued straggler factor is exactly 1 and its rounds are
    the shorter first row's; with ``refill_at=2`` the loop waits for both rows, the shorter one's slot idles, and
    the queued factor exceeds 1 by exactly that idle time. The drain after the queue empties is counted in
    ``straggler_factor`` only."""
    reqs = [dict(prompt=[1, 2, 3], max_new_tokens=12), dict(prompt=[4, 5], max_new_tokens=3)]
    reqs.append(dict(prompt=[6, 7, 8, 9], max_new_tokens=4))
    for refill_at in (1, 2):
        engine = Engine(target, slots=2, max_length=S, temperature=0.0, refill_at=refill_at, schedule="fifo")
        run = engine.run(reqs)
        got = {r.index: r.stats.rounds for r in run}
        s = run.stats
        short, long_ = sorted((got[0], got[1]))
        assert short < long_ and s.row_rounds == sum(got.values())
        if refill_at == 1:
            assert s.queued_rounds == short and s.queued_row_rounds == 2 * short
            assert s.queued_straggler_factor == 1.0
        else:
            assert s.queued_rounds == long_ and s.queued_row_rounds == short + long_
            assert s.queued_straggler_factor == pytest.approx(2 * long_ / (short + long_)) and long_ > short
        assert s.rounds >= s.queued_rounds and s.straggler_factor >= 1.0


def test_no_recompilation_across_refills_and_runs(target, perturbed_draft):
    """Programs compile once per batch (prefill of k rows, rounds at B) or pair of batches (insert, resize), never
    per refill; a later run whose requests differ only in values (prompt ids, seeds, temperature, top-k, top-p)
    compiles nothing."""
    engine = Engine(target, draft=perturbed_draft, gamma=GAMMA, slots=4, max_length=S, temperature=0.0)
    with count_compiles() as counts:
        run = engine.run(requests_of(12, seed=6))
        assert len(list(run)) == 12
    stats = run.stats
    widths = engine.widths
    assert widths == (1, 2, 4)
    allowed = {f"{p}[{w}]" for p in ("prefill", "rounds") for w in widths}
    allowed |= {f"insert[{w}<-{k}]" for w in widths for k in widths if k <= w}
    allowed |= {f"resize[{a}->{b}]" for a in widths for b in widths if a != b}
    assert set(stats.compiles) <= allowed, stats.compiles
    # each of those programs compiled at most once (one another test compiled already comes back from jax's own
    # cache: no backend compile), and fewer of them than the program calls
    assert counts["compiles"] <= len(stats.compiles) < stats.refills + stats.resizes + stats.syncs
    plain = Engine(target, slots=4, max_length=S, temperature=0.0)
    reqs = requests_of(9, seed=7)
    list(plain.run(reqs))
    rng = np.random.default_rng(0)
    values = [0.0, 0.5, 1.2]
    other = [
        dict(
            r,
            prompt=rng.integers(0, VOCAB, len(r["prompt"])).tolist(),
            temperature=values[i % 3],
            seed=i,
            top_k=i % 4,
            top_p=[1.0, 0.9][i % 2],
        )
        for i, r in enumerate(reqs)
    ]
    with count_compiles() as counts:
        run = plain.run(other)
        assert len(list(run)) == 9
    assert counts["compiles"] == 0 and run.stats.compile_time_s == 0 and run.stats.refills >= 3


def test_mesh_run_equals_one_device(target, perturbed_draft):
    reqs = requests_of(6, seed=8)
    kw = dict(draft=perturbed_draft, gamma=GAMMA, slots=4, max_length=S, temperature=0.0)
    one = {r.index: r.tokens for r in Engine(target, **kw).run(reqs)}
    mesh = {r.index: r.tokens for r in Engine(target, mesh={"data": 2, "model": 4}, **kw).run(reqs)}
    assert mesh == one


def test_bad_requests_fail_before_compiling(target):
    engine = Engine(target, slots=2, max_length=S)
    cases = [
        ([], "requests is empty"),
        ([dict(prompt=[1], temperature=-1.0)], r"temperature\[0\]"),
        ([[1], dict(prompt=[1], top_p=0.0)], r"top_p\[1\]"),
        ([dict(prompt=[1], top_k=-2)], r"top_k\[0\]"),
        ([dict(prompt=[1], colour="red")], r"requests\[0\] has unknown keys \['colour'\]"),
        ([dict(max_new_tokens=3)], r'requests\[0\] has no "prompt"'),
        ([[1], [2], dict(prompt=[1], eos_token_id=VOCAB)], r"requests\[2\]\.eos_token_id"),
        ([dict(prompt=[VOCAB + 1])], r"outside the vocabulary"),
        ([dict(prompt=list(range(S)))], "does not fit max_length"),
        ([dict(prompt=[1], max_new_tokens=0)], "max_new_tokens"),
    ]
    with count_compiles() as counts:
        for reqs, message in cases:
            with pytest.raises(ValueError, match=message):
                engine.run(reqs)
        with pytest.raises(ValueError, match="slots must be an int >= 1"):
            Engine(target, slots=0)
        with pytest.raises(ValueError, match="schedule must be 'longest_first' or 'fifo'"):
            Engine(target, schedule="random")
        with pytest.raises(ValueError, match="temperature"):
            Engine(target, temperature=-1)
    assert counts["compiles"] == 0


def test_auto_gamma_compiles_only_its_loop_and_learns_its_rounds(target, perturbed_draft, monkeypatch):
    """gamma="auto" in the engine: the standalone-step calibration compiles no loop but the one the run uses
    (calibrate="loops" would add the plain one), the rows are the target's greedy tokens, and the run's own
    rounds and acceptance are fed back to the policy for the next run of these shapes."""
    from jaxspec import loop
    from jaxspec.loop import executables, programs

    policy = jaxspec.policy.AutoGamma(gammas=(GAMMA,), margin=0.0)  # speculate whatever this machine's timings
    policy.set_alpha(target, perturbed_draft, True, 0.97)
    reqs = requests_of(7, seed=3)
    compiled = []  # the (spec, argument signature, batch) of every rounds program lowered for a compile
    lower = loop.rounds_program.lower

    def recording_lower(spec, *args):
        compiled.append((spec, programs._signature(args), args[2].done.shape[0]))
        return lower(spec, *args)

    monkeypatch.setattr(loop.rounds_program, "lower", recording_lower)
    kw = dict(slots=5, max_length=S, temperature=0.0)  # 5 slots: shapes no other test compiles
    run = Engine(target, draft=perturbed_draft, gamma="auto", policy=policy, **kw).run(reqs)
    got = {r.index: r.tokens for r in run}
    assert run.stats.gamma == run.stats.policy["gamma"] == GAMMA
    # the loop program of the chosen γ, at each batch the run decoded at (5, then fewer as rows finish), and no
    # other; the same one compiled again counts once (a long test process can reach the bounds on kept
    # executables, jaxspec.loop.executables, which release least recently used ones: time, never a wrong result)
    assert {spec.gamma for spec, *_ in compiled} == {GAMMA}, (len(compiled), executables.map_pressure())
    batches = [batch for *_, batch in compiled]
    assert 5 in batches and set(batches) <= set(run.stats.widths)
    assert len(set(compiled)) == len(set(batches))  # one program per batch
    assert got == {r.index: r.tokens for r in Engine(target, **kw).run(reqs)}
    # set_alpha's 10 000 drafts aged by one decision (half-life 8 calls), plus the run's own
    assert policy.alpha(target, perturbed_draft, True)[1] == round(10_000 * 0.5 ** (1 / 8) + run.stats.drafted)
    # a width's rounds are recorded from a call that did not compile its program (a first run pays one-time
    # costs); whether this run reached a second count at width 5 depends on when its rows finished, so a second
    # run, which compiles nothing, is what must feed them back
    again = Engine(target, draft=perturbed_draft, gamma="auto", policy=policy, **kw).run(reqs)
    assert {r.index: r.tokens for r in again} == got
    seen = policy.observed_rounds(target, perturbed_draft, 5, S)
    assert set(seen) == {GAMMA} and seen[GAMMA] > 0


def test_the_loop_runs_at_the_smallest_batch_holding_the_rows(target, perturbed_draft, monkeypatch):
    """Three requests on 16 slots decode as a batch of 4; as rows finish and nothing waits the rows left move to
    batches of 2 and 1 (every rounds call runs at the smallest width holding its running rows). The rows are
    generate's, and a second run of other prompts (other lengths, other prefill chunk counts) compiles nothing."""
    from jaxspec import loop

    calls = []  # (batch, running rows) of every rounds-program call
    rounds_program = loop.rounds_program

    def recording(spec, tparams, dparams, state, *args):
        calls.append((state.done.shape[0], int(np.sum(~np.asarray(state.done)))))
        return rounds_program(spec, tparams, dparams, state, *args)

    monkeypatch.setattr(loop, "rounds_program", recording)
    engine = Engine(target, draft=perturbed_draft, gamma=GAMMA, slots=16, max_length=S, temperature=0.0)
    assert engine.widths == (1, 2, 4, 8, 16) and engine.width(3) == 4
    rng = np.random.default_rng(11)
    # rows that cannot finish in the same round: at most 2, at least 3 (10 / (γ + 1)) and at least 12 rounds
    reqs = [dict(prompt=rng.integers(0, VOCAB, n).tolist(), max_new_tokens=m) for n, m in ((3, 2), (40, 10), (7, 45))]
    run = engine.run(reqs)
    got = {r.index: r for r in run}
    for i, req in enumerate(reqs):
        assert got[i].tokens == alone(target, perturbed_draft, req, temperature=0.0).tokens[0], i
    assert calls[0] == (4, 3) and calls[-1] == (1, 1)
    assert all(batch == engine.width(running) for batch, running in calls), calls
    assert {batch for batch, _ in calls} == set(run.stats.widths) == {4, 2, 1}
    assert run.stats.resizes == 2 and run.stats.slot_rounds == sum(w * n for w, n in run.stats.widths.items())
    assert run.stats.occupancy > 0.5  # at 16 slots it would be under 3/16
    other = [dict(prompt=rng.integers(0, VOCAB, n).tolist(), max_new_tokens=m) for n, m in ((50, 2), (2, 10), (15, 45))]
    with count_compiles() as counts:
        assert len(list(engine.run(other))) == 3
    assert counts["compiles"] == 0


def test_string_requests_get_the_chat_template(target):
    """``chat`` defaults to on when the tokenizer has a chat template, in the engine as in ``generate``: a string
    request decodes as its templated ids; ``chat=False`` encodes the text alone."""
    from helpers import tiny_hf_tokenizer

    tok = tiny_hf_tokenizer()
    tok.chat_template = (
        "{% for m in messages %}<eos>{{ m['content'] }}<eos>{% endfor %}{% if add_generation_prompt %}def{% endif %}"
    )
    model = target.replace(tokenizer=tok)
    kw = dict(slots=2, max_length=S, temperature=0.0, max_new_tokens=6)
    templated, raw = tok.encode("<eos>x + 1<eos>def"), tok.encode("x + 1")
    assert templated != raw
    ids = {r.index: r.tokens for r in Engine(model, **kw).run([templated, raw])}
    chat = {r.index: r.tokens for r in Engine(model, **kw).run(["x + 1", {"prompt": "x + 1"}])}
    assert chat == {0: ids[0], 1: ids[0]}
    plain = next(iter(Engine(model, chat=False, **kw).run(["x + 1"])))
    assert plain.tokens == ids[1]
    assert jaxspec.generate(model, ["x + 1"], max_length=S, temperature=0.0, max_new_tokens=6).tokens == [ids[0]]
    with pytest.raises(ValueError, match="chat"):
        Engine(model, chat="yes")
