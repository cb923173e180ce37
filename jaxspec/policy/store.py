"""``gamma="auto"``'s measured costs kept on disk, so a later process's first call at the same shapes decides
without timing the standalone steps again (``AutoGamma(cost_dir=...)``).

One small JSON file per (target, drafter, batch bucket, cache bucket, mesh, candidate γ, calibration mode, machine),
named by a digest of that key. Models are keyed by what their speed depends on, not by their weights' values: the
model's name, its forward function and the shapes and dtypes of its parameters (a drafter without a model, such as
prompt lookup, by its ``repr``). The machine is the backend, the device kind and count, this process's devices, the
CPU's architecture and core count, ``XLA_FLAGS`` and the jax and jaxspec versions, so costs timed on one machine are
not used on another. Nothing is evicted: delete the directory to measure again. A file that cannot be read or does
not hold what is expected is ignored (the costs are measured and the file written again).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import tempfile
from pathlib import Path

import jax

from jaxspec.policy.cost import Costs
from jaxspec.version import __version__

SUBDIR = "jaxspec-auto-costs"  # under the compilation cache directory when the costs follow it
FORMAT = 2  # the files' layout; 2 added the load reference's seconds (a file of format 1 is measured again)


def model_fingerprint(model) -> str:
    """What a model's step time depends on: its name, forward function and parameter shapes/dtypes (a drafter
    with a model of its own, an EAGLE head, by that model and its class; one without, by its ``repr``)."""
    if hasattr(model, "as_model"):
        return f"{type(model).__module__}.{type(model).__qualname__}:{model_fingerprint(model.as_model())}"
    if not hasattr(model, "apply_fn"):
        return repr(model)
    fn = getattr(model.apply_fn, "func", model.apply_fn)  # a functools.partial: its function
    shapes = jax.tree.map(lambda x: f"{tuple(x.shape)}:{x.dtype}", model.params)
    leaves = jax.tree_util.tree_flatten_with_path(shapes)[0]
    return json.dumps(
        [model.name, f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', repr(fn))}", str(leaves)]
    )


def machine_fingerprint() -> list:
    """The machine and software the costs were timed on (see the module docstring)."""
    devices = jax.local_devices()
    return [
        jax.default_backend(),
        devices[0].device_kind if devices else "",
        jax.device_count(),
        len(devices),
        platform.machine(),
        os.cpu_count(),
        os.environ.get("XLA_FLAGS", ""),
        jax.__version__,
        __version__,
    ]


def cost_path(directory, target, draft, batch: int, cache_len: int, mesh_key, gammas, calibrate: str) -> Path:
    """The file that holds these costs (it may not exist yet)."""
    key = [
        model_fingerprint(target),
        model_fingerprint(draft),
        batch,
        cache_len,
        repr(mesh_key),
        list(gammas),
        calibrate,
        machine_fingerprint(),
    ]
    digest = hashlib.sha256(json.dumps(key, default=str).encode()).hexdigest()[:32]
    return Path(directory) / f"costs-{digest}.json"


def _costs_to_json(costs: Costs) -> dict:
    out = {
        "c": costs.c,
        "v": {str(g): x for g, x in costs.v.items()},
        "prefill": costs.prefill,
        "round": None if costs.round is None else {str(g): x for g, x in costs.round.items()},
        "target_prefill": costs.target_prefill,
        "prefill_tokens": costs.prefill_tokens,
        "step_s": costs.step_s,
        "sampling": costs.sampling,
        "reference_s": costs.reference_s,
    }
    return {"format": FORMAT, "costs": out}


def _costs_from_json(data) -> Costs:
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError("not a jaxspec cost file")
    d = data["costs"]
    numbers = ("c", "prefill", "target_prefill", "step_s", "sampling", "reference_s")
    if not all(isinstance(d[k], (int, float)) for k in numbers) or not isinstance(d["prefill_tokens"], int):
        raise ValueError("bad cost values")
    v = {int(g): float(x) for g, x in d["v"].items()}
    rounds = None if d["round"] is None else {int(g): float(x) for g, x in d["round"].items()}
    return Costs(
        float(d["c"]),
        v,
        float(d["prefill"]),
        rounds,
        float(d["target_prefill"]),
        d["prefill_tokens"],
        float(d["step_s"]),
        float(d["sampling"]),
        float(d["reference_s"]),
    )


def load(path: Path, gammas) -> Costs | None:
    """The costs kept in ``path``, or None when there are none usable (missing, unreadable, another format, or not
    covering every γ of ``gammas``)."""
    try:
        costs = _costs_from_json(json.loads(Path(path).read_text()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if not set(gammas) <= set(costs.v) or (costs.round is not None and not set(gammas) <= set(costs.round)):
        return None
    return costs


def save(path: Path, costs: Costs) -> bool:
    """Write ``costs`` to ``path`` atomically (a temporary file renamed into place, so a concurrent process reads
    either the whole file or none); False, and nothing written, when the directory cannot be written."""
    path, tmp = Path(path), None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".costs-", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(_costs_to_json(costs), f)
        os.replace(tmp, path)
    except OSError:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        return False
    return True


def default_directory() -> Path | None:
    """Where the costs follow the compilation cache: ``<jax_compilation_cache_dir>/jaxspec-auto-costs`` when one is
    set (``jaxspec.loop.compile_cache.enable_compilation_cache``, which the CLI turns on), else None (not kept)."""
    current = jax.config.jax_compilation_cache_dir  # type: ignore[attr-defined]  # a dynamic config attribute
    return Path(current) / SUBDIR if current else None
