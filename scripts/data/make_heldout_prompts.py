"""Write checkpoints/heldout_prompts.jsonl: prompts cut from the corpus's held-out files (never trained on).

    python scripts/data/make_heldout_prompts.py [--count 24] [--out checkpoints/heldout_prompts.jsonl]
    python scripts/data/make_heldout_prompts.py --split train --category docs --count 200 --out runs/docs_train.jsonl

Each prompt is up to 10 consecutive lines (at most 400 characters) starting at a random line of a file of the
chosen split and category (stdlib source "code" or documentation "docs"), drawn with a fixed seed. The second
form makes a workload for ``jaxspec distill`` (training files only; several prompts per file when needed).
"""

import argparse
import json

import numpy as np

from jaxspec.training import corpus


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--count", type=int, default=24)
    ap.add_argument("--out", default="checkpoints/heldout_prompts.jsonl")
    ap.add_argument("--split", choices=["heldout", "train"], default="heldout")
    ap.add_argument("--category", choices=["all", "code", "docs"], default="all")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    files = [
        (n, p)
        for n, p in corpus.corpus_files(args.split)
        if not n.startswith("stdlib/encodings/")
        and len(corpus.read_text(p)) > 2000
        and args.category in ("all", "docs" if n.startswith("docs/") else "code")
    ]
    picks = rng.choice(len(files), size=args.count, replace=args.count > len(files))
    with open(args.out, "w") as f:
        for i, k in enumerate(sorted(picks)):
            name, path = files[k]
            lines = corpus.read_text(path).splitlines(keepends=True)
            start = int(rng.integers(0, max(1, len(lines) - 10)))
            text = "".join(lines[start : start + 10])[:400]
            category = "docs" if name.startswith("docs/") else "code"
            f.write(
                json.dumps({"id": f"{args.split}-{i:02d}", "category": category, "source": name, "prompt": text}) + "\n"
            )
    print(f"wrote {len(picks)} prompts to {args.out}")


if __name__ == "__main__":
    main()
