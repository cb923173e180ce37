"""``--sweep``: batch sizes × {plain, γ fixed, auto} on the shipped pair (held-out prompts), with a table and a PNG.

Every batch size generates the same pool of prompts: the held-out prompts cycled to a multiple of the largest
batch size (64 rows by default: each of the 24 prompts two or three times), in calls of B rows each,
``--max-new-tokens`` each (so every batch size measures the same prompts, batch 1 included).
A warm-up pass over the pool per mode compiles every prompt-length bucket and gives the auto policy its first
acceptance observations; then ``--repeats`` timed passes, modes interleaved per call. tokens/s = generated tokens ÷
device time (compile excluded) of a pass, median over the passes. Ratios are against plain decoding at the same batch
size in the same run, paired by pass: the median over passes of (the mode's tok/s ÷ plain's in the same pass), so a
drift of the machine's speed between passes cancels (at batch 64 a pass is one call per mode, and a ratio of
medians taken apart would carry the drift: docs/history/shipped-pair.md).

Each batch size also gets a decomposition of the fixed-γ mode against plain (``decompose``), from the timed calls
and the prefill programs of the same calls: the prefill's share of a plain call, a round's cost in plain steps,
τ, the straggler factor, the decode-only speed-up, the ceiling (every draft accepted, at the measured round cost
and prefill: what no draft could beat on the machine that runs it) and the bound τ/(γc+v) from the standalone costs.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time

import jax

import jaxspec
from jaxspec import loop
from jaxspec.bench.shipped import TARGET, draft_name, load_prompts
from jaxspec.generation.generate import prepare
from jaxspec.policy import AutoGamma


def prompt_pool(ids: list[list[int]], size: int) -> list[list[int]]:
    """The prompts every batch size generates: ``ids`` cycled to ``size`` rows."""
    return [ids[i % len(ids)] for i in range(size)]


def batch_calls(pool: list, batch: int) -> list[list]:
    """``pool`` cut into consecutive calls of ``batch`` rows (the last one shorter if ``batch`` does not divide it)."""
    return [pool[i : i + batch] for i in range(0, len(pool), batch)]


@dataclasses.dataclass(frozen=True)
class CallRecord:
    """One timed ``generate`` call: device seconds (compile excluded), the prefill's share of them, and counts."""

    wall_s: float
    prefill_s: float
    passes: int  # loop iterations (target passes after prefill): the slowest row's rounds
    row_rounds: int  # summed over rows
    tokens: int  # generated, summed over rows
    longest: int  # the longest row's generated tokens


def record(stats, prefill_s: float) -> CallRecord:
    """The ``CallRecord`` of one call from its ``Stats`` ``stats`` and ``prefill_s``, the seconds of its prefill
    program (``prefill_seconds``): ``passes`` is the slowest row's rounds, ``row_rounds`` the rounds summed over
    rows, ``tokens`` the generated tokens and ``longest`` the longest row's generated tokens."""
    rows = stats.rows
    return CallRecord(
        stats.wall_time_s,
        prefill_s,
        max(r.rounds for r in rows),
        sum(r.rounds for r in rows),
        stats.generated_tokens,
        max(r.generated_tokens for r in rows),
    )


def decompose(
    plain: list[CallRecord],
    spec: list[CallRecord],
    gamma: int,
    c: float | None = None,
    v: float | None = None,
    round_costs: dict | None = None,
) -> dict:
    """Where a speculative mode's time goes against plain decoding, from the same calls' records.

    step / round: decode seconds (wall minus prefill) per loop iteration; r = round ÷ step. τ: tokens per
    row-round. straggler: iterations run ÷ iterations the longest rows would need at τ per round (the batch
    waits for its slowest row). decode_speedup: tokens/s with every prefill left out. ceiling: the speed-up if
    every draft were accepted (γ + 1 tokens per round for every row) at the measured round cost and prefill,
    which no draft can beat. bound: τ / (γc + v) from the standalone costs, when given. ceiling_by_gamma: the
    same ceiling for other γ at their round costs ``round_costs`` (γ -> plain steps, e.g. auto's in-loop timings).
    """

    def total(recs, field):
        return sum(getattr(x, field) for x in recs)

    plain_decode = total(plain, "wall_s") - total(plain, "prefill_s")
    spec_decode = total(spec, "wall_s") - total(spec, "prefill_s")
    step = plain_decode / total(plain, "passes")
    round_s = spec_decode / total(spec, "passes")
    tau = total(spec, "tokens") / total(spec, "row_rounds")
    plain_rate = total(plain, "tokens") / total(plain, "wall_s")

    def ceiling(g: int, seconds_per_round: float) -> float:
        perfect = total(spec, "prefill_s") + sum(math.ceil(x.longest / (g + 1)) for x in spec) * seconds_per_round
        return (total(spec, "tokens") / perfect) / plain_rate

    return {
        "prefill_share": total(plain, "prefill_s") / total(plain, "wall_s"),
        "round_cost": round_s / step,
        "tau": tau,
        "straggler": total(spec, "passes") / sum(x.longest / tau for x in spec),
        "decode_speedup": (total(spec, "tokens") / spec_decode) / (total(plain, "tokens") / plain_decode),
        "ceiling": ceiling(gamma, round_s),
        "bound": None if c is None or v is None else tau / (gamma * c + v),
        "ceiling_by_gamma": {int(g): ceiling(int(g), r * step) for g, r in (round_costs or {}).items()},
    }


def run(args) -> dict:
    """The sweep mode (see the module docstring): the shipped pair (``TARGET`` + ``draft_name(args)``) over the
    batch sizes ``args.batches`` in three modes, ``"plain"``, ``"γ={args.gamma}"`` and ``"auto"``, at the first of
    ``args.temperatures``, printing a table row and the auto and decomposition details per batch size; with
    ``args.plot``, also writes the PNG there.

    Returns ``{"mode": "sweep", "temperature", "gamma", "max_new_tokens", "draft", "pool", "rows"}`` (``pool``:
    the number of prompts every batch size generates). A row has ``batch``, ``calls`` (calls per pass),
    ``first_call_s`` (mode -> seconds of its first warm-up call, compile included), per mode ``{"tok_s",
    "alpha", "vs_plain"}`` (median tokens/s over the ``args.repeats`` timed passes, α over them or None when
    nothing was drafted, ``paired_ratio`` against plain), ``auto_choices`` (the γ auto chose in the timed calls ->
    count, probes labelled), ``auto_decision`` (the last timed auto call's ``stats.policy``) and ``decomposition``
    (``decompose`` of the fixed-γ mode against plain).
    """
    target, draft = jaxspec.load(TARGET), jaxspec.load(draft_name(args))
    ids = [target.tokenizer.encode(p["prompt"]) for p in load_prompts()]
    largest = max(args.batches)
    pool = prompt_pool(ids, -(-max(largest, len(ids)) // largest) * largest)
    policy = AutoGamma()
    temp = args.temperatures[0]
    print(
        f"sweep: shipped pair ({TARGET} + {draft_name(args)}), batch sizes {args.batches}, temperature {temp:g}, "
        f"γ={args.gamma} fixed vs auto (candidates {policy.gammas}), {args.max_new_tokens} new tokens, the same "
        f"{len(pool)} prompts at every batch size, {args.repeats} timed passes",
        flush=True,
    )
    modes = {
        "plain": dict(draft=None),
        f"γ={args.gamma}": dict(draft=draft, gamma=args.gamma),
        "auto": dict(draft=draft, gamma="auto", policy=policy),
    }
    rows = []
    header = f"{'batch':>5} | " + " | ".join(f"{m:>22}" for m in modes) + " | auto decision (last call)"
    print(header + "\n" + "-" * len(header), flush=True)
    for batch in args.batches:
        calls = batch_calls(pool, batch)
        kw = dict(max_new_tokens=args.max_new_tokens, temperature=temp, seed=args.seed)
        row = {"batch": batch, "calls": len(calls)}
        for name, extra in modes.items():  # warm-up pass: compiles; auto's first call also times its round costs
            start = time.perf_counter()
            for i, prompts in enumerate(calls):
                jaxspec.generate(target, prompts, **kw, **extra)
                if i == 0:
                    row.setdefault("first_call_s", {})[name] = time.perf_counter() - start
        passes: dict[str, list] = {name: [] for name in modes}
        choices: dict[str, int] = {}
        fixed = f"γ={args.gamma}"
        # (call index, stats) of every timed call, for the decomposition
        timed: dict[str, list] = {"plain": [], fixed: []}
        for _ in range(args.repeats):
            totals = {name: [0, 0.0, 0, 0] for name in modes}  # tokens, seconds, accepted, drafted
            for i, prompts in enumerate(calls):
                for name, extra in modes.items():
                    s = jaxspec.generate(target, prompts, **kw, **extra).stats
                    if name in timed:
                        timed[name].append((i, s))
                    t = totals[name]
                    t[0] += s.generated_tokens
                    t[1] += s.wall_time_s
                    t[2] += s.accepted
                    t[3] += s.drafted
                    if s.policy is not None:
                        label = ("probe " if s.policy["probe"] else "") + (f"γ={s.gamma}" if s.gamma else "plain")
                        choices[label] = choices.get(label, 0) + 1
                        row["auto_decision"] = s.policy
            for name, t in totals.items():
                passes[name].append(t)
        for name, ts in passes.items():
            accepted, drafted = sum(t[2] for t in ts), sum(t[3] for t in ts)
            row[name] = {
                "tok_s": statistics.median(t[0] / t[1] for t in ts),
                "alpha": accepted / drafted if drafted else None,
            }
        for name in modes:
            row[name]["vs_plain"] = paired_ratio(passes[name], passes["plain"])
        row["auto_choices"] = choices
        d = row["auto_decision"]
        prefills = {name: [prefill_seconds(target, prompts, kw, modes[name]) for prompts in calls] for name in timed}
        records = {name: [record(s, prefills[name][i]) for i, s in timed[name]] for name in timed}
        row["decomposition"] = decompose(
            records["plain"], records[fixed], args.gamma, d["c"], d["v"].get(args.gamma), d["round_cost"]
        )
        rows.append(row)
        cells = []
        for name in modes:
            r = row[name]
            a = "" if r["alpha"] is None else f" α{r['alpha']:.2f}"
            cells.append(f"{r['tok_s']:7.1f} {r['vs_plain']:4.2f}×{a:>6}")
        print(f"{batch:>5} | " + " | ".join(f"{c:>22}" for c in cells) + f" | {d['reason']}", flush=True)
        print(
            "      auto chose (timed calls): " + ", ".join(f"{k} ×{v}" for k, v in sorted(choices.items())), flush=True
        )
        first = row["first_call_s"]
        print(
            "      first calls (compile; auto also times its candidate loops): "
            + ", ".join(f"{m} {first[m]:.1f} s" for m in modes),
            flush=True,
        )
        print(
            "      auto's inputs: round cost r(γ) "
            + ", ".join(f"{g}: {r:.2f}" for g, r in d["round_cost"].items())
            + "; τ(γ) "
            + ", ".join(f"{g}: {t:.2f}" for g, t in d["tau"].items())
            + f"; straggler {d['straggler']:.2f}; prefill (steps) target {d['prefill'].get('target', 0):.1f}, "
            + f"draft {d['prefill'].get('draft', 0):.1f}; standalone c {d['c']:.3f}, v "
            + ", ".join(f"{g}: {v:.2f}" for g, v in d["v"].items()),
            flush=True,
        )
        x = row["decomposition"]
        bound = "" if x["bound"] is None else f"; bound τ/(γc+v) {x['bound']:.2f}×"
        print(
            f"      where {fixed}'s time goes (timed calls): prefill {100 * x['prefill_share']:.0f} % of a plain "
            f"call; a round costs {x['round_cost']:.2f} plain steps; τ {x['tau']:.2f} per row-round; straggler "
            f"{x['straggler']:.2f}; decode-only {x['decode_speedup']:.2f}×; ceiling with every draft accepted "
            f"{x['ceiling']:.2f}×{bound}",
            flush=True,
        )
        print(
            "      ceiling with every draft accepted at auto's round costs: "
            + ", ".join(f"γ={g} {ceil:.2f}×" for g, ceil in sorted(x["ceiling_by_gamma"].items())),
            flush=True,
        )
    doc = {
        "mode": "sweep",
        "temperature": temp,
        "gamma": args.gamma,
        "max_new_tokens": args.max_new_tokens,
        "draft": draft_name(args),
        "pool": len(pool),
        "rows": rows,
    }
    if args.plot:
        _plot(rows, list(modes), args.plot)
        print(f"plot written to {args.plot}")
    return doc


def paired_ratio(mode_passes: list, plain_passes: list) -> float:
    """Median over passes of tok/s ÷ plain tok/s in the same pass (each pass: [tokens, seconds, ...])."""
    return statistics.median((m[0] / m[1]) / (p[0] / p[1]) for m, p in zip(mode_passes, plain_passes, strict=True))


def prefill_seconds(target, prompts, kw: dict, extra: dict, repeats: int = 3) -> float:
    """Fastest of ``repeats`` runs of the prefill program ``generate`` would run for this call (target and draft
    prompt passes; compiled on first use, not timed)."""
    prep = prepare(target, prompts, **kw, **extra)
    draft = extra.get("draft")
    params = (target.params, None if draft is None else draft.params)
    jax.block_until_ready(loop.prefill_program(prep.spec, *params, prep.inputs)[0])
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(loop.prefill_program(prep.spec, *params, prep.inputs)[0])
        best = min(best, time.perf_counter() - start)
    return best


def _plot(rows, modes, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    batches = [r["batch"] for r in rows]
    for m in modes:
        ax.plot(batches, [r[m]["vs_plain"] for r in rows], marker="o", label=m)
    if all("decomposition" in r for r in rows):
        ax.plot(
            batches,
            [r["decomposition"]["ceiling"] for r in rows],
            color="grey",
            linestyle="--",
            marker=".",
            label=f"{modes[1]}, every draft accepted",
        )
    ax.axhline(0.95, color="grey", linestyle=":", linewidth=1, label="0.95× plain")
    ax.set_xscale("log", base=2)
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.set_xlabel("batch size")
    ax.set_ylabel("tokens/s ÷ plain")
    ax.set_title("shipped pair: speculative vs plain by batch size")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
