"""gamma="auto" in an engine run (``jaxspec.generation.regamma``): a pair never measured probes with the first wave of
rows, and the run re-decides at a refill once its rows' acceptance is in: a draft that agrees with nothing goes
plain, one that agrees with everything keeps its γ (the negative control). Rows are the target's greedy tokens
either way, and a second run reuses every program the first compiled. Costs are set, and the runs' own timings
left out (a step of 0 s converts no observation), so the decisions do not depend on this machine's speed."""

import numpy as np

from jaxspec import loop
from jaxspec.generation import regamma
from jaxspec.generation.engine import Engine
from jaxspec.policy import AutoGamma, Costs

S = 64
# a round of γ = 2 costs 1.5 plain steps: the probe pays at acceptance 0.8 (τ 2.44), not at 0 (τ 1)
COSTS = Costs(c=0.1, v={2: 1.2}, prefill=0.0, round={2: 1.5})


def requests(n: int = 8) -> list[dict]:
    rng = np.random.default_rng(5)
    return [dict(prompt=rng.integers(0, 96, int(rng.integers(2, 8))).tolist(), max_new_tokens=12) for _ in range(n)]


def auto_run(target, draft, reqs):
    policy = AutoGamma(gammas=(2,), keep_costs=False)
    policy.set_costs(target, draft, 2, S, COSTS)
    run = Engine(target, draft=draft, gamma="auto", policy=policy, slots=2, max_length=S, temperature=0.0).run(reqs)
    return run, {r.index: r.tokens for r in run}, policy


def test_an_engine_run_probes_then_redecides_at_a_refill(target, unrelated_draft):
    reqs = requests()
    plain = {r.index: r.tokens for r in Engine(target, slots=2, max_length=S, temperature=0.0).run(reqs)}
    run, rows, policy = auto_run(target, unrelated_draft, reqs)
    p = run.stats.policy
    assert p["probe"] and p["gamma"] == 2  # nothing measured: the first wave speculates to measure
    assert [s["gamma"] for s in p["switches"]] == [0] and run.stats.gamma == 0  # then plain, at a refill
    assert p["switches"][0]["reason"].startswith("plain: γ=2 expected") and 0 < p["switches"][0]["sync"]
    assert rows == plain
    alpha, drafted = policy.alpha(target, unrelated_draft, True)
    assert drafted > 0 and alpha < 0.6  # the probe's rows were counted, once
    assert drafted == run.stats.drafted

    same, rows, _ = auto_run(target, target, reqs)  # negative control: a draft the target always accepts
    assert same.stats.policy["probe"] and same.stats.policy["switches"] == [] and same.stats.gamma == 2
    assert rows == plain

    compiled = loop.rounds_program.compiles, regamma.switch_program.compiles
    again, rows, _ = auto_run(target, unrelated_draft, reqs)  # the programs of both γ are reused
    assert [s["gamma"] for s in again.stats.policy["switches"]] == [0] and rows == plain
    assert (loop.rounds_program.compiles, regamma.switch_program.compiles) == compiled
    # the policy that saw the probe decides plain from the start of its next run: no probe, no switch
    kw = dict(draft=unrelated_draft, gamma="auto", policy=policy, slots=2, max_length=S, temperature=0.0)
    next_run = Engine(target, **kw).run(reqs)
    assert {r.index: r.tokens for r in next_run} == plain
    assert next_run.stats.gamma == 0 and not next_run.stats.policy["probe"] and not next_run.stats.policy["switches"]
