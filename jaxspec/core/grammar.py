"""Token-level automata on device: each row's constraint (a JSON schema, a regular expression, a list of choices,
compiled on the host by ``jaxspec.generation.constraints``) as fixed-shape arrays, so masking and advancing never
leave the compiled loop and a new constraint changes array values, not programs.

Layout, per row: tokens whose transitions agree from every state share a *class* (``token_class [V]``); the
automaton is a table ``next_state [S, C]`` (the state after a token of class c from state s; -1: the token is not
allowed there). A JSON schema over a 49 k vocabulary has ~100 states and ~100 classes, so the table is small and
one gather of ``[V]`` class ids gives a state's allowed tokens. Rows of a batch are padded to shared ``S`` and
``C``; a row without a constraint has one state and one class that allows every token (its mask is all-true).

Masks apply to logits before warping (temperature, top-k, top-p), for the target and the drafter alike, so
speculative output is exactly sampling from the masked, renormalized target (``jaxspec.core.sampling.warp``).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

NEG_INF = -jnp.inf


class Grammar(NamedTuple):
    """The rows' automata and where each row (or each position of a row) stands (a pytree of arrays).

    Attributes:
      token_class: ``[B, V] int32``: the class of each token id in row b's automaton.
      next_state: ``[B, S, C] int32``: the state after a token of class c from state s; -1: not allowed.
      state: ``[B]`` or ``[B, T] int32``: the current state of each row (or of each of T positions).
    """

    token_class: jax.Array
    next_state: jax.Array
    state: jax.Array

    def rows(self) -> jax.Array:
        """``[B, (T,) C]``: the table rows of the current states."""
        if self.state.ndim == 1:
            return jnp.take_along_axis(self.next_state, self.state[:, None, None], axis=1)[:, 0]
        return jnp.take_along_axis(self.next_state, self.state[:, :, None], axis=1)

    def allowed(self) -> jax.Array:
        """``[B, (T,) V] bool``: the tokens each state allows."""
        rows = self.rows()
        classes = self.token_class if rows.ndim == 2 else self.token_class[:, None, :]
        classes = jnp.broadcast_to(classes, rows.shape[:-1] + self.token_class.shape[-1:])
        return jnp.take_along_axis(rows, classes, axis=-1) >= 0

    def mask(self, logits: jax.Array) -> jax.Array:
        """``logits [B, (T,) V]`` with the tokens the states do not allow at -inf. Where no allowed token has a
        finite logit (a drafter whose vocabulary lacks every token the state allows), the allowed tokens get 0:
        a draft drawn uniformly among them, still exact (q is what it was drawn from)."""
        allowed = self.allowed()
        masked = jnp.where(allowed, logits, NEG_INF)
        empty = jnp.all(masked == NEG_INF, axis=-1, keepdims=True)
        return jnp.where(empty & allowed, 0.0, masked)

    def step(self, tokens: jax.Array) -> jax.Array:
        """``[B, (T)]`` the states after ``tokens`` (of the state's shape). A token the state does not allow (a
        deterministic drafter's proposal the verifier will reject) leaves the state as it was, so later positions
        still have tokens to allow."""
        cls = jnp.take_along_axis(self.token_class, tokens.reshape(tokens.shape[0], -1), axis=1).reshape(tokens.shape)
        nxt = jnp.take_along_axis(self.rows(), cls[..., None], axis=-1)[..., 0]
        return jnp.where(nxt >= 0, nxt, self.state)

    def advanced(self, tokens: jax.Array) -> Grammar:
        """This grammar after ``tokens [B]`` (one per row)."""
        return self._replace(state=self.step(tokens))

    def at(self, state: jax.Array) -> Grammar:
        """This grammar standing at ``state`` (``[B]`` or ``[B, T]``)."""
        return self._replace(state=state)

    def path(self, tokens: jax.Array) -> jax.Array:
        """``[B, T+1]``: the states before each of ``tokens [B, T]`` and after the last (state 0 of the result is
        the current one), advancing along them."""

        def one(state, tok):
            nxt = self.at(state).step(tok)
            return nxt, nxt

        _, after = jax.lax.scan(one, self.state, tokens.T)
        return jnp.concatenate([self.state[:, None], after.T], axis=1)

    def forced(self) -> tuple[jax.Array, jax.Array]:
        """``(forced [B, (T)] bool, token [B, (T)] int32)``: where the state allows exactly one token, and which."""
        allowed = self.allowed()
        return jnp.sum(allowed, axis=-1) == 1, jnp.argmax(allowed, axis=-1).astype(jnp.int32)


def unconstrained(batch: int, vocab: int) -> Grammar:
    """``batch`` rows that allow every token (one state, one class)."""
    return Grammar(
        jnp.zeros((batch, vocab), jnp.int32), jnp.zeros((batch, 1, 1), jnp.int32), jnp.zeros((batch,), jnp.int32)
    )
