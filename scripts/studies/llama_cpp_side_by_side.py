"""jaxspec and llama.cpp side by side on the same GGUF file, the same prompts and the same token ids: batch 1, greedy,
HumanEval prompts (chat template), calls interleaved prompt by prompt in one run.

    python scripts/studies/llama_cpp_side_by_side.py --llama-python /tmp/lcppvenv/bin/python [--prompts 20]

llama.cpp runs through ``llama-cpp-python`` (built from its PyPI sdist in a separate venv: ``python -m venv
/tmp/lcppvenv && /tmp/lcppvenv/bin/pip install llama_cpp_python-*.tar.gz``) in a worker process of this script
(``--worker``), which reads one JSON request per line (token ids, how many new tokens, the mode) and answers with
the tokens and the seconds the call took: llama.cpp plain greedy on the file's own quantization (SmolLM2's Q4_1),
and its prompt-lookup decoding (``LlamaPromptLookupDecoding``). jaxspec runs here: plain float32, plain w8a8
(``jaxspec.quantize``) and w8a8 with the shipped EAGLE head. Each jaxspec mode's first call per compiled shape is
run once untimed. Prints tokens/s per mode (summed tokens ÷ summed seconds) and each mode's ratio to llama.cpp
plain, after the machine (CPU model, cores, features: ``jaxspec.bench.measure.machine``); ``--json`` writes them.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time


def worker(model_path: str, threads: int) -> None:
    """The llama.cpp side: answer JSON lines on stdin until EOF."""
    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    common = dict(model_path=model_path, n_ctx=1024, n_threads=threads, n_batch=512, verbose=False, seed=0)
    models = {
        "plain": Llama(**common),
        "lookup": Llama(**common, draft_model=LlamaPromptLookupDecoding(num_pred_tokens=4)),
    }
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        llm = models[req["mode"]]
        llm.reset()
        out: list[int] = []
        start = time.perf_counter()
        for tok in llm.generate(req["ids"], top_k=1, top_p=1.0, temp=0.0, repeat_penalty=1.0, reset=True):
            if tok in req["eos"]:
                break
            out.append(tok)
            if len(out) >= req["n"]:
                break
        seconds = time.perf_counter() - start
        print(json.dumps({"tokens": out, "seconds": seconds}), flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--worker", action="store_true")
    p.add_argument("--model")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--llama-python", default="/tmp/lcppvenv/bin/python")
    p.add_argument("--prompts", type=int, default=20)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--gamma", type=int, default=2)
    p.add_argument("--json")
    a = p.parse_args()
    if a.worker:
        worker(a.model, a.threads)
        return

    import jaxspec
    from jaxspec.bench.humaneval import HEAD, bucket_cache, load_problems, prompt_ids
    from jaxspec.bench.measure import machine
    from jaxspec.formats import named

    path = str(named.path("smollm2-135m-instruct"))
    target = jaxspec.load(path)
    quantized = jaxspec.load(path, quantize="w8a8")
    head = jaxspec.eagle.load(HEAD, quantized)
    ids = prompt_ids(target, load_problems(a.prompts))
    eos = [target.eos_token_id] if isinstance(target.eos_token_id, int) else list(target.eos_token_id)
    proc = subprocess.Popen(
        [a.llama_python, __file__, "--worker", "--model", path, "--threads", str(a.threads)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    assert json.loads(proc.stdout.readline()).get("ready")

    def llama(mode, prompt):
        proc.stdin.write(json.dumps({"mode": mode, "ids": prompt, "n": a.max_new_tokens, "eos": eos}) + "\n")
        proc.stdin.flush()
        r = json.loads(proc.stdout.readline())
        return r["tokens"], r["seconds"]

    kw = dict(max_new_tokens=a.max_new_tokens, temperature=0.0, eos_token_id=eos)

    def ours(model, draft=None):
        def run(prompt):
            extra = {} if draft is None else dict(draft=draft, gamma=a.gamma)
            start = time.perf_counter()
            r = jaxspec.generate(model, [prompt], **kw, **extra)
            return r.tokens[0], time.perf_counter() - start

        return run

    modes = {
        "llama.cpp plain (Q4_1)": lambda pr: llama("plain", pr),
        "llama.cpp prompt lookup": lambda pr: llama("lookup", pr),
        "jaxspec plain float32": ours(target),
        "jaxspec plain w8a8": ours(quantized),
        f"jaxspec w8a8 + EAGLE head γ={a.gamma}": ours(quantized, head),
    }
    totals = {m: [0, 0.0] for m in modes}
    warm: set = set()
    outputs: dict = {m: [] for m in modes}
    for prompt in ids:
        shape = bucket_cache(len(prompt) + a.max_new_tokens)
        if shape not in warm:  # compile jaxspec's programs for this shape outside the timing
            warm.add(shape)
            for m, run in modes.items():
                if m.startswith("jaxspec"):
                    run(prompt)
        for m, run in modes.items():
            tokens, seconds = run(prompt)
            totals[m][0] += len(tokens)
            totals[m][1] += seconds
            outputs[m].append(tokens)
    proc.stdin.close()
    proc.wait()
    base = totals["llama.cpp plain (Q4_1)"][0] / totals["llama.cpp plain (Q4_1)"][1]
    rows = {}
    host = machine()
    print(f"machine: {host.get('cpu', host['device'])}, {host.get('cpu_cores', '?')} cores, {host.get('cpu_features')}")
    print(f"{len(ids)} HumanEval prompts, batch 1, greedy, {a.max_new_tokens} new tokens, {a.threads} threads")
    for m, (n, s) in totals.items():
        rows[m] = {"tokens": n, "seconds": s, "tok_s": n / s, "vs_llama_cpp_plain": n / s / base}
        print(f"{m:>34}: {n:>5} tokens {s:>7.1f} s {n / s:>6.1f} tok/s  {n / s / base:>5.2f}× llama.cpp plain")
    same = sum(x == y for x, y in zip(outputs["jaxspec plain float32"], outputs["llama.cpp plain (Q4_1)"]))
    print(f"greedy rows identical, jaxspec float32 vs llama.cpp Q4_1: {same} / {len(ids)}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(
                {"machine": host, "prompts": len(ids), "max_new_tokens": a.max_new_tokens, "modes": rows}, f, indent=1
            )


if __name__ == "__main__":
    main()
