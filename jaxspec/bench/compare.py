"""One (target, draft) pair, plain vs speculative: compile, step and prefill timings, interleaved ``generate``
runs at every temperature, and the figures derived from them (α, τ, speedup, bounds, round times, memory)."""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any

import jax

from jaxspec import loop
from jaxspec.bench.bounds import bound_cpu, bound_issue
from jaxspec.bench.measure import (
    CompileReport,
    GenRun,
    StepTimer,
    measure_compile,
    measure_prefill,
    memory_report,
    model_round_s,
    round_timer,
    run_generate,
    step_ratios,
)
from jaxspec.bench.pairs import Pair, make_prompt
from jaxspec.generate import prepare


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
    def decode_speedup(self) -> float:
        """Speedup with the prefill passes left out: τ · plain round time ÷ spec round time."""
        return self.tau * self.plain_round_s / self.spec_round_s

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
    step_samples: int
    prefill_s: dict[str, float]
    c: float
    v: float
    compile_spec: CompileReport
    compile_plain: CompileReport
    memory: dict[str, Any]
    temps: list[TempReport]


def temp_report(
    temp: float, plain: list[GenRun], spec: list[GenRun], steps: dict[str, float], prefill: dict[str, float], gamma: int
) -> TempReport:
    c, v = step_ratios(steps, gamma)
    model_round = model_round_s(steps, gamma)
    drafted = sum(x.drafted for x in spec)
    alpha = sum(x.accepted for x in spec) / drafted if drafted else float("nan")
    tau = sum(x.tokens for x in spec) / sum(x.rounds for x in spec)
    return TempReport(
        temperature=temp,
        plain=plain,
        spec=spec,
        alpha=alpha,
        tau=tau,
        plain_tps=statistics.median(x.tokens_per_s for x in plain),
        spec_tps=statistics.median(x.tokens_per_s for x in spec),
        speedup=statistics.median(s.tokens_per_s / p.tokens_per_s for p, s in zip(plain, spec)),
        plain_round_s=statistics.median((x.wall_s - prefill["target"]) / x.passes for x in plain),
        spec_round_s=statistics.median((x.wall_s - prefill["target"] - prefill["draft"]) / x.passes for x in spec),
        bound_issue=bound_issue(alpha, gamma, c),
        bound_cpu=bound_cpu(alpha, gamma, c, v),
        ideal_tau=tau * steps["target_1"] / model_round,
        model_round_s=model_round,
    )


def _interleaved_runs(pair: Pair, prompt, base: dict, args, timer: StepTimer) -> dict[float, tuple[list, list]]:
    """Plain and speculative runs interleaved (same seeds), a step-timing block after every plain+spec pair."""
    runs = {}
    for temp in args.temperatures:
        kw = dict(base, temperature=temp)
        plain, spec = [], []
        for r in range(args.repeats):
            plain.append(run_generate(pair.target, None, prompt, kw, r))
            spec.append(run_generate(pair.target, pair.draft, prompt, kw, r))
            timer.block(args.step_iters)
        runs[temp] = (plain, spec)
    return runs


def _compile_reports(pair: Pair, prompt, base: dict, first_temp: float) -> tuple[CompileReport, CompileReport]:
    """(spec, plain): explicit lower + compile of both programs, cold (also gives memory_analysis), then the
    first (cold) generate() calls, which are also the warm-up calls; temperature is traced, so later calls at
    other temperatures reuse the same executables."""
    target, draft = pair.target, pair.draft
    comp_spec = measure_compile(target, draft, prompt, dict(base, temperature=0.0))
    comp_plain = measure_compile(target, None, prompt, dict(base, temperature=0.0))
    jax.clear_caches()
    loop.clear_compiled()
    first = dict(base, temperature=first_temp)
    for comp, d in ((comp_plain, None), (comp_spec, draft)):
        run = run_generate(target, d, prompt, first, 0)
        comp.first_call_s, comp.first_call_compile_s = run.call_s, run.compile_s
    return comp_spec, comp_plain


def bench_pair(pair: Pair, args) -> PairReport:
    target, draft, gamma = pair.target, pair.draft, args.gamma
    prompt = make_prompt(target.vocab_size, args)
    base = dict(gamma=gamma, max_new_tokens=args.max_new_tokens, eos_token_id=None)
    comp_spec, comp_plain = _compile_reports(pair, prompt, base, args.temperatures[0])
    prep = prepare(target, prompt, draft=draft, **dict(base, temperature=0.0))
    cache_len, padded = prep.spec.cache_len, prep.inputs.prompt

    # one decode step of each model at the generation's cache length, verify over γ+1 (and the draft's 2-token
    # first step); timed in blocks interleaved with the generation runs
    timer = round_timer(target, draft, gamma, cache_len, args.prompt_len + args.max_new_tokens // 2, args.seed)
    timer.block(args.step_iters)
    prefill = {
        "target": measure_prefill(target, padded, cache_len, iters=5),
        "draft": measure_prefill(draft, padded, cache_len, iters=5),
    }
    runs = _interleaved_runs(pair, prompt, base, args, timer)
    steps = timer.medians()
    temps = [temp_report(temp, plain, spec, steps, prefill, gamma) for temp, (plain, spec) in runs.items()]
    c, v = step_ratios(steps, gamma)
    return PairReport(
        name=pair.name,
        description=pair.description,
        target_params=target.num_params,
        draft_params=draft.num_params,
        cache_len=cache_len,
        prompt_pad=int(padded.shape[1]),
        steps_s=steps,
        step_samples=timer.count(),
        prefill_s=prefill,
        c=c,
        v=v,
        compile_spec=comp_spec,
        compile_plain=comp_plain,
        memory=memory_report(target, draft, int(padded.shape[0]), cache_len),
        temps=temps,
    )
