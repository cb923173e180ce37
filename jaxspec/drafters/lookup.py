"""Prompt lookup (n-gram) drafting, and ``LookupFirst`` (prompt lookup where it matches, another drafter elsewhere).

``PromptLookup`` finds the most recent earlier occurrence of the row's last ``n`` tokens in its own
prompt and output (largest ``n`` from ``max_ngram`` down to ``min_ngram`` that matches) and propose the γ tokens
that followed it; a row without a match abstains (``jaxspec.drafters.base``). The proposal is deterministic, so its
distribution q is one-hot and the exact rejection sampler applies unchanged: a draft token d is accepted with
probability p(d) (greedy: iff it is the argmax), and a rejection is corrected from p with d removed. It costs no model
pass and shines where outputs repeat their context (editing, extraction, code).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from jaxspec.core.model import CausalLM
from jaxspec.drafters.base import Drafter, NoDraft, Proposal
from jaxspec.drafters.draft_model import ModelDrafter


@dataclasses.dataclass(frozen=True)
class PromptLookup(Drafter):
    """Prompt-lookup drafting with n-grams of ``max_ngram`` down to ``min_ngram`` tokens (static, hashable).

    Attributes:
      max_ngram, min_ngram: the longest and shortest suffix length tried (``1 <= min_ngram <= max_ngram``, else
        ``ValueError`` at construction). A one-token match (``min_ngram=1``) is found almost always and rarely
        right, so the default shortest is 2.
      abstain: rows without a match propose nothing (``Proposal.proposed``), and a round in which no row has a
        match is a plain step instead of a verify pass over γ+1 tokens. False: such rows propose their last token
        repeated and every round verifies (as before abstaining existed; kept for comparisons).
      name: the drafter's name in messages (as ``CausalLM.name`` is a model's).
    """

    max_ngram: int = 3
    min_ngram: int = 2
    abstain: bool = True
    name: str = "prompt_lookup"

    def __post_init__(self):
        for field in ("max_ngram", "min_ngram"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"PromptLookup({field}=...) must be an int >= 1, got {value!r}")
        if self.min_ngram > self.max_ngram:
            raise ValueError(f"PromptLookup: min_ngram ({self.min_ngram}) > max_ngram ({self.max_ngram})")
        if not isinstance(self.abstain, bool):
            raise ValueError(f"PromptLookup(abstain=...) must be a bool, got {self.abstain!r}")

    def propose(self, tokens: jax.Array, length: jax.Array, gamma: int) -> jax.Array:
        """``tokens [B, S]`` with ``length [B]`` valid tokens per row -> ``drafts [B, γ]`` (``tokens.dtype``).

        Rows with no match propose their last token repeated. A copied continuation that runs into the row's
        end repeats the copied segment (so periodic text keeps being predicted).
        """
        return self.lookup(tokens, length, gamma)[0]

    def lookup(self, tokens: jax.Array, length: jax.Array, gamma: int) -> tuple[jax.Array, jax.Array]:
        """``(drafts [B, γ], found [B] bool)``: ``propose``'s drafts and which rows had a match."""
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
        return jnp.take_along_axis(tokens, jnp.clip(idx, 0, size - 1), axis=1), best_start >= 0

    def verify_widths(self, gamma: int) -> tuple[int, ...]:
        """``(0, gamma)`` when it abstains (a plain step or a verify pass), else ``(gamma,)``."""
        return (0, gamma) if self.abstain else (gamma,)

    def draft(self, params, state, tokens, length, sampling, keys, vocab_size: int) -> Proposal:
        """``lookup``'s γ tokens with a one-hot q (a deterministic proposal); with ``abstain``, rows without a
        match are marked as proposing nothing."""
        drafts, found = self.lookup(tokens, length, keys.shape[1])
        q = jax.nn.one_hot(drafts, vocab_size, dtype=jnp.float32)
        return Proposal(drafts, q, state, jnp.zeros((tokens.shape[0],), bool), found if self.abstain else None)


@dataclasses.dataclass(frozen=True)
class LookupFirst(Drafter):
    """Prompt lookup for the rows where it finds an n-gram, another drafter (a draft model, an EAGLE head) for the
    others, row by row in every round.

        head = jaxspec.eagle.load("jaxspec/smollm2-eagle3", target)
        jaxspec.generate(target, prompts, draft=jaxspec.LookupFirst(head), gamma=4)   # lookup γ 4, head γ 2

    A copied continuation is accepted often where the output repeats its context (code that restates a
    signature, extraction, edits) and costs no model pass, so those rows verify the call's γ copied tokens; the
    other rows verify ``draft_gamma`` of the fallback's drafts (its own default γ unless set, at most γ). The round
    verifies over the wider of the two only when some running row copies (``Proposal.lengths``; at batch 1 each
    round is one or the other). Exact as each drafter alone: a copied draft's q is one-hot, a drafted one's is
    the fallback's. The fallback drafts in every round, so its state follows every verified token (it catches up
    on up to γ+1 new tokens it did not draft, ``catching_up``).

    Attributes:
      drafter: the fallback: a draft ``CausalLM`` (drafted with its ``apply_fn``; its weights become ``params``)
        or a ``Drafter`` (its ``params`` attribute, if any, likewise).
      lookup: the ``PromptLookup`` tried first (its ``abstain`` is not used: a row without a match drafts with
        the fallback).
      draft_gamma: the fallback's drafts per round; None: its ``default_gamma``. Capped at the call's γ.
      params: the fallback's weights (set from ``drafter``; passed to the loop traced, not part of the key).
      name: for messages and statistics.
    """

    drafter: Any
    lookup: PromptLookup = PromptLookup()
    draft_gamma: int | None = None
    params: Any = dataclasses.field(default=None, compare=False, repr=False)
    name: str = ""
    default_gamma: ClassVar[int] = 4

    def __post_init__(self):
        fallback = self.drafter
        if isinstance(fallback, CausalLM):
            object.__setattr__(self, "params", fallback.params)
            object.__setattr__(self, "drafter", ModelDrafter.of(fallback))
        elif isinstance(fallback, Drafter) and not isinstance(fallback, (NoDraft, PromptLookup, LookupFirst)):
            object.__setattr__(self, "params", getattr(fallback, "params", None))
        else:
            raise ValueError(
                "LookupFirst(drafter=...) must be a draft jaxspec.CausalLM or a model-backed jaxspec.Drafter "
                f"(e.g. an EAGLE head), got {fallback!r}"
            )
        if not isinstance(self.lookup, PromptLookup):
            raise ValueError(f"LookupFirst(lookup=...) must be a jaxspec.PromptLookup, got {self.lookup!r}")
        g = self.draft_gamma
        if g is not None and (not isinstance(g, int) or isinstance(g, bool) or g < 1):
            raise ValueError(f"LookupFirst(draft_gamma=...) must be None or an int >= 1, got {g!r}")
        if not self.name:
            object.__setattr__(self, "name", f"lookup+{self.drafter.name}")

    @property  # the base class's is a plain class attribute; this one follows the fallback
    def features(self) -> bool:  # type: ignore[override]
        """The fallback's: True when it drafts from the target's hidden states."""
        return self.drafter.features

    @property
    def target_features(self) -> Callable:
        """The fallback's target pass with hidden states (``features`` drafters only)."""
        return self.drafter.target_features

    def fallback_gamma(self, gamma: int) -> int:
        """The fallback's drafts per round in a call at ``gamma``."""
        return min(self.draft_gamma or self.drafter.default_gamma, gamma)

    def verify_widths(self, gamma: int) -> tuple[int, ...]:
        """The fallback's widths at its γ, and ``gamma``."""
        return tuple(sorted({*self.drafter.verify_widths(self.fallback_gamma(gamma)), gamma}))

    def init_state(self, batch: int, cache_len: int) -> Any:
        """The fallback's state."""
        return self.drafter.init_state(batch, cache_len)

    def prefill(self, params, prompt, positions, state) -> Any:
        """The fallback's state after the prompt."""
        return self.drafter.prefill(params, prompt, positions, state)

    def observe(self, state, feats, positions) -> Any:
        """The fallback's state after the target's hidden states."""
        return self.drafter.observe(state, feats, positions)

    def check_target(self, target) -> None:
        """The fallback's check."""
        self.drafter.check_target(target)

    def draft(self, params, state, tokens, length, sampling, keys, vocab_size: int) -> Proposal:
        """γ copied tokens where the lookup matches, else the fallback's drafts (padded to γ, q zero past them)."""
        batch, gamma = keys.shape[:2]
        g = self.fallback_gamma(gamma)
        fallback = self.drafter.catching_up(gamma + 1).draft(
            params, state, tokens, length, sampling, keys[:, :g], vocab_size
        )
        copied, found = self.lookup.lookup(tokens, length, gamma)
        pad = gamma - g
        drafted = jnp.pad(fallback.tokens, ((0, 0), (0, pad)))
        q_drafted = jnp.pad(fallback.q, ((0, 0), (0, pad), (0, 0)))
        if fallback.lengths is not None:
            own = fallback.lengths
        elif fallback.proposed is not None:
            own = jnp.where(fallback.proposed, g, 0)
        else:
            own = jnp.full((batch,), g, jnp.int32)
        return Proposal(
            tokens=jnp.where(found[:, None], copied, drafted),
            q=jnp.where(found[:, None, None], jax.nn.one_hot(copied, vocab_size, dtype=jnp.float32), q_drafted),
            state=fallback.state,
            bad=fallback.bad & ~found,
            lengths=jnp.where(found, gamma, own).astype(jnp.int32),
        )
