"""gamma="auto"'s decisions from measured figures, deterministic (costs set, the load reference's timing injected):
a pair never measured probes; measured acceptance decides the next call either way; timings disturbed by other
work (a slow call, a compile, a machine whose load changed between calls) do not flip a decision. Each with a
negative control: the check the old rule (the prior alone, means of raw seconds) passed or failed."""

import dataclasses

import pytest

from jaxspec.policy import AutoGamma, Costs, expected_speedup
from jaxspec.policy import auto as auto_lib
from jaxspec.policy.cost import tree_label, tree_nodes, tree_prior

# a round of γ = 2 costs 1.9 plain steps: at the prior acceptance 0.6 (τ = 1.96) 1.03×, below the margin 1.05; at
# the probe's 0.8 (τ = 2.44) 1.28×
PROBED = Costs(c=0.1, v={2: 1.2}, prefill=0.0, round={2: 1.9})


def test_a_pair_never_measured_probes(target, small_draft):
    policy = AutoGamma(gammas=(2,), keep_costs=False)
    policy.set_costs(target, small_draft, 1, 64, PROBED)
    first = policy.decide(target, small_draft, 1, 64, 64, True)
    assert first.expected_speedup[2] == pytest.approx(1.96 / 1.9) and first.expected_speedup[2] < policy.margin
    assert first.probe and first.gamma == 2 and "no acceptance measured yet" in first.reason
    assert policy.decide(target, small_draft, 1, 64, 64, False).probe  # sampled calls: an estimate of their own
    # negative control: without probing, the prior alone decides plain (as on all 409 HumanEval calls before)
    never = AutoGamma(gammas=(2,), keep_costs=False, explore_after=None)
    never.set_costs(target, small_draft, 1, 64, PROBED)
    d = never.decide(target, small_draft, 1, 64, 64, True)
    assert d.gamma == 0 and not d.probe and "below the margin" in d.reason
    # where even acceptance 0.8 could not pay (a round of 3 steps: 2.44 / 3 < 1) the first call does not probe
    hopeless = AutoGamma(gammas=(2,), keep_costs=False)
    hopeless.set_costs(target, small_draft, 1, 64, Costs(c=0.1, v={2: 1.2}, prefill=0.0, round={2: 3.0}))
    d = hopeless.decide(target, small_draft, 1, 64, 64, True)
    assert d.gamma == 0 and not d.probe


def test_measured_acceptance_decides_the_next_call(target, small_draft):
    """After the probe, favourable acceptance makes the next call speculate (no probe), unfavourable acceptance
    sends it back to plain. Negative control: acceptance measured at the prior's level keeps it plain, so the
    speculation comes from the measurement, not from the costs."""
    policy = AutoGamma(gammas=(2,), keep_costs=False, half_life=None)
    policy.set_costs(target, small_draft, 1, 64, PROBED)
    assert policy.decide(target, small_draft, 1, 64, 64, True).probe
    # 30 probe rounds at γ = 2: 2 rejected the first draft, 3 the second, 25 accepted both
    policy.observe(target, small_draft, True, accepted=3 + 50, drafted=60, accept_hist=(2, 3, 25))
    favourable = policy.decide(target, small_draft, 1, 64, 64, True)
    assert favourable.gamma == 2 and not favourable.probe and favourable.expected_speedup[2] >= policy.margin
    policy.observe(target, small_draft, True, accepted=20, drafted=630, accept_hist=(300, 10, 5))
    unfavourable = policy.decide(target, small_draft, 1, 64, 64, True)
    assert unfavourable.gamma == 0 and not unfavourable.probe and "below the margin" in unfavourable.reason

    control = AutoGamma(gammas=(2,), keep_costs=False, half_life=None)
    control.set_costs(target, small_draft, 1, 64, PROBED)
    control.decide(target, small_draft, 1, 64, 64, True)
    control.observe(target, small_draft, True, accepted=360, drafted=1000, accept_hist=(200, 120, 180))  # 0.6, 0.6
    assert control.decide(target, small_draft, 1, 64, 64, True).gamma == 0


def _timed(policy, target, draft, monkeypatch, reference_s: float):
    """Costs with a 10 ms step and a 2 ms load reference; the reference timed after each call takes what
    ``load[0]`` says (the injected timing)."""
    costs = Costs(c=0.1, v={2: 1.2}, prefill=0.0, step_s=0.01, reference_s=0.002)
    policy.set_costs(target, draft, 1, 64, costs)
    policy.set_alpha(target, draft, True, 0.7)  # τ(2) = 1 + 0.7 + 0.49 = 2.19
    load = [reference_s]
    monkeypatch.setattr(policy, "reference_seconds", lambda *args, **kwargs: load[0])
    return load


def test_one_slow_call_or_a_compile_does_not_flip_a_decision(target, small_draft, monkeypatch):
    """A round's cost is the low median of the calls' own timings: one call slowed threefold by other work in the
    process leaves it, where the mean of the calls would have made speculation look slower than plain (the
    negative control). A call that compiled its loop is not recorded at all: recorded, its compile would put a
    round at 100 steps."""
    policy = AutoGamma(gammas=(2,), keep_costs=False)
    _timed(policy, target, small_draft, monkeypatch, 0.002)
    for _ in range(3):  # settled calls: 10 ms a plain step, 16 ms a round of γ = 2 (r = 1.6)
        assert policy.observe_call(target, small_draft, 1, 64, 0, rounds=(0.64, 64))
        assert policy.observe_call(target, small_draft, 1, 64, 2, rounds=(0.48, 30))
    before = policy.decide(target, small_draft, 1, 64, 64, True)
    assert before.gamma == 2 and before.round_cost[2] == pytest.approx(1.6)
    policy.observe_rounds(target, small_draft, 1, 64, 2, 1.44, 30)  # one call at three times the time
    after = policy.decide(target, small_draft, 1, 64, 64, True)
    assert after.gamma == 2 and after.round_cost[2] == pytest.approx(1.6)
    mean = (3 * 16 + 48) / 4 / 10  # 2.4 steps a round: the old running mean
    assert expected_speedup(0.7, 2, 0.1, 1.2, 64, round_cost=mean) < 1 < before.expected_speedup[2]

    fresh = AutoGamma(gammas=(2,), keep_costs=False)
    _timed(fresh, target, small_draft, monkeypatch, 0.002)
    assert not fresh.observe_call(target, small_draft, 1, 64, 2, rounds=(30.0, 30), fresh=True)
    assert fresh.observed_rounds(target, small_draft, 1, 64) == {}
    assert fresh.decide(target, small_draft, 1, 64, 64, True).gamma == 2  # predicted: r(2) = 0.2 + 1.2
    fresh.observe_rounds(target, small_draft, 1, 64, 2, 30.0, 30)  # negative control: the compile recorded
    assert fresh.decide(target, small_draft, 1, 64, 64, True).gamma == 0


def test_a_change_of_load_between_calls_is_scaled_out(target, small_draft, monkeypatch):
    """What collapsed gamma="auto" on a shared machine: r(γ) divided a round timed now by a plain step timed at
    another time (the calibration, an earlier plain call), so the machine's load changing in between read as a
    costlier round. Every call's timings are now scaled by a reference step timed right after its loop: rounds
    timed while the machine runs twice as slow (the reference too) give the same r(γ). Negative control: the same
    rounds recorded as measured (the old rule) make speculation look slower than plain."""
    policy = AutoGamma(gammas=(2,), keep_costs=False)
    load = _timed(policy, target, small_draft, monkeypatch, 0.002)
    for _ in range(3):  # plain calls on a quiet machine
        policy.observe_call(target, small_draft, 1, 64, 0, rounds=(0.64, 64))
    load[0] = 0.004  # the machine is twice as slow now: the reference step and the rounds alike
    for _ in range(3):
        policy.observe_call(target, small_draft, 1, 64, 2, rounds=(0.96, 30))
    d = policy.decide(target, small_draft, 1, 64, 64, True)
    assert d.round_cost[2] == pytest.approx(1.6) and d.gamma == 2

    old = AutoGamma(gammas=(2,), keep_costs=False)
    _timed(old, target, small_draft, monkeypatch, 0.002)
    for _ in range(3):
        old.observe_rounds(target, small_draft, 1, 64, 0, 0.64, 64)
        old.observe_rounds(target, small_draft, 1, 64, 2, 0.96, 30)  # not scaled: 3.2 steps a round
    d = old.decide(target, small_draft, 1, 64, 64, True)
    assert d.round_cost[2] == pytest.approx(3.2) and d.gamma == 0


def test_the_reference_is_timed_only_while_it_is_needed(target, small_draft, monkeypatch):
    """A (shapes, γ) times the load reference after each of its first ``REFERENCED`` recorded calls, then after
    every ``REFERENCE_EVERY``-th; the calls in between record nothing (their seconds alone compare with nothing)."""
    policy = AutoGamma(gammas=(2,), keep_costs=False)
    _timed(policy, target, small_draft, monkeypatch, 0.002)
    recorded = [policy.observe_call(target, small_draft, 1, 64, 2, rounds=(0.48, 30)) for _ in range(20)]
    first, every = auto_lib.REFERENCED, auto_lib.REFERENCE_EVERY
    assert recorded[:first] == [True] * first
    assert [i for i, r in enumerate(recorded) if r] == [*range(first), *range(first - 1 + every, 20, every)]
    assert policy.observe_call(target, small_draft, 1, 64, 0, rounds=(0.64, 64))  # another γ counts apart


def test_the_last_calls_gamma_stays_unless_another_is_clearly_faster(target, small_draft):
    """Two γ whose expected speed-ups differ by under ``KEEP_GAIN``: the call after one at γ = 2 keeps γ = 2 (its
    loop compiled) though γ = 4 is estimated 2 % faster; once γ = 4 is estimated ≥ 5 % faster it moves. Negative
    control: a fresh policy with the same figures picks γ = 4 (the best estimate), so the keeping is the rule's."""
    # 200 drafts at γ = 2 (0.85 accepted, blended with the prior): rounds of 2.0 and 2.8 plain steps put γ = 4
    # about 2 % ahead (1.28× against 1.30×); rounds of 2.0 and 2.5, 14 % ahead
    close = Costs(c=0.1, v={2: 1.2, 4: 1.4}, prefill=0.0, round={2: 2.0, 4: 2.8})
    hist = (10, 10, 80)

    def policy_with(costs, last=None):
        p = AutoGamma(gammas=(2, 4), keep_costs=False, half_life=None)
        p.set_costs(target, small_draft, 1, 64, costs)
        p.observe(target, small_draft, True, accepted=170, drafted=200, accept_hist=hist)
        if last is not None:
            p._batch(target, small_draft, True, 1).last_gamma = last
        return p

    fresh = policy_with(close).decide(target, small_draft, 1, 64, 256, True)
    assert fresh.gamma == 4 and 1 < fresh.expected_speedup[4] / fresh.expected_speedup[2] < auto_lib.KEEP_GAIN
    kept = policy_with(close, last=2).decide(target, small_draft, 1, 64, 256, True)
    assert kept.gamma == 2 and "kept" in kept.reason
    clear = Costs(c=0.1, v={2: 1.2, 4: 1.4}, prefill=0.0, round={2: 2.0, 4: 2.5})
    moved = policy_with(clear, last=2).decide(target, small_draft, 1, 64, 256, True)
    assert moved.gamma == 4 and moved.expected_speedup[4] >= auto_lib.KEEP_GAIN * moved.expected_speedup[2]


class _Head:
    """A drafter as the policy sees it: a key, and the γ its maker measured best (an EAGLE-3 head's is 3)."""

    def __init__(self, default_gamma):
        self.default_gamma = default_gamma


# The calibration's costs on the 2-core CPU: c 0.08, the verify pass timed over 4 tokens (v 1.38) and the others on
# the line through (0, 1): at the prior 0.6 per position γ = 2 is the best (1.39× against γ = 3's 1.34×)
CALIBRATED = Costs(c=0.08, v={1: 1.127, 2: 1.253, 3: 1.38, 4: 1.507}, prefill=0.0, step_s=0.01)
# 1000 rounds at γ = 3 accepting 0.68, 0.65, 0.68 by position (the EAGLE-3 head on HumanEval)
HEAD_HIST = (320, 238, 142, 300)


def test_the_first_probe_runs_at_the_drafters_default_gamma(target):
    """A pair never measured probes at the drafter's ``default_gamma`` (3), which measures positions 1..3, where the
    γ best at the prior (2) would leave position 3 to borrow position 2's estimate. Negative controls: a drafter
    without a default, or whose default is no candidate, probes at the γ best at the prior."""
    d = AutoGamma(gammas=(1, 2, 3, 4), keep_costs=False)
    head = _Head(3)
    d.set_costs(target, head, 1, 64, CALIBRATED)
    first = d.decide(target, head, 1, 64, 64, True)
    assert first.probe and first.gamma == 3 and "probe: γ=3" in first.reason
    assert max(first.expected_speedup, key=first.expected_speedup.get) == 2  # not the prior's choice
    for other in (_Head(None), _Head(6)):
        control = AutoGamma(gammas=(1, 2, 3, 4), keep_costs=False)
        control.set_costs(target, other, 1, 64, CALIBRATED)
        probe = control.decide(target, other, 1, 64, 64, True)
        assert probe.probe and probe.gamma == 2


def test_a_gamma_whose_loop_ran_replaces_the_last_one_at_a_smaller_gain(target):
    """γ = 3 expected 4.5 % faster than the last call's γ = 2 (rounds of 1.80 and 1.65 steps, the head's
    acceptance): where γ = 3's loop already ran at these shapes (its rounds observed) the call moves to it, since
    moving compiles nothing (``SWITCH_GAIN``). Negative control: the same round costs from the calibration alone
    (γ = 3 never ran) keep γ = 2 (``KEEP_GAIN``)."""
    head = _Head(3)

    def policy_with(observed: bool):
        p = AutoGamma(gammas=(2, 3), keep_costs=False, half_life=None)
        p.set_costs(target, head, 1, 64, dataclasses.replace(CALIBRATED, round={2: 1.65, 3: 1.80}))
        p.observe(target, head, True, accepted=1422, drafted=3000, accept_hist=HEAD_HIST)
        if observed:  # 30 rounds of each at 16.5 and 18 ms, the plain step's 10 ms
            p.observe_rounds(target, head, 1, 64, 2, 0.495, 30)
            p.observe_rounds(target, head, 1, 64, 3, 0.54, 30)
        p._batch(target, head, True, 1).last_gamma = 2
        return p

    moved = policy_with(observed=True).decide(target, head, 1, 64, 256, True)
    gain = moved.expected_speedup[3] / moved.expected_speedup[2]
    assert moved.gamma == 3 and auto_lib.SWITCH_GAIN < gain < auto_lib.KEEP_GAIN
    assert moved.round_cost == pytest.approx({2: 1.65, 3: 1.80})
    kept = policy_with(observed=False).decide(target, head, 1, 64, 256, True)
    assert kept.gamma == 2 and "kept" in kept.reason
    assert kept.expected_speedup == pytest.approx(moved.expected_speedup)


# Standalone steps put a round of γ = 3 at 3 × 0.08 + 2.3 = 2.54 plain steps; at acceptance 0.7 (τ 2.533) 1.00×
UNTIMED = Costs(c=0.08, v={3: 2.3}, prefill=0.0, step_s=0.01)


def test_a_gamma_whose_loop_ran_untimed_is_timed_before_plain_is_chosen(target, small_draft):
    """The estimate from standalone steps (1.00×) would choose plain decoding; γ = 3's loop already ran at these
    shapes, but only in a call that compiled it (not recorded), so the next call runs it again to time its rounds
    (a probe), and the measured round of 1.86 steps (SmolLM2's head at batch 4 took that where its standalone steps
    said 2.14) makes γ = 3 the choice. Negative controls: without that run, plain (no loop is compiled on the
    estimate's word); an estimate under ``MEASURE_REACH`` (a round of 3.24 steps: 0.78×), plain; a measured round
    as slow as the estimate, plain with no second probe; ``explore_after=None``, plain; a loop that compiled twice
    (released in between), plain."""

    def policy_with(costs=UNTIMED, ran: bool = True, **kw) -> AutoGamma:
        p = AutoGamma(gammas=(3,), keep_costs=False, half_life=None, **kw)
        p.set_costs(target, small_draft, 4, 64, costs)
        p.set_alpha(target, small_draft, True, 0.7)
        if ran:  # a probe's call that compiled the loop: nothing recorded
            assert not p.observe_call(target, small_draft, 4, 64, 3, rounds=(0.6, 30), fresh=True)
        return p

    policy = policy_with()
    timing = policy.decide(target, small_draft, 4, 64, 64, True)
    assert timing.expected_speedup[3] == pytest.approx(2.533 / 2.54, abs=1e-3)
    assert timing.gamma == 3 and timing.probe and "timing them" in timing.reason
    assert policy.observe_call(target, small_draft, 4, 64, 3, rounds=(30 * 0.0186, 30))
    after = policy.decide(target, small_draft, 4, 64, 64, True)
    assert after.gamma == 3 and not after.probe and after.round_cost[3] == pytest.approx(1.86)

    assert policy_with(ran=False).decide(target, small_draft, 4, 64, 64, True).gamma == 0
    dear = policy_with(dataclasses.replace(UNTIMED, v={3: 3.0})).decide(target, small_draft, 4, 64, 64, True)
    assert dear.gamma == 0 and dear.expected_speedup[3] < auto_lib.MEASURE_REACH
    slow = policy_with()
    assert slow.decide(target, small_draft, 4, 64, 64, True).probe
    assert slow.observe_call(target, small_draft, 4, 64, 3, rounds=(30 * 0.0254, 30))
    assert [slow.decide(target, small_draft, 4, 64, 64, True).gamma for _ in range(3)] == [0, 0, 0]
    assert policy_with(explore_after=None).decide(target, small_draft, 4, 64, 64, True).gamma == 0
    twice = policy_with()  # compiled twice (its programs released in between): no third compile for a timing run
    twice.observe_call(target, small_draft, 4, 64, 3, rounds=(0.6, 30), fresh=True)
    assert twice.decide(target, small_draft, 4, 64, 64, True).gamma == 0


def test_one_slow_first_batch_does_not_send_a_paying_gamma_to_plain(target, small_draft, monkeypatch):
    """The first batch of four HumanEval problems took 33 passes where its rows' mean needed 25.25 rounds (straggler
    1.31; ten such batches pooled 1.14). With the prior of ``STRAGGLER_PRIOR`` calls at 1 the factor counts a third
    of that excess (1.10), and γ = 3 (a measured round of 1.86 steps, τ 2.533) stays the choice at 1.24×. Negative
    control: without the prior the one batch's 1.31 puts it at 1.04×, below the margin: plain, which measures no
    straggling to correct it."""

    def decide():
        p = AutoGamma(gammas=(3,), keep_costs=False, half_life=None)
        p.set_costs(target, small_draft, 4, 64, UNTIMED)
        p.set_alpha(target, small_draft, True, 0.7)
        p.observe_rounds(target, small_draft, 4, 64, 3, 30 * 0.0186, 30)
        rows = dict(batch=4, passes=33, row_tokens=[64] * 4, row_rounds=[26, 33, 22, 20])
        p.observe(target, small_draft, True, accepted=0, drafted=0, **rows)
        return p.decide(target, small_draft, 4, 64, 64, True)

    kept = decide()
    assert kept.straggler == pytest.approx(1 + (33 * 256 / 101 / 64 - 1) / 3)
    assert kept.gamma == 3 and kept.expected_speedup[3] == pytest.approx(1.236, abs=1e-3)
    monkeypatch.setattr(auto_lib, "STRAGGLER_PRIOR", 0.0)
    raw = decide()
    assert raw.straggler == pytest.approx(1.307, abs=1e-3) and raw.gamma == 0


# A chain measured at 0.6 per position (1000 rounds of γ = 2): τ 1.96
CHAIN_HIST = (400, 240, 360)
TREE = (3, 2, 3)  # 2 + 2 × 3 = 8 nodes


def _tree_policy(target, draft, v: dict, **kw):
    kw.setdefault("sibling_gain", 0.25)
    p = AutoGamma(gammas=(2,), trees=(TREE,), keep_costs=False, half_life=None, **kw)
    p.set_costs(target, draft, 1, 64, Costs(c=0.1, v=v, prefill=0.0))
    p.observe(target, draft, True, accepted=960, drafted=2000, accept_hist=CHAIN_HIST)
    return p


def test_tree_round_cost_and_prior_by_hand():
    costs = Costs(c=0.1, v={4: 1.4}, prefill=0.0)
    # v along the line through (0, 1) and (4, 1.4): 2, 3 and 9 tokens (γ = 1, 2, 8) cost 1.1, 1.2, 1.8 steps;
    # the drafter's window step, its level passes over 2 then 3 nodes, the target's pass over 1 + 8 tokens
    assert costs.tree_round_cost(TREE) == pytest.approx(0.1 * (1 + 1.1 + 1.2) + 1.8)
    assert costs.round_cost(TREE) == costs.tree_round_cost(TREE)
    warped = Costs(c=0.1, v={4: 1.4}, prefill=0.0, sampling=0.01)  # 2 × 8 + 1 warps, in units of 1 + s
    assert warped.tree_round_cost(TREE) == pytest.approx((0.33 + 1.8 + 17 * 0.01) / 1.01)
    # greedy: a log-softmax and top-k at the 1 + 2 + 3 nodes whose children are chosen, an argmax at the 9 verified
    assert warped.tree_round_cost(TREE, greedy=True) == pytest.approx((0.33 + 1.8 + 0.35 * 15 * 0.01) / 1.01)
    assert warped.round_cost(TREE, True) == warped.tree_round_cost(TREE, greedy=True)
    assert warped.round_cost(4, True) == warped.round_cost(4)  # a chain draws alike at any temperature
    # depth 1 offers branch = 2 children, deeper levels min(branch, width // branch) = 1
    assert tree_prior((0.6, 0.5), TREE, 0.25) == pytest.approx((1 - 0.4 * 0.75, 0.5, 0.5))
    assert tree_prior((0.6,), (2, 4, 16), 0.5) == pytest.approx((1 - 0.4 * 0.5**3, 1 - 0.4 * 0.5**3))
    assert tree_nodes((5, 3, 6)) == 27 and tree_label((5, 3, 6)) == "tree:5,3,6"


def test_a_tree_is_probed_where_wide_passes_are_cheap_and_never_where_they_are_dear(target, small_draft):
    """Passes over 9 tokens costing what one does (an accelerator): the tree's prior (depth 1 0.7, then 0.6; τ 2.37
    for 1.3 steps, 1.82×) beats the measured chain (τ 1.96 for 1.2 steps, 1.63×) by over ``KEEP_GAIN``, so the call
    probes the tree. Then its own acceptance decides: a good one keeps it, a poor one goes back to the chain.
    Where a pass over 9 tokens costs 2.2 steps (this CPU's slope), the tree is never tried. Negative control: with
    no sibling gain in the prior (a tree no better than its chain) the cheap passes do not probe it either."""
    cheap = {2: 1.0}
    policy = _tree_policy(target, small_draft, cheap)
    d = policy.decide(target, small_draft, 1, 64, 64, True, branching=True)
    assert d.probe and d.tree == TREE and d.gamma == 3 and "never measured" in d.reason
    assert d.expected_speedup["tree:3,2,3"] == pytest.approx(2.372 / 1.3, rel=1e-3)
    assert d.expected_speedup[2] == pytest.approx(1.96 / 1.2) and d.v["tree:3,2,3"] == 1.0
    # 100 tree rounds reaching depth 3 in 60: τ 2.5 measured, so the tree stays
    policy.observe(target, small_draft, True, accepted=250, drafted=300, accept_hist=(10, 10, 20, 60), tree=TREE)
    kept = policy.decide(target, small_draft, 1, 64, 64, True, branching=True)
    assert kept.tree == TREE and not kept.probe and kept.tau["tree:3,2,3"] > 2.3
    # then 1000 rounds that mostly accept nothing: back to the chain
    policy.observe(target, small_draft, True, accepted=100, drafted=3000, accept_hist=(900, 100, 0, 0), tree=TREE)
    back = policy.decide(target, small_draft, 1, 64, 64, True, branching=True)
    assert back.tree is None and back.gamma == 2 and not back.probe
    # without branching (a drafter that cannot) trees are no candidates
    assert _tree_policy(target, small_draft, cheap).decide(target, small_draft, 1, 64, 64, True).tree is None

    dear = _tree_policy(target, small_draft, {2: 1.3})  # v(9 tokens) = 1 + 8 × 0.15 = 2.2
    d = dear.decide(target, small_draft, 1, 64, 64, True, branching=True)
    assert d.tree is None and d.gamma == 2 and not d.probe and d.expected_speedup["tree:3,2,3"] < 1

    control = _tree_policy(target, small_draft, cheap, sibling_gain=0.0)
    d = control.decide(target, small_draft, 1, 64, 64, True, branching=True)
    assert d.tree is None and d.gamma == 2 and not d.probe
