"""Benchmark: plain vs speculative decoding at batch 1, measured against the analytic speedup bounds.

    python -m jaxspec.bench                         # both pairs, greedy and temperature 1, γ=4
    python -m jaxspec.bench --pair aligned --gamma 4 --max-new-tokens 128 --repeats 3 --json out.json

For each (target, draft) pair it reports:

  * tokens/s of plain decoding (``draft=None``) and of speculative decoding, via ``jaxspec.generate`` after a
    warm-up call (compile excluded); speedup = spec tokens/s ÷ plain tokens/s (median over interleaved runs);
  * α (acceptance rate) and τ (tokens per target pass) from ``result.stats``;
  * c = draft step time ÷ target step time and v = target verify time over γ+1 tokens ÷ target step time, each
    timed as a jitted ``apply_fn(params, tokens[1, T], positions[1, T], cache)`` (cache donated and threaded, as
    inside the loop) at the cache length the generation uses; medians of many interleaved calls;
  * bound A (the issue's):      (1 − α^(γ+1)) / ((1 − α)(γc + 1))
    bound B (CPU-aware):        (1 − α^(γ+1)) / ((1 − α)(γc + v))
    (the numerator is written Σ_{i=0..γ} α^i, so α = 0 and α = 1 need no special case), and
    efficiency = measured speedup ÷ bound, for both bounds. A third reference, "ideal@τ", replaces the
    α-formula by the measured τ and the round by its measured model time (one 2-token + (γ−1) 1-token draft
    steps + one verify pass): its efficiency isolates per-round engine overhead;
  * where the time goes: measured round time (wall minus prefill, ÷ rounds) against the model time of a round;
    the difference is the per-round engine overhead (sampling, rejection sampler, bookkeeping, loop);
  * compile time of ``jaxspec.loop.generate_program`` (explicit ``.lower()`` + ``.compile()``, and first call
    minus a steady-state call);
  * memory: weight bytes, KV-cache bytes (``jax.eval_shape`` of ``init_cache``), the compiled program's
    ``memory_analysis()``, process peak RSS and, on GPU/TPU, the device's peak ``memory_stats()``.

The pairs (random weights; the efficiency measures engine overhead whatever α is):

  * ``random``: a target and a draft with independent random weights. Greedy α ≈ 0 (the bound is then < 1);
    at temperature 1 both models are near-uniform over the vocabulary, so α is high.
  * ``aligned``: built so that the draft agrees with the target most of the time, honestly: the target's
    residual-branch outputs (every layer's ``o_proj`` and ``down_proj``) are multiplied by
    ``--residual-scale``, so its logits are dominated by the context-free path
    embed → final_norm → lm_head; the draft (one cheap layer, its residual outputs scaled the same way) uses
    the target's own ``embed``, ``final_norm`` and ``lm_head`` arrays. The layers still perturb the logits
    in a context-dependent way, so the draft is right often but not always (greedy α is high, not 1).

Both pairs use the same two architectures, so c and v are the same for both; only α differs.
Everything here runs unchanged on any backend (CPU, GPU, TPU).

The module is organised so that other modes (``--mesh``, ``--sweep``) can reuse ``build_pairs``,
``bench_pair`` and the ``measure_*`` helpers: ``main`` parses flags and dispatches on the mode.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import resource
import statistics
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import jaxspec
from jaxspec import loop
from jaxspec.generate import prepare
from jaxspec.model import CausalLM
from jaxspec.models import llama

MIB = 1024 * 1024


# --------------------------------------------------------------------------------------------- pairs


@dataclasses.dataclass(frozen=True)
class Pair:
    name: str
    target: CausalLM
    draft: CausalLM
    description: str


def target_config(args) -> llama.LlamaConfig:
    return llama.LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=4 * args.hidden,
        num_layers=args.target_layers,
        num_heads=args.hidden // 64,
        num_kv_heads=max(1, args.hidden // 128),
    )


def draft_config(args) -> llama.LlamaConfig:
    # Same hidden size as the target (so the aligned draft can use the target's embed/lm_head), but a narrow
    # attention (4 query heads, 1 KV head of 64) and MLP: its step is dominated by the [hidden, vocab] lm_head.
    return llama.LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.hidden,
        num_layers=args.draft_layers,
        num_heads=4,
        num_kv_heads=1,
        head_dim=64,
    )


def _scale_residual(params, scale: float):
    """Multiply every layer's residual-branch output projections (attn o_proj, mlp down_proj) by ``scale``."""
    layers = params["layers"]
    attn = dict(layers["attn"], o_proj={"kernel": layers["attn"]["o_proj"]["kernel"] * scale})
    mlp = dict(layers["mlp"], down_proj={"kernel": layers["mlp"]["down_proj"]["kernel"] * scale})
    return dict(params, layers=dict(layers, attn=attn, mlp=mlp))


def build_pair(kind: str, args) -> Pair:
    tcfg, dcfg = target_config(args), draft_config(args)
    if kind == "random":
        target = llama.init(tcfg, seed=args.seed, name="target")
        draft = llama.init(dcfg, seed=args.seed + 1, name="draft")
        desc = "independent random weights (greedy α ≈ 0 expected)"
    elif kind == "aligned":
        s = args.residual_scale
        tparams = _scale_residual(llama.init_params(tcfg, args.seed), s)
        dparams = _scale_residual(llama.init_params(dcfg, args.seed + 1), s)
        # the draft reads and writes through the target's own embedding, final norm and LM head (same arrays)
        dparams = dict(dparams, embed=tparams["embed"], final_norm=tparams["final_norm"], lm_head=tparams["lm_head"])
        target = llama.from_params(tcfg, tparams, name="target")
        draft = llama.from_params(dcfg, dparams, name="draft")
        desc = f"o_proj/down_proj x{s:g} in both; draft shares the target's embed, final_norm, lm_head"
    else:
        raise ValueError(kind)
    return Pair(kind, target, draft, desc)


def build_pairs(args) -> list[Pair]:
    kinds = ["aligned", "random"] if args.pair == "both" else [args.pair]
    return [build_pair(k, args) for k in kinds]


# --------------------------------------------------------------------------------------------- bounds


def expected_tokens(alpha: float, gamma: int) -> float:
    """(1 − α^(γ+1)) / (1 − α) written as Σ_{i=0..γ} α^i: exact at α = 0 (1) and α = 1 (γ + 1)."""
    return float(sum(alpha**i for i in range(gamma + 1)))


def bound_issue(alpha: float, gamma: int, c: float) -> float:
    """Bound A: (1 − α^(γ+1)) / ((1 − α)(γc + 1))."""
    return expected_tokens(alpha, gamma) / (gamma * c + 1.0)


def bound_cpu(alpha: float, gamma: int, c: float, v: float) -> float:
    """Bound B: (1 − α^(γ+1)) / ((1 − α)(γc + v)), v = verify(γ+1 tokens) ÷ one target step."""
    return expected_tokens(alpha, gamma) / (gamma * c + v)


# --------------------------------------------------------------------------------------------- timing


def _sync(x):
    return jax.block_until_ready(x)


@functools.lru_cache(maxsize=None)
def _step_fn(apply_fn):
    # Donate the cache and thread it through, as the loop does (no fresh cache buffer per call).
    return jax.jit(apply_fn, donate_argnums=3)


@functools.lru_cache(maxsize=None)
def _prefill_fn(apply_fn, init_cache, cache_len):
    def f(params, tokens, positions):
        return apply_fn(params, tokens, positions, init_cache(tokens.shape[0], cache_len))

    return jax.jit(f)


def measure_steps(cases: dict[str, tuple[CausalLM, int]], cache_len: int, position: int, iters: int, blocks: int,
                  seed: int = 0) -> dict[str, float]:
    """Median seconds of one ``apply_fn`` call per case ``name -> (model, T)`` at batch 1, cache length
    ``cache_len``, tokens at positions ``position .. position+T-1``. Cases are interleaved in ``blocks``
    blocks of ``iters`` calls each, so background load hits all of them alike."""
    rng = np.random.default_rng(seed)
    state = {}
    for name, (model, t) in cases.items():
        tokens = jnp.asarray(rng.integers(0, model.vocab_size, (1, t)), jnp.int32)
        pos0 = min(position, cache_len - t)
        positions = jnp.arange(pos0, pos0 + t, dtype=jnp.int32)[None]
        fn = _step_fn(model.apply_fn)
        cache = model.init_cache(1, cache_len)
        for _ in range(3):  # compile + warm-up
            logits, cache = _sync(fn(model.params, tokens, positions, cache))
        state[name] = [fn, model.params, tokens, positions, cache]
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(blocks):
        for name, st in state.items():
            fn, params, tokens, positions, cache = st
            for _ in range(iters):
                start = time.perf_counter()
                logits, cache = _sync(fn(params, tokens, positions, cache))
                times[name].append(time.perf_counter() - start)
            st[4] = cache
    return {name: statistics.median(ts) for name, ts in times.items()}


def measure_prefill(model: CausalLM, prompt: jax.Array, cache_len: int, iters: int) -> float:
    """Median seconds of the prefill pass (prompt [B, T] into a fresh cache of ``cache_len``)."""
    fn = _prefill_fn(model.apply_fn, model.init_cache, cache_len)
    positions = jnp.broadcast_to(jnp.arange(prompt.shape[1], dtype=jnp.int32), prompt.shape)
    for _ in range(2):
        _sync(fn(model.params, prompt, positions))
    ts = []
    for _ in range(iters):
        start = time.perf_counter()
        _sync(fn(model.params, prompt, positions))
        ts.append(time.perf_counter() - start)
    return statistics.median(ts)


# --------------------------------------------------------------------------------------------- memory


def tree_bytes(tree) -> int:
    return sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree))


def unique_param_bytes(*models: CausalLM | None) -> int:
    """Weight bytes with arrays shared between models counted once."""
    seen, total = set(), 0
    for m in models:
        if m is None:
            continue
        for x in jax.tree.leaves(m.params):
            if id(x) not in seen:
                seen.add(id(x))
                total += int(x.size) * x.dtype.itemsize
    return total


def cache_bytes(model: CausalLM, batch: int, cache_len: int) -> int:
    return tree_bytes(jax.eval_shape(lambda: model.init_cache(batch, cache_len)))


def peak_rss_bytes() -> int:
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


def memory_analysis_dict(compiled) -> dict[str, int] | None:
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
    lower_s: float  # trace + lower to StableHLO
    compile_s: float  # XLA compile
    memory: dict[str, int] | None
    first_call_s: float = float("nan")  # whole generate() call, cold
    steady_call_s: float = float("nan")  # whole generate() call, warm (median)

    @property
    def total_s(self) -> float:
        return self.lower_s + self.compile_s

    @property
    def first_minus_steady_s(self) -> float:
        return self.first_call_s - self.steady_call_s


def measure_compile(target: CausalLM, draft: CausalLM | None, prompt, gen_kwargs: dict) -> CompileReport:
    """Explicit ``generate_program.lower(...).compile()`` with the arguments ``prepare`` produces (cold caches)."""
    prep = prepare(target, prompt, draft=draft, **gen_kwargs)
    dparams = None if draft is None else draft.params
    jax.clear_caches()
    start = time.perf_counter()
    lowered = loop.generate_program.lower(prep.spec, target.params, dparams, prep.inputs)
    mid = time.perf_counter()
    compiled = lowered.compile()
    end = time.perf_counter()
    return CompileReport(lower_s=mid - start, compile_s=end - mid, memory=memory_analysis_dict(compiled))


# --------------------------------------------------------------------------------------------- generation


@dataclasses.dataclass
class GenRun:
    wall_s: float  # stats.wall_time_s (the compiled program, blocked on)
    call_s: float  # the whole generate() call, host work included
    tokens: int
    rounds: int
    drafted: int
    accepted: int

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s


def _gen(target, draft, prompt, gen_kwargs, seed) -> GenRun:
    start = time.perf_counter()
    res = jaxspec.generate(target, prompt, draft=draft, seed=seed, **gen_kwargs)
    call = time.perf_counter() - start
    s = res.stats
    return GenRun(s.wall_time_s, call, s.generated_tokens, s.rounds, s.drafted, s.accepted)


@dataclasses.dataclass
class TempReport:
    temperature: float
    plain: list[GenRun]
    spec: list[GenRun]
    alpha: float
    tau: float
    plain_tps: float
    spec_tps: float
    speedup: float
    plain_round_s: float
    spec_round_s: float
    bound_issue: float
    bound_cpu: float
    ideal_tau: float
    model_round_s: float

    @property
    def eff_issue(self) -> float:
        return self.speedup / self.bound_issue

    @property
    def eff_cpu(self) -> float:
        return self.speedup / self.bound_cpu

    @property
    def eff_tau(self) -> float:
        return self.speedup / self.ideal_tau


@dataclasses.dataclass
class PairReport:
    name: str
    description: str
    target_params: int
    draft_params: int
    cache_len: int
    prompt_pad: int
    steps_s: dict[str, float]
    prefill_s: dict[str, float]
    c: float
    v: float
    compile_spec: CompileReport
    compile_plain: CompileReport
    memory: dict[str, Any]
    temps: list[TempReport]


def bench_pair(pair: Pair, args) -> PairReport:
    target, draft, gamma = pair.target, pair.draft, args.gamma
    rng = np.random.default_rng(args.seed)
    prompt = rng.integers(0, target.vocab_size, (1, args.prompt_len)).astype(np.int32)
    base = dict(gamma=gamma, max_new_tokens=args.max_new_tokens, eos_token_id=None)

    # 1. compile, cold: explicit lower + compile of both programs (also gives memory_analysis)
    comp_spec = measure_compile(target, draft, prompt, dict(base, temperature=0.0))
    comp_plain = measure_compile(target, None, prompt, dict(base, temperature=0.0))
    prep = prepare(target, prompt, draft=draft, **dict(base, temperature=0.0))
    cache_len, batch = prep.spec.cache_len, int(prep.inputs.prompt.shape[0])

    # 2. first (cold) generate() calls: these are also the warm-up calls; temperature is traced, so the later
    #    temperature-1 calls reuse the same executables
    jax.clear_caches()
    comp_plain.first_call_s = _gen(target, None, prompt, dict(base, temperature=0.0), 0).call_s
    comp_spec.first_call_s = _gen(target, draft, prompt, dict(base, temperature=0.0), 0).call_s

    # 3. one decode step of each model at the generation's cache length, verify over γ+1, prefill passes
    position = args.prompt_len + args.max_new_tokens // 2
    steps = measure_steps(
        {"target_1": (target, 1), "draft_1": (draft, 1), "draft_2": (draft, 2), f"target_{gamma + 1}": (target, gamma + 1)},
        cache_len, position, iters=args.step_iters, blocks=args.step_blocks, seed=args.seed,
    )
    c = steps["draft_1"] / steps["target_1"]
    v = steps[f"target_{gamma + 1}"] / steps["target_1"]
    padded_prompt = prep.inputs.prompt
    prefill = {
        "target": measure_prefill(target, padded_prompt, cache_len, iters=5),
        "draft": measure_prefill(draft, padded_prompt, cache_len, iters=5),
    }
    model_round = steps["draft_2"] + (gamma - 1) * steps["draft_1"] + steps[f"target_{gamma + 1}"]

    # 4. generation: plain and speculative runs interleaved (same seeds), per temperature
    temps = []
    for temp in args.temperatures:
        kw = dict(base, temperature=temp)
        plain, spec = [], []
        for r in range(args.repeats):
            plain.append(_gen(target, None, prompt, kw, r))
            spec.append(_gen(target, draft, prompt, kw, r))
        drafted = sum(x.drafted for x in spec)
        alpha = sum(x.accepted for x in spec) / drafted if drafted else float("nan")
        tau = sum(x.tokens for x in spec) / sum(x.rounds for x in spec)
        speedup = statistics.median(s.tokens_per_s / p.tokens_per_s for p, s in zip(plain, spec))
        plain_round = statistics.median((x.wall_s - prefill["target"]) / x.rounds for x in plain)
        spec_round = statistics.median((x.wall_s - prefill["target"] - prefill["draft"]) / x.rounds for x in spec)
        temps.append(
            TempReport(
                temperature=temp, plain=plain, spec=spec, alpha=alpha, tau=tau,
                plain_tps=statistics.median(x.tokens_per_s for x in plain),
                spec_tps=statistics.median(x.tokens_per_s for x in spec),
                speedup=speedup, plain_round_s=plain_round, spec_round_s=spec_round,
                bound_issue=bound_issue(alpha, gamma, c), bound_cpu=bound_cpu(alpha, gamma, c, v),
                ideal_tau=tau * steps["target_1"] / model_round, model_round_s=model_round,
            )
        )
    # steady-state whole-call time at temperature 0, for "first call minus steady call"
    t0 = next((t for t in temps if t.temperature == 0.0), temps[0])
    comp_plain.steady_call_s = statistics.median(x.call_s for x in t0.plain)
    comp_spec.steady_call_s = statistics.median(x.call_s for x in t0.spec)

    memory = {
        "target_weights": target.param_bytes,
        "draft_weights": draft.param_bytes,
        "weights_unique": unique_param_bytes(target, draft),
        "target_cache": cache_bytes(target, batch, cache_len),
        "draft_cache": cache_bytes(draft, batch, cache_len),
        "peak_rss": peak_rss_bytes(),
        "device_peak": device_peak_bytes(),
    }
    return PairReport(
        name=pair.name, description=pair.description, target_params=target.num_params,
        draft_params=draft.num_params, cache_len=cache_len, prompt_pad=int(padded_prompt.shape[1]),
        steps_s=steps, prefill_s=prefill, c=c, v=v, compile_spec=comp_spec, compile_plain=comp_plain,
        memory=memory, temps=temps,
    )


# --------------------------------------------------------------------------------------------- report


def _mib(n) -> str:
    return "n/a" if n is None else f"{n / MIB:8.1f} MiB"


def _ms(s: float) -> str:
    return f"{s * 1e3:.2f} ms"


def format_pair(rep: PairReport, args) -> str:
    g = args.gamma
    st = rep.steps_s
    lines = [
        "=" * 96,
        f"pair: {rep.name}  ({rep.description})",
        f"  target {rep.target_params / 1e6:.1f} M params, draft {rep.draft_params / 1e6:.1f} M params "
        f"(draft counts its shared arrays); batch 1, prompt {args.prompt_len} (padded {rep.prompt_pad}), "
        f"max_new_tokens {args.max_new_tokens}, cache_length {rep.cache_len}, γ={g}",
        f"  step times (median of {args.step_iters * args.step_blocks}, jitted apply_fn, cache length {rep.cache_len}):",
        f"    target 1 tok {_ms(st['target_1'])} | target verify {g + 1} tok {_ms(st[f'target_{g + 1}'])} | "
        f"draft 1 tok {_ms(st['draft_1'])} | draft 2 tok {_ms(st['draft_2'])}",
        f"    c = draft/target step = {rep.c:.4f}   v = verify({g + 1})/target step = {rep.v:.3f}   "
        f"prefill: target {_ms(rep.prefill_s['target'])}, draft {_ms(rep.prefill_s['draft'])}",
        f"  model time of one spec round = draft(2 tok) + {g - 1}·draft(1 tok) + verify({g + 1}) = "
        f"{_ms(rep.temps[0].model_round_s)}",
    ]
    for t in rep.temps:
        name = "greedy (T=0)" if t.temperature == 0 else f"T={t.temperature:g}"
        plain_over = t.plain_round_s - st["target_1"]
        spec_over = t.spec_round_s - t.model_round_s
        rows = [
            ("tokens/s (median)", f"{t.plain_tps:10.1f}", f"{t.spec_tps:10.1f}"),
            ("generated tokens / run", f"{t.plain[0].tokens:10d}", f"{t.spec[0].tokens:10d}"),
            ("target passes / run (median)", f"{statistics.median(x.rounds for x in t.plain):10g}",
             f"{statistics.median(x.rounds for x in t.spec):10g}"),
            ("α acceptance rate", f"{'-':>10}", f"{t.alpha:10.3f}"),
            ("τ tokens per target pass", f"{1.0:10.2f}", f"{t.tau:10.2f}"),
            ("round time, measured (ms)", f"{t.plain_round_s * 1e3:10.2f}", f"{t.spec_round_s * 1e3:10.2f}"),
            ("round time, models only (ms)", f"{st['target_1'] * 1e3:10.2f}", f"{t.model_round_s * 1e3:10.2f}"),
            ("engine overhead / round (ms)", f"{plain_over * 1e3:10.2f}", f"{spec_over * 1e3:10.2f}"),
        ]
        lines.append("-" * 96)
        lines.append(f"  {name}   ({args.repeats} interleaved runs each)")
        lines.append(f"    {'':34s}{'plain':>10}{'spec':>10}")
        lines += [f"    {a:34s}{b}{c}" for a, b, c in rows]
        lines.append(f"    {'speedup (spec tok/s ÷ plain tok/s)':34s}{'':10s}{t.speedup:10.3f}")
        lines.append(f"    {'bound A, issue  Σα^i/(γc+1)':34s}{'':10s}{t.bound_issue:10.3f}   "
                     f"efficiency A = {t.eff_issue:.3f}")
        lines.append(f"    {'bound B, CPU    Σα^i/(γc+v)':34s}{'':10s}{t.bound_cpu:10.3f}   "
                     f"efficiency B = {t.eff_cpu:.3f}")
        lines.append(f"    {'ideal@τ  τ·t_target/t_round_models':34s}{'':10s}{t.ideal_tau:10.3f}   "
                     f"efficiency τ = {t.eff_tau:.3f}")
    lines.append("-" * 96)
    lines.append("  compile (generate_program, cold caches)       spec            plain")
    cs, cp = rep.compile_spec, rep.compile_plain
    lines.append(f"    trace+lower / XLA compile / total   {cs.lower_s:6.2f}+{cs.compile_s:6.2f}={cs.total_s:6.2f} s"
                 f"   {cp.lower_s:6.2f}+{cp.compile_s:6.2f}={cp.total_s:6.2f} s")
    lines.append(f"    first generate() − steady generate()  {cs.first_call_s:6.2f}−{cs.steady_call_s:5.2f}={cs.first_minus_steady_s:6.2f} s"
                 f"   {cp.first_call_s:6.2f}−{cp.steady_call_s:5.2f}={cp.first_minus_steady_s:6.2f} s")
    mem = rep.memory
    lines.append("  memory")
    lines.append(f"    weights: target {_mib(mem['target_weights'])}, draft {_mib(mem['draft_weights'])}, "
                 f"unique {_mib(mem['weights_unique'])}")
    lines.append(f"    KV caches (B=1, L={rep.cache_len}): target {_mib(mem['target_cache'])}, draft {_mib(mem['draft_cache'])}")
    wc = mem["weights_unique"] + mem["target_cache"] + mem["draft_cache"]
    for label, comp, caches in (("spec ", cs, mem["target_cache"] + mem["draft_cache"]),
                                ("plain", cp, mem["target_cache"])):
        ma = comp.memory
        if ma is None:
            lines.append(f"    {label} program memory_analysis(): n/a")
            continue
        lines.append(
            f"    {label} program memory_analysis(): args {_mib(ma['argument'])}, out {_mib(ma['output'])}, "
            f"temp {_mib(ma['temp'])} (caches {_mib(caches).strip()}), alias {_mib(ma['alias']).strip()}, "
            f"code {_mib(ma['generated_code']).strip()}"
        )
    lines.append(f"    spec program peak estimate (args+out+temp−alias) {_mib(cs.memory['peak_estimate']) if cs.memory else 'n/a'}"
                 f" vs weights+caches {_mib(wc)}")
    dev = mem["device_peak"]
    lines.append(f"    process peak RSS so far {_mib(mem['peak_rss'])}; device peak "
                 f"{'n/a (backend has no memory_stats)' if dev is None else _mib(dev)}")
    return "\n".join(lines)


def format_summary(reports: list[PairReport], args) -> str:
    lines = ["=" * 96, "summary (targets: efficiency ≥ 0.9 at γ=4 for c ≤ 0.1; compile ≤ 15 s)"]
    for rep in reports:
        for t in rep.temps:
            lines.append(
                f"  {rep.name:8s} T={t.temperature:<3g} c={rep.c:.3f} v={rep.v:.2f} α={t.alpha:.3f} τ={t.tau:.2f} "
                f"speedup={t.speedup:.2f}  eff A={t.eff_issue:.2f}{' ok' if t.eff_issue >= 0.9 else ' LOW'}  "
                f"eff B={t.eff_cpu:.2f}{' ok' if t.eff_cpu >= 0.9 else ' LOW'}  eff τ={t.eff_tau:.2f}"
            )
        lines.append(f"  {rep.name:8s} compile spec {rep.compile_spec.total_s:.1f} s "
                     f"({'ok' if rep.compile_spec.total_s <= 15 else 'OVER'}), plain {rep.compile_plain.total_s:.1f} s")
    lines.append("note: 'bound A' is the issue's (1−α^(γ+1))/((1−α)(γc+1)), which assumes verifying γ+1 tokens costs one "
                 "target step; 'bound B' replaces the 1 by the measured v (CPU-aware). Efficiency = speedup ÷ bound.")
    return "\n".join(lines)


def to_json(reports: list[PairReport], args) -> dict:
    def conv(x):
        if dataclasses.is_dataclass(x):
            d = {f.name: conv(getattr(x, f.name)) for f in dataclasses.fields(x)}
            for prop in ("eff_issue", "eff_cpu", "eff_tau", "tokens_per_s", "total_s", "first_minus_steady_s"):
                if hasattr(type(x), prop):
                    d[prop] = getattr(x, prop)
            return d
        if isinstance(x, dict):
            return {k: conv(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [conv(v) for v in x]
        return x

    return {"args": vars(args), "backend": jax.default_backend(), "device": str(jax.devices()[0]),
            "pairs": [conv(r) for r in reports]}


# --------------------------------------------------------------------------------------------- main


def run_single(args) -> list[PairReport]:
    """Default mode: one γ, every requested pair, every requested temperature."""
    reports = []
    for pair in build_pairs(args):
        rep = bench_pair(pair, args)
        print(format_pair(rep, args), flush=True)
        reports.append(rep)
    print(format_summary(reports, args), flush=True)
    return reports


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m jaxspec.bench", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pair", choices=["aligned", "random", "both"], default="both")
    p.add_argument("--gamma", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3, help="generate() runs per mode and temperature (interleaved)")
    p.add_argument("--temperatures", type=lambda s: [float(x) for x in s.split(",")], default=[0.0, 1.0],
                   help="comma-separated, default 0,1")
    p.add_argument("--step-iters", type=int, default=20, help="calls per block when timing one model step")
    p.add_argument("--step-blocks", type=int, default=5, help="interleaved blocks when timing model steps")
    p.add_argument("--seed", type=int, default=0)
    g = p.add_argument_group("models (float32 Llama, random weights)")
    g.add_argument("--vocab", type=int, default=8192)
    g.add_argument("--hidden", type=int, default=512, help="shared by target and draft")
    g.add_argument("--target-layers", type=int, default=16)
    g.add_argument("--draft-layers", type=int, default=1)
    g.add_argument("--residual-scale", type=float, default=0.05,
                   help="aligned pair: factor on every o_proj/down_proj (smaller = higher α)")
    p.add_argument("--json", metavar="PATH", help="also write every figure as JSON")
    args = p.parse_args(argv)
    if args.gamma < 1:
        p.error("--gamma must be >= 1")
    return args


def main(argv=None):
    args = parse_args(argv)
    print(f"jaxspec.bench: backend {jax.default_backend()}, device {jax.devices()[0]}, jax {jax.__version__}, "
          f"persistent compilation cache {jax.config.jax_compilation_cache_dir or 'off'}", flush=True)
    reports = run_single(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(to_json(reports, args), f, indent=1, default=str)
    return reports


if __name__ == "__main__":
    main()
