"""The ``jaxspec distill`` command: flags -> ``jaxspec.training.distill.distill``
(online: ``--prompts``) or ``jaxspec.training.offline.distill_offline`` (offline: ``--data``), on a loaded
``--draft`` or a ``--new-draft`` made for the target.

    jaxspec distill --target jaxspec/code-target --draft jaxspec/code-draft --prompts p.jsonl --out runs/d
    jaxspec distill --target smollm2-135m-instruct --new-draft hidden=256,layers=4 --data outputs.jsonl --out runs/d
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from jaxspec.cli.progress import Progress
from jaxspec.drafters import eagle
from jaxspec.formats import eagle3 as eagle3_format
from jaxspec.formats.loader import load
from jaxspec.formats.orbax import save
from jaxspec.formats.paths import resolve
from jaxspec.training import distill as distill_lib
from jaxspec.training import eagle3 as eagle3_training
from jaxspec.training.distill import LOSSES, distill, measure_alpha, read_prompts
from jaxspec.training.eagle import agreement, train_head, tune_temperature_scale
from jaxspec.training.offline import distill_offline, make_draft, parse_spec, read_data

DESCRIPTION = distill_lib.__doc__.split("\n")[0]
"""The command's one-line description (the first line of ``jaxspec.training.distill``'s docstring)."""


def build_parser() -> argparse.ArgumentParser:
    """The command's flags (``main`` parses them; the docs' examples are checked against it)."""
    ap = argparse.ArgumentParser(prog="jaxspec distill", description=DESCRIPTION)
    ap.add_argument("--target", required=True, help="target model: a directory or a shipped name")
    ap.add_argument(
        "--draft",
        help="draft model to distill: a directory or a shipped name (an EAGLE head goes on training from its "
        "weights; --data only; with --new-draft eagle3=K, a new EAGLE-3 head starts from the EAGLE head)",
    )
    ap.add_argument(
        "--new-draft",
        metavar="SPEC",
        help="instead of --draft: a new Llama draft for the target, e.g. hidden=256,layers=2,heads=4,"
        "kv_heads=1,intermediate=768 (embedding initialised from the target's), or target_layers=2 "
        "(the target's first 2 layers, embedding and norm), or eagle=1 (an EAGLE head of 1 layer that "
        "drafts from the target's hidden states; --data only, see jaxspec.training.eagle), or eagle3=4 (an "
        "EAGLE-3 head over the target's low, middle and high layers, trained with 4 draft steps of "
        "training-time test; --data only, see jaxspec.training.eagle3; lm_head=0 keeps the target's LM head "
        "at the draft vocabulary, neither trained nor stored; aux=2:15:30 chooses the tapped layers); add "
        "vocab=N for a reduced vocabulary of the N ids most frequent in --data (see distill_offline)",
    )
    ap.add_argument("--prompts", help='JSONL file, one {"prompt": ...} or {"turns": [...]} a line')
    ap.add_argument(
        "--data",
        metavar="JSONL",
        help='offline mode: train on the target\'s stored outputs ({"prompt_ids", "output_ids"} '
        "per line, from scripts/data/generate_distill_data.py) by cross-entropy instead of generating",
    )
    ap.add_argument("--out", required=True, help="checkpoint directory (a killed run resumes from it)")
    ap.add_argument("--heldout", help="JSONL file of held-out prompts (default: the last 10%% of --prompts)")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--learning-rate", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--loss",
        choices=LOSSES,
        default="fkl",
        help="online distillation and EAGLE-3 heads: forward KL (cross-entropy), reverse KL or total variation",
    )
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--on-policy", type=float, default=0.0)
    ap.add_argument(
        "--prompt-weight",
        type=float,
        default=0.0,
        help="loss weight of the prompt's own positions (default 0: generated positions only)",
    )
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--window", type=int, default=256, help="EAGLE head: tokens per training window")
    ap.add_argument(
        "--heldout-data",
        help="EAGLE head: JSONL records like --data's, held out; prints the head's teacher-forced agreement with "
        "the target on them (draft steps 1 and 2; before and after training when --draft gives a head)",
    )
    ap.add_argument(
        "--temperature-scale",
        type=_scale_arg,
        metavar="auto|X",
        help="EAGLE head: draft at the call's temperature times X (saved with the head); auto: the scale whose "
        "drafts at temperature 1 are accepted most on --heldout-data (teacher-forced)",
    )
    ap.add_argument(
        "--tree-temperature-scale",
        type=_scale_arg,
        metavar="auto|X",
        help="EAGLE head: the same for the draft trees it samples (saved with the head; default: "
        "--temperature-scale's); auto (EAGLE-3 heads): the scale whose sibling sets of four children are accepted "
        "most at temperature 1 on --heldout-data (teacher-forced)",
    )
    ap.add_argument("--checkpoint-every", type=int, default=50)
    ap.add_argument("--dtype", default=None, help="load both models in this dtype (e.g. float32)")
    ap.add_argument("--save-draft", help="save the distilled draft here (jaxspec.save; must not exist)")
    ap.add_argument("--no-progress", action="store_true")
    return ap


def main(argv=None):
    """Parse the ``jaxspec distill`` flags (``argv``; None: ``sys.argv``), load the models, train, print α and the
    final loss, save the draft with ``--save-draft``. Returns the ``DistillResult`` online, the trained draft
    offline (``--data``). Bad flags exit through ``argparse`` (status 2)."""
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.draft is None and args.new_draft is None:
        ap.error("give --draft or --new-draft (both: a new EAGLE-3 head started from the EAGLE head --draft)")
    for flag in ("temperature_scale", "tree_temperature_scale"):
        if getattr(args, flag) == "auto" and not args.heldout_data:
            ap.error(f"--{flag.replace('_', '-')} auto chooses the scale on --heldout-data: give it")
    if (args.prompts is None) == (args.data is None):
        ap.error("give exactly one of --prompts (generate while training) and --data (offline)")
    progress = Progress(False if args.no_progress else None)
    progress.stage("loading", f"target {args.target}")
    target = load(args.target, args.dtype)
    if args.new_draft:
        try:
            spec = parse_spec(args.new_draft)
        except ValueError as e:
            ap.error(str(e))
        if args.draft is not None:  # a new EAGLE-3 head that starts from an EAGLE head
            if "eagle3_steps" not in spec or spec.keys() - {"eagle3_steps", "aux_layers"} or not args.data:
                ap.error(
                    "--draft with --new-draft: an EAGLE head to start a new EAGLE-3 head from, with --new-draft "
                    "eagle3=K[,aux=...] (its vocabulary and LM head are the EAGLE head's) and --data"
                )
            progress.stage("loading", f"EAGLE head {args.draft}")
            where = resolve(args.draft)
            if not eagle.is_head(where):
                ap.error(f"--draft {args.draft}: not an EAGLE head (needed to start an EAGLE-3 head from)")
            try:
                start = eagle3_training.from_eagle_head(
                    target, eagle.load(args.draft, target), args.data, aux_layers=spec.get("aux_layers")
                )
            except ValueError as e:
                ap.error(f"--draft {args.draft}: {e}")
            return _run_eagle3(args, target, {"eagle3_steps": spec["eagle3_steps"]}, init=start)
        if "eagle_layers" in spec or "eagle3_steps" in spec:
            if not args.data:
                ap.error(f"--new-draft {args.new_draft.split('=')[0]}=K trains offline: give --data")
            return _run_eagle(args, target, spec)
        draft = make_draft(target, read_data(args.data) if args.data else None, seed=args.seed, **spec)
    else:
        progress.stage("loading", f"draft {args.draft}")
        where = resolve(args.draft)
        if eagle.is_head(where) or eagle3_format.is_eagle3(where):  # go on training a head (e.g. on your workload)
            if not args.data:
                ap.error("--draft: an EAGLE head trains offline: give --data")
            return _run_eagle(args, target, {}, init=eagle.load(args.draft, target))
        draft = load(args.draft, args.dtype)
    if args.heldout_data:
        ap.error("--heldout-data measures an EAGLE head; for a draft model give --heldout (prompts, measured α)")
    for flag in ("temperature_scale", "tree_temperature_scale"):
        if getattr(args, flag) is not None:
            ap.error(f"--{flag.replace('_', '-')} is an EAGLE head's (a draft model samples at the call's temperature)")
    if args.data:
        return _run_offline(args, target, draft, save)
    result = distill(
        target,
        draft,
        args.prompts,
        out_dir=args.out,
        heldout=args.heldout,
        steps=args.steps,
        batch_size=args.batch_size,
        max_new_tokens=args.max_new_tokens,
        learning_rate=args.learning_rate,
        warmup=args.warmup,
        seed=args.seed,
        loss=args.loss,
        temperature=args.temperature,
        on_policy=args.on_policy,
        gamma=args.gamma,
        checkpoint_every=args.checkpoint_every,
        prompt_weight=args.prompt_weight,
        progress=not args.no_progress,
    )
    for key in ("greedy", "t1"):
        print(f"alpha {key}: {result.alpha_before[key]:.3f} -> {result.alpha_after[key]:.3f}")
    print(f"steps {result.steps}, final loss {result.loss:.4f}")
    if args.save_draft:
        print(f"saved the distilled draft to {save(result.draft, args.save_draft)}")
    return result


def _report(args, log, target, draft) -> None:
    """An offline run's last step and loss, and α on ``--heldout`` when given."""
    if log:
        print(f"steps {log[-1]['step']}, final loss {log[-1]['loss']:.4f}")
    if args.heldout:
        held = read_prompts(args.heldout)
        alpha = measure_alpha(target, draft, held, gamma=args.gamma, max_new_tokens=args.max_new_tokens, seed=args.seed)
        print(f"alpha greedy {alpha['greedy']:.3f}, t1 {alpha['t1']:.3f} on {len(held)} held-out prompts")


def _print_choice(title: str, table: dict, best: float) -> None:
    """A tuner's table, one line per scale (accepts per draft step), the chosen one marked."""
    print(title)
    for scale, accepts in table.items():
        print(f"  {scale:g}: {' / '.join(f'{a:.3f}' for a in accepts)}" + ("  <- chosen" if scale == best else ""))


def _scale_arg(text: str):
    """``--temperature-scale``: ``auto`` or a finite number > 0."""
    if text == "auto":
        return text
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be auto or a finite number > 0, got {text!r}")
    return value


def _run_eagle3(args, target, spec, init=None):
    """``--new-draft eagle3=K[,vocab=N] --data`` (or ``--draft HEAD --data`` with an EAGLE-3 head):
    ``jaxspec.training.eagle3.train_head``, per-step agreement on ``--heldout-data`` if given, ``--save-draft``."""
    name = Path(args.save_draft).name if args.save_draft else init.name if init else "eagle3"
    held = read_data(args.heldout_data) if args.heldout_data else None  # a bad file fails before training
    steps = spec.get("eagle3_steps", 4)
    before = eagle3_training.agreement(target, init, held, steps=steps) if held and init is not None else None
    head, log = eagle3_training.train_head(
        target,
        args.data,
        out_dir=args.out,
        steps_ahead=steps,
        vocab=spec.get("vocab"),
        aux_layers=spec.get("aux_layers"),
        loss=args.loss,
        train_lm_head=None if "lm_head" not in spec else bool(spec["lm_head"]),
        init=init,
        steps=args.steps,
        batch_size=args.batch_size,
        window=args.window,
        learning_rate=args.learning_rate,
        warmup=args.warmup,
        seed=args.seed,
        checkpoint_every=args.checkpoint_every,
        progress=not args.no_progress,
        name=name,
    )
    _report(args, log, target, head)
    if args.temperature_scale == "auto":
        best, table = eagle3_training.tune_temperature_scale(target, head, held)
        _print_choice(
            "held-out acceptance at temperature 1 (teacher-forced, per draft step) by temperature scale:", table, best
        )
        head = dataclasses.replace(head, temperature_scale=best)
    elif args.temperature_scale is not None:
        head = dataclasses.replace(head, temperature_scale=args.temperature_scale)
    if args.tree_temperature_scale == "auto":
        best, table = eagle3_training.tune_tree_temperature_scale(target, head, held, branch=4)
        title = "held-out acceptance of four sampled children a node at temperature 1 (teacher-forced, per draft step)"
        _print_choice(title + "\nby tree temperature scale:", table, best)
        head = dataclasses.replace(head, tree_temperature_scale=best)
    elif args.tree_temperature_scale is not None:
        head = dataclasses.replace(head, tree_temperature_scale=args.tree_temperature_scale)
    if held:
        after = eagle3_training.agreement(target, head, held, steps=steps)
        for key, what in (("steps", "agreement"), ("accept", "acceptance at temperature 1")):
            was = " / ".join(f"{a:.3f}" for a in before[key]) + " -> " if before else ""
            now = " / ".join(f"{a:.3f}" for a in after[key])
            print(f"held-out {what} (teacher-forced, per draft step): {was}{now} on {len(held)} records")
        print(f"temperature scale: {head.temperature_scale:g}, trees {head.tree_scale:g}")
    if args.save_draft:
        print(f"saved the EAGLE-3 head to {eagle.save(head, args.save_draft)}")
    return head


def _run_eagle(args, target, spec, init=None):
    """``--new-draft eagle=K[,vocab=N] --data`` (or ``--draft HEAD --data``: go on training ``init``):
    ``jaxspec.training.eagle.train_head``, α on ``--heldout`` if given, ``--save-draft`` with ``jaxspec.eagle.save``.
    An EAGLE-3 spec or head goes to ``_run_eagle3``."""
    if "eagle3_steps" in spec or (init is not None and init.eagle3):
        return _run_eagle3(args, target, spec, init)
    if args.tree_temperature_scale == "auto":
        raise SystemExit("jaxspec distill: --tree-temperature-scale auto tunes EAGLE-3 heads; give this one a number")
    if args.loss != "fkl":
        raise SystemExit(
            f"jaxspec distill: --loss {args.loss} trains EAGLE-3 heads; an EAGLE-1-style head trains by cross-entropy"
        )
    name = Path(args.save_draft).name if args.save_draft else init.name if init else "eagle"
    held = read_data(args.heldout_data) if args.heldout_data else None  # a bad file fails before training
    before = agreement(target, init, held) if held and init is not None else None
    head, log = train_head(
        target,
        args.data,
        out_dir=args.out,
        num_layers=spec.get("eagle_layers"),
        vocab=spec.get("vocab"),
        init=init,
        steps=args.steps,
        batch_size=args.batch_size,
        window=args.window,
        learning_rate=args.learning_rate,
        warmup=args.warmup,
        seed=args.seed,
        checkpoint_every=args.checkpoint_every,
        progress=not args.no_progress,
        name=name,
    )
    _report(args, log, target, head)
    if args.temperature_scale == "auto":
        best, table = tune_temperature_scale(target, head, held)
        _print_choice(
            "held-out acceptance at temperature 1 (teacher-forced, draft step 1 / 2) by temperature scale:", table, best
        )
        head = dataclasses.replace(head, temperature_scale=best)
    elif args.temperature_scale is not None:
        head = dataclasses.replace(head, temperature_scale=args.temperature_scale)
    if args.tree_temperature_scale is not None:
        head = dataclasses.replace(head, tree_temperature_scale=args.tree_temperature_scale)
    if held:
        after = agreement(target, head, held)
        for key, what in (("step", "agreement"), ("accept", "acceptance at temperature 1")):
            was = f"{before[key + '1']:.3f} / {before[key + '2']:.3f} -> " if before else ""
            print(
                f"held-out {what} (teacher-forced, draft step 1 / 2): {was}{after[key + '1']:.3f} / "
                f"{after[key + '2']:.3f} on {after['tokens']} tokens of {len(held)} records"
            )
        print(f"temperature scale: {head.temperature_scale:g}")
    if args.save_draft:
        print(f"saved the EAGLE head to {eagle.save(head, args.save_draft)}")
    return head


def _run_offline(args, target, draft, save):
    """``--data``: ``distill_offline`` on the stored outputs, α on ``--heldout`` if given, ``--save-draft`` in bf16."""
    if args.loss != "fkl":
        raise SystemExit(
            f"jaxspec distill: --loss {args.loss} is online distillation's (--prompts); --data trains by cross-entropy"
        )
    trained, log = distill_offline(
        draft,
        args.data,
        out_dir=args.out,
        steps=args.steps,
        batch_size=args.batch_size,
        learning_rate=args.learning_rate,
        warmup=args.warmup,
        seed=args.seed,
        prompt_weight=args.prompt_weight,
        checkpoint_every=args.checkpoint_every,
        progress=not args.no_progress,
    )
    _report(args, log, target, trained)
    if args.save_draft:
        trained = trained.replace(name=Path(args.save_draft).name)
        print(f"saved the distilled draft to {save(trained, args.save_draft, storage_dtype='bfloat16')}")
    return trained
