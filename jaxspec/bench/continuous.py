"""``--continuous``: static batches against the continuous-batching engine (``jaxspec.Engine``), one prompt pool.

The pool: ``--pool`` prompts (default ``max(4 × largest slot count, 64)``) cycled from the pair's prompts, each with
its own ``max_new_tokens`` drawn uniformly in ``[max/8, max]`` (``--max-new-tokens``; seeded by ``--seed``) and its
own seed (``--seed + i``), EOS on (the target's). Every mode at every slot count B generates exactly this work, with
the same cache length (bucketed from the longest prompt + its new tokens), so greedy outputs must agree:

  * ``static-plain`` / ``static-fixed``: today's batching, the pool cut into consecutive ``jaxspec.generate`` calls
    of B prompts, plain or with the draft at γ = ``--gamma`` (each call runs until its slowest row is done);
  * ``cont-plain`` / ``cont-fixed`` / ``cont-auto`` / ``cont-lookup``: one ``Engine(slots=B).run(pool)``: plain, the
    draft at fixed γ, ``gamma="auto"`` (a fresh ``AutoGamma`` per slot count) and prompt lookup at γ (not run by
    default; ``--continuous-modes`` picks a subset, the two plain modes always run).

Per (temperature, B): first calls, each from a cold start (every compiled program forgotten): ``cont-plain``, then
``cont-auto`` (its cost calibration included; candidates ``--auto-gammas``); then the other modes' warm-ups (an
untimed pass; static modes: one call per compiled shape, which compiles what a pass does; ``cont-plain`` again when
auto's cold start chose γ > 0, so that plain's programs are gone), then
``--repeats`` timed passes, modes interleaved (order reversed on odd passes). Reported per mode: tokens/s (generated
tokens ÷ device time, compilation excluded: for static the calls' ``stats.wall_time_s`` summed, for continuous
``run.stats.wall_time_s``), ratios to static plain and to continuous plain paired per pass (median over passes, as
``--sweep``), α, τ (tokens per row-round), straggler factor (slot-rounds run ÷ the rows' rounds: for static Σ over
calls of the slowest row's rounds × the call's compiled batch (B) ÷ Σ row rounds; for continuous
``run.stats.straggler_factor``), the continuous straggler factor while requests still waited (``queued``:
``stats.queued_straggler_factor``, the job's drain excluded) and slot occupancy (its inverse), refills and syncs per
100 rows, and the share of rows whose tokens equal the static counterpart's (greedy: static plain's).

First calls: ``compile_s`` is ``stats.compile_time_s``; ``setup_s`` is what the first run took beyond its device
time minus what a warm run takes beyond it (its host work, compilation excluded): compilation plus, for auto, the
calibration that ``EngineStats`` does not count (it happens when the run is created). The issue's goal: auto's
first call ≤ 2× a plain call's compile.

Sync overhead: one ``loop.rounds_program`` call that runs no round (plus the engine's per-sync host read) on a
state of B running rows, median of many, against one round at B (the slope over k rounds): what each sync costs the
host-driven engine and an on-device queue would save, as a share of the rounds between two syncs.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Any

import jax
import numpy as np

import jaxspec
from jaxspec import loop
from jaxspec.bench import humaneval, shipped
from jaxspec.bench.pairs import PAIRS
from jaxspec.bench.sweep import batch_calls, paired_ratio, prompt_pool
from jaxspec.core.model import CausalLM
from jaxspec.formats.jsonl import read_jsonl
from jaxspec.formats.paths import shipped_dir
from jaxspec.generation import inputs as inputs_lib
from jaxspec.generation.request import tokenize
from jaxspec.parallel import sharding
from jaxspec.policy import AutoGamma, measure_costs

MODES = ("static-plain", "static-fixed", "cont-plain", "cont-fixed", "cont-auto", "cont-lookup")
DEFAULT_MODES = MODES[:5]
BASELINES = ("static-plain", "cont-plain")
SHARES_AT = (1, 4, 16)  # sync overhead as a share of k rounds, for these k


@dataclasses.dataclass(frozen=True)
class Workload:
    """The pair and the pool every mode generates: ``prompts`` (token ids), per prompt ``max_new`` and ``seeds``."""

    pair: str
    description: str
    target: CausalLM
    draft: CausalLM
    prompts: list[list[int]]
    max_new: list[int]
    seeds: list[int]
    eos: int | tuple[int, ...] | None
    cache_len: int


def pool_size(args) -> int:
    """``--pool``, or ``max(4 × largest slot count, 64)``."""
    return args.pool or max(4 * max(args.slots), 64)


def mixed_lengths(n: int, max_new: int, seed: int) -> list[int]:
    """``n`` values of ``max_new_tokens``, uniform in ``[max(1, max_new // 8), max_new]``, drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    return [int(x) for x in rng.integers(max(1, max_new // 8), max_new + 1, n)]


def auto_gammas(args) -> tuple[int, ...] | None:
    """``cont-auto``'s candidate γ: ``--auto-gammas``; with ``--quick`` ``--gamma`` alone (its calibration then
    compiles no loop that the other modes do not); else None (``AutoGamma``'s default)."""
    if args.auto_gammas:
        return tuple(args.auto_gammas)
    return (args.gamma,) if args.quick else None


def workload(args) -> Workload:
    """The ``Workload`` of ``args.pair``: ``shipped`` (code-target + its draft, held-out prompts), ``smollm2``
    (SmolLM2-135M-Instruct + its draft, HumanEval chat prompts) or a random-weight pair of ``PAIRS`` (``--quick``:
    16 prompts of random tokens, ``--prompt-len`` / 2 + 1 to ``--prompt-len`` long: one length bucket, so few
    programs to compile)."""
    size = pool_size(args)
    if args.pair == "shipped":
        target, draft = jaxspec.load(shipped.TARGET), jaxspec.load(shipped.draft_name(args))
        ids = [target.tokenizer.encode(p["prompt"]) for p in shipped.load_prompts(args.shipped_prompts)]
        desc = f"{shipped.TARGET} + {shipped.draft_name(args)}, held-out prompts"
    elif args.pair == "smollm2":
        target = jaxspec.load(getattr(args, "target", None) or humaneval.TARGET)
        draft = jaxspec.load(getattr(args, "shipped_draft", None) or humaneval.DRAFT)
        ids = humaneval.prompt_ids(target, humaneval.load_problems(args.humaneval_prompts or size))
        desc = f"{target.name} + {draft.name}, HumanEval chat prompts"
    else:
        pair = PAIRS[args.pair](args)
        target, draft = pair.target, pair.draft
        rng = np.random.default_rng(args.seed)
        lengths = rng.integers(args.prompt_len // 2 + 1, args.prompt_len + 1, min(size, 16))
        ids = [rng.integers(0, target.vocab_size, n).tolist() for n in lengths]
        desc = f"{pair.name} pair ({pair.description}), random prompts"
    prompts = prompt_pool(ids, size)
    max_new = mixed_lengths(size, args.max_new_tokens, args.seed)
    cache_len = inputs_lib.bucket_cache(max(len(p) + m for p, m in zip(prompts, max_new)))
    seeds = [args.seed + i for i in range(size)]
    return Workload(args.pair, desc, target, draft, prompts, max_new, seeds, target.eos_token_id, cache_len)


@dataclasses.dataclass
class Pass:
    """One mode's pass over the pool: counts summed over its calls (static) or its one run (continuous)."""

    tokens: int = 0
    seconds: float = 0.0  # device time, compilation excluded
    elapsed_s: float = 0.0  # the whole pass on the host clock
    compile_s: float = 0.0
    drafted: int = 0
    accepted: int = 0
    row_rounds: int = 0
    rounds: int = 0  # loop iterations (batched target passes)
    slot_rounds: int = 0  # rounds × slots (static: × each call's compiled batch, B but for a shorter last call)
    queued_slot_rounds: int = 0  # continuous: rounds × slots while requests waited (the drain excluded)
    queued_row_rounds: int = 0
    refills: int | None = None
    syncs: int | None = None
    gammas: dict = dataclasses.field(default_factory=dict)  # γ run -> calls
    policy: dict | None = None
    outputs: list = dataclasses.field(default_factory=list)
    run: object = None  # the EngineRun (continuous)


def cold() -> None:
    """Forget every compiled program (jaxspec's loop and slot programs, jax's own caches): the next call pays
    what it would in a fresh process."""
    jax.clear_caches()
    loop.clear_compiled()


def static_calls(w: Workload, slots: int, warm_up: bool = False) -> list[list[int]]:
    """The pool's indices in consecutive calls of ``slots``; with ``warm_up``, only the first call of each (rows,
    prompt-length bucket): every program a full pass compiles, at a fraction of its cost."""
    calls = batch_calls(list(range(len(w.prompts))), slots)
    if not warm_up:
        return calls
    shapes: dict[tuple[int, int], list[int]] = {}
    for call in calls:
        shapes.setdefault((len(call), inputs_lib.next_pow2(max(len(w.prompts[i]) for i in call), 8)), call)
    return list(shapes.values())


def static_pass(w: Workload, calls: list[list[int]], temp: float, extra: dict) -> Pass:
    """``generate`` calls of the pool's prompts ``calls`` (index lists) with ``extra`` (draft, γ)."""
    p, start = Pass(), time.perf_counter()
    for call in calls:
        res = jaxspec.generate(
            w.target,
            [w.prompts[i] for i in call],
            max_new_tokens=[w.max_new[i] for i in call],
            seed=[w.seeds[i] for i in call],
            temperature=temp,
            eos_token_id=w.eos,
            max_length=w.cache_len,
            **extra,
        )
        s = res.stats
        p.tokens += s.generated_tokens
        p.seconds += s.wall_time_s
        p.compile_s += s.compile_time_s
        p.drafted, p.accepted = p.drafted + s.drafted, p.accepted + s.accepted
        p.row_rounds += s.rounds
        p.rounds += s.target_passes
        p.slot_rounds += s.target_passes * s.compiled_batch_size
        p.gammas[s.gamma] = p.gammas.get(s.gamma, 0) + 1
        p.outputs += res.tokens
    p.elapsed_s = time.perf_counter() - start
    return p


def continuous_pass(w: Workload, engine) -> Pass:
    """The whole pool through ``engine.run`` (each request with its own ``max_new_tokens`` and seed)."""
    requests = [dict(prompt=q, max_new_tokens=m, seed=s) for q, m, s in zip(w.prompts, w.max_new, w.seeds)]
    start = time.perf_counter()
    run = engine.run(requests)
    outputs = [None] * len(requests)
    for row in run:
        outputs[row.index] = row.tokens
    s = run.stats
    return Pass(
        tokens=s.generated_tokens,
        seconds=s.wall_time_s,
        elapsed_s=time.perf_counter() - start,
        compile_s=s.compile_time_s,
        drafted=s.drafted,
        accepted=s.accepted,
        row_rounds=s.row_rounds,
        rounds=s.rounds,
        slot_rounds=s.slot_rounds,
        queued_slot_rounds=s.queued_slot_rounds,
        queued_row_rounds=s.queued_row_rounds,
        refills=s.refills,
        syncs=s.syncs,
        gammas={s.gamma: 1},
        policy=s.policy,
        outputs=outputs,
        run=run,
    )


def sync_costs(run, greedy: bool, repeats: int = 11, budget: float = 0.05) -> dict:
    """Host cost of one sync of ``run``'s engine against one round, on a timing state of ``slots`` running rows at
    mid-cache: the median of ``repeats`` calls of ``loop.rounds_program`` that run no round (plus the engine's
    per-sync ``stop_after`` upload and host read of ``length``/``done``/``rounds``), and the median of as many
    calls of k rounds (k: about ``budget`` seconds, 2 to 16): round = (t(k) − t(0)) / k."""
    spec, request, width = run.spec, run.batch.request, run.engine.slots
    tparams, dparams = inputs_lib.place_params(request.target, run.drafter, spec.mesh, request.shard_draft)
    length = spec.cache_len // 2
    fits = max(1, (spec.cache_len - length - 2) // (spec.gamma + 1))

    def once(rounds: int) -> float:
        state = jax.block_until_ready(loop.timing_state(spec, width, length, greedy))
        limit = inputs_lib.replicated_scalar(spec.mesh, rounds)
        start = time.perf_counter()
        stop = inputs_lib.replicated_scalar(spec.mesh, run.engine.refill_at)
        state, _ = loop.rounds_program(spec, tparams, dparams, state, limit, stop)
        sharding.to_host((state.length, state.done, state.rounds))
        return time.perf_counter() - start

    once(0)  # compiles (if the timing state's signature is new) and warms up
    once(1)
    k = min(fits, max(2, min(16, int(np.ceil(budget / max(once(1), 1e-6))))))
    zero, full = [], []
    for _ in range(repeats):
        zero.append(once(0))
        full.append(once(k))
    sync_s = statistics.median(zero)
    round_s = max(statistics.median(full) - sync_s, 1e-9) / k
    return {
        "sync_ms": sync_s * 1e3,
        "round_ms": round_s * 1e3,
        "k": k,
        "share_at": {n: sync_s / (n * round_s) for n in SHARES_AT},
    }


def _labels(gamma: int) -> dict:
    return {
        "static-plain": "static plain",
        "static-fixed": f"static γ={gamma}",
        "cont-plain": "cont plain",
        "cont-fixed": f"cont γ={gamma}",
        "cont-auto": "cont auto",
        "cont-lookup": f"cont lookup γ={gamma}",
    }


def _runners(
    w: Workload, modes, gamma: int, slots: int, temp: float, auto_gammas=None, schedule="longest_first"
) -> dict:
    """Mode -> a function running one pass, or with ``warm_up=True`` what compiles its programs (static: one call
    per shape; continuous: a whole pass); ``cont-auto`` gets a fresh ``AutoGamma`` (candidates ``auto_gammas``,
    default the policy's); the engines take requests in ``schedule`` order."""
    kw = dict(slots=slots, max_length=w.cache_len, temperature=temp, eos_token_id=w.eos, schedule=schedule)
    engines: dict[str, dict[str, Any]] = {
        "cont-plain": dict(draft=None),
        "cont-fixed": dict(draft=w.draft, gamma=gamma),
        "cont-auto": dict(draft=w.draft, gamma="auto", policy=AutoGamma(auto_gammas) if auto_gammas else AutoGamma()),
        "cont-lookup": dict(draft="prompt_lookup", gamma=gamma),
    }
    statics = {"static-plain": dict(draft=None), "static-fixed": dict(draft=w.draft, gamma=gamma)}
    out = {}
    for m in modes:
        if m in statics:
            out[m] = lambda warm_up=False, e=statics[m]: static_pass(w, static_calls(w, slots, warm_up), temp, e)
        else:
            engine = jaxspec.Engine(w.target, **engines[m], **kw)
            out[m] = lambda warm_up=False, engine=engine: continuous_pass(w, engine)
    return out


def _counterpart(mode: str, greedy: bool) -> str | None:
    """The static mode whose outputs ``mode``'s must equal (greedy: static plain's for every mode)."""
    if greedy:
        return "static-plain"
    return {"cont-plain": "static-plain", "cont-fixed": "static-fixed"}.get(mode)


def figures(passes: list[Pass], base: dict, rows: int, ref: Pass | None) -> dict:
    """One mode's figures from its timed ``passes``; ``base``: baseline mode -> its passes (paired ratios)."""

    def total(field):
        return sum(getattr(p, field) for p in passes)

    pairs = [[p.tokens, p.seconds] for p in passes]
    straggler = total("slot_rounds") / total("row_rounds")
    continuous = passes[0].syncs is not None
    gammas: dict = {}
    for p in passes:
        for g, n in p.gammas.items():
            gammas[g] = gammas.get(g, 0) + n
    last = passes[-1]
    same = None if ref is None else sum(a == b for a, b in zip(last.outputs, ref.outputs)) / rows
    return {
        "tok_s": statistics.median(t / s for t, s in pairs),
        "tok_s_host": statistics.median(p.tokens / p.elapsed_s for p in passes),  # host clock: all included
        "vs_static_plain": paired_ratio(pairs, [[p.tokens, p.seconds] for p in base["static-plain"]]),
        "vs_cont_plain": paired_ratio(pairs, [[p.tokens, p.seconds] for p in base["cont-plain"]]),
        "alpha": total("accepted") / total("drafted") if total("drafted") else None,
        "tau": total("tokens") / total("row_rounds"),
        "straggler": straggler,
        "occupancy": 1.0 / straggler,
        # continuous: the straggler factor while requests waited (what refilling controls; the rest is the drain)
        "straggler_queued": (
            total("queued_slot_rounds") / total("queued_row_rounds") if total("queued_row_rounds") else None
        ),
        "refills_per_100": 100 * total("refills") / (rows * len(passes)) if continuous else None,
        "syncs_per_100": 100 * total("syncs") / (rows * len(passes)) if continuous else None,
        "rounds_per_sync": total("rounds") / total("syncs") if continuous else None,
        "gammas": {str(g): n for g, n in sorted(gammas.items())},
        "policy": last.policy,
        "tokens": last.tokens,
        "same_outputs": same,
        "timed_compile_s": total("compile_s"),
        "host_overhead_s": statistics.median(p.elapsed_s - p.seconds - p.compile_s for p in passes),
        "passes": [_pass_dict(p) for p in passes],
    }


def _pass_dict(p: Pass) -> dict:
    return {f.name: getattr(p, f.name) for f in dataclasses.fields(p) if f.name not in ("outputs", "run")}


def first_call(p: Pass, warm: dict) -> dict:
    """A first (cold) run's costs: ``compile_s`` and ``setup_s`` (beyond device time, minus a warm run's)."""
    return {
        "compile_s": p.compile_s,
        "elapsed_s": p.elapsed_s,
        "setup_s": (p.elapsed_s - p.seconds) - warm["host_overhead_s"],
        "gamma": next(iter(p.gammas)),
        "policy": p.policy,
    }


def _fmt(x, spec: str, none: str = "-") -> str:
    return none if x is None else format(x, spec)


HEADER = (
    f"{'slots':>5} | {'mode':<19} | {'tok/s':>7} | {'vs static':>9} | {'vs cont':>7} | {'α':>5} | {'τ':>5} | "
    f"{'strag.':>6} | {'queued':>6} | {'occup.':>6} | {'refills':>7} | {'syncs':>5} | {'same':>5}"
)


def _row_line(slots: int, label: str, f: dict) -> str:
    return (
        f"{slots:>5} | {label:<19} | {f['tok_s']:>7.1f} | {f['vs_static_plain']:>8.2f}× | "
        f"{f['vs_cont_plain']:>6.2f}× | "
        f"{_fmt(f['alpha'], '.3f'):>5} | {f['tau']:>5.2f} | {f['straggler']:>6.2f} | "
        f"{_fmt(f['straggler_queued'], '6.2f'):>6} | {f['occupancy']:>6.3f} | "
        f"{_fmt(f['refills_per_100'], '.1f'):>7} | {_fmt(f['syncs_per_100'], '.0f'):>5} | "
        f"{_fmt(f['same_outputs'], '.2f'):>5}"
    )


def bench_slots(w: Workload, args, modes, slots: int, temp: float) -> dict:
    """First calls, warm-up and timed passes at one slot count; prints its table rows; returns its block."""
    runners = _runners(w, modes, args.gamma, slots, temp, auto_gammas(args), args.schedule)
    labels = _labels(args.gamma)
    firsts = {}
    for m in ("cont-plain", "cont-auto"):  # cold first calls (auto: its calibration and the one loop it chose)
        if m in runners:
            cold()
            firsts[m] = runners[m]()
    if "cont-auto" in firsts and 0 not in firsts["cont-auto"].gammas:
        runners["cont-plain"](warm_up=True)  # auto's cold start dropped plain's programs and did not rebuild them
    for m in modes:  # warm-up: compile every other mode's programs
        if m not in firsts:
            runners[m](warm_up=True)
    passes: dict[str, list[Pass]] = {m: [] for m in modes}
    for r in range(args.repeats):
        for m in modes if r % 2 == 0 else modes[::-1]:
            passes[m].append(runners[m]())
    greedy, rows = temp == 0, len(w.prompts)
    block: dict[str, Any] = {"temperature": temp, "slots": slots, "modes": {}, "first_calls": {}, "sync": {}}
    for m in modes:
        ref_mode = _counterpart(m, greedy)
        ref = passes[ref_mode][-1] if ref_mode in passes and ref_mode != m else None
        block["modes"][m] = dict(label=labels[m], **figures(passes[m], passes, rows, ref))
        print(_row_line(slots, labels[m], block["modes"][m]), flush=True)
    for m, p in firsts.items():
        block["first_calls"][m] = first_call(p, block["modes"][m])
    _print_first_calls(block)
    if "cont-fixed" in passes and hasattr(w.draft, "apply_fn"):
        block["projection"] = x = projection(w, args.gamma, slots, block["modes"]["cont-fixed"]["tau"])
        print(
            f"{'':>5}   cont γ={args.gamma} per round: τ {x['tau']:.2f}, c {x['c']:.3f}, v {x['v']:.2f} (measured "
            "here); "
            f"τ/(γc+v) = {x['here']:.2f}× here, projection on an accelerator (v := 1, same τ and c) "
            f"τ/(γc+1) = {x['accelerator']:.2f}×",
            flush=True,
        )
    for m in ("cont-plain", "cont-fixed"):
        if m in passes:
            s = sync_costs(passes[m][-1].run, greedy)
            every = block["modes"][m]["rounds_per_sync"]
            s["observed_rounds_per_sync"] = every
            s["observed_share"] = s["sync_ms"] / (every * s["round_ms"])
            block["sync"][m] = s
            shares = "/".join(f"{100 * s['share_at'][n]:.1f}" for n in SHARES_AT)
            print(
                f"{'':>5}   {labels[m]}: sync overhead {s['sync_ms']:.2f} ms, round {s['round_ms']:.2f} ms; overhead "
                f"% of a round at refill every {'/'.join(map(str, SHARES_AT))} rounds: {shares} %; observed a sync "
                f"every {every:.1f} rounds: {100 * s['observed_share']:.1f} %",
                flush=True,
            )
    return block


def projection(w: Workload, gamma: int, slots: int, tau: float) -> dict:
    """Decode speed-up per round of ``cont-fixed`` over plain decoding from its measured τ (tokens per row-round)
    and c, v measured here (standalone steps at ``slots`` rows, ``policy.measure_costs``): τ/(γc+v) on this
    machine, and the projection τ/(γc+1) for an accelerator, where a verify pass over γ+1 tokens costs about one
    step (v := 1; c kept as measured here). Both leave out the prefill and slot occupancy."""
    costs = measure_costs(w.target, w.draft, slots, w.cache_len, (gamma,))
    c, v = costs.c, costs.v[gamma]
    return {"tau": tau, "c": c, "v": v, "here": tau / (gamma * c + v), "accelerator": tau / (gamma * c + 1.0)}


def _print_first_calls(block: dict) -> None:
    first = block["first_calls"]
    if "cont-auto" not in first:
        return
    plain, auto = first["cont-plain"], first["cont-auto"]
    block["auto_first_call"] = x = {
        "compile_extra_s": auto["compile_s"] - plain["compile_s"],
        "compile_ratio": auto["compile_s"] / plain["compile_s"] if plain["compile_s"] > 0 else None,
        "setup_extra_s": auto["setup_s"] - plain["setup_s"],
        "setup_vs_plain_compile": auto["setup_s"] / plain["compile_s"] if plain["compile_s"] > 0 else None,
        # what the first call did beyond compiling the programs it ran: the policy's calibration
        "calibration_s": auto["setup_s"] - auto["compile_s"],
        "calibration_vs_plain_compile": (auto["setup_s"] - auto["compile_s"]) / plain["compile_s"]
        if plain["compile_s"] > 0
        else None,
    }
    print(
        f"{'':>5}   first calls (cold): cont plain compile {plain['compile_s']:.1f} s (setup "
        f"{plain['setup_s']:.1f} s); "
        f"cont auto (chose γ={auto['gamma']}) compile {auto['compile_s']:.1f} s ({x['compile_extra_s']:+.1f} s, "
        f"{_fmt(x['compile_ratio'], '.2f')}×; its calibration is not counted there), setup incl. calibration "
        f"{auto['setup_s']:.1f} s = {_fmt(x['setup_vs_plain_compile'], '.2f')}× plain's compile; the calibration "
        f"alone (setup − compile) {x['calibration_s']:.1f} s = {_fmt(x['calibration_vs_plain_compile'], '.2f')}× "
        "plain's compile (goal ≤ 2×)",
        flush=True,
    )


def run(args) -> dict:
    """The ``--continuous`` mode (see the module docstring): prints a table block per (temperature, slot count)
    and a summary; returns the JSON document: the workload's description and ``blocks``, one per (temperature,
    slots) with ``modes`` (mode -> figures, see ``figures``), ``first_calls``, ``auto_first_call`` and ``sync``.
    With ``--requests``, the engine's sizing instead (``sizing``)."""
    if getattr(args, "requests", None):
        return sizing(args)
    modes = [m for m in MODES if m in BASELINES or m in (args.continuous_modes or DEFAULT_MODES)]
    w = workload(args)
    lengths = [len(p) for p in w.prompts]
    print(
        f"continuous: {w.description}; {len(w.prompts)} prompts ({min(lengths)}-{max(lengths)} tokens), "
        f"max_new_tokens {min(w.max_new)}-{max(w.max_new)} per prompt ({sum(w.max_new)} in all), EOS {w.eos}, "
        f"cache {w.cache_len}; γ={args.gamma}, auto's candidates {auto_gammas(args) or AutoGamma().gammas}; slots "
        f"{args.slots}; {args.repeats} timed passes, modes {modes}; schedule {args.schedule}",
        flush=True,
    )
    doc = {
        "mode": "continuous",
        "pair": w.pair,
        "description": w.description,
        "gamma": args.gamma,
        "max_new_tokens": args.max_new_tokens,
        "max_new_per_prompt": w.max_new,
        "pool": len(w.prompts),
        "prompt_tokens": lengths,
        "eos": w.eos,
        "cache_len": w.cache_len,
        "repeats": args.repeats,
        "auto_gammas": list(auto_gammas(args) or AutoGamma().gammas),
        "slots": args.slots,
        "schedule": args.schedule,
        "temperatures": args.temperatures,
        "modes": modes,
        "blocks": [],
    }
    for temp in args.temperatures:
        print(f"\ntemperature {temp:g}\n{HEADER}\n{'-' * len(HEADER)}", flush=True)
        for slots in args.slots:
            doc["blocks"].append(bench_slots(w, args, modes, slots, temp))
    _summary(doc)
    return doc


def _summary(doc: dict) -> None:
    print("\nsummary (tok/s; × static plain at the same slots):", flush=True)
    for b in doc["blocks"]:
        m = b["modes"]
        best = max(m, key=lambda k: m[k]["tok_s"])
        auto = ""
        if "cont-auto" in m:
            a, x = m["cont-auto"], b.get("auto_first_call", {})
            auto = (
                f"; auto {a['vs_static_plain']:.2f}× (γ {','.join(a['gammas'])}), first call "
                f"{_fmt(x.get('setup_vs_plain_compile'), '.2f')}× plain's compile"
            )
        print(
            f"  T={b['temperature']:g} slots {b['slots']:>3}: static plain {m['static-plain']['tok_s']:.1f}, "
            "cont plain "
            f"{m['cont-plain']['tok_s']:.1f} ({m['cont-plain']['vs_static_plain']:.2f}×, occupancy "
            f"{m['static-plain']['occupancy']:.2f} -> {m['cont-plain']['occupancy']:.2f}); best {m[best]['label']} "
            f"{m[best]['tok_s']:.1f} ({m[best]['vs_static_plain']:.2f}×){auto}",
            flush=True,
        )


SIZING_TARGET = "smollm2-135m-instruct"
SIZING_HEAD = "jaxspec/smollm2-eagle3"


@dataclasses.dataclass
class SizingPass:
    """One pass of a ``--requests`` mode: tokens, device seconds (compilation excluded), host seconds, outputs."""

    tokens: int
    seconds: float
    elapsed_s: float
    compile_s: float
    outputs: list
    compiles: dict
    widths: dict | None = None  # the engine's rounds by batch


def sizing_workload(args):
    """``(target, head, prompt ids)``: SmolLM2-135M-Instruct, its shipped EAGLE head and the 24 chat prompts of
    ``checkpoints/chat_prompts.jsonl`` through its chat template."""
    target = jaxspec.load(SIZING_TARGET)
    head = jaxspec.eagle.load(SIZING_HEAD, target)
    rows = read_jsonl(shipped_dir() / "chat_prompts.jsonl")
    return target, head, tokenize(target, [r["prompt"] for r in rows], chat=True)


def sizing_passes(target, head, prompts: list[list[int]], slots: int, max_new: int):
    """``{"engine": run, "generate": run}`` for one request count: ``Engine(slots=slots)`` over every prompt, and
    ``generate`` calls of ``min(len(prompts), slots)`` rows (the same prompts in order), greedy, the head at its
    default γ, ``max_new`` new tokens (EOS on). Each run returns a ``SizingPass``."""
    kw = dict(draft=head, temperature=0.0, max_new_tokens=max_new)
    engine = jaxspec.Engine(target, slots=slots, **kw)
    batch = min(len(prompts), slots)

    def engine_pass() -> SizingPass:
        start = time.perf_counter()
        run = engine.run(prompts)
        outputs: list[list[int] | None] = [None] * len(prompts)
        for row in run:
            outputs[row.index] = row.tokens
        s = run.stats
        elapsed = time.perf_counter() - start
        return SizingPass(s.generated_tokens, s.wall_time_s, elapsed, s.compile_time_s, outputs, s.compiles, s.widths)

    def generate_pass() -> SizingPass:
        p = SizingPass(0, 0.0, 0.0, 0.0, [], {})
        start = time.perf_counter()
        for call in batch_calls(prompts, batch):
            res = jaxspec.generate(target, call, **kw)
            s = res.stats
            p.tokens += s.generated_tokens
            p.seconds += s.wall_time_s
            p.compile_s += s.compile_time_s
            p.outputs += res.tokens
            if s.compile_time_s > 0:
                shape = f"generate[{s.compiled_batch_size}x{s.cache_length}]"
                p.compiles[shape] = p.compiles.get(shape, 0.0) + s.compile_time_s
        p.elapsed_s = time.perf_counter() - start
        return p

    return {"engine": engine_pass, "generate": generate_pass}


def sizing(args) -> dict:
    """``--continuous --requests N[,N...]``: for each N, the first N chat prompts (cycled) through
    ``Engine(slots=S)`` (S the largest ``--slots``) against ``generate`` calls of ``min(N, S)`` rows, SmolLM2 with
    its EAGLE head at the head's default γ, greedy, ``--max-new-tokens`` each. Per N: one untimed pass per mode (it
    compiles; its compile seconds per program are printed), then ``--repeats`` timed passes, modes interleaved
    (order reversed on odd passes). Reported: tokens/s (generated tokens ÷ device time, compilation excluded;
    median over passes), the engine's ratio to generate paired per pass, the batches the engine ran at, and the
    share of requests whose tokens agree."""
    target, head, ids = sizing_workload(args)
    slots = max(args.slots)
    print(
        f"engine sizing: {SIZING_TARGET} + {SIZING_HEAD} (γ={head.default_gamma}), {len(ids)} chat prompts "
        f"({min(map(len, ids))}-{max(map(len, ids))} tokens) cycled, greedy, {args.max_new_tokens} new tokens "
        f"(EOS on); Engine(slots={slots}) vs generate calls of min(N, {slots}) rows; {args.repeats} timed passes",
        flush=True,
    )
    doc: dict[str, Any] = {"mode": "continuous-sizing", "slots": slots, "max_new_tokens": args.max_new_tokens}
    doc["requests"] = []
    header = f"{'N':>4} | {'engine tok/s':>12} | {'generate tok/s':>14} | {'ratio':>6} | {'engine batches':<22} | same"
    print(f"{header}\n{'-' * len(header)}", flush=True)
    for n in args.requests:
        runners = sizing_passes(target, head, prompt_pool(ids, n), slots, args.max_new_tokens)
        first = {m: run() for m, run in runners.items()}  # compiles what a pass does
        passes: dict[str, list[SizingPass]] = {m: [] for m in runners}
        for r in range(args.repeats):
            for m in runners if r % 2 == 0 else list(runners)[::-1]:
                passes[m].append(runners[m]())
        tok_s = {m: statistics.median(p.tokens / p.seconds for p in ps) for m, ps in passes.items()}
        pairs = {m: [[p.tokens, p.seconds] for p in ps] for m, ps in passes.items()}
        ratio = paired_ratio(pairs["engine"], pairs["generate"])
        last = {m: ps[-1] for m, ps in passes.items()}
        same = sum(a == b for a, b in zip(last["engine"].outputs, last["generate"].outputs)) / n
        batches = "/".join(f"{w}:{k}" for w, k in sorted((last["engine"].widths or {}).items(), reverse=True))
        print(
            f"{n:>4} | {tok_s['engine']:>12.1f} | {tok_s['generate']:>14.1f} | {ratio:>5.2f}× | {batches:<22} | "
            f"{same:.2f}",
            flush=True,
        )
        for m, p in first.items():
            programs = ", ".join(f"{k} {v:.1f}s" for k, v in p.compiles.items()) or "none"
            print(f"{'':>4}   first {m} pass compiled {p.compile_s:.1f} s: {programs}", flush=True)
        doc["requests"].append(
            {
                "n": n,
                "tok_s": tok_s,
                "engine_vs_generate": ratio,
                "engine_widths": last["engine"].widths,
                "same_outputs": same,
                "first_pass_compiles": {m: p.compiles for m, p in first.items()},
                "passes": {m: [[p.tokens, p.seconds, p.elapsed_s] for p in ps] for m, ps in passes.items()},
            }
        )
    return doc
