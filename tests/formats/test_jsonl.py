"""JSONL reading (jaxspec.formats.jsonl): the reasons given for bad lines and bad prompt rows."""

import re

import pytest

from jaxspec.formats import jsonl


@pytest.mark.parametrize(
    "raw, reason",
    [
        (b'{"prompt": "a\tb"}', "not valid JSON (Invalid control character at column 14)"),
        (b'{"prompt": "ab', "not valid JSON (Unterminated string starting at column 12)"),
        (b'{"prompt": "a\\qb"}', "not valid JSON (Invalid \\escape at column 14)"),
        (b"{not json", "not valid JSON (Expecting property name enclosed in double quotes at column 2)"),
        (b'{"prompt": "\xff"}', "not UTF-8 (invalid start byte at byte 12)"),
    ],
)
def test_bad_line_reasons_read_once(raw, reason):
    # json's own message may end in "at" ("... starting at"): the column completes it, never "at at"
    with pytest.raises(ValueError) as err:
        jsonl.parse_line(raw)
    assert str(err.value) == reason
    assert "at at" not in str(err.value)


def test_bad_line_reason_in_the_batch_jobs_problems(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_bytes(b'{"id": 1, "prompt": "ok"}\n{"id": 2, "prompt": "a\tb"}\n')
    rows, problems = jsonl.read_prompts(path)
    assert [r.id for r in rows] == [1]
    assert problems == [f"{path} line 2: not valid JSON (Invalid control character at column 23)"]


@pytest.mark.parametrize(
    "obj, reason",
    [
        ({"id": 1, "prompt": " \n\t"}, '"prompt" is only whitespace'),
        ({"id": 1, "prompt": ""}, '"prompt" is empty'),
        ({"id": 1, "prompt": 5}, 'needs "prompt" (a string)'),
        ({"question_id": 1, "turns": ["  ", "second"]}, 'the first of "turns" is only whitespace'),
        ({"question_id": 1, "turns": []}, '"turns" must be a non-empty list'),
    ],
)
def test_blank_or_missing_prompts_are_bad_rows(obj, reason):
    with pytest.raises(ValueError, match=re.escape(reason)):
        jsonl.prompt_row(obj, 1)
    assert jsonl.prompt_row({"id": 1, "prompt": " x "}, 1).prompt == " x "  # text with spaces around is kept as is


def test_appender_removes_only_an_empty_file_it_created(tmp_path):
    new = tmp_path / "new.jsonl"
    jsonl.Appender(new).close()  # created, nothing written: a failed start leaves no file
    assert not new.exists()
    appender = jsonl.Appender(new)
    assert appender.created
    appender.write({"id": 1})
    appender.close()
    assert new.read_text() == '{"id": 1}\n'
    again = jsonl.Appender(new)  # an existing file is never removed, written to or not
    assert not again.created
    again.close()
    assert new.read_text() == '{"id": 1}\n'
    empty = tmp_path / "empty.jsonl"
    empty.touch()
    jsonl.Appender(empty).close()
    assert empty.exists()
