"""``--sweep``: batch sizes × {plain, γ fixed, auto} on the shipped pair (held-out prompts), with a table and a PNG.

For each batch size B the first B held-out prompts (cycled when B exceeds them) are generated in one call per
mode, ``--max-new-tokens`` each, after a warm-up call per mode (compile excluded; the warm-up also gives the
auto policy its first acceptance observations). tokens/s = generated tokens ÷ device time, median of
``--repeats`` calls; ratios are against plain decoding at the same batch size in the same run.
"""

from __future__ import annotations

import statistics
import time

import jaxspec
from jaxspec.bench.shipped import DRAFT, TARGET, load_prompts
from jaxspec.policy import AutoGamma


def _batch_prompts(ids: list[list[int]], batch: int) -> list[list[int]]:
    return [ids[i % len(ids)] for i in range(batch)]


def run(args) -> dict:
    target, draft = jaxspec.load(TARGET), jaxspec.load(DRAFT)
    ids = [target.tokenizer.encode(p["prompt"]) for p in load_prompts()]
    policy = AutoGamma()
    temp = args.temperatures[0]
    print(f"sweep: shipped pair, batch sizes {args.batches}, temperature {temp:g}, γ={args.gamma} fixed vs auto "
          f"(candidates {policy.gammas}), {args.max_new_tokens} new tokens, {args.repeats} repeats", flush=True)
    modes = {"plain": dict(draft=None), f"γ={args.gamma}": dict(draft=draft, gamma=args.gamma),
             "auto": dict(draft=draft, gamma="auto", policy=policy)}
    rows = []
    header = f"{'batch':>5} | " + " | ".join(f"{m:>22}" for m in modes) + " | auto decision"
    print(header + "\n" + "-" * len(header), flush=True)
    for batch in args.batches:
        prompts = _batch_prompts(ids, batch)
        kw = dict(max_new_tokens=args.max_new_tokens, temperature=temp, seed=args.seed)
        row = {"batch": batch}
        for name, extra in modes.items():  # compile / warm-up; auto's first call also measures its round costs
            start = time.perf_counter()
            jaxspec.generate(target, prompts, **kw, **extra)
            row.setdefault("first_call_s", {})[name] = time.perf_counter() - start
        runs = {name: [] for name in modes}
        for _ in range(args.repeats):
            for name, extra in modes.items():
                runs[name].append(jaxspec.generate(target, prompts, **kw, **extra).stats)
        for name, stats in runs.items():
            row[name] = {
                "tok_s": statistics.median(s.tokens_per_s for s in stats),
                "alpha": stats[-1].acceptance_rate,
                "gamma": stats[-1].gamma,
                "decision": stats[-1].policy,
            }
        plain = row["plain"]["tok_s"]
        for name in modes:
            row[name]["vs_plain"] = row[name]["tok_s"] / plain
        rows.append(row)
        cells = []
        for name in modes:
            r = row[name]
            a = "" if r["alpha"] is None else f" α{r['alpha']:.2f}"
            cells.append(f"{r['tok_s']:7.1f} {r['vs_plain']:4.2f}×{a:>6}")
        decision = row["auto"]["decision"]["reason"] if row["auto"]["decision"] else ""
        print(f"{batch:>5} | " + " | ".join(f"{c:>22}" for c in cells) + f" | {decision}", flush=True)
        first = row["first_call_s"]
        print(f"      first calls (compile; auto also times its candidate loops): "
              + ", ".join(f"{m} {first[m]:.1f} s" for m in modes), flush=True)
        d = row["auto"]["decision"]
        if d:
            print("      auto's inputs: round cost r(γ) " + ", ".join(f"{g}: {r:.2f}" for g, r in d["round_cost"].items())
                  + "; τ(γ) " + ", ".join(f"{g}: {t:.2f}" for g, t in d["tau"].items())
                  + f"; straggler {d['straggler']:.2f}; standalone c {d['c']:.3f}, v " + ", ".join(f"{g}: {v:.2f}" for g, v in d["v"].items()),
                  flush=True)
    doc = {"mode": "sweep", "temperature": temp, "gamma": args.gamma, "max_new_tokens": args.max_new_tokens,
           "rows": rows}
    if args.plot:
        _plot(rows, list(modes), args.plot)
        print(f"plot written to {args.plot}")
    return doc


def _plot(rows, modes, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    batches = [r["batch"] for r in rows]
    for m in modes:
        ax.plot(batches, [r[m]["vs_plain"] for r in rows], marker="o", label=m)
    ax.axhline(0.95, color="grey", linestyle=":", linewidth=1, label="0.95× plain")
    ax.set_xscale("log", base=2)
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.set_xlabel("batch size")
    ax.set_ylabel("tokens/s ÷ plain")
    ax.set_title("shipped pair: speculative vs plain by batch size")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
