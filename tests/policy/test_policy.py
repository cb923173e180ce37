"""gamma="auto": the expected-speed-up formula, decisions at forced low/high α, running estimates, cost caching."""

import pytest
from helpers import count_compiles

import jaxspec
from jaxspec.policy import AutoGamma, Costs, expected_speedup, expected_tokens


def test_expected_speedup_by_hand():
    # α = 0.8, γ = 4: τ = 1 + .8 + .64 + .512 + .4096 = 3.3616; c = 0.1, v = 1.2 -> 3.3616 / 1.6 = 2.101
    assert expected_speedup(0.8, 4, 0.1, 1.2, 1000) == pytest.approx(3.3616 / 1.6, rel=1e-9)
    # prefill of the draft is paid once per call: 100 tokens, p = 5 -> 100 / (5 + 100 / 3.3616 * 1.6)
    assert expected_speedup(0.8, 4, 0.1, 1.2, 100, prefill=5) == pytest.approx(100 / (5 + 100 / 3.3616 * 1.6))
    # the target's prefill (50 steps) is paid by both modes: (50 + 100) / (50 + 5 + 100 / 3.3616 * 1.6)
    assert expected_speedup(0.8, 4, 0.1, 1.2, 100, prefill=5, target_prefill=50) == pytest.approx(
        150 / (55 + 100 / 3.3616 * 1.6)
    )
    # a round cannot emit more than the output needs: 2 tokens at α = 1 gain at most 2 / (γc + v)
    assert expected_speedup(1.0, 4, 0.1, 1.0, 2) == pytest.approx(2 / 1.4)
    assert expected_speedup(0.0, 4, 0.1, 1.0, 100) < 1  # nothing accepted: speculation is pure cost
    # per-position acceptance: 1 + .9 + .9*.5 + .9*.5*.5 = 2.575 (the textbook formula is the all-equal case)
    assert expected_tokens([0.9, 0.5, 0.5, 0.5], 3) == pytest.approx(2.575)
    assert expected_tokens([0.8] * 4, 4) == pytest.approx(3.3616)


def test_verify_is_timed_at_one_candidate_and_interpolated_from_it():
    from jaxspec.policy.timing import interpolate, verify_gammas

    # the candidate nearest the mean: (1, 2, 4, 6) -> mean 3.25 -> 4; a tie takes the larger
    assert verify_gammas((6, 1, 4, 2)) == (4,)
    assert verify_gammas((1, 2, 3, 4, 5, 6, 7, 8)) == (5,)
    assert verify_gammas((4,)) == (4,) and verify_gammas((2, 3)) == (3,)
    # v(4) between v(2) = 1.3 and v(6) = 1.9: 1.3 + 0.6 * (4 - 2) / (6 - 2) = 1.6; v(1) between v(0) = 1 and v(2)
    got = interpolate({0: 1.0, 2: 1.3, 6: 1.9}, (1, 2, 4, 6))
    assert got == pytest.approx({1: 1.15, 2: 1.3, 4: 1.6, 6: 1.9})
    assert interpolate({1: 1.2, 3: 1.2}, (1, 2, 3)) == pytest.approx({1: 1.2, 2: 1.2, 3: 1.2})
    # one timed candidate: the line through v(0) = 1 and v(4) = 1.6, beyond it too (v(6) = 1.9)
    got = interpolate({0: 1.0, 4: 1.6}, (1, 2, 4, 6))
    assert got == pytest.approx({1: 1.15, 2: 1.3, 4: 1.6, 6: 1.9})


def test_a_deep_models_passes_are_extrapolated_from_copies_of_its_first_layers(small_draft, monkeypatch):
    """A built-in model of ``EXTRAPOLATE_FROM`` layers or more is never compiled whole by the calibration: its passes
    are timed on copies with its first ``LAYER_POINTS`` layers, in turn, and extended linearly to its depth; a
    shallow model (the draft) is timed whole."""
    from helpers import tiny_config

    from jaxspec.models import llama
    from jaxspec.policy import timing

    deep = llama.init(tiny_config(num_layers=24, hidden_size=32, intermediate_size=48), seed=0, name="deep")
    compiled, timed = [], []
    monkeypatch.setattr(timing, "compile_all", lambda programs: compiled.extend(programs) or dict.fromkeys(programs))
    monkeypatch.setattr(timing, "time_sampling", lambda *args, **kwargs: 1e-3)
    monkeypatch.setattr(timing, "_step_call", lambda model, batch, cache_len, tokens, exe, prefill: (model, tokens))

    def seconds(model, tokens):  # a made-up cost, linear in depth: (1 + 0.1 n) + layers * (0.2 + 0.05 n) ms
        return 1e-3 * (1 + 0.1 * tokens + model.config.num_layers * (0.2 + 0.05 * tokens))

    def in_turn(calls, iters, skip, budget_s):
        timed.append(sorted(k for k in calls if k is not None))
        return {k: seconds(*call) for k, call in calls.items()}

    monkeypatch.setattr(timing, "_timed_in_turn", in_turn)
    costs = timing.measure_costs(deep, small_draft, 1, 64, (2, 4))
    assert costs.step_s == pytest.approx(1e-3 * (1.1 + 24 * 0.25))  # deep's whole 1-token pass, 7.1 ms
    assert costs.v[4] == pytest.approx(1e-3 * (1.5 + 24 * 0.45) / costs.step_s)  # its 5-token pass, verify_gammas
    assert costs.c == pytest.approx(seconds(small_draft, 1) / costs.step_s)
    models = {key[0] for key in compiled if key != "draw"}
    assert deep not in models and small_draft in models  # negative control: the draft is shallow, timed whole
    copies = sorted((k[0].config.num_layers, k[3]) for k in compiled if k != "draw" and k[0] is not small_draft)
    assert copies == [(1, 1), (1, 5), (4, 1), (4, 5)]  # (layers, tokens): each copy over 1 and γ+1 = 5 tokens
    assert timed.count(sorted(timing.LAYER_POINTS)) == 2  # the two copies, timed in turn, for each width

    compiled.clear()
    monkeypatch.setattr(timing, "EXTRAPOLATE_FROM", 25)  # now too shallow to extrapolate: timed whole
    timing.measure_costs(deep, small_draft, 1, 64, (2, 4))
    assert deep in {key[0] for key in compiled if key != "draw"}

    monkeypatch.undo()  # and for real: the copies compile and time
    costs = timing.measure_costs(deep, small_draft, 1, 64, (2,))
    assert costs.step_s > 0 and costs.v[2] > 0 and costs.c > 0


def test_the_calibrations_inputs_compile_nothing(small_draft):
    """The inputs the calibration times its steps and its draw on (tokens, positions, a cache, logits, keys, sampling
    settings) are built on the host: jax ops would compile a small program per shape on a first call, beside the
    steps' own compiles (on the 2-core CPU those were ~10 programs and ~4 s of compile in a first auto job). The
    negative control builds a cache the usual way, which compiles."""
    from helpers import tiny_config

    from jaxspec.models import llama
    from jaxspec.policy import timing

    model = llama.init(tiny_config(num_layers=2, hidden_size=24, intermediate_size=40), seed=0, name="fresh")
    with count_compiles() as counts:
        timing._step_args(model, 3, 48, 5)
        timing._draw_args(3, 77)
    assert counts["compiles"] == 0
    with count_compiles() as counts:
        model.init_cache(3, 47)  # shapes no test has built before
    assert counts["compiles"] > 0


def test_position_estimates_come_from_accept_histograms(target, small_draft):
    policy = AutoGamma(gammas=(1, 2, 4), prior_alpha=0.5, prior_drafts=1)
    # 10 rounds at γ=4: 2 rejected at position 1, 3 stopped at 2, 0 at 3, 1 at 4, 4 accepted everything
    policy.observe(target, small_draft, True, accepted=3 * 1 + 1 * 3 + 4 * 4, drafted=40, accept_hist=(2, 3, 0, 1, 4))
    a = policy.position_acceptance(target, small_draft, True)
    # reached/accepted per position: 10/8, 8/5, 5/5, 5/4; with the prior (0.5 weight 1) added to each
    assert a == pytest.approx(((8 + 0.5) / 11, (5 + 0.5) / 9, (5 + 0.5) / 6, (4 + 0.5) / 6))
    # correlated acceptances: τ from the positions beats the textbook formula at α = accepted ÷ drafted
    alpha = policy.alpha(target, small_draft, True)[0]
    assert expected_tokens(a, 4) > expected_tokens([alpha] * 4, 4) + 0.5


def test_policy_goes_plain_at_low_alpha_and_speculates_at_high(target, small_draft):
    policy = AutoGamma(trees=())  # chains (trees: test_auto_chooses_a_tree_and_learns_its_acceptance)
    # fixed costs (a machine's timings under load would make the decision flaky): batch bucket 1, cache bucket 64
    policy.set_costs(target, small_draft, 1, 64, Costs(c=0.1, v={g: 1.1 for g in policy.gammas}, prefill=0.5))
    kw = dict(draft=small_draft, gamma="auto", policy=policy, max_new_tokens=24, temperature=0.0)
    policy.set_alpha(target, small_draft, True, 0.02)
    low = jaxspec.generate(target, [[1, 2, 3]], **kw)
    assert low.stats.mode == "plain" and low.stats.policy["gamma"] == 0
    assert "below the margin" in low.stats.policy["reason"]
    assert low.tokens == jaxspec.generate(target, [[1, 2, 3]], max_new_tokens=24, temperature=0.0).tokens
    policy.set_alpha(target, small_draft, True, 0.97)
    high = jaxspec.generate(target, [[1, 2, 3]], **kw)
    assert high.stats.mode == "speculative" and high.stats.gamma == high.stats.policy["gamma"] >= 2
    p = high.stats.policy
    assert p["alpha"] == pytest.approx(0.97, abs=0.01) and p["c"] == 0.1 and set(p["v"]) == set(policy.gammas)
    assert max(p["expected_speedup"].values()) == p["expected_speedup"][p["gamma"]] > policy.margin
    assert high.tokens == low.tokens  # greedy: the same text either way


def test_a_long_prompt_dilutes_the_expected_gain(target, small_draft):
    """The target's prefill is paid by both modes: behind a long enough prompt a short output is not worth
    speculating on, while the same costs and acceptance speculate behind a short one (the negative control)."""
    policy = AutoGamma(gammas=(4,))
    # timed over 64 prompt tokens: the target's prefill costs 10 steps, the draft's 0.5
    costs = Costs(c=0.1, v={4: 1.1}, prefill=0.5, round={4: 1.5}, target_prefill=10.0, prefill_tokens=64)
    policy.set_costs(target, small_draft, 1, 4096, costs)
    policy.set_alpha(target, small_draft, True, 0.7)  # τ(4) = 1 + .7 + .49 + .343 + .2401 = 2.7731
    decode = 20 / 2.7731 * 1.5

    def decide(prompt_tokens):
        return policy.decide(target, small_draft, 1, 4096, 20, True, prompt_tokens=prompt_tokens)

    short = decide(8)  # 8 tokens: prefills of 1.25 and 0.0625 steps
    assert short.prefill == pytest.approx({"target": 1.25, "draft": 0.0625})
    assert short.expected_speedup[4] == pytest.approx(21.25 / (1.3125 + decode), rel=1e-3)
    assert short.gamma == 4
    long = decide(4096)  # 640 and 32 steps: (640 + 20) / (672 + 10.8) < 1
    assert long.expected_speedup[4] == pytest.approx(660 / (672 + decode), rel=1e-3)
    assert long.gamma == 0 and "below the margin" in long.reason
    # without a prompt length only the draft's (per call) prefill counts, as before
    assert decide(None).prefill == {"target": 0.0, "draft": 0.5}


def test_running_alpha_learns_from_calls(target):
    """The draft equal to the target is always accepted: the estimate moves from the prior towards 1."""
    policy = AutoGamma(gammas=(2,), prior_alpha=0.3, prior_drafts=20)  # one candidate: fewer loops to time
    first = jaxspec.generate(
        target, [[5, 6]], draft=target, gamma="auto", policy=policy, max_new_tokens=30, temperature=0.0
    )
    assert first.stats.policy["alpha"] == pytest.approx(0.3) and first.stats.policy["alpha_observed_drafts"] == 0
    if first.stats.mode == "speculative":  # at prior 0.3 the policy may or may not speculate on this CPU
        alpha, seen = policy.alpha(target, target, True)
        assert seen == first.stats.drafted > 0 and alpha > 0.3
    policy.observe(target, target, True, accepted=200, drafted=200)
    alpha, seen = policy.alpha(target, target, True)
    assert alpha > 0.85 and seen >= 200
    assert policy.alpha(target, target, False)[0] == pytest.approx(0.3)  # sampled calls keep their own estimate


def test_costs_are_measured_once(target, small_draft):
    policy = AutoGamma()
    policy.decide(target, small_draft, 1, 64, 32, True)
    with count_compiles() as counts:
        again = policy.decide(target, small_draft, 1, 64, 32, False)
    assert counts["compiles"] == 0 and again.c > 0
    lookup = policy.decide(target, jaxspec.PromptLookup(), 1, 64, 32, True)
    assert lookup.c == 0.0  # copying costs no model step


def test_auto_argument_errors(target, small_draft):
    with count_compiles() as counts:
        with pytest.raises(ValueError, match="gamma='auto' needs a draft"):
            jaxspec.generate(target, [[1]], gamma="auto")
        with pytest.raises(ValueError, match="gamma must be an int >= 1 or 'auto'"):
            jaxspec.generate(target, [[1]], draft=small_draft, gamma="fast")
        with pytest.raises(ValueError, match="policy must be a jaxspec.policy.AutoGamma"):
            jaxspec.generate(target, [[1]], draft=small_draft, gamma="auto", policy="greedy")
    assert counts["compiles"] == 0
    with pytest.raises(ValueError, match="gammas must be ints"):
        AutoGamma(gammas=(0, 2))
    with pytest.raises(ValueError, match="calibrate must be 'steps' or 'loops'"):
        AutoGamma(calibrate="never")


def test_round_costs_by_hand():
    """r(γ) from standalone steps, corrected by rounds observed in earlier calls (seconds ÷ the 10 ms step)."""
    from jaxspec.policy import round_costs

    costs = Costs(c=0.1, v={1: 1.2, 2: 1.3, 4: 1.5}, prefill=0.0, step_s=0.01)
    gammas = (1, 2, 4)
    assert round_costs(costs, gammas) == pytest.approx({1: 1.3, 2: 1.5, 4: 1.9})  # γc + v(γ)
    # γ = 2 ran at 18 ms a round (1.8 steps, 1.2× its prediction): γ = 2 as measured, the others scaled by 1.2
    assert round_costs(costs, gammas, {2: 0.018}) == pytest.approx({1: 1.56, 2: 1.8, 4: 2.28})
    # the plain loop ran at 9 ms a step: every round in units of that step
    assert round_costs(costs, gammas, {0: 0.009, 2: 0.018}) == pytest.approx({1: 1.56 / 0.9, 2: 2.0, 4: 2.28 / 0.9})
    # the nearest observed γ corrects: γ = 1 and 4 observed, γ = 2 scaled by γ = 1's factor (2.6 / 1.3)
    near = round_costs(costs, gammas, {1: 0.026, 4: 0.019})
    assert near == pytest.approx({1: 2.6, 2: 1.5 * 2.0, 4: 1.9})
    # a round observed faster than a plain step is noise: r(γ) is at least 1
    assert round_costs(costs, gammas, {0: 0.02, 2: 0.018}) == pytest.approx({1: 1.0, 2: 1.0, 4: 1.14})
    # where a verify pass costs less than a step (a GPU: v 0.86), a round may too, down to v, and no lower
    gpu = Costs(c=0.03, v={2: 0.86}, prefill=0.0, step_s=0.01)
    assert round_costs(gpu, (2,), {0: 0.01, 2: 0.0093}) == pytest.approx({2: 0.93})
    assert round_costs(gpu, (2,), {0: 0.01, 2: 0.007}) == pytest.approx({2: 0.86})
    # without the step's seconds nothing observed can be converted: the prediction stands
    assert round_costs(Costs(c=0.1, v={2: 1.3}, prefill=0.0), (2,), {2: 0.5}) == pytest.approx({2: 1.5})


def test_first_call_compiles_only_its_loop_and_later_calls_learn_its_rounds(target, small_draft):
    """gamma="auto" (calibrate="steps", the default) times standalone model steps only: a first call compiles the
    one loop it runs, and its r(γ) is predicted from the steps. A call that compiled its programs records nothing
    (a program's first run pays one-time costs); the next call of these shapes records its own loop's rounds,
    scaled by the load reference timed after it, and the call after that takes r(γ) from it (and scales the other
    γ); a plain call then sets the unit. Outputs are the target's."""
    from jaxspec import loop

    policy = AutoGamma(gammas=(1, 3), margin=0.0, trees=())  # speculate whatever this machine's timings
    policy.set_alpha(target, small_draft, True, 0.97)
    prompts = [[5, 6, 7], [9, 2]]
    kw = dict(draft=small_draft, gamma="auto", policy=policy, max_new_tokens=20, temperature=0.0)
    loops = loop.rounds_program.compiles
    first = jaxspec.generate(target, prompts, **kw)
    p = first.stats.policy
    assert loop.rounds_program.compiles - loops == 1 and first.stats.gamma == p["gamma"] > 0
    costs = policy.costs(target, small_draft, 2, 64)
    assert costs.round is None and costs.step_s > 0 and costs.sampling > 0 and costs.reference_s > 0
    s = costs.sampling  # r(γ) = (γc + v(γ) + (2γ + 1) s) / (1 + s), standalone steps and one warp-and-draw
    predicted = {x: (x * costs.c + costs.v[x] + (2 * x + 1) * s) / (1 + s) for x in (1, 3)}
    assert p["round_cost"] == pytest.approx(predicted)
    g, other = p["gamma"], 4 - p["gamma"]
    assert policy.observed_rounds(target, small_draft, 2, 64) == {}  # the first run of a fresh loop: not recorded
    second = jaxspec.generate(target, prompts, **kw).stats.policy
    assert second["round_cost"] == pytest.approx(predicted) and second["gamma"] == g
    seen = policy.observed_rounds(target, small_draft, 2, 64)
    assert set(seen) == {g} and seen[g] > 0
    third = jaxspec.generate(target, prompts, **kw).stats.policy
    measured = seen[g] / (costs.step_s * (1 + s))

    def floor(x):  # a round costs at least its verify pass, or a plain step where that pass timed cheaper
        return min(1.0, costs.v[x])

    assert third["round_cost"][g] == pytest.approx(max(measured, floor(g)))  # below that: noise
    assert third["round_cost"][other] == pytest.approx(max(predicted[other] * measured / predicted[g], floor(other)))
    policy.set_alpha(target, small_draft, True, 0.0)
    # at α = 0 no γ beats plain decoding (τ = 1, a round costs about a step or more); a margin of 2 keeps the decision
    # plain when a loaded machine times a verify pass below a step (seen once, beside a benchmark)
    policy.margin = 2.0
    loops, prefills = loop.rounds_program.compiles, loop.prefill_program.compiles
    plain = jaxspec.generate(target, prompts, **kw)
    assert plain.stats.mode == "plain" and plain.tokens == first.tokens
    # its plain programs (unless an earlier test compiled them): a call that compiled records nothing
    compiled = loop.rounds_program.compiles > loops or loop.prefill_program.compiles > prefills
    assert set(policy.observed_rounds(target, small_draft, 2, 64)) == ({g} if compiled else {0, g})
    assert jaxspec.generate(target, prompts, max_new_tokens=20, temperature=0.0).tokens == first.tokens
    assert jaxspec.generate(target, prompts, **kw).stats.mode == "plain"  # recorded
    seen = policy.observed_rounds(target, small_draft, 2, 64)
    assert set(seen) == {0, g}
    fourth = jaxspec.generate(target, prompts, **kw).stats.policy  # in units of the plain loop's step now
    assert fourth["round_cost"][g] == pytest.approx(max(seen[g] / seen[0], floor(g)))


def test_round_costs_come_from_the_compiled_loop_and_are_reused(target, small_draft):
    """calibrate="loops": gamma="auto" times the candidate loops themselves (γ = 0 is the plain step); the call
    then runs the rounds program that measurement compiled, and a second call of the same shapes compiles
    nothing. The output is the target's, whatever γ was chosen."""
    from jaxspec import loop

    policy = AutoGamma(gammas=(1, 3), calibrate="loops", trees=())
    prompts = [[5, 6, 7], [9, 2]]
    start = loop.rounds_program.compiles
    first = jaxspec.generate(
        target, prompts, draft=small_draft, gamma="auto", policy=policy, max_new_tokens=20, temperature=0.0
    )
    p = first.stats.policy
    assert set(p["round_cost"]) == {1, 3} and all(r > 0 for r in p["round_cost"].values())
    assert p["round_cost"] != {g: g * p["c"] + p["v"][g] for g in (1, 3)}  # measured, not the standalone sum
    for g in (1, 3):  # the decision is the formula with the measured round cost
        tau = min(p["tau"][g], 20)
        costs = policy.costs(target, small_draft, 2, 64)
        assert costs.prefill_tokens == 32 and costs.target_prefill > 0
        # both prefills timed over 32 prompt tokens, scaled to the positions the call's prefill reads: one chunk
        # of 64 (a cache of 64)
        big, small = costs.target_prefill * 64 / 32, costs.prefill * 64 / 32
        assert p["prefill"] == pytest.approx({"target": big, "draft": small})
        assert p["expected_speedup"][g] == pytest.approx((big + 20) / (big + small + 20 / tau * p["round_cost"][g]))
    plain = jaxspec.generate(target, prompts, max_new_tokens=20, temperature=0.0)
    assert first.tokens == plain.tokens
    compiled = loop.rounds_program.compiles
    with count_compiles() as counts:
        again = jaxspec.generate(
            target, prompts, draft=small_draft, gamma="auto", policy=policy, max_new_tokens=20, temperature=0.0
        )
    assert again.tokens == plain.tokens
    assert loop.rounds_program.compiles == compiled
    # the observed α may change the chosen γ: at most that γ's prefill compiles, never a loop
    assert counts["compiles"] <= 1
    policy.set_alpha(target, small_draft, True, 0.0)  # now plain decoding: the timed γ = 0 loop, no draft weights
    # at α = 0 no γ pays (τ = 1); a margin of 2 keeps the decision plain when a loaded machine (the test suite's other
    # worker) times a round below a plain step, as a clean-clone CI run once did
    policy.margin = 2.0
    plain_auto = jaxspec.generate(
        target, prompts, draft=small_draft, gamma="auto", policy=policy, max_new_tokens=20, temperature=0.0
    )
    assert plain_auto.stats.mode == "plain" and plain_auto.tokens == plain.tokens
    # every call ran a loop the timing compiled (γ = 0, 1, 3): a plain decision once ran the γ = 0 loop with the
    # draft's weights as an extra argument, a fourth compile
    assert loop.rounds_program.compiles - start <= 3


def test_time_rounds_counts_rounds_not_dispatch(target, small_draft):
    """Seconds per round of the compiled loop, dispatch subtracted: positive and finite for a speculative and a
    plain loop (how they compare is a speed figure: the sweep benchmark reports it, no test asserts it)."""
    from jaxspec.generation.generate import prepare
    from jaxspec.policy import time_rounds

    spec3 = prepare(target, [[1, 2]], draft=small_draft, gamma=3, max_new_tokens=40).spec
    spec0 = prepare(target, [[1, 2]], max_new_tokens=40).spec
    seconds = time_rounds({3: spec3, 0: spec0}, target.params, small_draft.params, 1, greedy=False, repeats=3)
    assert set(seconds) == {0, 3} and all(0 < s < 1 for s in seconds.values())


def test_straggler_factor_is_learned_per_batch_and_slows_the_estimate(target, small_draft):
    """A batch runs until its slowest row is done: rows of 64 tokens that took 20, 22, 25 and 30 rounds (τ =
    256 / 97) in 30 verify passes need 30 × τ / 64 = 1.237 times the mean row's rounds. With the prior of
    ``STRAGGLER_PRIOR`` (2) calls at 1, one such call counts a third of the excess and nine count 9/11. Batch 1 and
    unseen batch sizes keep 1; the expected speed-up is divided by the factor."""
    policy = AutoGamma(gammas=(2,), margin=1.0, half_life=None)
    costs = Costs(c=0.1, v={2: 1.1}, prefill=0.0, round={2: 1.3})
    for batch in (1, 4):
        policy.set_costs(target, small_draft, batch, 64, costs)
    policy.set_alpha(target, small_draft, True, 0.8)
    before = policy.decide(target, small_draft, 4, 64, 64, True)
    measured = 30 * 256 / 97 / 64

    def observe():
        policy.observe(
            target,
            small_draft,
            True,
            accepted=0,
            drafted=0,
            batch=4,
            passes=30,
            row_tokens=[64] * 4,
            row_rounds=[20, 22, 25, 30],
        )

    observe()
    assert policy.straggler(target, small_draft, True, 4) == pytest.approx(1 + (measured - 1) / 3)
    for _ in range(8):
        observe()
    assert policy.straggler(target, small_draft, True, 4) == pytest.approx(1 + (measured - 1) * 9 / 11)
    assert policy.straggler(target, small_draft, True, 1) == 1.0 and before.straggler == 1.0
    assert policy.straggler(target, small_draft, False, 4) == 1.0  # sampled calls keep their own
    after = policy.decide(target, small_draft, 4, 64, 64, True)
    assert after.straggler == pytest.approx(1.194, abs=1e-3)
    assert after.expected_speedup[2] == pytest.approx(before.expected_speedup[2] / after.straggler)
    one = policy.decide(target, small_draft, 1, 64, 64, True)
    assert one.expected_speedup[2] == pytest.approx(before.expected_speedup[2])


def test_auto_with_prompt_lookup(target):
    """gamma="auto" also decides for prompt lookup (no draft model: c = 0, the round cost is measured)."""
    policy = AutoGamma(gammas=(2,))
    res = jaxspec.generate(
        target,
        [[3, 4, 3, 4, 3]],
        draft="prompt_lookup",
        gamma="auto",
        policy=policy,
        max_new_tokens=12,
        temperature=0.0,
    )
    assert res.tokens == jaxspec.generate(target, [[3, 4, 3, 4, 3]], max_new_tokens=12, temperature=0.0).tokens
    assert res.stats.policy["c"] == 0.0 and res.stats.policy["round_cost"][2] > 0


def test_estimates_forget_and_plain_decisions_probe_again(target, small_draft):
    """A workload change after the policy settled on plain decoding: the counts age with every call, and after
    ``explore_after`` plain calls one call probes with γ; acceptance seen in the probe brings speculation back.
    A probe that finds nothing doubles the wait. Negative control: where even the optimistic acceptance cannot
    pay (a round costing 3 plain steps), no probe ever runs."""
    policy = AutoGamma(gammas=(2,), explore_after=2, half_life=2.0)
    policy.set_costs(target, small_draft, 1, 64, Costs(c=0.1, v={2: 1.1}, prefill=0.0, round={2: 1.3}))
    policy.set_alpha(target, small_draft, True, 0.05, drafts=1000)
    kinds = []
    for _ in range(8):
        d = policy.decide(target, small_draft, 1, 64, 64, True)
        kinds.append("probe" if d.probe else ("spec" if d.gamma else "plain"))
        if d.probe:
            assert d.gamma == 2 and d.reason.startswith("probe: γ=2")
            policy.observe(target, small_draft, True, accepted=0, drafted=20, accept_hist=(10, 0, 0))
    # plain, plain, probe (wait 2), then the wait doubles to 4
    assert kinds == ["plain", "plain", "probe", "plain", "plain", "plain", "plain", "probe"]
    # aged by every decision (half-life 2 calls): 1000 drafts 8 calls ago, 20 drafts 5 calls ago, 20 just now
    assert policy.alpha(target, small_draft, True)[1] == round(1000 * 0.5**4 + 20 * 0.5**2.5 + 20)
    # the workload changed: the probe accepts everything, and the next call speculates on its own
    policy.observe(target, small_draft, True, accepted=200, drafted=200, accept_hist=(0, 0, 100))
    d = policy.decide(target, small_draft, 1, 64, 64, True)
    assert d.gamma == 2 and not d.probe

    hopeless = AutoGamma(gammas=(2,), explore_after=1, half_life=2.0)
    hopeless.set_costs(target, small_draft, 1, 64, Costs(c=0.1, v={2: 1.1}, prefill=0.0, round={2: 3.0}))
    hopeless.set_alpha(target, small_draft, True, 0.05, drafts=1000)
    decisions = [hopeless.decide(target, small_draft, 1, 64, 64, True) for _ in range(10)]
    assert all(d.gamma == 0 and not d.probe for d in decisions)
    with pytest.raises(ValueError, match="explore_after"):
        AutoGamma(explore_after=0)
    with pytest.raises(ValueError, match="calibrate must be 'steps' or 'loops'"):
        AutoGamma(calibrate="never")
    with pytest.raises(ValueError, match="half_life"):
        AutoGamma(half_life=0)


def test_position_counts_from_histogram():
    from jaxspec.policy.cost import position_counts

    # 3 rounds accepted none, 2 accepted one, 1 accepted both drafts (γ = 2), counted by hand:
    # draft 1 is checked in all 6 rounds and accepted in 3; draft 2 is checked in 3 and accepted in 1.
    assert position_counts([3, 2, 1]) == ([6, 3], [3, 1])
    assert position_counts([0, 0, 0, 5]) == ([5, 5, 5], [5, 5, 5])
    assert position_counts([4]) == ([], [])  # γ = 0: no draft position


def test_step_timing_never_counts_the_warm_up_calls(monkeypatch):
    """A fresh executable's first call pays one-time costs (timing it made SmolLM2's plain step look 4x slower),
    and the next few run slower than later ones (timing them made v read 1.15-1.37 where it is 1.9): the first is
    skipped, the settling calls run untimed for WARM_S, and a long call is timed fewer times. The calls take
    their time on a virtual clock, so a loaded machine (whose sleeps overshoot) cannot move the figures."""
    import types

    from jaxspec.policy import timing
    from jaxspec.policy.timing import _timed_calls

    now = [0.0]
    monkeypatch.setattr(timing, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))
    calls = []

    def call():  # 0.3 s, then settling from 18 ms down to a steady 10 ms over ten calls
        calls.append(None)
        n = len(calls)
        now[0] += 0.3 if n == 1 else 0.01 + max(0, 10 - n) * 0.001

    # one skipped call, seven settling calls (18 .. 12 ms: 0.105 s >= WARM_S), then three timed at 11, 10, 10 ms
    assert _timed_calls(call, iters=3, skip=1, budget_s=0.25) == pytest.approx(0.010) and len(calls) == 11
    calls.clear()
    slow = lambda: (calls.append(None), now.__setitem__(0, now[0] + 0.15))  # noqa: E731
    # one skipped, one settling call (0.15 s >= WARM_S), two timed (their 0.3 s exceed the budget)
    assert _timed_calls(slow, iters=3, skip=1, budget_s=0.25) == pytest.approx(0.15) and len(calls) == 4
    calls.clear()
    monkeypatch.setattr(timing, "WARM_S", 0.0)  # negative control: without the settling calls the timing is high
    assert _timed_calls(call, iters=3, skip=1, budget_s=0.25) == pytest.approx(0.015) and len(calls) == 5


def test_prefills_are_timed_without_logits(target):
    """The loop's prefill keeps the caches alone, so XLA leaves out the LM head; the timed prefill must too (with
    logits it put an EAGLE head's prefill at 4.2 target steps instead of 0.14 for HumanEval prompts at batch 4)."""
    from jaxspec.policy import timing

    batch, tokens = 2, 8
    logits = f"[{batch},{tokens},{target.vocab_size}]"
    lowered = timing.lower_steps([(target, batch, 64, tokens, True), (target, batch, 64, tokens, False)])
    hlo = {key[4]: low.compile().as_text() for key, low in lowered.items()}
    assert logits not in hlo[True]
    assert logits in hlo[False]  # negative control: the step's program computes them
    assert timing.time_step(target, batch, 64, tokens, iters=1, prefill=True) > 0


def test_target_prefill_is_extrapolated_then_taken_from_the_calls(target, small_draft):
    """No prefill program is timed for the target: its first estimate extends its timed passes linearly (the widest
    pass plus the slope between the two widest per further token); a call's own prefill then replaces it, less the
    draft's share when it speculated."""
    from jaxspec.policy import timing

    # passes over 1, 3 and 7 tokens cost 1, 1.4 and 1.8 steps: slope 0.1 per token -> 64 tokens: 1.8 + 57 * 0.1
    assert timing.extrapolate({1: 1.0, 3: 1.4, 7: 1.8}, 64) == pytest.approx(7.5)
    assert timing.extrapolate({1: 1.0, 5: 1.4}, 5) == pytest.approx(1.4)  # no further token
    assert timing.extrapolate({1: 1.0, 5: 0.9}, 9) == pytest.approx(0.9)  # timing noise: never a falling cost

    policy = AutoGamma(gammas=(2,), keep_costs=False)
    # a step of 10 ms; prefills timed over 8 tokens: the target's 4 steps (the estimate), the draft's 0.5
    costs = Costs(c=0.1, v={2: 1.2}, prefill=0.5, target_prefill=4.0, prefill_tokens=8, step_s=0.01)
    policy.set_costs(target, small_draft, 1, 64, costs)

    def prefill(prompt_tokens=16):
        return policy.decide(target, small_draft, 1, 64, 20, True, prompt_tokens=prompt_tokens).prefill

    assert prefill() == pytest.approx({"target": 8.0, "draft": 1.0})  # the estimate, scaled to 16 tokens
    assert policy.observed_prefill(target, small_draft, 1, 64) is None
    # a speculative call's prefill over 16 tokens took 0.33 s: the draft's 1 step (0.01 s) is taken off
    policy.observe_prefill(target, small_draft, 1, 64, 2, 16, 0.33)
    assert policy.observed_prefill(target, small_draft, 1, 64) == pytest.approx(0.02)
    assert prefill() == pytest.approx({"target": 32.0, "draft": 1.0})
    assert prefill(8) == pytest.approx({"target": 16.0, "draft": 0.5})
    policy.observe_prefill(target, small_draft, 1, 64, 0, 16, 0.16)  # a plain call: the target's alone
    # the low median of the calls (0.02 and 0.01 s a token): one slow call does not move it
    assert policy.observed_prefill(target, small_draft, 1, 64) == pytest.approx(0.01)
    policy.observe_prefill(target, small_draft, 1, 64, 0, 16, 3.2)  # a call slowed by other work: 0.2 s a token
    assert policy.observed_prefill(target, small_draft, 1, 64) == pytest.approx(0.02)
    # timed while the load reference took twice its calibration time: scaled back to the calibration's load
    scaled = Costs(c=0.1, v={2: 1.2}, prefill=0.5, target_prefill=4.0, prefill_tokens=8, step_s=0.01, reference_s=1e-3)
    policy.set_costs(target, small_draft, 1, 128, scaled)
    policy.observe_prefill(target, small_draft, 1, 128, 0, 16, 0.32, reference_s=2e-3)
    assert policy.observed_prefill(target, small_draft, 1, 128) == pytest.approx(0.01)
    assert policy.observed_prefill(target, small_draft, 2, 64) is None  # other shapes learn apart

    # end to end: an auto call times its own prefill (not one that compiled its programs, as a first call of these
    # shapes in this process does, or a later one whose decision changed, e.g. to plain decoding), and the next
    # decision uses it
    live = AutoGamma(gammas=(2,), keep_costs=False)
    kw = dict(draft=small_draft, gamma="auto", policy=live, max_new_tokens=8, temperature=0.0)
    called = jaxspec.generate(target, [[5, 6, 7]], **kw).stats
    first = called.policy
    for _ in range(3):  # at most γ = 2 and plain decoding to compile
        if called.compile_time_s == 0:
            break
        assert live.observed_prefill(target, small_draft, 1, 64) is None  # a call that compiled records nothing
        called = jaxspec.generate(target, [[5, 6, 7]], **kw).stats
    assert called.compile_time_s == 0
    per_token = live.observed_prefill(target, small_draft, 1, 64)
    assert per_token > 0
    third = jaxspec.generate(target, [[5, 6, 7]], **kw).stats.policy
    step_s = live.costs(target, small_draft, 1, 64).step_s
    # the positions the prefill reads: one chunk of 64 (a cache of 64)
    assert third["prefill"]["target"] == pytest.approx(per_token * 64 / step_s)
    assert first["prefill"]["target"] != third["prefill"]["target"]


def test_costs_are_kept_across_processes(target, small_draft, tmp_path, monkeypatch):
    """keep_costs: measured costs are written to disk and a new policy (as in a new process) loads them instead of
    timing; other shapes or candidates, and an unreadable file, are measured again."""
    import jax

    from jaxspec.policy import store, timing

    first = AutoGamma(gammas=(1, 3), keep_costs=tmp_path)
    costs = first.costs(target, small_draft, 2, 64)
    files = list(tmp_path.glob("costs-*.json"))
    assert len(files) == 1 and files[0] == first.cost_path(target, small_draft, 2, 64)

    measured = []
    real = timing.measure_costs
    monkeypatch.setattr(timing, "measure_costs", lambda *a, **k: measured.append(a) or real(*a, **k))
    with count_compiles() as counts:
        again = AutoGamma(gammas=(1, 3), keep_costs=tmp_path).costs(target, small_draft, 2, 64)
    assert again == costs and not measured and counts["compiles"] == 0
    # negative controls: another batch bucket, other candidates, another draft are other files, measured
    AutoGamma(gammas=(1, 3), keep_costs=tmp_path).costs(target, small_draft, 1, 64)
    AutoGamma(gammas=(2,), keep_costs=tmp_path).costs(target, small_draft, 2, 64)
    AutoGamma(gammas=(1, 3), keep_costs=tmp_path).costs(target, jaxspec.PromptLookup(), 2, 64)
    assert len(measured) == 3 and len(list(tmp_path.glob("costs-*.json"))) == 4
    files[0].write_text('{"format": 1, "costs": {"c": "fast"}}')  # not what is expected: measured and rewritten
    assert AutoGamma(gammas=(1, 3), keep_costs=tmp_path).costs(target, small_draft, 2, 64).c > 0
    assert len(measured) == 4 and store.load(files[0], (1, 3)) is not None

    # keep_costs=True follows the compilation cache: nowhere without one (the test suite's), beside it with one
    assert AutoGamma().cost_path(target, small_draft, 2, 64) is None
    assert AutoGamma(keep_costs=False).cost_path(target, small_draft, 2, 64) is None
    saved = jax.config.jax_compilation_cache_dir
    try:
        jax.config.update("jax_compilation_cache_dir", str(tmp_path / "xla"))
        path = AutoGamma().cost_path(target, small_draft, 2, 64)
    finally:
        jax.config.update("jax_compilation_cache_dir", saved)
    assert path.parent == tmp_path / "xla" / store.SUBDIR
    # the key is what a step's time depends on: the same shapes under another name is another file
    renamed = target.replace(name="other")
    assert first.cost_path(renamed, small_draft, 2, 64) != first.cost_path(target, small_draft, 2, 64)
    with pytest.raises(ValueError, match="keep_costs must be"):
        AutoGamma(keep_costs=3)


def test_auto_chooses_a_tree_and_learns_its_acceptance(target, small_draft):
    """With passes as cheap as a step and the chain measured, ``gamma="auto"`` probes its tree: the call drafts
    trees of that shape (greedy: the same tokens as plain decoding), the policy learns the shape's acceptance
    from it, and the next call decides from that measurement. An engine run stays among chains."""
    tree = (3, 2, 3)
    policy = AutoGamma(gammas=(2,), trees=(tree,), keep_costs=False, sibling_gain=0.25)
    policy.set_costs(target, small_draft, 1, 64, Costs(c=0.1, v={2: 1.0}, prefill=0.0))
    policy.observe(target, small_draft, True, accepted=960, drafted=2000, accept_hist=(400, 240, 360))
    kw = dict(draft=small_draft, gamma="auto", policy=policy, max_new_tokens=24, temperature=0.0)
    plain = jaxspec.generate(target, [[1, 2, 3]], max_new_tokens=24, temperature=0.0).tokens
    run = jaxspec.generate(target, [[1, 2, 3]], **kw)
    p = run.stats.policy
    assert p["probe"] and tuple(p["tree"]) == tree and run.stats.gamma == 3 and run.stats.drafted > 0
    assert run.tokens == plain
    accept, measured = policy.tree_acceptance(target, small_draft, True, tree)
    assert measured and len(accept) == 3
    after = jaxspec.generate(target, [[1, 2, 3]], **kw)
    assert not after.stats.policy["probe"] and after.tokens == plain
    engine = jaxspec.Engine(target, draft=small_draft, gamma="auto", policy=policy, slots=1, temperature=0.0)
    run = engine.run([{"prompt": [1, 2, 3], "max_new_tokens": 24}])
    (row,) = list(run)
    assert run.stats.policy.get("tree") is None and run.stats.gamma == 2 and row.tokens == plain[0]
