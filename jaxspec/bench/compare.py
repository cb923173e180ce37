"""One (target, draft) pair, plain vs speculative: compile, step and prefill timings, interleaved ``generate``
runs at every temperature, and the figures derived from them (α, τ, speedup, bounds, round times, memory)."""

from __future__ import annotations

import dataclasses
import math
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
from jaxspec.generation.generate import prepare


@dataclasses.dataclass
class TempReport:
    """The figures of one temperature: its plain and speculative ``generate`` runs and what is derived from them.

    Times are in seconds. A run's ``wall_s`` is device time with compilation left out and the prefill included;
    step and prefill times are the pair's standalone medians (``PairReport.steps_s``, ``PairReport.prefill_s``).

    Attributes:
      temperature: the sampling temperature of every run.
      plain, spec: the plain (no draft) and speculative runs, one per repeat with seeds 0, 1, …; ``plain[i]`` and
        ``spec[i]`` share a seed and ran back to back.
      alpha: α, accepted ÷ drafted tokens summed over ``spec`` (NaN when nothing was drafted).
      tau: τ, generated tokens ÷ target passes after prefill, both summed over ``spec``.
      plain_tps, spec_tps: median tokens/s (``GenRun.tokens_per_s``) of ``plain`` and of ``spec``.
      speedup: median over the seed-paired runs of spec tokens/s ÷ plain tokens/s (prefill included).
      plain_round_s: median over ``plain`` of (wall − the target's prefill) ÷ target passes: seconds per decode step.
      spec_round_s: median over ``spec`` of (wall − the target's and the draft's prefill) ÷ target passes: seconds
        per speculative round.
      bound_issue: bound A, ``bounds.bound_issue(alpha, γ, c)``.
      bound_cpu: bound B, ``bounds.bound_cpu(alpha, γ, c, v)``.
      ideal_tau: τ · target step ÷ ``model_round_s``: the speed-up at this τ if a round cost only its model steps
        and a plain token one target step (no prefill, no loop overhead).
      model_round_s: model time of one round from the standalone steps (``measure.model_round_s``): one 2-token
        draft step, γ−1 1-token draft steps and the verify pass over γ+1 tokens.
    """

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
        """Speedup with the prefill passes left out: τ · plain round time ÷ spec round time; NaN when a round time
        is not positive (the separately timed prefill exceeded the median call: calls too short to tell)."""
        if self.plain_round_s <= 0 or self.spec_round_s <= 0:
            return math.nan
        return self.tau * self.plain_round_s / self.spec_round_s

    @property
    def eff_issue(self) -> float:
        """``speedup`` ÷ ``bound_issue``: the share of bound A reached (1 = at the bound)."""
        return self.speedup / self.bound_issue

    @property
    def eff_cpu(self) -> float:
        """``speedup`` ÷ ``bound_cpu``: the share of bound B reached (1 = at the bound)."""
        return self.speedup / self.bound_cpu

    @property
    def eff_tau(self) -> float:
        """``speedup`` ÷ ``ideal_tau``: the share reached of the models-only speed-up at the measured τ."""
        return self.speedup / self.ideal_tau


@dataclasses.dataclass
class PairReport:
    """Everything ``bench_pair`` measured for one (target, draft) pair. Times are in seconds, memory in bytes.

    Attributes:
      name, description: the pair's (``Pair.name``, ``Pair.description``).
      target_params, draft_params: parameter counts (``CausalLM.num_params``).
      cache_len: the generation's KV-cache length (``prepare``'s), also that of the step and prefill timings.
      prompt_pad: the prompt's length after padding: the tokens of the prefill pass.
      steps_s: median seconds of one standalone step per case (``measure.round_timer``): ``"target_1"``,
        ``"draft_1"``, ``"draft_2"`` and the verify pass ``measure.verify_key(γ)`` (``"target_{γ+1}"``).
      step_samples: timed calls behind each of those medians.
      prefill_s: median seconds of the prefill pass over the padded prompt, keys ``"target"`` and ``"draft"``.
      c, v: draft step ÷ target step and verify pass ÷ target step (``measure.step_ratios``).
      compile_spec, compile_plain: compile reports of the speculative and the plain ``generate`` program.
      memory: ``measure.memory_report`` at the prompt's batch and ``cache_len``, taken after all the runs.
      temps: one ``TempReport`` per temperature of ``args.temperatures``, in that order.
    """

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
    """The ``TempReport`` of temperature ``temp`` from its seed-paired ``plain`` and ``spec`` runs, the pair's
    standalone step medians ``steps`` (keys as ``PairReport.steps_s``), its prefill medians ``prefill``
    (``"target"``, ``"draft"``) and ``gamma``. Speeds and round times are medians over the runs; α and τ pool the
    counts of every ``spec`` run."""
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
    """Benchmark one pair, plain vs speculative, on the batch-1 prompt of ``make_prompt``: its ``PairReport``.

    In order: a cold lower + compile of both programs and their first ``generate`` calls; a ``round_timer`` at the
    generation's cache length and position ``prompt_len + max_new_tokens // 2`` and one block of ``step_iters``
    calls; the prefill medians (5 calls per model); then per temperature ``repeats`` plain + speculative runs
    (seeds 0, 1, …; no EOS stop), with a step-timing block after each plain + speculative pair. ``args`` is the
    bench's namespace; ``gamma``, ``max_new_tokens``, ``temperatures``, ``repeats``, ``step_iters``, ``prompt_len``
    and ``seed`` are read.
    """
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
