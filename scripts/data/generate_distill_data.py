"""Generate a target's outputs once, for offline draft distillation (``jaxspec distill --data``).

    python scripts/data/generate_distill_data.py --target smollm2-135m-instruct \
        --prompts runs/smol/train_prompts.jsonl --out runs/smol/train_data.jsonl \
        --batch-size 32 --max-new-tokens 160 --chat

Prompts are chat-formatted (``--chat``) and tokenized, then decoded by ``jaxspec.Engine`` (continuous batching over
``--batch-size`` slots, plain decoding, ``--temperature``, default greedy, EOS on) and appended to ``--out`` as
``{"id", "prompt_ids", "output_ids", "temperature"}``, one line per prompt as soon as its row finishes, flushed:
a killed run resumes where it stopped.

``--records`` instead of ``--prompts``: the target answers the chat prompts of stored records itself, e.g. the
``fn-*`` records of ``make_reference_answers.py`` (their ``prompt_ids`` are chat-formatted already; its raw-source
records are skipped), in an order shuffled by ``--shuffle SEED``, the first ``--limit N``:

    python scripts/data/generate_distill_data.py --target smollm2-135m-instruct --records ref_data.jsonl \
        --shuffle 5 --limit 2000 --out runs/smol/self_answers.jsonl
"""

import argparse
import json
import random
import time
from pathlib import Path

import jaxspec
from jaxspec.training.distill import read_prompts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", required=True)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompts", help='JSONL, one {"prompt": ...} a line')
    src.add_argument("--records", help='JSONL of stored records: answer their chat prompts ("id": "fn-...")')
    ap.add_argument("--shuffle", type=int, metavar="SEED", help="--records: answer them in this shuffled order")
    ap.add_argument("--limit", type=int, metavar="N", help="--records: only the first N (after --shuffle)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=160)
    ap.add_argument("--max-prompt-tokens", type=int, default=320)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--chat", action="store_true")
    ap.add_argument("--dtype", default="float32")
    args = ap.parse_args()
    if args.prompts and (args.shuffle is not None or args.limit is not None):
        ap.error("--shuffle and --limit order and cut --records; with --prompts, edit the prompts file")

    target = jaxspec.load(args.target, args.dtype)
    if args.records:
        lines = [json.loads(line) for line in Path(args.records).read_text().splitlines() if line.strip()]
        lines = [r for r in lines if str(r.get("id", "")).startswith("fn-")]
        if args.shuffle is not None:
            random.Random(args.shuffle).shuffle(lines)
        lines = lines[: args.limit]
        texts = [r["prompt_ids"] for r in lines]
    else:
        lines = [json.loads(line) for line in Path(args.prompts).read_text().splitlines() if line.strip()]
        texts = read_prompts(args.prompts)
    done = set()
    out = Path(args.out)
    if out.exists():
        done = {json.loads(line)["id"] for line in out.read_text().splitlines() if line.strip()}
    todo = []
    for rec, text in zip(lines, texts):
        if rec["id"] in done:
            continue
        if args.records:  # chat-formatted token ids already
            ids = list(text)
        elif args.chat:
            ids = target.tokenizer.apply_chat_template(
                [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
            )
            ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        else:
            ids = target.tokenizer.encode(text)
        if len(ids) <= args.max_prompt_tokens:
            todo.append((rec["id"], ids))
    print(f"{len(done)} done, {len(todo)} to generate", flush=True)
    engine = jaxspec.Engine(
        target,
        slots=args.batch_size,
        max_length=args.max_prompt_tokens + args.max_new_tokens,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
    )
    requests = [{"prompt": ids, "id": rid, "seed": k} for k, (rid, ids) in enumerate(todo)]
    start, tokens = time.time(), 0
    with open(out, "a") as f:
        for n, row in enumerate(engine.run(requests), 1):
            rec = {"id": row.id, "prompt_ids": todo[row.index][1], "output_ids": [int(t) for t in row.tokens]}
            f.write(json.dumps({**rec, "temperature": args.temperature}) + "\n")
            f.flush()
            tokens += len(row.tokens)
            if n % args.batch_size == 0 or n == len(todo):
                el = time.time() - start
                print(f"{n}/{len(todo)} prompts, {tokens} tokens, {el:.0f}s, {tokens / el:.1f} tok/s", flush=True)


if __name__ == "__main__":
    main()
