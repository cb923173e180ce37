"""Timings behind ``gamma="auto"``'s cost model (``jaxspec.policy.cost``): standalone model steps and rounds of the
compiled generation loop, in seconds, and the ``Costs`` of a model pair built from them."""

from __future__ import annotations

import functools
import math
import statistics
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxspec import loop
from jaxspec.core import sampling
from jaxspec.loop import executables
from jaxspec.models import families
from jaxspec.parallel import sharding
from jaxspec.policy.cost import Costs, interpolate


@functools.cache
def _step(apply_fn, prefill: bool = False):
    if not prefill:
        return jax.jit(apply_fn, donate_argnums=3)

    def cache_only(params, tokens, positions, cache):
        # as in the loop's prefill, which keeps the cache alone: XLA then leaves out the LM head (a large part
        # of a small model's prefill, most of an EAGLE head's)
        return apply_fn(params, tokens, positions, cache)[-1]

    return jax.jit(cache_only, donate_argnums=3)


def _host_zeros(tree):
    """Zeros of the shapes and dtypes of ``tree`` (of ``jax.ShapeDtypeStruct``s), made on the host and put on the
    device: building them with jax ops (``jnp.zeros``, even ``jnp.asarray``) would compile a small program per shape
    on a first call, while compiles of the steps hold the cores (a cost does not depend on the values)."""
    return jax.tree.map(lambda s: jax.device_put(np.zeros(s.shape, s.dtype)), tree)


def _step_args(model, batch: int, cache_len: int, tokens: int) -> tuple:
    toks = jax.device_put(np.zeros((batch, tokens), np.int32))
    pos = jax.device_put(np.broadcast_to(np.arange(tokens, dtype=np.int32) + cache_len // 2, (batch, tokens)))
    cache = _host_zeros(jax.eval_shape(lambda: model.init_cache(batch, cache_len)))
    return model.params, toks, pos, cache


def compile_all(lowered: dict) -> dict:
    """``{key: executable}`` for ``{key: jax Lowered, or a function returning one}``, compiled on parallel threads
    (``executables.compile_lowered``)."""
    return executables.compile_lowered(lowered)


def _lower_step(step):
    model, batch, cache_len, tokens, prefill = step
    return _step(model.apply_fn, prefill).lower(*_step_args(model, batch, cache_len, tokens))


def lower_steps(steps) -> dict:
    """``{(model, batch, cache_len, tokens, prefill): Lowered}`` for the jitted ``apply_fn`` calls ``time_step``
    makes (``prefill``: keeping the cache alone)."""
    return {s: _lower_step(s) for s in steps}


WARM_S = 0.1  # after the skipped calls, a call is repeated untimed for this long (at least once, at most 20 calls)


def _timed_calls(call, iters: int, skip: int, budget_s: float) -> float:
    """Fastest seconds of ``call()`` over ``iters`` calls after ``skip`` untimed ones and a warm-up of ``WARM_S``;
    fewer timed calls (at least one) once they add up to ``budget_s``: a long call (a prefill) is timed once or
    twice, a short one ``iters`` times.

    A fresh executable's first call pays one-time costs and its next few run slower than later ones, settling over
    about ten calls of a short step (docs/history/continuous.md); timed too early, a short step looks slower than
    a long one's share and v reads low. Hence the skipped calls and the warm-up.
    """
    return _timed_in_turn({None: call}, iters, skip, budget_s)[None]


def _timed_in_turn(calls: dict, iters: int, skip: int, budget_s: float) -> dict:
    """``{key: fastest seconds}`` of each of ``calls`` (``{key: call}``), each warmed up as ``_timed_calls`` does,
    then timed in turn (every repeat calls each once, so a burst of load on a shared machine falls on all alike)
    ``iters`` times, or fewer (at least once) once the timed calls add up to ``budget_s`` per call.

    The fastest call, not the median: other work only ever adds time, and bursts of it last long enough to take
    half the calls. Four calibrations of SmolLM2 at batch 4 in one process (2-core CPU) put v(3) at 1.12–1.46 by
    the median and 1.35–1.41 by the fastest; ``time_rounds`` takes the fastest run too. (The load reference, which
    measures the load, keeps its median.)"""
    for call in calls.values():
        for _ in range(skip):  # never timed: a fresh executable's first call pays one-time costs
            call()
        warm, start = 0, time.perf_counter()
        while warm == 0 or (time.perf_counter() - start < WARM_S and warm < 20):
            call()
            warm += 1
    times: dict[Any, list[float]] = {key: [] for key in calls}
    spent, repeats = 0.0, 0
    while repeats == 0 or (repeats < iters and spent < budget_s * len(calls)):
        for key, call in calls.items():
            start = time.perf_counter()
            call()
            times[key].append(time.perf_counter() - start)
            spent += times[key][-1]
        repeats += 1
    return {key: min(t) for key, t in times.items()}


def _step_call(model, batch: int, cache_len: int, tokens: int, executable=None, prefill: bool = False):
    """A call of one jitted ``model.apply_fn`` pass, as ``time_step`` times it."""
    fn = executable or _step(model.apply_fn, prefill)
    params, toks, pos, cache = _step_args(model, batch, cache_len, tokens)
    state = [cache]

    def call():
        out = jax.block_until_ready(fn(params, toks, pos, state[0]))
        state[0] = out if prefill else out[1]

    return call


def time_step(
    model,
    batch: int,
    cache_len: int,
    tokens: int,
    iters: int = 5,
    executable=None,
    budget_s: float = math.inf,
    prefill: bool = False,
) -> float:
    """Fastest seconds of one jitted ``model.apply_fn`` call on ``tokens: [batch, tokens]`` at positions from
    ``cache_len // 2`` into a fresh cache of ``cache_len`` (donated and threaded, as inside the loop), over
    ``iters`` calls (fewer, at least one, once they add up to ``budget_s``) after a warm-up call (and a compile
    unless ``executable``, that call already compiled, e.g. by ``compile_all(lower_steps(...))``, is given).
    ``prefill``: the call keeps the cache alone, as the loop's prefill does, so no logits are computed."""
    call = _step_call(model, batch, cache_len, tokens, executable, prefill)
    return _timed_calls(call, iters, 1 if executable is not None else 2, budget_s)  # warm-up (+ compile)


@functools.cache
def _draw():
    def draw(logits, keys, params):
        return jax.vmap(sampling.sample)(keys, sampling.warp(logits, params))

    return jax.jit(draw)


def _draw_args(batch: int, vocab: int) -> tuple:
    # drawn on the host: a jax draw here would compile a program of its own on a first call
    logits = np.random.default_rng(0).standard_normal((batch, vocab), np.float32)
    data = jax.eval_shape(lambda: jax.random.key_data(jax.random.key(0)))  # the default generator's key layout
    keys = jax.random.wrap_key_data(jax.device_put(np.ones((batch, *data.shape), data.dtype)))
    ones, off = jax.device_put((np.ones(batch, np.float32), np.zeros(batch, np.int32)))
    return jax.device_put(logits), keys, sampling.SamplingParams(ones, off, ones)


def lower_sampling(batch: int, vocab: int):
    """The ``Lowered`` warp-and-draw program ``time_sampling`` times (to compile it beside the steps)."""
    return _draw().lower(*_draw_args(batch, vocab))


def time_sampling(batch: int, vocab: int, iters: int = 5, executable=None) -> float:
    """Fastest seconds of warping ``[batch, vocab]`` logits at temperature 1 and drawing one token per row (what a
    round does besides the model passes, once per draft token and once per verified position), over ``iters``
    calls after a warm-up call (and a compile unless ``executable``, from ``lower_sampling``, is given)."""
    args = _draw_args(batch, vocab)
    fn = executable or _draw()
    return _timed_calls(lambda: jax.block_until_ready(fn(*args)), iters, 1 if executable is not None else 2, math.inf)


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


STEP_BUDGET_S = 0.25  # measure_costs: a step is timed ``iters`` times, or fewer (at least once) past this many s
REFERENCE_ITERS = 5  # Reference.time: timed calls (after one untimed), their median taken


class Reference:
    """The load reference of a (target, batch, cache length): one 1-token step of the target (of its first
    ``LAYER_POINTS[0]`` layers when it is deep: ``depth_copies``), timed once when the costs are measured
    (``Costs.reference_s``) and again right after a call's loop, so that the loop's seconds can be put in the
    seconds the calibration would have measured (``AutoGamma.observe_rounds``).

    Why: a loop's seconds per round mean nothing on their own on a shared machine, where other work slows every
    program by a factor that changes from minute to minute (on the 2-core CPU, the same plain call took 55 to 125
    ms a step within ten minutes). r(γ) divides a round by a plain step, and the two are rarely measured in the same
    call; dividing each by a reference step timed in its own call compares them as if they had run side by side.
    """

    def __init__(self, target, batch: int, cache_len: int):
        copies = depth_copies(target)
        self.model = copies[min(copies)] if copies else target
        self.step = (self.model, batch, cache_len, 1, False)
        self.executable = None

    def compile(self) -> None:
        """Compile the reference step (unless ``measure_costs`` did)."""
        if self.executable is None:
            self.executable = compile_all({0: functools.partial(_lower_step, self.step)})[0]

    def time(self, iters: int = REFERENCE_ITERS) -> float:
        """Median seconds of the reference step over ``iters`` calls after one untimed call."""
        self.compile()
        call = _step_call(*self.step[:4], self.executable)
        call()
        times = []
        for _ in range(iters):
            start = time.perf_counter()
            call()
            times.append(time.perf_counter() - start)
        return statistics.median(times)


def verify_gammas(gammas) -> tuple[int, ...]:
    """The one candidate whose verify pass ``measure_costs`` times (over γ+1 tokens): the one nearest the mean of
    the candidates (the larger on a tie); with v(0) = 1 (the plain step itself) the others' v is ``interpolate``d
    on the line through both, so a first call compiles two target programs, not one per candidate. For
    (1, 2, 3, 4, 6): 3 is timed. On the 2-core CPU (SmolLM2, batch 1), where v(γ) is concave (1.20, 1.41, 1.65, 1.89
    at γ = 1, 2, 4, 6), that puts v(1), v(2), v(4) and v(6) at about -2 %, -4 %, +3 % and +9 % of their timings; a γ
    that a call has run is then taken from that call's own rounds (``cost.round_costs``)."""
    gammas = sorted(set(gammas))
    mean = sum(gammas) / len(gammas)
    return (min(gammas, key=lambda g: (abs(g - mean), -g)),)


def prefill_tokens(batch: int, cache_len: int) -> int:
    """The prompt tokens the prefills are timed over: about 512 tokens in all (batch × tokens), between 8 and 64
    per row and at most half the cache, so a large batch does not time long prefills for seconds."""
    return max(1, min(64, max(8, 512 // batch), cache_len // 2))


def extrapolate(points: dict, x: float) -> float:
    """The value at ``x`` of a cost known at ``points`` (``{size: cost}``, at least two sizes), extrapolated
    linearly from the two largest: the largest size's cost plus the slope between them (never negative: timing
    noise does not make a larger pass cheaper) for each further unit. Used for two sizes:

    * a target prefill over ``x`` prompt tokens from its timed passes (``{width: time of a pass over width
      tokens}``): what ``measure_costs`` reports until a call has run one (``AutoGamma.observe_prefill``), so no
      prefill program is compiled for it. On the 2-core CPU, from the 1- and 5-token passes, it puts SmolLM2's
      64-token prefill at 11.6 steps against 12.6 timed; a prefill counts on both sides of the expected speed-up,
      so that moves its estimate by under 1 % there;
    * a deep model's pass from copies that keep its first layers (``{layers: time}``, ``LAYER_POINTS``)."""
    lo, hi = sorted(points)[-2:]
    slope = max(0.0, (points[hi] - points[lo]) / (hi - lo))
    return points[hi] + max(0, x - hi) * slope


# A model of at least EXTRAPOLATE_FROM layers has its passes timed on two copies that keep its first LAYER_POINTS
# layers (``families.first_layers``: the same weights, embedding and LM head) and ``extrapolate``d to its depth:
# compiling 1 + 4 layers instead of all of them costs less (layers are held split, so compile time grows with depth).
# On the 2-core CPU the estimates from 1 + 4, 2 + 6 and 3 + 11 layers all fall within about ±10 % of the full
# passes' timings, and as often outside it, set by the machine's noise, while 1 + 4 compiles the least; calls then
# measure their own rounds (docs/history/gamma-auto.md).
LAYER_POINTS = (1, 4)
EXTRAPOLATE_FROM = 22
DEPTH_ITERS = 9  # calls timed per copy (cheap ones): the slope between them is multiplied by the layers beyond


def depth_copies(model) -> dict | None:
    """``{layers: copy}`` for the ``LAYER_POINTS`` when ``model`` is a built-in family's model of at least
    ``EXTRAPOLATE_FROM`` layers, else None (it is timed whole)."""
    layers = getattr(model.config, "num_layers", None)
    if not isinstance(layers, int) or layers < EXTRAPOLATE_FROM:
        return None
    copies = {k: families.first_layers(model, k) for k in LAYER_POINTS}
    return None if any(c is None for c in copies.values()) else copies


def measure_costs(
    target, draft, batch: int, cache_len: int, gammas, round_timer=None, iters: int = 3, reference=None
) -> Costs:
    """The ``Costs`` of ``target`` and ``draft`` (a ``CausalLM``; a drafter with ``as_model()``, an EAGLE head,
    timed as that model's 1-token step; or a drafter without a model such as prompt lookup: c = p = 0) at
    ``batch`` rows and a cache of ``cache_len``, for the candidate ``gammas``, from standalone model steps (each
    lowered and compiled once, compiles overlapping on parallel threads, and timed ``iters`` times): the target
    over 1 and γ+1 tokens (γ of ``verify_gammas``; the others ``interpolate``d), the draft over 1 and
    ``prefill_tokens`` prompt tokens (its prefill keeps the cache alone, as the loop's does: no LM head); and one
    warp-and-draw over the target's vocabulary (``time_sampling``). A deep built-in model's passes are timed on
    copies with its first ``LAYER_POINTS`` layers (``DEPTH_ITERS`` times each) and ``extrapolate``d to its depth
    (``depth_copies``). The target's prefill is not timed but ``extrapolate``d from its passes (calls then measure
    their own).
    ``round_timer(gammas)``: seconds per in-loop round for each γ (γ = 0: the plain step), as ``generate`` builds
    it from ``time_rounds`` (this compiles every candidate loop: ``AutoGamma(calibrate="loops")``); without it
    ``Costs.round`` is None. ``reference``: a ``Reference`` of (``target``, ``batch``, ``cache_len``), compiled with
    the steps and timed right after the target's step (``Costs.reference_s``; 0 without one)."""
    tokens = prefill_tokens(batch, cache_len)
    if hasattr(draft, "as_model"):  # a drafter with a model of its own (an EAGLE head): time its steps
        draft = draft.as_model()
    has_model = hasattr(draft, "apply_fn")
    gammas = tuple(sorted(set(gammas)))
    timed_gammas = verify_gammas(gammas)
    widths = sorted({1, *(g + 1 for g in timed_gammas)})
    needed = [(target, n, False) for n in widths]  # (model, tokens, prefill) passes
    if has_model:
        needed += [(draft, 1, False), (draft, tokens, True)]
    copies = {m: depth_copies(m) or {} for m in {m for m, _, _ in needed}}  # {}: timed whole
    if reference is not None and copies[target]:  # the reference is one of the target's copies: the same object
        copies[target][min(copies[target])] = reference.model
    # per pass, the programs it is timed by: {layers: step} for a deep model's copies, {None: step} for the model
    plans = {
        (m, n, pre): {k: (c, batch, cache_len, n, pre) for k, c in copies[m].items()}
        if copies[m]
        else {None: (m, batch, cache_len, n, pre)}
        for m, n, pre in needed
    }
    programs: dict[Any, functools.partial] = {
        s: functools.partial(_lower_step, s) for plan in plans.values() for s in plan.values()
    }
    programs["draw"] = functools.partial(lower_sampling, batch, target.vocab_size)
    compiled = compile_all(programs)  # lowered in turn, compiled on parallel threads as each is ready

    def timed(model, n, prefill=False):
        plan = plans[(model, n, prefill)]
        if None in plan:
            return time_step(model, batch, cache_len, n, iters, compiled[plan[None]], STEP_BUDGET_S, prefill)
        calls = {k: _step_call(step[0], batch, cache_len, n, compiled[step], prefill) for k, step in plan.items()}
        depth = _timed_in_turn(calls, max(iters, DEPTH_ITERS), 1, STEP_BUDGET_S)  # the copies in turn
        return extrapolate(depth, model.config.num_layers)

    step_s = timed(target, 1)
    reference_s = 0.0
    if reference is not None:  # timed in the same burst as the step it stands for
        reference.executable = compiled[reference.step]
        reference_s = reference.time()
    passes = {1: 1.0, **{n: timed(target, n) / step_s for n in widths if n > 1}}
    v = interpolate({0: 1.0, **{g: passes[g + 1] for g in timed_gammas}}, gammas)
    target_prefill = extrapolate(passes, tokens)
    if has_model:
        c = timed(draft, 1) / step_s
        prefill = timed(draft, tokens, True) / step_s
    else:  # prompt lookup: no model
        c, prefill = 0.0, 0.0
    draw = time_sampling(batch, target.vocab_size, iters, executable=compiled["draw"]) / step_s
    rounds, unit_s = None, step_s
    if round_timer is not None:  # calibrate="loops": rounds observed later are in units of the in-loop plain step
        seconds = round_timer((0, *gammas))
        rounds = {g: seconds[g] / seconds[0] for g in gammas}
        unit_s = seconds[0]
    return Costs(c, v, prefill, rounds, target_prefill, tokens, unit_s, draw, reference_s)
