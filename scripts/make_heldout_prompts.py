"""Write checkpoints/heldout_prompts.jsonl: prompts cut from the corpus's held-out files (never trained on).

    python scripts/make_heldout_prompts.py [--count 24] [--out checkpoints/heldout_prompts.jsonl]

Each prompt is up to 10 consecutive lines (at most 400 characters) starting at a random line of a held-out file
(stdlib source or documentation), drawn with a fixed seed.
"""

import argparse
import json

import numpy as np

from jaxspec import corpus


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--count", type=int, default=24)
    ap.add_argument("--out", default="checkpoints/heldout_prompts.jsonl")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    files = [(n, p) for n, p in corpus.corpus_files("heldout")
             if not n.startswith("stdlib/encodings/") and len(corpus.read_text(p)) > 2000]
    picks = rng.choice(len(files), size=min(args.count, len(files)), replace=False)
    with open(args.out, "w") as f:
        for i, k in enumerate(sorted(picks)):
            name, path = files[k]
            lines = corpus.read_text(path).splitlines(keepends=True)
            start = int(rng.integers(0, max(1, len(lines) - 10)))
            text = "".join(lines[start : start + 10])[:400]
            category = "docs" if name.startswith("docs/") else "code"
            f.write(json.dumps({"id": f"heldout-{i:02d}", "category": category, "source": name,
                                "prompt": text}) + "\n")
    print(f"wrote {len(picks)} prompts to {args.out}")


if __name__ == "__main__":
    main()
