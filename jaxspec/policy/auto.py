"""``gamma="auto"``: speculate with the γ that maximizes the expected speed-up (``jaxspec.policy.cost``), or decode
plainly when no γ is expected to beat plain decoding by ``margin`` (default 1.05).

``AutoGamma`` keeps, per model pair:

  * the measured ``Costs`` per (batch bucket, cache bucket, mesh), timed once from standalone model steps
    (``jaxspec.policy.timing``; with ``calibrate="loops"``, every candidate loop is compiled and timed too) and
    kept on disk for later processes when ``keep_costs`` says where (``jaxspec.policy.store``), with a load
    reference (``timing.Reference``: one small step timed with them);
  * per (batch bucket, cache bucket, mesh) and γ, the seconds per round that the calls' own loops took
    (``observe_call``), from which r(γ) is taken once a call has run that γ (``cost.round_costs``). So a first
    call compiles no loop but the one it runs. Each call's seconds are scaled by the load reference timed right
    after its loop, so that rounds and plain steps timed in different calls compare as if timed side by side on a
    machine whose other work comes and goes; r(γ) is the low median of the last ``KEEP`` calls, so one call slowed
    by a burst of other work does not move it; a call that compiled its programs is not recorded (a program's
    first run pays one-time costs). The reference is timed after the first ``REFERENCED`` calls of a γ, then after
    every ``REFERENCE_EVERY``-th; the calls in between record nothing;
  * per (batch bucket, cache bucket, mesh), the target's prefill seconds per prompt token that the calls measured
    (scaled and kept alike), which replace the first estimate (extrapolated from the target's timed passes);
  * per greedy/sampled mode, an ``Acceptance``: acceptance by draft position, a_i = P(draft i accepted | drafts
    1..i−1 accepted), counted from the accept-length histograms of earlier calls with a Beta prior of
    ``prior_alpha`` weighing ``prior_drafts`` drafts (a position never reached yet borrows the estimate of the
    one before). Every decision multiplies the counts by 0.5 ** (1 / ``half_life``) (8 calls by default), so the
    estimate follows a changing workload and the prior regains weight;
  * per mode and batch bucket, a ``BatchState``: the straggler factor s = passes × τ ÷ (longest row's tokens),
    summed over earlier calls (τ = all tokens ÷ all row-rounds; 1 at batch 1 and before any call) with a prior of
    ``STRAGGLER_PRIOR`` calls at 1, and the run of plain decisions.

Probing. The prior is a guess, not a measurement: a call for a pair whose acceptance was never measured (greedy and
sampled apart) *probes* (``Decision.probe``) with the drafter's own ``default_gamma`` (the γ its maker measured
best; the γ best at the prior for a drafter without one, or whose default is no candidate), as long as some γ
would clear the margin at the optimistic acceptance ``probe_alpha`` (0.8) at every position; its acceptance then
decides the next call. Starting there matters beyond the first call: a probe at γ measures positions 1..γ, which
every smaller γ's estimate then uses, while a larger γ's deeper positions only borrow the last one measured; and
the next calls keep the probe's γ unless another is clearly faster (below).
After ``explore_after`` plain decisions in a row (8), a probe the same way measures the acceptance again; a probe
that does not bring speculation back doubles the wait before the next one (8, 16, 32, ... calls). A batch bucket
where even the optimistic acceptance cannot pay never probes. A γ whose loop ran at the call's shapes once, in a call
that compiled it (so its rounds were not recorded), is probed too, instead of a plain decision, while its estimate
from standalone steps is at least ``MEASURE_REACH``: that estimate can be some 15 % off, and the run compiles nothing.

The margin. Speculation is chosen when its expected speed-up is at least ``margin``. Below it, plain decoding gives
up at most a factor ``margin`` against a γ whose estimate is right, and above it a γ whose costs or acceptance were
overestimated by less than ``margin`` − 1 still does not lose to plain: 1.05 keeps auto within 0.95× of both the
best γ and plain decoding for estimates within 5 %. Both bounds are the goal ``gamma="auto"`` is measured against
(docs/history/gamma-auto.md); a larger margin would leave more of a real gain on the table, a smaller one would
follow noise in the estimates.

Between calls, the last call's γ stays unless another is expected ``KEEP_GAIN`` times as fast (estimates move by a
few per cent from call to call; each γ's first call compiles its loop: SmolLM2's first four auto calls went γ = 2, 4,
2, 2 for an expected gain of 2 %, paying a second loop's 15 s compile), or ``SWITCH_GAIN`` times as fast when the
other's loop already ran at these shapes in this process (compiled: the move costs nothing).

Inside an engine run, ``decide(running=γ)`` re-decides at refills (``jaxspec.generation.regamma``): another γ when
expected ``SWITCH_GAIN`` times as fast, plain decoding when the running γ is expected to be slower than plain.

Draft trees. For a drafter that can branch (``decide(..., branching=True)``: an EAGLE head or a draft model, in
``generate`` and ``stream``) the candidates also hold the tree shapes of ``trees`` (``cost.TREES`` by default), each
with its own acceptance by depth, counted from its calls' path-length histograms (``observe(..., tree=...)``), and
its own observed rounds. A shape never measured is estimated with ``cost.tree_prior`` of the chain's acceptance
and ``Costs.tree_round_cost``, and is tried only as a probe, once the chain's acceptance is measured, when that
estimate is at least ``KEEP_GAIN`` times the best measured choice (and clears the margin): on a backend where a
pass over a tree's tokens costs several steps (XLA:CPU) no tree is tried, so auto stays with the best chain (also
over w8a8 on an AMX CPU, where a small greedy tree beats the chain by 2-5 %: the standalone timings put a pass over
its 7 tokens at 1.46-1.73 steps where its whole round costs 1.72-1.74 in the loop; docs/history/trees.md).
``Decision.tree`` is the chosen shape (``Decision.gamma`` its depth); the decision's dicts key trees by
``cost.tree_label``. An engine run's re-decisions stay among chains.

Models are told apart by name, forward function and the identity of their weights; a drafter without a model
(prompt lookup) by itself.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import statistics
from typing import cast

import jax

from jaxspec.drafters.branching import check_tree
from jaxspec.policy import store, timing
from jaxspec.policy.cost import (
    GAMMAS,
    SIBLING_GAIN,
    TREES,
    Costs,
    Decision,
    expected_speedup,
    expected_tokens,
    position_counts,
    round_costs,
    tree_label,
    tree_nodes,
    tree_prior,
)

KEEP = 16  # calls whose timings are kept per (shapes, γ): r(γ) and the prefill are their low medians
REFERENCED = 3  # a (shapes, γ) times the load reference after each call until this many calls are recorded,
REFERENCE_EVERY = 8  # then after every REFERENCE_EVERY-th call
# A run's re-decision (``AutoGamma.decide(running=...)``) moves to another γ only when it is expected this much faster:
# each change converts the run's state (compiling the conversion and the new loop on first use) and restarts the
# in-flight rows' accept histograms, which a flip between two nearly equal γ would pay for nothing.
SWITCH_GAIN = 1.02
# Between calls, the last call's γ stays unless another is expected this much faster: estimates move by a few per cent
# from call to call (the margin's 5 %), and each γ's first call compiles its loop.
KEEP_GAIN = 1.05
# The straggler factor's prior: s = 1 (rows finish together) weighing this many calls, so the factor measured over
# n calls counts n / (n + STRAGGLER_PRIOR) of its excess over 1. One batch is a noisy measure of it (SmolLM2's head at
# γ = 3 on the first 40 HumanEval problems in batches of 4: 1.31 for the first batch, 1.04–1.22 for the others, 1.14
# pooled), and plain decisions measure none, so a high first figure would otherwise stand; leaning towards
# speculation costs little, since speculative calls measure the factor.
STRAGGLER_PRIOR = 2.0
# A γ whose loop ran at these shapes once, in a call that compiled it (so its rounds were not recorded), is run again
# rather than passed over for plain decoding while its expected speed-up is at least this: its estimate comes from
# standalone steps, which put SmolLM2's round at γ = 3, batch 4, 15 % above what its loop then took (2.14 against 1.86
# plain steps), and the run costs no compile.
MEASURE_REACH = 0.9


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

    def positions(self, n: int, prior, weight: float) -> tuple[float, ...]:
        """a_i for i = 1..n with the prior: one number, where a position never reached borrows the one before (the
        prior for i = 1); or one per position, which a position never reached takes."""
        each = not isinstance(prior, (int, float))
        priors = list(prior) if each else [prior] * n
        out = []
        for i in range(n):
            if i < len(self.position_reached) and self.position_reached[i] > 0:
                out.append((self.position_accepted[i] + priors[i] * weight) / (self.position_reached[i] + weight))
            else:
                out.append(priors[i] if each or not out else out[-1])
        return tuple(out)


@dataclasses.dataclass
class BatchState:
    """What ``AutoGamma`` learns per (model pair, greedy/sampled, batch bucket).

    Attributes:
      passes_tau: Σ over observed calls of (the loop's verify passes × τ), τ = tokens ÷ row-rounds.
      longest_tokens: Σ over the same calls of the longest row's generated tokens.
      calls: the calls observed.
      plain_streak: plain decisions in a row since the last speculative (or probing) one.
      probe_wait: plain decisions in a row after which to probe (doubles after each probe; None: never probe).
      last_gamma: the γ the last call decided (0: plain decoding), or its tree shape.
    """

    passes_tau: float = 0.0
    longest_tokens: int = 0
    calls: int = 0
    plain_streak: int = 0
    probe_wait: int | None = None
    last_gamma: int | tuple = 0

    def straggler(self) -> float:
        """Rounds a batch needs ÷ the mean row's rounds: passes_tau ÷ longest_tokens, at least 1, with the prior of
        ``STRAGGLER_PRIOR`` calls at 1 (so 1 before any call)."""
        if not self.longest_tokens:
            return 1.0
        measured = max(1.0, self.passes_tau / self.longest_tokens)
        return 1.0 + (measured - 1.0) * self.calls / (self.calls + STRAGGLER_PRIOR)


def _plan(gamma):
    """A candidate as the policy keys it: γ as an int, a tree shape as a tuple of ints."""
    return tuple(int(x) for x in gamma) if isinstance(gamma, (tuple, list)) else int(gamma)


def _name(plan) -> str:
    """A candidate in words: ``γ=2`` or ``tree (5, 3, 6)``."""
    return f"tree {plan}" if isinstance(plan, tuple) else f"γ={plan}"


def _model_key(model):
    """A model's identity for the caches: name, forward function and weights (a drafter object keys itself, with
    its weights' identity when it carries weights)."""
    if not hasattr(model, "apply_fn"):
        leaves = jax.tree.leaves(getattr(model, "params", None))
        return (model, id(leaves[0])) if leaves else model
    leaves = jax.tree.leaves(model.params)
    return (model.name, model.apply_fn, id(leaves[0]) if leaves else 0)


def _shapes_key(target, draft, batch: int, cache_len: int, mesh_key) -> tuple:
    """The key of what is measured per (target, drafter, batch, cache length, mesh): costs, rounds, prefills."""
    return (_model_key(target), _model_key(draft), batch, cache_len, mesh_key)


class AutoGamma:
    """The ``gamma="auto"`` policy: a cost cache and running acceptance estimates (see the module docstring; one
    instance per process is enough: ``jaxspec.policy.DEFAULT``).

    Attributes:
      gammas: the candidate γ, sorted (γ = 0, plain decoding, is always a candidate).
      prior_alpha: the prior acceptance per position.
      prior_drafts: the prior's weight in drafts.
      margin: the least expected speed-up worth speculating for (see the module docstring).
      half_life: calls after which the acceptance counts weigh half (None: never forget).
      explore_after: plain decisions in a row before a probe measures the acceptance again (None: never probe, not
        even a pair never measured, which the prior then decides alone).
      calibrate: ``"steps"`` (default): the first call of a shape times standalone model steps only (a few small
        programs) and rounds are learned from the calls themselves; ``"loops"``: it also compiles and times every
        candidate loop (more exact first decisions, at several loop compiles).
      keep_costs: where measured costs are kept across processes (``jaxspec.policy.store``), so a later process
        skips the timing: True (default): beside the compilation cache when one is on (the CLI's default, or
        ``jaxspec.enable_compilation_cache()``), else nowhere; False: nowhere; a directory: there.
      probe_alpha: the acceptance at every position at which speculation must be able to clear the margin for a
        probe to run: what a good drafter reaches, so a pair that could pay is measured and a batch where none
        could is not.
      trees: the candidate tree shapes ``(depth, branch, width)`` for drafters that branch (() : chains only).
      sibling_gain: the prior of a shape never measured (``cost.tree_prior``).
    """

    def __init__(
        self,
        gammas=GAMMAS,
        prior_alpha: float = 0.6,
        prior_drafts: int = 20,
        margin: float = 1.05,
        half_life: float | None = 8.0,
        explore_after: int | None = 8,
        calibrate: str = "steps",
        keep_costs: bool | str | os.PathLike = True,
        probe_alpha: float = 0.8,
        trees=TREES,
        sibling_gain: float = SIBLING_GAIN,
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
        if not isinstance(probe_alpha, (int, float)) or not 0 < probe_alpha <= 1:
            raise ValueError(f"probe_alpha must be a number in (0, 1], got {probe_alpha!r}")
        self.probe_alpha = float(probe_alpha)
        self.trees = tuple(dict.fromkeys(check_tree(tree) for tree in trees or ()))  # ValueError naming "tree"
        if not isinstance(sibling_gain, (int, float)) or not 0 <= sibling_gain < 1:
            raise ValueError(f"sibling_gain must be a number in [0, 1), got {sibling_gain!r}")
        self.sibling_gain = float(sibling_gain)
        self.keep_costs = keep_costs
        self.calibrate = calibrate
        self.gammas = tuple(sorted(set(gammas)))
        self.prior_alpha, self.prior_drafts, self.margin = prior_alpha, prior_drafts, margin
        self.half_life, self.explore_after = half_life, explore_after
        self._costs: dict[tuple, Costs] = {}  # (target, draft, batch, cache_len, mesh_key) -> Costs
        self._acceptance: dict[tuple, Acceptance] = {}  # (target, draft, greedy[, tree]) -> counts
        self._batches: dict[tuple, BatchState] = {}  # (target, draft, greedy, batch) -> straggling, plain streak
        # costs key -> {γ or tree: the last KEEP calls' seconds per round}, scaled to the load the costs were timed
        # under
        self._rounds: dict[tuple, dict[int | tuple, collections.deque]] = {}
        self._prefills: dict[tuple, collections.deque] = {}  # costs key -> prefill seconds per prompt token, scaled
        self._unreferenced: dict[tuple, int] = {}  # (costs key, γ) -> calls since the last one timed with a reference
        self._references: dict[tuple, timing.Reference] = {}  # costs key -> its load reference

    def costs(self, target, draft, batch: int, cache_len: int, round_timer=None, mesh_key=None) -> Costs:
        """Measured once per key and cached (``timing.measure_costs``). ``round_timer(gammas)``: seconds per in-loop
        round for each γ (γ = 0: the plain step), as ``generate`` builds it; used with ``calibrate="loops"``
        only."""
        key = _shapes_key(target, draft, batch, cache_len, mesh_key)
        if key not in self._costs:
            path = self.cost_path(target, draft, batch, cache_len, mesh_key)
            costs = None if path is None else store.load(path, self.gammas)
            if costs is None:
                timer = round_timer if self.calibrate == "loops" else None
                reference = timing.Reference(target, batch, cache_len)
                costs = timing.measure_costs(target, draft, batch, cache_len, self.gammas, timer, reference=reference)
                if path is not None:
                    store.save(path, costs)
            else:  # kept by an earlier process: its reference is compiled now, before the call runs
                reference = timing.Reference(target, batch, cache_len)
                reference.compile()
            self._references[key] = reference
            self._costs[key] = costs
        return self._costs[key]

    def reference_seconds(self, target, draft, batch: int, cache_len: int, mesh_key=None) -> float:
        """The load reference of these costs timed now (``timing.Reference``)."""
        key = _shapes_key(target, draft, batch, cache_len, mesh_key)
        if key not in self._references:
            self._references[key] = timing.Reference(target, batch, cache_len)
        return self._references[key].time()

    def wants_reference(self, target, draft, batch: int, cache_len: int, gamma, mesh_key=None) -> bool:
        """Whether a call of ``gamma`` at these shapes should time the load reference after its loop and record its
        timings (``observe_call``): while fewer than ``REFERENCED`` of its calls are recorded, and then every
        ``REFERENCE_EVERY``-th call (a round's cost relative to a plain step barely changes, so a few calls fix it
        and the later ones only follow a slow drift). Costs without a reference (``set_costs``) record every call
        unscaled. ``gamma``: a γ, or a tree shape."""
        key = _shapes_key(target, draft, batch, cache_len, mesh_key)
        costs = self._costs.get(key)
        if costs is None:
            return False
        if not costs.reference_s:
            return True
        plan = _plan(gamma)
        kept = self._rounds.get(key, {}).get(plan, ())
        return len(kept) < REFERENCED or self._unreferenced.get((key, plan), 0) + 1 >= REFERENCE_EVERY

    def observe_call(
        self,
        target,
        draft,
        batch: int,
        cache_len: int,
        gamma,
        *,
        prefill: tuple[int, float] | None = None,
        rounds: tuple[float, int] | None = None,
        fresh: bool = False,
        mesh_key=None,
    ) -> bool:
        """Record a call's own timings: ``prefill`` = (padded prompt tokens per row, seconds), ``rounds`` = (seconds,
        rounds) of its loop of ``gamma`` (device time, compilation excluded). ``fresh``: the call compiled its
        programs, whose first run pays one-time costs (page faults, allocations): its timings are not recorded.
        Otherwise, when ``wants_reference``, the load reference is timed now and both timings are recorded scaled
        by it (``observe_prefill``, ``observe_rounds``). ``gamma``: the loop's γ, or its tree shape. Returns whether
        they were recorded."""
        key = _shapes_key(target, draft, batch, cache_len, mesh_key)
        plan = _plan(gamma)
        if fresh or not self.wants_reference(target, draft, batch, cache_len, plan, mesh_key):
            self._unreferenced[(key, plan)] = self._unreferenced.get((key, plan), 0) + 1
            return False
        self._unreferenced[(key, plan)] = 0
        costs = self._costs[key]
        reference_s = self.reference_seconds(target, draft, batch, cache_len, mesh_key) if costs.reference_s else None
        if prefill is not None:
            self.observe_prefill(target, draft, batch, cache_len, gamma, *prefill, mesh_key, reference_s=reference_s)
        if rounds is not None:
            self.observe_rounds(target, draft, batch, cache_len, gamma, *rounds, mesh_key, reference_s=reference_s)
        return True

    def _scale(self, key, reference_s: float | None) -> float:
        """Seconds measured when the reference took ``reference_s`` -> seconds under the costs' load."""
        costs = self._costs.get(key)
        if costs is None or not costs.reference_s or not reference_s or reference_s <= 0:
            return 1.0
        return costs.reference_s / reference_s

    def cost_path(self, target, draft, batch: int, cache_len: int, mesh_key=None):
        """The file where these costs are kept across processes (``keep_costs``), or None when they are not."""
        if self.keep_costs is False:
            return None
        directory = store.default_directory() if self.keep_costs is True else self.keep_costs
        if directory is None:
            return None
        return store.cost_path(directory, target, draft, batch, cache_len, mesh_key, self.gammas, self.calibrate)

    def observe_rounds(
        self,
        target,
        draft,
        batch: int,
        cache_len: int,
        gamma,
        seconds: float,
        rounds: int,
        mesh_key=None,
        *,
        reference_s: float | None = None,
    ) -> None:
        """Record that a call's loop of ``gamma`` (0: plain) ran ``rounds`` rounds in ``seconds`` (device time,
        compilation and prefill excluded) at these shapes, while the load reference took ``reference_s`` (None: as
        measured); later decisions take r(γ) from the median of the last ``KEEP`` calls of γ."""
        if rounds > 0 and seconds > 0:
            key = _shapes_key(target, draft, batch, cache_len, mesh_key)
            kept = self._rounds.setdefault(key, {}).setdefault(_plan(gamma), collections.deque(maxlen=KEEP))
            kept.append(seconds / rounds * self._scale(key, reference_s))

    def observe_prefill(
        self,
        target,
        draft,
        batch: int,
        cache_len: int,
        gamma,
        prompt_tokens: int,
        seconds: float,
        mesh_key=None,
        *,
        reference_s: float | None = None,
    ) -> None:
        """Record that a call's prefill over ``prompt_tokens`` (padded) prompt tokens per row took ``seconds``
        (device time, compilation excluded; with ``gamma`` > 0 the draft's prefill included, whose measured share
        is taken off) while the load reference took ``reference_s`` (None: as measured). Later decisions at these
        shapes take the target's prefill from the median of these calls instead of the estimate ``measure_costs``
        extrapolated from the target's passes."""
        key = _shapes_key(target, draft, batch, cache_len, mesh_key)
        costs = self._costs.get(key)
        if costs is None or not costs.step_s or prompt_tokens <= 0:
            return
        seconds *= self._scale(key, reference_s)
        if _plan(gamma) != 0:
            seconds -= costs.prefills(prompt_tokens)[1] * costs.step_s
        if seconds > 0:
            self._prefills.setdefault(key, collections.deque(maxlen=KEEP)).append(seconds / prompt_tokens)

    def observed_prefill(self, target, draft, batch: int, cache_len: int, mesh_key=None) -> float | None:
        """Seconds of the target's prefill per (padded) prompt token, the median over the last ``KEEP`` calls at
        these shapes (``observe_prefill``); None before any."""
        seen = self._prefills.get(_shapes_key(target, draft, batch, cache_len, mesh_key))
        return statistics.median_low(seen) if seen else None

    def observed_rounds(self, target, draft, batch: int, cache_len: int, mesh_key=None) -> dict:
        """γ -> seconds per round of the calls' own loops at these shapes (``observe_rounds``): the low median of the
        last ``KEEP`` calls of each γ, so one call slowed by a burst of other work does not move it."""
        key = _shapes_key(target, draft, batch, cache_len, mesh_key)
        return {g: statistics.median_low(kept) for g, kept in self._rounds.get(key, {}).items() if kept}

    def set_costs(self, target, draft, batch: int, cache_len: int, costs: Costs, mesh_key=None) -> None:
        """Use ``costs`` instead of measuring them (tests, or figures measured elsewhere)."""
        self._costs[_shapes_key(target, draft, batch, cache_len, mesh_key)] = costs

    def alpha(self, target, draft, greedy: bool) -> tuple[float, int]:
        """(accepted ÷ drafted with the prior, drafts observed (aged, rounded)) of the pair in this mode."""
        counts = self._acceptance.get(self._pair(target, draft, greedy), Acceptance())
        return counts.alpha(self.prior_alpha, self.prior_drafts), int(round(counts.drafted))

    def position_acceptance(self, target, draft, greedy: bool, n: int | None = None) -> tuple[float, ...]:
        """Estimated a_i for i = 1 .. ``n`` (default: the largest candidate γ; see the module docstring)."""
        counts = self._acceptance.get(self._pair(target, draft, greedy), Acceptance())
        return counts.positions(n or max(self.gammas), self.prior_alpha, self.prior_drafts)

    def tree_acceptance(self, target, draft, greedy: bool, tree) -> tuple[tuple[float, ...], bool]:
        """(estimated a_d for d = 1 .. depth of tree shape ``tree``, whether any of its calls was observed): its own
        counts with ``cost.tree_prior`` of the chain's estimates as the prior."""
        chain = self.position_acceptance(target, draft, greedy, tree[0])
        prior = tree_prior(chain, tree, self.sibling_gain)
        counts = self._acceptance.get((*self._pair(target, draft, greedy), tuple(tree)))
        measured = counts is not None and counts.drafted > 0
        return (counts or Acceptance()).positions(tree[0], prior, self.prior_drafts), measured

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
        tree=None,
    ) -> None:
        """Record a call's counts; ``accept_hist[n]`` = rounds in which exactly n drafts were accepted (with
        ``tree``, the call's tree shape: rounds whose accepted path was n deep, counted for that shape). With
        ``batch`` (the compiled batch size), ``passes`` (the loop's verify passes) and the rows' generated tokens
        and rounds, also the batch's straggler factor."""
        if batch is not None and passes and sum(row_rounds) and max(row_tokens, default=0):
            tau = sum(row_tokens) / sum(row_rounds)
            state = self._batch(target, draft, greedy, batch)
            state.passes_tau += passes * tau
            state.longest_tokens += max(row_tokens)
            state.calls += 1
        key = self._pair(target, draft, greedy) if tree is None else (*self._pair(target, draft, greedy), tuple(tree))
        self._acceptance.setdefault(key, Acceptance()).add(accepted, drafted, accept_hist)

    def set_alpha(self, target, draft, greedy: bool, alpha: float, drafts: int = 10_000) -> None:
        """Overwrite the running estimate with α at every position (tests, or a value known from elsewhere)."""
        n = max(self.gammas)
        self._acceptance[self._pair(target, draft, greedy)] = Acceptance(
            alpha * drafts, drafts, [alpha * drafts] * n, [drafts] * n
        )

    def _forget(self, key) -> None:
        """Age a pair's acceptance counts by one call (its trees' too)."""
        if self.half_life is None:
            return
        for k in [key, *((*key, t) for t in self.trees)]:
            if k in self._acceptance:
                self._acceptance[k].age(0.5 ** (1.0 / self.half_life))

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
        running: int | None = None,
        branching: bool = False,
    ) -> Decision:
        """Choose γ (0: plain decoding) for a call of ``batch`` rows (bucket), a cache of ``cache_len`` and
        ``new_tokens`` new tokens; ``prompt_tokens``: the call's padded prompt length, for the prefills (see
        ``Costs.prefills``). Measures the costs on first use of a key (``round_timer``, ``mesh_key``: see
        ``costs``), and ages the pair's acceptance counts by one call. ``branching``: the drafter can draft trees,
        so the shapes of ``trees`` are candidates too (module docstring; ``Decision.tree``).

        Without any acceptance measured for the pair (greedy and sampled apart) the call probes (``Decision.probe``)
        with the drafter's ``default_gamma`` (else the γ best at the prior), if some γ would clear the margin at
        acceptance ``probe_alpha``: the prior alone decides nothing. ``running``: the γ a run is decoding with, for a
        re-decision inside it (an engine's refill, once its rows' acceptance is observed), which neither ages the
        counts nor probes: another γ replaces it when expected ``SWITCH_GAIN`` times as fast, plain decoding when it
        is expected to be slower than plain (below ``margin`` when that is under 1)."""
        costs = self.costs(target, draft, batch, cache_len, round_timer, mesh_key)
        target_prefill, draft_prefill = costs.prefills(prompt_tokens)
        per_token = self.observed_prefill(target, draft, batch, cache_len, mesh_key)
        if per_token is not None and prompt_tokens:  # measured in earlier calls (observe_prefill)
            target_prefill = per_token * prompt_tokens / costs.step_s
        alpha, seen = self.alpha(target, draft, greedy)
        positions = self.position_acceptance(target, draft, greedy)
        observed = self.observed_rounds(target, draft, batch, cache_len, mesh_key)
        trees = self.trees if branching and not running else ()
        rounds = round_costs(costs, (*self.gammas, *trees), observed, greedy)
        straggler = self.straggler(target, draft, greedy, batch)

        def gain(acceptance, plan):
            depth = plan[0] if isinstance(plan, tuple) else plan
            v = costs.verify_cost(tree_nodes(plan) + 1) if isinstance(plan, tuple) else costs.v[plan]
            args = (costs.c, v, new_tokens, draft_prefill, rounds[plan], straggler, target_prefill)
            return expected_speedup(acceptance, depth, *args)

        def speedups(acceptance):
            return {g: gain(acceptance, g) for g in self.gammas}

        gains = speedups(positions)
        taus = {g: expected_tokens(positions, g) for g in self.gammas}
        tree_taus, tree_gains, unmeasured = {}, {}, []
        for tree in trees:
            accept, tree_measured = self.tree_acceptance(target, draft, greedy, tree)
            tree_taus[tree] = expected_tokens(accept, tree[0])
            tree_gains[tree] = gain(accept, tree)
            if not tree_measured:
                unmeasured.append(tree)
        best = max(gains, key=gains.get)
        default = getattr(draft, "default_gamma", None)
        start = default if isinstance(default, int) and default in gains else best  # the first probe's γ
        counts = self._acceptance.get(self._pair(target, draft, greedy))
        measured = counts is not None and counts.drafted > 0
        options = {**gains, **{t: g for t, g in tree_gains.items() if t not in unmeasured}}  # measured candidates
        top = max(options, key=lambda k: options[k])
        plain = f"plain: best expected speed-up {gains[best]:.2f}× (γ={best}) is below the margin {self.margin}"
        probe = False
        if running:  # a re-decision within a run: no probe, no streak, no aging
            floor = min(1.0, self.margin)  # leave for plain when expected slower than it (never at margin 0)
            if gains[best] >= max(floor, SWITCH_GAIN * gains[running]):
                chosen, reason = (
                    best,
                    f"γ={best} expected {gains[best]:.2f}× plain ({gains[running]:.2f}× at γ={running})",
                )
            elif gains[running] >= floor:
                chosen, reason = running, f"γ={running} expected {gains[running]:.2f}× plain: kept"
            else:
                chosen, reason = 0, f"plain: γ={running} expected {gains[running]:.2f}× plain, best {gains[best]:.2f}×"
        elif (
            measured
            and unmeasured
            and self.explore_after is not None
            and max(tree_gains[t] for t in unmeasured) >= max(self.margin, KEEP_GAIN * options[top])
        ):
            # worth measuring: a shape expected to beat the best measured choice
            tree = max(unmeasured, key=lambda t: tree_gains[t])
            chosen, probe = tree, True
            reason = (
                f"probe: tree {tree} never measured, expected {tree_gains[tree]:.2f}× plain at its prior "
                f"(best measured: {_name(top)} {options[top]:.2f}×)"
            )
            self._batch(target, draft, greedy, batch).plain_streak = 0
        elif measured and options[top] >= self.margin:
            reason = f"{_name(top)} expected {options[top]:.2f}× plain"
            chosen = top
            state = self._batch(target, draft, greedy, batch)
            last = state.last_gamma
            keep = SWITCH_GAIN if top in observed else KEEP_GAIN  # top's loop ran here: moving compiles nothing
            if last in options and last != top and options[last] >= self.margin and options[top] < keep * options[last]:
                chosen = last  # KEEP_GAIN (SWITCH_GAIN)
                reason = f"{_name(last)} expected {options[last]:.2f}× plain: kept ({_name(top)}: {options[top]:.2f}×, "
                reason += "within the margin)"
            state.plain_streak, state.probe_wait = 0, self.explore_after
        else:
            state = self._batch(target, draft, greedy, batch)
            reason, chosen = plain, 0
            wait = cast(int, state.probe_wait)  # an int while explore_after is one (it starts as explore_after)
            shapes = _shapes_key(target, draft, batch, cache_len, mesh_key)
            untimed = [  # ran here once, compiling (its rounds unrecorded), and close enough to pay; a γ that
                # compiled twice had its programs released in between, and a timing run would compile a third time
                g
                for g in self.gammas
                if g not in observed and self._unreferenced.get((shapes, g), 0) == 1 and gains[g] >= MEASURE_REACH
            ]
            if self.explore_after is not None and measured and untimed:
                chosen, probe = max(untimed, key=lambda g: gains[g]), True
                reason = (
                    f"probe: γ={chosen} expected {gains[chosen]:.2f}× plain from standalone steps; its loop ran at "
                    f"these shapes without its rounds timed (a first run): timing them ({plain})"
                )
                state.plain_streak = 0
            elif self.explore_after is not None and (not measured or state.plain_streak >= wait):
                hopeful = speedups(tuple(max(a, self.probe_alpha) for a in positions))
                hope = max(hopeful.values())
                if hope >= self.margin:  # speculation could pay: measure the acceptance now
                    # at the drafter's default γ where that could pay too, else at the γ best at the estimate
                    probed = start if hopeful[start] >= self.margin else best
                    chosen, probe = probed, True
                    why = (
                        "no acceptance measured yet for this pair"
                        if not measured
                        else f"after {state.plain_streak} plain calls, to measure acceptance again"
                    )
                    reason = (
                        f"probe: γ={probed} {why} (expected {gains[probed]:.2f}× at the current estimate, up to "
                        f"{hopeful[probed]:.2f}× at acceptance >= {self.probe_alpha})"
                    )
                    state.plain_streak = 0
                    if measured:  # a probe that does not bring speculation back doubles the wait
                        state.probe_wait = 2 * wait
            if not probe:
                state.plain_streak += 1
        if not running:
            self._batch(target, draft, greedy, batch).last_gamma = chosen
            self._forget(self._pair(target, draft, greedy))
        shape = chosen if isinstance(chosen, tuple) else None
        labels = {t: tree_label(t) for t in trees}
        return Decision(
            shape[0] if shape else chosen,
            alpha,
            seen,
            positions,
            {**taus, **{labels[t]: x for t, x in tree_taus.items()}},
            costs.c,
            {**costs.v, **{labels[t]: costs.verify_cost(tree_nodes(t) + 1) for t in trees}},
            {labels.get(g, g): r for g, r in rounds.items()},
            straggler,
            {**gains, **{labels[t]: x for t, x in tree_gains.items()}},
            reason,
            probe,
            {"target": target_prefill, "draft": draft_prefill},
            shape,
        )

    @staticmethod
    def _pair(target, draft, greedy: bool) -> tuple:
        return (_model_key(target), _model_key(draft), bool(greedy))
