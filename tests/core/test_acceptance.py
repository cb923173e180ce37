"""The acceptance rule, case by case, with outcomes fixed by the distributions or by known uniforms.

The statistical tests (test_exactness) show the output distribution is the target's; these pin down each branch
of ``RejectionSampler`` on small hand-written distributions, so a wrong branch fails with a readable name.
Vocabulary of 4 tokens; ``p`` has γ+1 rows, ``q`` γ rows.
"""

import jax
import numpy as np
import pytest

from jaxspec.core.acceptance import RejectionSampler

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
    # the correction is drawn from p minus q: token 2 has p's mass but q covers it, so only token 3 remains
    "residual removes q's mass": ([1], [HALF_12], [np.array([0, 0, 0.5, 0.5], np.float32), ONE[0]], 0, 3),
}


@pytest.mark.parametrize("name", list(CASES))
def test_case(name):
    draft, q, p, want_n, want_next = CASES[name]
    for seed in range(8):  # the outcome must not depend on the key
        n, nxt = RejectionSampler().accept_row(
            jax.random.PRNGKey(seed), np.asarray(draft, np.int32), np.stack(q), np.stack(p)
        )
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


@pytest.mark.parametrize("name", list(LIMIT_CASES))
def test_limit_case(name):
    draft, q, p, limit, want_n, want_next = LIMIT_CASES[name]
    for seed in range(8):
        args = (jax.random.PRNGKey(seed), np.asarray(draft, np.int32), np.stack(q), np.stack(p))
        n, nxt = RejectionSampler().accept_row(*args, np.int32(limit))
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
