"""Drafters that are not models. A draft model is any ``CausalLM``; ``PromptLookup`` drafts by copying.

Prompt lookup (n-gram) drafting: find the most recent earlier occurrence of the row's last ``n`` tokens in its
own prompt and output (largest ``n`` from ``max_ngram`` down to ``min_ngram`` that matches) and propose the γ
tokens that followed it. The proposal is deterministic, so its distribution q is one-hot and the exact rejection
sampler applies unchanged: a draft token d is accepted with probability p(d) (greedy: iff it is the argmax), and
a rejection is corrected from p with d removed. It costs no model pass and shines where outputs repeat their
context (editing, extraction, code).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class PromptLookup:
    """Prompt-lookup drafting with n-grams of ``max_ngram`` down to ``min_ngram`` tokens (static, hashable).

    Attributes:
      max_ngram, min_ngram: the longest and shortest suffix length tried (``1 <= min_ngram <= max_ngram``, else
        ``ValueError`` at construction).
      name: the drafter's name in messages (as ``CausalLM.name`` is a model's).
    """

    max_ngram: int = 3
    min_ngram: int = 1
    name: str = "prompt_lookup"

    def __post_init__(self):
        for field in ("max_ngram", "min_ngram"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"PromptLookup({field}=...) must be an int >= 1, got {value!r}")
        if self.min_ngram > self.max_ngram:
            raise ValueError(f"PromptLookup: min_ngram ({self.min_ngram}) > max_ngram ({self.max_ngram})")

    def propose(self, tokens: jax.Array, length: jax.Array, gamma: int) -> jax.Array:
        """``tokens [B, S]`` with ``length [B]`` valid tokens per row -> ``drafts [B, γ]`` (``tokens.dtype``).

        Rows with no match propose their last token repeated. A copied continuation that runs into the row's
        end repeats the copied segment (so periodic text keeps being predicted).
        """
        batch, size = tokens.shape
        slots = jnp.arange(size, dtype=jnp.int32)
        best_start = jnp.full((batch,), -1, jnp.int32)  # first token after the chosen match, -1 = none yet
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            suffix_pos = length[:, None] - n + jnp.arange(n, dtype=jnp.int32)[None]  # [B, n]
            suffix = jnp.take_along_axis(tokens, jnp.clip(suffix_pos, 0, size - 1), axis=1)
            match = jnp.ones((batch, size), bool)
            for i in range(n):  # window starting at slot j equals the suffix
                shifted = jnp.concatenate([tokens[:, i:], jnp.full((batch, i), -1, tokens.dtype)], axis=1)
                match &= shifted == suffix[:, i : i + 1]
            # the window must end before the last token (something follows it) and the suffix must exist
            valid = match & (slots[None] + n <= length[:, None] - 1) & (length[:, None] > n)
            latest = jnp.max(jnp.where(valid, slots[None], -1), axis=1)
            found = (latest >= 0) & (best_start < 0)
            best_start = jnp.where(found, latest + n, best_start)
        offsets = jnp.arange(gamma, dtype=jnp.int32)[None]
        period = jnp.maximum(length - best_start, 1)[:, None]
        idx = best_start[:, None] + offsets % period
        idx = jnp.where(best_start[:, None] >= 0, idx, length[:, None] - 1)
        return jnp.take_along_axis(tokens, jnp.clip(idx, 0, size - 1), axis=1)


def as_drafter(draft):
    """``"prompt_lookup"`` -> ``PromptLookup()``; a ``PromptLookup`` as is; anything else: None."""
    if isinstance(draft, str) and draft == "prompt_lookup":
        return PromptLookup()
    return draft if isinstance(draft, PromptLookup) else None
