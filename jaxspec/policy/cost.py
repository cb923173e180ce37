"""The cost model of ``gamma="auto"``: expected tokens per round and the expected speed-up of speculation over
plain decoding (pure Python, no JAX; the timings it needs come from ``jaxspec.policy.timing``).

Costs are in units of one plain decoding step at the call's batch size and cache length:

    r(γ)   = one speculative round ÷ one plain step of the compiled generation loop: the draft steps, warping and
             sampling over the vocabulary, the verify pass over γ+1 tokens, the rejection sampler and the
             bookkeeping of a round. Before a call has run γ it is estimated from standalone steps as
             (γc + v(γ) + (2γ+1)s) ÷ (1 + s), s = one warp-and-draw over the vocabulary ÷ target step, corrected
             by what earlier calls of other γ measured (``round_costs``); once a call has run γ, what that call
             measured. (``AutoGamma(calibrate="loops")`` times every candidate loop up front instead.)
    c      = draft step ÷ target step                          (standalone model calls; reported)
    v(γ)   = target pass over γ+1 tokens ÷ target step         (standalone; ~1 when memory-bound, up to γ+1 when
                                                                 compute-bound)
    p, P   = draft / target prefill ÷ target step             (p standalone, timed over a few prompt tokens;
                                                                 P extrapolated from the target's timed passes
                                                                 until calls measure their own; both scaled
                                                                 linearly to the call's padded prompt)

With a_i = P(draft i accepted | drafts 1..i−1 accepted), a round emits on average

    τ(γ) = 1 + Σ_{i≤γ} Π_{j≤i} a_j          (the textbook (1 − α^(γ+1)) / (1 − α) when every a_i = α)

tokens. A call of N new tokens costs P + N steps plainly and P + p + s (N / τ) r(γ) speculatively, with τ
capped at N (a round cannot emit more than is left) and s >= 1 the straggler factor of a batch (the loop runs
until its slowest row is done). The expected speed-up is their ratio.
"""

from __future__ import annotations

import dataclasses
import numbers

GAMMAS = (1, 2, 3, 4, 6)  # the candidate γ of ``AutoGamma`` by default (3: an EAGLE-3 head's own default)
# The candidate tree shapes (depth, branch, width) of ``AutoGamma`` by default, for drafters that branch: 6, 8, 10, 27
# and 54 nodes, the sizes the tree benchmarks measured (docs/history/trees.md); the two smallest for backends where a
# pass over a few tokens costs about one (their greedy rounds, timed on a synthetic state over w8a8 on an AMX CPU,
# cost 1.0-1.3 of a γ = 3 chain round).
TREES = ((3, 2, 2), (4, 2, 2), (4, 2, 4), (5, 3, 6), (6, 4, 10))
# A greedy tree round's vocabulary-wide work per row of logits, in warp-and-draws (``Costs.sampling``): a log-softmax
# and top-k for each node whose children are chosen, an argmax for each verified node (``branching.grow`` and
# ``tree_acceptance.greedy_tree`` when every row is greedy); 0.24-0.6 of a warp-and-draw each, timed on XLA:CPU.
GREEDY_TREE_VOCAB = 0.35
# ``tree_prior``: the share of what a node's earlier siblings missed that each further sibling catches. Fit on the
# held-out chat prompts' τ with the shipped head (docs/history/trees.md: chain γ = 3 2.51, i.e. about 0.62 a
# position; trees (4, 2, 4) 3.30 and (5, 3, 6) 3.71 fit 0.45 and 0.4), never on HumanEval. Only a prior: it decides
# whether a shape is worth a probe, after which the shape's own calls measure it.
SIBLING_GAIN = 0.4


def tree_nodes(tree) -> int:
    """The draft nodes of a tree ``(depth, branch, width)``: ``branch + (depth - 1) × width``."""
    depth, branch, width = tree
    return branch + (depth - 1) * width


def tree_label(tree) -> str:
    """A tree shape as ``Decision``'s dicts key it: ``"tree:D,B,W"``."""
    return "tree:" + ",".join(str(int(x)) for x in tree)


def tree_prior(positions, tree, sibling_gain: float = SIBLING_GAIN) -> tuple[float, ...]:
    """Prior a_d, d = 1 .. depth, of a tree whose chain has acceptance ``positions`` (a_i, at least one): the
    accepted path's node at depth d − 1 offers ``m_d`` children (``branch`` at depth 1; below it the ``width``
    nodes of a level shared among the ``branch`` best of the level above, at most ``branch``), the first accepted
    with the chain's a_d and each further one catching ``sibling_gain`` of what the ones before it missed:
    1 − (1 − a_d)(1 − sibling_gain)^(m_d − 1). A position past ``positions`` borrows the last."""
    depth, branch, width = tree
    positions = list(positions)
    out = []
    for d in range(depth):
        a = positions[min(d, len(positions) - 1)]
        m = branch if d == 0 else max(1, min(branch, width // branch))
        out.append(1.0 - (1.0 - a) * (1.0 - sibling_gain) ** (m - 1))
    return tuple(out)


def interpolate(measured: dict, gammas) -> dict:
    """``{γ: v}`` for every γ of ``gammas`` from ``measured`` (at least two points): measured where timed, else
    linear in γ between the nearest timed candidates on either side, or beyond the timed range along the line
    through its two outermost points on that side."""
    known = sorted(measured)
    out = {}
    for g in gammas:
        if g in measured:
            out[g] = measured[g]
            continue
        below, above = [k for k in known if k < g], [k for k in known if k > g]
        if below and above:
            lo, hi = below[-1], above[0]
        elif below:
            lo, hi = below[-2], below[-1]
        else:
            lo, hi = above[0], above[1]
        out[g] = measured[lo] + (measured[hi] - measured[lo]) * (g - lo) / (hi - lo)
    return out


def position_counts(accept_hist) -> tuple[list[int], list[int]]:
    """Per draft position, from an accept-length histogram (``accept_hist[n]`` = rounds in which exactly n drafts
    were accepted; length γ+1): ``(reached, accepted)``, each of length γ, where ``reached[i]`` counts the rounds
    that checked draft i+1 (at least i drafts accepted) and ``accepted[i]`` those that accepted it (at least i+1).
    ``accepted[i] / reached[i]`` is P(draft i+1 accepted | the drafts before it accepted)."""
    hist = list(accept_hist)
    reached = [sum(hist[i:]) for i in range(len(hist) - 1)]
    return reached, [sum(hist[i + 1 :]) for i in range(len(hist) - 1)]


@dataclasses.dataclass(frozen=True)
class Costs:
    """Measured costs of one (model pair, batch bucket, cache bucket, mesh), in plain target steps.

    Attributes:
      c: draft step ÷ target step (0 for prompt lookup).
      v: γ -> target pass over γ+1 tokens ÷ target step.
      prefill: the draft's prefill ÷ target step, for ``prefill_tokens`` prompt tokens (per call if that is 0).
      round: γ -> an in-loop speculative round ÷ an in-loop plain step; None: ``γc + v(γ)`` is used.
      target_prefill: the target's prefill ÷ target step, for ``prefill_tokens`` prompt tokens.
      prefill_tokens: the prompt length both prefills were timed at (0: ``prefill`` is per call, unscaled).
      step_s: the unit step in seconds (0: unknown), in which rounds observed in real calls are converted
        (``round_costs``): the standalone target step, or with ``round`` (in-loop timings) the in-loop plain step.
      sampling: one warp-and-draw over the vocabulary for every row ÷ target step (0: not timed): a plain step
        does one, a round of γ about 2γ + 1 (γ draft draws, γ + 1 verified positions).
      reference_s: seconds of the load reference (``timing.Reference``) timed with these costs (0: none), by which
        calls' own timings are scaled to the load the costs were measured under.
    """

    c: float
    v: dict
    prefill: float
    round: dict | None = None
    target_prefill: float = 0.0
    prefill_tokens: int = 0
    step_s: float = 0.0
    sampling: float = 0.0
    reference_s: float = 0.0

    def prefills(self, prompt_tokens: int | None = None) -> tuple[float, float]:
        """(target, draft) prefill of a call in plain steps, scaled linearly to its (padded) prompt length; without
        a prompt length or a timed one, (0, ``prefill``)."""
        if not prompt_tokens or not self.prefill_tokens:
            return 0.0, self.prefill
        scale = prompt_tokens / self.prefill_tokens
        return self.target_prefill * scale, self.prefill * scale

    def round_cost(self, gamma, greedy: bool = False) -> float:
        """r(γ): a round in plain steps, measured in the loop when it was, else ``(γc + v(γ) + (2γ + 1) s) ÷
        (1 + s)`` with s = ``sampling`` (γc + v(γ) when it was not timed). A tree shape ``(depth, branch, width)``
        in place of γ: ``tree_round_cost`` (``greedy``: for a call whose rows are all greedy)."""
        if self.round is not None and gamma in self.round:
            return self.round[gamma]
        if isinstance(gamma, tuple):
            return self.tree_round_cost(gamma, greedy)
        s = self.sampling
        return (gamma * self.c + self.v[gamma] + (2 * gamma + 1) * s) / (1 + s)

    def verify_cost(self, tokens: int) -> float:
        """A target pass over ``tokens`` tokens ÷ a one-token step: v where timed or interpolated (``v[γ]`` is over
        γ + 1 tokens), else along the line through the timed points (``interpolate``)."""
        if tokens <= 1:
            return 1.0
        if tokens - 1 in self.v:
            return self.v[tokens - 1]
        return interpolate({0: 1.0, **self.v}, (tokens - 1,))[tokens - 1]

    def tree_round_cost(self, tree, greedy: bool = False) -> float:
        """A tree round ``(depth, branch, width)`` in plain steps, before any call has run it (module docstring):
        ``(c (1 + v(branch) + (depth − 2) v(width)) + v(n + 1) + w s) ÷ (1 + s)``, the level passes' v at their
        widths (a drafter's pass over k nodes scaled as the target's over k tokens), and ``w = 2n + 1`` warps and
        draws (each node's q and p, the drawn token), or for a call whose rows are all ``greedy`` ``GREEDY_TREE_VOCAB
        × (e + n + 1)`` (the ``e = 1 + branch + (depth − 2) width`` nodes whose children are chosen, the n + 1
        verified)."""
        depth, branch, width = tree
        n = tree_nodes(tree)
        levels = 1.0
        if depth > 1:
            levels += self.verify_cost(branch) + (depth - 2) * self.verify_cost(width)
        s = self.sampling
        expanded = 1 + (branch + (depth - 2) * width if depth > 1 else 0)
        warps = GREEDY_TREE_VOCAB * (expanded + n + 1) if greedy else 2 * n + 1
        return (self.c * levels + self.verify_cost(n + 1) + warps * s) / (1 + s)


def round_costs(costs: Costs, gammas, observed=None, greedy: bool = False) -> dict:
    """r(γ) for each of ``gammas``, in plain steps, from the costs and from ``observed``: γ -> seconds per round
    of the compiled loop, measured in earlier calls of the same shapes (γ = 0: plain decoding).

    A tree shape ``(depth, branch, width)`` may stand among ``gammas`` (and among ``observed``'s keys) for its
    rounds; unobserved, it is corrected by the nearest observed chain γ to its depth (``greedy``: the call's rows
    are all greedy, which a tree round's vocabulary work depends on: ``Costs.tree_round_cost``).

    Each round is estimated in units of a plain step as ``Costs.round_cost`` predicts it (1 + s standalone
    target steps, s = ``costs.sampling``): observed rounds as they were measured (seconds ÷ ``costs.step_s`` ÷
    (1 + s)); a plain step unobserved as 1; a speculative round unobserved as ``costs.round_cost(γ)`` times the
    correction measured at the nearest observed speculative γ (observed ÷ predicted: what the prediction leaves
    out, such as the rejection sampler and the bookkeeping of a round), 1 before any. r(γ) is then a round's
    estimate ÷ the plain step's, and at least its verify pass's v (the timed pass over γ + 1 tokens, or over a
    tree's nodes and root) or 1, whichever is lower: a round's target pass alone costs that, so a lower figure is
    timing noise (say, a standalone step timed during a burst of load), which would otherwise make speculation look
    free even at α = 0. Where v < 1 (a GPU's one-row pass is slower than its few-row one: 0.8–0.9 of a step on an
    H100/H200) a round may cost less than a plain step, as measured there. Without ``step_s`` the observations are
    not used."""
    unit = costs.step_s * (1 + (0.0 if costs.round else costs.sampling))
    seen = {g: s / unit for g, s in (observed or {}).items() if unit > 0 and s > 0}
    spec = sorted(g for g in seen if not isinstance(g, tuple) and g > 0)
    plain = seen.get(0, 1.0)
    out = {}
    for g in gammas:
        if g in seen:
            out[g] = seen[g] / plain
            continue
        factor = 1.0
        if spec:
            depth = g[0] if isinstance(g, tuple) else g  # a tree shape: corrected at the chain γ of its depth
            near = min(spec, key=lambda s: (abs(s - depth), s))
            factor = seen[near] / costs.round_cost(near)
        out[g] = costs.round_cost(g, greedy) * factor / plain

    def floor(g) -> float:
        return min(1.0, costs.verify_cost(tree_nodes(g) + 1 if isinstance(g, tuple) else g + 1))

    return {g: max(r, floor(g)) for g, r in out.items()}


@dataclasses.dataclass(frozen=True)
class Decision:
    """What ``AutoGamma.decide`` chose for a call, and everything it used (``stats.policy`` is ``as_dict()``).

    Attributes:
      gamma: the chosen γ; 0 = plain decoding.
      alpha: accepted ÷ drafted over the calls seen so far, with the prior (the prior alone before any).
      alpha_observed_drafts: drafts behind that estimate (0: the prior alone).
      position_acceptance: the a_i estimates used, i = 1 .. max candidate γ.
      tau: γ -> expected tokens per round.
      c: draft step ÷ target step.
      v: γ -> verify pass over γ+1 tokens ÷ target step.
      round_cost: γ -> a round in plain steps (``round_costs``: observed in earlier calls, or γc + v corrected).
      straggler: rounds the batch needs ÷ the mean row's (learned; 1 at batch 1 and before any call).
      expected_speedup: γ -> expected speed-up over plain decoding.
      reason: why, in words.
      probe: whether this is a probe: speculating after a run of plain decisions to measure acceptance again.
      prefill: ``"target"`` / ``"draft"`` -> this call's prefill in plain steps.
      tree: the chosen tree shape ``(depth, branch, width)`` (``gamma`` is its depth), or None (a chain, or plain).
        Tree candidates appear in ``tau``, ``v`` (the pass over the tree's nodes and root), ``round_cost`` and
        ``expected_speedup`` under ``tree_label``'s keys.
    """

    gamma: int
    alpha: float
    alpha_observed_drafts: int
    position_acceptance: tuple
    tau: dict
    c: float
    v: dict
    round_cost: dict
    straggler: float
    expected_speedup: dict
    reason: str
    probe: bool = False
    prefill: dict = dataclasses.field(default_factory=dict)
    tree: tuple | None = None

    def as_dict(self) -> dict:
        """The fields as a plain dict (``GenerateStats.policy``)."""
        return dataclasses.asdict(self)


def expected_tokens(acceptance, gamma: int) -> float:
    """τ(γ) = 1 + Σ_{i≤γ} Π_{j≤i} a_j, the expected tokens of a round with γ drafts. ``acceptance``: the a_i, or one
    number α for every position (then τ is the textbook (1 − α^(γ+1)) / (1 − α), exact at α = 0 and α = 1)."""
    one = isinstance(acceptance, numbers.Real) or getattr(acceptance, "ndim", None) == 0  # a 0-d array too
    positions = [acceptance] * gamma if one else list(acceptance)[:gamma]
    tau, run = 1.0, 1.0
    for a in positions:
        run *= a
        tau += run
    return float(tau)


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
    """Plain time ÷ speculative time for ``new_tokens`` tokens: (P + N) ÷ (P + p + s (N/τ) r) with τ capped at N
    (see the module docstring). ``alpha``: one acceptance probability for every position, or a sequence of
    per-position ones. ``round_cost`` (a round in plain steps, measured in the loop) replaces ``gamma * c + v`` when
    given; ``straggler`` multiplies the rounds a batch needs. ``prefill`` (the draft's) is paid by speculation
    only, ``target_prefill`` by both."""
    tau = min(expected_tokens(alpha, gamma), float(new_tokens))
    cost = gamma * c + v if round_cost is None else round_cost
    return (target_prefill + new_tokens) / (target_prefill + prefill + straggler * new_tokens / tau * cost)
