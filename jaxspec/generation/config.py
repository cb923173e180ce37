"""``GenerationConfig``: the settings of one call, written once.

``generate``, ``stream``, ``prepare`` and ``Engine`` take a ``GenerationConfig`` and/or its fields as keywords
(``generate(target, prompts, temperature=0.7)``; keywords override the config's fields) and pass the one object on.
Nothing here is checked: ``jaxspec.generation.request.make_request`` checks every value against the target and the
prompts, before anything compiles, and names the argument in its error.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar


@dataclasses.dataclass(frozen=True, eq=False)
class GenerationConfig:
    """How to generate: the drafter, γ, how many tokens, how to sample, where to run.

    Attributes:
      draft: a cheaper ``CausalLM`` with the same tokenizer (its ``vocab_size`` may differ from the target's, as a
        family's padded tables do: exactness holds, see ``jaxspec.drafters.ModelDrafter``); a ``jaxspec.Drafter``
        (an EAGLE head from ``jaxspec.eagle.load``, a ``PromptLookup``, a ``LookupFirst``); ``"prompt_lookup"``
        (draft by copying n-grams from the row's own prompt and output); or None for plain decoding.
      gamma: draft tokens per round (static: each value compiles once), or ``"auto"``: pick γ among a few compiled
        values, or plain decoding, from measured costs and the acceptance seen so far (``jaxspec.policy``; the
        decision and its inputs are in ``stats.policy``). None: the drafter's own default
        (``Drafter.default_gamma``: 2 for an EAGLE-1-style head, 3 for an EAGLE-3 head, 4 for a draft model or prompt
        lookup).
      max_new_tokens: int, or one int per prompt (traced).
      temperature: warping applied to target and draft alike, a number or one per prompt (traced: never
        recompiles); 0 is greedy, so greedy and sampled rows can share a call.
      top_k: keep the k largest logits, a number or one per prompt (traced); 0 or None is off.
      top_p: keep the smallest set of tokens whose probability reaches p, a number or one per prompt (traced);
        1 or None is off.
      eos_token_id: int or ints ending a row; None: ``target.eos_token_id``.
      seed: int (row ``b`` uses ``fold_in(key(seed), b)``) or one int per prompt (a row uses its own seed only).
      max_length: cache length (prompt + generated); None: bucketed from the prompts and ``max_new_tokens``.
      acceptance: advanced: the acceptance rule, a hashable ``jaxspec.core.acceptance.RejectionSampler`` (subclass)
        instance; None: block verification (``BlockVerifier``); ``RejectionSampler()`` checks token by token.
      chat: wrap each string prompt as one user turn with the tokenizer's chat template (generation prompt added);
        None (the default): when the target's tokenizer has a chat template, as the ``jaxspec`` command does.
        Token-id prompts are never wrapped.
      mesh: a ``jax.sharding.Mesh`` with axes ``data``/``model`` or a dict such as ``{"data": 2, "model": 4}``:
        rows and KV caches split over ``data``, the target's weights over ``model`` (``jaxspec.sharding``). With
        several processes (``jax.distributed``) every process makes the same call and gets every row.
      shard_draft: on a mesh, shard the draft's weights by the same rules as the target's (True). False
        replicates them over ``model``: no collectives per draft step, but every device reads the whole draft each
        step (worth it for small drafts).
      policy: with ``gamma="auto"``, a ``jaxspec.policy.AutoGamma``; None: the process-wide one.
      tree: ``(depth, branch, width)``: with an EAGLE head, each round drafts a tree of candidates (the root's
        ``branch`` best children, then per level the ``width`` most promising of their children, ``depth`` levels)
        and one target pass verifies all of it; exact at any temperature. Static: each shape compiles once; γ is
        the depth. None: chains of γ drafts.
      constraint: structured output: ``jaxspec.JsonSchema(schema)``, ``jaxspec.Regex(pattern)``,
        ``jaxspec.Choice([...])`` (or the dicts ``{"json_schema": ...}``, ``{"regex": ...}``, ``{"choices": [...]}``),
        one for every prompt or one per prompt (None: free). The target and the drafter are masked by each row's
        automaton state, so the output is exactly sampling from the masked, renormalized target; tokens the
        constraint forces are proposed for free. A new constraint changes arrays, not programs (tables bucketed).
    """

    draft: Any = None
    gamma: int | str | None = None
    max_new_tokens: int | Sequence[int] = 64
    temperature: float | Sequence[float] = 1.0
    top_k: int | Sequence[int | None] | None = None
    top_p: float | Sequence[float | None] | None = None
    eos_token_id: int | Sequence[int] | None = None
    seed: int | Sequence[int] = 0
    max_length: int | None = None
    acceptance: Any = None
    chat: bool | None = None
    mesh: Any = None
    shard_draft: bool = True
    policy: Any = None
    tree: Any = None
    constraint: Any = None

    PER_REQUEST: ClassVar[tuple[str, ...]] = (
        "max_new_tokens",
        "temperature",
        "top_k",
        "top_p",
        "seed",
        "eos_token_id",
        "constraint",
    )
    """The fields an ``Engine`` request may set for itself; the others hold for the whole engine."""

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """Every field's name, in order."""
        return tuple(f.name for f in dataclasses.fields(cls))

    def replace(self, **changes) -> GenerationConfig:
        """A copy with ``changes``; ``TypeError`` naming any keyword that is not a field."""
        unknown = sorted(set(changes) - set(self.names()))
        if unknown:
            raise TypeError(f"unknown setting(s) {unknown}; the settings are {list(self.names())}")
        return dataclasses.replace(self, **changes)

    def as_dict(self) -> dict[str, Any]:
        """The fields as a dict (values as given, not copied)."""
        return {name: getattr(self, name) for name in self.names()}

    @classmethod
    def of(cls, config: GenerationConfig | None, settings: Mapping[str, Any], where: str) -> GenerationConfig:
        """``config`` (None: the defaults) with the keyword ``settings`` applied; ``where`` names the function in
        the ``TypeError`` for a ``config`` that is not a ``GenerationConfig`` or a keyword that is not a field."""
        if config is None:
            config = cls()
        elif not isinstance(config, cls):
            raise TypeError(f"{where}: config must be a jaxspec.GenerationConfig or None, got {type(config).__name__}")
        try:
            return config.replace(**settings) if settings else config
        except TypeError as err:
            raise TypeError(f"{where}() got {err}") from None
