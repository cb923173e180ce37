"""What jaxspec's three optax trainings share: ``train`` (the shipped pair from scratch), ``distill`` (a draft
toward a target, online) and ``distill_offline`` (a draft on stored target outputs).

- ``make_optimizer`` / ``learning_rate_at``: AdamW after global-norm clipping, on a linear-warmup + cosine-decay
  learning-rate schedule; ``optimizer_step``: one gradient step of a loss through it, inside a jitted train step.
- ``Checkpoints``: a run's orbax checkpoints: save every N steps, resume from the latest.
- ``due`` and ``append_jsonl``: when a step is saved or logged, and the JSONL log a run appends to (the
  distillations' is ``LOG_FILE`` in their output directory).

Every run makes its batches as a pure function of (seed, step), so params, optimizer state and step are all it
needs to resume to exactly the parameters of an uninterrupted run.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import optax
import orbax.checkpoint as ocp

LOG_FILE = "distill_log.jsonl"
"""The log of a distillation run (online, offline or an EAGLE head's), in its ``out_dir``: one JSON record a line."""


def learning_rate_at(count, learning_rate, warmup, steps) -> jax.Array:
    """The learning rate after ``count`` updates, a float32 scalar: linear warmup from 0 over ``warmup`` steps,
    then cosine decay to ``learning_rate / 10`` at ``steps`` (optax's ``warmup_cosine_decay_schedule``), written
    with ``jnp`` so that every argument may be traced."""
    count = jnp.asarray(count, jnp.float32)
    warm = learning_rate * count / jnp.maximum(warmup, 1)
    frac = jnp.clip((count - warmup) / jnp.maximum(steps - warmup, 1), 0.0, 1.0)
    decayed = learning_rate / 10 + 0.9 * learning_rate * 0.5 * (1 + jnp.cos(jnp.pi * frac))
    return jnp.where(count < warmup, warm, decayed)


def make_optimizer(
    learning_rate, warmup, steps, *, weight_decay: float = 0.0, b2: float = 0.999, clip_norm: float = 1.0
) -> optax.GradientTransformation:
    """AdamW (``b1`` = 0.9, ``b2``, decoupled ``weight_decay``) after clipping the global gradient norm to
    ``clip_norm``, on the schedule of ``learning_rate_at``: warmup over ``warmup`` steps to ``learning_rate``, then
    cosine decay to ``learning_rate / 10`` at ``steps``.

    ``learning_rate``, ``warmup`` and ``steps`` are Python numbers (the schedule is then optax's
    ``warmup_cosine_decay_schedule``) or JAX arrays, traced inside a jitted train step so that new values do not
    recompile (the schedule is then ``learning_rate_at``, the same function in ``jnp``; the two agree to float32
    rounding). The optimizer state's structure does not depend on any argument, so checkpoints are the same either
    way. Used as ``make_optimizer(lr, warmup, steps, weight_decay=0.1, b2=0.95)`` by ``train`` and with the
    defaults and a traced ``[learning_rate, warmup, steps]`` by ``distill`` and ``distill_offline``.
    """
    if any(isinstance(x, jax.Array) for x in (learning_rate, warmup, steps)):

        def schedule(count):
            return learning_rate_at(count, learning_rate, warmup, steps)

    else:
        schedule = optax.warmup_cosine_decay_schedule(0.0, learning_rate, warmup, steps, learning_rate / 10)
    return optax.chain(optax.clip_by_global_norm(clip_norm), optax.adamw(schedule, b2=b2, weight_decay=weight_decay))


def optimizer_step(loss_fn, optimizer: optax.GradientTransformation, params, opt_state, *batch):
    """One training step, to call inside a jitted function: the gradient of ``loss_fn(params, *batch)`` (a scalar)
    applied through ``optimizer`` (``make_optimizer``'s). Returns ``(params, opt_state, loss)``: the updated
    parameters and optimizer state, and the loss before the update."""
    loss, grads = jax.value_and_grad(loss_fn)(params, *batch)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


def due(done: int, every: int, last: int) -> bool:
    """Whether the step that brings a run to ``done`` finished steps is saved (or logged): every ``every``
    steps and at the run's ``last`` step."""
    return done % every == 0 or done == last


def append_jsonl(path, record: dict) -> None:
    """Append ``record`` as one JSON line to ``path`` (a run's log; resumed runs add to it)."""
    with Path(path).open("a") as f:
        f.write(json.dumps(record) + "\n")


class Checkpoints:
    """A training run's orbax checkpoints in one directory, the newest ``max_to_keep`` kept.

    On disk: one sub-directory per saved step, ``<directory>/<step>/default``, holding the run's state dict with
    orbax's ``StandardSave``: ``params``, ``opt_state``, ``step`` (an int32 scalar) and whatever else the run
    keeps (``distill`` keeps its last ``loss``). ``save`` adds ``step`` and ``restore`` takes it out, so callers
    handle only the rest. Use as a context manager: leaving it waits for the last (asynchronous) save and closes.

    Attributes:
      directory: the checkpoint directory, absolute.
      manager: the ``orbax.checkpoint.CheckpointManager`` over it.
    """

    def __init__(self, directory, *, max_to_keep: int | None = 2, create: bool = True):
        self.directory = Path(directory).resolve()
        self.manager = ocp.CheckpointManager(
            self.directory, options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=create)
        )

    @property
    def latest_step(self) -> int | None:
        """The step of the newest checkpoint, None when there is none."""
        return self.manager.latest_step()

    def restore(self, template: dict, *, name: str = "checkpoint directory", what: str = "this model"):
        """``(state, step)`` from the newest checkpoint, or ``(template, 0)`` when there is none.

        ``template`` gives the structure, shapes and dtypes of the state without ``step`` (arrays or
        ``jax.ShapeDtypeStruct``). A checkpoint of another structure raises ``ValueError`` naming the directory
        (as ``name``) and the model (``what``).
        """
        step = self.latest_step
        if step is None:
            return template, 0
        try:
            state = self.manager.restore(step, args=ocp.args.StandardRestore({**template, "step": jnp.int32(0)}))
        except Exception as err:  # orbax raises many kinds; all mean the same to a user
            raise ValueError(
                f"{name} {self.directory} holds a checkpoint (step {step}) that does not match {what}; "
                f"use a new {name} ({type(err).__name__}: {str(err)[:200]})"
            ) from err
        return {k: v for k, v in state.items() if k != "step"}, int(state["step"])

    def save(self, step: int, state: dict) -> None:
        """Save ``state`` (without ``step``) as the checkpoint of ``step`` (asynchronously)."""
        self.manager.save(step, args=ocp.args.StandardSave({**state, "step": jnp.int32(step)}))

    def close(self) -> None:
        """Wait for pending saves, then release the manager."""
        self.manager.wait_until_finished()
        self.manager.close()

    def __enter__(self) -> Checkpoints:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
