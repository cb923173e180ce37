"""Analytic speedup bounds of speculative decoding, from one acceptance rate α (pure functions).

With acceptance rate α, γ drafted tokens per round, c = draft step ÷ target step and v = target verify pass over
γ+1 tokens ÷ target step:

    expected tokens per round   Σ_{i=0..γ} α^i  = (1 − α^(γ+1)) / (1 − α)
    bound A (the issue's)       Σ_{i=0..γ} α^i / (γc + 1)
    bound B (CPU-aware)         Σ_{i=0..γ} α^i / (γc + v)

These are the textbook formulas: every draft is accepted with the same probability α, independently. The
expected tokens are ``jaxspec.policy.cost.expected_tokens`` at that one α (the cost model ``gamma="auto"`` uses,
which also takes a per-position acceptance); it is computed as a sum, so α = 0 (1) and α = 1 (γ + 1) are exact.
"""

from __future__ import annotations

from jaxspec.policy.cost import expected_tokens

__all__ = ["bound_cpu", "bound_issue", "expected_tokens"]


def bound_issue(alpha: float, gamma: int, c: float) -> float:
    """Bound A: (1 − α^(γ+1)) / ((1 − α)(γc + 1))."""
    return expected_tokens(alpha, gamma) / (gamma * c + 1.0)


def bound_cpu(alpha: float, gamma: int, c: float, v: float) -> float:
    """Bound B: (1 − α^(γ+1)) / ((1 − α)(γc + v)), v = verify(γ+1 tokens) ÷ one target step."""
    return expected_tokens(alpha, gamma) / (gamma * c + v)
