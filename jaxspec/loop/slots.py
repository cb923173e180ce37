"""Device side of continuous batching: a loop state whose rows (the slots) come and go, and whose batch grows and
shrinks with the rows in flight.

The engine (``jaxspec.generation.engine``) keeps one loop ``State`` of ``B`` rows on device, ``B`` one of a few
bucketed widths. Waiting prompts are prefilled as a small batch of ``k`` rows (``programs.prefill_program``, one
program per ``k``) and scattered into free slots of every per-row array and of both caches (``insert``, one cheap
program per ``(B, k)`` that donates the old state); ``resize`` moves the live rows into a state of another width
(one cheap program per pair of widths); decoding runs ``programs.rounds_program`` at the state's width. Nothing here
depends on which model or drafter runs: a cache's batch axis is found by asking its factory for one and for two
rows.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxspec.loop.programs import Program
from jaxspec.loop.state import (
    FINISH_PADDING,
    LoopSpec,
    State,
    constrain_state,
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


insert_program = Program(insert, donate_argnums=(1,))


def resize(spec: LoopSpec, state: State, rows: jax.Array) -> State:
    """A state of ``len(rows)`` rows: row ``i`` is row ``rows[i]`` of ``state`` (every per-row array and both
    caches), or an idle row (done, ``FINISH_PADDING``) where ``rows[i] < 0``. Moves rows between widths without
    changing them: a row's draws depend on its own key and round counter only."""
    target_axes = batch_axes(spec.target_init_cache, spec.cache_len)
    draft_axes = batch_axes(spec.drafter.init_state, spec.cache_len)
    src = jnp.maximum(rows, 0)

    def take(x, axis):
        return x if axis is None else jnp.take(x, src, axis=axis)

    fields = {}
    for f in dataclasses.fields(State):
        value = getattr(state, f.name)
        if f.name == "target_cache":
            fields[f.name] = jax.tree.map(take, value, target_axes)
        elif f.name == "draft_state":
            fields[f.name] = jax.tree.map(take, value, draft_axes)
        else:
            fields[f.name] = jax.tree.map(lambda x: take(x, 0), value)
    idle = rows < 0
    fields["done"] = fields["done"] | idle
    fields["finish"] = jnp.where(idle, FINISH_PADDING, fields["finish"])
    return constrain_state(spec, State(**fields))


resize_program = Program(resize)
