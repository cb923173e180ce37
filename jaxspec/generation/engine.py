"""Continuous batching: ``Engine(...).run(requests)`` yields each request's result as soon as its row finishes.

Up to ``slots`` rows (the slots) decode together in the loop of ``jaxspec.loop``, at the smallest of a few bucketed
batch widths that holds the rows in flight and the requests waiting: a state of B rows, B a power of two (or
``slots``), so a few requests do not pay for every slot, and as rows finish with nothing waiting the rows left move
to a smaller batch (``jaxspec.loop.slots.resize``). When rows finish and requests wait, the host reads which (a
``[B]`` flag array: one small transfer per refill, never one per token), prefills as many waiting prompts as there
are free slots in one small batch and inserts them into those slots of the target and draft caches
(``jaxspec.loop.slots``), and decoding goes on. Every per-request value (prompt, seed, ``max_new_tokens``, EOS ids,
temperature, top-k, top-p) is a traced per-row input and prompts are read in chunks as in ``generate``: each
width's programs compile once, and nothing recompiles as requests come and go. Why the host drives the refills
(JetStream's prefill / insert / generate split) rather than a queue inside the loop: see ``docs/guides/design.md``.

A row's output equals what ``jaxspec.generate`` returns for that prompt alone with the same seed and
``max_length`` (same draws: a row's keys depend only on its seed and its own round counter).
"""

from __future__ import annotations

import collections
import dataclasses
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence

import jax
import numpy as np

from jaxspec import loop
from jaxspec.core.grammar import Grammar
from jaxspec.core.model import CausalLM
from jaxspec.core.sampling import SamplingParams
from jaxspec.generation import constraints, regamma, results
from jaxspec.generation import inputs as inputs_lib
from jaxspec.generation.config import GenerationConfig
from jaxspec.generation.generate import choose_gamma
from jaxspec.generation.request import Request, is_int, make_request, resolve_chat, tokenize
from jaxspec.generation.results import FINISH_REASONS, RowStats
from jaxspec.loop import compile_cache, slots
from jaxspec.parallel import sharding

REQUEST_KEYS = ("prompt", "id", *GenerationConfig.PER_REQUEST)
"""The keys a request given as a dict may have (only ``prompt`` is required)."""

_NEVER = np.iinfo(np.int32).max


@dataclasses.dataclass(frozen=True)
class RowResult:
    """One request's result, yielded by ``EngineRun`` when its row finishes.

    Attributes:
      index: the request's position in the sequence given to ``Engine.run``.
      id: the request's ``"id"`` when it was a dict with one, else ``index``.
      tokens: generated ids (prompt excluded); ``logprobs``: ``[len(tokens)] float32``, the target's raw
        log-probability of each.
      finish_reason: ``"eos"`` | ``"length"`` | ``"cache"``.
      text: the decoded tokens when the target has a tokenizer, else None.
      stats: this row's ``RowStats`` (rounds, drafts, acceptance histogram).
      slot: the slot it was inserted into (rows move to lower slots when the batch shrinks).
      wall_time_s: its share of the run's device time (each decode call's time split over the rows by the tokens
        they generated in it, each prefill's over the rows it inserted); the shares sum to the run's time.
      error: None, or why the row's tokens are not trustworthy (a model produced NaN/inf logits for it).
    """

    index: int
    id: object
    tokens: list[int]
    logprobs: np.ndarray
    finish_reason: str
    text: str | None
    stats: RowStats
    slot: int
    wall_time_s: float
    error: str | None = None


@dataclasses.dataclass
class EngineStats:
    """One ``Engine.run``'s figures (complete once the run is exhausted).

    Attributes:
      slots: the most rows decoded together (``Engine.slots``). gamma: draft tokens per round (0: plain).
      cache_length: S.
      rows: requests finished. generated_tokens: their tokens.
      rounds: loop iterations (batched target passes); row_rounds: the rows' rounds summed.
      widths: compiled batch -> loop iterations run at it (the loop runs at the smallest of ``Engine.widths``
        that holds the rows in flight).
      slot_rounds: slot-rounds run: each iteration times the batch it ran at.
      queued_rounds, queued_slot_rounds, queued_row_rounds: the same, counted over the decode calls made while
        requests were still waiting: the job's steady state, its drain at the end excluded.
      wall_time_s: device time (prefill + decode, compilation excluded); prefill_time_s and decode_time_s: its
        prefill (and insert) and decode (and resize) parts.
      compile_time_s: compilation during the run (0 when every program was compiled before).
      compiles: program -> seconds, for each program compiled (or loaded from the persistent compilation cache)
        during the run: ``prefill[k]``, ``rounds[B]``, ``insert[B<-k]``, ``resize[B->B']``.
      refills: prefill-and-insert calls; syncs: decode calls (each ends in one small host read); resizes: moves of
        the rows in flight to another batch.
      drafted, accepted: draft tokens verified / accepted over every row (verify rounds only).
      policy: with ``gamma="auto"``, the decision (``jaxspec.policy.Decision.as_dict()``); else None.
    """

    slots: int = 0
    gamma: int = 0
    cache_length: int = 0
    rows: int = 0
    generated_tokens: int = 0
    rounds: int = 0
    row_rounds: int = 0
    widths: dict[int, int] = dataclasses.field(default_factory=dict)
    slot_rounds: int = 0
    queued_rounds: int = 0
    queued_slot_rounds: int = 0
    queued_row_rounds: int = 0
    wall_time_s: float = 0.0
    prefill_time_s: float = 0.0
    decode_time_s: float = 0.0
    compile_time_s: float = 0.0
    compiles: dict[str, float] = dataclasses.field(default_factory=dict)
    refills: int = 0
    syncs: int = 0
    resizes: int = 0
    drafted: int = 0
    accepted: int = 0
    policy: dict | None = None

    @property
    def occupancy(self) -> float:
        """Busy slot-rounds ÷ slot-rounds run: ``row_rounds / slot_rounds`` (NaN before any round)."""
        return self.row_rounds / self.slot_rounds if self.slot_rounds else float("nan")

    @property
    def straggler_factor(self) -> float:
        """Slot-rounds run ÷ the rows' rounds: ``1 / occupancy``."""
        return 1.0 / self.occupancy if self.row_rounds else float("nan")

    @property
    def queued_straggler_factor(self) -> float:
        """The straggler factor while requests were waiting: ``queued_slot_rounds / queued_row_rounds``. What the
        refill policy controls; the rest of ``straggler_factor`` is the drain, when the queue is empty and the last
        rows finish at different rounds (NaN when no decode call ran with requests waiting)."""
        return self.queued_slot_rounds / self.queued_row_rounds if self.queued_row_rounds else float("nan")

    @property
    def acceptance_rate(self) -> float | None:
        """α over every row (None for plain decoding)."""
        return self.accepted / self.drafted if self.drafted else None

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens ÷ ``wall_time_s``."""
        return self.generated_tokens / self.wall_time_s if self.wall_time_s > 0 else float("nan")

    def summary(self) -> str:
        """One line: rows, tokens, tok/s, α, occupancy, batches, refills."""
        alpha = "" if self.acceptance_rate is None else f", γ={self.gamma} α={self.acceptance_rate:.3f}"
        batches = "/".join(str(w) for w in sorted(self.widths, reverse=True)) or "-"
        return (
            f"{self.rows} rows, {self.generated_tokens} tokens in {self.wall_time_s:.2f}s "
            f"({self.tokens_per_s:.1f} tok/s){alpha}, {self.slots} slots (ran at {batches}), occupancy "
            f"{self.occupancy:.3f}, {self.refills} refills, {self.syncs} syncs"
        )


class Engine:
    """Continuous batching over up to ``slots`` rows, plain or speculative.

    The settings are ``generate``'s (a ``GenerationConfig`` and/or its fields as keywords, checked now with a
    stand-in prompt) and are the defaults of every request; a request given as a dict overrides the fields of
    ``GenerationConfig.PER_REQUEST`` (``max_new_tokens``, ``temperature``, ``top_k``, ``top_p``, ``seed``,
    ``eos_token_id``) for itself, each as one value. ``max_length`` is the cache length S of every slot (prompt +
    generated); None: bucketed from the longest request of each ``run``. String requests get the target's chat
    template as ``generate`` gives it (``chat``: by default when the tokenizer has one). Besides:

    Args:
      slots: the most rows decoded together (rounded up to a multiple of the mesh's ``data`` axis). The loop runs
        at the smallest of ``widths`` (powers of two below ``slots``, and ``slots``) that holds the rows in flight
        and the requests waiting: 3 requests on 16 slots decode as a batch of 4, and as rows finish with nothing
        waiting the rows left move to a smaller batch. Each width's programs compile once.
      refill_at: when requests are waiting, the decode loop hands back to the host once this many rows have
        finished (default: ``max(1, slots // 32)``); with none waiting it returns at each finished row, so results
        are yielded as soon as they exist.
      schedule: the order waiting requests take free slots: ``"longest_first"`` (default: largest
        ``max_new_tokens`` first, ties in arrival order, so long rows do not start last and leave the other slots
        idle at the end of a job) or ``"fifo"`` (arrival order). Outputs do not depend on it.
    """

    def __init__(
        self,
        target: CausalLM,
        config: GenerationConfig | None = None,
        *,
        slots: int = 8,
        refill_at: int | None = None,
        schedule: str = "longest_first",
        **settings,
    ):
        if not is_int(slots) or slots < 1:
            raise ValueError(f"slots must be an int >= 1, got {slots!r}")
        if refill_at is not None and (not is_int(refill_at) or refill_at < 1):
            raise ValueError(f"refill_at must be None or an int >= 1, got {refill_at!r}")
        if schedule not in ("longest_first", "fifo"):
            raise ValueError(f"schedule must be 'longest_first' or 'fifo', got {schedule!r}")
        self.schedule = schedule
        self.target = target
        self.config = GenerationConfig.of(config, settings, "Engine")
        # every engine-level setting checked now (a one-token stand-in prompt), before anything compiles
        probe = make_request(target, [[0]], self.config)
        compile_cache.use_default()  # the persistent compilation cache, unless this process chose otherwise
        self.mesh = probe.mesh
        data = sharding.axis_size(self.mesh, "data")
        self.slots = -(-slots // data) * data
        powers = (-(-(1 << i) // data) * data for i in range(self.slots.bit_length()))  # multiples of data
        self.widths = tuple(sorted({w for w in powers if w < self.slots} | {self.slots}))
        self.refill_at = refill_at or max(1, self.slots // 32)

    def width(self, rows: int) -> int:
        """The compiled batch for ``rows`` rows: the smallest of ``widths`` holding ``min(rows, slots)``."""
        return next(w for w in self.widths if w >= min(max(rows, 1), self.slots))

    def run(self, requests: Iterable) -> EngineRun:
        """Check and tokenize every request now (errors name ``requests[i]``; nothing compiles), and return the
        ``EngineRun`` that decodes them while it is iterated.

        A request is a string, a token-id list, or a dict with ``"prompt"`` (either) and any of ``REQUEST_KEYS``.
        """
        return EngineRun(self, self._request(list(requests)))

    def _request(self, items: list) -> _Batch:
        if not items:
            raise ValueError("requests is empty")
        prompts, ids, per_row, explicit = [], [], collections.defaultdict(list), []
        for i, item in enumerate(items):
            if isinstance(item, Mapping):
                unknown = sorted(set(item) - set(REQUEST_KEYS))
                if unknown:
                    raise ValueError(f"requests[{i}] has unknown keys {unknown}; allowed: {list(REQUEST_KEYS)}")
                if "prompt" not in item:
                    raise ValueError(f'requests[{i}] has no "prompt"')
                prompt, ids_i = item["prompt"], item.get("id", i)
            else:
                item, prompt, ids_i = {}, item, i
            if isinstance(prompt, str) or (isinstance(prompt, Sequence) and prompt and is_int(prompt[0])):
                prompts.append(prompt)
            else:
                try:
                    prompts.append(list(np.asarray(prompt).reshape(-1)))
                except Exception:
                    raise ValueError(f"requests[{i}]: the prompt must be a string or token ids") from None
            ids.append(ids_i)
            for key in GenerationConfig.PER_REQUEST:
                per_row[key].append(item.get(key, getattr(self.config, key)))
            explicit.append("seed" in item)
        rows = tokenize(self.target, prompts, resolve_chat(self.target, self.config.chat))
        eos_sets = per_row.pop("eos_token_id")
        request = make_request(self.target, rows, self.config, **per_row)
        # generate's seeding: an explicit seed -> the row depends on it alone; the engine's seed -> folded with the
        # request's index (as row i of one generate call over all the requests)
        row_ids = np.where(explicit, 0, np.arange(len(rows)))
        eos = [self._eos(e, i) for i, e in enumerate(eos_sets)]
        for i, automaton in enumerate(request.automata or ()):
            if automaton is not None and request.eos[0] not in eos[i]:
                raise ValueError(
                    f"requests[{i}]: a constrained request ends with the engine's end-of-sequence id {request.eos[0]}; "
                    f"its own eos_token_id {list(eos[i])} must include it"
                )
        return _Batch(request, ids, row_ids, eos)

    def _eos(self, value, index: int) -> tuple[int, ...]:
        vocab = self.target.vocab_size
        if value is None:
            value = self.target.eos_token_id
        ids = [] if value is None else ([value] if is_int(value) else list(value))
        if not all(is_int(e) and 0 <= e < vocab for e in ids):
            raise ValueError(f"requests[{index}].eos_token_id must be None or int(s) in [0, {vocab}), got {value!r}")
        return tuple(int(e) for e in ids)


@dataclasses.dataclass(frozen=True)
class _Batch:
    request: Request  # every request checked, tokenized, per-row values expanded
    ids: list
    row_ids: np.ndarray
    eos: list[tuple[int, ...]]


class EngineRun:
    """Iterator over ``RowResult``s in the order rows finish; ``stats`` (``EngineStats``) fills in as it runs."""

    def __init__(self, engine: Engine, batch: _Batch):
        self.engine, self.batch = engine, batch
        request = batch.request
        lengths = request.lengths
        self.cache_len = request.max_length or inputs_lib.bucket_cache(int(np.max(lengths + request.max_new)))
        self.eos_width = inputs_lib.next_pow2(max(len(e) for e in batch.eos), 4)
        prefill = inputs_lib.prefill_positions(self.cache_len, int(lengths.max()))
        shape = inputs_lib.Buckets(engine.width(request.num_rows), self.cache_len, prefill)
        gamma, decision, policy = choose_gamma(request, shape)
        self.spec = inputs_lib.loop_spec(request, self.cache_len, gamma)
        self.drafter = request.drafter if gamma > 0 else None
        # constraints: one table shape (bucketed) for the whole run, so refills compile nothing new; each refill
        # lays out only the tables of the rows it inserts
        self.table_shape = None if request.automata is None else constraints.table_shape(request.automata)
        # gamma="auto": the hook that re-decides γ between decode calls (jaxspec.generation.regamma)
        self.auto = None if decision is None else regamma.Regamma(request, shape, decision, policy)
        self.stats = EngineStats(
            slots=engine.slots,
            gamma=gamma,
            cache_length=self.cache_len,
            policy=None if self.auto is None else self.auto.summary(),
        )
        self.decode_s: dict[int, float] = collections.defaultdict(float)  # batch width -> decode seconds (gamma="auto")

    def __iter__(self) -> Iterator[RowResult]:
        engine, request, spec = self.engine, self.batch.request, self.spec
        tparams, dparams = inputs_lib.place_params(request.target, self.drafter, spec.mesh, request.shard_draft)
        n = request.num_rows
        order: Sequence[int] = range(n)
        if engine.schedule == "longest_first":  # stable: ties keep arrival order
            order = sorted(order, key=lambda i: -int(request.max_new[i]))
        queue = collections.deque(order)
        occupant: list[int] = []  # request index in each slot of the state, -1 = free
        self._slot = np.zeros(n, np.int64)  # the slot each request was inserted into
        wall = np.zeros(n)
        stats = self.stats
        state = None
        never = inputs_lib.replicated_scalar(spec.mesh, _NEVER)
        length, rounds = np.ones(0, np.int64), np.zeros(0, np.int64)  # per slot, as last read from the device
        rows_hist: list[tuple[int, ...]] = []
        row_stats: list[RowStats] = []
        while queue or any(o >= 0 for o in occupant):
            live = [b for b, o in enumerate(occupant) if o >= 0]
            width = engine.width(len(live) + len(queue))
            if state is not None and width != len(occupant):  # the rows in flight (and waiting) fit another batch
                start = time.perf_counter()
                state, seconds = self._resize(state, live, width)
                occupant = [occupant[b] for b in live] + [-1] * (width - len(live))
                length = np.concatenate([length[live], np.ones(width - len(live), np.int64)])
                rounds = np.concatenate([rounds[live], np.zeros(width - len(live), np.int64)])
                jax.block_until_ready(state)
                elapsed = time.perf_counter() - start - seconds
                wall[[occupant[b] for b in range(len(live))]] += elapsed / max(1, len(live))
                stats.decode_time_s += elapsed
                stats.wall_time_s += elapsed
                stats.resizes += 1
            if state is None:
                occupant = [-1] * width
            free = [b for b, o in enumerate(occupant) if o < 0]
            if queue and free and state is not None and self.auto is not None:  # gamma="auto": γ may change here
                state, dparams = self.auto.between(self, state, dparams, rows_hist, width)
                spec = self.spec
            if queue and free:
                take = [queue.popleft() for _ in range(min(len(free), len(queue)))]
                start = time.perf_counter()
                state, seconds = self._refill(state, tparams, dparams, take, free[: len(take)], width)
                for b, i in zip(free, take):
                    occupant[b] = i
                    self._slot[i] = b
                length, rounds = sharding.to_host((state.length, state.rounds))
                elapsed = time.perf_counter() - start - seconds
                wall[take] += elapsed / len(take)
                stats.prefill_time_s += elapsed
                stats.wall_time_s += elapsed
                stats.refills += 1
            assert state is not None  # the first pass through the loop refilled (requests is never empty)
            stop_after = inputs_lib.replicated_scalar(spec.mesh, engine.refill_at if queue else 1)
            start = time.perf_counter()
            before = rounds
            state, seconds = loop.rounds_program(spec, tparams, dparams, state, never, stop_after)
            self._compiled(f"rounds[{width}]", seconds)
            new_length, done, rounds = sharding.to_host((state.length, state.done, state.rounds))
            elapsed = time.perf_counter() - start - seconds
            stats.wall_time_s += elapsed
            stats.decode_time_s += elapsed
            self.decode_s[width] += elapsed
            stats.syncs += 1
            busy = [b for b in range(width) if occupant[b] >= 0]
            ran = int(np.max(rounds - before))
            stats.rounds += ran
            stats.slot_rounds += ran * width
            stats.widths[width] = stats.widths.get(width, 0) + ran
            if queue:  # requests waiting: every free slot was refilled when this call started
                stats.queued_rounds += ran
                stats.queued_slot_rounds += ran * width
                stats.queued_row_rounds += int((rounds - before)[busy].sum())
            grown = np.array([new_length[b] - length[b] for b in busy], np.float64)
            share = grown / grown.sum() if grown.sum() > 0 else np.full(len(busy), 1.0 / max(1, len(busy)))
            for b, s in zip(busy, share):
                wall[occupant[b]] += elapsed * s
            length = new_length
            finished = [b for b in busy if done[b]]
            if not finished:
                continue
            host = sharding.to_host(
                (
                    state.tokens,
                    state.logprobs,
                    state.prompt_len,
                    state.finish,
                    state.drafted,
                    state.accepted,
                    state.accept_hist,
                    state.bad_target,
                    state.bad_draft,
                    state.forced,
                    None if state.grammar is None else state.grammar.state,
                )
            )
            for b in finished:
                result = self._row(host, b, occupant[b], int(new_length[b]), int(rounds[b]), wall[occupant[b]])
                occupant[b] = -1
                stats.rows += 1
                stats.generated_tokens += len(result.tokens)
                stats.row_rounds += result.stats.rounds
                stats.drafted += result.stats.drafted
                stats.accepted += result.stats.accepted
                rows_hist.append(result.stats.accept_hist)
                row_stats.append(result.stats)
                yield result
        self._observe(rows_hist, row_stats)

    def _compiled(self, program: str, seconds: float) -> None:
        """Count a program's compile (or load) seconds in the run's stats."""
        if seconds > 0:
            self.stats.compile_time_s += seconds
            self.stats.compiles[program] = self.stats.compiles.get(program, 0.0) + seconds

    def _put(self, values: np.ndarray):
        """A small host array placed for the slot programs (replicated over the mesh, if any)."""
        mesh = self.spec.mesh
        if mesh is None:
            return jax.device_put(values)
        return sharding.put(values, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))

    def _resize(self, state, live: list[int], width: int):
        """``state`` with its rows ``live`` moved to the first slots of a state of ``width`` rows (the others
        idle): ``(state, compile seconds)``."""
        rows = np.asarray(live + [-1] * (width - len(live)), np.int32)
        before = state.done.shape[0]
        state, seconds = slots.resize_program(self.spec, state, self._put(rows))
        self._compiled(f"resize[{before}->{width}]", seconds)
        return state, seconds

    def _refill(self, state, tparams, dparams, take: list[int], free: list[int], width: int):
        """Prefill the requests ``take`` and insert them into the slots ``free`` (same length) of ``state`` (of
        ``width`` rows); with no state yet, the prefill of ``width`` rows is the state. Returns ``(state, compile
        seconds)``."""
        request, spec, batch = self.batch.request, self.spec, self.batch
        k = width if state is None else self.engine.width(len(take))
        prompt = np.zeros((k, self.cache_len), np.int32)
        eos = np.full((k, self.eos_width), -1, np.int32)
        pad = k - len(take)

        def col(values, fill, dtype):
            return np.concatenate([np.asarray(values), np.full(pad, fill)]).astype(dtype)

        for r, i in enumerate(take):
            prompt[r, : len(request.rows[i])] = request.rows[i]
            eos[r, : len(batch.eos[i])] = batch.eos[i]
        # host arrays here (LoopInputs holds jax.Arrays once placed, just below)
        inputs = loop.LoopInputs(
            prompt=prompt,  # type: ignore[arg-type]
            prompt_len=col([len(request.rows[i]) for i in take], 1, np.int32),
            max_new=col(request.max_new[take], 1, np.int32),
            active=np.arange(k) < len(take),  # type: ignore[arg-type]
            seeds=col(request.seeds[take], 0, np.uint32),
            row_ids=col(batch.row_ids[take], 0, np.uint32),
            eos=eos,  # type: ignore[arg-type]
            sampling=SamplingParams.create(
                col(request.temperature[take], 0.0, np.float32),
                col(np.minimum(request.top_k[take], self.spec.vocab_size), 0, np.int32),
                col(request.top_p[take], 1.0, np.float32),
            ),
            grammar=None if self.table_shape is None else self._grammar(take, pad),
        )
        inputs = jax.device_put(inputs) if spec.mesh is None else inputs_lib.place_inputs(inputs, spec.mesh)
        new, seconds = loop.prefill_program(spec, tparams, dparams, inputs)
        self._compiled(f"prefill[{k}]", seconds)
        if state is None:
            return new, seconds
        where = self._put(col(free, width, np.int32))  # padding rows go past the last slot: dropped
        state, more = slots.insert_program(spec, state, new, where)
        self._compiled(f"insert[{width}<-{k}]", more)
        return state, seconds + more

    def _grammar(self, take: list[int], pad: int) -> Grammar:
        """The constraint tables of the requests ``take`` and ``pad`` unconstrained padding rows, every row at its
        initial state (host arrays, at the run's table shape)."""
        automata = self.batch.request.automata
        assert automata is not None and self.table_shape is not None
        rows = [automata[i] for i in take] + [None] * pad
        token_class, next_state = constraints.device_tables(rows, self.spec.vocab_size, self.table_shape)
        return Grammar(token_class, next_state, np.zeros(len(rows), np.int32))  # type: ignore[arg-type]

    def _row(self, host, slot: int, index: int, length: int, rounds: int, wall: float) -> RowResult:
        tokens, logprobs, plen, finish, drafted, accepted, hist, bad_t, bad_d, forced, where = host
        start = int(plen[slot])
        automata = self.batch.request.automata
        automaton = None if automata is None else automata[index]
        out = tokens[slot, start:length].tolist()
        reason = FINISH_REASONS.get(int(finish[slot]), "running")
        stats = RowStats(
            generated_tokens=length - start,
            rounds=rounds,
            drafted=int(drafted[slot]),
            accepted=int(accepted[slot]),
            accept_hist=tuple(int(x) for x in hist[slot]),
            forced_tokens=int(forced[slot]),
            finish_reason=reason,
            complete=None if automaton is None else bool(automaton.final[int(where[slot])]),
        )
        error = None
        if bad_t[slot] or bad_d[slot]:
            if bad_t[slot]:
                who = f"target model {self.batch.request.target.name!r}"
            else:
                assert self.drafter is not None  # only a drafter's logits set the draft's flag
                who = f"draft {self.drafter.name!r}"
            error = f"{who} produced NaN/inf logits (or no finite logit); the tokens are not trustworthy"
        tokenizer = self.batch.request.target.tokenizer
        text = None if tokenizer is None else results.decode(tokenizer, out)
        return RowResult(
            index=index,
            id=self.batch.ids[index],
            tokens=out,
            logprobs=np.asarray(logprobs[slot, start:length], np.float32),
            finish_reason=reason,
            text=text,
            stats=stats,
            slot=int(self._slot[index]),
            wall_time_s=float(wall),
            error=error,
        )

    def _observe(self, hists, row_stats) -> None:
        """With ``gamma="auto"``, feed the last decode calls' round time and acceptance back into the policy (not a
        straggler factor: refilled slots do not wait for the slowest row)."""
        if self.auto is not None:
            self.auto.close(self, hists)
