"""Multi-process (multi-host) helpers: every process runs the same program on one global mesh.

After ``jax.distributed.initialize()``, ``jax.devices()`` lists every process's devices and ``jaxspec.generate``
with ``mesh=`` runs one SPMD program over all of them. The contract is the usual JAX one: every process makes the
same call with the same arguments, and every process gets every row back. ``share_prompts`` builds that common
prompt list when each process reads its own part of a workload.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np


def share_prompts(local_prompts: Sequence, tokenizer=None) -> tuple[list[list[int]], slice]:
    """All processes' prompts, in process order, plus the slice of that list holding this process's own.

    ``local_prompts``: this process's prompts as token-id lists (or strings, with ``tokenizer``). Call it on every
    process (it is a collective). With one process it returns the prompts and ``slice(0, n)``. Raises
    ``ValueError`` for a string prompt without ``tokenizer``.
    """
    from jax.experimental import multihost_utils

    rows = []
    for i, p in enumerate(local_prompts):
        if isinstance(p, str):
            if tokenizer is None:
                raise ValueError(f"local_prompts[{i}] is a string; pass tokenizer= to encode it")
            p = tokenizer.encode(p)
        rows.append([int(t) for t in p])
    if jax.process_count() == 1:
        return rows, slice(0, len(rows))
    sizes = np.asarray([len(rows), max((len(r) for r in rows), default=0)], np.int32)
    all_sizes = np.asarray(multihost_utils.process_allgather(sizes))  # [P, 2]
    n_max, len_max = int(all_sizes[:, 0].max()), max(int(all_sizes[:, 1].max()), 1)
    local = np.full((n_max, len_max), -1, np.int32)
    for i, r in enumerate(rows):
        local[i, : len(r)] = r
    everyone = np.asarray(multihost_utils.process_allgather(local))  # [P, n_max, len_max]
    out: list[list[int]] = []
    start = 0
    for proc, (count, _) in enumerate(all_sizes):
        if proc == jax.process_index():
            start = len(out)
        out.extend([int(t) for t in row if t >= 0] for row in everyone[proc, :count])
    return out, slice(start, start + len(rows))
