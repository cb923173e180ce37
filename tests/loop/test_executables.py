"""Compiled programs are kept within bounds (jaxspec.loop.executables): a count bound over every Program, least recently
used released first, and memory-map pressure (XLA:CPU maps every kernel of an executable, and a process that keeps
too many dies inside the compiler)."""

import dataclasses
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from helpers import HELD_HIGH, RELEASE_HIGH, count_compiles

import jaxspec
from jaxspec import loop
from jaxspec.loop import executables


@dataclasses.dataclass(frozen=True)
class Spec:  # what Program needs of a loop spec: hashable (a static argument) and a mesh
    k: int
    mesh: None = None


def _double(spec, x):
    return x * 2 + spec.k


@pytest.fixture
def own_order():
    """An empty process-wide order for the test (the suite's own executables are put back afterwards)."""
    saved = executables._ORDER.copy()
    executables._ORDER.clear()
    yield
    executables._ORDER.clear()
    executables._ORDER.update(saved)


@pytest.fixture
def isolated(own_order, monkeypatch):
    """``own_order``, and the library's release threshold (tests/conftest.py raises it within every other test)."""
    monkeypatch.setattr(executables, "HIGH", RELEASE_HIGH)


def test_count_bound_releases_the_least_recently_used_across_programs(isolated, monkeypatch):
    monkeypatch.setenv("JAXSPEC_MAX_EXECUTABLES", "2")
    a, b = loop.Program(_double), loop.Program(_double)
    x = jnp.arange(3.0)
    assert a(Spec(1), x)[1] > 0 and b(Spec(1), x)[1] > 0 and (a.compiles, b.compiles) == (1, 1)
    assert float(a(Spec(1), x)[0][2]) == 5.0 and a(Spec(1), x)[1] == 0.0  # a's is now the most recently used
    out, seconds = b(Spec(2), x)  # a third executable: b's first, the least recently used, is released
    assert float(out[2]) == 6.0 and seconds > 0 and executables.kept() == 2
    assert (a.cache_size(), b.cache_size()) == (1, 1)
    assert a(Spec(1), x)[1] == 0.0  # kept
    out, seconds = b(Spec(1), x)  # released: compiled again, same result
    assert float(out[2]) == 5.0 and seconds > 0 and b.compiles == 3


def test_bad_bound_is_a_clear_error(isolated, monkeypatch):
    monkeypatch.setenv("JAXSPEC_MAX_EXECUTABLES", "many")
    with pytest.raises(ValueError, match="JAXSPEC_MAX_EXECUTABLES"):
        loop.Program(_double)(Spec(1), jnp.ones(2))


def test_map_pressure_releases_down_to_low_and_not_below_high(isolated, monkeypatch):
    program = loop.Program(_double)
    for k in range(6):
        program(Spec(k), jnp.ones(2))
    assert executables.kept() == 6
    monkeypatch.setattr(executables, "map_pressure", lambda: 0.45)  # under HIGH: nothing released (control)
    executables.make_room()
    assert executables.kept() == 6
    readings = iter([0.7, 0.6, 0.5, 0.35, 0.25, 0.25])  # each release lowers it; stop once under LOW
    monkeypatch.setattr(executables, "map_pressure", lambda: next(readings))
    executables.make_room()
    assert executables.kept() == 3  # three released (0.6, 0.5, 0.35 > LOW), the oldest ones
    monkeypatch.setattr(executables, "map_pressure", lambda: 0.0)
    assert program(Spec(5), jnp.ones(2))[1] == 0.0 and program(Spec(3), jnp.ones(2))[1] == 0.0
    assert program(Spec(0), jnp.ones(2))[1] > 0


def test_within_a_test_the_pressure_release_waits_until_near_the_limit(own_order, monkeypatch):
    """The suite's own setting (tests/conftest.py): within a test, a worker past HIGH releases nothing, so a test
    that counts compiles sees its programs compiled once (CI's once-flaky recompilation tests); near the limit it
    still releases rather than crash; between tests the library's threshold acts."""
    program = loop.Program(_double)
    for k in range(3):
        program(Spec(k), jnp.ones(2))
    monkeypatch.setattr(executables, "map_pressure", lambda: 0.6)  # past RELEASE_HIGH, under HELD_HIGH
    assert executables.HIGH == HELD_HIGH > 0.6 > RELEASE_HIGH
    with count_compiles() as counts:
        executables.make_room()
        assert executables.kept() == 3 and program(Spec(0), jnp.ones(2))[1] == 0.0
    assert counts["compiles"] == 0
    readings = iter([0.95, 0.95, 0.25, 0.25])  # near the limit: released down to LOW (one, here)
    monkeypatch.setattr(executables, "map_pressure", lambda: next(readings))
    executables.make_room()
    assert executables.kept() == 2
    monkeypatch.setattr(executables, "HIGH", RELEASE_HIGH)  # control: as between tests, 0.6 releases
    readings = iter([0.6, 0.6, 0.25, 0.25])
    executables.make_room()
    assert executables.kept() == 1


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="memory maps are read from Linux's /proc")
def test_a_compiled_program_holds_memory_maps_and_releasing_it_frees_them(target):
    """The mechanism the bounds guard against, measured: a loop program maps hundreds of pages on XLA:CPU (some
    on other backends), and releasing it gives them back."""

    def maps():
        with open("/proc/self/maps", "rb") as f:
            return sum(1 for _ in f)

    def run():
        jaxspec.generate(target, [[1, 2, 3]], max_new_tokens=3, temperature=0.0)

    run()  # whatever a first call sets up for good (threads, their stacks, allocator arenas) is not measured
    executables.release_all()
    before = maps()
    run()
    grown = maps() - before
    assert executables.kept() == 1
    executables.release_all()
    left = maps() - before
    assert executables.kept() == 0 and left < grown / 2, (grown, left)
    if jax.default_backend() == "cpu":
        assert grown > 100
