"""Device side of continuous batching: slots, prefill-and-insert, and an idle state.

The engine (``jaxspec.generation.engine``) keeps one loop ``State`` of ``B`` rows (the slots) on device. When slots free
up it prefills ``k`` waiting prompts as a small batch (``rounds.prefill``) and scatters those rows into the chosen slots
of every per-row array and of both caches (``insert``), in one compiled program per (k, prompt bucket) that donates
the old state; decoding then goes on with ``programs.rounds_program`` until enough rows finish. Nothing here depends on
which model or drafter runs: a cache's batch axis is found by asking its factory for one and for two rows.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from jaxspec.core.sampling import SamplingParams
from jaxspec.loop.programs import Program
from jaxspec.loop.rounds import prefill
from jaxspec.loop.state import (
    FINISH_PADDING,
    LoopInputs,
    LoopSpec,
    State,
    constrain_state,
    state_shardings,
    zero_counters,
)


def batch_axes(init_fn, cache_len: int):
    """The batch axis of every leaf of ``init_fn(batch, cache_len)`` (a pytree like it, of ints; None for a leaf
    whose shape does not depend on the batch), found from the shapes of one and two rows (no compute).

    Raises ``ValueError`` for a leaf whose shape changes along more than one axis."""
    one = jax.eval_shape(lambda: init_fn(1, cache_len))
    two = jax.eval_shape(lambda: init_fn(2, cache_len))

    def axis(a, b):
        diff = [i for i, (x, y) in enumerate(zip(a.shape, b.shape)) if x != y]
        if len(diff) > 1:
            raise ValueError(f"cache leaf of shape {a.shape} changes along several axes with the batch size")
        return diff[0] if diff else None

    return jax.tree.map(axis, one, two)


def _scatter(big: jax.Array, small: jax.Array, axis: int | None, slots: jax.Array) -> jax.Array:
    """``big`` with its rows ``slots`` along ``axis`` replaced by ``small``'s rows (slots out of range: dropped)."""
    if axis is None:
        return big
    index = (slice(None),) * axis + (slots,)
    return big.at[index].set(small.astype(big.dtype), mode="drop")


def insert(spec: LoopSpec, state: State, new: State, slots: jax.Array) -> State:
    """``state`` (``B`` rows) with row ``i`` of ``new`` (``k`` rows) written into slot ``slots[i]``, in every
    per-row array and in both caches; ``slots[i] >= B`` drops row ``i`` (bucket padding)."""
    target_axes = batch_axes(spec.target_init_cache, spec.cache_len)
    draft_axes = batch_axes(spec.drafter.init_state, spec.cache_len)
    fields = {}
    for f in dataclasses.fields(State):
        big, small = getattr(state, f.name), getattr(new, f.name)
        if f.name == "target_cache":
            fields[f.name] = jax.tree.map(lambda a, b, x: _scatter(b, x, a, slots), target_axes, big, small)
        elif f.name == "draft_state":
            fields[f.name] = jax.tree.map(lambda a, b, x: _scatter(b, x, a, slots), draft_axes, big, small)
        else:
            fields[f.name] = jax.tree.map(lambda b, x: _scatter(b, x, 0, slots), big, small)
    return constrain_state(spec, State(**fields))


def refill(spec: LoopSpec, target_params, draft_params, state: State, inputs: LoopInputs, slots: jax.Array):
    """Prefill the ``k`` prompts of ``inputs`` and insert them into ``slots [k]`` of ``state`` (one program)."""
    return insert(spec, state, prefill(spec, target_params, draft_params, inputs), slots)


refill_program = Program(refill, donate_argnums=(3,))


def empty_state(spec: LoopSpec, batch: int, eos_width: int = 4) -> State:
    """A loop state of ``batch`` idle slots (every row done, ``FINISH_PADDING``; ``eos [batch, eos_width]``), zero
    caches, built on device and placed by ``state_shardings`` on ``spec.mesh``."""
    return _empty_fn(spec, batch, eos_width)()


@functools.cache
def _empty_fn(spec: LoopSpec, batch: int, eos_width: int):
    def make() -> State:
        ones = jnp.ones((batch,), jnp.int32)
        keys = jax.vmap(lambda i: jax.random.fold_in(jax.random.key(0), i))(jnp.arange(batch, dtype=jnp.uint32))
        state = State(
            tokens=jnp.zeros((batch, spec.cache_len), jnp.int32),
            logprobs=jnp.zeros((batch, spec.cache_len), jnp.float32),
            length=ones,
            prompt_len=ones,
            max_new=ones,
            done=jnp.ones((batch,), bool),
            finish=jnp.full((batch,), FINISH_PADDING, jnp.int32),
            row_keys=keys,
            eos=jnp.full((batch, eos_width), -1, jnp.int32),
            sampling=SamplingParams.create(0.0, batch=batch),
            **zero_counters(spec, batch),
            target_cache=spec.target_init_cache(batch, spec.cache_len),
            draft_state=spec.drafter.init_state(batch, spec.cache_len),
        )
        return constrain_state(spec, state)

    if spec.mesh is None:
        return jax.jit(make)
    return jax.jit(make, out_shardings=state_shardings(spec, jax.eval_shape(make)))
