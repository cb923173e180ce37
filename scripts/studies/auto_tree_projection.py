"""What ``gamma="auto"`` would choose between the head's chain and its trees on another backend: the policy
(``jaxspec.policy.AutoGamma``) fed with that backend's measured costs and the acceptance measured on CPU (which
carries across backends), decision after decision, as a run of calls would feed it.

    python scripts/studies/auto_tree_projection.py COSTS.jsonl HUMANEVAL.json

``COSTS.jsonl``: ``scripts/studies/device_costs.py``'s output (the ``steps`` rows' ``v_by_width`` and EAGLE-1
``c_by_gamma``, the ``loop`` rows' ``round_over_plain_step`` for ``eagle1@2`` and ``eagle1@D.B.W``);
``HUMANEVAL.json``: ``python -m jaxspec.bench --humaneval --trees ... --json`` (the ``eagle`` row at γ = 2 and the
``tree:D,B,W`` rows' ``accept_hist``). Each decision is printed; after a call of a shape, that shape's histogram
is observed (the CPU run's, as if the call had measured it). Nothing runs on a device: a projection, not a
measurement of auto itself.
"""

from __future__ import annotations

import json
import sys

from jaxspec.policy import AutoGamma, Costs

CHAIN = 2
SEQ = 8  # decisions simulated per shape


def main(costs_path: str, bench_path: str) -> None:
    rows = [json.loads(line) for line in open(costs_path)]
    bench = {r["mode"]: r for r in json.load(open(bench_path))["rows"] if r["temperature"] == 0}
    trees = tuple(tuple(int(x) for x in m.split(":")[1].split(",")) for m in bench if m.startswith("tree:"))
    hists = {CHAIN: bench["eagle"]["accept_hist"][: CHAIN + 1]}
    for t in trees:
        hists[t] = bench["tree:" + ",".join(map(str, t))]["accept_hist"][: t[0] + 1]
    for shape in dict.fromkeys(r["shape"] for r in rows if "shape" in r):
        steps = [r for r in rows if r.get("section") == "steps" and r.get("shape") == shape and "v_by_width" in r]
        loops = [
            r for r in rows if r.get("section") == "loop" and r.get("shape") == shape and "round_over_plain_step" in r
        ]
        if not steps or not loops:
            continue
        v = {int(w) - 1: x for w, x in steps[0]["v_by_width"].items() if int(w) > 1}
        measured = loops[0]["round_over_plain_step"]
        rounds = {CHAIN: measured[f"eagle1@{CHAIN}"]}
        for t in trees:
            key = "eagle1@" + ".".join(map(str, t))
            if key in measured:
                rounds[t] = measured[key]
        costs = Costs(c=steps[0]["c_by_gamma"]["eagle1"][str(CHAIN)], v=v, prefill=0.0, round=rounds)
        policy = AutoGamma(gammas=(CHAIN,), trees=tuple(t for t in trees if t in rounds), keep_costs=False)
        target, draft = object(), object()  # keys only: no model runs
        policy.set_costs(target, draft, 1, 1024, costs)
        print(
            f"{shape}: c {costs.c:.3f}, rounds (plain steps) " + ", ".join(f"{k}: {x:.2f}" for k, x in rounds.items())
        )
        chosen = []
        for _ in range(SEQ):
            d = policy.decide(target, draft, 1, 1024, 128, True, branching=True)
            plan = d.tree or d.gamma
            chosen.append(plan)
            print(f"  {'probe ' if d.probe else ''}{plan}: {d.reason}")
            hist = hists.get(plan)
            if hist:
                drafted = sum(hist) * (plan[0] if isinstance(plan, tuple) else plan)
                accepted = sum(i * n for i, n in enumerate(hist))
                policy.observe(target, draft, True, accepted, drafted, hist, tree=d.tree)
        gains = {k: round(x, 2) for k, x in d.expected_speedup.items()}
        print(f"  last expected speed-ups (128 tokens, no prefill): {gains}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
