"""Prefill and speculative rounds inside one jit-compiled ``lax.while_loop``; plain decoding is ``gamma = 0``.

Invariants per row (``L = length``, the number of tokens in ``tokens[b]``, prompt included):
  * the target cache holds valid keys/values for positions ``0 .. L-2``; token ``L-1`` is fed by the next
    verify pass (the last prompt token is re-fed after prefill, which rewrites identical values);
  * the draft cache holds valid entries for ``0 .. L-3`` at least; each round's first draft step feeds the
    two newest tokens ``(L-2, L-1)``, so the draft catches up after a rejection *and* after a bonus token;
  * slots ``>= L`` may hold stale data; attention masks them and the next writes overwrite them.

A round: γ draft steps -> one target pass over ``[last, d_1..d_γ]`` -> rejection sampler -> emit the
accepted drafts plus one corrected/bonus token, truncated at EOS, ``max_new_tokens`` and the cache end.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from jaxspec.core.grammar import Grammar
from jaxspec.core.sampling import SamplingParams, warp
from jaxspec.drafters.base import Proposal, bad_logits
from jaxspec.loop.commit import commit, target_pass
from jaxspec.loop.state import (
    FINISH_PADDING,
    RUNNING,
    LoopInputs,
    LoopSpec,
    State,
    constrain_state,
    state_shardings,
    zero_counters,
)
from jaxspec.loop.tree import tree_round
from jaxspec.parallel import sharding


def _per_row(inputs: LoopInputs, batch: int) -> tuple[jax.Array, SamplingParams]:
    """``(eos [B, E], sampling with [B] fields)``: one EOS set or scalar parameters broadcast to every row."""
    eos = inputs.eos if inputs.eos.ndim == 2 else jnp.broadcast_to(inputs.eos, (batch, inputs.eos.shape[0]))
    sampling = jax.tree.map(lambda x: jnp.broadcast_to(x, (batch,)), inputs.sampling)
    return eos, sampling


def prefill(spec: LoopSpec, target_params, draft_params, inputs: LoopInputs) -> State:
    """The initial state: the target and the drafter read the padded prompts into fresh caches/state.

    The prompts are read in chunks of ``spec.prefill_chunk`` positions, in order, as many as the longest active
    prompt needs (a traced count: one compiled program serves every prompt length up to ``cache_len``): each chunk
    is one target pass at its positions (its features, for a ``features`` drafter, go to ``Drafter.observe``)
    then the drafter's ``prefill`` over the same chunk. Each cache entry is the one a single pass over the whole
    prompt writes: a position attends to the slots before it, written by earlier chunks or by its own.

    Generates nothing (``length = prompt_len``; the first round re-feeds the last prompt token). Positions past a
    row's prompt, up to the end of its last chunk, hold stale entries until overwritten."""
    batch, plen = inputs.prompt.shape
    size, width = spec.cache_len, spec.prefill_chunk
    if plen > size:
        raise ValueError(f"prefill: prompts of {plen} positions do not fit cache_len={size}")
    tokens = jnp.zeros((batch, size), jnp.int32).at[:, :plen].set(inputs.prompt)
    padded = jnp.pad(tokens, ((0, 0), (0, spec.prefill_chunks(size) * width - size)))
    longest = jnp.max(jnp.where(inputs.active, inputs.prompt_len, 1))
    chunks = (longest + width - 1) // width

    def placed(cache):
        return cache if spec.mesh is None else sharding.constrain(cache, sharding.cache_sharding(cache, spec.mesh))

    def chunk(c, carry):
        target_cache, draft_state = carry
        start = c * width
        part = jax.lax.dynamic_slice_in_dim(padded, start, width, axis=1)
        positions = start + jnp.broadcast_to(jnp.arange(width, dtype=jnp.int32), (batch, width))
        _, feats, target_cache = target_pass(spec, target_params, part, positions, target_cache)
        if feats is not None:
            draft_state = spec.drafter.observe(draft_state, feats, positions)
        draft_state = spec.drafter.prefill(draft_params, part, positions, draft_state)
        return placed(target_cache), draft_state

    caches = placed(spec.target_init_cache(batch, size)), placed(spec.drafter.init_state(batch, size))
    target_cache, draft_state = jax.lax.fori_loop(0, chunks, chunk, caches)
    row_keys = jax.vmap(lambda s, i: jax.random.fold_in(jax.random.key(s), i))(inputs.seeds, inputs.row_ids)
    eos, sampling = _per_row(inputs, batch)
    state = State(
        tokens=tokens,
        logprobs=jnp.zeros((batch, size), jnp.float32),
        length=inputs.prompt_len,
        prompt_len=inputs.prompt_len,
        max_new=inputs.max_new,
        done=~inputs.active,
        finish=jnp.where(inputs.active, RUNNING, FINISH_PADDING).astype(jnp.int32),
        row_keys=row_keys,
        eos=eos,
        sampling=sampling,
        **zero_counters(spec, batch),
        target_cache=target_cache,
        draft_state=draft_state,
        grammar=inputs.grammar,
    )
    return constrain_state(spec, state)


def round_step(spec: LoopSpec, target_params, draft_params, state: State) -> State:
    """One round for every row: γ drafts, one target pass over ``[last, d_1..d_γ]``, the rejection sampler.

    A running row appends its ``n`` accepted drafts and one corrected/bonus token, cut after the first EOS and at
    ``max_new`` and ``cache_len``, with their log-probs; ``finish`` and the counters follow. Rows already done keep
    every field but the caches (the passes still run over them: they re-feed their last tokens, or hit stale slots).

    When the drafter marks which rows propose (``Proposal.proposed``) and no running row does, the round is a plain
    step instead (``lax.cond``): one target pass over ``[last]``, one token per row, no drafts counted. When it gives
    each row's number of drafts (``Proposal.lengths``), the round verifies over the smallest of its
    ``verify_widths`` that holds every running row's drafts (``lax.switch``), each row up to its own length."""
    if spec.drafter.tree is not None:
        if state.grammar is not None:
            raise ValueError("constraints (grammar) are not supported with draft trees; draft chains instead")
        return tree_round(spec, target_params, draft_params, state)
    gamma = spec.gamma
    round_keys = jax.vmap(lambda k, r: jax.random.split(jax.random.fold_in(k, r), gamma + 1))(
        state.row_keys, state.rounds
    )
    sampling = state.sampling
    if state.grammar is not None:  # the drafter masks its draws by each row's state, advanced along them
        sampling = dataclasses.replace(sampling, grammar=state.grammar)
    proposal = spec.drafter.draft(
        draft_params,
        state.draft_state,
        state.tokens,
        state.length,
        sampling,
        round_keys[:, :gamma],
        spec.vocab_size,
    )
    if state.grammar is not None and gamma > 0:
        proposal = _forced(state.grammar, proposal)
    if gamma > 0 and proposal.lengths is not None:
        widths = sorted({w for w in spec.drafter.verify_widths(gamma) if 0 <= w < gamma} | {gamma})
        lengths = jnp.clip(proposal.lengths, 0, gamma)
        need = jnp.max(jnp.where(state.done, 0, lengths))
        index = jnp.sum(jnp.asarray(widths[:-1], jnp.int32) < need)  # the smallest width >= need

        def verify_at(width):
            cut = proposal._replace(tokens=proposal.tokens[:, :width], q=proposal.q[:, :width])
            return lambda s: _verify(spec, target_params, s, cut, round_keys, jnp.minimum(lengths, width))

        if len(widths) == 1:
            return verify_at(gamma)(state)
        return jax.lax.switch(index, [verify_at(w) for w in widths], state)
    if gamma == 0 or proposal.proposed is None:
        return _verify(spec, target_params, state, proposal, round_keys)
    plain = proposal._replace(tokens=proposal.tokens[:, :0], q=proposal.q[:, :0])
    return jax.lax.cond(
        jnp.any(~state.done & proposal.proposed),
        lambda s: _verify(spec, target_params, s, proposal, round_keys),
        lambda s: _verify(spec, target_params, s, plain, round_keys),
        state,
    )


def _forced(grammar: Grammar, proposal: Proposal) -> Proposal:
    """``proposal`` with each draft whose state (along the drafts) allows a single token replaced by that token,
    drawn with q = 1: whatever the drafter proposed (prompt lookup's copies included), the target's masked
    distribution is one-hot there too, so the token is accepted for certain and a JSON skeleton costs no
    rejections. Exact: each later draft is still drawn from the q it carries, independently of the verifier."""
    vocab = proposal.q.shape[-1]

    def one(state, xs):
        tok, q = xs
        here = grammar.at(state)
        only, token = here.forced()
        tok = jnp.where(only, token, tok)
        q = jnp.where(only[:, None], jax.nn.one_hot(token, vocab, dtype=q.dtype), q)
        return here.step(tok), (tok, q)

    _, (tokens, q) = jax.lax.scan(one, grammar.state, (proposal.tokens.T, jnp.swapaxes(proposal.q, 0, 1)))
    return proposal._replace(tokens=tokens.T, q=jnp.swapaxes(q, 0, 1))


def _verify(spec: LoopSpec, target_params, state: State, proposal, round_keys, limits=None) -> State:
    """The rest of a round: the target pass over ``[last, proposal's drafts]`` (no drafts: a plain step), the
    rejection sampler, the emitted tokens and the counters (drafts and the accept histogram only for a round that
    verified all γ drafts, or for plain decoding's rounds). ``limits`` (``[B] int32`` or None): each row's real
    drafts among them; drafts past a row's limit are never accepted nor counted, and only rows verified over all
    γ drafts enter the histogram."""
    gamma = proposal.tokens.shape[1]
    batch = state.tokens.shape[0]
    rows = jnp.arange(batch)
    active = ~state.done
    pos_last = state.length - 1
    last = state.tokens[rows, pos_last]
    drafts, q, draft_state, bad_draft = proposal.tokens, proposal.q, proposal.state, proposal.bad

    verify_tokens = jnp.concatenate([last[:, None], drafts], axis=1)
    offsets = jnp.arange(gamma + 1, dtype=jnp.int32)
    positions = pos_last[:, None] + offsets[None]
    logits, feats, target_cache = target_pass(spec, target_params, verify_tokens, positions, state.target_cache)
    if feats is not None:
        draft_state = spec.drafter.observe(draft_state, feats, positions)
    logits = logits.astype(jnp.float32)
    raw = logits
    grammar, forced = state.grammar, None
    if grammar is not None:  # position j is masked by the row's state after its drafts d_1..d_j
        states = grammar.path(drafts)
        logits = grammar.at(states).mask(logits)
        forced = grammar.at(states).forced()[0]
    p = warp(logits, state.sampling)
    if limits is None:
        n, nxt = spec.acceptance(round_keys[:, spec.gamma], drafts, q, p)
        drafted, full_rows = jnp.full((batch,), gamma, jnp.int32), active
    else:
        n, nxt = spec.acceptance(round_keys[:, spec.gamma], drafts, q, p, limits)
        drafted, full_rows = limits, active & (limits == spec.gamma)

    # Emitted tokens: d_1..d_n then the correction/bonus token.
    cand = jnp.where(offsets[None] < n[:, None], jnp.concatenate([drafts, nxt[:, None]], axis=1), nxt[:, None])
    token_logprobs = jnp.take_along_axis(jax.nn.log_softmax(logits, axis=-1), cand[:, :, None], axis=-1)[..., 0]
    used = offsets[None] <= n[:, None]  # target positions that decided something this round
    bad_target = active & jnp.any(bad_logits(raw) & used, axis=1)
    path = None
    if grammar is not None:  # the state after each number of emitted tokens: d_1..d_n, then the correction/bonus
        after = grammar.at(states[rows, n]).step(nxt)
        ahead = jnp.concatenate([states, after[:, None]], axis=1)
        path = jnp.where(jnp.arange(gamma + 2)[None] <= n[:, None], ahead, after[:, None])
    return commit(
        spec,
        state,
        cand,
        n,
        token_logprobs,
        drafted=drafted,
        full_rows=full_rows,
        full=gamma == spec.gamma,
        bad_target=bad_target,
        bad_draft=active & bad_draft,
        target_cache=target_cache,
        draft_state=draft_state,
        forced=forced,
        grammar_path=path,
    )


def run(spec: LoopSpec, target_params, draft_params, state: State, max_rounds, stop_after) -> State:
    """Run rounds until every row is done, or ``max_rounds`` rounds have run, or ``stop_after`` of the rows
    running at entry have finished (the continuous-batching engine's cue to refill slots; pass more than the
    batch size to never stop for that)."""
    running_at_entry = ~state.done

    def cond(carry):
        i, s = carry
        finished = jnp.sum(running_at_entry & s.done)
        return jnp.any(~s.done) & (i < max_rounds) & (finished < stop_after)

    def body(carry):
        i, s = carry
        return i + 1, round_step(spec, target_params, draft_params, s)

    _, state = jax.lax.while_loop(cond, body, (jnp.int32(0), state))
    return state


def timing_state(spec: LoopSpec, batch: int, length: int, greedy: bool) -> State:
    """A synthetic loop state for timing rounds (``jaxspec.policy``): ``batch`` running rows of ``length`` zero
    tokens, empty (zero) caches, no EOS and no length limit, so every row keeps running. Built on device (placed
    by ``state_shardings`` on ``spec.mesh``): no host transfer of the caches."""
    return _timing_state_fn(spec, batch, length, greedy)()


@functools.cache
def _timing_state_fn(spec: LoopSpec, batch: int, length: int, greedy: bool):
    def make() -> State:
        zeros = jnp.zeros((batch,), jnp.int32)
        full = jnp.full((batch,), length, jnp.int32)
        keys = jax.vmap(lambda i: jax.random.fold_in(jax.random.key(0), i))(jnp.arange(batch, dtype=jnp.uint32))
        return State(
            tokens=jnp.zeros((batch, spec.cache_len), jnp.int32),
            logprobs=jnp.zeros((batch, spec.cache_len), jnp.float32),
            length=full,
            prompt_len=full,
            max_new=jnp.full((batch,), spec.cache_len, jnp.int32),
            done=jnp.zeros((batch,), bool),
            finish=zeros,
            row_keys=keys,
            eos=jnp.full((batch, 4), -1, jnp.int32),
            sampling=SamplingParams.create(0.0 if greedy else 1.0, batch=batch),
            **zero_counters(spec, batch),
            target_cache=spec.target_init_cache(batch, spec.cache_len),
            draft_state=spec.drafter.init_state(batch, spec.cache_len),
        )

    if spec.mesh is None:
        return jax.jit(make)
    return jax.jit(make, out_shardings=state_shardings(spec, jax.eval_shape(make)))
