"""``--mesh``: the same generation on several mesh shapes (simulated CPU devices here, real ones on GPU/TPU).

For each shape ``data x model`` (plus one device without a mesh) it reports, for the aligned pair at batch
``--mesh-batch``: bytes per device of the target's weights, the draft's weights and both KV caches (read from the
placed arrays' addressable shards), ms per round (wall ÷ target passes, median of ``--repeats`` runs after a
warm-up) for plain and speculative decoding, and whether the greedy tokens equal the single-device ones.
Simulated CPU devices share the host's cores, so round times show the cost of the partitioned program and its
collectives, not a speed-up; per-device bytes are exact.
"""

from __future__ import annotations

import statistics
from typing import Any

import jax
import numpy as np

import jaxspec
from jaxspec import loop
from jaxspec.bench.pairs import aligned_pair
from jaxspec.generation.generate import prepare
from jaxspec.parallel import sharding


def parse_shapes(text: str, devices: int) -> list[tuple[int, int]]:
    """``"1x8,2x4"`` -> [(1, 8), (2, 4)]; ``"all"``: every data x model factorization of the device count."""
    if text == "all":
        return [(d, devices // d) for d in range(1, devices + 1) if devices % d == 0]
    shapes = []
    for part in text.split(","):
        d, m = (int(x) for x in part.lower().split("x"))
        shapes.append((d, m))
    return shapes


def _per_device(tree) -> int:
    """Bytes on the first device of the arrays in ``tree``."""
    dev = jax.devices()[0]
    total = 0
    for x in jax.tree.leaves(tree):
        total += sum(s.data.nbytes for s in x.addressable_shards if s.device == dev)
    return total


def _placement(target, draft, prompts, kw, mesh) -> dict:
    prep = prepare(target, prompts, draft=draft, mesh=mesh, **kw)
    tparams, dparams = prep.placed_params()
    if mesh is None:
        tparams, dparams = jax.device_put((tparams, dparams), jax.devices()[0])
    state, _ = loop.prefill_program(prep.spec, tparams, dparams, prep.inputs)
    out: dict[str, Any] = {
        "target_weights": _per_device(tparams),
        "draft_weights": _per_device(dparams),
        "target_cache": _per_device(state.target_cache),
        "draft_cache": _per_device(state.draft_state),
    }
    if mesh is not None:
        out["fallbacks"] = [str(f) for f in sharding.plan(target, mesh).fallbacks]
    return out


def _ms_per_round(target, draft, prompts, kw, mesh, repeats) -> tuple[float, list | None]:
    jaxspec.generate(target, prompts, draft=draft, mesh=mesh, **kw)  # compile
    times, tokens = [], None
    for _ in range(repeats):
        res = jaxspec.generate(target, prompts, draft=draft, mesh=mesh, **kw)
        times.append(res.stats.wall_time_s / max(res.stats.target_passes, 1))
        tokens = res.tokens
    return statistics.median(times) * 1e3, tokens


def run(args) -> dict:
    """The mesh mode: greedy plain and speculative generation with the aligned pair (``aligned_pair(args)``) on one
    device without a mesh, then on every ``data x model`` shape of ``args.mesh`` (``parse_shapes``), printing a
    table row per shape.

    The prompts are ``args.mesh_batch`` rows of ``args.prompt_len`` random ids below ``args.vocab`` (drawn from
    ``args.seed``), each call generating ``args.max_new_tokens`` tokens with ``args.gamma``. Returns ``{"mode":
    "mesh", "devices", "platform", "batch", "gamma", "rows"}``; a row has ``mesh`` (``"1 device"`` or ``"DxM"``),
    the bytes on the first device of ``target_weights``, ``draft_weights``, ``target_cache`` and ``draft_cache``
    (after prefill), ``fallbacks`` (mesh rows only: ``sharding.plan``'s, as strings), ``plain_ms_per_round`` and
    ``spec_ms_per_round`` (ms per target pass, median of ``args.repeats`` calls after a warm-up one) and
    ``same_tokens`` (the plain and the speculative tokens both equal the single-device plain ones).
    """
    devices = jax.device_count()
    shapes = parse_shapes(args.mesh, devices)
    pair = aligned_pair(args)
    rng = np.random.default_rng(args.seed)
    prompts = rng.integers(0, args.vocab, (args.mesh_batch, args.prompt_len)).tolist()
    kw = dict(max_new_tokens=args.max_new_tokens, temperature=0.0, gamma=args.gamma)
    print(
        f"mesh mode: {devices} devices ({jax.devices()[0].platform}), aligned pair, batch {args.mesh_batch}, "
        f"γ={args.gamma}, {args.max_new_tokens} new tokens; target {pair.target.num_params / 1e6:.1f} M params, "
        f"draft {pair.draft.num_params / 1e6:.1f} M",
        flush=True,
    )
    rows, reference = [], None
    for shape in [None, *shapes]:
        mesh = None if shape is None else sharding.make_mesh({"data": shape[0], "model": shape[1]})
        place = _placement(pair.target, pair.draft, prompts, kw, mesh)
        plain_ms, plain_tokens = _ms_per_round(pair.target, None, prompts, kw, mesh, args.repeats)
        spec_ms, spec_tokens = _ms_per_round(pair.target, pair.draft, prompts, kw, mesh, args.repeats)
        if reference is None:
            reference = plain_tokens
        row = {
            "mesh": "1 device" if shape is None else f"{shape[0]}x{shape[1]}",
            **place,
            "plain_ms_per_round": plain_ms,
            "spec_ms_per_round": spec_ms,
            "same_tokens": plain_tokens == reference and spec_tokens == reference,
        }
        rows.append(row)
        print(_line(row), flush=True)
    return {
        "mode": "mesh",
        "devices": devices,
        "platform": jax.devices()[0].platform,
        "batch": args.mesh_batch,
        "gamma": args.gamma,
        "rows": rows,
    }


def _mib(n: int) -> str:
    return f"{n / 2**20:7.2f}"


def _line(row: dict) -> str:
    if not hasattr(_line, "header"):
        _line.header = True  # type: ignore[attr-defined]  # a function attribute: the header prints once
        print(
            f"{'mesh':>9} | MiB/device: {'target W':>8} {'draft W':>8} {'t cache':>8} {'d cache':>8} | "
            f"ms/round: {'plain':>7} {'spec':>7} | same tokens"
        )
    return (
        f"{row['mesh']:>9} |             {_mib(row['target_weights']):>8} {_mib(row['draft_weights']):>8} "
        f"{_mib(row['target_cache']):>8} {_mib(row['draft_cache']):>8} |           {row['plain_ms_per_round']:7.2f} "
        f"{row['spec_ms_per_round']:7.2f} | {row['same_tokens']}"
    )
