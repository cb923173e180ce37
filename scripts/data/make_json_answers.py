"""The target's own answers to the JSON-extraction request of ``jaxspec.bench.structured`` (describe a function as
``{"name", "args", "returns"}``), over *training-split* functions, decoded under that schema, for a drafter's
training data:

    python scripts/data/make_json_answers.py --out runs/smol/json_answers.jsonl --count 800

Functions: the standard library's training files, then the installed third-party packages' (as
``make_chat_prompts.py --source site-packages`` reads them, benchmark packages and this project skipped), chosen by
``structured.functions``'s rule; the benchmark's held-out files are never read. Greedy, the chat template, the
constraint on (what a constrained speculative call drafts against); records as ``generate_distill_data.py`` writes
them (``id``, ``prompt_ids``, ``output_ids``), resumable: ids already in ``--out`` are skipped.
"""

import argparse
import json
import sys
from pathlib import Path

import jaxspec
from jaxspec.bench import structured
from jaxspec.generation.request import tokenize
from jaxspec.training import corpus

sys.path.insert(0, str(Path(__file__).parent))
from make_chat_prompts import _site_files  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="smollm2-135m-instruct")
    ap.add_argument("--out", required=True)
    ap.add_argument("--count", type=int, default=800)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    args = ap.parse_args()
    files = corpus.stdlib_files("train") + _site_files()
    funcs = structured.functions(args.count, files)
    out = Path(args.out)
    done = {json.loads(line)["id"] for line in out.read_text().splitlines() if line.strip()} if out.exists() else set()
    todo = [(f"json-{i:04d}", f) for i, f in enumerate(funcs) if f"json-{i:04d}" not in done]
    print(f"{len(funcs)} functions, {len(done)} done, {len(todo)} to answer", flush=True)
    target = jaxspec.load(args.target)
    rule = jaxspec.JsonSchema(structured.SCHEMA)
    with open(out, "a") as f:
        for k in range(0, len(todo), args.batch_size):
            part = todo[k : k + args.batch_size]
            prompts = [structured.PROMPT.format(source=fn["source"]) for _, fn in part]
            ids = tokenize(target, prompts, chat=True)
            res = jaxspec.generate(
                target, prompts, chat=True, constraint=rule, temperature=0.0, max_new_tokens=args.max_new_tokens
            )
            for (rid, _), p, o in zip(part, ids, res.tokens):
                rec = {"id": rid, "prompt_ids": [int(t) for t in p], "output_ids": [int(t) for t in o]}
                f.write(json.dumps({**rec, "temperature": 0.0}) + "\n")
            f.flush()
            print(f"{k + len(part)}/{len(todo)}", flush=True)


if __name__ == "__main__":
    main()
