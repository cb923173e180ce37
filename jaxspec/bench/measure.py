"""Measurements: the machine (``machine``), model step and prefill timers, compile time, memory, ``generate`` runs,
and the in-loop breakdown (ms per round with a ~zero-cost null model swapped into the target and/or draft seat)."""

from __future__ import annotations

import dataclasses
import functools
import statistics
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import jaxspec
from jaxspec import loop
from jaxspec.bench.pairs import Pair, make_prompt
from jaxspec.core.model import CausalLM
from jaxspec.generation.generate import prepare

# --------------------------------------------------------------------------------------------- the machine

# the CPU features XLA:CPU's products depend on most (int8 dot products: VNNI; wide vectors: AVX-512; AMX tiles)
CPU_FEATURES = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8", "amx_bf16")


def machine(cpuinfo: str | None = None) -> dict:
    """The machine a run measured: backend, device, jax version, and on Linux the CPU's model name, logical cores
    and which of ``CPU_FEATURES`` it has (read from ``/proc/cpuinfo``, or ``cpuinfo`` when given): figures from
    machines with other features (a w8a8 product with or without VNNI) do not compare."""
    info: dict = {"backend": jax.default_backend(), "device": str(jax.devices()[0]), "jax": jax.__version__}
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read()
        except OSError:
            return info
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    flags = set(fields.get("flags", "").split())
    info["cpu"] = fields.get("model name", "unknown")
    info["cpu_cores"] = sum(1 for line in cpuinfo.splitlines() if line.startswith("processor"))
    info["cpu_features"] = [f for f in CPU_FEATURES if f in flags]
    return info


# --------------------------------------------------------------------------------------------- model steps


@functools.cache
def _step_fn(apply_fn):
    # Donate the cache and thread it through, as the loop does (no fresh cache buffer per call).
    return jax.jit(apply_fn, donate_argnums=3)


@functools.cache
def _prefill_fn(apply_fn, init_cache, cache_len):
    def f(params, tokens, positions):
        return apply_fn(params, tokens, positions, init_cache(tokens.shape[0], cache_len))

    return jax.jit(f)


class StepTimer:
    """Times one ``apply_fn`` call per case ``name -> (model, T)`` at batch 1 and cache length ``cache_len``,
    tokens at positions ``position .. position+T-1``; the cache is donated and threaded through.

    ``block(iters)`` runs ``iters`` calls of every case, cases interleaved call by call; call it between
    generation runs so background load hits steps and generations alike. ``medians()`` over all blocks."""

    def __init__(self, cases: dict[str, tuple[CausalLM, int]], cache_len: int, position: int, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.state = {name: _step_state(m, t, cache_len, position, rng) for name, (m, t) in cases.items()}
        self.times: dict[str, list[float]] = {name: [] for name in cases}

    def block(self, iters: int) -> None:
        """Time ``iters`` calls of every case, cases interleaved call by call, each blocked on until ready; the
        seconds are appended to ``times[name]`` and each call's returned cache is fed to the case's next call."""
        for _ in range(iters):
            for name, st in self.state.items():
                fn, params, tokens, positions, cache = st
                start = time.perf_counter()
                _, st[4] = jax.block_until_ready(fn(params, tokens, positions, cache))
                self.times[name].append(time.perf_counter() - start)

    def medians(self) -> dict[str, float]:
        """Median seconds of one call per case name, over every call timed so far (``statistics.StatisticsError``
        before the first ``block``)."""
        return {name: statistics.median(ts) for name, ts in self.times.items()}

    def count(self) -> int:
        """Calls timed so far per case: the fewest over the cases (each ``block(iters)`` adds ``iters`` to all)."""
        return min(len(v) for v in self.times.values())


def _step_state(model: CausalLM, t: int, cache_len: int, position: int, rng) -> list:
    tokens = jnp.asarray(rng.integers(0, model.vocab_size, (1, t)), jnp.int32)
    pos0 = max(0, min(position, cache_len - t))
    positions = jnp.arange(pos0, pos0 + t, dtype=jnp.int32)[None]
    fn = _step_fn(model.apply_fn)
    cache = model.init_cache(1, cache_len)
    for _ in range(3):  # compile + warm-up
        _, cache = jax.block_until_ready(fn(model.params, tokens, positions, cache))
    return [fn, model.params, tokens, positions, cache]


def verify_key(gamma: int) -> str:
    """The case name (and ``steps_s`` key) of the verify pass over γ+1 tokens: ``"target_{γ+1}"``."""
    return f"target_{gamma + 1}"


def round_timer(
    target: CausalLM,
    draft: CausalLM,
    gamma: int,
    cache_len: int,
    position: int,
    seed: int,
    head=None,
    head_gammas: tuple[int, ...] = (),
) -> StepTimer:
    """The steps of a round: one target step, the verify pass over γ+1 tokens, the draft's 1- and 2-token steps;
    with an EAGLE ``head`` (``jaxspec.eagle.EagleDrafter``) drafting G tokens for each G of ``head_gammas``
    (default (γ,)) also its 1-token step, its window pass over G + 1 pairs and the verify pass over G + 1."""
    cases = {
        "target_1": (target, 1),
        "draft_1": (draft, 1),
        "draft_2": (draft, 2),
        verify_key(gamma): (target, gamma + 1),
    }
    if head is not None:
        cases["head_1"] = (head.as_model(), 1)
        for g in head_gammas or (gamma,):
            cases[f"head_window_{g}"] = (head.as_model(), g + 1)
            cases[verify_key(g)] = (target, g + 1)
    return StepTimer(cases, cache_len, position, seed=seed)


def head_ratio(steps: dict[str, float], gamma: int) -> float:
    """An EAGLE head's c per draft token: its draft phase (the window pass over γ+1 pairs, then γ−1 one-token
    steps) ÷ γ ÷ one target step, so that τ/(γc+v) is its bound as for a draft model."""
    return (steps[f"head_window_{gamma}"] + (gamma - 1) * steps["head_1"]) / gamma / steps["target_1"]


def step_ratios(steps: dict[str, float], gamma: int) -> tuple[float, float]:
    """c = draft step ÷ target step, v = verify(γ+1 tokens) ÷ target step."""
    return steps["draft_1"] / steps["target_1"], steps[verify_key(gamma)] / steps["target_1"]


def draft_phase_s(steps: dict[str, float], gamma: int) -> float:
    """Model time of a round's draft phase: one 2-token step (catching up) and γ−1 1-token steps."""
    return steps["draft_2"] + (gamma - 1) * steps["draft_1"]


def model_round_s(steps: dict[str, float], gamma: int) -> float:
    """Model time of one speculative round: the draft phase plus the verify pass."""
    return draft_phase_s(steps, gamma) + steps[verify_key(gamma)]


def measure_prefill(model: CausalLM, prompt: jax.Array, cache_len: int, iters: int) -> float:
    """Median seconds of the prefill pass (prompt [B, T] into a fresh cache of ``cache_len``)."""
    fn = _prefill_fn(model.apply_fn, model.init_cache, cache_len)
    positions = jnp.broadcast_to(jnp.arange(prompt.shape[1], dtype=jnp.int32), prompt.shape)
    for _ in range(2):
        jax.block_until_ready(fn(model.params, prompt, positions))
    ts = []
    for _ in range(iters):
        start = time.perf_counter()
        jax.block_until_ready(fn(model.params, prompt, positions))
        ts.append(time.perf_counter() - start)
    return statistics.median(ts)


# --------------------------------------------------------------------------------------------- memory


def _nbytes(x) -> int:
    return int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize


def tree_bytes(tree) -> int:
    """Bytes of every leaf (arrays or ``jax.ShapeDtypeStruct``)."""
    return sum(_nbytes(x) for x in jax.tree.leaves(tree))


def unique_param_bytes(*models: CausalLM) -> int:
    """Weight bytes with arrays shared between models counted once."""
    unique = {id(x): x for m in models for x in jax.tree.leaves(m.params)}
    return sum(_nbytes(x) for x in unique.values())


def cache_bytes(model: CausalLM, batch: int, cache_len: int) -> int:
    """Bytes of ``model``'s KV cache for ``batch`` rows of ``cache_len`` positions, from the shapes alone
    (``jax.eval_shape``: nothing is allocated)."""
    return tree_bytes(jax.eval_shape(lambda: model.init_cache(batch, cache_len)))


def peak_rss_bytes() -> int | None:
    """Peak resident set size of this process so far, in bytes (``ru_maxrss``); None where the ``resource`` module
    is missing (not Unix)."""
    try:
        import resource  # Unix only
    except ImportError:
        return None
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if sys.platform == "darwin" else rss * 1024  # bytes on macOS, KiB on Linux


def device_peak_bytes() -> int | None:
    """Peak bytes in use on the first device (GPU/TPU); None where the backend has no memory stats (CPU)."""
    try:
        stats = jax.devices()[0].memory_stats()
    except Exception:  # noqa: BLE001 - some backends raise instead of returning None
        return None
    if not stats:
        return None
    return stats.get("peak_bytes_in_use", stats.get("bytes_in_use"))


def memory_report(target: CausalLM, draft: CausalLM, batch: int, cache_len: int) -> dict[str, Any]:
    """Memory of a pair, in bytes: ``target_weights`` and ``draft_weights`` (``CausalLM.param_bytes``),
    ``weights_unique`` (arrays the two share counted once), ``target_cache`` and ``draft_cache`` (``batch`` rows of
    ``cache_len``), ``peak_rss`` (``peak_rss_bytes``) and ``device_peak`` (``device_peak_bytes``); the last two are
    process-wide figures at the time of the call and may be None."""
    return {
        "target_weights": target.param_bytes,
        "draft_weights": draft.param_bytes,
        "weights_unique": unique_param_bytes(target, draft),
        "target_cache": cache_bytes(target, batch, cache_len),
        "draft_cache": cache_bytes(draft, batch, cache_len),
        "peak_rss": peak_rss_bytes(),
        "device_peak": device_peak_bytes(),
    }


def memory_analysis_dict(compiled) -> dict[str, int] | None:
    """XLA's ``memory_analysis()`` of a compiled executable, in bytes: ``argument``, ``output``, ``alias``, ``temp``
    and ``generated_code`` (0 where the backend leaves one out), plus ``peak_estimate`` = argument + output + temp −
    alias. None when the backend gives no analysis (returns None or raises)."""
    try:
        ma = compiled.memory_analysis()
    except Exception:  # noqa: BLE001
        return None
    if ma is None:
        return None
    fields = ("argument", "output", "alias", "temp", "generated_code")
    out = {f: int(getattr(ma, f"{f}_size_in_bytes", 0) or 0) for f in fields}
    out["peak_estimate"] = out["argument"] + out["output"] + out["temp"] - out["alias"]
    return out


# --------------------------------------------------------------------------------------------- compile


@dataclasses.dataclass
class CompileReport:
    """Compile cost of one ``generate`` program with cold caches (``measure_compile``). Times are in seconds.

    Attributes:
      lower_s: trace and lower to StableHLO.
      compile_s: the XLA compile of the lowered program.
      memory: ``memory_analysis_dict`` of the compiled executable (None where the backend gives none).
      first_call_s: the whole first, cold ``generate()`` call, host work included; NaN until set (the benchmark
        sets it after the explicit compile).
      first_call_compile_s: the compile time that first call reported (``stats.compile_time_s``); NaN until set.
    """

    lower_s: float  # trace + lower to StableHLO
    compile_s: float  # XLA compile
    memory: dict[str, int] | None
    first_call_s: float = float("nan")  # whole generate() call, cold
    first_call_compile_s: float = float("nan")  # compile time that first call reported in its stats

    @property
    def total_s(self) -> float:
        """``lower_s + compile_s``: seconds from tracing to a compiled executable (the first call not included)."""
        return self.lower_s + self.compile_s


def measure_compile(target: CausalLM, draft: CausalLM | None, prompt, gen_kwargs: dict) -> CompileReport:
    """Explicit ``generate_program.lower(...).compile()`` with the arguments ``prepare`` produces (cold caches)."""
    prep = prepare(target, prompt, draft=draft, **gen_kwargs)
    dparams = None if draft is None else draft.params
    jax.clear_caches()
    loop.clear_compiled()
    start = time.perf_counter()
    lowered = loop.generate_program.lower(prep.spec, target.params, dparams, prep.inputs)
    mid = time.perf_counter()
    compiled = lowered.compile()
    end = time.perf_counter()
    return CompileReport(lower_s=mid - start, compile_s=end - mid, memory=memory_analysis_dict(compiled))


# --------------------------------------------------------------------------------------------- generation


@dataclasses.dataclass
class GenRun:
    """One timed ``jaxspec.generate`` call (``run_generate``). Times are in seconds; counts are over all rows.

    Attributes:
      wall_s: ``stats.wall_time_s``: the compiled program's run, blocked on (prefill included, compile excluded).
      call_s: the whole ``generate()`` call, host work and any compilation included.
      compile_s: ``stats.compile_time_s``: compilation during the call (0 once the program was compiled).
      tokens: generated tokens (prompt excluded).
      rounds: target passes after prefill, summed over rows (τ = tokens ÷ rounds).
      passes: batched target passes the loop ran, the slowest row's rounds (time per round = wall ÷ passes);
        equal to ``rounds`` at batch 1.
      drafted, accepted: draft tokens proposed and accepted (0 for plain decoding).
    """

    wall_s: float  # stats.wall_time_s (the compiled program, blocked on)
    call_s: float  # the whole generate() call, host work included
    compile_s: float  # stats.compile_time_s
    tokens: int
    rounds: int  # target passes summed over rows (τ = tokens ÷ rounds)
    passes: int  # batched target passes the loop ran (time per round = wall ÷ passes); = rounds at batch 1
    drafted: int
    accepted: int

    @property
    def tokens_per_s(self) -> float:
        """``tokens ÷ wall_s``: generated tokens per second of device time (compile excluded, prefill included)."""
        return self.tokens / self.wall_s


def run_generate(target: CausalLM, draft: CausalLM | None, prompt, gen_kwargs: dict, seed: int) -> GenRun:
    """One timed ``jaxspec.generate(target, prompt, draft=draft, seed=seed, **gen_kwargs)`` call (``draft`` None:
    plain decoding) as a ``GenRun``."""
    start = time.perf_counter()
    res = jaxspec.generate(target, prompt, draft=draft, seed=seed, **gen_kwargs)
    call = time.perf_counter() - start
    s = res.stats
    return GenRun(
        s.wall_time_s, call, s.compile_time_s, s.generated_tokens, s.rounds, s.target_passes, s.drafted, s.accepted
    )


# --------------------------------------------------------------------------------------------- in-loop breakdown


def _null_apply(params, tokens, positions, cache):
    """A model that costs (almost) nothing: logits are a window of a fixed random vector, shifted by token and
    position (one gather, no transcendental functions), so different contexts give different distributions."""
    vocab = params["w2"].shape[0] // 2
    shift = (tokens * 7919 + positions) % vocab
    return params["w2"][shift[..., None] + jnp.arange(vocab)], cache


def _null_init_cache(batch_size: int, max_length: int):
    return jnp.zeros((batch_size, max_length), jnp.float32)


def null_model(vocab: int, seed: int = 0) -> CausalLM:
    """A ~zero-cost ``CausalLM`` named ``"null"`` over ``vocab`` tokens: ``_null_apply`` (one gather) reading a
    random vector 3·N(0, 1) of length ``vocab`` drawn from ``seed`` and stored twice as ``params["w2"]`` (shape
    [2·vocab]), and a [batch, max_length] float32 zeros cache that it returns untouched. In a seat, it costs ~0."""
    w = 3.0 * jax.random.normal(jax.random.key(seed), (vocab,), jnp.float32)
    return CausalLM(_null_apply, {"w2": jnp.concatenate([w, w])}, _null_init_cache, vocab, name="null")


@dataclasses.dataclass
class Breakdown:
    """Seconds per round inside the compiled loop, for real and null models swapped in as target and draft.

    Each figure is the slope of ``stats.wall_time_s`` over target passes between two ``max_new_tokens``
    (same compiled program, so launch and prefill cancel). With a null model (``null_model``: one gather, no
    cache) in a seat, that seat costs ~0, so:

      engine      = spec(null, null)                      sampling, rejection sampler, bookkeeping, while loop
      verify      = spec(real target, null draft) − engine  the target pass over γ+1 tokens, in the loop
      draft phase = spec(null target, real draft) − engine  one 2-token + (γ−1) 1-token draft steps, in the loop
      interaction = spec(real, real) − (engine + verify + draft phase)
      plain: engine = plain(null); target step = plain(real) − plain(null)
    """

    pair: str
    short_new: int
    long_new: int
    rounds_s: dict[str, dict[float, float]]  # combo -> temperature -> seconds per round
    steps_s: dict[str, float]  # standalone step medians, timed interleaved with the breakdown runs

    def get(self, combo: str, temp: float) -> float:
        """Seconds per round of combination ``combo`` (a ``breakdown_seats`` name) at temperature ``temp``;
        ``KeyError`` for one not measured."""
        return self.rounds_s[combo][temp]


def breakdown_seats(pair: Pair, null: CausalLM) -> dict[str, tuple[CausalLM, CausalLM | None]]:
    """The six ``(target, draft)`` seatings of ``Breakdown`` by name: ``"spec T/D"`` for T (target seat) and D
    (draft seat) each ``null`` (the model ``null``) or ``real`` (``pair.target``, ``pair.draft``), then
    ``"plain null"`` and ``"plain real"`` (draft None)."""
    t, d = pair.target, pair.draft
    return {
        "spec null/null": (null, null),
        "spec real/null": (t, null),
        "spec null/real": (null, d),
        "spec real/real": (t, d),
        "plain null": (null, None),
        "plain real": (t, None),
    }


def _round_slopes(seats, prompt, short_kw: dict, long_kw: dict, repeats: int, between) -> dict[str, float]:
    """Median seconds per round of every seat combination: the slope of wall time over target passes between
    ``short_kw`` and ``long_kw`` runs; combinations interleaved (so background load hits them alike), with
    ``between()`` after every sweep over them."""
    for t, d in seats.values():  # compile / warm up
        run_generate(t, d, prompt, short_kw, 0)
    slopes: dict[str, list[float]] = {name: [] for name in seats}
    for r in range(repeats):
        for name, (t, d) in seats.items():
            a = run_generate(t, d, prompt, short_kw, r)
            b = run_generate(t, d, prompt, long_kw, r)
            slopes[name].append((b.wall_s - a.wall_s) / max(1, b.passes - a.passes))
        between()
    return {name: statistics.median(s) for name, s in slopes.items()}


def measure_breakdown(pair: Pair, args, cache_len: int, repeats: int) -> Breakdown:
    """The in-loop ``Breakdown`` of ``pair``: seconds per round of every ``breakdown_seats`` combination at each
    of ``args.temperatures``, the median of ``repeats`` slopes (after one warm-up call per combination and temperature).

    A slope is taken between ``args.breakdown_tokens`` new tokens (at most ``cache_len − args.prompt_len``) and a
    fifth of that (at least 1), with ``max_length=cache_len``, ``args.gamma``, no EOS stop and the prompt of
    ``make_prompt``. A ``round_timer`` at position ``args.prompt_len`` + half the longer run times a block of
    ``max(1, args.step_iters // 2)`` calls after every sweep over the combinations; its medians are ``steps_s``.
    """
    seats = breakdown_seats(pair, null_model(pair.target.vocab_size, args.seed))
    prompt = make_prompt(pair.target.vocab_size, args)
    long_new = min(args.breakdown_tokens, cache_len - args.prompt_len)
    short_new = max(1, long_new // 5)
    position = args.prompt_len + long_new // 2
    timer = round_timer(pair.target, pair.draft, args.gamma, cache_len, position, args.seed)
    rounds: dict[str, dict[float, float]] = {name: {} for name in seats}
    for temp in args.temperatures:
        kw = dict(gamma=args.gamma, temperature=temp, eos_token_id=None, max_length=cache_len)
        slopes = _round_slopes(
            seats,
            prompt,
            dict(kw, max_new_tokens=short_new),
            dict(kw, max_new_tokens=long_new),
            repeats,
            lambda: timer.block(max(1, args.step_iters // 2)),
        )
        for name, s in slopes.items():
            rounds[name][temp] = s
    return Breakdown(pair.name, short_new, long_new, rounds, timer.medians())
