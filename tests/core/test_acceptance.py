"""The acceptance rules, case by case, with outcomes fixed by the distributions or by known uniforms.

The statistical tests (test_exactness) show the output distribution is the target's; these pin down each branch
of ``RejectionSampler`` and ``BlockVerifier`` on small hand-written distributions, so a wrong branch fails with a
readable name. Vocabulary of 4 tokens; ``p`` has γ+1 rows, ``q`` γ rows. At the end, block verification on random
three-token "models" against exact enumeration: its output distribution and its expected accepted drafts.
"""

import itertools

import jax
import numpy as np
import pytest
import scipy.stats
from helpers import PrefixRatioOnly

from jaxspec.core.acceptance import BlockVerifier, RejectionSampler

RULES = {"token": RejectionSampler(), "block": BlockVerifier()}

ONE = np.eye(4, dtype=np.float32)
HALF_01 = np.array([0.5, 0.5, 0, 0], np.float32)
HALF_12 = np.array([0, 0.5, 0.5, 0], np.float32)

# name: (draft tokens, q rows, p rows, expected accepted count, expected next token) -- outcomes that hold for any key
CASES = {
    # greedy verification: one-hot p and q
    "greedy, all accepted, bonus from p[γ]": ([1, 2], [ONE[1], ONE[2]], [ONE[1], ONE[2], ONE[3]], 2, 3),
    "greedy, first rejected, correction = target's token": ([1, 2], [ONE[1], ONE[2]], [ONE[0], ONE[2], ONE[3]], 0, 0),
    "greedy, second rejected": ([1, 2], [ONE[1], ONE[2]], [ONE[1], ONE[3], ONE[0]], 1, 3),
    # p(d) >= q(d): accepted whatever u is
    "p above q at every draft, bonus": ([0, 1], [HALF_01, HALF_12], [ONE[0], ONE[1], ONE[2]], 2, 2),
    # p(d) = 0: rejected whatever u is; residual max(0, p - q) is one-hot here
    "p zero at the draft, residual one token": ([2], [HALF_12], [HALF_01, ONE[3]], 0, 0),
    "accepted then p zero, residual at position 1": ([1, 2], [ONE[1], HALF_12], [ONE[1], HALF_01, ONE[3]], 1, 0),
    # a draft the target rules out, then one with a vanishing q (p/q overflows, or q reads as 0 where denormals are
    # flushed): nothing accepted, the correction from max(0, p_0 - q_0)
    "ruled out, then an overflowing ratio": (
        [1, 2],
        [HALF_12, np.array([0.5, 0.5, 1e-45, 0], np.float32)],
        [ONE[0], np.array([0, 0.5, 0.5, 0], np.float32), ONE[3]],
        0,
        0,
    ),
    # the correction is drawn from p minus q: token 2 has p's mass but q covers it, so only token 3 remains
    "residual removes q's mass": ([1], [HALF_12], [np.array([0, 0, 0.5, 0.5], np.float32), ONE[0]], 0, 3),
}


@pytest.mark.parametrize("rule", list(RULES))
@pytest.mark.parametrize("name", list(CASES))
def test_case(name, rule):
    draft, q, p, want_n, want_next = CASES[name]
    for seed in range(8):  # the outcome must not depend on the key
        n, nxt = RULES[rule].accept_row(jax.random.PRNGKey(seed), np.asarray(draft, np.int32), np.stack(q), np.stack(p))
        assert (int(n), int(nxt)) == (want_n, want_next), f"{name}, seed {seed}"


def test_batched_rows_are_independent_cases():
    """The vmapped call gives each row its own case's outcome (rows of different cases side by side)."""
    names = [k for k in CASES if len(CASES[k][0]) == 2]
    draft = np.asarray([CASES[k][0] for k in names], np.int32)
    q = np.stack([np.stack(CASES[k][1]) for k in names])
    p = np.stack([np.stack(CASES[k][2]) for k in names])
    keys = jax.random.split(jax.random.PRNGKey(0), len(names))
    n, nxt = RejectionSampler()(keys, draft, q, p)
    assert list(zip(np.asarray(n).tolist(), np.asarray(nxt).tolist())) == [tuple(CASES[k][3:]) for k in names]


def test_partial_acceptance_follows_the_uniform():
    """p(d)/q(d) = 0.4: accepted exactly when the key's uniform is below 0.4 (u derived from the key as the rule's
    documented first split), and a rejection then draws from normalize(max(0, p - q)), which is token 0 here."""
    q = np.array([[0, 1, 0, 0]], np.float32)  # draft always proposes token 1
    p = np.array([[0.6, 0.4, 0, 0], ONE[2]], np.float32)
    outcomes = {0: 0, 1: 0}
    for seed in range(40):
        key = jax.random.PRNGKey(seed)
        u = float(jax.random.uniform(jax.random.split(key)[0], (1,))[0])
        n, nxt = RejectionSampler().accept_row(key, np.array([1], np.int32), q, p)
        want = (1, 2) if u < 0.4 else (0, 0)  # accepted: bonus from p[1] = token 2; rejected: residual = token 0
        assert (int(n), int(nxt)) == want, f"seed {seed}, u={u:.3f}"
        outcomes[int(n)] += 1
    assert outcomes[0] and outcomes[1]  # both branches were exercised


def test_gamma_zero_is_plain_sampling():
    p = np.array([ONE[3]], np.float32)
    n, nxt = RejectionSampler().accept_row(
        jax.random.PRNGKey(0), np.zeros((0,), np.int32), np.zeros((0, 4), np.float32), p
    )
    assert (int(n), int(nxt)) == (0, 3)


# name: (draft tokens, q rows, p rows, limit, expected accepted count, expected next token). A row with fewer real
# drafts than the round verifies (``limit``; q zero past them): nothing past the limit is accepted, and a row that
# accepts all its drafts draws its bonus from p[limit], exactly as a round of γ = limit would.
LIMIT_CASES = {
    "greedy, limit 2 of 3, both accepted: bonus from p[2], not the third draft": (
        [1, 2, 3],
        [ONE[1], ONE[2], np.zeros(4, np.float32)],
        [ONE[1], ONE[2], ONE[0], ONE[3]],
        2,
        2,
        0,
    ),
    "limit 0: a plain step, the token from p[0] (the pad draft matches p but is not taken)": (
        [3, 3],
        [np.zeros(4, np.float32)] * 2,
        [ONE[3], ONE[3], ONE[3]],
        0,
        0,
        3,
    ),
    "limit 1, first rejected: the residual at position 0 as usual": (
        [1, 2],
        [ONE[1], np.zeros(4, np.float32)],
        [ONE[0], ONE[2], ONE[3]],
        1,
        0,
        0,
    ),
    "limit = γ: as without a limit": ([1, 2], [ONE[1], ONE[2]], [ONE[1], ONE[2], ONE[3]], 2, 2, 3),
}


@pytest.mark.parametrize("rule", list(RULES))
@pytest.mark.parametrize("name", list(LIMIT_CASES))
def test_limit_case(name, rule):
    draft, q, p, limit, want_n, want_next = LIMIT_CASES[name]
    for seed in range(8):
        args = (jax.random.PRNGKey(seed), np.asarray(draft, np.int32), np.stack(q), np.stack(p))
        n, nxt = RULES[rule].accept_row(*args, np.int32(limit))
        assert (int(n), int(nxt)) == (want_n, want_next), f"{name}, seed {seed}"


def test_without_the_limit_the_pad_drafts_would_be_taken():
    """Negative control for the limit cases: the same rows without a limit accept past it (so the limit is what
    stops them), and the batched call applies each row's own limit."""
    names = [k for k in LIMIT_CASES if len(LIMIT_CASES[k][0]) == 2]
    for name in names[:1]:
        draft, q, p, limit, want_n, _ = LIMIT_CASES[name]
        n, _ = RejectionSampler().accept_row(
            jax.random.PRNGKey(0), np.asarray(draft, np.int32), np.stack(q), np.stack(p)
        )
        assert int(n) > want_n, name
    draft = np.asarray([LIMIT_CASES[k][0] for k in names], np.int32)
    q = np.stack([np.stack(LIMIT_CASES[k][1]) for k in names])
    p = np.stack([np.stack(LIMIT_CASES[k][2]) for k in names])
    limits = np.asarray([LIMIT_CASES[k][3] for k in names], np.int32)
    keys = jax.random.split(jax.random.PRNGKey(0), len(names))
    n, nxt = RejectionSampler()(keys, draft, q, p, limits)
    assert list(zip(np.asarray(n).tolist(), np.asarray(nxt).tolist())) == [tuple(LIMIT_CASES[k][4:]) for k in names]


# Block verification against exact enumeration. A "model" here is a table of next-token distributions over a
# three-token vocabulary for every prefix of up to γ tokens (target and draft alike), so the joint distribution of
# a round's γ + 1 output tokens can be enumerated exactly: a round emits its n accepted drafts and one more token,
# and the rest of the γ + 1 are drawn from the target's table, as the next rounds would (they are exact by the
# same argument). NumPy builds every expected value below; nothing of jaxspec's is used for them.

SMALL_V, BLOCK_GAMMA, MC_ROWS = 3, 3, 60_000


def _tables(seed: int, concentration: float) -> list[np.ndarray]:
    """``tables[k]``: shape ``(V,) * k + (V,)``, the next-token distribution after each prefix of k tokens."""
    rng = np.random.default_rng(seed)
    return [rng.dirichlet(np.full(SMALL_V, concentration), size=(SMALL_V,) * k) for k in range(BLOCK_GAMMA + 2)]


def _dist(tables, prefix) -> np.ndarray:
    return tables[len(prefix)][tuple(prefix)]


def _target_joint(target) -> np.ndarray:
    """P(x_1 .. x_{γ+1}) under the target, ``[V] * (γ+1)``."""
    joint = np.zeros((SMALL_V,) * (BLOCK_GAMMA + 1))
    for seq in itertools.product(range(SMALL_V), repeat=BLOCK_GAMMA + 1):
        joint[seq] = np.prod([_dist(target, seq[:j])[seq[j]] for j in range(BLOCK_GAMMA + 1)])
    return joint


def _expected_accepted(target, draft, block: bool) -> float:
    """E[n] by enumeration of every draft: the token rule's Σ_i Π_{j<=i} min(1, p/q), or block verification's
    stopping probabilities (the formulas of ``BlockVerifier``'s docstring, written out in NumPy)."""
    total = 0.0
    for x in itertools.product(range(SMALL_V), repeat=BLOCK_GAMMA):
        p = [_dist(target, x[:i]) for i in range(BLOCK_GAMMA)]
        q = [_dist(draft, x[:i]) for i in range(BLOCK_GAMMA)]
        chance = np.prod([q[i][x[i]] for i in range(BLOCK_GAMMA)])
        if not block:
            total += chance * sum(
                np.prod([min(1.0, p[j][x[j]] / q[j][x[j]]) for j in range(i + 1)]) for i in range(BLOCK_GAMMA)
            )
            continue
        w = [1.0]
        for i in range(BLOCK_GAMMA):
            w.append(min(1.0, w[-1] * p[i][x[i]] / q[i][x[i]]))
        h = [0.0] * (BLOCK_GAMMA + 1)
        for i in range(1, BLOCK_GAMMA):
            mass = np.maximum(w[i] * p[i] - q[i], 0).sum()
            h[i] = mass / (mass + 1 - w[i]) if mass + 1 - w[i] > 0 else 0.0
        h[BLOCK_GAMMA] = w[BLOCK_GAMMA]
        none_later = 1.0
        for i in range(BLOCK_GAMMA, 0, -1):
            total += chance * none_later * h[i] * i
            none_later *= 1 - h[i]
    return total


def _rows(tables, prefixes: np.ndarray) -> np.ndarray:
    """The table's distribution after each row's prefix (``[N, k]``): ``[N, V]``."""
    return np.broadcast_to(tables[prefixes.shape[1]][tuple(prefixes.T)], (len(prefixes), SMALL_V))


def _sample_rows(tables, prefixes: np.ndarray, rng) -> np.ndarray:
    """One token per row from the table's distribution after each row's prefix (``[N, k]``)."""
    probs = _rows(tables, prefixes)
    return (rng.random((len(prefixes), 1)) > np.cumsum(probs, axis=1)).sum(axis=1).clip(0, SMALL_V - 1)


def _round_outputs(rule, target, draft, seed: int):
    """``MC_ROWS`` rounds of ``rule`` on drafts sampled from the draft's table: ``(n [N], tokens [N, γ+1])``, the
    round's emitted tokens extended to γ + 1 from the target's table."""
    rng = np.random.default_rng(seed)
    x = np.zeros((MC_ROWS, 0), np.int64)
    for _ in range(BLOCK_GAMMA):
        x = np.concatenate([x, _sample_rows(draft, x, rng)[:, None]], axis=1)
    q = np.stack([_rows(draft, x[:, :i]) for i in range(BLOCK_GAMMA)], axis=1).astype(np.float32)
    p = np.stack([_rows(target, x[:, :i]) for i in range(BLOCK_GAMMA + 1)], axis=1).astype(np.float32)
    keys = jax.random.split(jax.random.PRNGKey(seed), MC_ROWS)
    n, nxt = (np.asarray(a) for a in jax.jit(rule)(keys, x.astype(np.int32), q, p))
    out = np.where(np.arange(BLOCK_GAMMA + 1)[None] < n[:, None], np.pad(x, ((0, 0), (0, 1))), 0)
    out[np.arange(MC_ROWS), n] = nxt
    for j in range(1, BLOCK_GAMMA + 1):  # positions after the round's last token: from the target's table
        later = j > n
        if later.any():
            out[later, j] = _sample_rows(target, out[later, :j], rng)
    return n, out


def _fit_p_value(tokens: np.ndarray, joint: np.ndarray) -> float:
    counts = np.zeros(joint.size)
    np.add.at(counts, np.ravel_multi_index(tokens.T, joint.shape), 1)
    expected = joint.ravel() * len(tokens)
    big = expected >= 5  # cells expected below 5 are merged into one
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    return float(scipy.stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue)


BLOCK_CASES = {"flat": (11, 1.0), "peaked": (12, 0.3)}


@pytest.mark.parametrize("case", list(BLOCK_CASES))
def test_block_verification_gives_the_target_distribution(case):
    seed, concentration = BLOCK_CASES[case]
    target, draft = _tables(seed, concentration), _tables(seed + 100, concentration)
    joint = _target_joint(target)
    _, tokens = _round_outputs(BlockVerifier(), target, draft, seed)
    assert _fit_p_value(tokens, joint) > 1e-3
    _, wrong = _round_outputs(PrefixRatioOnly(), target, draft, seed)
    assert _fit_p_value(wrong, joint) < 1e-6, "the negative control passed: the test cannot tell"


@pytest.mark.parametrize("case", list(BLOCK_CASES))
def test_block_verification_accepts_more_drafts_than_the_token_rule(case):
    """Each rule's mean accepted count matches its enumerated expectation, and block verification's is higher."""
    seed, concentration = BLOCK_CASES[case]
    target, draft = _tables(seed, concentration), _tables(seed + 100, concentration)
    means = {}
    for name, rule in RULES.items():
        n, _ = _round_outputs(rule, target, draft, seed)
        want = _expected_accepted(target, draft, block=name == "block")
        assert abs(n.mean() - want) < 5 * n.std() / np.sqrt(MC_ROWS), (name, n.mean(), want)
        means[name] = want
    assert means["block"] > means["token"] + 0.02, means
