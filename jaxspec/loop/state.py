"""The loop's types: ``LoopSpec`` (static, hashable: part of every compiled program's key), ``LoopInputs`` (the
traced inputs of one generation) and ``State`` (the loop's carry), with where each part of the state lives on a
mesh. ``jaxspec.loop`` runs them; it re-exports every name here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding

from jaxspec.core.acceptance import BlockVerifier, RejectionSampler
from jaxspec.core.sampling import SamplingParams
from jaxspec.drafters import Drafter, NoDraft
from jaxspec.parallel import sharding

# finish reasons, as stored on device
RUNNING, FINISH_EOS, FINISH_LENGTH, FINISH_CACHE, FINISH_PADDING = 0, 1, 2, 3, 4


@dataclasses.dataclass(frozen=True)
class LoopSpec:
    """Everything static about a compiled loop (hashable, part of every compiled program's key).

    Attributes:
      target_apply, target_init_cache: the target's ``CausalLM.apply_fn`` and ``init_cache``.
      drafter: what proposes each round's drafts (``jaxspec.drafters.Drafter``: a ``ModelDrafter``, a
        ``PromptLookup``, ...); ``NoDraft()`` for plain decoding.
      gamma: drafts per round (γ); 0 is plain autoregressive decoding (one target pass per token).
      cache_len: ``S``, the length of ``State.tokens`` and of both KV caches (prompt + generated).
      vocab_size: ``V``, the target's vocabulary (the last axis of the drafts' q).
      acceptance: the rejection sampler that decides each round.
      mesh: None (one device), or a mesh: per-row arrays split over ``"data"``, caches by
        ``sharding.CACHE_AXES`` (the caller places the weights).
      prefill_chunk: the prefill reads prompts in chunks of this many positions, as many chunks as the longest
        prompt needs (a traced count), so no compiled program depends on the prompts' lengths; 0 (the default):
        ``default_chunk(cache_len)``.
    """

    target_apply: Callable
    target_init_cache: Callable
    drafter: Drafter
    gamma: int
    cache_len: int
    vocab_size: int
    acceptance: RejectionSampler = BlockVerifier()
    mesh: Mesh | None = None
    prefill_chunk: int = 0

    def __post_init__(self):
        if self.gamma == 0 and not isinstance(self.drafter, NoDraft):
            raise ValueError(f"LoopSpec: gamma=0 is plain decoding; drafter must be NoDraft(), got {self.drafter!r}")
        tree = self.drafter.tree
        if tree is not None and self.gamma != tree[0]:
            raise ValueError(f"LoopSpec: a tree drafter's gamma is its depth {tree[0]}, got gamma={self.gamma}")
        chunk = self.prefill_chunk
        if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 0:
            raise ValueError(f"LoopSpec: prefill_chunk must be an int >= 0 (0: the default), got {chunk!r}")
        if chunk == 0:
            object.__setattr__(self, "prefill_chunk", default_chunk(self.cache_len))

    def prefill_chunks(self, longest: int) -> int:
        """How many chunks the prefill runs for a longest prompt of ``longest`` tokens."""
        return -(-max(1, longest) // self.prefill_chunk)


def default_chunk(cache_len: int) -> int:
    """The prefill's chunk for a cache of ``cache_len`` positions: an eighth of it, at least 64 and at most all of
    it. The padding past the longest prompt is under a chunk, so short prompts pay for few positions, while a long
    cache (long prompts, an accelerator) gets wide chunks; wider passes cost less per position, on a CPU too
    (docs/history/cpu-costs.md: a chat prompt of 120-200 tokens reaches its first token sooner in chunks of 64 than
    of 32 or 128; only a prompt of at most 32 tokens pays for padding it would not have had)."""
    return min(cache_len, max(64, cache_len // 8))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LoopInputs:
    """The traced inputs of one generation (a pytree; new values of the same shapes do not recompile).

    Attributes:
      prompt: ``[B, T] int32`` prompts, right-padded (any value) to a length ``T <= cache_len`` (``generate`` and
        the engine pad to ``cache_len``, so the programs' shapes do not depend on the prompts).
      prompt_len: ``[B] int32`` real prompt lengths, ``1 <= prompt_len <= T``.
      max_new: ``[B] int32`` most tokens to generate per row.
      active: ``[B] bool``; False marks batch padding (such a row starts done, finish ``FINISH_PADDING``).
      seeds, row_ids: ``[B] uint32``; a row's PRNG key is ``fold_in(key(seeds[b]), row_ids[b])``.
      eos: ``[B, E] int32`` each row's end-of-sequence ids; ``-1`` marks an unused entry.
      sampling: temperature / top-k / top-p, ``[B]`` each (one value per row).
      grammar: None, or each row's constraint automaton at its initial state (``jaxspec.core.grammar.Grammar``,
        ``state [B]``): every token the target and the drafter draw is masked by its row's state.
    """

    prompt: jax.Array
    prompt_len: jax.Array
    max_new: jax.Array
    active: jax.Array
    seeds: jax.Array
    row_ids: jax.Array
    eos: jax.Array
    sampling: SamplingParams
    grammar: Any = None


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class State:
    """The loop's carry (a pytree): tokens, per-row progress and statistics, both KV caches.

    ``B`` rows, ``S = spec.cache_len``, ``γ = spec.gamma``; counters count only rounds in which the row was running.

    Attributes:
      tokens: ``[B, S] int32`` prompt then generated tokens; slots ``>= length`` are stale.
      logprobs: ``[B, S] float32`` log-probability of each generated token under the raw (unwarped) target
        logits; 0 at prompt slots and slots not yet written.
      length: ``[B] int32`` valid tokens per row (prompt included).
      prompt_len, max_new: ``[B] int32``, from ``LoopInputs``.
      done: ``[B] bool``, ``finish != RUNNING``.
      finish: ``[B] int32`` one of ``RUNNING``, ``FINISH_EOS``, ``FINISH_LENGTH``, ``FINISH_CACHE``,
        ``FINISH_PADDING``.
      row_keys: ``[B]`` typed PRNG keys; round ``r`` of row ``b`` splits ``fold_in(row_keys[b], r)`` γ+1 ways.
      eos: ``[B, E] int32`` and sampling: ``SamplingParams`` (``[B]`` fields), from ``LoopInputs``.
      rounds: ``[B] int32`` target verify passes.
      drafted, accepted: ``[B] int32`` drafts proposed (γ per round) and drafts accepted.
      accept_hist: ``[B, γ+1] int32`` rounds by number of accepted drafts.
      bad_target: ``[B] bool``: target logits that decided a token had a NaN or +inf, or no finite entry.
      bad_draft: ``[B] bool``: likewise for any draft-model step (never set by prompt lookup).
      forced: ``[B] int32`` emitted tokens that were the only token their row's constraint allowed.
      target_cache: the target's cache pytree (``init_cache(B, S)``).
      draft_state: the drafter's state (a draft model's KV cache), or None for drafters without one.
      grammar: None, or the rows' constraint automata at each row's state after its tokens so far.
    """

    tokens: jax.Array
    logprobs: jax.Array
    length: jax.Array
    prompt_len: jax.Array
    max_new: jax.Array
    done: jax.Array
    finish: jax.Array
    row_keys: jax.Array
    eos: jax.Array
    sampling: SamplingParams
    rounds: jax.Array
    drafted: jax.Array
    accepted: jax.Array
    accept_hist: jax.Array
    bad_target: jax.Array
    bad_draft: jax.Array
    forced: jax.Array
    target_cache: Any
    draft_state: Any
    grammar: Any = None


_CACHE_FIELDS = ("target_cache", "draft_state")


def state_shardings(spec: LoopSpec, state: State) -> State:
    """Where each part of the loop state lives on ``spec.mesh``: every per-row array (all but the caches) split
    over ``data`` (batch), caches by ``sharding.CACHE_AXES`` (other drafter states: left to XLA)."""
    mesh = spec.mesh
    assert mesh is not None  # callers check spec.mesh first (constrain_state, programs)

    def named(field, value):
        if value is None:
            return None
        if field in _CACHE_FIELDS:
            return sharding.cache_sharding(value, mesh)
        return jax.tree.map(lambda x: NamedSharding(mesh, sharding.batch_spec(x.ndim)), value)

    return State(**{f.name: named(f.name, getattr(state, f.name)) for f in dataclasses.fields(State)})


def constrain_state(spec: LoopSpec, state: State) -> State:
    """``state`` with sharding constraints to ``state_shardings`` on ``spec.mesh`` (unchanged without a mesh)."""
    if spec.mesh is None:
        return state
    shardings = state_shardings(spec, state)
    return State(
        **{
            f.name: sharding.constrain(getattr(state, f.name), getattr(shardings, f.name))
            for f in dataclasses.fields(State)
        }
    )


def zero_counters(spec: LoopSpec, batch: int) -> dict:
    """The per-row statistics of a fresh state: rounds, drafts, acceptances, their histogram, bad-logit flags,
    forced tokens."""
    zeros = jnp.zeros((batch,), jnp.int32)
    return dict(
        rounds=zeros,
        drafted=zeros,
        accepted=zeros,
        accept_hist=jnp.zeros((batch, spec.gamma + 1), jnp.int32),
        bad_target=jnp.zeros((batch,), bool),
        bad_draft=jnp.zeros((batch,), bool),
        forced=zeros,
    )
