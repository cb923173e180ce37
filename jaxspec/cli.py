"""``jaxspec``: the command line.

    jaxspec generate "prompt"                          stream one completion, stats to stderr
    jaxspec generate --input in.jsonl --output o.jsonl  resumable batch evaluation (Spec-Bench style records)
    jaxspec convert SRC DST [--to jaxspec|hf]          Hugging Face <-> jaxspec checkpoint directories
    jaxspec export-hf SRC DST                          the same as ``convert --to hf``
    jaxspec bench ...                                  ``python -m jaxspec.bench ...``
    jaxspec distill ...                                ``python -m jaxspec.distill ...``

``main(argv) -> int`` is the exit code: 0 success, 2 bad usage or inputs (reported before any model is loaded
whenever it can be known then), 1 a failure at run time. Errors are one line, ``jaxspec: error: ...``, on stderr.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib.util
import json
import os
import sys
from pathlib import Path

DEFAULT_TARGET = "smollm2-135m-instruct"  # a named model: SmolLM2-135M-Instruct (GGUF, fetched once; jaxspec.named)
# Its shipped draft (jaxspec/smollm2-draft) is still an early checkpoint that loses to plain decoding; prompt lookup
# is what speeds SmolLM2 up today (README, HumanEval table), so it is the default drafter.
DEFAULT_DRAFT = "prompt_lookup"
FORWARDED = ("bench", "distill")


class CliError(Exception):
    """A failure to report as one line; ``code`` 2 for bad usage/inputs, 1 for run-time failures."""

    def __init__(self, message: str, code: int = 2):
        super().__init__(message)
        self.code = code


def _warn(message: str) -> None:
    print(f"jaxspec: warning: {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------- arguments


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse prints usage + exits; we want one line and a return code
        raise CliError(f"{message} (see '{self.prog} --help')")


def _gamma(text: str):
    if text == "auto":
        return "auto"
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an int >= 1 or 'auto', got {text!r}")
    return value


def _number(kind, lo=None, hi=None, lo_open=False, what=""):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None
        if (lo is not None and (value < lo or (lo_open and value == lo))) or (hi is not None and value > hi):
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
        return value

    return parse


_positive = _number(int, lo=1, what="an int >= 1")


def _add_model_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("models")
    g.add_argument(
        "--target",
        default=DEFAULT_TARGET,
        help=f"target model: a shipped name, a jaxspec or a Hugging Face directory (default {DEFAULT_TARGET})",
    )
    g.add_argument(
        "--draft",
        default=DEFAULT_DRAFT,
        help=f"draft model like --target; 'none' = plain decoding, 'prompt_lookup' = n-gram drafts from "
        f"the prompt (default {DEFAULT_DRAFT})",
    )
    g.add_argument(
        "--dtype",
        choices=["float32", "bfloat16", "float16"],
        help="load both models in this dtype (default: a jaxspec checkpoint's own, float32 for HF)",
    )


def _add_sampling_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("decoding")
    g.add_argument("--gamma", type=_gamma, default=4, help="draft tokens per round, or 'auto' (default 4)")
    g.add_argument("--max-new-tokens", type=_positive, default=128, help="per prompt (default 128)")
    g.add_argument(
        "--temperature",
        type=_number(float, lo=0, what="a number >= 0"),
        default=0.0,
        help="0 = greedy (default, as in Spec-Bench)",
    )
    g.add_argument("--top-k", type=_number(int, lo=0, what="an int >= 0"), default=None, help="0 or unset = off")
    g.add_argument(
        "--top-p",
        type=_number(float, lo=0, hi=1, lo_open=True, what="a number in (0, 1]"),
        default=None,
        help="unset or 1 = off",
    )
    g.add_argument(
        "--seed",
        type=_number(int, lo=0, hi=2**32 - 1, what="an int in [0, 2**32)"),
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


def build_parser() -> argparse.ArgumentParser:
    import jaxspec

    p = _Parser(
        prog="jaxspec",
        description="Exact speculative decoding for JAX/Flax language models.",
        epilog="Run 'jaxspec COMMAND --help' for a command's options.",
    )
    p.add_argument("--version", action="version", version=f"jaxspec {jaxspec.__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    g = sub.add_parser(
        "generate",
        help="generate for one prompt (streamed) or a JSONL file of prompts (resumable batch job)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=GENERATE_HELP,
    )
    g.add_argument("prompt", nargs="?", help="one prompt ('-' reads it from stdin); streamed to stdout")
    b = g.add_argument_group("batch mode")
    b.add_argument("-i", "--input", metavar="JSONL", help="prompts, one JSON object a line (see above)")
    b.add_argument("-o", "--output", metavar="JSONL", help="records, appended; rerun to resume")
    b.add_argument("--batch-size", type=_positive, default=8, help="prompts per generate call (default 8)")
    b.add_argument(
        "--on-error",
        choices=["fail", "skip"],
        default="fail",
        help="malformed or duplicate input lines: fail (exit 2 before generating; default) or skip them with a warning",
    )
    b.add_argument("--plot", metavar="PNG", help="plot acceptance by draft position per category (needs matplotlib)")
    b.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_model_args(g)
    _add_sampling_args(g)
    g.set_defaults(handler=cmd_generate)

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

    sub.add_parser(
        "bench", add_help=False, help="the engine benchmark: 'jaxspec bench --help' (python -m jaxspec.bench)"
    )
    sub.add_parser(
        "distill",
        add_help=False,
        help="distill a draft from a target: 'jaxspec distill --help' (python -m jaxspec.distill)",
    )
    return p


GENERATE_HELP = """\
Generate with the target model, speculatively when a draft is given (the output has the target's distribution).

One prompt:  jaxspec generate "def f(x):"
  The verified text is streamed to stdout as it is produced (no newline is added unless stdout is a terminal);
  stats go to stderr: α (accepted ÷ drafted), τ (tokens ÷ target passes), tokens/s and target passes. The
  speed-up is measured only with --compare (non-streamed plain vs speculative runs, compilation excluded);
  otherwise τ is printed as its upper bound: the estimate is τ/(γc+v), with c (draft step ÷ target step) and v
  (verify pass ÷ target step) known only with --gamma auto.

Batch:  jaxspec generate --input prompts.jsonl --output out.jsonl [--batch-size 8]
  Input lines: {"id": ..., "prompt": "...", "category": "..." (optional)}, or Spec-Bench / MT-bench
  {"question_id": ..., "category": ..., "turns": ["...", ...]} (the first turn is the prompt; id = question_id).
  Ids are ints or strings and must be unique.
  Output: one JSON record per prompt, appended, written whole and fsync'ed: id, category, prompt, text,
  token_ids, finish_reason, new_tokens, wall_time, accept_lengths, alpha, rounds (target passes after prefill),
  drafted, accepted, accept_hist, gamma, and a Spec-Bench "choices" entry (turns, new_tokens, wall_time,
  accept_lengths as lists) so Spec-Bench's speed.py reads the file as is. With --compare also plain_wall_time
  and plain_new_tokens.
    wall_time: the batch's device time (compilation excluded) split over its rows in proportion to their new
      tokens, so a category's tokens ÷ wall time is the batch throughput.
    accept_lengths: accepted drafts + 1 for each round, rebuilt from the row's accept-length histogram: the
      round order is not preserved (ascending), and the prefill's first token is not a round.
  Resuming: ids already in --output are skipped, so a killed job rerun with the same arguments ends with every
  id exactly once; a partial last line left by a crash is removed (and reported) before appending.
  At the end a per-category table goes to stdout: rows, tokens, α, τ, tokens/s and the speed-up (measured
  with --compare, which also runs plain decoding for every batch; "-" otherwise).
"""


# --------------------------------------------------------------------------------------------- models


def _check_model_arg(value: str, flag: str) -> None:
    from jaxspec import named
    from jaxspec.checkpoint import resolve

    if named.is_model(value) and not Path(value).exists():
        return  # installed, cached or fetched when loaded (a failed fetch says what to run)
    try:
        path = resolve(value)
    except FileNotFoundError as err:
        raise CliError(f"{flag}: {err}") from None
    if not path.is_dir() and not (path.is_file() and path.suffix == ".gguf"):
        raise CliError(
            f"{flag}: {value!r} is not a model directory, a GGUF file, a named model or a shipped model name"
        )


def _is_none(value: str) -> bool:
    return value.lower() in ("none", "plain")


def _check_models(args) -> None:
    if args.compare and _is_none(args.draft):
        raise CliError("--compare needs a draft (it measures speculative against plain decoding); got --draft none")
    _check_model_arg(args.target, "--target")
    if not _is_none(args.draft) and args.draft != "prompt_lookup":
        _check_model_arg(args.draft, "--draft")


def _load_models(args):
    import jaxspec

    def load(value, flag):
        try:
            return jaxspec.load(value, args.dtype)
        except (FileNotFoundError, ValueError) as err:
            raise CliError(f"{flag}: cannot load {value!r}: {err}") from None

    target = load(args.target, "--target")
    if _is_none(args.draft):
        draft = None
    elif args.draft == "prompt_lookup":
        draft = "prompt_lookup"
    else:
        draft = load(args.draft, "--draft")
    if target.tokenizer is None:
        raise CliError(f"--target: {args.target!r} has no tokenizer; the command line works with text prompts")
    if args.chat is None:
        args.chat = getattr(target.tokenizer, "chat_template", None) is not None
    elif args.chat and getattr(target.tokenizer, "chat_template", None) is None:
        raise CliError(f"--chat: {args.target!r}'s tokenizer has no chat template")
    return target, draft


def _gen_kwargs(args, draft) -> dict:
    kw = dict(
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        chat=args.chat,
    )
    if draft is not None:
        kw["gamma"] = args.gamma
    return kw


# --------------------------------------------------------------------------------------------- one prompt


def _speedup_line(stats) -> str:
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
    return (
        f"est. speed-up ≤ τ = {tau:.2f} (the estimate τ/(γc+v) needs the draft cost c and verify cost v, not "
        "measured here; --compare measures the speed-up)"
    )


def _one_prompt(args) -> int:
    import jaxspec

    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    if not prompt:
        raise CliError("prompt: the prompt is empty")
    for flag in ("output", "plot"):
        if getattr(args, flag):
            raise CliError(f"--{flag} needs --input (batch mode)")
    _check_models(args)
    target, draft = _load_models(args)
    kw = _gen_kwargs(args, draft)
    stream = jaxspec.stream(target, [prompt], draft=draft, seed=args.seed, **kw)
    shown = []
    for step in stream:
        piece = step.texts[0] if step.texts else ""
        if piece:
            sys.stdout.write(piece)
            sys.stdout.flush()
            shown.append(piece)
    result = stream.result
    shown = "".join(shown)
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
        spec = jaxspec.generate(target, [prompt], draft=draft, seed=args.seed, **kw).stats
        plain = jaxspec.generate(target, [prompt], draft=None, seed=args.seed, **_gen_kwargs(args, None)).stats
        print(
            f"measured speed-up: {spec.tokens_per_s / plain.tokens_per_s:.2f}× (speculative {spec.tokens_per_s:.1f} "
            f"tok/s vs plain {plain.tokens_per_s:.1f} tok/s; non-streamed runs, compilation excluded)",
            file=err,
        )
    else:
        print(_speedup_line(stats), file=err)
    err.flush()
    return 0


# --------------------------------------------------------------------------------------------- batch input


@dataclasses.dataclass(frozen=True)
class Row:
    id: object
    prompt: str
    category: str | None
    line: int
    question: bool  # Spec-Bench / MT-bench format (question_id, turns)

    @property
    def key(self) -> str:
        return _key(self.id)


def _key(row_id) -> str:
    return json.dumps(row_id)  # 1 and "1" are different ids


def _valid_id(value) -> bool:
    return (isinstance(value, int) and not isinstance(value, bool)) or (isinstance(value, str) and value != "")


def _parse_line(raw: bytes, line: int) -> Row:
    try:
        obj = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise ValueError(f"not UTF-8 ({err.reason} at byte {err.start})") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"not valid JSON ({err.msg} at column {err.colno})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    category = obj.get("category")
    if category is not None and not isinstance(category, str):
        raise ValueError(f'"category" must be a string, got {category!r}')
    if "turns" in obj or "question_id" in obj:
        row_id, turns = obj.get("question_id"), obj.get("turns")
        if not isinstance(turns, list) or not turns or not isinstance(turns[0], str) or not turns[0]:
            raise ValueError('"turns" must be a non-empty list whose first turn is a non-empty string')
        prompt, question, id_field = turns[0], True, "question_id"
    else:
        row_id, prompt, question, id_field = obj.get("id"), obj.get("prompt"), False, "id"
        if not isinstance(prompt, str) or not prompt:
            raise ValueError('needs "prompt" (a non-empty string), or "question_id" and "turns"')
    if not _valid_id(row_id):
        raise ValueError(f'"{id_field}" must be an int or a non-empty string, got {row_id!r}')
    return Row(row_id, prompt, category, line, question)


def read_prompts(path: Path, on_error: str) -> list[Row]:
    """Parse the input file; malformed and duplicate lines raise ``CliError`` (``fail``) or warn (``skip``)."""
    rows, seen, problems = [], {}, []
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            try:
                row = _parse_line(raw, number)
            except ValueError as err:
                problems.append(f"{path} line {number}: {err}")
                continue
            if row.key in seen:
                problems.append(f"{path} line {number}: duplicate id {row.id!r} (first on line {seen[row.key]})")
                continue
            seen[row.key] = number
            rows.append(row)
    if problems and on_error == "fail":
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise CliError(f"{problems[0]}{more}; nothing was generated (--on-error skip skips bad lines)")
    for message in problems[:20]:
        _warn(f"skipping {message}")
    if len(problems) > 20:
        _warn(f"skipping {len(problems) - 20} more bad lines")
    return rows


# --------------------------------------------------------------------------------------------- batch output


@dataclasses.dataclass
class Existing:
    records: dict  # key -> record (the first one for each id)
    valid_bytes: int  # length of the file up to its last complete line
    partial_bytes: int  # bytes after the last newline (a line cut short by a crash)


def read_output(path: Path) -> Existing:
    """Read the records already written (read-only); a trailing partial line is measured, not yet removed."""
    if not path.exists():
        return Existing({}, 0, 0)
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    records = {}
    for number, raw in enumerate(data[:end].split(b"\n")[:-1], start=1):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise CliError(
                f"--output: {path} line {number} is not a JSON record (not written by jaxspec "
                "generate?); fix or remove it, or choose another --output"
            ) from None
        if not isinstance(record, dict) or not _valid_id(record.get("id")):
            raise CliError(f'--output: {path} line {number} has no valid "id"; fix or remove it')
        records.setdefault(_key(record["id"]), record)
    return Existing(records, end, len(data) - end)


class Appender:
    """The output file opened for appending complete lines only (one ``os.write`` of the whole line, fsync'ed),
    locked against a second writer."""

    def __init__(self, path: Path):
        self.path = path
        self.fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            import fcntl

            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except ImportError:  # not POSIX: no lock
            pass
        except OSError:
            os.close(self.fd)
            raise CliError(f"--output: {path} is locked by another running 'jaxspec generate'") from None

    def repair(self, existing: Existing) -> None:
        """Drop a partial last line (re-checked under the lock), so every line in the file is a whole record."""
        size = os.fstat(self.fd).st_size
        if size == existing.valid_bytes:
            return
        with open(self.path, "rb") as f:
            end = f.read().rfind(b"\n") + 1
        os.ftruncate(self.fd, end)
        os.fsync(self.fd)
        _warn(
            f"{self.path} ended with a partial line ({size - end} bytes, from an interrupted run); removed it, "
            "its prompt is generated again"
        )

    def write(self, record: dict) -> None:
        data = (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view) :]
        os.fsync(self.fd)

    def close(self) -> None:
        os.close(self.fd)


def _check_paths(args) -> tuple[Path, Path]:
    inp, out = Path(args.input), Path(args.output)
    if not inp.exists():
        raise CliError(f"--input: {inp} does not exist")
    if not inp.is_file():
        raise CliError(f"--input: {inp} is not a file")
    if not os.access(inp, os.R_OK):
        raise CliError(f"--input: {inp} is not readable")
    directory = out.parent
    if out.exists() and not out.is_file():
        raise CliError(f"--output: {out} is not a regular file")
    if out.exists() and out.resolve() == inp.resolve():
        raise CliError("--output: is the same file as --input")
    if not directory.is_dir():
        raise CliError(f"--output: directory {directory} does not exist")
    if out.exists():
        if not os.access(out, os.R_OK | os.W_OK):
            raise CliError(f"--output: {out} is not readable and writable")
    elif not os.access(directory, os.W_OK | os.X_OK):
        raise CliError(f"--output: directory {directory} is not writable")
    if args.plot:
        if importlib.util.find_spec("matplotlib") is None:
            raise CliError("--plot needs matplotlib, which is not installed (pip install matplotlib)")
        plot_dir = Path(args.plot).parent
        if not plot_dir.is_dir() or not os.access(plot_dir, os.W_OK | os.X_OK):
            raise CliError(f"--plot: directory {plot_dir} does not exist or is not writable")
        if _is_none(args.draft):
            raise CliError("--plot shows draft acceptance; it needs a draft (got --draft none)")
    return inp, out


def row_seed(seed: int, row_id) -> int:
    """A row's own sampling seed: stable across batches, resumes and processes."""
    digest = hashlib.sha256(f"{seed}:{_key(row_id)}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


def accept_lengths(hist) -> list[int]:
    """Accepted drafts + 1 per round, from a histogram (``hist[n]`` rounds accepted exactly n): ascending order."""
    return [n + 1 for n, count in enumerate(hist) for _ in range(int(count))]


def _split(total: float, weights: list[int]) -> list[float]:
    s = sum(weights)
    return [total * w / s if s else total / len(weights) for w in weights]


def _record(row: Row, result, i: int, wall: float, plain=None) -> dict:
    stats = result.stats
    rs = stats.rows[i]
    lengths = accept_lengths(rs.accept_hist)
    text = result.texts[i]
    rec = {
        "id": row.id,
        "category": row.category,
        "prompt": row.prompt,
        "text": text,
        "token_ids": result.tokens[i],
        "finish_reason": result.finish_reasons[i],
        "new_tokens": rs.generated_tokens,
        "wall_time": wall,
        "accept_lengths": lengths,
        "alpha": rs.acceptance_rate,
        "rounds": rs.rounds,
        "drafted": rs.drafted,
        "accepted": rs.accepted,
        "accept_hist": list(rs.accept_hist),
        "gamma": stats.gamma,
    }
    if plain is not None:
        rec["plain_wall_time"], rec["plain_new_tokens"] = plain
    if row.question:
        rec["question_id"] = row.id
    rec["choices"] = [
        {
            "index": 0,
            "turns": [text],
            "new_tokens": [rs.generated_tokens],
            "wall_time": [wall],
            "accept_lengths": lengths,
        }
    ]
    return rec


def _batch(args) -> int:
    if args.prompt is not None:
        raise CliError("give either a prompt or --input, not both")
    if not args.output:
        raise CliError("--input needs --output (the JSONL file records are appended to)")
    inp, out = _check_paths(args)
    rows = read_prompts(inp, args.on_error)
    if not rows:
        raise CliError(f"--input: {inp} has no prompts")
    existing = read_output(out)
    pending = [r for r in rows if r.key not in existing.records]
    input_keys = {r.key for r in rows}
    stray = sum(1 for k in existing.records if k not in input_keys)
    if stray:
        _warn(f"{out} has {stray} records whose ids are not in {inp} (kept, left out of the summary)")
    done = {r.key: existing.records[r.key] for r in rows if r.key in existing.records}
    if done:
        print(
            f"jaxspec: resuming: {len(done)} of {len(rows)} ids already in {out}, {len(pending)} to generate",
            file=sys.stderr,
            flush=True,
        )
    if pending:
        _check_models(args)
        appender = Appender(out)
        try:
            target, draft = _load_models(args)
            appender.repair(existing)
            _run_batches(args, pending, target, draft, appender, done)
        finally:
            appender.close()
    elif existing.partial_bytes:
        appender = Appender(out)
        try:
            appender.repair(existing)
        finally:
            appender.close()
    ordered = [done[r.key] for r in rows if r.key in done]
    print(summary_table(ordered))
    if args.plot:
        plot_acceptance(ordered, args.plot)
    return 0


def _run_batches(args, pending: list[Row], target, draft, appender: Appender, done: dict) -> None:
    from tqdm import tqdm

    import jaxspec

    kw = _gen_kwargs(args, draft)
    tokens = wall = accepted = drafted = 0
    bar = tqdm(
        total=len(pending), unit="row", file=sys.stderr, disable=args.no_progress, dynamic_ncols=True, desc="generate"
    )
    try:
        for start in range(0, len(pending), args.batch_size):
            batch = pending[start : start + args.batch_size]
            prompts = [r.prompt for r in batch]
            seeds = [row_seed(args.seed, r.id) for r in batch]
            try:
                result = jaxspec.generate(target, prompts, draft=draft, seed=seeds, **kw)
                plain = None
                if args.compare:
                    pres = jaxspec.generate(target, prompts, draft=None, seed=seeds, **_gen_kwargs(args, None))
                    counts = [s.generated_tokens for s in pres.stats.rows]
                    plain = list(zip(_split(pres.stats.wall_time_s, counts), counts))
            except ValueError as err:
                ids = ", ".join(repr(r.id) for r in batch)
                raise CliError(f"generating ids {ids}: {err}") from None
            counts = [s.generated_tokens for s in result.stats.rows]
            walls = _split(result.stats.wall_time_s, counts)
            for i, row in enumerate(batch):
                rec = _record(row, result, i, walls[i], None if plain is None else plain[i])
                appender.write(rec)
                done[row.key] = rec
            tokens += result.stats.generated_tokens
            wall += result.stats.wall_time_s
            accepted += result.stats.accepted
            drafted += result.stats.drafted
            post = {"tok/s": f"{tokens / wall:.1f}" if wall > 0 else "-"}
            if drafted:
                post["α"] = f"{accepted / drafted:.3f}"
            bar.set_postfix(post, refresh=False)
            bar.update(len(batch))
    finally:
        bar.close()


# --------------------------------------------------------------------------------------------- report


def _category(record) -> str:
    return record.get("category") or "(none)"


def summary_table(records: list[dict]) -> str:
    """Per category (and in total): rows, tokens, α, τ, tokens/s, speed-up (measured: --compare; else "-")."""
    groups: dict[str, list[dict]] = {}
    for rec in records:
        groups.setdefault(_category(rec), []).append(rec)
    lines = [("category", "rows", "tokens", "α", "τ", "tok/s", "speed-up")]
    for name, recs in [*sorted(groups.items()), ("total", records)]:
        tokens = sum(r.get("new_tokens", 0) for r in recs)
        rounds = sum(r.get("rounds", 0) for r in recs)
        drafted = sum(r.get("drafted", 0) for r in recs)
        accepted = sum(r.get("accepted", 0) for r in recs)
        wall = sum(r.get("wall_time", 0.0) for r in recs)
        speed = "-"
        if recs and all("plain_wall_time" in r for r in recs):
            pw = sum(r["plain_wall_time"] for r in recs)
            pt = sum(r["plain_new_tokens"] for r in recs)
            if wall > 0 and pw > 0 and pt > 0:
                speed = f"{(tokens / wall) / (pt / pw):.2f}×"
        lines.append(
            (
                name,
                str(len(recs)),
                str(tokens),
                f"{accepted / drafted:.3f}" if drafted else "-",
                f"{tokens / rounds:.2f}" if rounds and drafted else "-",
                f"{tokens / wall:.1f}" if wall > 0 else "-",
                speed,
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths))) for line in lines
    )


def position_acceptance(records: list[dict]) -> list[float | None]:
    """P(draft i accepted | drafts before it accepted), i = 1..γ, pooled over rows (rows may differ in γ)."""
    reached, passed = [], []
    for rec in records:
        hist = rec.get("accept_hist") or []
        for i in range(len(hist) - 1):  # a row with γ drafts has len(hist) == γ + 1
            if i == len(reached):
                reached.append(0)
                passed.append(0)
            reached[i] += sum(hist[i:])
            passed[i] += sum(hist[i + 1 :])
    return [p / r if r else None for p, r in zip(passed, reached)]


def plot_acceptance(records: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups: dict[str, list[dict]] = {}
    for rec in records:
        groups.setdefault(_category(rec), []).append(rec)
    curves = {name: position_acceptance(recs) for name, recs in sorted(groups.items())}
    curves = {k: v for k, v in curves.items() if any(x is not None for x in v)}
    if not curves:
        _warn(f"no drafted tokens in these records (plain decoding?); {path} not written")
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, values in curves.items():
        xs = [i + 1 for i, v in enumerate(values) if v is not None]
        ax.plot(xs, [v for v in values if v is not None], marker="o", label=name)
    ax.set_xticks(range(1, max(len(v) for v in curves.values()) + 1))
    ax.set_xlabel("draft position i")
    ax.set_ylabel("P(draft i accepted | drafts before it accepted)")
    ax.set_ylim(0, 1.02)
    ax.set_title("acceptance by draft position")
    ax.legend(title="category")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    print(f"jaxspec: wrote {path}", file=sys.stderr)


def cmd_generate(args) -> int:
    if args.input is not None:
        return _batch(args)
    if args.prompt is None:
        raise CliError("give a prompt, or --input JSONL --output JSONL for a batch")
    return _one_prompt(args)


# --------------------------------------------------------------------------------------------- convert


def cmd_convert(args) -> int:
    import jaxspec
    from jaxspec import named
    from jaxspec.checkpoint import resolve

    if named.is_model(args.src) and not Path(args.src).exists():
        src = args.src  # a named model (GGUF), resolved by jaxspec.load
    else:
        try:
            src = resolve(args.src)
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
    try:
        model = jaxspec.load(src, args.dtype)
    except (FileNotFoundError, ValueError) as err:
        raise CliError(f"SRC: cannot load {args.src}: {err}") from None
    if args.to == "hf":
        written = jaxspec.export_hf(model, dst)
    else:
        written = jaxspec.save(model, dst)
    print(f"wrote {args.to} model {model.name!r} ({model.num_params:,} parameters) to {written}")
    return 0


# --------------------------------------------------------------------------------------------- forwarding


def _forward(command: str, argv: list[str]) -> int:
    if command == "bench":
        from jaxspec.bench.__main__ import main as forwarded
    else:
        try:
            from jaxspec.distill import main as forwarded
        except ModuleNotFoundError as err:
            if err.name != "jaxspec.distill":
                raise
            raise CliError("the distill command is not available: jaxspec.distill is not installed") from None
    try:
        forwarded(argv)
    except SystemExit as exit_:  # argparse: --help (0) or bad flags (2, already reported by that parser)
        return exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    return 0


# --------------------------------------------------------------------------------------------- main


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


if __name__ == "__main__":
    sys.exit(main())
