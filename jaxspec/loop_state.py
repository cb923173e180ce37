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
from jax.sharding import PartitionSpec as P

from jaxspec import sharding
from jaxspec.acceptance import RejectionSampler
from jaxspec.drafters import PromptLookup
from jaxspec.sampling import SamplingParams

# finish reasons, as stored on device
RUNNING, FINISH_EOS, FINISH_LENGTH, FINISH_CACHE, FINISH_PADDING = 0, 1, 2, 3, 4


@dataclasses.dataclass(frozen=True)
class LoopSpec:
    """Everything static about a compiled loop (hashable, part of every compiled program's key).

    Attributes:
      target_apply, target_init_cache: the target's ``CausalLM.apply_fn`` and ``init_cache``.
      draft_apply, draft_init_cache: the draft model's, or None (plain decoding or prompt lookup).
      gamma: drafts per round (γ); 0 is plain autoregressive decoding (one target pass per token).
      cache_len: ``S``, the length of ``State.tokens`` and of both KV caches (prompt + generated).
      acceptance: the rejection sampler that decides each round.
      mesh: None (one device), or a mesh: per-row arrays split over ``"data"``, caches by
        ``sharding.CACHE_AXES`` (the caller places the weights).
      lookup: draft by prompt lookup instead of a draft model (when ``gamma > 0``).
    """

    target_apply: Callable
    target_init_cache: Callable
    draft_apply: Callable | None
    draft_init_cache: Callable | None
    gamma: int
    cache_len: int
    acceptance: RejectionSampler = RejectionSampler()
    mesh: Mesh | None = None
    lookup: PromptLookup | None = None


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LoopInputs:
    """The traced inputs of one generation (a pytree; new values of the same shapes do not recompile).

    Attributes:
      prompt: ``[B, T] int32`` prompts, right-padded (any value) to a bucketed length ``T <= cache_len``.
      prompt_len: ``[B] int32`` real prompt lengths, ``1 <= prompt_len <= T``.
      max_new: ``[B] int32`` most tokens to generate per row.
      active: ``[B] bool``; False marks batch padding (such a row starts done, finish ``FINISH_PADDING``).
      seeds, row_ids: ``[B] uint32``; a row's PRNG key is ``fold_in(key(seeds[b]), row_ids[b])``.
      eos: ``[E] int32`` end-of-sequence ids; ``-1`` marks an unused slot.
      sampling: temperature / top-k / top-p, shared by every row.
    """

    prompt: jax.Array
    prompt_len: jax.Array
    max_new: jax.Array
    active: jax.Array
    seeds: jax.Array
    row_ids: jax.Array
    eos: jax.Array
    sampling: SamplingParams


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
      eos: ``[E] int32`` and sampling: ``SamplingParams``, from ``LoopInputs``.
      rounds: ``[B] int32`` target verify passes.
      drafted, accepted: ``[B] int32`` drafts proposed (γ per round) and drafts accepted.
      accept_hist: ``[B, γ+1] int32`` rounds by number of accepted drafts.
      bad_target: ``[B] bool``: target logits that decided a token had a NaN or +inf, or no finite entry.
      bad_draft: ``[B] bool``: likewise for any draft-model step (never set by prompt lookup).
      target_cache: the target's cache pytree (``init_cache(B, S)``).
      draft_cache: the draft model's cache pytree, or None without a draft model.
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
    target_cache: Any
    draft_cache: Any


_REPLICATED_FIELDS = ("eos", "sampling")


def state_shardings(spec: LoopSpec, state: State) -> State:
    """Where each part of the loop state lives on ``spec.mesh``: per-row arrays split over ``data`` (batch),
    caches by ``sharding.CACHE_AXES``, EOS ids and sampling parameters replicated."""
    mesh = spec.mesh

    def named(field, value):
        if value is None:
            return None
        if field in ("target_cache", "draft_cache"):
            return sharding.cache_sharding(value, mesh)
        if field in _REPLICATED_FIELDS:
            return jax.tree.map(lambda _: NamedSharding(mesh, P()), value)
        return NamedSharding(mesh, sharding.batch_spec(value.ndim))

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
    """The per-row statistics of a fresh state: rounds, drafts, acceptances, their histogram, bad-logit flags."""
    zeros = jnp.zeros((batch,), jnp.int32)
    return dict(
        rounds=zeros,
        drafted=zeros,
        accepted=zeros,
        accept_hist=jnp.zeros((batch, spec.gamma + 1), jnp.int32),
        bad_target=jnp.zeros((batch,), bool),
        bad_draft=jnp.zeros((batch,), bool),
    )
