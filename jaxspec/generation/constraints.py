"""Constraints per request (structured output): a JSON schema, a regular expression or a list of choices, compiled
on the host into a token-level automaton laid out as device arrays (``jaxspec.core.grammar``).

Compilation is ``outlines-core``'s (``Index``: a regular expression over a tokenizer's vocabulary, its transitions
readable as a table; a JSON schema becomes a regular expression by its ``build_regex_from_schema``). Of the
libraries of the field it is the one whose automaton is exported whole, which is what a compiled loop needs: masks
and transitions as arrays on device, never a call back to the host per token. (``xgrammar`` and ``llguidance``
are matchers advanced token by token on the host; they handle recursive grammars, which a finite automaton cannot.)

The table is then made small: states the initial state cannot reach, or from which no final state is reachable,
are dropped (the second kind would let a row walk into a dead end), and tokens whose transitions agree from every
state share one class, so a row's automaton is ``token_class [V]`` and ``next_state [S, C]``. The end-of-sequence
id of the call (the first, when it has several) is allowed exactly in the final states, so an output that can only
end is forced to end.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

# a row's table of S states by C classes must hold at most this many entries (int32: 16 MiB), and S and C at
# most MAX_SIDE each; a larger automaton is refused before anything compiles
MAX_TABLE = 1 << 22
MAX_SIDE = 1 << 15


@dataclasses.dataclass(frozen=True)
class Regex:
    """Output that matches ``pattern`` in full (Rust ``regex`` syntax, as ``outlines-core`` reads it)."""

    pattern: str

    def regex(self) -> str:
        """The regular expression."""
        return self.pattern


@dataclasses.dataclass(frozen=True)
class JsonSchema:
    """Output that is a JSON document of ``schema`` (a dict or its JSON text), whitespace between tokens optional."""

    schema: str

    def __init__(self, schema: Any):
        text = schema if isinstance(schema, str) else json.dumps(schema)  # key order kept: it is the output's
        object.__setattr__(self, "schema", text)

    def regex(self) -> str:
        """The regular expression of the schema (``outlines_core.json_schema.build_regex_from_schema``)."""
        from outlines_core.json_schema import build_regex_from_schema

        return build_regex_from_schema(self.schema)


@dataclasses.dataclass(frozen=True)
class Choice:
    """Output that is exactly one of ``options`` (strings)."""

    options: tuple[str, ...]

    def __init__(self, options: Sequence[str]):
        object.__setattr__(self, "options", tuple(options))

    def regex(self) -> str:
        """The alternation of the escaped options."""
        return "(" + "|".join(re.escape(o) for o in self.options) + ")"


Constraint = Regex | JsonSchema | Choice


def parse(value: Any, name: str) -> Constraint | None:
    """A ``Constraint`` (or None) from ``value``: one already, None, or a dict with one key, ``{"regex": str}``,
    ``{"json_schema": dict or str}`` or ``{"choices": [str, ...]}`` (the JSONL form). ``ValueError`` naming
    ``name`` otherwise."""
    if value is None or isinstance(value, (Regex, JsonSchema, Choice)):
        return value
    if isinstance(value, dict) and len(value) == 1:
        ((kind, body),) = value.items()
        if kind == "regex" and isinstance(body, str):
            return Regex(body)
        if kind == "json_schema" and isinstance(body, (dict, str)):
            return JsonSchema(body)
        if kind == "choices" and isinstance(body, (list, tuple)) and body and all(isinstance(o, str) for o in body):
            return Choice(body)
    raise ValueError(
        f"{name} must be None, jaxspec.Regex(pattern), jaxspec.JsonSchema(schema), jaxspec.Choice([...]) or a dict "
        f'{{"regex": str}} / {{"json_schema": schema}} / {{"choices": [str, ...]}}, got {value!r}'
    )


@dataclasses.dataclass(frozen=True, eq=False)
class Automaton:
    """One constraint's automaton over a vocabulary of V ids (host arrays).

    Attributes:
      token_class: ``[V] int32``: each token id's class.
      next_state: ``[S, C] int32``: the state after a class from a state; -1: not allowed. State 0 is initial.
      final: ``[S] bool``: states where the output is complete (the end-of-sequence ids are allowed there).
      regex: the regular expression it was compiled from.
      min_tokens: the fewest tokens of a complete output, its end-of-sequence id included.
    """

    token_class: np.ndarray
    next_state: np.ndarray
    final: np.ndarray
    regex: str
    min_tokens: int

    @property
    def num_states(self) -> int:
        """S."""
        return int(self.next_state.shape[0])

    @property
    def num_classes(self) -> int:
        """C."""
        return int(self.next_state.shape[1])


# ----------------------------------------------------------------------------------------------- token bytes


def _byte_level_alphabet() -> dict[str, int]:
    """The printable character byte-level BPE tokenizers (GPT-2's scheme) write for each byte: printable Latin-1
    bytes stand for themselves, the others take the code points from 256 up, in byte order."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[chr(b)] = b
        else:
            out[chr(256 + extra)] = b
            extra += 1
    return out


_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def _decoder_kind(tokenizer) -> str:
    """``"byte_level"`` (GPT-2-style), ``"metaspace"`` (SentencePiece-style: ``▁`` for a space, ``<0xNN>`` byte
    tokens) or ``"unknown"``, read from the fast tokenizer's decoder."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return "unknown"
    decoder = json.loads(backend.to_str()).get("decoder") or {}
    kinds = {decoder.get("type")} | {d.get("type") for d in decoder.get("decoders", []) or []}
    if "ByteLevel" in kinds:
        return "byte_level"
    if "ByteFallback" in kinds or "Metaspace" in kinds or "Replace" in kinds:
        return "metaspace"
    return "unknown"


def token_bytes(tokenizer, vocab_size: int) -> dict[bytes, list[int]]:
    """``{bytes: [ids]}``: what each ordinary token id below ``vocab_size`` writes, as bytes (special tokens and
    ids the tokenizer does not know are left out: a constraint never allows them). ``ValueError`` for a tokenizer
    whose tokens cannot be read as bytes."""
    kind = _decoder_kind(tokenizer)
    if kind == "unknown":
        raise ValueError(
            "constraint: this tokenizer's tokens cannot be read as bytes (a byte-level BPE or a SentencePiece-style "
            "tokenizer with byte fallback is needed)"
        )
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    special |= {i for i, tok in added.items() if getattr(tok, "special", False)}
    alphabet = _byte_level_alphabet()
    out: dict[bytes, list[int]] = {}
    for i, piece in enumerate(tokenizer.convert_ids_to_tokens(list(range(vocab_size)))):
        if piece is None or i in special:
            continue
        if kind == "byte_level":
            if not all(ch in alphabet for ch in piece):
                continue  # an added token written as text (not a byte sequence)
            data = bytes(alphabet[ch] for ch in piece)
        else:
            match = _BYTE_FALLBACK.match(piece)
            data = bytes([int(match.group(1), 16)]) if match else piece.replace("\u2581", " ").encode("utf-8")
        if data:
            out.setdefault(data, []).append(i)
    return out


@functools.lru_cache(maxsize=8)
def _vocabulary(tokenizer, vocab_size: int, eos: int):
    from outlines_core import Vocabulary

    table = {k: v for k, v in token_bytes(tokenizer, vocab_size).items() if eos not in v}
    return Vocabulary(eos, table)


# ----------------------------------------------------------------------------------------------- compiling


def compile_constraint(
    constraint: Constraint, tokenizer, vocab_size: int, eos: tuple[int, ...], name: str
) -> Automaton:
    """``constraint``'s automaton over ``tokenizer``'s first ``vocab_size`` ids, ``eos[0]`` allowed in its final
    states (the other ``eos`` ids never). ``ValueError`` naming ``name`` when it cannot be compiled, can never be
    completed, or does not fit ``MAX_TABLE``."""
    if tokenizer is None:
        raise ValueError(f"{name}: a constraint needs the target's tokenizer (this target has none)")
    if not eos:
        raise ValueError(f"{name}: a constraint needs an end-of-sequence id to end a completed output (eos_token_id)")
    try:
        regex = constraint.regex()
    except Exception as err:  # the schema library's own errors (an unsupported schema, bad JSON)
        raise ValueError(f"{name}: {type(constraint).__name__} cannot be compiled: {err}") from None
    return _compile(regex, tokenizer, int(vocab_size), tuple(int(e) for e in eos), name)


@functools.lru_cache(maxsize=64)
def _compiled(regex: str, tokenizer, vocab_size: int, eos: tuple[int, ...]) -> Automaton:
    from outlines_core import Index

    index = Index(regex, _vocabulary(tokenizer, vocab_size, eos[0]))
    transitions = index.get_transitions()
    initial = index.get_initial_state()
    finals = set(index.get_final_states())
    # keep the states reachable from the initial state from which a final state is reachable
    reach, todo = {initial}, [initial]
    while todo:
        for nxt in transitions.get(todo.pop(), {}).values():
            if nxt not in reach:
                reach.add(nxt)
                todo.append(nxt)
    back: dict[int, set[int]] = {}
    for s, edges in transitions.items():
        for nxt in edges.values():
            back.setdefault(nxt, set()).add(s)
    live, todo = set(finals & reach), list(finals & reach)
    while todo:
        for prev in back.get(todo.pop(), ()):
            if prev in reach and prev not in live:
                live.add(prev)
                todo.append(prev)
    if initial not in live:
        raise ValueError("no output of this vocabulary can complete it")
    order = [initial] + sorted(live - {initial})
    number = {s: i for i, s in enumerate(order)}
    dense = np.full((len(order), vocab_size), -1, np.int32)
    for s in order:
        edges = {t: n for t, n in transitions.get(s, {}).items() if n in live and t < vocab_size and t not in eos}
        if edges:
            dense[number[s], np.fromiter(edges.keys(), np.int64)] = [number[n] for n in edges.values()]
    final = np.array([s in finals for s in order])
    dense[final, eos[0]] = np.nonzero(final)[0]  # the (first) EOS id from a final state: a loop
    columns, token_class = np.unique(dense.T, axis=0, return_inverse=True)
    table = np.ascontiguousarray(columns.T)
    # the fewest tokens from the initial state to a final one (breadth first over the table), then the EOS
    depth, frontier, seen = 0, {0}, {0}
    while not any(final[s] for s in frontier):
        frontier = {int(n) for s in frontier for n in table[s] if n >= 0} - seen
        seen |= frontier
        depth += 1
    return Automaton(token_class.astype(np.int32).reshape(-1), table, final, regex, depth + 1)


def _compile(regex: str, tokenizer, vocab_size: int, eos: tuple[int, ...], name: str) -> Automaton:
    try:
        automaton = _compiled(regex, tokenizer, vocab_size, eos)
    except (ValueError, RuntimeError, TypeError) as err:
        raise ValueError(f"{name}: the constraint cannot be compiled: {err}") from None
    s, c = automaton.next_state.shape
    if s * c > MAX_TABLE or s > MAX_SIDE or c > MAX_SIDE:
        raise ValueError(
            f"{name}: the constraint's automaton has {s} states by {c} token classes, more than the device budget "
            f"({MAX_TABLE} entries, {MAX_SIDE} a side); simplify it (fewer optional fields, shorter length bounds)"
        )
    return automaton


def bucket(n: int) -> int:
    """The padded size of a table side holding ``n`` (powers of two from 8): new constraints of similar size reuse
    the compiled programs."""
    return max(8, 1 << (max(1, n) - 1).bit_length())


def table_shape(automata: Sequence[Automaton | None]) -> tuple[int, int]:
    """The bucketed ``(S, C)`` that holds every one of ``automata`` (None: a row without a constraint)."""
    s = bucket(max((a.num_states for a in automata if a is not None), default=1))
    c = bucket(max((a.num_classes for a in automata if a is not None), default=1))
    return s, c


def device_tables(
    automata: Sequence[Automaton | None], vocab_size: int, shape: tuple[int, int] | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """``(token_class [N, V], next_state [N, S, C])`` for the rows' automata (None: a row without a constraint,
    one state allowing every token), padded to ``shape`` (default: ``table_shape(automata)``); every row starts in
    state 0."""
    s, c = table_shape(automata) if shape is None else shape
    token_class = np.zeros((len(automata), vocab_size), np.int32)
    next_state = np.full((len(automata), s, c), -1, np.int32)
    for i, a in enumerate(automata):
        if a is None:
            next_state[i, 0, 0] = 0
        else:
            token_class[i] = a.token_class
            next_state[i, : a.num_states, : a.num_classes] = a.next_state
    return token_class, next_state
