"""``jaxspec generate``: its flags and help, and one prompt streamed to stdout (a batch from ``--input`` is
``jaxspec.cli.batch``)."""

from __future__ import annotations

import argparse
import sys

import jaxspec
from jaxspec.cli import batch
from jaxspec.cli.common import CliError
from jaxspec.cli.models import (
    DEFAULT_DRAFT,
    DEFAULT_TARGET,
    check_models,
    default_draft,
    gen_kwargs,
    load_models,
)
from jaxspec.cli.progress import Progress
from jaxspec.drafters import branching
from jaxspec.loop import compile_cache

GENERATE_HELP = """\
Generate with the target model, speculatively when a draft is given (the output has the target's distribution).

One prompt:  jaxspec generate "def f(x):"
  The verified text is streamed to stdout as it is produced (no newline is added unless stdout is a terminal);
  stats go to stderr: α (accepted ÷ drafted), τ (tokens ÷ target passes), tokens/s and target passes. The
  speed-up is measured only with --compare (non-streamed plain vs speculative runs, compilation excluded);
  without it, --gamma auto prints its estimate τ/(γc+v) from measured step costs (c: draft step ÷ target step,
  v: verify pass ÷ target step), and other runs print none.

Batch:  jaxspec generate --input prompts.jsonl --output out.jsonl [--batch-size 8]
  Continuous batching: --batch-size slots decode together and a finished row's slot takes the next prompt at
  once; each record is written as soon as its row finishes (so records come in finishing order).
  Input lines: {"id": ..., "prompt": "...", "category": "..." (optional)}, or Spec-Bench / MT-bench
  {"question_id": ..., "category": ..., "turns": ["...", ...]} (the first turn is the prompt; id = question_id).
  Ids are ints or strings and must be unique. Structured output per line: "constraint": {"json_schema": {...}},
  {"regex": "..."} or {"choices": ["...", ...]}.
  Output: one JSON record per prompt, appended, written whole and fsync'ed: id, category, prompt, text,
  token_ids, finish_reason, new_tokens, wall_time, accept_lengths, alpha, rounds (target passes after prefill),
  drafted, accepted, accept_hist, gamma, and a Spec-Bench "choices" entry (turns, new_tokens, wall_time,
  accept_lengths as lists) so Spec-Bench's speed.py reads the file as is. With --compare also plain_wall_time
  and plain_new_tokens; with a constraint also complete (the output matches it in full) and forced_tokens.
    wall_time: the row's share of the job's device time (compilation excluded): each decode stretch's time split
      over the rows by the tokens they generated in it, each prefill's over the rows it inserted; so a
      category's tokens ÷ wall time is its throughput.
    accept_lengths: accepted drafts + 1 for each round, rebuilt from the row's accept-length histogram (a plain
      step taken while prompt lookup had no match counts 1): the round order is not preserved (ascending), and
      the prefill's first token is not a round.
  Resuming: ids already in --output are skipped, so a killed job rerun with the same arguments ends with every
  id exactly once; a partial last line left by a crash is removed (and reported) before appending.
  At the end a per-category table goes to stdout: rows, tokens, α, τ, tokens/s and the speed-up (measured
  with --compare, which first runs plain decoding over the same prompts; "-" otherwise).

Progress (stderr, when it is a terminal, or with --progress): a line as each stage begins (loading, compiling)
and a bar per pass (plain pass: --compare's baseline, which writes no record; speculative pass: records appended
as rows finish).
"""


# --------------------------------------------------------------------------------------------- arguments


def tree_arg(text: str) -> tuple[int, int, int]:
    """``--tree``: ``DEPTH,BRANCH,WIDTH``, three ints >= 1."""
    try:
        return branching.parse_tree(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def gamma_arg(text: str):
    """``--gamma``: an int >= 1 or ``"auto"``."""
    if text == "auto":
        return "auto"
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an int >= 1 or 'auto', got {text!r}")
    return value


def number_arg(kind, lo=None, hi=None, lo_open=False, what=""):
    """An argparse ``type``: ``kind(text)`` within [``lo``, ``hi``] (``lo`` excluded if ``lo_open``); ``what``
    describes the allowed values in the error."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None
        if (lo is not None and (value < lo or (lo_open and value == lo))) or (hi is not None and value > hi):
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
        return value

    return parse


positive = number_arg(int, lo=1, what="an int >= 1")


def _add_model_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("models")
    g.add_argument(
        "--target",
        default=DEFAULT_TARGET,
        help=f"target model: a shipped or named model, a jaxspec or Hugging Face directory, a GGUF file or a Hugging "
        f"Face Hub id such as Qwen/Qwen2.5-0.5B-Instruct (default {DEFAULT_TARGET})",
    )
    g.add_argument(
        "--draft",
        help=f"draft model or EAGLE head like --target; 'none' = plain decoding, 'prompt_lookup' = n-gram drafts "
        f"from the prompt (default: the target's shipped drafter, {default_draft(DEFAULT_TARGET)} for "
        f"{DEFAULT_TARGET}; {DEFAULT_DRAFT} for other targets)",
    )
    g.add_argument(
        "--dtype",
        choices=["float32", "bfloat16", "float16"],
        help="load both models in this dtype (default: a jaxspec checkpoint's own, float32 for HF)",
    )
    g.add_argument(
        "--quantize",
        choices=["int8", "w8a8"],
        help="hold the projections and embeddings of both models as int8 with a float scale per output channel: "
        "int8 multiplies in floats, w8a8 also rounds each product's inputs to int8 and multiplies in integers "
        "(jaxspec.quantize; default: as loaded)",
    )
    g.add_argument(
        "--compilation-cache",
        metavar="DIR",
        help="keep compiled programs in DIR so a later run's first call loads them instead of compiling; 'off' "
        "disables it (default: $JAXSPEC_COMPILATION_CACHE, else ~/.cache/jaxspec/xla; jaxspec.loop.compile_cache)",
    )


def _add_sampling_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("decoding")
    g.add_argument(
        "--gamma",
        type=gamma_arg,
        help="draft tokens per round, or 'auto' (default: the drafter's: 3 for an EAGLE-3 head, 2 for an EAGLE-1 "
        "head, 4 otherwise)",
    )
    g.add_argument(
        "--tree",
        type=tree_arg,
        help="DEPTH,BRANCH,WIDTH: with an EAGLE head or a draft model, draft a tree each round (the root's BRANCH "
        "best children, then the WIDTH most promising per level, DEPTH levels) verified in one target pass; γ is DEPTH",
    )
    g.add_argument("--max-new-tokens", type=positive, default=128, help="per prompt (default 128)")
    g.add_argument(
        "--temperature",
        type=number_arg(float, lo=0, what="a number >= 0"),
        default=0.0,
        help="0 = greedy (default, as in Spec-Bench)",
    )
    g.add_argument("--top-k", type=number_arg(int, lo=0, what="an int >= 0"), default=None, help="0 or unset = off")
    g.add_argument(
        "--top-p",
        type=number_arg(float, lo=0, hi=1, lo_open=True, what="a number in (0, 1]"),
        default=None,
        help="unset or 1 = off",
    )
    g.add_argument(
        "--seed",
        type=number_arg(int, lo=0, hi=2**32 - 1, what="an int in [0, 2**32)"),
        default=0,
        help="sampling seed; in batch mode each row's seed is derived from it and the row's id, so a "
        "row's sample does not depend on its batch or on resuming",
    )
    g.add_argument(
        "--chat",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="wrap each prompt as a user turn with the chat template (default: when the target's tokenizer has one)",
    )
    g.add_argument(
        "--compare",
        action="store_true",
        help="also run plain decoding (same settings) and report the measured speed-up",
    )


def add_parser(sub) -> None:
    """Add the ``generate`` subcommand to ``sub`` (the subparsers of ``build_parser``)."""
    g = sub.add_parser(
        "generate",
        help="generate for one prompt (streamed) or a JSONL file of prompts (resumable batch job)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=GENERATE_HELP,
    )
    g.add_argument("prompt", nargs="?", help="one prompt ('-' reads it from stdin); streamed to stdout")
    g.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="on stderr, a line as each stage begins (loading, compiling, plain pass, speculative pass) and the "
        "batch job's progress bars (default: when stderr is a terminal)",
    )
    b = g.add_argument_group("batch mode")
    b.add_argument("-i", "--input", metavar="JSONL", help="prompts, one JSON object a line (see above)")
    b.add_argument("-o", "--output", metavar="JSONL", help="records, appended; rerun to resume")
    b.add_argument(
        "--batch-size",
        type=positive,
        default=8,
        help="slots: rows decoded together, each refilled as soon as its row finishes (default 8)",
    )
    b.add_argument(
        "--on-error",
        choices=["fail", "skip"],
        default="fail",
        help="malformed or duplicate input lines: fail (exit 2 before generating; default) or skip them with a warning",
    )
    b.add_argument("--plot", metavar="PNG", help="plot acceptance by draft position per category (needs matplotlib)")
    _add_model_args(g)
    _add_sampling_args(g)
    g.set_defaults(handler=cmd_generate)


# --------------------------------------------------------------------------------------------- one prompt


def speedup_line(stats) -> str:
    """The stderr line on speed-up after a streamed prompt without ``--compare``: none (plain decoding), the
    estimate τ/(γc+v) from ``gamma="auto"``'s timings, or "not measured". τ alone is no estimate: it bounds the
    speed-up only as the draft's cost goes to zero, and a real drafter's cost and verification overhead can bring
    a τ of 2.5 down to a measured 1.1×, so it is not shown as one."""
    tau, pol = stats.tokens_per_round, stats.policy
    if stats.mode == "plain":
        return "speed-up: none, plain decoding" + (f" (gamma=auto chose it: {pol['reason']})" if pol else "")
    if pol and pol.get("gamma"):
        g = pol["gamma"]
        v = pol["v"].get(g, pol["v"].get(str(g)))
        est = tau / (g * pol["c"] + v)
        return (
            f"est. speed-up ≈ τ/(γc+v) = {tau:.2f}/({g}·{pol['c']:.3f}+{v:.2f}) = {est:.2f}× "
            "(from gamma=auto's step timings; not measured: use --compare)"
        )
    return "speed-up: not measured (--compare measures it: the prompt decoded again, plainly and speculatively)"


def one_prompt(args: argparse.Namespace, progress: Progress) -> int:
    """Stream one prompt's completion to stdout, stats to stderr (and ``progress``'s stage lines); returns the exit
    code."""
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    if not prompt.strip():  # jaxspec.stream refuses it too; here before any model is loaded
        raise CliError(f"prompt: is {'only whitespace' if prompt else 'empty'}; give it some text")
    for flag in ("output", "plot"):
        if getattr(args, flag):
            raise CliError(f"--{flag} needs --input (batch mode)")
    check_models(args)
    target, draft = load_models(args, progress)
    kw = gen_kwargs(args, draft)
    stream = jaxspec.stream(target, [prompt], draft=draft, seed=args.seed, **kw)
    progress.stage("compiling", "the decoding programs; the text streams to stdout once they run")
    pieces = []
    for step in stream:
        piece = step.texts[0] if step.texts else ""
        if piece:
            sys.stdout.write(piece)
            sys.stdout.flush()
            pieces.append(piece)
    result = stream.result
    assert result is not None and result.texts is not None  # set at the stream's end; a text prompt has a tokenizer
    shown = "".join(pieces)
    text = result.texts[0]
    if len(text) > len(shown) and text.startswith(shown):  # text held back as incomplete UTF-8 at the very end
        sys.stdout.write(text[len(shown) :])
    if sys.stdout.isatty():
        sys.stdout.write("\n")
    sys.stdout.flush()
    stats = result.stats
    err = sys.stderr
    print(f"{stats.summary()} (streamed: includes a host sync per round), finish: {result.finish_reasons[0]}", file=err)
    if stats.acceptance_rate is not None:
        print(
            f"α = {stats.acceptance_rate:.3f}, τ = {stats.tokens_per_round:.2f} tokens per target pass, "
            f"{stats.target_passes} target passes, {stats.tokens_per_s:.1f} tokens/s",
            file=err,
        )
    if args.compare:
        progress.stage("speculative pass", "the prompt again, not streamed, for --compare (compiling first)")
        spec = jaxspec.generate(target, [prompt], draft=draft, seed=args.seed, **kw).stats
        progress.stage("plain pass", "the prompt with plain decoding, for --compare (compiling first)")
        plain = jaxspec.generate(target, [prompt], draft=None, seed=args.seed, **gen_kwargs(args, None)).stats
        print(
            f"measured speed-up: {spec.tokens_per_s / plain.tokens_per_s:.2f}× (speculative {spec.tokens_per_s:.1f} "
            f"tok/s vs plain {plain.tokens_per_s:.1f} tok/s; non-streamed runs, compilation excluded)",
            file=err,
        )
    else:
        print(speedup_line(stats), file=err)
    err.flush()
    return 0


def compilation_cache(value: str | None):
    """``--compilation-cache``: turn JAX's persistent compilation cache on (``enable_compilation_cache``) unless
    ``value`` (or, without it, ``$JAXSPEC_COMPILATION_CACHE``) says off; returns its directory or None."""
    if value is not None and compile_cache.is_off(value):
        return None
    try:
        return compile_cache.enable_compilation_cache(value)
    except ValueError as err:
        raise CliError(f"--compilation-cache: {err}") from None


def cmd_generate(args: argparse.Namespace) -> int:
    """``jaxspec generate``: the batch job with ``--input``, else one prompt; returns the exit code."""
    if args.draft is None:
        args.draft = default_draft(args.target)
    compilation_cache(args.compilation_cache)
    progress = Progress(args.progress)
    if args.input is not None:
        return batch.run(args, progress)
    if args.prompt is None:
        raise CliError("give a prompt, or --input JSONL --output JSONL for a batch")
    return one_prompt(args, progress)
