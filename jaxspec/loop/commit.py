"""What every round (chain or tree) shares: the target's pass, through a features drafter's hook when it has one,
and the commit of a round's emitted tokens into the loop state."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxspec.loop.state import (
    FINISH_CACHE,
    FINISH_EOS,
    FINISH_LENGTH,
    RUNNING,
    LoopSpec,
    State,
    constrain_state,
)


def target_pass(spec: LoopSpec, params, tokens, positions, cache):
    """``(logits, hidden states or None, cache)``: the target's pass, through the drafter's ``target_features``
    when it drafts from the target's features (``Drafter.features``)."""
    if spec.drafter.features:
        # only features drafters define target_features (the protocol in jaxspec.drafters.base)
        return spec.drafter.target_features(params, tokens, positions, cache)  # type: ignore[attr-defined]
    logits, cache = spec.target_apply(params, tokens, positions, cache)
    return logits, None, cache


def commit(
    spec: LoopSpec,
    state: State,
    cand,
    n,
    token_logprobs,
    *,
    drafted,
    full_rows,
    full: bool,
    bad_target,
    bad_draft,
    target_cache,
    draft_state,
    forced=None,
    grammar_path=None,
) -> State:
    """The end of a round (chain or tree): each running row appends ``cand [B, K]``'s first ``n + 1`` tokens (``n``
    accepted drafts, then the correction or bonus token) with their log-probabilities ``token_logprobs [B, K]``,
    cut after the first EOS and at ``max_new`` and ``cache_len``; ``finish``, the counters (``drafted`` drafts per
    running row, the histogram of ``n`` for ``full_rows`` when ``full``) and the flags follow; the caches are
    replaced. With a constraint: ``forced [B, K] bool`` marks positions whose state allowed one token (counted
    where emitted) and ``grammar_path [B, K+1]`` is each row's state after k of ``cand``'s tokens: a row takes the
    state after the tokens it emitted (a cut at ``max_new`` leaves no token unaccounted for)."""
    size, batch, width = spec.cache_len, state.tokens.shape[0], cand.shape[1]
    rows = jnp.arange(batch)
    active = ~state.done
    offsets = jnp.arange(width, dtype=jnp.int32)
    count = n + 1
    is_eos = jnp.any(cand[:, :, None] == state.eos[:, None, :], axis=-1) & (offsets[None] < count[:, None])
    has_eos = jnp.any(is_eos, axis=1)
    count = jnp.where(has_eos, jnp.argmax(is_eos, axis=1) + 1, count)
    room_new = state.max_new - (state.length - state.prompt_len)
    room_cache = size - state.length
    count = jnp.where(active, jnp.minimum(count, jnp.minimum(room_new, room_cache)), 0)
    eos_hit = has_eos & (jnp.argmax(is_eos, axis=1) < count)

    write_pos = jnp.where(offsets[None] < count[:, None], state.length[:, None] + offsets[None], size)
    tokens = state.tokens.at[rows[:, None], write_pos].set(cand, mode="drop")
    logprobs = state.logprobs.at[rows[:, None], write_pos].set(token_logprobs, mode="drop")
    length = state.length + count

    finish = jnp.where(
        ~active,
        state.finish,
        jnp.where(
            eos_hit,
            FINISH_EOS,
            jnp.where(
                length - state.prompt_len >= state.max_new,
                FINISH_LENGTH,
                jnp.where(length >= size, FINISH_CACHE, RUNNING),
            ),
        ),
    )
    active_i = active.astype(jnp.int32)
    state = dataclasses.replace(
        state,
        tokens=tokens,
        logprobs=logprobs,
        length=length,
        done=finish != RUNNING,
        finish=finish,
        rounds=state.rounds + active_i,
        drafted=state.drafted + drafted * active_i,
        accepted=state.accepted + n * active_i,
        accept_hist=state.accept_hist
        + (full_rows.astype(jnp.int32)[:, None] * jax.nn.one_hot(n, spec.gamma + 1, dtype=jnp.int32) if full else 0),
        bad_target=state.bad_target | bad_target,
        bad_draft=state.bad_draft | bad_draft,
        forced=state.forced
        + (0 if forced is None else jnp.sum(forced & (offsets[None] < count[:, None]), axis=1, dtype=jnp.int32)),
        target_cache=target_cache,
        draft_state=draft_state,
        grammar=state.grammar
        if grammar_path is None
        else state.grammar.at(jnp.where(active, grammar_path[rows, count], state.grammar.state)),
    )
    return constrain_state(spec, state)
