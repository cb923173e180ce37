"""Host API: ``generate`` and ``stream``, in visible stages.

1. request (``jaxspec.generation.request.make_request``): every argument checked and the prompts tokenized, before
   anything compiles;
2. buckets and inputs (``jaxspec.generation.inputs``): compiled shapes, the static ``LoopSpec``, the traced
   ``LoopInputs``, placement on the mesh;
3. the γ decision (``choose_gamma``): the fixed γ, or ``gamma="auto"`` through ``jaxspec.policy``;
4. run (``run``, or ``Stream`` round by round): the compiled loop programs of ``jaxspec.loop``;
5. result (``finish``): ``GenerationResult`` and ``Stats`` read off the final state (``jaxspec.generation.results``).

``prepare`` composes stages 1-3 into a ``Prepared`` (benchmarks and tests use it to reach the compiled loop).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from typing import cast

import jax
import numpy as np

from jaxspec import loop
from jaxspec import policy as policy_lib
from jaxspec.core.model import CausalLM
from jaxspec.drafters import Drafter
from jaxspec.generation import inputs as inputs_lib
from jaxspec.generation import results
from jaxspec.generation.config import GenerationConfig
from jaxspec.generation.inputs import bucket_batch, bucket_cache
from jaxspec.generation.request import Request, make_request
from jaxspec.generation.results import (
    FINISH_REASONS,
    GenerationResult,
    NonFiniteLogitsError,
    RowStats,
    Stats,
    StreamStep,
)
from jaxspec.loop import compile_cache
from jaxspec.parallel import sharding

__all__ = [
    "FINISH_REASONS",
    "GenerationResult",
    "NonFiniteLogitsError",
    "Prepared",
    "RowStats",
    "Stats",
    "Stream",
    "StreamStep",
    "bucket_batch",
    "bucket_cache",
    "choose_gamma",
    "finish",
    "generate",
    "prepare",
    "run",
    "stream",
]


def choose_gamma(
    request: Request, shape: inputs_lib.Buckets, trees: bool = False
) -> tuple[int, policy_lib.Decision | None, policy_lib.AutoGamma | None]:
    """Stage 3: ``(gamma, decision, policy)``. ``gamma`` is the compiled loop's (0: plain decoding, also when there
    is no drafter); ``decision`` and ``policy`` are set only with ``gamma="auto"``.

    With ``gamma="auto"`` the policy (``request.policy`` or ``jaxspec.policy.DEFAULT``) decides from measured
    costs (standalone model steps timed the first time it sees these shapes, and the rounds of earlier calls'
    loops; with ``AutoGamma(calibrate="loops")`` the candidate loops on the call's placed weights, which compiles
    them) and from the acceptance seen in earlier calls. ``trees``: the policy may choose a draft tree
    (``decision.tree``; ``gamma`` is then its depth) when the drafter can branch (``can_branch``).
    """
    if not request.auto:
        gamma = cast(int, request.gamma)  # an int (Python or NumPy) unless gamma="auto"
        return (gamma if request.drafter is not None else 0), None, None
    policy = request.policy or policy_lib.DEFAULT

    def round_timer(gammas) -> dict:
        tparams, dparams = inputs_lib.place_params(request.target, request.draft, request.mesh, request.shard_draft)
        specs = {g: inputs_lib.loop_spec(request, shape.cache_len, g) for g in gammas}
        return policy_lib.time_rounds(specs, tparams, dparams, shape.batch, request.greedy)

    decision = policy.decide(
        request.target,
        request.drafter,
        shape.batch,
        shape.cache_len,
        int(np.mean(request.max_new)),
        request.greedy,
        round_timer=round_timer,
        mesh_key=mesh_key(request.mesh, request.shard_draft),
        prompt_tokens=shape.prompt_len,
        branching=trees and can_branch(request),
    )
    return decision.gamma, decision, policy


def can_branch(request: Request) -> bool:
    """Whether ``request``'s drafter can draft trees (an EAGLE head or a draft model) and nothing in the request
    rules them out (constraints are verified over chains only)."""
    drafter = request.drafter
    able = isinstance(drafter, CausalLM) or callable(getattr(drafter, "with_tree", None))
    return able and request.automata is None


def with_tree(request: Request, tree) -> Request:
    """``request`` drafting trees of shape ``tree`` (``jaxspec.drafters.branching``) instead of chains."""
    lookup = request.lookup.with_tree(tree) if request.lookup is not None else None  # type: ignore[attr-defined]
    return dataclasses.replace(request, lookup=lookup, tree=tuple(tree))


def mesh_key(mesh, shard_draft: bool):
    """How ``gamma="auto"``'s policy tells meshes apart in its cost caches (None without a mesh)."""
    return None if mesh is None else (tuple(mesh.shape.items()), shard_draft)


@dataclasses.dataclass(frozen=True)
class Prepared:
    """A checked call ready to run: what ``prepare`` returns.

    With B the compiled batch and S the cache length (``jaxspec.generation.inputs.Buckets``):

    Attributes:
      spec: the static ``loop.LoopSpec`` (γ, cache length S, functions, mesh); ``spec.gamma`` 0 is plain decoding.
      inputs: the traced ``loop.LoopInputs``: ``prompt [B, S]``, ``prompt_len``/``max_new``/``active``/``seeds``/
        ``row_ids`` ``[B]``, ``eos [E]``, sampling parameters ``[B]``; placed on ``spec.mesh`` when there is one.
      num_rows: N, the number of prompts (rows ``N..B-1`` are inactive padding).
      tokenizer: the target's tokenizer (None without one), for ``texts``.
      shard_draft: on a mesh, whether the draft's weights are sharded (True) or replicated.
      decision: with ``gamma="auto"``, the ``jaxspec.policy.Decision``; else None.
      policy: with ``gamma="auto"``, the ``AutoGamma`` that decided (it learns from the result); else None.
      draft: the drafter actually used (a ``CausalLM`` or a ``Drafter``); None for plain decoding.
      target: the target model.
      drafter: with ``gamma="auto"``, the drafter the policy decided for (also when it chose plain decoding).
      config: the call's settings as given (its ``draft`` names the culprit in a ``NonFiniteLogitsError``).
      prompt_len: the positions per row the prefill reads (``Buckets.prompt_len``: whole chunks).
      automata: the rows' compiled constraints (``Request.automata``), or None.
    """

    spec: loop.LoopSpec
    inputs: loop.LoopInputs
    num_rows: int
    tokenizer: object
    shard_draft: bool = True
    decision: policy_lib.Decision | None = None
    policy: policy_lib.AutoGamma | None = None
    draft: CausalLM | Drafter | None = None
    target: CausalLM | None = None
    drafter: object = None
    config: GenerationConfig = GenerationConfig()
    prompt_len: int = 0
    automata: tuple | None = None

    def placed_params(self) -> tuple:
        """``(target_params, draft_params)`` placed as the loop takes them (``inputs.place_params``)."""
        assert self.target is not None  # prepare sets it
        return inputs_lib.place_params(self.target, self.draft, self.spec.mesh, self.shard_draft)


def prepare(target, prompts, config: GenerationConfig | None = None, **settings) -> Prepared:
    """Stages 1-3 of ``generate`` (same arguments): check and tokenize, bucket and build the inputs, choose γ.

    Raises ``TypeError``/``ValueError`` on bad input before compiling anything; with ``gamma="auto"`` the γ
    decision may compile and time candidate loops. Turns the persistent compilation cache on unless the process
    chose otherwise (``jaxspec.loop.compile_cache.use_default``).
    """
    request = make_request(target, prompts, config, **settings)
    compile_cache.use_default()  # the persistent compilation cache, unless this process chose otherwise
    shape = inputs_lib.buckets(request)
    g, decision, policy = choose_gamma(request, shape, trees=True)
    drafter = request.drafter  # what the policy keys its estimates by: chains and trees alike
    if decision is not None and decision.tree is not None:
        request = with_tree(request, decision.tree)
    return Prepared(
        spec=inputs_lib.loop_spec(request, shape.cache_len, g),
        inputs=inputs_lib.loop_inputs(request, shape),
        num_rows=request.num_rows,
        tokenizer=request.target.tokenizer,
        shard_draft=request.shard_draft,
        decision=decision,
        policy=policy,
        draft=drafter if g > 0 else None,
        target=request.target,
        drafter=drafter if decision is not None else None,
        config=request.config,
        prompt_len=shape.prompt_len,
        automata=request.automata,
    )


def run(prep: Prepared) -> tuple[loop.State, float, float]:
    """Stage 4: run the whole loop; ``(final state, run seconds without compilation, compile seconds)``."""
    tparams, dparams = prep.placed_params()
    start = time.perf_counter()
    if prep.decision is None:
        state, compile_s = loop.generate_program(prep.spec, tparams, dparams, prep.inputs)
    else:  # gamma="auto": a prefill, then the rounds program (timed apart: the policy learns its round cost)
        limit = inputs_lib.replicated_scalar(prep.spec.mesh, np.iinfo(np.int32).max)
        state = loop.prefilled_state(prep.spec, tparams, dparams, prep.inputs)
        compile_s = loop.compile_programs(  # both compiled at once, before either runs
            [
                (loop.prefill_program, prep.spec, tparams, dparams, prep.inputs),
                (loop.rounds_program, prep.spec, tparams, dparams, state, limit, limit),
            ]
        )
        fresh = compile_s > 0  # a program's first run pays one-time costs: the policy does not learn from it
        before = time.perf_counter()
        state, seconds = loop.prefill_program(prep.spec, tparams, dparams, prep.inputs)
        state = jax.block_until_ready(state)
        compile_s += seconds
        prefill_s = time.perf_counter() - before - seconds
        before = time.perf_counter()
        state, seconds = loop.rounds_program(prep.spec, tparams, dparams, state, limit, limit)
        rounds = int(np.max(sharding.to_host(state.rounds)))
        rounds_s = time.perf_counter() - before - seconds
        compile_s += seconds
        assert prep.policy is not None  # prepare sets it with the decision
        batch, prompt_tokens = prep.inputs.prompt.shape[0], prep.prompt_len  # the positions the prefill reads
        prep.policy.observe_call(  # may time the policy's load reference: part of the call's time
            prep.target,
            prep.drafter,
            batch,
            prep.spec.cache_len,
            prep.spec.drafter.tree or prep.spec.gamma,
            prefill=(prompt_tokens, prefill_s),
            rounds=(rounds_s, rounds),
            fresh=fresh or seconds > 0,
            mesh_key=mesh_key(prep.spec.mesh, prep.shard_draft),
        )
    state = jax.block_until_ready(state)
    return state, time.perf_counter() - start - compile_s, compile_s


def finish(prep: Prepared, state: loop.State, wall_time_s: float, compile_time_s: float) -> GenerationResult:
    """Stage 5: the ``GenerationResult`` of the final ``state``; with ``gamma="auto"`` the acceptance seen is fed
    back into the policy's running estimate. The draft as the caller gave it names the culprit in a
    ``NonFiniteLogitsError``."""
    assert prep.target is not None  # prepare sets it
    draft = prep.config.draft
    kind = "draft model" if isinstance(draft, CausalLM) else "draft"
    names = f"target model {prep.target.name!r}", f"{kind} {getattr(draft, 'name', draft)!r}"
    result = results.build_result(
        state,
        num_rows=prep.num_rows,
        gamma=prep.spec.gamma,
        cache_len=prep.spec.cache_len,
        tokenizer=prep.tokenizer,
        policy=None if prep.decision is None else prep.decision.as_dict(),
        wall_time_s=wall_time_s,
        compile_time_s=compile_time_s,
        model_names=names,
        automata=prep.automata,
    )
    stats = result.stats
    if prep.decision is not None and stats.drafted:
        assert prep.policy is not None  # prepare sets it with the decision
        temperature = np.ravel(sharding.to_host(prep.inputs.sampling.temperature))[: prep.num_rows]
        prep.policy.observe(
            prep.target,
            prep.draft,
            bool(np.all(temperature == 0)),  # every row greedy
            stats.accepted,
            stats.drafted,
            stats.accept_hist,
            batch=prep.inputs.prompt.shape[0],
            passes=stats.target_passes,
            row_tokens=[r.generated_tokens for r in stats.rows],
            row_rounds=[r.rounds for r in stats.rows],
            tree=prep.spec.drafter.tree,
        )
    return result


def generate(target: CausalLM, prompts, config: GenerationConfig | None = None, **settings) -> GenerationResult:
    """Generate continuations of ``prompts`` with ``target``, speculatively when a draft is given.

    Args:
      target: the model whose distribution the output follows exactly.
      prompts: list of token-id lists (any lengths), an int array ``[B, T]``, or strings (needs a tokenizer).
      config: a ``jaxspec.GenerationConfig`` (None: its defaults).
      **settings: any field of ``GenerationConfig`` (``draft``, ``gamma``, ``max_new_tokens``, ``temperature``,
        ``top_k``, ``top_p``, ``eos_token_id``, ``seed``, ``max_length``, ``acceptance``, ``chat``, ``mesh``,
        ``shard_draft``, ``policy``), over ``config``'s. ``GenerationConfig`` documents each.

    Returns a ``GenerationResult`` with ``tokens``, ``logprobs``, ``finish_reasons``, ``texts`` and ``stats``.
    Raises ``TypeError``/``ValueError`` for bad input before compiling, ``NonFiniteLogitsError`` after the call
    if a model produced NaN/inf logits.
    """
    prep = prepare(target, prompts, config, **settings)
    state, wall, compile_s = run(prep)
    return finish(prep, state, wall, compile_s)


class Stream:
    """Iterator over ``StreamStep``s, one per round; ``.result`` holds the ``GenerationResult`` at the end."""

    def __init__(self, prep: Prepared):
        self._prep = prep
        self.result: GenerationResult | None = None

    def __iter__(self) -> Iterator[StreamStep]:
        prep = self._prep
        tparams, dparams = prep.placed_params()
        start = time.perf_counter()
        state, compile_s = loop.prefill_program(prep.spec, tparams, dparams, prep.inputs)
        n = prep.num_rows
        emitted = sharding.to_host(prep.inputs.prompt_len)[:n].copy()
        plen = emitted.copy()
        texts_so_far = [""] * n
        one = inputs_lib.replicated_scalar(prep.spec.mesh, 1)
        never = inputs_lib.replicated_scalar(prep.spec.mesh, np.iinfo(np.int32).max)
        while True:
            state, seconds = loop.rounds_program(prep.spec, tparams, dparams, state, one, never)
            compile_s += seconds
            length, done = sharding.to_host((state.length, state.done))
            length = length[:n]
            tokens = sharding.to_host(state.tokens)[:n] if (length > emitted).any() else None
            new = [tokens[b, emitted[b] : length[b]].tolist() if tokens is not None else [] for b in range(n)]
            texts = None
            if prep.tokenizer is not None:
                texts = []
                for b in range(n):
                    full = (
                        results.decode(prep.tokenizer, tokens[b, plen[b] : length[b]].tolist())
                        if tokens is not None and new[b]
                        else ""
                    )
                    if not new[b] or full.endswith("\ufffd"):  # hold back incomplete UTF-8 sequences
                        texts.append("")
                        continue
                    texts.append(full[len(texts_so_far[b]) :])
                    texts_so_far[b] = full
            emitted = np.maximum(emitted, length)
            yield StreamStep(new, texts)
            if done.all():
                break
        wall = time.perf_counter() - start - compile_s
        self.result = finish(prep, state, wall, compile_s)


def stream(target: CausalLM, prompts, config: GenerationConfig | None = None, **settings) -> Stream:
    """Like ``generate`` (same arguments), but iterate to receive each row's newly verified tokens after every
    round. Arguments are checked now (errors before anything compiles); the loop runs while the ``Stream`` is
    iterated."""
    return Stream(prepare(target, prompts, config, **settings))
