"""``--shipped``: the shipped pair (``jaxspec/code-target`` + ``jaxspec/code-draft``) on held-out prompts.

Every prompt of ``checkpoints/heldout_prompts.jsonl`` (cut from corpus files never trained on) is generated at
batch 1, plain and speculative (γ = ``--gamma``) interleaved, ``--repeats`` times after a warm-up, for each
temperature. Reported per temperature: α and τ (summed over prompts), tokens/s of each mode (total tokens ÷ total
device time) and their ratio, the measured c and v, bound B and the efficiency against it; α per category.
"""

from __future__ import annotations

import statistics

import jaxspec
from jaxspec.bench import measure
from jaxspec.bench.bounds import bound_cpu, bound_issue
from jaxspec.formats.jsonl import read_jsonl
from jaxspec.formats.paths import shipped_dir
from jaxspec.generation.inputs import bucket_cache

TARGET, DRAFT = "jaxspec/code-target", "jaxspec/code-draft"


def draft_name(args) -> str:
    """The draft the shipped-pair modes use: ``--shipped-draft`` or the pair's own."""
    return getattr(args, "shipped_draft", None) or DRAFT


def load_prompts(limit: int | None = None) -> list[dict]:
    """The held-out prompts of ``checkpoints/heldout_prompts.jsonl`` (dicts with ``id``, ``category``, ``source``,
    ``prompt``); only the first ``limit`` unless ``limit`` is None or 0."""
    rows = read_jsonl(shipped_dir() / "heldout_prompts.jsonl")
    return rows[:limit] if limit else rows


def _one(target, draft, prompt, kw, seed):
    res = jaxspec.generate(target, prompt, draft=draft, seed=seed, **kw)
    return res.stats


def run(args) -> dict:
    """The ``--shipped`` mode: prints one line per temperature as it goes; returns the JSON document (one entry of
    ``temperatures`` per temperature, with the figures of the module docstring)."""
    target, draft = jaxspec.load(TARGET), jaxspec.load(draft_name(args))
    prompts = load_prompts(args.shipped_prompts)
    ids = [target.tokenizer.encode(p["prompt"]) for p in prompts]
    print(
        f"shipped pair: target {target.num_params / 1e6:.2f} M params, draft {draft.num_params / 1e6:.2f} M; "
        f"{len(prompts)} held-out prompts ({min(map(len, ids))}-{max(map(len, ids))} tokens), batch 1, "
        f"γ={args.gamma}, {args.max_new_tokens} new tokens, {args.repeats} repeats",
        flush=True,
    )
    cache_len = bucket_cache(max(map(len, ids)) + args.max_new_tokens)
    timer = measure.round_timer(target, draft, args.gamma, cache_len, max(map(len, ids)), args.seed)
    doc = {
        "mode": "shipped",
        "gamma": args.gamma,
        "max_new_tokens": args.max_new_tokens,
        "prompts": len(prompts),
        "target_params": target.num_params,
        "draft_params": draft.num_params,
        "temperatures": [],
    }
    for temp in args.temperatures:
        kw = dict(max_new_tokens=args.max_new_tokens, temperature=temp, gamma=args.gamma)
        totals = {"plain": [0, 0.0], "spec": [0, 0.0]}
        drafted = accepted = rounds = spec_tokens = 0
        per_cat: dict[str, list[int]] = {}
        for p, tok in zip(prompts, ids):
            for d in (None, draft):  # warm-up (compiles once per prompt bucket)
                _one(target, d, [tok], kw, args.seed)
            for r in range(args.repeats):
                for name, d in (("plain", None), ("spec", draft)):
                    s = _one(target, d, [tok], kw, args.seed + r)
                    totals[name][0] += s.generated_tokens
                    totals[name][1] += s.wall_time_s
                    if d is not None:
                        drafted, accepted = drafted + s.drafted, accepted + s.accepted
                        rounds, spec_tokens = rounds + s.rounds, spec_tokens + s.generated_tokens
                        c = per_cat.setdefault(p["category"], [0, 0])
                        c[0], c[1] = c[0] + s.accepted, c[1] + s.drafted
            timer.block(args.step_iters)
        c_ratio, v_ratio = measure.step_ratios(timer.medians(), args.gamma)
        alpha, tau = accepted / drafted, spec_tokens / rounds
        plain_tps, spec_tps = (totals[k][0] / totals[k][1] for k in ("plain", "spec"))
        speedup = spec_tps / plain_tps
        b_a, b_b = bound_issue(alpha, args.gamma, c_ratio), bound_cpu(alpha, args.gamma, c_ratio, v_ratio)
        row = {
            "temperature": temp,
            "alpha": alpha,
            "tau": tau,
            "plain_tok_s": plain_tps,
            "spec_tok_s": spec_tps,
            "speedup": speedup,
            "c": c_ratio,
            "v": v_ratio,
            "bound_a": b_a,
            "bound_b": b_b,
            "eff_b": speedup / b_b,
            "alpha_by_category": {k: a / d for k, (a, d) in per_cat.items()},
            "target_step_ms": statistics.median(timer.times["target_1"]) * 1e3,
        }
        doc["temperatures"].append(row)
        name = "greedy" if temp == 0 else f"T={temp:g}"
        cats = ", ".join(f"{k} {v:.3f}" for k, v in sorted(row["alpha_by_category"].items()))
        print(
            f"{name:>7}: α {alpha:.3f} ({cats}), τ {tau:.2f}, plain {plain_tps:.1f} tok/s, spec {spec_tps:.1f} "
            f"tok/s, speedup {speedup:.2f}×; c {c_ratio:.3f}, v {v_ratio:.2f}, bound A {b_a:.2f}, "
            f"bound B {b_b:.2f}, eff. B {speedup / b_b:.2f}; target step {row['target_step_ms']:.2f} ms",
            flush=True,
        )
    return doc
