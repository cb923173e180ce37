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

from jaxspec import loop, sharding
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
    ``iters`` calls after a compile and a warm-up call (``executable``: that call already compiled, e.g. by
    ``compile_steps``)."""
    fn = executable or _step(model.apply_fn)
    params, toks, pos, cache = _step_args(model, batch, cache_len, tokens)
    times = []
    for i in range(iters + 2):  # compile + warm-up
        start = time.perf_counter()
        _, cache = jax.block_until_ready(fn(params, toks, pos, cache))
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


def measure_costs(target, draft, batch: int, cache_len: int, gammas, round_timer=None) -> Costs:
    """The ``Costs`` of ``target`` and ``draft`` (a ``CausalLM``, or a drafter without a model such as prompt
    lookup: c = p = 0) at ``batch`` rows and a cache of ``cache_len``, for the candidate ``gammas``. The prefills
    are timed over min(64, cache_len / 2) prompt tokens. ``round_timer(gammas)``: seconds per in-loop round for
    each γ (γ = 0: the plain step), as ``generate`` builds it from ``time_rounds``; without it ``Costs.round`` is
    None (r(γ) = γc + v(γ))."""
    tokens = min(64, cache_len // 2)
    has_model = hasattr(draft, "apply_fn")
    steps = [(target, batch, cache_len, n) for n in {1, tokens, *(g + 1 for g in gammas)}]
    if has_model:
        steps += [(draft, batch, cache_len, 1), (draft, batch, cache_len, tokens)]
    compiled = compile_steps(steps)

    def timed(model, n):
        return time_step(model, batch, cache_len, n, executable=compiled[(model, batch, cache_len, n)])

    step = timed(target, 1)
    v = {g: timed(target, g + 1) / step for g in gammas}
    target_prefill = timed(target, tokens) / step
    if has_model:
        c = timed(draft, 1) / step
        prefill = timed(draft, tokens) / step
    else:  # prompt lookup: no model
        c, prefill = 0.0, 0.0
    rounds = None
    if round_timer is not None:
        seconds = round_timer((0, *gammas))
        rounds = {g: seconds[g] / seconds[0] for g in gammas}
    return Costs(c, v, prefill, rounds, target_prefill, tokens)
