"""Stage 2 of ``generate``: the compiled shapes (batch and cache buckets), the loop's static ``LoopSpec`` and traced
``LoopInputs``, and their placement on a mesh.

Shapes are bucketed so that calls with nearby sizes reuse one compiled loop; everything that varies per call
(prompts, lengths, seeds, ``max_new_tokens``, sampling parameters) is a traced input and never recompiles. Prompts
are padded to the cache length and read by the prefill in chunks (``jaxspec.loop.LoopSpec.prefill_chunk``), so
a prompt's length selects no program: a call's programs depend on its batch and cache buckets only.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxspec import loop
from jaxspec.core.grammar import Grammar
from jaxspec.core.model import CausalLM
from jaxspec.core.sampling import SamplingParams
from jaxspec.drafters import Drafter, ModelDrafter, NoDraft
from jaxspec.generation import constraints
from jaxspec.generation.request import Request
from jaxspec.parallel import sharding


def next_pow2(n: int, minimum: int) -> int:
    """The smallest power of two >= ``n``, and at least ``minimum``."""
    return max(minimum, 1 << max(0, n - 1).bit_length())


def bucket_batch(n: int) -> int:
    """Compiled batch size: powers of two up to 8, then multiples of 8."""
    return next_pow2(n, 1) if n <= 8 else -(-n // 8) * 8


def bucket_cache(n: int) -> int:
    """Compiled cache length: powers of two from 64 up to 2048, then multiples of 1024."""
    return next_pow2(n, 64) if n <= 2048 else -(-n // 1024) * 1024


@dataclasses.dataclass(frozen=True)
class Buckets:
    """The shapes a request compiles for, and the prefill's work.

    Attributes:
      batch: compiled batch size B: ``bucket_batch(N)``, rounded up to a multiple of the mesh's ``data`` axis.
      cache_len: KV-cache length S: ``max_length``, or ``bucket_cache`` of the longest prompt + its ``max_new``.
      prompt_len: the positions per row the prefill reads: its chunks (as many as the longest prompt needs) times
        the chunk width (``loop.default_chunk(cache_len)``). Not a compiled shape: prompts are padded to S.
    """

    batch: int
    cache_len: int
    prompt_len: int


def buckets(request: Request) -> Buckets:
    """The ``Buckets`` of ``request``."""
    lengths = request.lengths
    if request.max_length is None:
        cache_len = bucket_cache(int(np.max(lengths + request.max_new)))
    else:
        cache_len = request.max_length
    batch = bucket_batch(request.num_rows)
    data = sharding.axis_size(request.mesh, "data")
    batch = -(-batch // data) * data  # the batch splits evenly over the data axis
    return Buckets(batch, cache_len, prefill_positions(cache_len, int(lengths.max())))


def prefill_positions(cache_len: int, longest: int) -> int:
    """The positions per row the prefill of a ``cache_len`` cache reads for a longest prompt of ``longest``
    tokens: whole chunks of ``loop.default_chunk(cache_len)``."""
    chunk = loop.default_chunk(cache_len)
    return -(-max(1, longest) // chunk) * chunk


def loop_spec(request: Request, cache_len: int, gamma: int) -> loop.LoopSpec:
    """The static ``LoopSpec`` for ``request`` at ``gamma`` draft tokens per round (0: plain decoding, no draft)."""
    spec = loop.LoopSpec(
        target_apply=request.target.apply_fn,
        target_init_cache=request.target.init_cache,
        drafter=loop_drafter(request.drafter if gamma > 0 else None, request.tree),
        gamma=gamma,
        cache_len=cache_len,
        vocab_size=request.target.vocab_size,
        mesh=request.mesh,
    )
    return spec if request.acceptance is None else dataclasses.replace(spec, acceptance=request.acceptance)


def loop_drafter(draft, tree=None) -> Drafter:
    """The loop's (static) ``Drafter`` for what ``generate`` was given as ``draft``: a draft ``CausalLM`` ->
    ``ModelDrafter`` (drafting trees of shape ``tree`` when given); a ``Drafter`` (``PromptLookup``, ...) as is;
    None -> ``NoDraft()``."""
    if draft is None:
        return NoDraft()
    if isinstance(draft, CausalLM):
        return ModelDrafter.of(draft).with_tree(tree)
    return draft


def loop_inputs(request: Request, shape: Buckets) -> loop.LoopInputs:
    """The traced ``LoopInputs`` of ``request``, padded to ``shape.batch`` rows (padding rows inactive) and
    ``shape.cache_len`` positions, placed on ``request.mesh`` when there is one (``place_inputs``)."""
    n, batch, pad = request.num_rows, shape.batch, shape.batch - request.num_rows
    prompt = np.zeros((batch, shape.cache_len), np.int32)
    for i, p in enumerate(request.rows):
        prompt[i, : len(p)] = p
    eos = np.full(next_pow2(len(request.eos), 4), -1, np.int32)
    eos[: len(request.eos)] = request.eos

    def rows(values: np.ndarray, fill) -> np.ndarray:
        return np.concatenate([values, np.full(pad, fill, values.dtype)])

    top_k = np.minimum(request.top_k, request.target.vocab_size)  # k >= V keeps every token: same rule, fits int32

    inputs = loop.LoopInputs(
        prompt=jnp.asarray(prompt),
        prompt_len=jnp.asarray(rows(request.lengths, 1), jnp.int32),
        max_new=jnp.asarray(rows(request.max_new, 1), jnp.int32),
        active=jnp.asarray(np.arange(batch) < n),
        seeds=jnp.asarray(rows(request.seeds, 0), jnp.uint32),
        row_ids=jnp.asarray(rows(request.row_ids, 0), jnp.uint32),
        eos=jnp.asarray(eos),
        # padding rows: greedy, no filter (so they never make the call run the top-k / top-p sort)
        sampling=SamplingParams.create(
            rows(request.temperature, 0.0), rows(top_k, 0), rows(request.top_p, 1.0), batch=batch
        ),
        grammar=None if request.automata is None else grammar_inputs(request, batch),
    )
    return inputs if request.mesh is None else place_inputs(inputs, request.mesh)


def grammar_inputs(request: Request, batch: int) -> Grammar:
    """The rows' constraint automata as device tables (``constraints.device_tables``; padding rows and rows
    without a constraint allow every token), every row at its initial state."""
    assert request.automata is not None
    automata = list(request.automata) + [None] * (batch - request.num_rows)
    token_class, next_state = constraints.device_tables(automata, request.target.vocab_size)
    return Grammar(jnp.asarray(token_class), jnp.asarray(next_state), jnp.zeros((batch,), jnp.int32))


def place_inputs(inputs: loop.LoopInputs, mesh: Mesh) -> loop.LoopInputs:
    """Per-row inputs (sampling parameters included) split over ``data``; EOS ids replicated (every process passes
    the same host values and supplies its own shards)."""

    def place(field, value):
        if field == "eos":
            return sharding.put(np.asarray(value), NamedSharding(mesh, P()))
        return jax.tree.map(
            lambda x: sharding.put(np.asarray(x), NamedSharding(mesh, sharding.batch_spec(np.ndim(x)))), value
        )

    return loop.LoopInputs(**{f.name: place(f.name, getattr(inputs, f.name)) for f in dataclasses.fields(inputs)})


def place_params(target: CausalLM, draft, mesh: Mesh | None, shard_draft: bool = True):
    """``(target_params, draft_params)`` as the loop takes them: on a mesh, the target's sharded by their logical
    axes and the draft's too, or replicated with ``shard_draft=False``; without a mesh, as they are.
    ``draft_params`` is None when ``draft`` is not a ``CausalLM`` (no draft, or prompt lookup), or the
    drafter's own ``params`` attribute (replicated on a mesh) for other ``Drafter``s that carry weights."""
    if isinstance(draft, Drafter):
        own = getattr(draft, "params", None)
        if mesh is not None and own is not None:
            own = jax.tree.map(lambda x: sharding.put(np.asarray(x), NamedSharding(mesh, P())), own)
        return place_params(target, None, mesh)[0], own
    if not isinstance(draft, CausalLM):
        draft = None
    if mesh is None:
        return target.params, None if draft is None else draft.params
    target = sharding.shard(target, mesh)
    if draft is not None:
        draft = sharding.shard(draft, mesh, replicate=not shard_draft)
    return target.params, None if draft is None else draft.params


def replicated_scalar(mesh: Mesh | None, value: int) -> jax.Array:
    """An int32 scalar argument for the loop programs (replicated over ``mesh``, if any)."""
    if mesh is None:
        return jnp.int32(value)
    return sharding.put(np.int32(value), NamedSharding(mesh, P()))
