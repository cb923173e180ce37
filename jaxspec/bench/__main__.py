"""``python -m jaxspec.bench``: flags, then dispatch to a mode through ``MODES``.

A new mode is a module with ``run(args) -> dict`` (prints its tables, returns the JSON document), an entry in
``MODES`` and a flag that stores its name in ``args.mode``, e.g.
``p.add_argument("--sweep", dest="mode", action="store_const", const="sweep")``."""

from __future__ import annotations

import argparse
import json
import os

import jax

import jaxspec.bench
from jaxspec.bench import continuous, humaneval, lookup, mesh, quant, shipped, single, structured, sweep
from jaxspec.bench.continuous import MODES as CONTINUOUS_MODES
from jaxspec.bench.humaneval import DEFAULT_MODES as HUMANEVAL_DEFAULT_MODES
from jaxspec.bench.humaneval import MODES as HUMANEVAL_MODES
from jaxspec.bench.measure import CPU_FEATURES, machine
from jaxspec.bench.pairs import PAIRS
from jaxspec.drafters import branching
from jaxspec.loop import compile_cache

MODES = {
    "single": single.run,
    "mesh": mesh.run,
    "shipped": shipped.run,
    "sweep": sweep.run,
    "lookup": lookup.run,
    "humaneval": humaneval.run,
    "quant": quant.run,
    "structured": structured.run,
    "continuous": continuous.run,
}

# --quick: the same pipeline on tiny models, in well under a minute on a 2-core CPU (explicit flags still win).
QUICK = dict(
    vocab=256,
    hidden=64,
    target_layers=2,
    draft_layers=1,
    max_new_tokens=16,
    repeats=1,
    step_iters=3,
    pair="aligned",
    breakdown_repeats=0,
)

# --continuous: greedy, 2 timed passes, the shipped pair; with --quick also slots 1,4 and a pool of 8; with
# --pair smollm2 (a real model: fewer, shorter rows) slots 1,4,16, a pool of 32, 64 new tokens at most.
CONTINUOUS = dict(pair="shipped", temperatures=[0.0], repeats=2)
CONTINUOUS_QUICK = dict(slots=[1, 4], pool=8)
CONTINUOUS_SMOLLM2 = dict(slots=[1, 4, 16], pool=32, max_new_tokens=64)
CONTINUOUS_PAIRS = ("shipped", "smollm2", *PAIRS)
# --continuous --requests: the engine's sizing at 16 slots, 64 new tokens
CONTINUOUS_SIZING = dict(slots=[16], max_new_tokens=64)


def _floats(s: str) -> list[float]:
    return [float(x) for x in s.split(",")]


def build_parser() -> argparse.ArgumentParser:
    """Every flag of every mode; the mode flags (``--shipped``, ``--sweep``, …) store their name in ``args.mode``
    (default ``"single"``)."""
    p = argparse.ArgumentParser(
        prog="python -m jaxspec.bench",
        description=jaxspec.bench.__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.set_defaults(mode="single")
    p.add_argument(
        "--pair",
        choices=[*PAIRS, "both", "shipped", "smollm2"],
        default="both",
        help="random/aligned/both: the synthetic pairs; --continuous: shipped (default), smollm2 or a synthetic one",
    )
    p.add_argument("--gamma", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3, help="generate() runs per mode and temperature (interleaved)")
    p.add_argument("--temperatures", type=_floats, default=[0.0, 1.0], help="comma-separated, default 0,1")
    p.add_argument(
        "--step-iters",
        type=int,
        default=10,
        help="calls of each model step per timing block (one block after every plain+spec pair of runs)",
    )
    p.add_argument("--seed", type=int, default=0)
    g = p.add_argument_group("models (float32 Llama, random weights)")
    g.add_argument("--vocab", type=int, default=8192)
    g.add_argument("--hidden", type=int, default=512, help="shared by target and draft")
    g.add_argument("--target-layers", type=int, default=16)
    g.add_argument("--draft-layers", type=int, default=1)
    g.add_argument(
        "--residual-scale",
        type=float,
        default=0.002,
        help="aligned pair: factor on every o_proj/down_proj (smaller = higher α)",
    )
    p.add_argument(
        "--breakdown-repeats",
        type=int,
        default=3,
        help="runs per combination for the in-loop time breakdown of the first pair (0 = skip it)",
    )
    p.add_argument(
        "--breakdown-tokens",
        type=int,
        default=100,
        help="the longer max_new_tokens of the breakdown's slope (the shorter is a fifth of it)",
    )
    quick = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in QUICK.items())
    p.add_argument("--quick", action="store_true", help=f"smoke run on tiny models: {quick}, unless given")
    p.add_argument("--json", metavar="PATH", help="also write every figure as JSON")
    p.add_argument(
        "--shipped",
        dest="mode",
        action="store_const",
        const="shipped",
        help="measure the shipped pair (jaxspec/code-target + code-draft) on held-out prompts",
    )
    p.add_argument("--shipped-prompts", type=int, help="use only the first N held-out prompts")
    p.add_argument(
        "--shipped-draft",
        metavar="NAME",
        help="--shipped/--sweep/--lookup: another draft (e.g. jaxspec/code-draft-greedy)",
    )
    p.add_argument(
        "--sweep",
        dest="mode",
        action="store_const",
        const="sweep",
        help="batch sizes x {plain, fixed γ, auto} on the shipped pair",
    )
    p.add_argument(
        "--lookup",
        dest="mode",
        action="store_const",
        const="lookup",
        help="prompt lookup vs the draft model on prompts that repeat their context (shipped pair)",
    )
    p.add_argument(
        "--humaneval",
        dest="mode",
        action="store_const",
        const="humaneval",
        help="SmolLM2-135M-Instruct + jaxspec/smollm2-draft on HumanEval (chat template): plain, fixed γ, "
        "auto, prompt lookup and the EAGLE head jaxspec/smollm2-eagle3, interleaved, per batch size and temperature",
    )
    p.add_argument("--eagle-head", metavar="DIR", help="--humaneval: another EAGLE head (jaxspec.eagle.save's)")
    p.add_argument(
        "--eagle-gamma",
        type=lambda s: [int(x) for x in s.split(",")],
        metavar="G[,G...]",
        help="--humaneval: the EAGLE head's fixed γ (default --gamma); several: one eagle@G mode each, interleaved",
    )
    p.add_argument(
        "--eagle3-head",
        metavar="DIR",
        help="--humaneval: an EAGLE-3 head (jaxspec.eagle.load's: saved, or a published checkpoint) run beside "
        "the EAGLE head as eagle3@G modes",
    )
    p.add_argument(
        "--eagle3-gamma",
        type=lambda s: [int(x) for x in s.split(",")],
        metavar="G[,G...]",
        help="--humaneval: the EAGLE-3 head's fixed γ values, one eagle3@G mode each (default 2)",
    )
    p.add_argument(
        "--eagle3-context-vocab",
        type=int,
        metavar="N",
        help="--humaneval: the EAGLE-3 head's context_vocab (default its own: the context ids it drafts; 0 for "
        "none), e.g. the EAGLE head itself with 0, to compare the two in one run",
    )
    p.add_argument(
        "--eagle-scale",
        type=lambda s: [float(x) for x in s.split(",")],
        metavar="S[,S...]",
        help="--humaneval: the EAGLE head's temperature scale (default its saved one); several: one eagle~S mode each",
    )
    p.add_argument(
        "--acceptance",
        type=lambda s: s.split(","),
        metavar="RULE[,RULE]",
        help="--humaneval: the acceptance rule, token (token by token; trees by recursive rejection sampling) or "
        "block (block verification; trees by traversal verification; the default); several: each chain and tree "
        "mode once per rule, as MODE/RULE",
    )
    p.add_argument(
        "--tree-scale",
        type=lambda s: [float(x) for x in s.split(",")],
        metavar="S[,S...]",
        help="--humaneval: the temperature scale the EAGLE head's --trees sample at (default its saved "
        "tree_temperature_scale); several: each tree at each scale, one tree:D,B,W~S mode each",
    )
    for flag, what in (("--trees", "the EAGLE head"), ("--draft-trees", "the draft model (--shipped-draft)")):
        mode = "tree" if flag == "--trees" else "draft-tree"
        p.add_argument(
            flag,
            type=lambda s: [branching.parse_tree(x) for x in s.split()],
            metavar="'D,B,W [D,B,W ...]'",
            help=f"--humaneval: {what} drafting trees of these shapes (depth, branch, width), one {mode}:D,B,W mode "
            "each, after the other modes",
        )
    p.add_argument(
        "--quant",
        dest="mode",
        action="store_const",
        const="quant",
        help="SmolLM2-135M-Instruct in float32, int8 and w8a8 (jaxspec.quantize): weight bytes, load time, step and "
        "v over 3/5/9 tokens interleaved, argmax agreement and KL against float32 on the first --humaneval-prompts "
        "(default 20) HumanEval prompts",
    )
    p.add_argument(
        "--structured",
        dest="mode",
        action="store_const",
        const="structured",
        help="structured output: held-out stdlib functions described as JSON {name, args, returns} by SmolLM2-135M-"
        "Instruct, batch 1, greedy: plain without and with the constraint, the EAGLE head and prompt lookup with it; "
        "validity, α, τ, forced tokens, speed-up over constrained plain",
    )
    p.add_argument(
        "--structured-prompts", type=int, default=24, metavar="N", help="--structured: the first N functions"
    )
    p.add_argument(
        "--quantize",
        choices=["int8", "w8a8"],
        help="--humaneval, --structured: load the target (and the draft model) quantized (jaxspec.quantize)",
    )
    p.add_argument("--humaneval-prompts", type=int, metavar="N", help="--humaneval: the first N of the 164 problems")
    p.add_argument(
        "--humaneval-modes",
        type=lambda s: [m.strip() for m in s.split(",") if m.strip()],
        default=list(HUMANEVAL_DEFAULT_MODES),
        help=f"--humaneval: modes to interleave, from {','.join(HUMANEVAL_MODES)} (default "
        f"{','.join(HUMANEVAL_DEFAULT_MODES)}; plain always runs; lookup-all: prompt lookup verifying every round, "
        "with one-token matches, as before lookup abstained; lookup+eagle: prompt lookup at --gamma where it "
        "matches, the EAGLE head at --eagle-gamma elsewhere)",
    )
    p.add_argument(
        "--ttft",
        action="store_true",
        help="--humaneval: before each timed call, the same call with max_new_tokens=1 (same cache length), timed: "
        "reports the time to first token and the decode phase after it (tokens/s and the ratio to plain) apart",
    )
    p.add_argument("--prompts-out", metavar="JSONL", help="--humaneval: write the prompt ids (for transformers)")
    p.add_argument("--target", help="--humaneval: another target (default smollm2-135m-instruct)")
    p.add_argument(
        "--batches",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[1, 4, 16, 64],
        help="sweep batch sizes, comma-separated (default 1,4,16,64)",
    )
    p.add_argument("--plot", metavar="PNG", help="sweep: write the plot here")
    c = p.add_argument_group("continuous mode")
    c.add_argument(
        "--continuous",
        dest="mode",
        action="store_const",
        const="continuous",
        help="static batches (generate calls of B prompts) vs the continuous-batching engine (Engine(slots=B)) on "
        "one pool of prompts with mixed output lengths; greedy and 2 timed passes unless given",
    )
    c.add_argument(
        "--slots",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[1, 4, 16, 64],
        help="--continuous: slot counts B, comma-separated (default 1,4,16,64; smollm2 1,4,16)",
    )
    c.add_argument(
        "--pool", type=int, help="--continuous: prompts in the pool (default max(4 x largest B, 64); smollm2 32)"
    )
    c.add_argument(
        "--continuous-modes",
        type=lambda s: [m.strip() for m in s.split(",") if m.strip()],
        help="--continuous: modes to interleave, from static-plain,static-fixed,cont-plain,cont-fixed,cont-auto,"
        "cont-lookup (default all but cont-lookup; the two plain modes always run)",
    )
    c.add_argument(
        "--schedule",
        choices=["longest_first", "fifo"],
        default="longest_first",
        help="--continuous: the engine's order of waiting requests (default longest_first)",
    )
    c.add_argument(
        "--requests",
        type=lambda s: [int(x) for x in s.split(",")],
        metavar="N[,N...]",
        help="--continuous: the engine's sizing instead: N chat prompts (checkpoints/chat_prompts.jsonl, cycled) "
        "through Engine(slots=largest --slots, default 16) against generate calls of min(N, slots) rows, "
        "SmolLM2-135M-Instruct with its EAGLE head at its default γ, greedy, --max-new-tokens (default 64)",
    )
    c.add_argument(
        "--auto-gammas",
        type=lambda s: [int(x) for x in s.split(",")],
        help="--continuous: cont-auto's candidate γ (default the policy's 1,2,4,6; with --quick --gamma alone)",
    )
    m = p.add_argument_group("mesh mode")
    m.add_argument(
        "--mesh",
        metavar="SHAPES",
        nargs="?",
        const="all",
        help="compare mesh shapes data x model, e.g. 1x8,2x4 (default: all factorizations)",
    )
    m.add_argument("--devices", type=int, help="simulated CPU devices (CPU backend only; e.g. 8)")
    m.add_argument("--mesh-batch", type=int, default=8, help="prompts per call in mesh mode")
    return p


def parse_args(argv=None) -> argparse.Namespace:
    """Parse ``argv`` (default ``sys.argv[1:]``). ``--quick`` swaps in the ``QUICK`` defaults and ``--continuous``
    the ``CONTINUOUS`` ones (with ``--quick`` also ``CONTINUOUS_QUICK``; with ``--pair smollm2``
    ``CONTINUOUS_SMOLLM2``; with ``--requests`` ``CONTINUOUS_SIZING``); explicit flags keep their values.
    ``--mesh`` selects the mesh mode. Exits with a usage error (``SystemExit``) for ``--gamma`` below 1, an unknown
    ``--humaneval-modes`` or ``--continuous-modes`` entry, a ``--requests`` below 1, or a ``--pair`` that the mode
    does not take."""
    p = build_parser()
    args = p.parse_args(argv)
    defaults = dict(CONTINUOUS) if args.mode == "continuous" else {}
    if args.quick:  # tiny defaults; flags given explicitly keep their values
        defaults.update(QUICK, **(CONTINUOUS_QUICK if args.mode == "continuous" else {}))
    if defaults:
        p.set_defaults(**defaults)
        args = p.parse_args(argv)
    if args.mode == "continuous" and args.pair == "smollm2":
        p.set_defaults(**CONTINUOUS_SMOLLM2)
        args = p.parse_args(argv)
    if args.mode == "continuous" and args.requests:
        p.set_defaults(**CONTINUOUS_SIZING)
        args = p.parse_args(argv)
        if min(args.requests) < 1:
            p.error("--requests must be >= 1")
    if args.mode == "continuous":
        if args.pair not in CONTINUOUS_PAIRS:
            p.error(f"--continuous: --pair must be one of {','.join(CONTINUOUS_PAIRS)}, got {args.pair}")
        bad = set(args.continuous_modes or ()) - set(CONTINUOUS_MODES)
        if bad:
            p.error(f"--continuous-modes: unknown {sorted(bad)}; choose from {','.join(CONTINUOUS_MODES)}")
        if not args.slots or min(args.slots) < 1 or (args.pool is not None and args.pool < 1):
            p.error("--slots and --pool must be >= 1")
    elif args.pair in ("shipped", "smollm2"):
        p.error(f"--pair {args.pair} is for --continuous (see --shipped, --humaneval)")
    if args.gamma < 1 or any(g is not None and min(g) < 1 for g in (args.eagle_gamma, args.eagle3_gamma)):
        p.error("--gamma, --eagle-gamma and --eagle3-gamma must be >= 1")
    if args.eagle3_context_vocab is not None and args.eagle3_context_vocab < 0:
        p.error(f"--eagle3-context-vocab must be >= 0, got {args.eagle3_context_vocab}")
    if args.acceptance is not None and (not args.acceptance or set(args.acceptance) - {"token", "block"}):
        p.error(f"--acceptance: each rule must be token or block, got {','.join(args.acceptance)}")
    if args.tree_scale is not None and not all(0 < s < float("inf") for s in args.tree_scale):
        p.error(f"--tree-scale: each scale must be a finite number > 0, got {args.tree_scale}")
    if args.eagle_scale is not None:
        if not all(0 < s < float("inf") for s in args.eagle_scale):
            p.error("--eagle-scale values must be finite numbers > 0")
        if len(args.eagle_scale) > 1 and args.eagle_gamma is not None and len(args.eagle_gamma) > 1:
            p.error("several --eagle-scale values run at one γ: give one --eagle-gamma")
    bad = set(args.humaneval_modes) - set(HUMANEVAL_MODES)
    if bad:
        p.error(f"--humaneval-modes: unknown {sorted(bad)}; choose from {','.join(HUMANEVAL_MODES)}")
    if args.mesh is not None:
        args.mode = "mesh"
    return args


def main(argv=None) -> dict:
    """Parse the flags, set ``--devices`` simulated CPU devices, print the machine (``machine``), run the mode, write
    ``--json`` if asked; returns the mode's JSON document (with ``machine``). The persistent compilation cache is off
    unless ``$JAXSPEC_COMPILATION_CACHE`` names a directory, so that first calls measure compiles."""
    args = parse_args(argv)
    if args.devices:  # must happen before the backend starts; only the CPU backend reads it
        jax.config.update("jax_num_cpu_devices", args.devices)
    if os.environ.get(compile_cache.ENV) is None:  # first calls measure compiles, not loads from disk
        compile_cache.enable_compilation_cache(False)
    else:
        compile_cache.use_default()
    cache_dir = jax.config.jax_compilation_cache_dir  # type: ignore[attr-defined]  # a dynamic config attribute
    host = machine()
    cpu = (
        f", CPU {host['cpu']} ({host['cpu_cores']} cores; {' '.join(host['cpu_features']) or 'none'} of "
        f"{' '.join(CPU_FEATURES)})"
        if "cpu" in host
        else ""
    )
    print(
        f"jaxspec.bench: backend {host['backend']}, device {host['device']}, jax {host['jax']}{cpu}, "
        f"persistent compilation cache {cache_dir or 'off'}",
        flush=True,
    )
    doc = MODES[args.mode](args)
    if isinstance(doc, dict):
        doc.setdefault("machine", host)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1, default=str)
    return doc


if __name__ == "__main__":
    main()
