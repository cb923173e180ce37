"""JSON Lines files: reading values line by line, prompt files, and a resumable, fsync'ed record file.

    iter_jsonl(path)     (line number, value) for every non-blank line; ``.gz`` files are decompressed
    read_jsonl(path)     the values alone, as a list
    read_prompts(path)   prompt rows ``{"id", "prompt", "category"?}`` or Spec-Bench ``{"question_id", "turns"}``,
                         with the problems found (bad or duplicate lines) for the caller to report or raise
    read_output(path)    the records already in an output file, and where a line cut short by a crash starts
    Appender(path)       appends whole lines (one ``os.write`` each, fsync'ed) under an exclusive lock

Line numbers count every line from 1, blank ones included, so they match an editor's. Errors about a line are
``LineError`` (a ``ValueError``) naming the file and the line.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any


class LineError(ValueError):
    """A line of a JSONL file that cannot be used. ``str(err)`` is ``"{path} line {line}: {reason}"``.

    Attributes:
      path: the file.
      line: the 1-based line number.
      reason: what is wrong, e.g. ``"not valid JSON (Expecting value at column 1)"``.
    """

    def __init__(self, path, line: int, reason: str):
        super().__init__(f"{path} line {line}: {reason}")
        self.path, self.line, self.reason = path, line, reason


class LockedError(OSError):
    """Another process holds the lock of a file that ``Appender`` opens (``path``: that file)."""

    def __init__(self, path):
        super().__init__(f"{path} is locked by another writer")
        self.path = path


def _lines(path) -> Iterator[tuple[int, bytes]]:
    """(1-based line number, raw bytes) of every non-blank line; ``.gz`` files are decompressed."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            if raw.strip():
                yield number, raw


def parse_line(raw: bytes):
    """One line's JSON value. Raises ``ValueError`` with a short reason: ``"not UTF-8 (...)"`` or
    ``"not valid JSON (... at column n)"``."""
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise ValueError(f"not UTF-8 ({err.reason} at byte {err.start})") from None
    except json.JSONDecodeError as err:
        # some of json's messages end in "at" ("Unterminated string starting at"): the column completes them
        what = err.msg.removesuffix(" at")
        raise ValueError(f"not valid JSON ({what} at column {err.colno})") from None


def iter_jsonl(path) -> Iterator[tuple[int, Any]]:
    """(line number, JSON value) for every non-blank line of ``path`` (gzip-compressed if it ends in ``.gz``).
    The first line that is not UTF-8 JSON raises ``LineError``."""
    for number, raw in _lines(path):
        try:
            value = parse_line(raw)
        except ValueError as err:
            raise LineError(path, number, str(err)) from None
        yield number, value


def read_jsonl(path) -> list:
    """Every JSON value in ``path``, in order (``iter_jsonl`` without the line numbers)."""
    return [value for _, value in iter_jsonl(path)]


# --------------------------------------------------------------------------------------------- prompt files


def row_key(row_id) -> str:
    """A row id as a dictionary key: its JSON text, so the int 1 and the string "1" are different ids."""
    return json.dumps(row_id)


def valid_id(value) -> bool:
    """Whether ``value`` can be a row id: an int (not a bool) or a non-empty string."""
    return (isinstance(value, int) and not isinstance(value, bool)) or (isinstance(value, str) and value != "")


@dataclasses.dataclass(frozen=True)
class Row:
    """One prompt of a prompt file.

    Attributes:
      id: the row's id (``"id"``, or ``"question_id"`` in Spec-Bench form): an int or a non-empty string.
      prompt: the prompt text (in Spec-Bench form the first of ``"turns"``).
      category: ``"category"``, or None.
      line: the 1-based line number in the file.
      question: whether the line was in Spec-Bench / MT-bench form (``question_id``, ``turns``).
      constraint: ``"constraint"`` (structured output: ``{"json_schema": ...}``, ``{"regex": ...}`` or
        ``{"choices": [...]}``, checked when the job starts), or None.
    """

    id: object
    prompt: str
    category: str | None
    line: int
    question: bool
    constraint: dict | None = None

    @property
    def key(self) -> str:
        """``row_key(self.id)``."""
        return row_key(self.id)


def _blank(text: str) -> str:
    return "only whitespace" if text else "empty"


def prompt_row(obj, line: int) -> Row:
    """The ``Row`` of one parsed line: ``{"id", "prompt", "category"?, "constraint"?}``, or ``{"question_id",
    "turns", "category"?, "constraint"?}`` (a line with either of those two keys is in this form). Raises
    ``ValueError`` with the reason, among them a prompt that is empty or only whitespace (``jaxspec.generate``
    refuses those too; caught here, the line is reported before any model is loaded)."""
    if not isinstance(obj, dict):
        raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
    category = obj.get("category")
    prompt: str | None
    if category is not None and not isinstance(category, str):
        raise ValueError(f'"category" must be a string, got {category!r}')
    if "turns" in obj or "question_id" in obj:
        row_id, turns = obj.get("question_id"), obj.get("turns")
        if not isinstance(turns, list) or not turns or not isinstance(turns[0], str):
            raise ValueError('"turns" must be a non-empty list whose first turn is a string')
        if not turns[0].strip():
            raise ValueError(f'the first of "turns" is {_blank(turns[0])}')
        prompt, question, id_field = turns[0], True, "question_id"
    else:
        row_id, prompt, question, id_field = obj.get("id"), obj.get("prompt"), False, "id"
        if not isinstance(prompt, str):
            raise ValueError('needs "prompt" (a string), or "question_id" and "turns"')
        if not prompt.strip():
            raise ValueError(f'"prompt" is {_blank(prompt)}')
    if not valid_id(row_id):
        raise ValueError(f'"{id_field}" must be an int or a non-empty string, got {row_id!r}')
    constraint = obj.get("constraint")
    if constraint is not None and not (isinstance(constraint, dict) and len(constraint) == 1):
        raise ValueError(
            '"constraint" must be an object with one key: {"json_schema": ...}, {"regex": ...} or {"choices": [...]}'
        )
    return Row(row_id, prompt, category, line, question, constraint)


def read_prompts(path) -> tuple[list[Row], list[str]]:
    """The rows of a prompt file and its problems. A line that is not a valid row, or repeats an earlier id, is
    left out and described in ``problems`` (``"{path} line {n}: {reason}"``, in file order); whether that is fatal
    is the caller's choice."""
    rows: list[Row] = []
    seen: dict[str, int] = {}
    problems: list[str] = []
    for number, raw in _lines(path):
        try:
            row = prompt_row(parse_line(raw), number)
        except ValueError as err:
            problems.append(str(LineError(path, number, str(err))))
            continue
        if row.key in seen:
            problems.append(str(LineError(path, number, f"duplicate id {row.id!r} (first on line {seen[row.key]})")))
            continue
        seen[row.key] = number
        rows.append(row)
    return rows, problems


# --------------------------------------------------------------------------------------------- record files

NOT_A_RECORD = "not a JSON record"
NO_ID = 'no valid "id"'


@dataclasses.dataclass
class Existing:
    """What an output file already holds.

    Attributes:
      records: ``row_key(id)`` -> record (the first record for each id), in file order.
      valid_bytes: the file's length up to and including its last newline.
      partial_bytes: bytes after the last newline: a line cut short by a crash (0 when none).
    """

    records: dict
    valid_bytes: int
    partial_bytes: int


def read_output(path) -> Existing:
    """Read the records already written to ``path`` (read-only; a missing file holds none). Every complete line
    must be a JSON object with a valid ``"id"``, else ``LineError`` with reason ``NOT_A_RECORD`` or ``NO_ID``; a
    trailing partial line is measured, not removed (``Appender.repair`` removes it)."""
    path = Path(path)
    if not path.exists():
        return Existing({}, 0, 0)
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    records: dict[str, dict] = {}
    for number, raw in enumerate(data[:end].split(b"\n")[:-1], start=1):
        if not raw.strip():
            continue
        try:
            record = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise LineError(path, number, NOT_A_RECORD) from None
        if not isinstance(record, dict) or not valid_id(record.get("id")):
            raise LineError(path, number, NO_ID)
        records.setdefault(row_key(record["id"]), record)
    return Existing(records, end, len(data) - end)


class Appender:
    """A JSONL file opened for appending whole lines, locked against a second writer (``fcntl.flock``; no lock
    where ``fcntl`` does not exist). Each ``write`` is one record as one line, written completely and fsync'ed,
    so a crash leaves at most one partial last line, which ``repair`` removes. A file this ``Appender`` created is
    removed by ``close`` if nothing was written to it, so a job that fails before its first record (a model that
    does not load, an interrupt while compiling) leaves no empty file behind; a file that existed is never removed.

    Attributes:
      path: the file (created if missing).
      fd: its descriptor, open until ``close``.
      created: whether this ``Appender`` created the file.

    Raises ``LockedError`` when another process holds the lock.
    """

    def __init__(self, path):
        self.path = Path(path)
        while True:
            try:
                self.fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_EXCL, 0o644)
                self.created = True
                break
            except FileExistsError:
                pass
            try:
                self.fd = os.open(self.path, os.O_RDWR | os.O_APPEND)
                self.created = False
                break
            except FileNotFoundError:  # removed in between: create it after all
                pass
        try:
            import fcntl

            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except ImportError:  # not POSIX: no lock
            pass
        except OSError:
            os.close(self.fd)
            raise LockedError(self.path) from None

    def repair(self, existing: Existing) -> int:
        """Drop a partial last line (re-checked under the lock), so every line in the file is a whole record.
        Returns the number of bytes removed (0 when the file ended with a newline)."""
        size = os.fstat(self.fd).st_size
        if size == existing.valid_bytes:
            return 0
        with open(self.path, "rb") as f:
            end = f.read().rfind(b"\n") + 1
        os.ftruncate(self.fd, end)
        os.fsync(self.fd)
        return size - end

    def write(self, record: dict) -> None:
        """Append ``record`` as one line of JSON (UTF-8, non-ASCII kept) and fsync."""
        data = (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view) :]
        os.fsync(self.fd)

    def close(self) -> None:
        """Close the file (releasing the lock); first remove it if this ``Appender`` created it and it is still
        empty (and still the file at ``path``)."""
        try:
            mine = os.fstat(self.fd)
            if self.created and mine.st_size == 0 and os.path.samestat(mine, os.stat(self.path)):
                os.unlink(self.path)  # under the lock: a job that opened it meanwhile could not lock it
        except FileNotFoundError:
            pass
        finally:
            os.close(self.fd)
