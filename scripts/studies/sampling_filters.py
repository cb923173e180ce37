"""What top-k and top-p cost: the warp alone, and SmolLM2-135M-Instruct decoding with them, under the filter
``jaxspec.core.sampling`` uses (bisection over the logits' ordered keys) or a sort of the vocabulary (the rule it
replaced, kept here as the reference).

    python scripts/studies/sampling_filters.py [--filter bisect|sort] [--repeats 5] [--max-new-tokens 64]

Prints the median time of ``warp`` on [1, 4, 49152] and [2, 4, 49152] logits (a verify's positions at γ = 3),
then, for one HumanEval-like chat prompt at batch 1, the median tok/s over ``--repeats`` seeded calls of plain
decoding and of the shipped EAGLE-3 head, greedy, T = 0.7, T = 0.7 with top-p 0.9 and T = 0.7 with top-k 40. The
filter is chosen before anything compiles, so one process measures one filter: run it once per filter.

A one-off measurement, not a test: its figures are recorded in docs/history/cpu-costs.md.
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np


def sort_filter(scaled, top_k, top_p):
    """The sort-based top-k then top-p of the module's rule (what ``_filter`` computed before the bisection)."""
    vocab = scaled.shape[-1]
    desc = -jnp.sort(-scaled, axis=-1)
    k = jnp.clip(jnp.where(top_k > 0, top_k, vocab), 1, vocab)
    kth = jnp.take_along_axis(desc, jnp.broadcast_to(k - 1, desc.shape[:-1] + (1,)), axis=-1)
    desc_k = jnp.where(desc >= kth, desc, -jnp.inf)
    probs_desc = jax.nn.softmax(desc_k, axis=-1)
    mass_before = jnp.cumsum(probs_desc, axis=-1) - probs_desc
    n_keep = jnp.maximum(jnp.sum(mass_before < top_p, axis=-1, keepdims=True), 1)
    pth = jnp.take_along_axis(desc_k, n_keep - 1, axis=-1)
    return jnp.where(scaled >= jnp.maximum(kth, pth), scaled, -jnp.inf)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--filter", choices=("bisect", "sort"), default="bisect")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args(argv)

    import jaxspec
    from jaxspec.core import sampling

    if args.filter == "sort":
        sampling._filter = sort_filter  # warp reads it when it is traced
    warp = jax.jit(sampling.warp)
    for shape in ((1, 4, 49152), (2, 4, 49152)):
        logits = jnp.asarray(np.random.default_rng(0).normal(0.0, 3.0, size=shape), jnp.float32)
        for name, params in (
            ("T=0.7", sampling.SamplingParams.create(0.7)),
            ("top-p 0.9", sampling.SamplingParams.create(0.7, top_p=0.9)),
            ("top-k 40", sampling.SamplingParams.create(0.7, top_k=40)),
        ):
            warp(logits, params).block_until_ready()
            times = []
            for _ in range(20):
                start = time.perf_counter()
                warp(logits, params).block_until_ready()
                times.append(time.perf_counter() - start)
            print(f"{args.filter} warp {shape} {name}: {statistics.median(times) * 1e3:.2f} ms", flush=True)

    target = jaxspec.load("smollm2-135m-instruct")
    head = jaxspec.eagle.load("jaxspec/smollm2-eagle3", target)
    prompt = ["Write a function that reverses a list."]
    settings = (
        ("greedy", dict(temperature=0.0)),
        ("T=0.7", dict(temperature=0.7)),
        ("T=0.7 top-p 0.9", dict(temperature=0.7, top_p=0.9)),
        ("T=0.7 top-k 40", dict(temperature=0.7, top_k=40)),
    )
    for name, kw in settings:
        for label, draft in (("plain", None), ("head", head)):
            call = dict(draft=draft, max_new_tokens=args.max_new_tokens, chat=True, **kw)
            jaxspec.generate(target, prompt, seed=0, **call)  # compile
            rates = [jaxspec.generate(target, prompt, seed=s, **call).stats.tokens_per_s for s in range(args.repeats)]
            print(f"{args.filter} {name} {label}: {statistics.median(rates):.1f} tok/s", flush=True)


if __name__ == "__main__":
    main()
