"""``jaxspec convert SRC DST [--to jaxspec|hf]`` and ``jaxspec export-hf SRC DST`` (the same as ``--to hf``)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import jaxspec
from jaxspec.cli.common import CliError
from jaxspec.cli.progress import Progress
from jaxspec.formats import hub, named, paths


def add_parsers(sub) -> None:
    """Add the ``convert`` and ``export-hf`` subcommands to ``sub`` (the subparsers of ``build_parser``)."""
    for name, to in (("convert", None), ("export-hf", "hf")):
        c = sub.add_parser(
            name,
            help="convert a model (HF directory, GGUF file, named model) to jaxspec or HF"
            if to is None
            else "the same as 'convert --to hf'",
            description="Load SRC (a jaxspec directory, a Hugging Face directory or a shipped name) and write it "
            "to DST, which must not exist or be empty. --to jaxspec: an orbax checkpoint "
            "(jaxspec.save); --to hf: config.json + model.safetensors + tokenizer (jaxspec.export_hf, "
            "Llama family only).",
        )
        c.add_argument("src", metavar="SRC")
        c.add_argument("dst", metavar="DST")
        c.add_argument(
            "--dtype", choices=["float32", "bfloat16", "float16"], help="load (and so write) the weights in this dtype"
        )
        if to is None:
            c.add_argument("--to", choices=["jaxspec", "hf"], default="jaxspec", help="output format (default jaxspec)")
        else:
            c.set_defaults(to=to)
        c.set_defaults(handler=cmd_convert)


def cmd_convert(args: argparse.Namespace) -> int:
    """Load ``args.src`` (a named model, a model directory or a GGUF file) and write it to the new or empty
    directory ``args.dst`` as ``args.to`` (``jaxspec`` or ``hf``); returns the exit code."""
    if named.names_model(args.src) or (hub.is_repo_id(args.src) and not args.src.startswith(paths.SHIPPED_PREFIX)):
        src = args.src  # a named model (GGUF) or a Hugging Face Hub id, resolved by jaxspec.load
    else:
        try:
            src = paths.resolve(args.src)
        except FileNotFoundError as err:
            raise CliError(f"SRC: {err}") from None
        if not src.exists():
            raise CliError(f"SRC: {args.src} does not exist")
        if not src.is_dir() and src.suffix != ".gguf":
            raise CliError(f"SRC: {args.src} is not a model directory or a GGUF file")
    dst = Path(args.dst)
    if dst.exists() and (not dst.is_dir() or any(dst.iterdir())):
        raise CliError(f"DST: {dst} exists and is not an empty directory; choose a new path")
    if not dst.exists():
        parent = next((p for p in dst.absolute().parents if p.exists()), None)
        if parent is None or not os.access(parent, os.W_OK | os.X_OK):
            raise CliError(f"DST: cannot create {dst} ({parent} is not writable)")
    progress = Progress()  # the stages of a large model take a while: named on a terminal
    progress.stage("loading", str(args.src))
    try:
        model = jaxspec.load(src, args.dtype)
    except (OSError, ValueError) as err:  # not found, gated (PermissionError), unsupported
        raise CliError(f"SRC: cannot load {args.src}: {err}") from None
    progress.stage("writing", f"{dst} ({args.to})")
    if args.to == "hf":
        written = jaxspec.export_hf(model, dst)
    else:
        written = jaxspec.save(model, dst)
    print(f"wrote {args.to} model {model.name!r} ({model.num_params:,} parameters) to {written}")
    return 0
