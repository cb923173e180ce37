"""Drafters: what proposes the γ tokens of a round. One small protocol (``Drafter``), three implementations:
``ModelDrafter`` (a draft ``CausalLM``), ``PromptLookup`` (copying n-grams), ``NoDraft`` (plain decoding), and one
combination, ``LookupFirst`` (prompt lookup where it finds a match, another drafter elsewhere).

The protocol (a drafter is static and hashable: it is part of the compiled loop's key; its weights, if any, are
passed in as the traced ``params``):

  * ``init_state(batch, cache_len)`` -> the drafter's own state (a pytree, e.g. its KV cache; None if it has
    none), built inside jit;
  * ``prefill(params, prompt [B, T], positions [B, T], state)`` -> state, after the prompt;
  * ``draft(params, state, tokens [B, S], length [B], sampling, keys [B, γ], vocab_size)`` -> ``Proposal``:
    γ draft tokens per row, the distribution q each was drawn from (one-hot for a deterministic drafter), the
    new state, a per-row flag for non-finite logits and, optionally, which rows have anything to propose.

Abstaining: a drafter may set ``Proposal.proposed`` (``[B] bool``). When no running row proposes, the loop skips
verification and runs a plain round instead (one target pass over one token, costing one step instead of a verify
pass over γ+1 tokens), so a drafter with nothing to offer costs nothing; when some row proposes, every row is
verified as usual. A drafter that may abstain must cope with rounds it took no part in (rows that grew by one
token since its last proposal); prompt lookup, stateless, does.

Rows of different lengths: a drafter may instead set ``Proposal.lengths`` (``[B] int32``, each row's real drafts,
``<= γ``) and declare the widths a round may verify (``verify_widths(γ)``, static). The loop verifies over the
smallest declared width that holds every running row's drafts (``lax.switch``: one target pass over that many
drafts plus one token), and the rejection sampler never accepts a row's drafts past its length (its bonus token
comes from the target's distribution right after them), so each row is verified as a round of its own γ would.
Catching up: a drafter handed γ keys may find up to γ+1 new tokens since its last call, some of them its own
drafts; ``catching_up(n)`` returns a copy that copes with up to ``n`` new tokens none of which it drafted
(``LookupFirst`` asks its fallback for that: a copied round may verify more tokens than the fallback drafts).

Drafting from the target's hidden states (``features = True``, e.g. ``jaxspec.eagle.EagleDrafter``): the loop
runs the target through the drafter's ``target_features(params, tokens, positions, cache) -> (logits, hidden,
cache)`` instead of its ``apply_fn`` and hands every pass's hidden states, with their positions, to
``observe(state, hidden, positions) -> state`` (after the prefill's pass and after each verify pass).

Catching up after acceptance is the drafter's own business: ``draft`` sees each row's verified tokens and
``length``; the model drafter re-feeds the two newest tokens, so its cache is right after a rejection and after
a bonus token alike. The loop (``jaxspec.loop``) never asks which drafter it has, so a new one (an EAGLE-style
head, self-speculation with the target's own early layers) plugs in by implementing these three methods.

Prompt lookup (n-gram) drafting: find the most recent earlier occurrence of the row's last ``n`` tokens in its own
prompt and output (largest ``n`` from ``max_ngram`` down to ``min_ngram`` that matches) and propose the γ tokens
that followed it; a row without a match abstains (above). The proposal is deterministic, so its distribution q is
one-hot and the exact rejection sampler applies unchanged: a draft token d is accepted with probability p(d)
(greedy: iff it is the argmax), and a rejection is corrected from p with d removed. It costs no model pass and
shines where outputs repeat their context (editing, extraction, code).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp

from jaxspec.sampling import sample, warp


class Proposal(NamedTuple):
    """One round's drafts for every row.

    Attributes:
      tokens: ``[B, γ] int32`` draft tokens.
      q: ``[B, γ, V] float32`` the distribution each draft token was drawn from (warped like the target's).
      state: the drafter's state after drafting.
      bad: ``[B] bool``: non-finite logits in a drafting step (always False for drafters without a model).
      proposed: ``[B] bool``: rows with a real proposal; None (the default): every row. When no running row
        proposes, the loop runs a plain round instead of verifying (the module docstring).
      lengths: ``[B] int32``: each row's real drafts (the first ``lengths[b]`` of ``tokens[b]``; q is zero past
        them); None (the default): γ for every row. The round verifies over the smallest of the drafter's
        ``verify_widths`` that holds every running row's (the module docstring).
    """

    tokens: jax.Array
    q: jax.Array
    state: Any
    bad: jax.Array
    proposed: jax.Array | None = None
    lengths: jax.Array | None = None


class Drafter:
    """Base class of drafters (see the module docstring for the protocol). Subclasses are frozen dataclasses
    (static, hashable); the defaults here suit a drafter without state or weights."""

    name: str = "drafter"
    features: bool = False  # True: the loop runs the target through target_features and calls observe
    default_gamma: ClassVar[int] = 4  # the γ of a call that names none (``generate(gamma=None)``)

    def init_state(self, batch: int, cache_len: int) -> Any:
        """The drafter's state for ``batch`` rows and ``cache_len`` positions (None: stateless)."""
        return None

    def prefill(self, params, prompt: jax.Array, positions: jax.Array, state: Any) -> Any:
        """``state`` after reading the (right-padded) ``prompt``; stateless drafters return it unchanged."""
        return state

    def draft(self, params, state, tokens, length, sampling, keys, vocab_size: int) -> Proposal:
        """γ = ``keys.shape[1]`` draft tokens per row (see the module docstring)."""
        raise NotImplementedError

    def observe(self, state, feats, positions) -> Any:
        """(``features`` drafters) ``state`` after the target's hidden states ``feats [B, T, D]`` at ``positions``."""
        return state

    def check_target(self, target) -> None:
        """Raise ``ValueError`` if this drafter cannot draft for ``target`` (checked before compiling)."""

    def verify_widths(self, gamma: int) -> tuple[int, ...]:
        """The numbers of drafts a round of this drafter at ``gamma`` may verify (``Proposal.lengths``), ascending
        and ending with ``gamma``; each is one compiled target pass. Drafters that propose γ drafts for every row
        need only ``(gamma,)``."""
        return (gamma,)

    def catching_up(self, new: int) -> Drafter:
        """This drafter, able to resume after up to ``new`` verified tokens since its last call that it did not
        necessarily draft itself. Stateless drafters (and those that re-read every verified token) return
        themselves."""
        return self


def bad_logits(logits: jax.Array) -> jax.Array:
    """NaN or +inf anywhere, or no finite logit at all (reduces the last axis)."""
    return jnp.any(jnp.isnan(logits) | (logits == jnp.inf), axis=-1) | jnp.all(logits == -jnp.inf, axis=-1)


@dataclasses.dataclass(frozen=True)
class NoDraft(Drafter):
    """Plain decoding (γ = 0): proposes nothing, so every round is one target step."""

    name: str = "none"

    def draft(self, params, state, tokens, length, sampling, keys, vocab_size: int) -> Proposal:
        """Empty drafts ``[B, 0]`` and q ``[B, 0, V]``."""
        batch = tokens.shape[0]
        empty = jnp.zeros((batch, 0), jnp.int32)
        return Proposal(empty, jnp.zeros((batch, 0, vocab_size), jnp.float32), state, jnp.zeros((batch,), bool))


@dataclasses.dataclass(frozen=True)
class ModelDrafter(Drafter):
    """A draft ``CausalLM`` (its ``apply_fn`` and ``init_cache``; the weights come in as ``params``).

    Its state is its KV cache. It holds valid entries for positions ``0 .. length-3`` at least; each round's first
    step feeds the two newest tokens ``(length-2, length-1)`` (the ``catch_up`` newest, if more), then γ-1
    one-token steps, each token sampled from the warped draft logits with the round's keys.

    ``vocab_size`` is the draft's own. It may differ from the target's (Qwen2.5 0.5B's 151 936 ids drafting for
    7B's 152 064, Gemma 3 1B's 262 144 for 4B's 262 208: padded embedding tables of one tokenizer): the draft's
    logits are cut to the target's ids or padded with -inf (q = 0 there), so rejection sampling stays exact, and a
    token id past the draft's table is fed to it as its last id (its proposals after such a token are poorer,
    never wrong). The ids both models have must mean the same tokens.
    """

    apply_fn: Callable
    init_cache: Callable
    name: str = "draft"
    catch_up: int = 0
    vocab_size: int | None = None

    @classmethod
    def of(cls, model) -> ModelDrafter:
        """The drafter of a ``CausalLM``."""
        return cls(model.apply_fn, model.init_cache, model.name, vocab_size=model.vocab_size)

    def _ids(self, tokens: jax.Array) -> jax.Array:
        """Token ids the draft can embed: those past its table become its last id."""
        return tokens if self.vocab_size is None else jnp.minimum(tokens, self.vocab_size - 1)

    @staticmethod
    def _fit(logits: jax.Array, vocab_size: int) -> jax.Array:
        """Draft logits ``[..., V_draft]`` -> ``[..., vocab_size]`` (the target's): cut, or padded with -inf."""
        own = logits.shape[-1]
        if own > vocab_size:
            return logits[..., :vocab_size]
        if own < vocab_size:
            pad = [(0, 0)] * (logits.ndim - 1) + [(0, vocab_size - own)]
            return jnp.pad(logits, pad, constant_values=-jnp.inf)
        return logits

    def init_state(self, batch: int, cache_len: int):
        """A fresh KV cache (``init_cache(batch, cache_len)``)."""
        return self.init_cache(batch, cache_len)

    def catching_up(self, new: int) -> ModelDrafter:
        """A copy whose first step feeds (at least) the ``new`` newest tokens."""
        return dataclasses.replace(self, catch_up=max(self.catch_up, new))

    def prefill(self, params, prompt, positions, state):
        """The cache after a forward pass over the prompt."""
        return self.apply_fn(params, self._ids(prompt), positions, state)[1]

    def draft(self, params, state, tokens, length, sampling, keys, vocab_size: int) -> Proposal:
        """γ draft-model steps (the first over the two newest tokens, or the ``catch_up`` newest)."""
        gamma = keys.shape[1]
        rows = jnp.arange(tokens.shape[0])[:, None]
        pos_last = length - 1
        feed = max(2, self.catch_up)
        fed = jnp.maximum(length[:, None] - feed + jnp.arange(feed, dtype=jnp.int32), 0)
        logits, cache = self.apply_fn(params, self._ids(tokens[rows, fed]), fed, state)
        last = self._fit(logits[:, -1], vocab_size)
        q0 = warp(last, sampling)
        d1 = jax.vmap(sample)(keys[:, 0], q0)
        bad = bad_logits(last)

        def step(carry, xs):
            cache, tok, bad = carry
            key, offset = xs
            logits, cache = self.apply_fn(params, self._ids(tok[:, None]), (pos_last + offset)[:, None], cache)
            logits = self._fit(logits[:, 0], vocab_size)
            q = warp(logits, sampling)
            nxt = jax.vmap(sample)(key, q)
            return (cache, nxt, bad | bad_logits(logits)), (nxt, q)

        (cache, _, bad), (rest, q_rest) = jax.lax.scan(
            step, (cache, d1, bad), (keys[:, 1:].T, jnp.arange(1, gamma, dtype=jnp.int32))
        )
        drafts = jnp.concatenate([d1[:, None], rest.T], axis=1)
        q = jnp.concatenate([q0[:, None], jnp.swapaxes(q_rest, 0, 1)], axis=1)
        return Proposal(drafts, q, cache, bad)


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

        head = jaxspec.eagle.load("jaxspec/smollm2-eagle", target)
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
        from jaxspec.model import CausalLM  # the model module does not import drafters; this one stays light

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

    @property
    def features(self) -> bool:
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


def as_drafter(draft):
    """``"prompt_lookup"`` -> ``PromptLookup()``; a ``Drafter`` (``PromptLookup`` or any other) as is; anything
    else (a draft ``CausalLM``, None): None."""
    if isinstance(draft, str) and draft == "prompt_lookup":
        return PromptLookup()
    return draft if isinstance(draft, Drafter) else None
