"""Compiled loop programs: ``Program`` compiles a loop function ahead of time once per (spec, argument shapes,
shardings) and keeps the executable in the bounded cache of ``jaxspec.loop.executables``. ``generate_program`` (the
whole generation), ``prefill_program`` and ``rounds_program`` (the engine's and the stream's two halves) are the
three every caller shares.
"""

from __future__ import annotations

import dataclasses
import functools
import time

import jax
import jax.numpy as jnp

from jaxspec.loop import executables
from jaxspec.loop.rounds import prefill, run
from jaxspec.loop.state import LoopInputs, LoopSpec, State, state_shardings


class Program:
    """A loop function compiled ahead of time once per (spec, argument shapes/dtypes/shardings).

    Calling returns ``(outputs, compile_seconds)``: 0 when an earlier call already compiled this signature, so
    callers can report compile time apart from run time. On a mesh (``spec.mesh``) the program is compiled with
    explicit input shardings (those of the arguments, which the caller places) and output shardings
    (``state_shardings``): pjit semantics, one SPMD program over every device of every process.
    """

    def __init__(self, fn, donate_argnums=()):
        self.fn = fn
        self.donate_argnums = donate_argnums
        self.jitted = jax.jit(fn, static_argnums=0, donate_argnums=donate_argnums)
        self._executables = executables.ExecutableCache()  # bounded, shared LRU order (jaxspec.loop.executables)
        self.compiles = 0  # programs compiled so far (a compile counter for callers and tests)

    def lower(self, spec: LoopSpec, *args):
        """``jax.stages.Lowered`` of ``fn(spec, *args)`` (with explicit shardings on a mesh); not cached."""
        if spec.mesh is None:
            return self.jitted.lower(spec, *args)
        fn = functools.partial(self.fn, spec)
        in_shardings = jax.tree.map(lambda x: x.sharding, args)
        out_shardings = state_shardings(spec, jax.eval_shape(fn, *args))
        donate = tuple(i - 1 for i in self.donate_argnums)
        return jax.jit(fn, in_shardings=in_shardings, out_shardings=out_shardings, donate_argnums=donate).lower(*args)

    def __call__(self, spec: LoopSpec, *args):
        key = (spec, _signature(args))
        executable, seconds = self._executables.get(key), 0.0
        if executable is None:
            executables.make_room()
            start = time.perf_counter()
            executable = self.lower(spec, *args).compile()
            seconds = time.perf_counter() - start
            self._executables.put(key, executable)
            self.compiles += 1
        return executable(*args), seconds

    def compile_all(self, calls) -> float:
        """Compile the programs of ``calls`` (``(spec, *args)`` tuples) not compiled yet, on parallel threads (XLA
        compiles without holding Python's lock, so on a machine with several cores this takes about as long as the
        slowest one); returns the seconds it took. Later calls with those signatures compile nothing."""
        return compile_programs([(self, *call) for call in calls])

    def cache_size(self) -> int:
        """Number of compiled executables held now (least recently used ones are released: ``compiles`` counts
        compilations)."""
        return len(self._executables)

    def clear(self) -> None:
        """Drop every compiled executable (the next call compiles again)."""
        self._executables.clear()


def compile_programs(calls) -> float:
    """Compile ``calls`` (``(program, spec, *args)`` tuples; arguments may be ``jax.ShapeDtypeStruct``s with the
    shardings the real ones will have) that their ``Program`` has not compiled yet, each lowered in turn and
    compiled on parallel threads as soon as it is lowered; returns the seconds it took (lowering included). Later
    calls with those signatures compile nothing."""
    todo = {}
    for program, spec, *args in calls:
        args = tuple(args)  # the pytree structure is part of the signature, as in Program.__call__
        key = (spec, _signature(args))
        if key not in program._executables:
            # tracing and lowering hold the lock: done in turn, each overlapping the compiles before it
            todo[(program, key)] = functools.partial(program.lower, spec, *args)
    if not todo:
        return 0.0
    start = time.perf_counter()
    for (program, key), executable in executables.compile_lowered(todo).items():
        program._executables.put(key, executable)
        program.compiles += 1
    return time.perf_counter() - start


def prefilled_state(spec: LoopSpec, target_params, draft_params, inputs: LoopInputs) -> State:
    """The ``State`` that ``prefill_program`` returns for these arguments, as ``jax.ShapeDtypeStruct``s with its
    shardings (``state_shardings`` on a mesh, else the inputs' device), to compile ``rounds_program`` beside the
    prefill (``compile_programs``) before the prefill has run."""
    # through the program's own jit, whose trace its lowering then reuses
    shapes = prefill_program.jitted.eval_shape(spec, target_params, draft_params, inputs)
    if spec.mesh is not None:
        where = state_shardings(spec, shapes)
    else:
        device = inputs.prompt.sharding
        where = jax.tree.map(lambda _: device, shapes)
    return jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s, weak_type=x.weak_type), shapes, where
    )


def _signature(args) -> tuple:
    leaves, treedef = jax.tree.flatten(args)
    return treedef, tuple(
        (jnp.shape(x), jnp.result_type(x), getattr(x, "weak_type", False), getattr(x, "sharding", None)) for x in leaves
    )


def _generate(spec: LoopSpec, target_params, draft_params, inputs: LoopInputs) -> State:
    """The whole generation in one program; caches are not returned."""
    state = prefill(spec, target_params, draft_params, inputs)
    never = jnp.iinfo(jnp.int32).max
    state = run(spec, target_params, draft_params, state, never, never)
    return dataclasses.replace(state, target_cache=None, draft_state=None)


generate_program = Program(_generate)
prefill_program = Program(prefill)
rounds_program = Program(run, donate_argnums=(3,))


def clear_compiled() -> None:
    """Forget every compiled program of every ``Program`` (the loop's and the engine's refill; the next calls
    compile again; used by benchmarks)."""
    while executables.release_oldest():
        pass
