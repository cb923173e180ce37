"""``--lookup``: prompt-lookup drafting against the shipped draft model, on prompts that do and do not repeat
their context.

Three workloads, each built from every held-out prompt of ``checkpoints/heldout_prompts.jsonl``:

  * ``as is``   — the prompt itself (ordinary continuation: the draft model's home ground);
  * ``edit``    — the prompt, a blank line, then its first line again: the model is asked to write the passage
                  again (editing, rewriting a function), so its output mostly copies the context;
  * ``repeat``  — the prompt twice, then its first line: extraction or repeated boilerplate, copying is near
                  certain.

Each prompt is generated at batch 1 by plain decoding, by the draft model and by prompt lookup (both at γ =
``--gamma``), by prompt lookup as it was before it abstained (``lookup, all``: one-token matches, every round
verified) and by prompt lookup with ``gamma="auto"`` (one policy for the whole run, so it learns the
workload's α), interleaved, ``--repeats`` times after a warm-up, at the first of ``--temperatures``.
Reported per workload and drafter: α (accepted ÷ drafted), τ (tokens per target pass), tokens/s (total tokens
÷ total device time) and the ratio to plain decoding in the same run.
"""

from __future__ import annotations

import jaxspec
from jaxspec.bench.shipped import TARGET, draft_name, load_prompts
from jaxspec.policy import AutoGamma

WORKLOADS = ("as is", "edit", "repeat")


def workload_prompt(text: str, workload: str) -> str:
    """The prompt text of ``workload`` (one of ``WORKLOADS``, see the module docstring) built from ``text``; its
    "first line" is the first non-blank one. Raises ``ValueError`` for another workload."""
    first = next((line for line in text.splitlines() if line.strip()), text)
    if workload == "as is":
        return text
    if workload == "edit":
        return text.rstrip("\n") + "\n\n" + first + "\n"
    if workload == "repeat":
        body = text.rstrip("\n") + "\n\n"
        return body + body + first + "\n"
    raise ValueError(f"unknown workload {workload!r}")


def run(args) -> dict:
    """The ``--lookup`` mode: prints one table row per (workload, drafter) as it goes; returns the JSON document
    (``rows`` of α, τ, tokens/s and the ratio to plain; the auto drafter's row of each workload adds
    ``auto_choices``, its decisions in the timed calls)."""
    target, draft = jaxspec.load(TARGET), jaxspec.load(draft_name(args))
    prompts = load_prompts(args.shipped_prompts)
    temp = args.temperatures[0]
    policy = AutoGamma()
    drafters = {
        "plain": {},
        "draft model": dict(draft=draft, gamma=args.gamma),
        "prompt lookup": dict(draft="prompt_lookup", gamma=args.gamma),
        # as before lookup abstained: one-token matches, every round verified
        "lookup, all": dict(draft=jaxspec.PromptLookup(3, 1, abstain=False), gamma=args.gamma),
        "lookup, auto": dict(draft="prompt_lookup", gamma="auto", policy=policy),  # last: auto_choices below
    }
    print(
        f"lookup: shipped pair ({TARGET} + {draft_name(args)}), {len(prompts)} held-out prompts per workload, "
        f"batch 1, γ={args.gamma}, "
        f"temperature {temp:g}, {args.max_new_tokens} new tokens, {args.repeats} repeats",
        flush=True,
    )
    header = f"{'workload':>8} | {'drafter':>13} | {'α':>5} | {'τ':>5} | {'tok/s':>7} | vs plain"
    print(header + "\n" + "-" * len(header), flush=True)
    doc = {
        "mode": "lookup",
        "temperature": temp,
        "gamma": args.gamma,
        "max_new_tokens": args.max_new_tokens,
        "rows": [],
    }
    for workload in WORKLOADS:
        ids = [target.tokenizer.encode(workload_prompt(p["prompt"], workload)) for p in prompts]
        kw = dict(max_new_tokens=args.max_new_tokens, temperature=temp)
        totals = {name: dict(tokens=0, seconds=0.0, drafted=0, accepted=0, rounds=0) for name in drafters}
        choices: dict[str, int] = {}  # auto's decisions in the timed calls: "γ=4", "plain", "probe γ=2" -> count
        for i, prompt in enumerate(ids):
            for extra in drafters.values():  # compile / warm-up
                jaxspec.generate(target, [prompt], seed=args.seed + i, **kw, **extra)
            for _ in range(args.repeats):
                for name, extra in drafters.items():
                    s = jaxspec.generate(target, [prompt], seed=args.seed + i, **kw, **extra).stats
                    t = totals[name]
                    t["tokens"] += s.generated_tokens
                    t["seconds"] += s.wall_time_s
                    t["drafted"] += s.drafted
                    t["accepted"] += s.accepted
                    t["rounds"] += s.rounds
                    if s.policy is not None:
                        g = s.policy["gamma"]
                        label = ("probe " if s.policy.get("probe") else "") + (f"γ={g}" if g else "plain")
                        choices[label] = choices.get(label, 0) + 1
        plain = totals["plain"]["tokens"] / totals["plain"]["seconds"]
        for name, t in totals.items():
            tok_s = t["tokens"] / t["seconds"]
            row = {
                "workload": workload,
                "drafter": name,
                "tok_s": tok_s,
                "vs_plain": tok_s / plain,
                "alpha": t["accepted"] / t["drafted"] if t["drafted"] else None,
                "tau": t["tokens"] / t["rounds"] if t["rounds"] else None,
            }
            doc["rows"].append(row)
            a = "" if row["alpha"] is None else f"{row['alpha']:.3f}"
            tau = "" if row["alpha"] is None else f"{row['tau']:.2f}"
            print(f"{workload:>8} | {name:>13} | {a:>5} | {tau:>5} | {tok_s:7.1f} | {row['vs_plain']:.2f}×", flush=True)
        doc["rows"][-1]["auto_choices"] = choices
        print(f"{'':>8}   auto chose: " + ", ".join(f"{k} ×{v}" for k, v in sorted(choices.items())), flush=True)
    return doc
