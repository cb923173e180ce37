"""The ``jaxspec`` command line: streaming, the resumable batch job (kill and rerun), input/output errors,
the summary and plot, conversion, forwarding and help."""

import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import jax
import numpy as np
import pytest
from helpers import FIXTURES_DIR, ROOT, tiny_config, tiny_hf_tokenizer

import jaxspec
from jaxspec import cli
from jaxspec.cli.generate import speedup_line
from jaxspec.models import llama

FIXTURES = FIXTURES_DIR / "hf"
MAX_NEW = 12
WORDS = ["def", "f(x):", "return", "x", "+ 1", "ret", "urn", "(x)"]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A tiny target and a perturbed copy as draft (0 < α < 1), saved as jaxspec directories, and loaded back."""
    tok = tiny_hf_tokenizer()
    target = llama.init(tiny_config(vocab_size=64), seed=0, tokenizer=tok, eos_token_id=tok.eos_token_id, name="target")
    leaves, tree = jax.tree.flatten(target.params)
    rng = np.random.default_rng(3)
    draft = target.replace(
        name="draft",
        params=jax.tree.unflatten(tree, [x + 0.01 * rng.standard_normal(x.shape).astype(x.dtype) for x in leaves]),
    )
    root = tmp_path_factory.mktemp("models")
    tdir, ddir = jaxspec.save(target, root / "target"), jaxspec.save(draft, root / "draft")
    return {"target_dir": str(tdir), "draft_dir": str(ddir), "target": jaxspec.load(tdir), "draft": jaxspec.load(ddir)}


def models(pair, max_new=MAX_NEW):
    return [
        "--target",
        pair["target_dir"],
        "--draft",
        pair["draft_dir"],
        "--max-new-tokens",
        str(max_new),
        "--temperature",
        "0",
        "--no-progress",
    ]


def prompt(i: int) -> str:
    return f"{WORDS[i % len(WORDS)]} {WORDS[(3 * i + 1) % len(WORDS)]}"


def write_jsonl(path, objs):
    path.write_text("".join((o if isinstance(o, str) else json.dumps(o)) + "\n" for o in objs))
    return str(path)


def read_records(path):
    lines = Path(path).read_text().splitlines()
    return [json.loads(line) for line in lines]


def core(records):
    return sorted((json.dumps(r["id"]), r["token_ids"], r["text"]) for r in records)


def expected(pair, prompts):
    """Greedy speculative output for each prompt, generated in pairs (greedy rows do not depend on their batch)."""
    out = []
    for i in range(0, len(prompts), 2):
        res = jaxspec.generate(
            pair["target"], prompts[i : i + 2], draft=pair["draft"], gamma=4, max_new_tokens=MAX_NEW, temperature=0.0
        )
        out += list(zip(res.tokens, res.texts))
    return out


@pytest.fixture
def no_models(monkeypatch):
    """Fail the test if the command loads or runs a model (errors must come first)."""

    def boom(*args, **kwargs):
        raise AssertionError("a model was loaded or run")

    for name in ("load", "generate", "stream", "Engine"):
        monkeypatch.setattr(jaxspec, name, boom)


def one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("jaxspec: error: ")]
    assert len(lines) == 1, err
    return lines[0]


# --------------------------------------------------------------------------------------------- help, usage


@pytest.mark.parametrize("command", [[], ["generate"], ["convert"], ["export-hf"], ["bench"], ["distill"]])
def test_help_exits_zero(command, capsys):
    assert cli.main([*command, "--help"]) == 0
    assert "usage" in capsys.readouterr().out.lower()


def test_distill_missing_is_a_clear_error(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "jaxspec.cli.distill", None)  # makes the import fail as if the module were absent
    assert cli.main(["distill", "--help"]) == 2
    assert "distill" in one_error_line(capsys.readouterr().err)


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["generate"], "prompt"),
        (["generate", "x", "--gamma", "0"], "--gamma"),
        (["generate", "x", "--top-p", "1.5"], "--top-p"),
        (["generate", "--input", "in.jsonl"], "--output"),
        (["generate", "x", "--draft", "none", "--compare"], "--compare"),
        (["generate", "x", "--target", "/nonexistent/model"], "--target"),
        (["generate", " \n\t"], "prompt: is only whitespace"),
        (["generate", ""], "prompt: is empty"),
        (["nonsense"], "nonsense"),
    ],
)
def test_bad_usage_is_one_line_and_exit_2(argv, needle, capsys, no_models):
    assert cli.main(argv) == 2
    assert needle in one_error_line(capsys.readouterr().err)


# --------------------------------------------------------------------------------------------- one prompt


def test_default_draft_is_the_targets_own_drafter_at_its_own_gamma(pair, monkeypatch, capsys):
    from jaxspec.cli.models import default_draft
    from jaxspec.drafters import eagle
    from jaxspec.formats.paths import resolve

    own = default_draft("smollm2-135m-instruct")
    assert own == "jaxspec/smollm2-eagle3" and eagle.is_head(resolve(own))  # SmolLM2's shipped EAGLE-3 head
    assert default_draft(pair["target_dir"]) == "prompt_lookup"  # a target with no drafter of its own
    seen = {}

    def stream(target, prompts, **kwargs):
        seen.update(kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(jaxspec, "stream", stream)
    assert cli.main(["generate", "def f(x):", "--target", pair["target_dir"]]) == 130
    assert seen["draft"] == "prompt_lookup" and seen["gamma"] is None  # None: the drafter's default γ
    cli.main(["generate", "def f(x):", "--target", pair["target_dir"], "--draft", pair["draft_dir"], "--gamma", "3"])
    assert seen["draft"].name == "draft" and seen["gamma"] == 3


def test_single_prompt_streams_the_generated_text(pair, monkeypatch, capsys):
    pieces = []
    real = sys.stdout

    class Recorder:
        def write(self, s):
            pieces.append(s)
            return len(s)

        def flush(self):
            pass

        def isatty(self):
            return False

    monkeypatch.setattr(sys, "stdout", Recorder())
    assert cli.main(["generate", "def f(x):", *models(pair)]) == 0
    monkeypatch.setattr(sys, "stdout", real)
    want = jaxspec.generate(
        pair["target"], ["def f(x):"], draft=pair["draft"], gamma=4, max_new_tokens=MAX_NEW, temperature=0.0
    ).texts[0]
    assert "".join(pieces) == want and want
    assert len([p for p in pieces if p]) >= 2  # written as rounds finished, not once at the end
    err = capsys.readouterr().err
    for needle in ("α = ", "τ = ", "target passes", "tokens/s", "speed-up: not measured (--compare measures it"):
        assert needle in err, err
    assert "≤" not in err and "est." not in err  # τ is no estimate of the speed-up: no bound is offered as one


def test_quantize_loads_both_models_quantized(pair, capsys):
    """--quantize reaches both loads (what the loaded models compute is tests/models/test_quant.py's)."""
    from jaxspec.cli.models import load_models

    args = cli.build_parser().parse_args(["generate", "x", *models(pair), "--quantize", "w8a8"])
    target, draft = load_models(args)
    for model in (target, draft):
        assert model.params["embed"]["embedding"].dtype == np.int8
        assert "embedding_scale_a8" in model.params["embed"]
    assert cli.main(["generate", "x", *models(pair), "--quantize", "int4"]) == 2
    assert "--quantize" in capsys.readouterr().err


def test_quantize_reaches_an_eagle_heads_own_weights(pair, tmp_path):
    """--quantize with an EAGLE head as --draft: the head's own projections are held int8 too (negative control:
    without the flag they stay float)."""
    from jaxspec.cli.models import load_models
    from jaxspec.drafters import eagle
    from jaxspec.models import eagle as eagle_model

    target = pair["target"]
    cfg = eagle_model.head_config(target.config, vocab_ids=tuple(range(0, 64, 2)))
    head = eagle.EagleDrafter.for_target(target, eagle_model.init_own(cfg, seed=1), config=cfg, name="head")
    path = str(eagle.save(head, tmp_path / "head"))
    flags = ["--target", pair["target_dir"], "--draft", path, "--no-progress"]
    for extra, dtype in (([], np.float32), (["--quantize", "w8a8"], np.int8)):
        _, loaded = load_models(cli.build_parser().parse_args(["generate", "x", *flags, *extra]))
        assert isinstance(loaded, eagle.EagleDrafter) and loaded.params["fc"]["kernel"].dtype == dtype


def test_speedup_line_offers_no_bound_as_an_estimate():
    spec = SimpleNamespace(mode="speculative", tokens_per_round=2.46, policy=None)
    assert speedup_line(spec).startswith("speed-up: not measured") and "2.46" not in speedup_line(spec)
    auto = SimpleNamespace(mode="speculative", tokens_per_round=2.0, policy={"gamma": 2, "c": 0.25, "v": {"2": 1.0}})
    assert speedup_line(auto).startswith("est. speed-up ≈ τ/(γc+v) = 2.00/(2·0.250+1.00) = 1.33×")
    plain = SimpleNamespace(mode="plain", tokens_per_round=1.0, policy=None)
    assert speedup_line(plain) == "speed-up: none, plain decoding"


class Terminal(io.StringIO):
    """A stand-in stderr that is a terminal."""

    def isatty(self):
        return True


def stages(err: str) -> list[str]:
    """The stages progress names on stderr, in order: each ``jaxspec: STAGE: ...`` line, and each pass's bar once
    (a bar is redrawn in place, ``\\r``-separated)."""
    found: list[str] = []
    for part in re.split(r"[\r\n]", err):
        line = re.match(r"jaxspec: (loading|compiling|plain pass|speculative pass): ", part)
        bar = re.match(r"(plain pass|speculative pass): +\d+%", part)
        if line:
            found.append(line.group(1))
        elif bar and found[-1:] != [bar.group(1)]:
            found.append(bar.group(1))
    return found


def test_single_prompt_compare_prints_the_measured_speedup(pair, capsys):
    assert cli.main(["generate", "def f(x):", "--compare", *models(pair), "--progress"]) == 0
    err = capsys.readouterr().err
    # the streamed text follows "compiling"; --compare then runs the prompt again, not streamed, both ways
    assert stages(err) == ["loading", "loading", "compiling", "speculative pass", "plain pass"], err
    lines = [line for line in err.splitlines() if "speed-up" in line]
    assert len(lines) == 1 and lines[0].startswith("measured speed-up: "), err
    assert float(lines[0].split()[2].rstrip("×")) > 0
    assert "≤" not in err and "est." not in err


# --------------------------------------------------------------------------------------------- batch


def mixed_input(path, n=8):
    """Half {"id", "prompt", "category"}, half Spec-Bench {"question_id", "category", "turns"}."""
    objs = []
    for i in range(n):
        if i % 2:
            objs.append({"id": f"row-{i}", "prompt": prompt(i), "category": "code"})
        else:
            objs.append({"question_id": 100 + i, "category": "chat", "turns": [prompt(i), "a second turn"]})
    return write_jsonl(path, objs), [prompt(i) for i in range(n)]


def test_batch_both_formats_records_and_summary(pair, tmp_path, capsys):
    inp, prompts = mixed_input(tmp_path / "in.jsonl")
    out = tmp_path / "out.jsonl"
    assert cli.main(["generate", "--input", inp, "--output", str(out), "--batch-size", "2", *models(pair)]) == 0
    ids = [100, "row-1", 102, "row-3", 104, "row-5", 106, "row-7"]
    written = read_records(out)  # in the order rows finished (continuous batching): each id once
    assert sorted(map(str, (r["id"] for r in written))) == sorted(map(str, ids)) and len(written) == len(ids)
    records = sorted(written, key=lambda r: ids.index(r["id"]))
    for i, (rec, (tokens, text)) in enumerate(zip(records, expected(pair, prompts))):
        assert rec["prompt"] == prompts[i]  # the first turn for Spec-Bench lines
        assert rec["category"] == ("code" if i % 2 else "chat")
        assert (rec["token_ids"], rec["text"]) == (tokens, text)
        assert rec["new_tokens"] == len(tokens) and rec["finish_reason"] in ("eos", "length")
        assert len(rec["accept_lengths"]) == rec["rounds"] == sum(rec["accept_hist"])
        assert sum(rec["accept_lengths"]) == rec["rounds"] + rec["accepted"]
        assert all(1 <= a <= 5 for a in rec["accept_lengths"])
        assert rec["alpha"] == pytest.approx(rec["accepted"] / rec["drafted"])
        assert rec["wall_time"] > 0
        choice = rec["choices"][0]  # what Spec-Bench's speed.py reads
        assert choice["new_tokens"] == [rec["new_tokens"]] and choice["accept_lengths"] == rec["accept_lengths"]
        assert ("question_id" in rec) == (i % 2 == 0)
    table = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines() if line.strip()}
    assert table["code"][1:3] == ["4", str(sum(r["new_tokens"] for r in records[1::2]))]
    assert table["chat"][1] == "4" and table["total"][1] == "8"
    drafted = sum(r["drafted"] for r in records)
    assert float(table["total"][3]) == pytest.approx(sum(r["accepted"] for r in records) / drafted, abs=1e-3)
    assert table["total"][6] == "-"  # no --compare: the speed-up is not measured


def test_batch_lines_take_constraints(pair, tmp_path, capsys):
    """A "constraint" per JSONL line (choices, a regex, none): each record equals the constrained generate call and
    says whether its output is complete; a constraint the engine refuses names the line's id."""
    rules = [{"choices": ["x + 1", "return x"]}, {"regex": "(def|ret)+"}, None]
    lines = [{"id": i, "prompt": prompt(i), **({"constraint": r} if r else {})} for i, r in enumerate(rules)]
    out = tmp_path / "out.jsonl"
    argv = ["generate", "--input", write_jsonl(tmp_path / "in.jsonl", lines), "--output", str(out), *models(pair)]
    assert cli.main([*argv, "--batch-size", "2"]) == 0
    records = sorted(read_records(out), key=lambda r: r["id"])
    alone = jaxspec.generate(
        pair["target"],
        [prompt(i) for i in range(3)],
        draft=pair["draft"],
        max_new_tokens=MAX_NEW,
        temperature=0.0,
        constraint=rules,
    )
    assert [r["token_ids"] for r in records] == alone.tokens
    assert records[0]["text"] in ("x + 1", "return x") and records[0]["complete"] is True
    assert "complete" in records[1] and "complete" not in records[2]
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"id": "q9", "prompt": "def", "constraint": {"regex": "("}}])
    assert cli.main(["generate", "--input", bad, "--output", str(tmp_path / "o2.jsonl"), *models(pair)]) == 2
    assert "(id 'q9'): constraint[0]: the constraint cannot be compiled" in capsys.readouterr().err


def test_compare_measures_speedup_and_plot_writes_png(pair, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    inp, _ = mixed_input(tmp_path / "in.jsonl", n=4)
    out, png = tmp_path / "out.jsonl", tmp_path / "acc.png"
    assert (
        cli.main(
            [
                "generate",
                "--input",
                inp,
                "--output",
                str(out),
                "--batch-size",
                "2",
                "--compare",
                "--plot",
                str(png),
                *models(pair),
            ]
        )
        == 0
    )
    records = read_records(out)
    assert all(r["plain_wall_time"] > 0 and r["plain_new_tokens"] == r["new_tokens"] for r in records)
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines() if line.strip()}
    assert rows["total"][6].endswith("×") and float(rows["total"][6][:-1]) > 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_progress_names_every_stage_in_order(tmp_path, capsys):
    """The shipped toy pair, --compare: loading both models, then each pass's compiling line and its bar, on stderr
    (stdout keeps the summary only); quiet by default where stderr is no terminal (here: captured)."""
    inp = write_jsonl(tmp_path / "in.jsonl", [{"id": i, "prompt": prompt(i)} for i in range(2)])
    out = tmp_path / "out.jsonl"
    argv = ["generate", "--input", inp, "--output", str(out), "--target", "jaxspec/code-target"]
    argv += ["--draft", "jaxspec/code-draft", "--max-new-tokens", "4", "--batch-size", "1", "--compare"]
    assert cli.main([*argv, "--progress"]) == 0
    captured = capsys.readouterr()
    assert stages(captured.err) == ["loading", "loading", "compiling", "plain pass", "compiling", "speculative pass"]
    assert "jaxspec: loading: target jaxspec/code-target\n" in captured.err
    assert "no record is written before the speculative pass" in captured.err
    assert "2/2" in captured.err.split("speculative pass: ")[-1]  # the bar ends with every row
    assert "jaxspec:" not in captured.out and "pass" not in captured.out
    out.unlink()
    assert cli.main(argv) == 0  # neither flag: stderr is no terminal, so no progress
    assert stages(capsys.readouterr().err) == []


def test_interrupted_plain_pass_says_no_record_was_written(pair, tmp_path, capsys, monkeypatch):
    inp = write_jsonl(tmp_path / "in.jsonl", [{"id": 1, "prompt": "def"}])
    out = tmp_path / "out.jsonl"
    real = jaxspec.Engine

    class Interrupted(real):  # Ctrl-C while the plain pass decodes
        def run(self, requests):
            run = super().run(requests)

            def rows():
                raise KeyboardInterrupt
                yield from run

            return rows()

    monkeypatch.setattr(jaxspec, "Engine", Interrupted)
    assert cli.main(["generate", "--input", inp, "--output", str(out), "--compare", *models(pair)]) == 130
    line = one_error_line(capsys.readouterr().err)
    assert "interrupted during the plain pass of --compare, before any record was written" in line
    assert not out.exists()


def test_malformed_lines_fail_before_anything_runs(tmp_path, capsys, no_models):
    inp = write_jsonl(
        tmp_path / "in.jsonl", [{"id": 1, "prompt": "def"}, "{not json", [1, 2], {"id": 4}, {"id": 5, "prompt": "x"}]
    )
    out = tmp_path / "out.jsonl"
    out.write_text('{"id": "earlier", "text": "kept"}\n')
    before = out.read_bytes()
    assert cli.main(["generate", "--input", inp, "--output", str(out), "--target", "t", "--draft", "d"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "line 2" in line and "not valid JSON" in line and "2 more" in line
    assert out.read_bytes() == before


def test_blank_prompts_are_bad_lines(tmp_path, capsys, no_models):
    inp = write_jsonl(
        tmp_path / "in.jsonl",
        [{"id": 1, "prompt": "def"}, {"id": 2, "prompt": " \n "}, {"question_id": 3, "turns": ["\t", "x"]}],
    )
    assert cli.main(["generate", "--input", inp, "--output", str(tmp_path / "o.jsonl")]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert 'line 2: "prompt" is only whitespace' in line and "1 more" in line
    assert not (tmp_path / "o.jsonl").exists()
    argv = ["generate", "--input", inp, "--output", str(tmp_path / "o.jsonl"), "--on-error", "skip"]
    assert cli.main(argv) == 1  # skipped: the good line goes on to loading (no_models makes that the error)
    err = capsys.readouterr().err
    assert 'line 3: the first of "turns" is only whitespace' in err and "a model was loaded" in err
    assert not (tmp_path / "o.jsonl").exists()  # a failed start leaves no output file


def test_duplicate_ids_name_both_lines(tmp_path, capsys, no_models):
    inp = write_jsonl(
        tmp_path / "in.jsonl",
        [{"id": "a", "prompt": "def"}, {"id": "b", "prompt": "x"}, {"question_id": "a", "turns": ["x"]}],
    )
    assert cli.main(["generate", "--input", inp, "--output", str(tmp_path / "o.jsonl")]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "line 3" in line and "duplicate id 'a'" in line and "line 1" in line
    assert not (tmp_path / "o.jsonl").exists()


def test_malformed_lines_skipped_with_warnings(pair, tmp_path, capsys):
    inp = write_jsonl(
        tmp_path / "in.jsonl",
        [{"id": 1, "prompt": prompt(1)}, "{not json", {"id": 1, "prompt": "dup"}, {"id": 2, "prompt": prompt(2)}],
    )
    out = tmp_path / "out.jsonl"
    argv = ["generate", "--input", inp, "--output", str(out), "--batch-size", "2", "--on-error", "skip"]
    assert cli.main([*argv, *models(pair)]) == 0
    err = capsys.readouterr().err
    assert "line 2" in err and "line 3" in err and "duplicate" in err
    assert [r["id"] for r in read_records(out)] == [1, 2]


def test_failed_start_creates_no_output_file(tmp_path, capsys, monkeypatch):
    def no_such_model(value, dtype=None):
        raise OSError(f"{value} is not in the Hugging Face cache and could not be downloaded")

    monkeypatch.setattr(jaxspec, "load", no_such_model)
    inp = write_jsonl(tmp_path / "in.jsonl", [{"id": 1, "prompt": "def"}, {"id": 2, "prompt": "x"}])
    out = tmp_path / "out.jsonl"
    argv = ["generate", "--input", inp, "--output", str(out), "--target", "no/such-model", "--draft", "none"]
    assert cli.main(argv) == 2
    assert "--target: cannot load 'no/such-model'" in one_error_line(capsys.readouterr().err)
    assert not out.exists()  # not even an empty file
    out.write_text('{"id": 1, "text": "kept"}\n')  # an existing file's records are never touched
    before = out.read_bytes()
    assert cli.main(argv) == 2
    assert out.read_bytes() == before


def test_missing_input_is_a_clear_error(tmp_path, capsys, no_models):
    assert cli.main(["generate", "--input", str(tmp_path / "nope.jsonl"), "--output", str(tmp_path / "o")]) == 2
    assert "--input" in one_error_line(capsys.readouterr().err)


def test_missing_output_directory_is_a_clear_error(tmp_path, capsys, no_models):
    inp = write_jsonl(tmp_path / "in.jsonl", [{"id": 1, "prompt": "def"}])
    assert cli.main(["generate", "--input", inp, "--output", str(tmp_path / "no" / "o.jsonl")]) == 2
    assert "does not exist" in one_error_line(capsys.readouterr().err)


def test_unwritable_output_directory_is_a_clear_error(tmp_path, capsys, no_models):
    inp = write_jsonl(tmp_path / "in.jsonl", [{"id": 1, "prompt": "def"}])
    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / "other.jsonl").write_text('{"id": 0}\n')
    locked.chmod(0o500)
    try:
        if os.access(locked, os.W_OK):
            pytest.skip("running as a user (root?) who can write to a 0o500 directory")
        assert cli.main(["generate", "--input", inp, "--output", str(locked / "o.jsonl")]) == 2
        assert "not writable" in one_error_line(capsys.readouterr().err)
        assert (locked / "other.jsonl").read_text() == '{"id": 0}\n' and not (locked / "o.jsonl").exists()
    finally:
        locked.chmod(0o700)


def test_unwritable_output_directory_as_reported_by_the_os(tmp_path, capsys, monkeypatch, no_models):
    """The same check where the chmod above cannot bite (root): the OS answers "not writable" for the directory."""
    inp = write_jsonl(tmp_path / "in.jsonl", [{"id": 1, "prompt": "def"}])
    locked = tmp_path / "locked"
    locked.mkdir()
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: real(p, mode) and Path(p) != locked)
    assert cli.main(["generate", "--input", inp, "--output", str(locked / "o.jsonl")]) == 2
    assert f"directory {locked} is not writable" in one_error_line(capsys.readouterr().err)
    assert not (locked / "o.jsonl").exists()


def test_partial_trailing_line_is_repaired_and_the_row_regenerated(pair, tmp_path, capsys):
    inp = write_jsonl(tmp_path / "in.jsonl", [{"id": i, "prompt": prompt(i)} for i in range(4)])
    full, out = tmp_path / "full.jsonl", tmp_path / "out.jsonl"
    argv = ["generate", "--input", inp, "--batch-size", "2", *models(pair)]
    assert cli.main([*argv, "--output", str(full)]) == 0
    lines = full.read_bytes().splitlines(keepends=True)
    out.write_bytes(lines[0] + lines[1][: len(lines[1]) // 2])  # a crash in the middle of the second record
    capsys.readouterr()
    assert cli.main([*argv, "--output", str(out)]) == 0
    err = capsys.readouterr().err
    assert "partial line" in err and "resuming: 1 of 4" in err
    assert out.read_bytes().startswith(lines[0])  # what was written whole is kept as it was
    records = read_records(out)  # every line parses
    assert sorted(r["id"] for r in records) == [0, 1, 2, 3]
    assert core(records) == core(read_records(full))


def test_rerun_of_a_finished_job_generates_nothing(pair, tmp_path, capsys, monkeypatch):
    inp = write_jsonl(tmp_path / "in.jsonl", [{"id": "only", "prompt": "def", "category": "c"}])
    out = tmp_path / "out.jsonl"
    out.write_text(
        json.dumps(
            {
                "id": "only",
                "category": "c",
                "new_tokens": 3,
                "rounds": 2,
                "drafted": 8,
                "accepted": 1,
                "wall_time": 0.5,
                "accept_hist": [1, 1, 0, 0, 0],
            }
        )
        + "\n"
    )
    for name in ("load", "generate"):
        monkeypatch.setattr(jaxspec, name, lambda *a, **k: pytest.fail("nothing should be generated"))
    assert cli.main(["generate", "--input", inp, "--output", str(out), *models(pair)]) == 0
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines() if line.strip()}
    assert rows["c"][1:6] == ["1", "3", "0.125", "1.50", "6.0"]


def test_sampled_rows_do_not_depend_on_their_batch(pair, tmp_path):
    """Each row's seed comes from --seed and its id, so resuming (which regroups rows) keeps sampled output."""
    inp = write_jsonl(tmp_path / "in.jsonl", [{"id": i, "prompt": prompt(i)} for i in range(3)])
    runs = {}
    for size in ("1", "2"):
        out = tmp_path / f"out{size}.jsonl"
        argv = ["generate", "--input", inp, "--output", str(out), "--batch-size", size, *models(pair)]
        assert cli.main([*argv, "--temperature", "1.0", "--seed", "7"]) == 0
        runs[size] = core(read_records(out))
    assert runs["1"] == runs["2"]


def test_killed_job_resumes_with_every_id_exactly_once(pair, tmp_path):
    n = 40
    inp = write_jsonl(
        tmp_path / "in.jsonl", [{"id": f"q{i}", "prompt": prompt(i), "category": f"c{i % 3}"} for i in range(n)]
    )
    out, clean = tmp_path / "out.jsonl", tmp_path / "clean.jsonl"
    argv = ["generate", "--input", inp, "--batch-size", "2", *models(pair, max_new=24)]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "JAX_PLATFORMS": "cpu",
        "JAX_COMPILATION_CACHE_DIR": str(tmp_path / "jax-cache"),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    }
    cmd = [sys.executable, "-m", "jaxspec.cli", *argv, "--output", str(out)]
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            if out.exists() and out.read_bytes().count(b"\n") >= 5:
                break
            time.sleep(0.005)
    finally:
        proc.send_signal(signal.SIGKILL)
        _, err = proc.communicate()
    assert proc.returncode == -signal.SIGKILL, err.decode()[-2000:]
    written = out.read_bytes().count(b"\n")
    print(f"killed after {written} of {n} records")
    assert 5 <= written < n, "the job was not interrupted part-way"

    again = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    assert f"resuming: {written} of {n}" in again.stderr
    records = read_records(out)
    ids = [r["id"] for r in records]
    assert sorted(ids) == sorted(f"q{i}" for i in range(n)) and len(ids) == len(set(ids))

    assert cli.main([*argv, "--output", str(clean)]) == 0  # the uninterrupted run
    assert core(records) == core(read_records(clean))


# --------------------------------------------------------------------------------------------- convert


def test_convert_round_trip_keeps_the_logits(tmp_path, capsys, monkeypatch):
    src = FIXTURES / "llama_gqa"
    ids = np.arange(24).reshape(1, 24) % 32
    ref = np.asarray(jaxspec.load(src).logits(ids))
    assert cli.main(["convert", str(src), str(tmp_path / "js")]) == 0
    assert (tmp_path / "js" / "jaxspec.json").is_file()
    np.testing.assert_array_equal(np.asarray(jaxspec.load(tmp_path / "js").logits(ids)), ref)
    assert stages(capsys.readouterr().err) == []  # stderr is no terminal: no progress
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert cli.main(["export-hf", str(tmp_path / "js"), str(tmp_path / "hf")]) == 0
    assert terminal.getvalue() == f"jaxspec: loading: {tmp_path / 'js'}\njaxspec: writing: {tmp_path / 'hf'} (hf)\n"
    assert (tmp_path / "hf" / "config.json").is_file()
    np.testing.assert_array_equal(np.asarray(jaxspec.load(tmp_path / "hf").logits(ids)), ref)
    assert "wrote" in capsys.readouterr().out


def test_convert_errors(tmp_path, capsys):
    assert cli.main(["convert", str(tmp_path / "missing"), str(tmp_path / "dst")]) == 2
    assert "SRC" in one_error_line(capsys.readouterr().err)
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine")
    assert cli.main(["convert", str(FIXTURES / "llama_gqa"), str(full), "--to", "hf"]) == 2
    assert "not an empty directory" in one_error_line(capsys.readouterr().err)
    assert [p.name for p in full.iterdir()] == ["keep.txt"]


def test_accept_lengths_count_abstained_rounds_as_one():
    """A record's accept_lengths come from the verify rounds' histogram; the plain steps prompt lookup takes when
    it has no match (rounds the histogram lacks) count one token each, so the lengths still sum to rounds +
    accepted."""
    hist, accepted = (2, 1, 0, 3), 1 * 1 + 3 * 3
    assert cli.accept_lengths(hist) == [1, 1, 2, 4, 4, 4]
    lengths = cli.accept_lengths(hist, rounds=9)
    assert lengths == [1, 1, 1, 1, 1, 2, 4, 4, 4]
    assert len(lengths) == 9 and sum(lengths) == 9 + accepted
    assert cli.accept_lengths(hist, rounds=6) == cli.accept_lengths(hist)  # nothing abstained
