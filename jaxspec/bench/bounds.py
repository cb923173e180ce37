"""Analytic speedup bounds of speculative decoding (pure functions, no JAX).

With acceptance rate α, γ drafted tokens per round, c = draft step ÷ target step and v = target verify pass over
γ+1 tokens ÷ target step:

    expected tokens per round   Σ_{i=0..γ} α^i  = (1 − α^(γ+1)) / (1 − α)
    bound A (the issue's)       Σ_{i=0..γ} α^i / (γc + 1)
    bound B (CPU-aware)         Σ_{i=0..γ} α^i / (γc + v)

The numerator is written as the sum, so α = 0 (1) and α = 1 (γ + 1) need no special case.
"""

from __future__ import annotations


def expected_tokens(alpha: float, gamma: int) -> float:
    """(1 − α^(γ+1)) / (1 − α) written as Σ_{i=0..γ} α^i: exact at α = 0 (1) and α = 1 (γ + 1)."""
    return float(sum(alpha**i for i in range(gamma + 1)))


def bound_issue(alpha: float, gamma: int, c: float) -> float:
    """Bound A: (1 − α^(γ+1)) / ((1 − α)(γc + 1))."""
    return expected_tokens(alpha, gamma) / (gamma * c + 1.0)


def bound_cpu(alpha: float, gamma: int, c: float, v: float) -> float:
    """Bound B: (1 − α^(γ+1)) / ((1 − α)(γc + v)), v = verify(γ+1 tokens) ÷ one target step."""
    return expected_tokens(alpha, gamma) / (gamma * c + v)
