"""Stage 1 of ``generate``: check every argument (the target, the prompts, a ``GenerationConfig``) and tokenize the
prompts, producing a ``Request``.

Everything here runs on the host before anything is compiled or placed on a device: bad input raises an error
that names the argument and its allowed values. The small checks (``is_int``, ``is_real``, ``per_row_ints``) and
``tokenize`` are shared with ``jaxspec.distill``. Per-prompt values (``max_new_tokens``, ``seed``, ``temperature``,
``top_k``, ``top_p``) are one value for every prompt or a sequence of one per prompt, expanded to ``[N]`` arrays.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

from jaxspec.core.acceptance import RejectionSampler
from jaxspec.core.model import CausalLM
from jaxspec.drafters import Drafter, LookupFirst, PromptLookup
from jaxspec.drafters.branching import check_tree
from jaxspec.generation import constraints
from jaxspec.generation.config import GenerationConfig
from jaxspec.parallel import sharding
from jaxspec.policy import AutoGamma


def is_int(x) -> bool:
    """An integer (Python or NumPy), not a bool."""
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def is_real(x) -> bool:
    """A real number (Python or NumPy int or float), not a bool."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def per_row_ints(value, name: str, n: int, lo: int, hi: int | None = None) -> np.ndarray:
    """``value`` (one int, or a sequence of ``n`` ints) as ``[n] int64``, each ``>= lo`` (and ``< hi``).

    Raises ``ValueError`` naming ``name`` otherwise.
    """
    values = [value] * n if is_int(value) else value
    if isinstance(values, (str, bytes)) or not isinstance(values, (Sequence, np.ndarray)):
        raise ValueError(f"{name} must be an int or a sequence of {n} ints, got {value!r}")
    values = list(values)
    if len(values) != n:
        raise ValueError(f"{name} has {len(values)} entries but there are {n} prompts")
    for v in values:
        if not is_int(v) or v < lo or (hi is not None and v >= hi):
            rng = f">= {lo}" if hi is None else f"in [{lo}, {hi})"
            raise ValueError(f"{name} must be an int {rng}, got {v!r}")
    return np.asarray(values, np.int64)


# name -> (allowed values, check of one value, the value stored for None)
_SAMPLING_RULES = {
    "temperature": (
        "a finite number >= 0 (0 = greedy)",
        lambda v: is_real(v) and bool(np.isfinite(v)) and v >= 0,
        None,
    ),
    "top_k": ("None or an int >= 0 (0 = off)", lambda v: v is None or (is_int(v) and v >= 0), 0),
    "top_p": ("None or a number in (0, 1]", lambda v: v is None or (is_real(v) and 0 < v <= 1), 1.0),
}


def check_sampling(value, name: str):
    """Check the sampling argument ``name`` (``temperature``, ``top_k`` or ``top_p``): one value, returned as is,
    or a sequence / 1-D array of one value per prompt, returned as a list (its length is checked by
    ``per_row_sampling`` once the prompts are counted).

    Raises ``ValueError`` naming ``name``, and the index of a bad per-prompt entry.
    """
    allowed, ok, _ = _SAMPLING_RULES[name]
    if isinstance(value, jax.Array):
        value = np.asarray(value)
    if isinstance(value, np.ndarray):
        value = value.tolist()  # Python scalars (a 0-d array: one value), nested lists for more dimensions
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        values = list(value)
        for i, v in enumerate(values):
            if not ok(v):
                raise ValueError(f"{name}[{i}] must be {allowed}, got {v!r}")
        return values
    if not ok(value):
        raise ValueError(f"{name} must be {allowed}, got {value!r}")
    return value


def per_row_sampling(value, name: str, n: int) -> np.ndarray:
    """``value`` checked by ``check_sampling`` as ``[n]``: ``float64`` for ``temperature`` and ``top_p`` (None ->
    1.0), ``int64`` for ``top_k`` (None -> 0). Raises ``ValueError`` when a sequence does not hold ``n`` values."""
    if isinstance(value, list):
        if len(value) != n:
            raise ValueError(f"{name} has {len(value)} entries but there are {n} prompts")
    else:
        value = [value] * n
    off = _SAMPLING_RULES[name][2]
    return np.asarray([off if v is None else v for v in value], np.int64 if name == "top_k" else np.float64)


def as_drafter(draft):
    """``"prompt_lookup"`` -> ``PromptLookup()``; a ``Drafter`` (``PromptLookup`` or any other) as is; anything
    else (a draft ``CausalLM``, None): None."""
    if isinstance(draft, str) and draft == "prompt_lookup":
        return PromptLookup()
    return draft if isinstance(draft, Drafter) else None


def check_tokenizers(target: CausalLM, draft: CausalLM | None) -> None:
    """Draft and target must map text to the same ids: compare their vocabularies (token -> id) when both have
    tokenizers that expose ``get_vocab``, over the ids both models have (``min`` of their ``vocab_size``: a
    smaller model's padded table may stop before a larger one's extra tokens). Raises ``ValueError`` if they
    differ."""
    if draft is None or target.tokenizer is None or draft.tokenizer is None:
        return
    if target.tokenizer is draft.tokenizer:
        return
    vocab = getattr(target.tokenizer, "get_vocab", None)
    other = getattr(draft.tokenizer, "get_vocab", None)
    if vocab is None or other is None:
        return
    shared = min(target.vocab_size, draft.vocab_size)
    a = {t: i for t, i in vocab().items() if i < shared}
    b = {t: i for t, i in other().items() if i < shared}
    if a != b:
        diff = sorted(set(a.items()) ^ set(b.items()))[:3]
        raise ValueError(
            f"draft tokenizer ({draft.name}) is not compatible with the target tokenizer ({target.name}): their "
            f"vocabularies differ ({len(a)} vs {len(b)} entries; e.g. {diff}); speculation needs one shared tokenizer"
        )


def apply_chat(model: CausalLM, text: str, index: int) -> list[int]:
    """Ids of ``text`` as one user turn in ``model``'s chat template, generation prompt added.

    ``index`` (the prompt's position) names the prompt in the error raised when the tokenizer has no template.
    """
    tok = model.tokenizer
    if not has_chat_template(model):
        raise ValueError(
            f"chat=True but {model.name}'s tokenizer has no chat template (prompts[{index}]); pass chat=False "
            "or a tokenizer with a chat_template"
        )
    ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "keys"):  # some versions return a BatchEncoding
        ids = ids["input_ids"]
    return list(ids)


def has_chat_template(model: CausalLM) -> bool:
    """Whether ``model``'s tokenizer has a chat template."""
    return getattr(model.tokenizer, "chat_template", None) is not None


def resolve_chat(model: CausalLM, chat: bool | None) -> bool:
    """The ``chat`` setting for ``model``: None (the default) means on when its tokenizer has a chat template."""
    return has_chat_template(model) if chat is None else chat


def tokenize(model: CausalLM, prompts, chat: bool = False) -> list[list[int]]:
    """Prompts as token-id lists, one per prompt.

    ``prompts``: a string, one token-id list, a list of strings and/or token-id lists, or an int array ``[T]`` or
    ``[B, T]``. Strings need ``model.tokenizer``; with ``chat`` they are wrapped by ``apply_chat``. Ids are not
    range-checked here (``make_request`` does). Raises ``ValueError`` naming the bad prompt, among them a string
    that is empty or only whitespace: it has nothing to continue (a tokenizer may still give it ids: a BOS, a chat
    template's turn), so its output would be the model's unprompted babble. A token-id list is never refused for
    what its ids decode to.
    """
    if isinstance(prompts, str):
        prompts = [prompts]
    if isinstance(prompts, np.ndarray) or isinstance(prompts, jax.Array):
        arr = np.asarray(prompts)
        if arr.ndim == 1:
            arr = arr[None]
        if arr.ndim != 2 or not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(f"prompts as an array must be a [B, T] integer array, got {arr.dtype} {arr.shape}")
        return [list(map(int, row)) for row in arr]
    if not isinstance(prompts, Sequence) or len(prompts) == 0:
        raise ValueError("prompts must be a non-empty list of token-id lists, an int array, or strings")
    if all(is_int(t) for t in prompts):
        prompts = [prompts]
    out = []
    for i, p in enumerate(prompts):
        if isinstance(p, str):
            if not p.strip():
                raise ValueError(f"prompts[{i}] is {'only whitespace' if p else 'empty'} ({p!r}); give it some text")
            if model.tokenizer is None:
                raise ValueError(f"prompts[{i}] is a string but {model.name} has no tokenizer; pass token ids")
            p = apply_chat(model, p, i) if chat else model.tokenizer.encode(p)
        if isinstance(p, np.ndarray):
            p = p.tolist()
        if not isinstance(p, Sequence) or not all(is_int(t) for t in p):
            raise ValueError(f"prompts[{i}] must be a string or a sequence of ints, got {type(p).__name__}")
        out.append([int(t) for t in p])
    return out


@dataclasses.dataclass(frozen=True, eq=False)
class Request:
    """A checked ``generate`` call: every argument validated, prompts tokenized, per-prompt values expanded.

    N is the number of prompts. Attributes:
      target: the model whose distribution the output follows.
      draft: the draft model, or None (plain decoding, or a ``Drafter`` object in ``lookup``).
      lookup: the draft when it is a ``Drafter`` object (prompt lookup, an EAGLE head, ``LookupFirst``, ...), else
        None.
      gamma: draft tokens per round (int >= 1), or ``"auto"`` (then ``draft`` or ``lookup`` is set).
      policy: the ``AutoGamma`` passed for ``gamma="auto"``, or None (the process-wide default).
      rows: N token-id lists, each non-empty with ids in ``[0, target.vocab_size)``.
      max_new: ``[N] int64``, each >= 1.
      seeds: ``[N] int64`` in ``[0, 2**32)``.
      row_ids: ``[N] int64``: the row index folded into the seed (0 for every row when one seed per prompt is
        given, so a row's sample depends on its own seed only).
      eos: the ids that end a row (possibly none).
      temperature: ``[N] float64``, each >= 0 (0 = greedy).
      top_k: ``[N] int64``, each >= 0 (0 = off).
      top_p: ``[N] float64``, each in (0, 1] (1 = off).
      max_length: the cache length asked for, or None (bucketed from the prompts and ``max_new``).
      acceptance: the acceptance rule, or None (the loop's default, block verification).
      mesh: the ``Mesh`` to run on, or None (one device).
      shard_draft: on a mesh, shard the draft's weights (True) or replicate them (False).
      tree: the ``(depth, branch, width)`` of the trees the drafter drafts each round, or None (chains); a
        ``Drafter`` object in ``lookup`` carries it too.
      config: the settings as given (unchecked; what the fields above were made from).
      automata: None (no row constrained), or N ``constraints.Automaton``s or None (a row without a constraint).
    """

    target: CausalLM
    draft: CausalLM | None
    lookup: Drafter | None
    gamma: int | str
    policy: AutoGamma | None
    rows: list[list[int]]
    max_new: np.ndarray
    seeds: np.ndarray
    row_ids: np.ndarray
    eos: tuple[int, ...]
    temperature: np.ndarray
    top_k: np.ndarray
    top_p: np.ndarray
    max_length: int | None
    acceptance: RejectionSampler | None
    mesh: Mesh | None
    shard_draft: bool
    config: GenerationConfig
    tree: tuple[int, int, int] | None = None
    automata: tuple | None = None

    @property
    def num_rows(self) -> int:
        """N, the number of prompts."""
        return len(self.rows)

    @property
    def lengths(self) -> np.ndarray:
        """``[N] int64`` prompt lengths."""
        return np.asarray([len(p) for p in self.rows], np.int64)

    @property
    def auto(self) -> bool:
        """``gamma="auto"``: the policy chooses γ (``jaxspec.generate.choose_gamma``)."""
        return isinstance(self.gamma, str)

    @property
    def drafter(self) -> CausalLM | Drafter | None:
        """What drafts: the draft model, the ``Drafter`` object, or None."""
        return self.lookup or self.draft

    @property
    def greedy(self) -> bool:
        """Every row at temperature 0."""
        return bool(np.all(self.temperature == 0))


def make_request(target, prompts, config: GenerationConfig | None = None, **settings) -> Request:
    """Check ``target``, ``prompts`` and every setting (``config`` and/or its fields as keywords: a
    ``GenerationConfig``, which documents each) and tokenize ``prompts``.

    Raises ``TypeError`` for a target or draft that is not a model or an unknown setting, ``ValueError`` naming the
    argument for any other bad input. Compiles nothing.
    """
    cfg = GenerationConfig.of(config, settings, "generate")
    gamma: Any  # as given (unchecked) until the checks below
    draft, gamma, max_length = cfg.draft, cfg.gamma, cfg.max_length
    if not isinstance(target, CausalLM):
        raise TypeError(f"target must be a jaxspec.CausalLM, got {type(target).__name__}")
    lookup = as_drafter(draft)
    if lookup is not None:
        lookup.check_target(target)
        draft = None
    elif draft is not None:
        if not isinstance(draft, CausalLM):
            raise TypeError(
                f"draft must be a jaxspec.CausalLM, 'prompt_lookup', a jaxspec.PromptLookup or None, got {draft!r}"
            )
    tree = lookup.tree if lookup is not None else None
    if cfg.tree is not None:
        if lookup is not None and hasattr(lookup, "with_tree"):
            lookup = lookup.with_tree(cfg.tree)
            tree = lookup.tree
        elif lookup is None and draft is not None:  # a draft model: its ModelDrafter drafts the tree
            tree = check_tree(cfg.tree)
        else:
            raise ValueError(
                f"tree={cfg.tree!r} needs a drafter that can branch (an EAGLE head or a draft model), got "
                f"draft={cfg.draft!r}"
            )
    if tree is not None:
        depth = tree[0]
        if gamma is None:
            gamma = depth
        elif isinstance(gamma, str) and gamma == "auto":
            raise ValueError(
                f"gamma='auto' chooses among its policy's trees itself (AutoGamma(trees=...)); pass tree={tree} "
                "alone (γ is its depth) or gamma='auto' without a tree"
            )
        elif gamma != depth:
            raise ValueError(f"gamma={gamma!r} with tree={tree}: a tree round's γ is its depth ({depth})")
    if gamma is None:  # the drafter's own default (a draft model's: the base class's)
        gamma = (lookup or Drafter).default_gamma
    auto = isinstance(gamma, str) and gamma == "auto"
    if not auto and (not is_int(gamma) or gamma < 1):
        raise ValueError(f"gamma must be an int >= 1 or 'auto', got {gamma!r}")
    if auto and draft is None and lookup is None:
        raise ValueError("gamma='auto' needs a draft (a model or 'prompt_lookup') to decide between")
    if auto and isinstance(lookup, LookupFirst):
        raise ValueError(
            "gamma='auto' is not supported with a LookupFirst drafter (its rounds mix two drafters' costs, which "
            "the policy's cost model does not describe); pass gamma=<int> (the copied drafts; the fallback drafts "
            "its own draft_gamma)"
        )
    if cfg.policy is not None and not isinstance(cfg.policy, AutoGamma):
        raise ValueError(f"policy must be a jaxspec.policy.AutoGamma or None, got {cfg.policy!r}")
    temperature = check_sampling(cfg.temperature, "temperature")
    top_k = check_sampling(cfg.top_k, "top_k")
    top_p = check_sampling(cfg.top_p, "top_p")
    if max_length is not None and (not is_int(max_length) or max_length < 2):
        raise ValueError(f"max_length must be None or an int >= 2, got {max_length!r}")
    if cfg.chat is not None and not isinstance(cfg.chat, bool):
        raise ValueError(f"chat must be True, False or None (when the tokenizer has a template), got {cfg.chat!r}")
    mesh = sharding.make_mesh(cfg.mesh)
    if not isinstance(cfg.shard_draft, bool):
        raise ValueError(f"shard_draft must be True or False, got {cfg.shard_draft!r}")
    check_tokenizers(target, draft)

    rows = tokenize(target, prompts, resolve_chat(target, cfg.chat))
    n = len(rows)
    vocab = target.vocab_size
    for i, p in enumerate(rows):
        if not p:
            raise ValueError(f"prompts[{i}] is empty; every prompt needs at least one token")
        bad = [t for t in p if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompts[{i}] has token id {bad[0]} outside the vocabulary [0, {vocab})")
        if max_length is not None and len(p) >= max_length:
            raise ValueError(
                f"prompts[{i}] has {len(p)} tokens, which does not fit max_length={max_length} "
                "(the cache must hold the prompt plus at least one new token)"
            )
    max_new = per_row_ints(cfg.max_new_tokens, "max_new_tokens", n, 1)
    seeds = per_row_ints(cfg.seed, "seed", n, 0, 2**32)
    temperature = per_row_sampling(temperature, "temperature", n)
    top_k = per_row_sampling(top_k, "top_k", n)
    top_p = per_row_sampling(top_p, "top_p", n)
    # one seed: row b draws from fold_in(key(seed), b); one seed per prompt: a row depends on its own seed only
    row_ids = np.arange(n) if is_int(cfg.seed) else np.zeros(n, np.int64)
    eos_token_id: Any = target.eos_token_id if cfg.eos_token_id is None else cfg.eos_token_id  # checked below
    eos = [] if eos_token_id is None else ([eos_token_id] if is_int(eos_token_id) else list(eos_token_id))
    for e in eos:
        if not is_int(e) or not 0 <= e < vocab:
            raise ValueError(f"eos_token_id must be None or int(s) in [0, {vocab}), got {eos_token_id!r}")
    automata = row_automata(target, cfg.constraint, n, tuple(int(e) for e in eos), max_new, tree)
    return Request(
        target=target,
        draft=draft,
        lookup=lookup,
        gamma=gamma,
        policy=cfg.policy,
        rows=rows,
        max_new=max_new,
        seeds=seeds,
        row_ids=row_ids,
        eos=tuple(int(e) for e in eos),
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        max_length=max_length,
        acceptance=cfg.acceptance,
        mesh=mesh,
        shard_draft=cfg.shard_draft,
        config=cfg,
        tree=tree,
        automata=automata,
    )


def row_automata(target: CausalLM, constraint, n: int, eos: tuple[int, ...], max_new: np.ndarray, tree) -> tuple | None:
    """Each row's compiled constraint (``constraints.compile_constraint``), or None when no row has one.
    ``constraint``: one for every row, or a list/tuple of N (each may be None). Errors name ``constraint`` (or
    ``constraint[i]``) and, for a row that cannot finish within its ``max_new_tokens``, ``prompts[i]``."""
    if constraint is None:
        return None
    if isinstance(constraint, (list, tuple)):
        if len(constraint) != n:
            raise ValueError(
                f"constraint: a list must hold one constraint (or None) per prompt: {n}, got {len(constraint)}"
            )
        parsed = [constraints.parse(c, f"constraint[{i}]") for i, c in enumerate(constraint)]
        names = [f"constraint[{i}]" for i in range(n)]
    else:
        parsed = [constraints.parse(constraint, "constraint")] * n
        names = ["constraint"] * n
    if all(c is None for c in parsed):
        return None
    if tree is not None:
        raise ValueError("constraint: draft trees do not take constraints yet; draft chains (tree=None)")
    out: list[constraints.Automaton | None] = []
    for i, (c, name) in enumerate(zip(parsed, names)):
        if c is None:
            out.append(None)
            continue
        automaton = constraints.compile_constraint(c, target.tokenizer, target.vocab_size, eos, name)
        if automaton.min_tokens > max_new[i]:
            raise ValueError(
                f"prompts[{i}]: its constraint needs at least {automaton.min_tokens} tokens (its end-of-sequence "
                f"included) and max_new_tokens is {int(max_new[i])}: it could never be completed"
            )
        out.append(automaton)
    return tuple(out)
