"""A persistent compilation cache: compiled programs kept on disk, so that a later process's first call loads them
instead of compiling them again (JAX's own cache, ``jax_compilation_cache_dir``).

A process pays XLA's compile on its first call of every shape (seconds for a real model; ``gamma="auto"`` adds its
calibration); with the cache, a second process running the same shapes loads the executables instead
(docs/guides/generation.md). It is on by default: ``generate``, ``stream``, ``prepare`` and ``Engine`` call
``use_default()`` before anything compiles, and the ``jaxspec generate`` command turns it on itself. JAX keys each
entry by the program, the backend, the devices and the jax/jaxlib versions, so one directory serves every model and
machine kind; nothing is evicted (delete the directory to clear it).

Directory: ``enable_compilation_cache``'s argument, else ``$JAXSPEC_COMPILATION_CACHE`` (``off``, ``0``, ``false``,
``no`` or empty: no cache), else ``<jaxspec cache>/xla`` (``~/.cache/jaxspec/xla``, under ``$JAXSPEC_CACHE`` when
set). Turning it off: ``$JAXSPEC_COMPILATION_CACHE=off``, or ``jaxspec.enable_compilation_cache(False)`` in the
process; a directory the user gave JAX itself (``jax_compilation_cache_dir``) is kept as it is.
"""

from __future__ import annotations

import os
from pathlib import Path

import jax
from jax.experimental.compilation_cache import compilation_cache as jax_cache

from jaxspec.formats.named import cache_dir

ENV = "JAXSPEC_COMPILATION_CACHE"
OFF = ("", "0", "off", "false", "no")

_decided = False  # whether this process chose (use_default or enable_compilation_cache ran)
_by_default: Path | None = None  # the directory use_default turned on (an explicit choice replaces it)


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


def _current() -> str | None:
    return jax.config.jax_compilation_cache_dir  # type: ignore[attr-defined]  # a dynamic config attribute


def _set(path: str | None, min_compile_time_s: float = 0.1) -> None:
    """Point JAX's cache at ``path`` (None: no cache), forgetting the cache JAX opened before, if any."""
    jax.config.update("jax_compilation_cache_dir", path)
    if path is not None:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_time_s))
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    jax_cache.reset_cache()


def use_default() -> Path | None:
    """Turn the cache on at ``default_directory()`` unless this process chose already (an earlier call of this or
    of ``enable_compilation_cache``) or JAX has a cache directory; returns the directory in use, or None. A default
    directory that cannot be created leaves the cache off (no error: it is a default)."""
    global _decided, _by_default
    if not _decided:
        _decided = True
        path = default_directory()
        if not _current() and path is not None:
            try:
                _by_default = _enable(path, f"the compilation cache directory {str(path)!r}", 0.1)
            except ValueError:
                pass
    current = _current()
    return Path(current) if current else None


def enable_compilation_cache(directory: str | os.PathLike | bool | None = None, *, min_compile_time_s: float = 0.1):
    """Keep every program that takes at least ``min_compile_time_s`` to compile in ``directory`` (created if
    missing; None: the default of the module docstring), and load it from there in later processes; ``False``
    turns the cache off for this process. Returns the directory as a ``Path``, or None when the cache is off
    (``False``, or ``$JAXSPEC_COMPILATION_CACHE`` turning the default off).

    It applies to the compiles after it. A directory chosen before in this process (an earlier call, or
    ``jax_compilation_cache_dir`` set by the user) is kept: that directory is returned and nothing changes; only
    the default one (``use_default``) gives way to an explicit directory. Raises ``ValueError`` naming the argument
    when ``directory`` exists and is not a writable directory, or when ``min_compile_time_s`` is not a number
    >= 0."""
    number = isinstance(min_compile_time_s, (int, float)) and not isinstance(min_compile_time_s, bool)
    if not (number and min_compile_time_s >= 0):
        raise ValueError(f"min_compile_time_s must be a number >= 0, got {min_compile_time_s!r}")
    global _decided, _by_default
    if directory is True:
        directory = None
    _decided = True
    current, by_default = _current(), _by_default
    if directory is False:
        if current:
            _set(None)
        _by_default = None
        return None
    if current and str(by_default) != current:
        return Path(current)
    if directory is None:
        path = default_directory()
        if path is None:
            return None
        what = f"the compilation cache directory {str(path)!r} (from ${ENV} or the jaxspec cache)"
    else:
        path = Path(os.fspath(directory)).expanduser()
        what = f"directory {str(path)!r}"
    _by_default = None
    return _enable(path, what, min_compile_time_s)


def _enable(path: Path, what: str, min_compile_time_s: float) -> Path:
    if path.exists() and not path.is_dir():
        raise ValueError(f"{what} exists and is not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ValueError(f"{what} cannot be created: {err}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ValueError(f"{what} is not writable")
    _set(str(path), min_compile_time_s)
    return path
