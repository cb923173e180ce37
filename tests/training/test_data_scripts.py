"""scripts/data/generate_distill_data.py --records: the target answers stored records' chat prompts itself."""

import json
import random
import runpy
import sys
from pathlib import Path

import numpy as np
from helpers import tiny_config

import jaxspec
from jaxspec.models import llama

SCRIPT = Path(__file__).parents[2] / "scripts" / "data" / "generate_distill_data.py"


def _run(argv, monkeypatch):
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), *argv])
    runpy.run_path(str(SCRIPT), run_name="__main__")


def test_records_are_answered_by_the_target_in_shuffled_order_and_resume(tmp_path, monkeypatch):
    target = llama.init(tiny_config(), seed=0, eos_token_id=1)
    where = jaxspec.save(target, tmp_path / "target")
    rng = np.random.default_rng(3)
    records = [{"id": "raw-0", "prompt_ids": [5], "output_ids": [6, 7]}]  # raw source: no prompt to answer
    for k in range(6):
        prompt = [int(t) for t in rng.integers(2, target.vocab_size, size=int(rng.integers(3, 9)))]
        records.append({"id": f"fn-{k}", "prompt_ids": prompt, "output_ids": [9, 9]})
    src = tmp_path / "records.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in records))
    out = tmp_path / "answers.jsonl"
    common = ["--target", str(where), "--records", str(src), "--shuffle", "4", "--out", str(out)]
    common += ["--batch-size", "2", "--max-new-tokens", "6", "--max-prompt-tokens", "16"]
    _run([*common, "--limit", "2"], monkeypatch)
    first = [json.loads(line) for line in out.read_text().splitlines()]
    _run([*common, "--limit", "4"], monkeypatch)  # resumes: answers only the two it lacks
    answers = [json.loads(line) for line in out.read_text().splitlines()]
    assert answers[:2] == first and len(answers) == 4

    order = [r for r in records if r["id"].startswith("fn-")]
    random.Random(4).shuffle(order)
    assert {a["id"] for a in first} == {r["id"] for r in order[:2]}
    assert {a["id"] for a in answers} == {r["id"] for r in order[:4]}  # the raw record is never answered
    by_id = {r["id"]: r for r in records}
    for a in answers:
        prompt = by_id[a["id"]]["prompt_ids"]
        assert a["prompt_ids"] == prompt  # the stored ids, not re-tokenized
        plain = jaxspec.generate(target, [prompt], max_new_tokens=6, temperature=0.0)
        assert a["output_ids"] == [int(t) for t in plain.tokens[0]]  # the target's own greedy answer
        assert a["output_ids"] != by_id[a["id"]]["output_ids"]  # not the stored reference answer
