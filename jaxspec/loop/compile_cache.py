"""A persistent compilation cache: compiled programs kept on disk, so that a later process's first call loads them
instead of compiling them again (JAX's own cache, ``jax_compilation_cache_dir``).

A process pays XLA's compile on its first call of every shape (seconds for a real model; ``gamma="auto"`` adds its
calibration); with the cache, a second process running the same shapes loads the executables instead
(docs/guides/generation.md). The ``jaxspec generate`` command
turns it on by default; a library user calls ``enable_compilation_cache()`` once, before the first call. JAX keys
each entry by the program, the backend, the devices and the jax/jaxlib versions, so one directory serves every
model and machine kind; nothing is evicted (delete the directory to clear it).

Directory: the argument, else ``$JAXSPEC_COMPILATION_CACHE`` (``off``, ``0``, ``false``, ``no`` or empty: no
cache), else ``<jaxspec cache>/xla`` (``~/.cache/jaxspec/xla``, under ``$JAXSPEC_CACHE`` when set).
"""

from __future__ import annotations

import os
from pathlib import Path

import jax

from jaxspec.formats.named import cache_dir

ENV = "JAXSPEC_COMPILATION_CACHE"
OFF = ("", "0", "off", "false", "no")


def is_off(text: str) -> bool:
    """Whether ``text`` (``$JAXSPEC_COMPILATION_CACHE`` or the CLI's ``--compilation-cache``) turns the cache off."""
    return text.strip().lower() in OFF


def default_directory() -> Path | None:
    """The cache directory ``enable_compilation_cache()`` uses without an argument: from ``$JAXSPEC_COMPILATION_CACHE``
    (None when it says off), else ``<jaxspec cache>/xla``."""
    value = os.environ.get(ENV)
    if value is not None:
        return None if is_off(value) else Path(value).expanduser()
    return cache_dir() / "xla"


def enable_compilation_cache(directory: str | os.PathLike | None = None, *, min_compile_time_s: float = 0.1):
    """Keep every program that takes at least ``min_compile_time_s`` to compile in ``directory`` (created if
    missing; see the module docstring for the default), and load it from there in later processes. Returns the
    directory as a ``Path``, or None when ``$JAXSPEC_COMPILATION_CACHE`` turns the default off.

    It applies to the compiles after it. A process that has a cache directory already (an earlier call, or
    ``jax_compilation_cache_dir`` set by the user) keeps it: that directory is returned and nothing changes.
    Raises ``ValueError`` naming the argument when ``directory`` exists and is not a writable directory, or when
    ``min_compile_time_s`` is not a number >= 0."""
    number = isinstance(min_compile_time_s, (int, float)) and not isinstance(min_compile_time_s, bool)
    if not (number and min_compile_time_s >= 0):
        raise ValueError(f"min_compile_time_s must be a number >= 0, got {min_compile_time_s!r}")
    current = jax.config.jax_compilation_cache_dir  # type: ignore[attr-defined]  # a dynamic config attribute
    if current:
        return Path(current)
    if directory is None:
        path = default_directory()
        if path is None:
            return None
        what = f"the compilation cache directory {str(path)!r} (from ${ENV} or the jaxspec cache)"
    else:
        path = Path(os.fspath(directory)).expanduser()
        what = f"directory {str(path)!r}"
    if path.exists() and not path.is_dir():
        raise ValueError(f"{what} exists and is not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ValueError(f"{what} cannot be created: {err}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ValueError(f"{what} is not writable")
    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_time_s))
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return path
