"""Automatic γ: speculate with the γ that maximizes expected tokens/s, or decode plainly when nothing pays.

Cost model, in units of one plain decoding step at the call's batch size and cache length, measured once per
(model pair, batch bucket, cache bucket, mesh) and cached:

    r(γ)   = one speculative round ÷ one plain step, both timed *inside the compiled generation loop* (the
             loop's own programs, run for a few rounds on a synthetic state): this is the bound's γc + v(γ)
             with everything a round really does (draft steps, warping and sampling over the vocabulary, the
             verify pass over γ+1 tokens, the rejection sampler, bookkeeping) and nothing it does not
    c      = draft step ÷ target step                          (standalone model calls; reported)
    v(γ)   = target pass over γ+1 tokens ÷ target step         (standalone; reported: ~1 when memory-bound, up
                                                                 to γ+1 when compute-bound)
    p, P   = draft / target prefill ÷ target step             (standalone, timed over min(64, cache/2) prompt
                                                                 tokens and scaled linearly to the call's padded
                                                                 prompt; paid once per call)

A first version used γc + v(γ) from the standalone calls for r(γ); on the 2-core CPU that was 15-70 %
optimistic at batch >= 4 (expected 1.63× where 0.95× was measured), because a round's per-step work besides
the two forward passes is large next to a 3 ms step of a 12.6 M model. The in-loop rounds compile the candidate
loops (each once; a later call with the chosen γ reuses the compiled rounds).

Acceptance is estimated per model pair (greedy and sampled apart) *by draft position*: a_i = P(draft i accepted |
drafts 1..i−1 accepted), counted from the accept-length histograms of earlier calls (a Beta prior of
``prior_alpha`` until enough rounds are seen; a position never reached yet borrows the estimate of the one
before). Expected tokens per round are then τ(γ) = 1 + Σ_{i≤γ} Π_{j≤i} a_j, which needs no independence
assumption: real acceptances are correlated, and the textbook τ = (1 − α^(γ+1)) / (1 − α) with α = accepted ÷
drafted underestimates τ badly (α counts the drafts after the first rejection, which are never checked).

A call of N new tokens costs P + N steps plainly and ``P + p + s (N / τ) r(γ)`` speculatively, with τ capped at
N (a round cannot emit more than is left: short outputs gain little). The target's prefill P is the same in both
modes but dilutes the gain: a first version left it out, so its expected speed-up was the decode's alone (at batch
4 a plain call was a third prefill on the 2-core CPU, and 1.24× was expected where a call measured 0.95-1.01×).
Linear scaling overestimates P for long prompts where a prefill pass is memory-bound (accelerators), which only
makes the policy more cautious. s >= 1 is the straggler factor of a batch:
the loop runs until its slowest row is done, and rows accept at different rates, so a batch needs more rounds
than N / τ (the mean row's). It is learned per (pair, greedy/sampled, batch bucket) from earlier calls as
passes × τ ÷ (longest row's tokens), where τ = all tokens ÷ all row-rounds; 1 at batch 1 and before any call.
The policy picks the γ with the largest expected speed-up and speculates only if it exceeds ``margin`` (default
1.1).

Workloads change, and a policy that has settled on plain decoding observes no acceptance, so it would never
notice that speculation pays again (a first version stayed plain through a whole prompt-lookup benchmark of
copying prompts after the ordinary ones). So:
  * the acceptance counts forget: every decision for a pair (speculative or plain) multiplies them by
    0.5 ** (1 / ``half_life``), ``half_life`` = 8 calls by default, and the Beta prior regains weight;
  * after ``explore_after`` consecutive plain decisions for a (pair, greedy/sampled, batch bucket) (8 at
    first), if speculation would pay at the optimistic acceptance max(a_i, ``prior_alpha``), one call
    *probes* with that γ (``Decision.probe``) to measure the workload's acceptance again. A probe that does not
    bring speculation back doubles the wait before the next one (8, 16, 32, ... calls), so a workload where
    speculation loses pays at most one probe per doubling; a batch bucket where even the optimistic acceptance
    cannot pay (large batches) never probes.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxspec import loop, sharding

GAMMAS = (1, 2, 4, 6)


@dataclasses.dataclass(frozen=True)
class Costs:
    c: float
    v: dict  # γ -> verify(γ+1 tokens) ÷ step
    prefill: float  # draft prefill ÷ target step, for ``prefill_tokens`` prompt tokens (per call if that is 0)
    round: dict | None = None  # γ -> in-loop round ÷ in-loop plain step (None: use γc + v(γ))
    target_prefill: float = 0.0  # target prefill ÷ target step, for ``prefill_tokens`` prompt tokens
    prefill_tokens: int = 0  # the prompt length both prefills were timed at (0: ``prefill`` is per call, unscaled)

    def prefills(self, prompt_tokens: int | None = None) -> tuple[float, float]:
        """(target, draft) prefill of a call in plain steps, scaled linearly to its (padded) prompt length; without
        a prompt length or a timed one, (0, ``prefill``)."""
        if not prompt_tokens or not self.prefill_tokens:
            return 0.0, self.prefill
        scale = prompt_tokens / self.prefill_tokens
        return self.target_prefill * scale, self.prefill * scale

    def round_cost(self, gamma: int) -> float:
        if self.round is not None and gamma in self.round:
            return self.round[gamma]
        return gamma * self.c + self.v[gamma]


@dataclasses.dataclass(frozen=True)
class Decision:
    gamma: int  # 0 = plain decoding
    alpha: float  # accepted ÷ drafted over the calls seen so far (the prior before any)
    alpha_observed_drafts: int  # drafts behind that estimate (0: the prior alone)
    position_acceptance: tuple  # the a_i estimates used, i = 1 .. max candidate γ
    tau: dict  # γ -> expected tokens per round
    c: float
    v: dict
    round_cost: dict  # γ -> cost of a round in plain steps (in-loop measured, or γc + v)
    straggler: float  # rounds the batch needs ÷ the mean row's (learned; 1 at batch 1 and before any call)
    expected_speedup: dict  # γ -> expected speed-up over plain decoding
    reason: str
    probe: bool = False  # speculating to re-measure acceptance after a run of plain decisions (see above)
    prefill: dict = dataclasses.field(default_factory=dict)  # "target"/"draft" -> this call's prefill in steps

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def expected_tokens(position_acceptance, gamma: int) -> float:
    """τ(γ) = 1 + Σ_{i≤γ} Π_{j≤i} a_j; with every a_j = α this is the textbook (1 − α^(γ+1)) / (1 − α)."""
    tau, run = 1.0, 1.0
    for a in list(position_acceptance)[:gamma]:
        run *= a
        tau += run
    return tau


def expected_speedup(
    alpha,
    gamma: int,
    c: float,
    v: float,
    new_tokens: int,
    prefill: float = 0.0,
    round_cost: float | None = None,
    straggler: float = 1.0,
    target_prefill: float = 0.0,
) -> float:
    """Plain time ÷ speculative time for ``new_tokens`` tokens (see the module docstring). ``alpha``: one
    acceptance probability for every position, or a sequence of per-position ones. ``round_cost`` (a round in
    plain steps, measured in the loop) replaces ``gamma * c + v`` when given; ``straggler`` multiplies the
    rounds a batch needs. ``prefill`` (the draft's) is paid by speculation only, ``target_prefill`` by both."""
    positions = [alpha] * gamma if isinstance(alpha, (int, float)) else alpha
    tau = min(expected_tokens(positions, gamma), float(new_tokens))
    cost = gamma * c + v if round_cost is None else round_cost
    return (target_prefill + new_tokens) / (target_prefill + prefill + straggler * new_tokens / tau * cost)


@functools.cache
def _step(apply_fn):
    return jax.jit(apply_fn, donate_argnums=3)


def _time_step(model, batch: int, cache_len: int, tokens: int, iters: int = 5) -> float:
    fn = _step(model.apply_fn)
    toks = jnp.zeros((batch, tokens), jnp.int32)
    pos = jnp.broadcast_to(jnp.arange(tokens, dtype=jnp.int32) + cache_len // 2, (batch, tokens))
    cache = model.init_cache(batch, cache_len)
    times = []
    for i in range(iters + 2):  # compile + warm-up
        start = time.perf_counter()
        _, cache = jax.block_until_ready(fn(model.params, toks, pos, cache))
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
    machine hits every candidate alike instead of one γ's whole measurement (a sequential first version once
    measured r(4) 2.25 where the loop's real rounds cost about 1.9)."""

    def once(spec, params, rounds: int):
        state = jax.block_until_ready(loop.timing_state(spec, batch, 1, greedy))
        limit = jnp.int32(rounds)
        if spec.mesh is not None:
            limit = sharding.put(np.int32(rounds), NamedSharding(spec.mesh, P()))
        start = time.perf_counter()
        out, _ = loop.rounds_program(spec, target_params, params, state, limit)
        out = jax.block_until_ready(out)
        seconds = time.perf_counter() - start
        return seconds, int(np.max(sharding.to_host(out.rounds)))

    plan = {}
    for g, spec in specs.items():
        params = draft_params if g > 0 else None
        once(spec, params, 1)  # compile and warm up
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


def _key(model):
    """A model's identity for the caches: name, forward function and weights (a drafter object keys itself)."""
    if not hasattr(model, "apply_fn"):
        return model
    leaves = jax.tree.leaves(model.params)
    return (model.name, model.apply_fn, id(leaves[0]) if leaves else 0)


class AutoGamma:
    """The ``gamma="auto"`` policy: a cost cache and running acceptance estimates (one instance per process is
    enough: ``jaxspec.policy.DEFAULT``)."""

    def __init__(
        self,
        gammas=GAMMAS,
        prior_alpha: float = 0.6,
        prior_drafts: int = 20,
        margin: float = 1.1,
        half_life: float | None = 8.0,
        explore_after: int | None = 8,
    ):
        if not gammas or any(not isinstance(g, int) or g < 1 for g in gammas):
            raise ValueError(f"gammas must be ints >= 1, got {gammas!r}")
        if half_life is not None and not half_life > 0:
            raise ValueError(f"half_life must be None (never forget) or > 0 calls, got {half_life!r}")
        if explore_after is not None and (not isinstance(explore_after, int) or explore_after < 1):
            raise ValueError(f"explore_after must be None (never probe) or an int >= 1, got {explore_after!r}")
        self.gammas = tuple(sorted(set(gammas)))
        self.prior_alpha, self.prior_drafts, self.margin = prior_alpha, prior_drafts, margin
        self.half_life, self.explore_after = half_life, explore_after
        self._plain: dict = {}  # (pair, greedy, batch) -> [plain decisions in a row, calls to wait before a probe]
        self._costs: dict = {}
        self._counts: dict = {}  # (pair, greedy) -> [accepted, drafted]
        self._positions: dict = {}  # (pair, greedy) -> [accepted at position i, rounds reaching position i]
        self._straggle: dict = {}  # (pair, greedy, batch) -> [Σ passes × τ, Σ longest row's tokens]

    def costs(self, target, draft, batch: int, cache_len: int, round_timer=None, mesh_key=None) -> Costs:
        """Measured once per key and cached. ``round_timer(gammas)``: seconds per in-loop round for each γ (γ = 0:
        the plain step), as ``generate`` builds it; without it r(γ) is γc + v(γ) from the standalone calls."""
        key = (_key(target), _key(draft), batch, cache_len, mesh_key)
        if key not in self._costs:
            step = _time_step(target, batch, cache_len, 1)
            v = {g: _time_step(target, batch, cache_len, g + 1) / step for g in self.gammas}
            tokens = min(64, cache_len // 2)
            target_prefill = _time_step(target, batch, cache_len, tokens) / step
            if hasattr(draft, "apply_fn"):
                c = _time_step(draft, batch, cache_len, 1) / step
                prefill = _time_step(draft, batch, cache_len, tokens) / step
            else:  # prompt lookup: no model
                c, prefill = 0.0, 0.0
            rounds = None
            if round_timer is not None:
                seconds = round_timer((0, *self.gammas))
                rounds = {g: seconds[g] / seconds[0] for g in self.gammas}
            self._costs[key] = Costs(c, v, prefill, rounds, target_prefill, tokens)
        return self._costs[key]

    def set_costs(self, target, draft, batch: int, cache_len: int, costs: Costs, mesh_key=None) -> None:
        """Use ``costs`` instead of measuring them (tests, or figures measured elsewhere)."""
        self._costs[(_key(target), _key(draft), batch, cache_len, mesh_key)] = costs

    def alpha(self, target, draft, greedy: bool) -> tuple[float, int]:
        acc, drafted = self._counts.get(self._pair(target, draft, greedy), (0, 0))
        w = self.prior_drafts
        return (acc + self.prior_alpha * w) / (drafted + w), int(round(drafted))

    def position_acceptance(self, target, draft, greedy: bool) -> tuple[float, ...]:
        """Estimated a_i for i = 1 .. max candidate γ (see the module docstring)."""
        acc, reached = self._positions.get(self._pair(target, draft, greedy), ([], []))
        w, out = self.prior_drafts, []
        for i in range(max(self.gammas)):
            if i < len(reached) and reached[i] > 0:
                out.append((acc[i] + self.prior_alpha * w) / (reached[i] + w))
            else:
                out.append(out[-1] if out else self.prior_alpha)
        return tuple(out)

    def straggler(self, target, draft, greedy: bool, batch: int) -> float:
        """Rounds a batch of ``batch`` rows needs ÷ the mean row's rounds (see the module docstring)."""
        done, longest = self._straggle.get((*self._pair(target, draft, greedy), batch), (0.0, 0))
        return max(1.0, done / longest) if longest else 1.0

    def observe(
        self,
        target,
        draft,
        greedy: bool,
        accepted: int,
        drafted: int,
        accept_hist=(),
        *,
        batch: int | None = None,
        passes: int = 0,
        row_tokens=(),
        row_rounds=(),
    ) -> None:
        """Record a call's counts; ``accept_hist[n]`` = rounds in which exactly n drafts were accepted. With
        ``batch`` (the compiled batch size), ``passes`` (the loop's verify passes) and the rows' generated tokens
        and rounds, also the batch's straggler factor."""
        if batch is not None and passes and sum(row_rounds) and max(row_tokens, default=0):
            tau = sum(row_tokens) / sum(row_rounds)
            entry = self._straggle.setdefault((*self._pair(target, draft, greedy), batch), [0.0, 0])
            entry[0] += passes * tau
            entry[1] += max(row_tokens)
        key = self._pair(target, draft, greedy)
        counts = self._counts.setdefault(key, [0, 0])
        counts[0] += accepted
        counts[1] += drafted
        acc, reached = self._positions.setdefault(key, ([], []))
        hist = list(accept_hist)
        for i in range(len(hist) - 1):  # position i + 1 is reached when >= i drafts were accepted
            if i >= len(reached):
                acc.append(0)
                reached.append(0)
            reached[i] += sum(hist[i:])
            acc[i] += sum(hist[i + 1 :])

    def set_alpha(self, target, draft, greedy: bool, alpha: float, drafts: int = 10_000) -> None:
        """Overwrite the running estimate with α at every position (tests, or a value known from elsewhere)."""
        key = self._pair(target, draft, greedy)
        self._counts[key] = [alpha * drafts, drafts]
        self._positions[key] = ([alpha * drafts] * max(self.gammas), [drafts] * max(self.gammas))

    def _forget(self, key) -> None:
        """Age a pair's acceptance counts by one call (see the module docstring)."""
        if self.half_life is None:
            return
        keep = 0.5 ** (1.0 / self.half_life)
        if key in self._counts:
            self._counts[key] = [x * keep for x in self._counts[key]]
        if key in self._positions:
            self._positions[key] = tuple([x * keep for x in column] for column in self._positions[key])

    def decide(
        self,
        target,
        draft,
        batch: int,
        cache_len: int,
        new_tokens: int,
        greedy: bool,
        round_timer=None,
        mesh_key=None,
        prompt_tokens: int | None = None,
    ) -> Decision:
        """``prompt_tokens``: the call's padded prompt length, for the prefills (see ``Costs.prefills``)."""
        costs = self.costs(target, draft, batch, cache_len, round_timer, mesh_key)
        target_prefill, draft_prefill = costs.prefills(prompt_tokens)
        alpha, seen = self.alpha(target, draft, greedy)
        positions = self.position_acceptance(target, draft, greedy)
        round_costs = {g: costs.round_cost(g) for g in self.gammas}
        straggler = self.straggler(target, draft, greedy, batch)

        def speedups(acceptance):
            return {
                g: expected_speedup(
                    acceptance,
                    g,
                    costs.c,
                    costs.v[g],
                    new_tokens,
                    draft_prefill,
                    round_costs[g],
                    straggler,
                    target_prefill,
                )
                for g in self.gammas
            }

        gains = speedups(positions)
        taus = {g: expected_tokens(positions, g) for g in self.gammas}
        best = max(gains, key=gains.get)
        streak = self._plain.setdefault((*self._pair(target, draft, greedy), batch), [0, self.explore_after])
        probe = False
        if gains[best] >= self.margin:
            reason = f"γ={best} expected {gains[best]:.2f}× plain"
            chosen = best
            streak[:] = [0, self.explore_after]
        else:
            reason = f"plain: best expected speed-up {gains[best]:.2f}× (γ={best}) is below the margin {self.margin}"
            chosen = 0
            if self.explore_after is not None and streak[0] >= streak[1]:
                hopeful = speedups(tuple(max(a, self.prior_alpha) for a in positions))
                bet = max(hopeful, key=hopeful.get)
                if hopeful[bet] >= self.margin:
                    chosen, probe = bet, True
                    reason = (
                        f"probe: γ={bet} after {streak[0]} plain calls, to measure acceptance again (best "
                        f"expected {gains[best]:.2f}× at the current estimate, {hopeful[bet]:.2f}× at "
                        f"acceptance >= {self.prior_alpha})"
                    )
                    streak[:] = [0, 2 * streak[1]]
            if not probe:
                streak[0] += 1
        self._forget(self._pair(target, draft, greedy))
        return Decision(
            chosen,
            alpha,
            seen,
            positions,
            taus,
            costs.c,
            dict(costs.v),
            round_costs,
            straggler,
            gains,
            reason,
            probe,
            {"target": target_prefill, "draft": draft_prefill},
        )

    @staticmethod
    def _pair(target, draft, greedy: bool) -> tuple:
        return (_key(target), _key(draft), bool(greedy))


DEFAULT = AutoGamma()
