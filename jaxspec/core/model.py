"""The model contract every jaxspec model satisfies.

A ``CausalLM`` is a pure forward function plus its parameters and a cache factory:

    apply_fn(params, tokens [B, T] int32, positions [B, T] int32, cache) -> (logits [B, T, V], cache)
    init_cache(batch_size, max_length) -> cache            (any pytree)

The engine never looks inside ``params`` or ``cache``. It relies on one rule: ``apply_fn`` writes the
keys/values of token ``tokens[b, t]`` at slot ``positions[b, t]`` of row ``b`` and lets that token attend to
slots ``<= positions[b, t]`` only. Slots past a row's current position may hold stale data (rejected draft
tokens, prompt padding); they are masked until overwritten, so rolling back costs nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

ApplyFn = Callable[[Any, jax.Array, jax.Array, Any], tuple[jax.Array, Any]]
InitCacheFn = Callable[[int, int], Any]


@dataclasses.dataclass(frozen=True, eq=False)
class CausalLM:
    """A causal language model as the engine sees it.

    Attributes:
      apply_fn: pure forward ``(params, tokens, positions, cache) -> (logits, cache)``. Keep the same function
        object across models that share an architecture: it is part of the compilation key.
      params: any pytree of arrays.
      init_cache: ``(batch_size, max_length) -> cache``; called inside jit, so it must build arrays with
        ``jnp`` (zeros), never read host state.
      vocab_size: size of the last logits axis.
      tokenizer: optional object with ``encode(str) -> list[int]`` and ``decode(list[int]) -> str``
        (a Hugging Face tokenizer works).
      config: optional architecture config (informational).
      eos_token_id: optional default end-of-sequence id(s) used when ``generate`` gets none.
      name: used in messages.
      param_axes: optional logical axes of the weights for sharding: ``{path: axes}`` with ``path`` a tuple of
        keys into ``params`` and ``axes`` one name per dimension from ``jaxspec.sharding.RULES`` (None:
        replicated); leaves under ``"layers"`` are looked up without it and get a leading ``"layers"`` axis.
        Unlisted weights are replicated. Built-in families fill it in.

    Raises ``TypeError`` when ``apply_fn`` or ``init_cache`` is not callable, ``ValueError`` when ``vocab_size`` is
    not a positive int.
    """

    apply_fn: ApplyFn
    params: Any
    init_cache: InitCacheFn
    vocab_size: int
    tokenizer: Any = None
    config: Any = None
    eos_token_id: int | tuple[int, ...] | None = None
    name: str = "model"
    param_axes: Any = None

    def __post_init__(self):
        if not callable(self.apply_fn):
            raise TypeError(f"CausalLM(apply_fn=...) must be callable, got {type(self.apply_fn).__name__}")
        if not callable(self.init_cache):
            raise TypeError(f"CausalLM(init_cache=...) must be callable, got {type(self.init_cache).__name__}")
        if not isinstance(self.vocab_size, int) or self.vocab_size < 1:
            raise ValueError(f"CausalLM(vocab_size=...) must be a positive int, got {self.vocab_size!r}")

    @classmethod
    def from_config(cls, fns: tuple[ApplyFn, InitCacheFn], config, params, **kwargs) -> CausalLM:
        """A built-in family's model: ``fns = (apply_fn, init_cache)`` for ``config`` (which has ``vocab_size``)."""
        apply_fn, init_cache = fns
        return cls(
            apply_fn=apply_fn,
            params=params,
            init_cache=init_cache,
            vocab_size=config.vocab_size,
            config=config,
            **kwargs,
        )

    def replace(self, **changes) -> CausalLM:
        """A copy with the given fields changed (``dataclasses.replace``; the checks of ``__init__`` run again)."""
        return dataclasses.replace(self, **changes)

    def logits(self, tokens) -> jax.Array:
        """Full-sequence logits ``[B, T, V]`` float32 for ``tokens [B, T]`` (``[T, V]`` for ``[T]``), positions
        ``0..T-1``, in a fresh cache of length ``T``. Raises ``ValueError`` unless ``tokens`` is ``[B, T]`` or
        ``[T]`` with ``T >= 1``."""
        tokens = jnp.asarray(tokens, jnp.int32)
        squeeze = tokens.ndim == 1
        if squeeze:
            tokens = tokens[None]
        if tokens.ndim != 2 or tokens.shape[1] == 0:
            raise ValueError(f"tokens must have shape [B, T] with T >= 1, got {tokens.shape}")
        out = _full_logits(self.apply_fn, self.init_cache, self.params, tokens)
        return out[0] if squeeze else out

    @property
    def num_params(self) -> int:
        """Number of parameters: the sum of the sizes of every array leaf of ``params``."""
        return sum(int(x.size) for x in jax.tree.leaves(self.params))

    @property
    def param_bytes(self) -> int:
        """Bytes of every array leaf of ``params`` at its stored dtype (repeated or shared arrays count each time)."""
        return sum(int(x.size) * x.dtype.itemsize for x in jax.tree.leaves(self.params))


def full_logits(apply_fn, init_cache, params, tokens: jax.Array) -> jax.Array:
    """``[B, T, V]`` float32 logits at every position of ``tokens [B, T]`` (positions ``0..T-1``, a fresh cache of
    length ``T``): the one full-sequence forward pass that training, distillation and ``CausalLM.logits`` share.
    Not jitted itself; call it inside a jitted loss or step."""
    batch, length = tokens.shape
    positions = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
    logits, _ = apply_fn(params, tokens, positions, init_cache(batch, length))
    return logits.astype(jnp.float32)


_full_logits = jax.jit(full_logits, static_argnums=(0, 1))
