"""Text tables and the JSON document of a benchmark run."""

from __future__ import annotations

import dataclasses
import statistics

import jax

from jaxspec.bench.bounds import bound_cpu
from jaxspec.bench.compare import PairReport, TempReport
from jaxspec.bench.measure import Breakdown, CompileReport, draft_phase_s, step_ratios, verify_key

MIB = 1024 * 1024
RULE = "=" * 96
THIN = "-" * 96


def _mib(n) -> str:
    return "n/a" if n is None else f"{n / MIB:8.1f} MiB"


def _ms(s: float) -> str:
    return f"{s * 1e3:.2f} ms"


def _temp_name(temp: float, greedy: str) -> str:
    return greedy if temp == 0 else f"T={temp:g}"


# --------------------------------------------------------------------------------------------- one pair


def _header_lines(rep: PairReport, args) -> list[str]:
    g, st = args.gamma, rep.steps_s
    return [
        RULE,
        f"pair: {rep.name}  ({rep.description})",
        f"  target {rep.target_params / 1e6:.1f} M params, draft {rep.draft_params / 1e6:.1f} M params "
        f"(draft counts its shared arrays); batch 1, prompt {args.prompt_len} (padded {rep.prompt_pad}), "
        f"max_new_tokens {args.max_new_tokens}, cache_length {rep.cache_len}, γ={g}",
        f"  step times (median of {rep.step_samples} calls each, interleaved with the generation runs; "
        f"jitted apply_fn, cache length {rep.cache_len}):",
        f"    target 1 tok {_ms(st['target_1'])} | target verify {g + 1} tok {_ms(st[verify_key(g)])} | "
        f"draft 1 tok {_ms(st['draft_1'])} | draft 2 tok {_ms(st['draft_2'])}",
        f"    c = draft/target step = {rep.c:.4f}   v = verify({g + 1})/target step = {rep.v:.3f}   "
        f"prefill: target {_ms(rep.prefill_s['target'])}, draft {_ms(rep.prefill_s['draft'])}",
        f"  model time of one spec round = draft(2 tok) + {g - 1}·draft(1 tok) + verify({g + 1}) = "
        f"{_ms(rep.temps[0].model_round_s)}",
    ]


def _temp_lines(t: TempReport, target_step_s: float, args) -> list[str]:
    rows = [
        ("tokens/s (median)", f"{t.plain_tps:10.1f}", f"{t.spec_tps:10.1f}"),
        ("generated tokens / run", f"{t.plain[0].tokens:10d}", f"{t.spec[0].tokens:10d}"),
        (
            "target passes / run (median)",
            f"{statistics.median(x.passes for x in t.plain):10g}",
            f"{statistics.median(x.passes for x in t.spec):10g}",
        ),
        ("α acceptance rate", f"{'-':>10}", f"{t.alpha:10.3f}"),
        ("τ tokens per target pass", f"{1.0:10.2f}", f"{t.tau:10.2f}"),
        ("round time, measured (ms)", f"{t.plain_round_s * 1e3:10.2f}", f"{t.spec_round_s * 1e3:10.2f}"),
        ("round time, models only (ms)", f"{target_step_s * 1e3:10.2f}", f"{t.model_round_s * 1e3:10.2f}"),
        (
            "residual = measured − models (ms)",
            f"{(t.plain_round_s - target_step_s) * 1e3:10.2f}",
            f"{(t.spec_round_s - t.model_round_s) * 1e3:10.2f}",
        ),
    ]
    figures = [
        ("speedup (spec tok/s ÷ plain tok/s)", t.speedup, ""),
        ("decode-only speedup (no prefill)", t.decode_speedup, ""),
        ("bound A, issue  Σα^i/(γc+1)", t.bound_issue, f"   efficiency A = {t.eff_issue:.3f}"),
        ("bound B, CPU    Σα^i/(γc+v)", t.bound_cpu, f"   efficiency B = {t.eff_cpu:.3f}"),
        ("ideal@τ  τ·t_target/t_round_models", t.ideal_tau, f"   efficiency τ = {t.eff_tau:.3f}"),
    ]
    return [
        THIN,
        f"  {_temp_name(t.temperature, 'greedy (T=0)')}   ({args.repeats} interleaved runs each)",
        f"    {'':34s}{'plain':>10}{'spec':>10}",
        *(f"    {a:34s}{b}{c}" for a, b, c in rows),
        *(f"    {label:34s}{'':10s}{value:10.3f}{tail}" for label, value, tail in figures),
    ]


def _first_call(c: CompileReport) -> str:
    return f"{c.first_call_compile_s:6.2f} s of {c.first_call_s:5.2f} s"


def _compile_lines(cs: CompileReport, cp: CompileReport) -> list[str]:
    return [
        THIN,
        "  compile (generate_program, cold caches)       spec            plain",
        f"    trace+lower / XLA compile / total   {cs.lower_s:6.2f}+{cs.compile_s:6.2f}={cs.total_s:6.2f} s"
        f"   {cp.lower_s:6.2f}+{cp.compile_s:6.2f}={cp.total_s:6.2f} s",
        f"    first generate(): stats.compile_time_s  {_first_call(cs)}   {_first_call(cp)}",
    ]


def _program_memory_line(label: str, comp: CompileReport, caches: int) -> str:
    ma = comp.memory
    if ma is None:
        return f"    {label} program memory_analysis(): n/a"
    return (
        f"    {label} program memory_analysis(): args {_mib(ma['argument'])}, out {_mib(ma['output'])}, "
        f"temp {_mib(ma['temp'])} (caches {_mib(caches).strip()}), alias {_mib(ma['alias']).strip()}, "
        f"code {_mib(ma['generated_code']).strip()}"
    )


def _memory_lines(rep: PairReport) -> list[str]:
    mem, cs = rep.memory, rep.compile_spec
    caches = mem["target_cache"] + mem["draft_cache"]
    dev = mem["device_peak"]
    peak = _mib(cs.memory["peak_estimate"]) if cs.memory else "n/a"
    return [
        "  memory",
        f"    weights: target {_mib(mem['target_weights'])}, draft {_mib(mem['draft_weights'])}, "
        f"unique {_mib(mem['weights_unique'])}",
        f"    KV caches (B=1, L={rep.cache_len}): target {_mib(mem['target_cache'])}, draft {_mib(mem['draft_cache'])}",
        _program_memory_line("spec ", cs, caches),
        _program_memory_line("plain", rep.compile_plain, mem["target_cache"]),
        f"    spec program peak estimate (args+out+temp−alias) {peak}"
        f" vs weights+caches {_mib(mem['weights_unique'] + caches)} (args count an array shared by target and draft "
        "once per use)",
        f"    process peak RSS so far {_mib(mem['peak_rss'])}; device peak "
        f"{'n/a (backend has no memory_stats)' if dev is None else _mib(dev)}",
    ]


def format_pair(rep: PairReport, args) -> str:
    """One pair's report: step times, one table per temperature (plain vs spec, bounds and efficiencies), compile
    times and memory."""
    lines = _header_lines(rep, args)
    for t in rep.temps:
        lines += _temp_lines(t, rep.steps_s["target_1"], args)
    lines += _compile_lines(rep.compile_spec, rep.compile_plain)
    lines += _memory_lines(rep)
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------- in-loop breakdown


def _breakdown_temp_lines(bd: Breakdown, t: TempReport | None, temp: float, g: int) -> list[str]:
    st = bd.steps_s
    eng = bd.get("spec null/null", temp)
    verify = bd.get("spec real/null", temp) - eng
    drafts = bd.get("spec null/real", temp) - eng
    real = bd.get("spec real/real", temp)
    p_eng = bd.get("plain null", temp)
    p_target = bd.get("plain real", temp) - p_eng
    name = _temp_name(temp, "greedy")
    pad = f"  {'':{len(name)}}  "
    lines = [
        f"  {name}: spec round {real * 1e3:6.2f} ms = engine {eng * 1e3:5.2f} + verify({g + 1}) {verify * 1e3:6.2f} "
        f"+ draft phase {drafts * 1e3:5.2f} + interaction {(real - (eng + verify + drafts)) * 1e3:+5.2f}",
        f"{pad}standalone: verify({g + 1}) {st[verify_key(g)] * 1e3:6.2f}, draft phase "
        f"(2-tok + {g - 1}×1-tok) {draft_phase_s(st, g) * 1e3:5.2f}; engine share of the spec round {eng / real:.1%}",
        f"{pad}plain round {bd.get('plain real', temp) * 1e3:6.2f} ms = engine {p_eng * 1e3:5.2f} "
        f"+ target step {p_target * 1e3:6.2f} (standalone {st['target_1'] * 1e3:6.2f})",
    ]
    if t is not None and p_target > 0:
        c_loop, v_loop = drafts / g / p_target, verify / p_target
        b_loop = bound_cpu(t.alpha, g, c_loop, v_loop)
        c_now, v_now = step_ratios(st, g)
        lines.append(
            f"{pad}in-loop c ≈ draft phase/(γ·target step) = {c_loop:.3f}, v = {v_loop:.2f}; "
            f"bound B with these {b_loop:.3f} -> efficiency {t.speedup / b_loop:.3f} "
            f"(standalone now c={c_now:.3f}, v={v_now:.2f})"
        )
    return lines


def format_breakdown(bd: Breakdown, rep: PairReport, args) -> str:
    """The in-loop time breakdown of one pair (``rep``, the same pair's report, supplies α and the speedup):
    engine, verify and draft phase per round for each temperature, with in-loop c and v."""
    lines = [
        RULE,
        f"where the time goes inside the loop (pair {bd.pair}): ms per round = slope of wall time over rounds between "
        f"max_new_tokens {bd.short_new} and {bd.long_new}",
        f"  (medians of {args.breakdown_repeats}; 'null' = a ~zero-cost model (one gather, no cache) in that seat; "
        "'standalone' = jitted single calls as above, timed between these runs)",
    ]
    for temp in args.temperatures:
        t = next((t for t in rep.temps if t.temperature == temp), None)
        lines += _breakdown_temp_lines(bd, t, temp, args.gamma)
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------- summary, JSON


def _ok(eff: float) -> str:
    return " ok" if eff >= 0.9 else " LOW"


def format_summary(reports: list[PairReport], args) -> str:
    """One line per (pair, temperature) with c, v, α, τ, the speedup and its efficiencies (A and B marked ok, or
    LOW under 0.9), one line of compile times per pair (OVER above 15 s), and a note on the bounds."""
    lines = [
        RULE,
        f"summary (this run γ={args.gamma}; targets: efficiency ≥ 0.9 at γ=4 for a pair with c ≤ 0.1, compile ≤ 15 s)",
    ]
    for rep in reports:
        for t in rep.temps:
            lines.append(
                f"  {rep.name:8s} T={t.temperature:<3g} c={rep.c:.3f} v={rep.v:.2f} α={t.alpha:.3f} τ={t.tau:.2f} "
                f"speedup={t.speedup:.2f}  eff A={t.eff_issue:.2f}{_ok(t.eff_issue)}  "
                f"eff B={t.eff_cpu:.2f}{_ok(t.eff_cpu)}  eff τ={t.eff_tau:.2f}"
            )
        total = rep.compile_spec.total_s
        lines.append(
            f"  {rep.name:8s} compile spec {total:.1f} s ({'ok' if total <= 15 else 'OVER'}), "
            f"plain {rep.compile_plain.total_s:.1f} s"
        )
    lines.append(
        "note: 'bound A' is the issue's (1−α^(γ+1))/((1−α)(γc+1)), which assumes verifying γ+1 tokens costs "
        "one target step; 'bound B' replaces the 1 by the measured v (CPU-aware). "
        "Efficiency = speedup ÷ bound."
    )
    return "\n".join(lines)


def _plain(x):
    """Dataclasses (with their properties) -> dicts, recursively; lists, tuples and dicts likewise."""
    if dataclasses.is_dataclass(x):
        d = {f.name: _plain(getattr(x, f.name)) for f in dataclasses.fields(x)}
        d.update({k: getattr(x, k) for k, v in vars(type(x)).items() if isinstance(v, property)})
        return d
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x


def to_json(reports: list[PairReport], breakdown: Breakdown | None, args) -> dict:
    """The run as a JSON-ready dict: ``args``, ``backend``, ``device``, ``pairs`` (each report as nested dicts,
    properties included) and ``breakdown`` (or None)."""
    return {
        "args": vars(args),
        "backend": jax.default_backend(),
        "device": str(jax.devices()[0]),
        "pairs": [_plain(r) for r in reports],
        "breakdown": _plain(breakdown),
    }
