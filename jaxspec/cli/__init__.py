"""``jaxspec``: the command line.

    jaxspec generate "prompt"                          stream one completion, stats to stderr
    jaxspec generate --input in.jsonl --output o.jsonl  resumable batch evaluation (Spec-Bench style records)
    jaxspec convert SRC DST [--to jaxspec|hf]          Hugging Face <-> jaxspec checkpoint directories
    jaxspec export-hf SRC DST                          the same as ``convert --to hf``
    jaxspec bench ...                                  ``python -m jaxspec.bench ...``
    jaxspec distill ...                                a draft model or EAGLE head for a target (``distill``)
    jaxspec train ...                                  the shipped pair from scratch (``train``)

``main(argv) -> int`` is the exit code: 0 success, 2 bad usage or inputs (reported before any model is loaded
whenever it can be known then), 1 a failure at run time. Errors are one line, ``jaxspec: error: ...``, on stderr.

One module per subcommand: ``generate`` (flags, one streamed prompt) with ``batch`` (the resumable ``--input``
job) and ``records`` (its records, summary table and plot), ``convert``, ``distill``, ``train``; ``models`` loads
the models named by the flags, ``progress`` names the long stages on stderr and ``common`` holds ``CliError``. The
JSONL reading and appending is ``jaxspec.formats.jsonl``. ``bench``, ``distill`` and ``train`` parse their own
flags (``main`` forwards them).
"""

from __future__ import annotations

import argparse
import importlib
import sys

import jaxspec
from jaxspec.cli import convert, generate
from jaxspec.cli.batch import row_seed
from jaxspec.cli.common import CliError
from jaxspec.cli.convert import cmd_convert
from jaxspec.cli.generate import GENERATE_HELP, cmd_generate
from jaxspec.cli.models import DEFAULT_DRAFT, DEFAULT_TARGET
from jaxspec.cli.records import accept_lengths, plot_acceptance, position_acceptance, summary_table

__all__ = [
    "DEFAULT_DRAFT",
    "DEFAULT_TARGET",
    "FORWARDED",
    "GENERATE_HELP",
    "CliError",
    "accept_lengths",
    "build_parser",
    "cmd_convert",
    "cmd_generate",
    "main",
    "plot_acceptance",
    "position_acceptance",
    "row_seed",
    "summary_table",
]

FORWARDED = {"bench": "jaxspec.bench.__main__", "distill": "jaxspec.cli.distill", "train": "jaxspec.cli.train"}
"""Subcommands whose arguments go, unparsed, to their module's own ``main``."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse prints usage + exits; we want one line and a return code
        raise CliError(f"{message} (see '{self.prog} --help')")


def build_parser() -> argparse.ArgumentParser:
    """The ``jaxspec`` parser; each subcommand's parsed arguments carry their ``handler(args) -> exit code``.
    ``bench``, ``distill`` and ``train`` appear for ``--help`` only (``main`` forwards them before parsing)."""
    p = _Parser(
        prog="jaxspec",
        description="Exact speculative decoding for JAX/Flax language models.",
        epilog="Run 'jaxspec COMMAND --help' for a command's options.",
    )
    p.add_argument("--version", action="version", version=f"jaxspec {jaxspec.__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    generate.add_parser(sub)
    convert.add_parsers(sub)
    sub.add_parser(
        "bench", add_help=False, help="the engine benchmark: 'jaxspec bench --help' (python -m jaxspec.bench)"
    )
    sub.add_parser(
        "distill",
        add_help=False,
        help="distill a draft from a target: 'jaxspec distill --help'",
    )
    sub.add_parser("train", add_help=False, help="train the shipped pair from scratch: 'jaxspec train --help'")
    return p


def _forward(command: str, argv: list[str]) -> int:
    # imported on use: these commands import the whole of jaxspec and JAX, which `jaxspec --help` does not need
    module = FORWARDED[command]
    try:
        forwarded = importlib.import_module(module).main
    except ModuleNotFoundError as err:
        if err.name != module:
            raise
        raise CliError(f"the {command} command is not available: {module} is not installed") from None
    try:
        forwarded(argv)
    except SystemExit as exit_:  # argparse: --help (0) or bad flags (2, already reported by that parser)
        return exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    return 0


def _run(argv: list[str]) -> int:
    if argv and argv[0] in FORWARDED:
        return _forward(argv[0], argv[1:])
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # --help / --version
        return exit_.code if isinstance(exit_.code, int) else 0
    return args.handler(args)


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit code (0 ok, 2 bad usage or inputs, 1 failure at run time)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        return _run(argv)
    except CliError as err:
        message, code = str(err), err.code
    except (FileNotFoundError, FileExistsError, NotADirectoryError, ValueError) as err:
        message, code = str(err), 2
    except KeyboardInterrupt:
        message, code = "interrupted (records written so far are kept; rerun to resume)", 130
    except BrokenPipeError:
        return 1
    except Exception as err:  # noqa: BLE001  (one line for the user; the type says what failed)
        message, code = f"{type(err).__name__}: {err}", 1
    print(f"jaxspec: error: {' '.join(message.split())}", file=sys.stderr, flush=True)
    return code
