"""``jaxspec train``: train the shipped pair's models from scratch, or export one (``jaxspec.training.pretrain``).

jaxspec train --run runs/pair --model target --steps 1100
jaxspec train --run runs/pair --model draft --teacher target --steps 1500
jaxspec train --run runs/pair --export target checkpoints/code-target --bf16
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from jaxspec.training import pretrain


def build_parser() -> argparse.ArgumentParser:
    """The command's flags (``main`` parses them; the docs' examples are checked against it)."""
    ap = argparse.ArgumentParser(prog="jaxspec train", description=pretrain.__doc__.split("\n")[0])
    ap.add_argument("--run", required=True, help="run directory (created; resumed if it has checkpoints)")
    ap.add_argument("--model", choices=sorted(pretrain.PAIR_CONFIGS), help="the model to train")
    ap.add_argument("--teacher", choices=sorted(pretrain.PAIR_CONFIGS), help="distill from this model of the same run")
    ap.add_argument("--export", nargs=2, metavar=("MODEL", "DIR"), help="save MODEL's latest checkpoint to DIR")
    ap.add_argument("--bf16", action="store_true", help="with --export: store the weights in bfloat16")
    for field in dataclasses.fields(pretrain.TrainConfig):
        ap.add_argument(f"--{field.name.replace('_', '-')}", type=type(field.default), default=field.default)
    return ap


def main(argv=None):
    """``jaxspec train``: train (``--model``) or export (``--export``) a model of a run directory."""
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.export:
        pretrain.export(Path(args.run), args.export[0], Path(args.export[1]), args.bf16)
        return
    if args.model is None:
        ap.error("--model is required (or --export MODEL DIR)")
    if args.teacher == args.model:
        ap.error("--teacher must be another model of the run")
    cfg = pretrain.TrainConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(pretrain.TrainConfig)})
    pretrain.prepare_run(Path(args.run))
    pretrain.train(Path(args.run), args.model, cfg, teacher=args.teacher)
