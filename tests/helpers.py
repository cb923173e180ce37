"""Test utilities: counting XLA compilations."""

import contextlib

import jax.monitoring

_BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"
_TRACE = "/jax/core/compile/jaxpr_trace_duration"


@contextlib.contextmanager
def count_compiles():
    """Counts backend compilations and traces inside the block: ``with count_compiles() as c: ...; c["compiles"]``."""
    counts = {"compiles": 0, "traces": 0}

    def listener(name, duration, **kwargs):
        if name == _BACKEND_COMPILE:
            counts["compiles"] += 1
        elif name == _TRACE:
            counts["traces"] += 1

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield counts
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
