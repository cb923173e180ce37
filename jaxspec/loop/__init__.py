"""The compiled decode loop: everything that runs on device between a prompt and its verified tokens.

* ``state``: ``LoopSpec`` (static, hashable: every compiled program's key), ``LoopInputs`` (one generation's
  traced inputs) and ``State`` (the loop's carry), with where each part lives on a mesh;
* ``rounds``: the prefill and the speculative round (draft, verify, accept, emit) inside one ``lax.while_loop``;
* ``programs``: those functions compiled ahead of time (``generate_program``, ``prefill_program``,
  ``rounds_program``), holding their executables in ``executables``' bounded cache;
* ``slots``: continuous batching's insert of freshly prefilled rows into a running state, and its move of the rows
  in flight to a state of another batch width;
* ``compile_cache``: JAX's persistent compilation cache, for later processes.
"""

from jaxspec.loop.programs import (
    Program,
    clear_compiled,
    compile_programs,
    generate_program,
    prefill_program,
    prefilled_state,
    rounds_program,
)
from jaxspec.loop.rounds import prefill, round_step, run, timing_state
from jaxspec.loop.state import (
    FINISH_CACHE,
    FINISH_EOS,
    FINISH_LENGTH,
    FINISH_PADDING,
    RUNNING,
    LoopInputs,
    LoopSpec,
    State,
    constrain_state,
    default_chunk,
    state_shardings,
    zero_counters,
)

__all__ = [
    "FINISH_CACHE",
    "FINISH_EOS",
    "FINISH_LENGTH",
    "FINISH_PADDING",
    "RUNNING",
    "LoopInputs",
    "LoopSpec",
    "Program",
    "State",
    "clear_compiled",
    "compile_programs",
    "constrain_state",
    "default_chunk",
    "generate_program",
    "prefill",
    "prefill_program",
    "prefilled_state",
    "round_step",
    "rounds_program",
    "run",
    "state_shardings",
    "timing_state",
    "zero_counters",
]
