"""Compiled programs kept for reuse, within bounds a long-running process can live with.

Every ``loop.Program`` keeps the executables it compiled (one per loop spec and argument signature), so a later call
with the same shapes compiles nothing. Kept forever, they add up: XLA:CPU loads each kernel of an executable as its
own few memory mappings (about 3 per kernel: code, constants, data), so one SmolLM2-135M loop program (30 layers held
split) costs 1 200–1 700 mappings and the toy pair's 650–1 000, against Linux's default limit of 65 530 per process
(``/proc/sys/vm/max_map_count``). A notebook or batch job that compiled a few dozen programs (prompt-length
buckets, γ candidates, refill shapes) would then die inside XLA's compiler ("LLVM compilation error: Cannot allocate
memory", then a segmentation fault).

So the executables of every ``Program`` share one least-recently-used order and two bounds:

* at most ``max_executables()`` are kept (``$JAXSPEC_MAX_EXECUTABLES``, default 32);
* before each compile, ``make_room()`` checks the process's memory-map use and, above ``HIGH`` of the limit,
  releases the least recently used executables until it is under ``LOW`` (then clears jax's own jit caches if
  that was not enough).

A released executable is compiled again if its shapes come back: time, never a wrong result. Where mappings are
cheap (accelerators' executables live on the device) or ``/proc`` is absent, only the count bound acts.
"""

from __future__ import annotations

import collections
import concurrent.futures
import os
from collections.abc import Hashable
from typing import Any

import jax

DEFAULT_MAX_EXECUTABLES = 32
HIGH, LOW = 0.5, 0.3  # fractions of the memory-map limit: make_room acts above HIGH and releases down to LOW

_ORDER: collections.OrderedDict[tuple[ExecutableCache, Hashable], None] = collections.OrderedDict()  # oldest first


def max_executables() -> int:
    """How many compiled executables every ``Program`` together keeps: ``$JAXSPEC_MAX_EXECUTABLES`` or 32."""
    value = os.environ.get("JAXSPEC_MAX_EXECUTABLES", "")
    try:
        return max(1, int(value)) if value else DEFAULT_MAX_EXECUTABLES
    except ValueError:
        raise ValueError(f"JAXSPEC_MAX_EXECUTABLES must be an int >= 1, got {value!r}") from None


def map_pressure() -> float:
    """The fraction of this process's memory-map limit in use (``/proc/self/maps`` lines ÷
    ``/proc/sys/vm/max_map_count``); 0.0 where the system does not tell."""
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            limit = int(f.read())
        with open("/proc/self/maps", "rb") as f:
            used = sum(1 for _ in f)
    except (OSError, ValueError):
        return 0.0
    return used / limit if limit > 0 else 0.0


class ExecutableCache:
    """A ``Program``'s executables by key, in the process-wide least-recently-used order."""

    def __init__(self):
        self._items: dict[Hashable, Any] = {}

    def get(self, key: Hashable):
        """The executable compiled for ``key`` (now the most recently used), or None."""
        executable = self._items.get(key)
        if executable is not None:
            _ORDER.move_to_end((self, key))
        return executable

    def put(self, key: Hashable, executable) -> None:
        """Keep ``executable`` for ``key``, releasing the least recently used ones beyond ``max_executables()``."""
        self._items[key] = executable
        _ORDER[(self, key)] = None
        _ORDER.move_to_end((self, key))
        while len(_ORDER) > max_executables():
            release_oldest()

    def clear(self) -> None:
        """Release every executable of this cache."""
        for key in self._items:
            _ORDER.pop((self, key), None)
        self._items.clear()

    def __contains__(self, key: Hashable) -> bool:
        return key in self._items

    def __len__(self) -> int:
        return len(self._items)


def kept() -> int:
    """How many executables every ``Program`` together keeps now."""
    return len(_ORDER)


def release_oldest() -> bool:
    """Release the least recently used executable of any ``Program``; False when none is kept."""
    if not _ORDER:
        return False
    (cache, key), _ = _ORDER.popitem(last=False)
    cache._items.pop(key, None)
    return True


def make_room() -> None:
    """Called before a compile: above ``HIGH`` of the memory-map limit, release least recently used executables
    until under ``LOW``, then, if that was not enough, jax's own jit caches."""
    if map_pressure() < HIGH:
        return
    while map_pressure() > LOW and release_oldest():
        pass
    if map_pressure() > LOW:
        jax.clear_caches()


def release_all() -> None:
    """Release every kept executable and clear jax's jit caches (later calls compile again)."""
    while release_oldest():
        pass
    jax.clear_caches()


def compile_lowered(lowered: dict) -> dict:
    """``{key: executable}`` for ``{key: jax Lowered}``, after ``make_room()``, compiled on parallel threads (XLA
    compiles without holding Python's lock, so on several cores this takes about as long as the slowest one).

    A value may also be a function of no arguments that returns the ``Lowered``: those are called here, in turn,
    and each program starts compiling as soon as it is lowered, so tracing the next one (which holds the lock)
    overlaps compiling the ones before."""
    if not lowered:
        return {}
    make_room()
    workers = max(1, min(len(lowered), os.cpu_count() or 1))
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {}
        for key, item in lowered.items():
            program = item if isinstance(item, jax.stages.Lowered) else item()
            futures[key] = pool.submit(program.compile)
        return {key: future.result() for key, future in futures.items()}
