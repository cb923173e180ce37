"""``gamma="auto"``: speculate with the γ that maximizes the expected speed-up (``jaxspec.policy.cost``), or decode
plainly when no γ is expected to beat plain decoding by ``margin`` (default 1.1).

``AutoGamma`` keeps, per model pair:

  * the measured ``Costs`` per (batch bucket, cache bucket, mesh), timed once from standalone model steps
    (``jaxspec.policy.timing``; with ``calibrate="loops"``, every candidate loop is compiled and timed too) and
    kept on disk for later processes when ``keep_costs`` says where (``jaxspec.policy.store``);
  * per (batch bucket, cache bucket, mesh) and γ, the seconds per round that the calls' own loops took
    (``observe_rounds``), from which r(γ) is taken once a call has run that γ (``cost.round_costs``). So a first
    call compiles no loop but the one it runs;
  * per (batch bucket, cache bucket, mesh), the target's prefill seconds per prompt token that the calls measured
    (``observe_prefill``), which replace the first estimate (extrapolated from the target's timed passes);
  * per greedy/sampled mode, an ``Acceptance``: acceptance by draft position, a_i = P(draft i accepted | drafts
    1..i−1 accepted), counted from the accept-length histograms of earlier calls with a Beta prior of
    ``prior_alpha`` weighing ``prior_drafts`` drafts (a position never reached yet borrows the estimate of the
    one before). Every decision multiplies the counts by 0.5 ** (1 / ``half_life``) (8 calls by default), so the
    estimate follows a changing workload and the prior regains weight;
  * per mode and batch bucket, a ``BatchState``: the straggler factor s = passes × τ ÷ (longest row's tokens),
    summed over earlier calls (τ = all tokens ÷ all row-rounds; 1 at batch 1 and before any call), and the run of
    plain decisions. After ``explore_after`` plain decisions in a row (8), if speculation would pay at the
    optimistic acceptance max(a_i, ``prior_alpha``), one call *probes* with that γ (``Decision.probe``) to measure
    the acceptance again; a probe that does not bring speculation back doubles the wait before the next one
    (8, 16, 32, ... calls). A batch bucket where even the optimistic acceptance cannot pay never probes.

Models are told apart by name, forward function and the identity of their weights; a drafter without a model
(prompt lookup) by itself.
"""

from __future__ import annotations

import dataclasses
import os
from typing import cast

import jax

from jaxspec.policy import store, timing
from jaxspec.policy.cost import (
    GAMMAS,
    Costs,
    Decision,
    expected_speedup,
    expected_tokens,
    position_counts,
    round_costs,
)


@dataclasses.dataclass
class Acceptance:
    """Acceptance counts of one (model pair, greedy/sampled) key; floats once aged by the half-life.

    Attributes:
      accepted: accepted drafts.
      drafted: drafted tokens.
      position_accepted: [i] rounds in which draft i + 1 was accepted.
      position_reached: [i] rounds that reached draft i + 1 (drafts 1..i accepted).
    """

    accepted: float = 0
    drafted: float = 0
    position_accepted: list = dataclasses.field(default_factory=list)
    position_reached: list = dataclasses.field(default_factory=list)

    def add(self, accepted: int, drafted: int, accept_hist=()) -> None:
        """Count a call: ``accept_hist[n]`` = rounds in which exactly n drafts were accepted."""
        self.accepted += accepted
        self.drafted += drafted
        acc, reached = self.position_accepted, self.position_reached
        for i, (r, a) in enumerate(zip(*position_counts(accept_hist))):
            if i >= len(reached):
                acc.append(0)
                reached.append(0)
            reached[i] += r
            acc[i] += a

    def age(self, keep: float) -> None:
        """Multiply every count by ``keep``."""
        self.accepted, self.drafted = self.accepted * keep, self.drafted * keep
        self.position_accepted = [x * keep for x in self.position_accepted]
        self.position_reached = [x * keep for x in self.position_reached]

    def alpha(self, prior: float, weight: float) -> float:
        """accepted ÷ drafted with a Beta prior of mean ``prior`` and ``weight`` drafts."""
        return (self.accepted + prior * weight) / (self.drafted + weight)

    def positions(self, n: int, prior: float, weight: float) -> tuple[float, ...]:
        """a_i for i = 1..n with the prior; a position never reached borrows the one before (the prior for i = 1)."""
        out = []
        for i in range(n):
            if i < len(self.position_reached) and self.position_reached[i] > 0:
                out.append((self.position_accepted[i] + prior * weight) / (self.position_reached[i] + weight))
            else:
                out.append(out[-1] if out else prior)
        return tuple(out)


@dataclasses.dataclass
class BatchState:
    """What ``AutoGamma`` learns per (model pair, greedy/sampled, batch bucket).

    Attributes:
      passes_tau: Σ over observed calls of (the loop's verify passes × τ), τ = tokens ÷ row-rounds.
      longest_tokens: Σ over the same calls of the longest row's generated tokens.
      plain_streak: plain decisions in a row since the last speculative (or probing) one.
      probe_wait: plain decisions in a row after which to probe (doubles after each probe; None: never probe).
    """

    passes_tau: float = 0.0
    longest_tokens: int = 0
    plain_streak: int = 0
    probe_wait: int | None = None

    def straggler(self) -> float:
        """Rounds a batch needs ÷ the mean row's rounds: passes_tau ÷ longest_tokens, at least 1 (1 before any)."""
        return max(1.0, self.passes_tau / self.longest_tokens) if self.longest_tokens else 1.0


def _model_key(model):
    """A model's identity for the caches: name, forward function and weights (a drafter object keys itself, with
    its weights' identity when it carries weights)."""
    if not hasattr(model, "apply_fn"):
        leaves = jax.tree.leaves(getattr(model, "params", None))
        return (model, id(leaves[0])) if leaves else model
    leaves = jax.tree.leaves(model.params)
    return (model.name, model.apply_fn, id(leaves[0]) if leaves else 0)


class AutoGamma:
    """The ``gamma="auto"`` policy: a cost cache and running acceptance estimates (see the module docstring; one
    instance per process is enough: ``jaxspec.policy.DEFAULT``).

    Attributes:
      gammas: the candidate γ, sorted (γ = 0, plain decoding, is always a candidate).
      prior_alpha: the prior acceptance per position, and the optimistic floor of a probe.
      prior_drafts: the prior's weight in drafts.
      margin: the least expected speed-up worth speculating for.
      half_life: calls after which the acceptance counts weigh half (None: never forget).
      explore_after: plain decisions in a row before the first probe (None: never probe).
      calibrate: ``"steps"`` (default): the first call of a shape times standalone model steps only (a few small
        programs) and rounds are learned from the calls themselves; ``"loops"``: it also compiles and times every
        candidate loop (more exact first decisions, at several loop compiles).
      keep_costs: where measured costs are kept across processes (``jaxspec.policy.store``), so a later process
        skips the timing: True (default): beside the compilation cache when one is on (the CLI's default, or
        ``jaxspec.enable_compilation_cache()``), else nowhere; False: nowhere; a directory: there.
    """

    def __init__(
        self,
        gammas=GAMMAS,
        prior_alpha: float = 0.6,
        prior_drafts: int = 20,
        margin: float = 1.1,
        half_life: float | None = 8.0,
        explore_after: int | None = 8,
        calibrate: str = "steps",
        keep_costs: bool | str | os.PathLike = True,
    ):
        if not gammas or any(not isinstance(g, int) or g < 1 for g in gammas):
            raise ValueError(f"gammas must be ints >= 1, got {gammas!r}")
        if half_life is not None and not half_life > 0:
            raise ValueError(f"half_life must be None (never forget) or > 0 calls, got {half_life!r}")
        if explore_after is not None and (not isinstance(explore_after, int) or explore_after < 1):
            raise ValueError(f"explore_after must be None (never probe) or an int >= 1, got {explore_after!r}")
        if calibrate not in ("steps", "loops"):
            raise ValueError(f"calibrate must be 'steps' or 'loops', got {calibrate!r}")
        if not isinstance(keep_costs, (bool, str, os.PathLike)) or keep_costs == "":
            raise ValueError(f"keep_costs must be True, False or a directory, got {keep_costs!r}")
        self.keep_costs = keep_costs
        self.calibrate = calibrate
        self.gammas = tuple(sorted(set(gammas)))
        self.prior_alpha, self.prior_drafts, self.margin = prior_alpha, prior_drafts, margin
        self.half_life, self.explore_after = half_life, explore_after
        self._costs: dict[tuple, Costs] = {}  # (target, draft, batch, cache_len, mesh_key) -> Costs
        self._acceptance: dict[tuple, Acceptance] = {}  # (target, draft, greedy) -> counts
        self._batches: dict[tuple, BatchState] = {}  # (target, draft, greedy, batch) -> straggling, plain streak
        self._rounds: dict[tuple, dict] = {}  # costs key -> {γ: [seconds, rounds]} of the calls' own loops
        self._prefills: dict[tuple, list] = {}  # costs key -> [target prefill seconds, prompt tokens] of the calls

    def costs(self, target, draft, batch: int, cache_len: int, round_timer=None, mesh_key=None) -> Costs:
        """Measured once per key and cached (``timing.measure_costs``). ``round_timer(gammas)``: seconds per in-loop
        round for each γ (γ = 0: the plain step), as ``generate`` builds it; used with ``calibrate="loops"``
        only."""
        key = (_model_key(target), _model_key(draft), batch, cache_len, mesh_key)
        if key not in self._costs:
            path = self.cost_path(target, draft, batch, cache_len, mesh_key)
            costs = None if path is None else store.load(path, self.gammas)
            if costs is None:
                timer = round_timer if self.calibrate == "loops" else None
                costs = timing.measure_costs(target, draft, batch, cache_len, self.gammas, timer)
                if path is not None:
                    store.save(path, costs)
            self._costs[key] = costs
        return self._costs[key]

    def cost_path(self, target, draft, batch: int, cache_len: int, mesh_key=None):
        """The file where these costs are kept across processes (``keep_costs``), or None when they are not."""
        if self.keep_costs is False:
            return None
        directory = store.default_directory() if self.keep_costs is True else self.keep_costs
        if directory is None:
            return None
        return store.cost_path(directory, target, draft, batch, cache_len, mesh_key, self.gammas, self.calibrate)

    def observe_rounds(
        self, target, draft, batch: int, cache_len: int, gamma: int, seconds: float, rounds: int, mesh_key=None
    ) -> None:
        """Record that a call's loop of ``gamma`` (0: plain) ran ``rounds`` rounds in ``seconds`` (device time,
        compilation and prefill excluded) at these shapes; later decisions take r(γ) from it."""
        if rounds > 0 and seconds > 0:
            key = (_model_key(target), _model_key(draft), batch, cache_len, mesh_key)
            total = self._rounds.setdefault(key, {}).setdefault(int(gamma), [0.0, 0])
            total[0] += seconds
            total[1] += rounds

    def observe_prefill(
        self,
        target,
        draft,
        batch: int,
        cache_len: int,
        gamma: int,
        prompt_tokens: int,
        seconds: float,
        mesh_key=None,
    ) -> None:
        """Record that a call's prefill over ``prompt_tokens`` (padded) prompt tokens per row took ``seconds``
        (device time, compilation excluded; with ``gamma`` > 0 the draft's prefill included, whose measured share
        is taken off). Later decisions at these shapes take the target's prefill from these calls instead of the
        estimate ``measure_costs`` extrapolated from the target's passes."""
        key = (_model_key(target), _model_key(draft), batch, cache_len, mesh_key)
        costs = self._costs.get(key)
        if costs is None or not costs.step_s or prompt_tokens <= 0:
            return
        if gamma > 0:
            seconds -= costs.prefills(prompt_tokens)[1] * costs.step_s
        if seconds > 0:
            total = self._prefills.setdefault(key, [0.0, 0])
            total[0] += seconds
            total[1] += prompt_tokens

    def observed_prefill(self, target, draft, batch: int, cache_len: int, mesh_key=None) -> float | None:
        """Seconds of the target's prefill per (padded) prompt token, over the calls at these shapes
        (``observe_prefill``); None before any."""
        seen = self._prefills.get((_model_key(target), _model_key(draft), batch, cache_len, mesh_key))
        return seen[0] / seen[1] if seen else None

    def observed_rounds(self, target, draft, batch: int, cache_len: int, mesh_key=None) -> dict:
        """γ -> mean seconds per round of the calls' own loops at these shapes (``observe_rounds``)."""
        key = (_model_key(target), _model_key(draft), batch, cache_len, mesh_key)
        return {g: s / n for g, (s, n) in self._rounds.get(key, {}).items()}

    def set_costs(self, target, draft, batch: int, cache_len: int, costs: Costs, mesh_key=None) -> None:
        """Use ``costs`` instead of measuring them (tests, or figures measured elsewhere)."""
        self._costs[(_model_key(target), _model_key(draft), batch, cache_len, mesh_key)] = costs

    def alpha(self, target, draft, greedy: bool) -> tuple[float, int]:
        """(accepted ÷ drafted with the prior, drafts observed (aged, rounded)) of the pair in this mode."""
        counts = self._acceptance.get(self._pair(target, draft, greedy), Acceptance())
        return counts.alpha(self.prior_alpha, self.prior_drafts), int(round(counts.drafted))

    def position_acceptance(self, target, draft, greedy: bool) -> tuple[float, ...]:
        """Estimated a_i for i = 1 .. max candidate γ (see the module docstring)."""
        counts = self._acceptance.get(self._pair(target, draft, greedy), Acceptance())
        return counts.positions(max(self.gammas), self.prior_alpha, self.prior_drafts)

    def straggler(self, target, draft, greedy: bool, batch: int) -> float:
        """Rounds a batch of ``batch`` rows needs ÷ the mean row's rounds (see the module docstring)."""
        state = self._batches.get((*self._pair(target, draft, greedy), batch))
        return 1.0 if state is None else state.straggler()

    def _batch(self, target, draft, greedy: bool, batch: int) -> BatchState:
        key = (*self._pair(target, draft, greedy), batch)
        if key not in self._batches:
            self._batches[key] = BatchState(probe_wait=self.explore_after)
        return self._batches[key]

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
            state = self._batch(target, draft, greedy, batch)
            state.passes_tau += passes * tau
            state.longest_tokens += max(row_tokens)
        self._acceptance.setdefault(self._pair(target, draft, greedy), Acceptance()).add(accepted, drafted, accept_hist)

    def set_alpha(self, target, draft, greedy: bool, alpha: float, drafts: int = 10_000) -> None:
        """Overwrite the running estimate with α at every position (tests, or a value known from elsewhere)."""
        n = max(self.gammas)
        self._acceptance[self._pair(target, draft, greedy)] = Acceptance(
            alpha * drafts, drafts, [alpha * drafts] * n, [drafts] * n
        )

    def _forget(self, key) -> None:
        """Age a pair's acceptance counts by one call."""
        if self.half_life is not None and key in self._acceptance:
            self._acceptance[key].age(0.5 ** (1.0 / self.half_life))

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
        """Choose γ (0: plain decoding) for a call of ``batch`` rows (bucket), a cache of ``cache_len`` and
        ``new_tokens`` new tokens; ``prompt_tokens``: the call's padded prompt length, for the prefills (see
        ``Costs.prefills``). Measures the costs on first use of a key (``round_timer``, ``mesh_key``: see
        ``costs``), and ages the pair's acceptance counts by one call."""
        costs = self.costs(target, draft, batch, cache_len, round_timer, mesh_key)
        target_prefill, draft_prefill = costs.prefills(prompt_tokens)
        per_token = self.observed_prefill(target, draft, batch, cache_len, mesh_key)
        if per_token is not None and prompt_tokens:  # measured in earlier calls (observe_prefill)
            target_prefill = per_token * prompt_tokens / costs.step_s
        alpha, seen = self.alpha(target, draft, greedy)
        positions = self.position_acceptance(target, draft, greedy)
        observed = self.observed_rounds(target, draft, batch, cache_len, mesh_key)
        rounds = round_costs(costs, self.gammas, observed)
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
                    rounds[g],
                    straggler,
                    target_prefill,
                )
                for g in self.gammas
            }

        gains = speedups(positions)
        taus = {g: expected_tokens(positions, g) for g in self.gammas}
        best = max(gains, key=gains.get)
        state = self._batch(target, draft, greedy, batch)
        probe = False
        if gains[best] >= self.margin:
            reason = f"γ={best} expected {gains[best]:.2f}× plain"
            chosen = best
            state.plain_streak, state.probe_wait = 0, self.explore_after
        else:
            reason = f"plain: best expected speed-up {gains[best]:.2f}× (γ={best}) is below the margin {self.margin}"
            chosen = 0
            wait = cast(int, state.probe_wait)  # an int while explore_after is one (it starts as explore_after)
            if self.explore_after is not None and state.plain_streak >= wait:
                hopeful = speedups(tuple(max(a, self.prior_alpha) for a in positions))
                bet = max(hopeful, key=hopeful.get)
                if hopeful[bet] >= self.margin:
                    chosen, probe = bet, True
                    reason = (
                        f"probe: γ={bet} after {state.plain_streak} plain calls, to measure acceptance again (best "
                        f"expected {gains[best]:.2f}× at the current estimate, {hopeful[bet]:.2f}× at "
                        f"acceptance >= {self.prior_alpha})"
                    )
                    state.plain_streak, state.probe_wait = 0, 2 * wait
            if not probe:
                state.plain_streak += 1
        self._forget(self._pair(target, draft, greedy))
        return Decision(
            chosen,
            alpha,
            seen,
            positions,
            taus,
            costs.c,
            dict(costs.v),
            rounds,
            straggler,
            gains,
            reason,
            probe,
            {"target": target_prefill, "draft": draft_prefill},
        )

    @staticmethod
    def _pair(target, draft, greedy: bool) -> tuple:
        return (_model_key(target), _model_key(draft), bool(greedy))
