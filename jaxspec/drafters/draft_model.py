"""A draft ``CausalLM`` as a drafter: γ steps of the draft model per round, its KV cache as the drafter's state."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp

from jaxspec.core.sampling import sample, warp
from jaxspec.drafters import branching
from jaxspec.drafters.base import Drafter, Proposal, TreeProposal, bad_logits


@dataclasses.dataclass(frozen=True)
class ModelDrafter(Drafter):
    """A draft ``CausalLM`` (its ``apply_fn`` and ``init_cache``; the weights come in as ``params``).

    Its state is its KV cache. It holds valid entries for positions ``0 .. length-3`` at least; each round's first
    step feeds the two newest tokens ``(length-2, length-1)`` (the ``catch_up`` newest, if more), then γ-1
    one-token steps, each token sampled from the warped draft logits with the round's keys.

    ``vocab_size`` is the draft's own. It may differ from the target's (Qwen2.5 0.5B's 151 936 ids drafting for
    7B's 152 064, Gemma 3 1B's 262 144 for 4B's 262 208: padded embedding tables of one tokenizer): the draft's
    logits are cut to the target's ids or padded with -inf (q = 0 there), so rejection sampling stays exact, and a
    token id past the draft's table is fed to it as its last id (its proposals after such a token are poorer,
    never wrong). The ids both models have must mean the same tokens.
    """

    apply_fn: Callable
    init_cache: Callable
    name: str = "draft"
    catch_up: int = 0
    vocab_size: int | None = None
    tree: tuple[int, int, int] | None = None

    @classmethod
    def of(cls, model) -> ModelDrafter:
        """The drafter of a ``CausalLM``."""
        return cls(model.apply_fn, model.init_cache, model.name, vocab_size=model.vocab_size)

    def _ids(self, tokens: jax.Array) -> jax.Array:
        """Token ids the draft can embed: those past its table become its last id."""
        return tokens if self.vocab_size is None else jnp.minimum(tokens, self.vocab_size - 1)

    @staticmethod
    def _fit(logits: jax.Array, vocab_size: int) -> jax.Array:
        """Draft logits ``[..., V_draft]`` -> ``[..., vocab_size]`` (the target's): cut, or padded with -inf."""
        own = logits.shape[-1]
        if own > vocab_size:
            return logits[..., :vocab_size]
        if own < vocab_size:
            pad = [(0, 0)] * (logits.ndim - 1) + [(0, vocab_size - own)]
            return jnp.pad(logits, pad, constant_values=-jnp.inf)
        return logits

    def with_tree(self, tree) -> ModelDrafter:
        """A copy drafting trees of shape ``tree = (depth, branch, width)`` each round (None: chains)."""
        return dataclasses.replace(self, tree=None if tree is None else branching.check_tree(tree))

    def init_state(self, batch: int, cache_len: int):
        """A fresh KV cache (``init_cache(batch, cache_len)``)."""
        return self.init_cache(batch, cache_len)

    def catching_up(self, new: int) -> ModelDrafter:
        """A copy whose first step feeds (at least) the ``new`` newest tokens."""
        return dataclasses.replace(self, catch_up=max(self.catch_up, new))

    def prefill(self, params, prompt, positions, state):
        """The cache after a forward pass over the prompt's chunk ``prompt`` at ``positions``."""
        return self.apply_fn(params, self._ids(prompt), positions, state)[1]

    def draft(self, params, state, tokens, length, sampling, keys, vocab_size: int) -> Proposal:
        """γ draft-model steps (the first over the two newest tokens, or the ``catch_up`` newest)."""
        gamma = keys.shape[1]
        rows = jnp.arange(tokens.shape[0])[:, None]
        pos_last = length - 1
        feed = max(2, self.catch_up)
        fed = jnp.maximum(length[:, None] - feed + jnp.arange(feed, dtype=jnp.int32), 0)
        logits, cache = self.apply_fn(params, self._ids(tokens[rows, fed]), fed, state)
        last = self._fit(logits[:, -1], vocab_size)
        q0 = warp(last, sampling)
        d1 = jax.vmap(sample)(keys[:, 0], q0)
        bad = bad_logits(last)

        def step(carry, xs):
            cache, tok, bad, sampling = carry
            key, offset = xs
            logits, cache = self.apply_fn(params, self._ids(tok[:, None]), (pos_last + offset)[:, None], cache)
            logits = self._fit(logits[:, 0], vocab_size)
            q = warp(logits, sampling)
            nxt = jax.vmap(sample)(key, q)
            return (cache, nxt, bad | bad_logits(logits), sampling.advanced(nxt)), (nxt, q)

        (cache, _, bad, _), (rest, q_rest) = jax.lax.scan(
            step, (cache, d1, bad, sampling.advanced(d1)), (keys[:, 1:].T, jnp.arange(1, gamma, dtype=jnp.int32))
        )
        drafts = jnp.concatenate([d1[:, None], rest.T], axis=1)
        q = jnp.concatenate([q0[:, None], jnp.swapaxes(q_rest, 0, 1)], axis=1)
        return Proposal(drafts, q, cache, bad)

    def draft_tree(
        self, params, state, tokens, length, sampling, keys, vocab_size: int, *, depth: int, branch: int, width: int
    ) -> TreeProposal:
        """A draft tree per row (``keys [B, depth]``; how it grows: ``branching.grow``). The first pass feeds the
        ``depth + 1`` newest tokens (the ``catch_up`` newest, if more): a tree round leaves its nodes' entries in
        the cache at slots that are not their positions, so the tokens it accepted are read again; node ``i`` is
        then written at slot ``L-1+i`` (the root, token ``L-1``, at its own)."""
        rows = jnp.arange(tokens.shape[0])[:, None]
        feed = max(2, depth + 1, self.catch_up)
        fed = jnp.maximum(length[:, None] - feed + jnp.arange(feed, dtype=jnp.int32), 0)
        logits, cache = self.apply_fn(params, self._ids(tokens[rows, fed]), fed, state)

        def level_pass(cache, node_tokens, parent, first, positions):
            out, cache = self.apply_fn(params, self._ids(node_tokens), positions, cache)
            return self._fit(out, vocab_size), cache

        node_tok, parent, rank, q, cache, bad = branching.grow(
            self._fit(logits[:, -1], vocab_size),
            level_pass,
            cache,
            sampling,
            keys,
            length,
            depth=depth,
            branch=branch,
            width=width,
        )
        return TreeProposal(node_tok, parent, rank, q, cache, bad)
