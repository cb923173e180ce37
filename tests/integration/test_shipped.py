"""The shipped pair in checkpoints/: loads by name offline, shares one tokenizer, and generates exactly."""

import json
from pathlib import Path

import pytest

import jaxspec
from jaxspec.formats.paths import shipped_dir

PROMPT = "def read_config(path):\n    with open(path) as f:\n"


@pytest.fixture(scope="module")
def pair():
    return jaxspec.load("jaxspec/code-target"), jaxspec.load("jaxspec/code-draft")


def test_shipped_pair_is_small_enough_and_sized_as_documented(pair):
    target, draft = pair
    size = sum(f.stat().st_size for f in shipped_dir().rglob("*") if f.is_file())
    assert size < 60 * 2**20, f"checkpoints/ is {size / 2**20:.1f} MiB"
    assert target.num_params >= 10_000_000
    assert target.num_params >= 10 * draft.num_params
    assert target.config.num_layers > draft.config.num_layers


def test_shared_tokenizer_round_trips_text(pair):
    target, draft = pair
    assert target.tokenizer.get_vocab() == draft.tokenizer.get_vocab()
    ids = target.tokenizer.encode(PROMPT)
    assert target.tokenizer.decode(ids) == PROMPT and max(ids) < target.vocab_size
    assert target.eos_token_id == target.tokenizer.eos_token_id is not None


def test_shipped_pair_generates_exactly_and_agrees(pair):
    target, draft = pair
    heldout = (shipped_dir() / "heldout_prompts.jsonl").read_text().splitlines()
    prompts = [PROMPT, json.loads(heldout[0])["prompt"]]
    spec = jaxspec.generate(target, prompts, draft=draft, gamma=4, max_new_tokens=32, temperature=0.0)
    plain = jaxspec.generate(target, prompts, max_new_tokens=32, temperature=0.0)
    assert spec.tokens == plain.tokens and spec.texts == plain.texts
    assert all(isinstance(t, str) and t for t in spec.texts)
    # a trained pair agrees far more than random weights would (greedy α ≈ 0 for unrelated random models)
    assert spec.stats.acceptance_rate > 0.3, spec.stats.summary()


@pytest.mark.parametrize("name", ["code-draft-greedy"])
def test_tuned_drafts_load_and_verify_exactly(pair, name):
    """The distilled drafts share the pair's architecture and tokenizer and give the target's greedy output."""
    target, base = pair
    draft = jaxspec.load(f"jaxspec/{name}")
    assert draft.config == base.config and draft.tokenizer.get_vocab() == target.tokenizer.get_vocab()
    spec = jaxspec.generate(target, [PROMPT], draft=draft, gamma=4, max_new_tokens=24, temperature=0.0)
    assert spec.tokens == jaxspec.generate(target, [PROMPT], max_new_tokens=24, temperature=0.0).tokens
    assert spec.stats.acceptance_rate > 0.3, spec.stats.summary()


def test_unknown_shipped_name_lists_the_available_ones():
    with pytest.raises(FileNotFoundError, match="available: .*jaxspec/code-draft.*jaxspec/code-target"):
        jaxspec.load("jaxspec/code-nothing")


def test_checkpoint_readme_documents_the_pair():
    text = (Path(shipped_dir()) / "README.md").read_text()
    for needle in ("jaxspec train", "held-out loss", "α", "speedup"):
        assert needle in text, needle


def test_cli_on_the_shipped_pair(tmp_path, capsys, monkeypatch):
    """The README's main command, small: the default models (SmolLM2-135M-Instruct, prompt lookup), both input
    formats, resumable. Layers stacked (``$JAXSPEC_LAYERS``): a fifth of the compile time, the same tokens."""
    from jaxspec import cli

    monkeypatch.setenv("JAXSPEC_LAYERS", "stacked")

    assert cli.main(["generate", "def read_config(path):", "--max-new-tokens", "16"]) == 0
    streamed = capsys.readouterr()
    assert streamed.out.strip() and "α" in streamed.err
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    lines = [
        {"id": "a", "category": "code", "prompt": PROMPT},
        {"question_id": 7, "category": "docs", "turns": ["The :mod:`json` module", "ignored"]},
    ]
    inp.write_text("".join(json.dumps(x) + "\n" for x in lines))
    argv = ["generate", "--input", str(inp), "--output", str(out), "--max-new-tokens", "16", "--no-progress"]
    assert cli.main(argv) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(str(r["id"]) for r in records) == ["7", "a"]
    assert all(r["new_tokens"] == len(r["token_ids"]) > 0 and r["accept_lengths"] for r in records)
    summary = capsys.readouterr().out
    assert "code" in summary and "docs" in summary
    assert cli.main(argv) == 0  # rerun: nothing missing, nothing duplicated
    assert len(out.read_text().splitlines()) == 2
