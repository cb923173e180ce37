"""``jaxspec generate --input in.jsonl --output out.jsonl``: the resumable batch job. Prompts are read and checked
(``jaxspec.formats.jsonl.read_prompts``), ids already in the output are skipped, the rest is fed continuously to an
``jaxspec.Engine`` of ``--batch-size`` slots (a finished row's slot takes the next prompt) and each record is
appended and fsync'ed as soon as its row finishes; a per-category summary (``records.summary_table``) goes to
stdout at the end."""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import os
import re
import sys
from pathlib import Path

import jaxspec
from jaxspec.cli.common import CliError, warn
from jaxspec.cli.models import check_models, gen_kwargs, is_none, load_models
from jaxspec.cli.progress import Progress
from jaxspec.cli.records import make_record, plot_acceptance, summary_table
from jaxspec.formats import jsonl
from jaxspec.formats.jsonl import Row


def row_seed(seed: int, row_id) -> int:
    """A row's own sampling seed: stable across batches, resumes and processes."""
    digest = hashlib.sha256(f"{seed}:{jsonl.row_key(row_id)}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


def check_paths(args: argparse.Namespace) -> tuple[Path, Path]:
    """(input, output) paths, checked before any model is loaded: the input is a readable file, the output a
    different, writable file (or creatable in an existing directory); ``--plot`` needs matplotlib and a draft."""
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
        if is_none(args.draft):
            raise CliError("--plot shows draft acceptance; it needs a draft (got --draft none)")
    return inp, out


def _read_prompts(path: Path, on_error: str) -> list[Row]:
    rows, problems = jsonl.read_prompts(path)
    if problems and on_error == "fail":
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise CliError(f"{problems[0]}{more}; nothing was generated (--on-error skip skips bad lines)")
    for message in problems[:20]:
        warn(f"skipping {message}")
    if len(problems) > 20:
        warn(f"skipping {len(problems) - 20} more bad lines")
    return rows


def _read_output(path: Path) -> jsonl.Existing:
    try:
        return jsonl.read_output(path)
    except jsonl.LineError as err:
        if err.reason == jsonl.NO_ID:
            raise CliError(f'--output: {path} line {err.line} has no valid "id"; fix or remove it') from None
        raise CliError(
            f"--output: {path} line {err.line} is not a JSON record (not written by jaxspec "
            "generate?); fix or remove it, or choose another --output"
        ) from None


def _open(path: Path) -> jsonl.Appender:
    try:
        return jsonl.Appender(path)
    except jsonl.LockedError:
        raise CliError(f"--output: {path} is locked by another running 'jaxspec generate'") from None


def _repair(appender: jsonl.Appender, existing: jsonl.Existing) -> None:
    removed = appender.repair(existing)
    if removed:
        warn(
            f"{appender.path} ended with a partial line ({removed} bytes, from an interrupted run); removed it, "
            "its prompt is generated again"
        )


def run(args: argparse.Namespace, progress: Progress | None = None) -> int:
    """The batch job (``args.input`` is set); ``progress`` names its stages on stderr (loading, compiling, the
    plain pass of ``--compare``, the speculative pass) and shows a bar per pass. Returns the exit code."""
    progress = progress or Progress(False)
    if args.prompt is not None:
        raise CliError("give either a prompt or --input, not both")
    if not args.output:
        raise CliError("--input needs --output (the JSONL file records are appended to)")
    inp, out = check_paths(args)
    rows = _read_prompts(inp, args.on_error)
    if not rows:
        raise CliError(f"--input: {inp} has no prompts")
    existing = _read_output(out)
    pending = [r for r in rows if r.key not in existing.records]
    input_keys = {r.key for r in rows}
    stray = sum(1 for k in existing.records if k not in input_keys)
    if stray:
        warn(f"{out} has {stray} records whose ids are not in {inp} (kept, left out of the summary)")
    done = {r.key: existing.records[r.key] for r in rows if r.key in existing.records}
    if done:
        print(
            f"jaxspec: resuming: {len(done)} of {len(rows)} ids already in {out}, {len(pending)} to generate",
            file=sys.stderr,
            flush=True,
        )
    if pending:
        check_models(args)
        appender = _open(out)
        try:
            target, draft = load_models(args, progress)
            _repair(appender, existing)
            _run_batches(args, pending, target, draft, appender, done, progress)
        finally:
            appender.close()
    elif existing.partial_bytes:
        appender = _open(out)
        try:
            _repair(appender, existing)
        finally:
            appender.close()
    ordered = [done[r.key] for r in rows if r.key in done]
    print(summary_table(ordered))
    if args.plot:
        plot_acceptance(ordered, args.plot)
    return 0


def _engine_error(err: ValueError, batch: list[Row]) -> CliError:
    """A request error of ``Engine.run`` (which numbers requests in ``batch`` order) naming the row's id."""
    found = re.search(r"\[(\d+)\]", str(err))
    where = f" (id {batch[int(found.group(1))].id!r})" if found and int(found.group(1)) < len(batch) else ""
    return CliError(f"generating{where}: {err}")


def _run_batches(args, pending: list[Row], target, draft, appender: jsonl.Appender, done: dict, progress) -> None:
    """Generate ``pending`` (with ``--compare`` a plain pass first, whose times go in the records) and append each
    record as its row finishes. Each pass compiles inside its first program calls, before any of its rows
    finishes: its "compiling" line says so and its bar keeps time meanwhile."""
    requests = [dict(prompt=r.prompt, seed=row_seed(args.seed, r.id)) for r in pending]
    for request, row in zip(requests, pending):
        if row.constraint is not None:  # structured output (checked by the engine: errors name the row's id)
            request["constraint"] = row.constraint
    kw = gen_kwargs(args, draft)
    chat = kw.pop("chat")
    plain = {}
    if args.compare:  # plain decoding first, same engine settings: its per-row time and tokens go in the records
        progress.stage(
            "compiling", "the plain pass (--compare's baseline; no record is written before the speculative pass)"
        )
        try:
            engine = jaxspec.Engine(target, slots=args.batch_size, chat=chat, **gen_kwargs(args, None, chat=False))
            try:
                run = engine.run(requests)
            except ValueError as err:
                raise _engine_error(err, pending) from None
            with progress.bar("plain pass", len(pending)) as bar:
                for r in run:
                    plain[r.index] = (r.wall_time_s, r.stats.generated_tokens)
                    bar.update(1)
        except KeyboardInterrupt:
            raise CliError(
                "interrupted during the plain pass of --compare, before any record was written (records are "
                "written during the speculative pass that follows it); rerun to start again",
                code=130,
            ) from None
    name = "plain pass" if draft is None else "speculative pass"
    progress.stage("compiling", f"the {name} (each record is appended to {appender.path} as its row finishes)")
    engine = jaxspec.Engine(target, draft=draft, slots=args.batch_size, chat=chat, **kw)
    try:
        run = engine.run(requests)
    except ValueError as err:
        raise _engine_error(err, pending) from None
    tokens = accepted = drafted = 0
    with progress.bar(name, len(pending)) as bar:
        for result in run:
            row = pending[result.index]
            if result.error:
                raise CliError(f"id {row.id!r}: {result.error}")
            rec = make_record(row, result, run.stats.gamma, plain.get(result.index))
            appender.write(rec)
            done[row.key] = rec
            tokens += result.stats.generated_tokens
            accepted += result.stats.accepted
            drafted += result.stats.drafted
            wall = run.stats.wall_time_s
            post = {"tok/s": f"{tokens / wall:.1f}" if wall > 0 else "-"}
            if drafted:
                post["α"] = f"{accepted / drafted:.3f}"
            bar.set_postfix(post, refresh=False)
            bar.update(1)
