"""The ``--quant`` mode: SmolLM2-135M-Instruct in float32 and in each quantized format (``jaxspec.quantize``),
side by side: resident weight bytes, load time, the cost of a one-token step and of passes over 3, 5 and 9 tokens
(interleaved call by call, int8's in blocks of their own; v = pass ÷ the same model's one-token step), and the
quality against float32 on HumanEval prompts: over the float model's greedy continuation (teacher-forced), the
share of positions where the quantized model's argmax is the same token, and the KL divergence of its next-token
distribution from the float one (mean and max); and the share of prompts whose whole greedy continuation is
unchanged. The speculative speed-up over a quantized target is the ``--humaneval`` mode with ``--quantize``."""

from __future__ import annotations

import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import jaxspec
from jaxspec.bench import measure
from jaxspec.bench.humaneval import TARGET, bucket_cache, load_problems, prompt_ids
from jaxspec.models import quant

WIDTHS = (1, 3, 5, 9)


def quality(ref, model, prompts: list[list[int]], continuations: list[list[int]]) -> dict:
    """Teacher-forced agreement and KL of ``model`` against ``ref`` over each prompt's ``ref`` continuation (the
    sequences right-padded to one length: causal logits before the padding do not see it; one compile each)."""
    seqs = [p + c for p, c in zip(prompts, continuations)]
    width = max(map(len, seqs))
    batch = jnp.asarray([s + [0] * (width - len(s)) for s in seqs])
    lp_ref, lp = (np.asarray(jax.nn.log_softmax(m.logits(batch))) for m in (ref, model))
    agree, kls = [], []
    for i, (prompt, cont) in enumerate(zip(prompts, continuations)):
        at = slice(len(prompt) - 1, len(prompt) - 1 + len(cont))  # the positions that predict the continuation
        a, b = lp_ref[i, at], lp[i, at]
        agree.append(a.argmax(-1) == b.argmax(-1))
        kls.append(np.sum(np.exp(a) * (a - b), axis=-1))
    a, k = np.concatenate(agree), np.concatenate(kls)
    return {"argmax_agreement": float(a.mean()), "kl_mean": float(k.mean()), "kl_max": float(k.max())}


def run(args) -> dict:
    """Loads the target once per format, times the steps interleaved, compares with float32; prints a table and
    returns the JSON document."""
    formats = ["float32", *quant.FORMATS]
    models: dict = {}
    records: dict[str, dict] = {}
    doc = {"mode": "quant", "target": TARGET, "formats": records}
    for fmt in formats:
        start = time.perf_counter()
        model = jaxspec.load(getattr(args, "target", None) or TARGET, quantize=None if fmt == "float32" else fmt)
        jax.block_until_ready(model.params)
        models[fmt] = model
        records[fmt] = {"load_s": time.perf_counter() - start, "weight_bytes": model.param_bytes}
    ref = models["float32"]
    problems = load_problems(args.humaneval_prompts or 20)
    prompts = prompt_ids(ref, problems)
    greedy = {
        fmt: jaxspec.generate(m, prompts, max_new_tokens=args.max_new_tokens, temperature=0.0).tokens
        for fmt, m in models.items()
    }
    position = int(statistics.median(map(len, prompts)))
    cache_len = bucket_cache(position + args.max_new_tokens)
    # int8's steps write the whole float weights out (XLA:CPU), and a w8a8 step timed right after one ran ~40 %
    # slower than after the others (docs/history/quantization.md): int8 gets a timer of its own, its blocks
    # alternating with the others' so drift still hits every format alike
    groups = ([f for f in models if f != "int8"], ["int8"])  # models holds every format (float32, *FORMATS)
    timers = [
        measure.StepTimer({f"{f}_{w}": (models[f], w) for f in fmts for w in WIDTHS}, cache_len, position, args.seed)
        for fmts in groups
    ]
    for _ in range(max(1, args.step_iters // 5)):
        for timer in timers:
            timer.block(5)
    ms = {k: v * 1e3 for timer in timers for k, v in timer.medians().items()}
    f32_step = ms["float32_1"]
    print(
        f"quant: {ref.name}, {len(prompts)} HumanEval prompts, {args.max_new_tokens} greedy tokens, cache "
        f"{cache_len}, steps at position {position} ({min(t.count() for t in timers)} calls each; interleaved "
        "call by call, int8 in blocks of its own)"
    )
    header = (
        f"{'format':>8} | {'MB':>6} | {'×f32':>5} | {'load s':>6} | {'step ms':>7} | {'×f32':>5} | "
        + " | ".join(f"v({w})" for w in WIDTHS[1:])
        + f" | {'argmax':>6} | {'KL mean':>8} | {'KL max':>7} | {'same':>5}"
    )
    print(header + "\n" + "-" * len(header))
    for fmt in formats:
        rec = records[fmt]
        rec["step_ms"] = {str(w): ms[f"{fmt}_{w}"] for w in WIDTHS}
        rec["v"] = {str(w): ms[f"{fmt}_{w}"] / ms[f"{fmt}_1"] for w in WIDTHS[1:]}
        rec["step_vs_float32"] = ms[f"{fmt}_1"] / f32_step
        rec["weights_vs_float32"] = rec["weight_bytes"] / records["float32"]["weight_bytes"]
        rec.update(quality(ref, models[fmt], prompts, greedy["float32"]) if fmt != "float32" else {})
        rec["same_greedy_rows"] = float(np.mean([a == b for a, b in zip(greedy[fmt], greedy["float32"])]))
        q = (
            f"{rec['argmax_agreement']:>6.3f} | {rec['kl_mean']:>8.4f} | {rec['kl_max']:>7.3f}"
            if fmt != "float32"
            else f"{'-':>6} | {'-':>8} | {'-':>7}"
        )
        print(
            f"{fmt:>8} | {rec['weight_bytes'] / 1e6:>6.1f} | {rec['weights_vs_float32']:>5.2f} | "
            f"{rec['load_s']:>6.1f} | {ms[f'{fmt}_1']:>7.1f} | {rec['step_vs_float32']:>5.2f} | "
            + " | ".join(f"{rec['v'][str(w)]:>4.2f}" for w in WIDTHS[1:])
            + f" | {q} | {rec['same_greedy_rows']:>5.2f}",
            flush=True,
        )
    return doc
