"""The drafter protocol: what proposes the γ tokens of a round (``Drafter``, ``Proposal``), and ``NoDraft`` (plain
decoding). The implementations live beside it: ``draft_model.ModelDrafter`` (a draft ``CausalLM``),
``lookup.PromptLookup`` (copying n-grams) and ``lookup.LookupFirst`` (prompt lookup where it finds a match, another
drafter elsewhere), ``eagle.EagleDrafter`` (a head over the target's hidden states).

The protocol (a drafter is static and hashable: it is part of the compiled loop's key; its weights, if any, are
passed in as the traced ``params``):

  * ``init_state(batch, cache_len)`` -> the drafter's own state (a pytree, e.g. its KV cache; None if it has
    none), built inside jit;
  * ``prefill(params, prompt [B, C], positions [B, C], state)`` -> state, after a part of the prompt: the loop
    reads prompts in consecutive chunks of C positions (``jaxspec.loop.LoopSpec.prefill_chunk``) and calls it once
    per chunk, in order, after the target's pass over that chunk (and, for a ``features`` drafter, its
    ``observe``); positions past a row's prompt hold padding;
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
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp


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


class TreeProposal(NamedTuple):
    """One round's draft tree for every row (``Drafter.draft_tree``): node 0 is the root (the newest verified token,
    not drafted), nodes ``1..N`` the candidates, parents before children (``jaxspec.core.tree_acceptance``).

    Attributes:
      tokens: ``[B, N+1] int32`` (``tokens[:, 0]`` unused).
      parent: ``[B, N+1] int32``, -1 for the root.
      rank: ``[B, N+1] int32``: a node's place among its siblings, in the order they were drawn.
      q: ``[B, N+1, V] float32``: the warped distribution each node's children were drawn from, without
        replacement (zeros at the deepest level, which has no children, and everywhere when every row is greedy:
        greedy acceptance reads only the target's argmax).
      state: the drafter's state after drafting.
      bad: ``[B] bool``: non-finite logits in a drafting pass.
    """

    tokens: jax.Array
    parent: jax.Array
    rank: jax.Array
    q: jax.Array
    state: Any
    bad: jax.Array


class Drafter:
    """Base class of drafters (see the module docstring for the protocol). Subclasses are frozen dataclasses
    (static, hashable); the defaults here suit a drafter without state or weights."""

    name: str = "drafter"
    features: bool = False  # True: the loop runs the target through target_features and calls observe
    default_gamma: ClassVar[int] = 4  # the γ of a call that names none (``generate(gamma=None)``)
    # (depth, branch, width) for a drafter whose rounds draft a tree (``draft_tree``, verified by
    # ``jaxspec.loop.tree``); None: chains. Drafters that can branch set it (``EagleDrafter.with_tree``).
    tree: tuple[int, int, int] | None = None

    def init_state(self, batch: int, cache_len: int) -> Any:
        """The drafter's state for ``batch`` rows and ``cache_len`` positions (None: stateless)."""
        return None

    def prefill(self, params, prompt: jax.Array, positions: jax.Array, state: Any) -> Any:
        """``state`` after reading the tokens ``prompt`` at ``positions`` (a chunk of the right-padded prompt, the
        chunks in order); stateless drafters return it unchanged."""
        return state

    def draft(self, params, state, tokens, length, sampling, keys, vocab_size: int) -> Proposal:
        """γ = ``keys.shape[1]`` draft tokens per row (see the module docstring)."""
        raise NotImplementedError

    def draft_tree(
        self, params, state, tokens, length, sampling, keys, vocab_size: int, *, depth: int, branch: int, width: int
    ) -> TreeProposal:
        """(drafters that can branch, ``tree`` set) a tree of ``branch + (depth - 1) × width`` candidates per row,
        ``keys [B, depth]`` (``jaxspec.drafters.eagle.EagleDrafter.draft_tree``)."""
        raise NotImplementedError(f"{type(self).__name__} does not draft trees")

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
