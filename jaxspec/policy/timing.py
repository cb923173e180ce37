"""Timings behind ``gamma="auto"``'s cost model (``jaxspec.policy.cost``): standalone model steps and rounds of the
compiled generation loop, in seconds, and the ``Costs`` of a model pair built from them."""

from __future__ import annotations

import concurrent.futures
import functools
import math
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxspec import loop, sampling, sharding
from jaxspec.policy.cost import Costs


@functools.cache
def _step(apply_fn):
    return jax.jit(apply_fn, donate_argnums=3)


def _step_args(model, batch: int, cache_len: int, tokens: int) -> tuple:
    toks = jnp.zeros((batch, tokens), jnp.int32)
    pos = jnp.broadcast_to(jnp.arange(tokens, dtype=jnp.int32) + cache_len // 2, (batch, tokens))
    return model.params, toks, pos, model.init_cache(batch, cache_len)


def compile_steps(steps) -> dict:
    """``{(model, batch, cache_len, tokens): executable}`` for the jitted ``apply_fn`` calls ``time_step`` makes,
    compiled on parallel threads (XLA compiles without holding Python's lock)."""
    lowered = {s: _step(s[0].apply_fn).lower(*_step_args(*s)) for s in steps}
    workers = max(1, min(len(lowered), os.cpu_count() or 1))
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        return dict(zip(lowered, pool.map(lambda lw: lw.compile(), lowered.values())))


def time_step(model, batch: int, cache_len: int, tokens: int, iters: int = 5, executable=None) -> float:
    """Median seconds of one jitted ``model.apply_fn`` call on ``tokens: [batch, tokens]`` at positions from
    ``cache_len // 2`` into a fresh cache of ``cache_len`` (donated and threaded, as inside the loop), over
    ``iters`` calls after a warm-up call (and a compile unless ``executable``, that call already compiled, e.g.
    by ``compile_steps``, is given)."""
    fn = executable or _step(model.apply_fn)
    params, toks, pos, cache = _step_args(model, batch, cache_len, tokens)
    skip = 1 if executable is not None else 2  # warm-up (+ compile)
    times = []
    for i in range(iters + skip):
        start = time.perf_counter()
        _, cache = jax.block_until_ready(fn(params, toks, pos, cache))
        if i >= skip:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


@functools.cache
def _draw():
    def draw(logits, keys, params):
        return jax.vmap(sampling.sample)(keys, sampling.warp(logits, params))

    return jax.jit(draw)


def time_sampling(batch: int, vocab: int, iters: int = 5) -> float:
    """Median seconds of warping ``[batch, vocab]`` logits at temperature 1 and drawing one token per row (what a
    round does besides the model passes, once per draft token and once per verified position), over ``iters``
    calls after a compile and a warm-up call."""
    logits = jax.random.normal(jax.random.key(0), (batch, vocab), jnp.float32)
    keys = jax.random.split(jax.random.key(1), batch)
    params = sampling.SamplingParams.create(1.0, batch=batch)
    times = []
    for i in range(iters + 2):
        start = time.perf_counter()
        jax.block_until_ready(_draw()(logits, keys, params))
        if i >= 2:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def time_rounds(
    specs: dict, target_params, draft_params, batch: int, greedy: bool, repeats: int = 7, budget: float = 0.06
) -> dict:
    """Seconds per round of each compiled loop in ``specs`` (γ -> ``LoopSpec``; ``loop.rounds_program``, the
    program ``stream`` and ``generate(gamma="auto")`` run) on a synthetic state of ``batch`` running rows: the
    fastest of ``repeats`` runs of k rounds minus the fastest of ``repeats`` runs of none (the dispatch), divided
    by k. k is enough rounds for about ``budget`` seconds (at most 16, and no more than the cache holds), so short
    steps of small models add up to a measurable time and large batches do not time for minutes. The loops are
    compiled first and then timed interleaved (every repeat runs each γ once), so a burst of load on a shared
    machine hits every candidate alike."""

    def once(spec, params, rounds: int):
        state = jax.block_until_ready(loop.timing_state(spec, batch, 1, greedy))
        limit, never = jnp.int32(rounds), jnp.int32(np.iinfo(np.int32).max)
        if spec.mesh is not None:
            limit = sharding.put(np.int32(rounds), NamedSharding(spec.mesh, P()))
            never = sharding.put(np.int32(np.iinfo(np.int32).max), NamedSharding(spec.mesh, P()))
        start = time.perf_counter()
        out, _ = loop.rounds_program(spec, target_params, params, state, limit, never)
        out = jax.block_until_ready(out)
        seconds = time.perf_counter() - start
        return seconds, int(np.max(sharding.to_host(out.rounds)))

    def limit_arg(spec, value: int):
        if spec.mesh is None:
            return jnp.int32(value)
        return sharding.put(np.int32(value), NamedSharding(spec.mesh, P()))

    # compile every candidate first, in parallel (the programs the calls below and the generation then reuse)
    loop.rounds_program.compile_all(
        [
            (spec, target_params, draft_params if g > 0 else None, loop.timing_state(spec, batch, 1, greedy))
            + (limit_arg(spec, 1), limit_arg(spec, np.iinfo(np.int32).max))
            for g, spec in specs.items()
        ]
    )
    plan = {}
    for g, spec in specs.items():
        params = draft_params if g > 0 else None
        once(spec, params, 1)  # warm up
        one = once(spec, params, 1)[0]
        fits = max(1, (spec.cache_len - 2) // (spec.gamma + 1))
        plan[g] = (spec, params, min(fits, max(2, min(16, math.ceil(budget / max(one, 1e-6))))))
    dispatch = {g: float("inf") for g in plan}
    runs = {g: (float("inf"), 1) for g in plan}
    for _ in range(repeats):
        for g, (spec, params, k) in plan.items():
            dispatch[g] = min(dispatch[g], once(spec, params, 0)[0])
            runs[g] = min(runs[g], once(spec, params, k))
    return {g: max(seconds - dispatch[g], 1e-3 * seconds) / max(rounds, 1) for g, (seconds, rounds) in runs.items()}


def prefill_tokens(batch: int, cache_len: int) -> int:
    """The prompt tokens the prefills are timed over: about 512 tokens in all (batch × tokens), between 8 and 64
    per row and at most half the cache, so a large batch does not time long prefills for seconds."""
    return max(1, min(64, max(8, 512 // batch), cache_len // 2))


def measure_costs(target, draft, batch: int, cache_len: int, gammas, round_timer=None, iters: int = 3) -> Costs:
    """The ``Costs`` of ``target`` and ``draft`` (a ``CausalLM``, or a drafter without a model such as prompt
    lookup: c = p = 0) at ``batch`` rows and a cache of ``cache_len``, for the candidate ``gammas``, from standalone
    model steps (each compiled once, in parallel, and timed ``iters`` times): the target over 1 and γ+1 tokens and
    over ``prefill_tokens`` prompt tokens, the draft over 1 and the prompt tokens; and one warp-and-draw over the
    target's vocabulary (``time_sampling``). ``round_timer(gammas)``: seconds
    per in-loop round for each γ (γ = 0: the plain step), as ``generate`` builds it from ``time_rounds`` (this
    compiles every candidate loop: ``AutoGamma(calibrate="loops")``); without it ``Costs.round`` is None."""
    tokens = prefill_tokens(batch, cache_len)
    has_model = hasattr(draft, "apply_fn")
    steps = [(target, batch, cache_len, n) for n in sorted({1, tokens, *(g + 1 for g in gammas)})]
    if has_model:
        steps += [(draft, batch, cache_len, 1), (draft, batch, cache_len, tokens)]
    compiled = compile_steps(steps)

    def timed(model, n):
        return time_step(model, batch, cache_len, n, iters=iters, executable=compiled[(model, batch, cache_len, n)])

    step_s = timed(target, 1)
    v = {g: timed(target, g + 1) / step_s for g in gammas}
    target_prefill = timed(target, tokens) / step_s
    if has_model:
        c = timed(draft, 1) / step_s
        prefill = timed(draft, tokens) / step_s
    else:  # prompt lookup: no model
        c, prefill = 0.0, 0.0
    draw = time_sampling(batch, target.vocab_size, iters) / step_s
    rounds, unit_s = None, step_s
    if round_timer is not None:  # calibrate="loops": rounds observed later are in units of the in-loop plain step
        seconds = round_timer((0, *gammas))
        rounds = {g: seconds[g] / seconds[0] for g in gammas}
        unit_s = seconds[0]
    return Costs(c, v, prefill, rounds, target_prefill, tokens, unit_s, draw)
