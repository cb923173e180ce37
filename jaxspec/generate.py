"""Host API: input checks (before anything compiles), tokenization, bucketing, results, stats, streaming."""

from __future__ import annotations

import dataclasses
import numbers
import time
from collections.abc import Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxspec import loop, sharding
from jaxspec import policy as policy_lib
from jaxspec.drafters import PromptLookup, as_drafter
from jaxspec.model import CausalLM
from jaxspec.sampling import SamplingParams

FINISH_REASONS = {loop.FINISH_EOS: "eos", loop.FINISH_LENGTH: "length", loop.FINISH_CACHE: "cache"}


class NonFiniteLogitsError(FloatingPointError):
    """A model produced NaN/+inf logits (or no finite logit) at a position that decided a token.

    ``.result`` holds the (untrustworthy) result so nothing computed is lost; ``.rows`` the affected rows.
    """

    def __init__(self, message, rows, result):
        super().__init__(message)
        self.rows = rows
        self.result = result


@dataclasses.dataclass(frozen=True)
class _Counts:
    generated_tokens: int
    rounds: int  # target forward passes after prefill (summed over rows for a call)
    drafted: int
    accepted: int
    accept_hist: tuple[int, ...]  # accept_hist[n] = rounds in which exactly n drafts were accepted

    @property
    def acceptance_rate(self) -> float | None:
        """α: accepted ÷ drafted (None for plain decoding)."""
        return self.accepted / self.drafted if self.drafted else None

    @property
    def tokens_per_round(self) -> float | None:
        """τ: generated tokens ÷ target passes."""
        return self.generated_tokens / self.rounds if self.rounds else None

    @property
    def position_acceptance(self) -> tuple[float | None, ...]:
        """For each draft position i: P(draft i accepted | the drafts before it were accepted)."""
        hist = np.asarray(self.accept_hist)
        out = []
        for i in range(len(hist) - 1):
            reached = hist[i:].sum()
            out.append(float(hist[i + 1 :].sum() / reached) if reached else None)
        return tuple(out)


@dataclasses.dataclass(frozen=True)
class RowStats(_Counts):
    finish_reason: str = "running"  # "eos" | "length" (max_new_tokens) | "cache" (end of the KV cache)


@dataclasses.dataclass(frozen=True)
class Stats(_Counts):
    """Per-call statistics; ``rows`` holds the same figures per prompt."""

    mode: str = "plain"  # "speculative" | "plain"
    gamma: int = 0
    batch_size: int = 0
    compiled_batch_size: int = 0
    cache_length: int = 0
    wall_time_s: float = 0.0  # run time on device, compilation excluded
    compile_time_s: float = 0.0  # compilation during this call (0 when the shapes were seen before)
    rows: tuple[RowStats, ...] = ()
    policy: dict | None = None  # gamma="auto": the decision and its inputs (α estimate, c, v, expected speed-ups)

    @property
    def target_passes(self) -> int:
        """Batched verify passes the loop ran (the slowest row's rounds); ``rounds`` sums rows."""
        return max((r.rounds for r in self.rows), default=0)

    @property
    def tokens_per_s(self) -> float:
        return self.generated_tokens / self.wall_time_s if self.wall_time_s > 0 else float("nan")

    def summary(self) -> str:
        parts = [f"{self.mode}", f"{self.generated_tokens} tokens", f"{self.target_passes} target passes"]
        if self.acceptance_rate is not None:
            parts += [f"γ={self.gamma}", f"α={self.acceptance_rate:.3f}", f"τ={self.tokens_per_round:.2f}"]
        parts += [f"{self.wall_time_s:.3f}s", f"{self.tokens_per_s:.1f} tok/s"]
        if self.compile_time_s:
            parts.append(f"compiled in {self.compile_time_s:.1f}s")
        return ", ".join(parts)


@dataclasses.dataclass(frozen=True)
class GenerationResult:
    tokens: list[list[int]]  # generated ids per prompt (prompt excluded)
    logprobs: list[np.ndarray]  # target log-probability (raw logits, before warping) of each token
    finish_reasons: list[str]
    stats: Stats
    texts: list[str] | None = None


@dataclasses.dataclass(frozen=True)
class StreamStep:
    """Newly verified tokens per prompt after one round (empty lists for rows with nothing new)."""

    tokens: list[list[int]]
    texts: list[str] | None = None


# --------------------------------------------------------------------------------------------- checks


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _is_real(x) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _per_row_ints(value, name: str, n: int, lo: int, hi: int | None = None) -> np.ndarray:
    values = [value] * n if _is_int(value) else value
    if isinstance(values, (str, bytes)) or not isinstance(values, (Sequence, np.ndarray)):
        raise ValueError(f"{name} must be an int or a sequence of {n} ints, got {value!r}")
    values = list(values)
    if len(values) != n:
        raise ValueError(f"{name} has {len(values)} entries but there are {n} prompts")
    for v in values:
        if not _is_int(v) or v < lo or (hi is not None and v >= hi):
            rng = f">= {lo}" if hi is None else f"in [{lo}, {hi})"
            raise ValueError(f"{name} must be an int {rng}, got {v!r}")
    return np.asarray(values, np.int64)


def _check_tokenizers(target: CausalLM, draft: CausalLM | None) -> None:
    """Draft and target must map text to the same ids: compare their vocabularies (token -> id)."""
    if draft is None or target.tokenizer is None or draft.tokenizer is None:
        return
    if target.tokenizer is draft.tokenizer:
        return
    vocab = getattr(target.tokenizer, "get_vocab", None)
    other = getattr(draft.tokenizer, "get_vocab", None)
    if vocab is None or other is None:
        return
    a, b = vocab(), other()
    if a != b:
        diff = sorted(set(a.items()) ^ set(b.items()))[:3]
        raise ValueError(
            f"draft tokenizer ({draft.name}) is not compatible with the target tokenizer ({target.name}): their "
            f"vocabularies differ ({len(a)} vs {len(b)} entries; e.g. {diff}); speculation needs one shared tokenizer"
        )


def _apply_chat(model: CausalLM, text: str, index: int) -> list[int]:
    tok = model.tokenizer
    if getattr(tok, "chat_template", None) is None:
        raise ValueError(
            f"chat=True but {model.name}'s tokenizer has no chat template (prompts[{index}]); pass chat=False "
            "or a tokenizer with a chat_template"
        )
    ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "keys"):  # some versions return a BatchEncoding
        ids = ids["input_ids"]
    return list(ids)


def _tokenize(model: CausalLM, prompts, chat: bool = False) -> list[list[int]]:
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
    if all(_is_int(t) for t in prompts):
        prompts = [prompts]
    out = []
    for i, p in enumerate(prompts):
        if isinstance(p, str):
            if model.tokenizer is None:
                raise ValueError(f"prompts[{i}] is a string but {model.name} has no tokenizer; pass token ids")
            p = _apply_chat(model, p, i) if chat else model.tokenizer.encode(p)
        if isinstance(p, np.ndarray):
            p = p.tolist()
        if not isinstance(p, Sequence) or not all(_is_int(t) for t in p):
            raise ValueError(f"prompts[{i}] must be a string or a sequence of ints, got {type(p).__name__}")
        out.append([int(t) for t in p])
    return out


def _next_pow2(n: int, minimum: int) -> int:
    return max(minimum, 1 << max(0, n - 1).bit_length())


def bucket_batch(n: int) -> int:
    """Compiled batch size: powers of two up to 8, then multiples of 8."""
    return _next_pow2(n, 1) if n <= 8 else -(-n // 8) * 8


def bucket_cache(n: int) -> int:
    """Compiled cache length: powers of two from 64 up to 2048, then multiples of 1024."""
    return _next_pow2(n, 64) if n <= 2048 else -(-n // 1024) * 1024


@dataclasses.dataclass(frozen=True)
class Prepared:
    spec: loop.LoopSpec
    inputs: loop.LoopInputs
    num_rows: int
    tokenizer: object
    shard_draft: bool = True
    decision: policy_lib.Decision | None = None
    policy: policy_lib.AutoGamma | None = None
    draft: object = None  # the drafter actually used (None for plain decoding)


def prepare(
    target,
    prompts,
    *,
    draft=None,
    gamma=4,
    max_new_tokens=64,
    temperature=1.0,
    top_k=None,
    top_p=None,
    eos_token_id=None,
    seed=0,
    max_length=None,
    acceptance=None,
    chat=False,
    mesh=None,
    shard_draft=True,
    policy=None,
) -> Prepared:
    """Check every argument and build the static spec and traced inputs. Raises ``ValueError`` on bad input."""
    if not isinstance(target, CausalLM):
        raise TypeError(f"target must be a jaxspec.CausalLM, got {type(target).__name__}")
    lookup = as_drafter(draft)
    if lookup is not None:
        draft = None
    elif draft is not None:
        if not isinstance(draft, CausalLM):
            raise TypeError(
                f"draft must be a jaxspec.CausalLM, 'prompt_lookup', a jaxspec.PromptLookup or None, got {draft!r}"
            )
        if draft.vocab_size != target.vocab_size:
            raise ValueError(
                f"draft vocab_size ({draft.vocab_size}) != target vocab_size ({target.vocab_size}); "
                "draft and target must share one vocabulary"
            )
    auto = isinstance(gamma, str) and gamma == "auto"
    if not auto and (not _is_int(gamma) or gamma < 1):
        raise ValueError(f"gamma must be an int >= 1 or 'auto', got {gamma!r}")
    if auto and draft is None and lookup is None:
        raise ValueError("gamma='auto' needs a draft (a model or 'prompt_lookup') to decide between")
    if policy is not None and not isinstance(policy, policy_lib.AutoGamma):
        raise ValueError(f"policy must be a jaxspec.policy.AutoGamma or None, got {policy!r}")
    if not _is_real(temperature) or not np.isfinite(temperature) or temperature < 0:
        raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {temperature!r}")
    if top_k is not None and (not _is_int(top_k) or top_k < 0):
        raise ValueError(f"top_k must be None or an int >= 0 (0 = off), got {top_k!r}")
    if top_p is not None and (not _is_real(top_p) or not 0 < top_p <= 1):
        raise ValueError(f"top_p must be None or a number in (0, 1], got {top_p!r}")
    if max_length is not None and (not _is_int(max_length) or max_length < 2):
        raise ValueError(f"max_length must be None or an int >= 2, got {max_length!r}")

    if not isinstance(chat, bool):
        raise ValueError(f"chat must be True or False, got {chat!r}")
    mesh = sharding.make_mesh(mesh)
    if not isinstance(shard_draft, bool):
        raise ValueError(f"shard_draft must be True or False, got {shard_draft!r}")
    _check_tokenizers(target, draft)
    rows = _tokenize(target, prompts, chat)
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
    max_new = _per_row_ints(max_new_tokens, "max_new_tokens", n, 1)
    if _is_int(seed):
        seeds = _per_row_ints(seed, "seed", n, 0, 2**32)
        row_ids = np.arange(n)
    else:  # one seed per prompt: a row's sample then depends on its own seed only
        seeds = _per_row_ints(seed, "seed", n, 0, 2**32)
        row_ids = np.zeros(n, np.int64)
    if eos_token_id is None:
        eos_token_id = target.eos_token_id
    eos = [] if eos_token_id is None else ([eos_token_id] if _is_int(eos_token_id) else list(eos_token_id))
    for e in eos:
        if not _is_int(e) or not 0 <= e < vocab:
            raise ValueError(f"eos_token_id must be None or int(s) in [0, {vocab}), got {eos_token_id!r}")

    lengths = np.asarray([len(p) for p in rows])
    if max_length is None:
        cache_len = bucket_cache(int(np.max(lengths + max_new)))
    else:
        cache_len = max_length
    batch = bucket_batch(n)
    data = sharding.axis_size(mesh, "data")
    batch = -(-batch // data) * data  # the batch splits evenly over the data axis

    def spec_for(g: int) -> loop.LoopSpec:
        use_draft = draft if g > 0 else None
        return loop.LoopSpec(
            target_apply=target.apply_fn,
            target_init_cache=target.init_cache,
            draft_apply=None if use_draft is None else use_draft.apply_fn,
            draft_init_cache=None if use_draft is None else use_draft.init_cache,
            gamma=g,
            cache_len=cache_len,
            mesh=mesh,
            lookup=lookup if g > 0 else None,
            **({} if acceptance is None else {"acceptance": acceptance}),
        )

    plen = min(_next_pow2(int(lengths.max()), 8), cache_len)  # the prompt's padded length (prefill buckets)
    decision = None
    if auto:  # every check above has passed: measuring costs (it compiles the candidate loops) is safe now
        policy = policy or policy_lib.DEFAULT
        greedy = temperature == 0
        tparams, dparams = _placed_params(target, draft, mesh, shard_draft)

        def round_timer(gammas) -> dict:
            return policy_lib.time_rounds({g: spec_for(g) for g in gammas}, tparams, dparams, batch, greedy)

        mesh_key = None if mesh is None else (tuple(mesh.shape.items()), shard_draft)
        decision = policy.decide(
            target,
            lookup or draft,
            batch,
            cache_len,
            int(np.mean(max_new)),
            greedy,
            round_timer=round_timer,
            mesh_key=mesh_key,
            prompt_tokens=plen,
        )
        gamma = decision.gamma
        if gamma == 0:
            draft = lookup = None
    g = gamma if draft is not None or lookup is not None else 0
    prompt = np.zeros((batch, plen), np.int32)
    for i, p in enumerate(rows):
        prompt[i, : len(p)] = p
    pad = batch - n
    eos_arr = np.full(_next_pow2(len(eos), 4), -1, np.int32)
    eos_arr[: len(eos)] = eos

    spec = spec_for(g)
    inputs = loop.LoopInputs(
        prompt=jnp.asarray(prompt),
        prompt_len=jnp.asarray(np.concatenate([lengths, np.ones(pad, np.int64)]), jnp.int32),
        max_new=jnp.asarray(np.concatenate([max_new, np.ones(pad, np.int64)]), jnp.int32),
        active=jnp.asarray(np.arange(batch) < n),
        seeds=jnp.asarray(np.concatenate([seeds, np.zeros(pad, np.int64)]), jnp.uint32),
        row_ids=jnp.asarray(np.concatenate([row_ids, np.zeros(pad, np.int64)]), jnp.uint32),
        eos=jnp.asarray(eos_arr),
        sampling=SamplingParams.create(temperature, top_k, top_p),
    )
    if mesh is not None:
        inputs = _place_inputs(inputs, mesh)
    return Prepared(spec, inputs, n, target.tokenizer, shard_draft, decision, policy, lookup or draft)


def _place_inputs(inputs: loop.LoopInputs, mesh) -> loop.LoopInputs:
    """Per-row inputs split over ``data``; EOS ids and sampling parameters replicated (every process passes the
    same host values and supplies its own shards)."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    def place(field, value):
        if field in ("eos", "sampling"):
            return jax.tree.map(lambda x: sharding.put(np.asarray(x), NamedSharding(mesh, P())), value)
        return sharding.put(np.asarray(value), NamedSharding(mesh, sharding.batch_spec(np.ndim(value))))

    return loop.LoopInputs(**{f.name: place(f.name, getattr(inputs, f.name)) for f in dataclasses.fields(inputs)})


def _on_mesh(prep: Prepared, target: CausalLM, draft: CausalLM | None):
    """Target params sharded by their logical axes; the draft's too, or replicated with ``shard_draft=False``."""
    return _placed_params(target, draft, prep.spec.mesh, prep.shard_draft)


def _placed_params(target: CausalLM, draft, mesh, shard_draft: bool):
    if not isinstance(draft, CausalLM):
        draft = None  # no draft, or prompt lookup
    if mesh is None:
        return target.params, None if draft is None else draft.params
    target = sharding.shard(target, mesh)
    if draft is not None:
        draft = sharding.shard(draft, mesh, replicate=not shard_draft)
    return target.params, None if draft is None else draft.params


# --------------------------------------------------------------------------------------------- results


def _decode(tokenizer, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=True)


def _result(prep: Prepared, state: loop.State, wall: float, compile_s: float, names) -> GenerationResult:
    host = sharding.to_host(
        (
            state.tokens,
            state.logprobs,
            state.length,
            state.prompt_len,
            state.finish,
            state.rounds,
            state.drafted,
            state.accepted,
            state.accept_hist,
            state.bad_target,
            state.bad_draft,
        )
    )
    tokens, logprobs, length, plen, finish, rounds, drafted, accepted, hist, bad_t, bad_d = host
    n = prep.num_rows
    out_tokens, out_lp, reasons, row_stats = [], [], [], []
    for b in range(n):
        sl = slice(int(plen[b]), int(length[b]))
        out_tokens.append(tokens[b, sl].tolist())
        out_lp.append(np.asarray(logprobs[b, sl], np.float32))
        reasons.append(FINISH_REASONS.get(int(finish[b]), "running"))
        row_stats.append(
            RowStats(
                generated_tokens=int(length[b] - plen[b]),
                rounds=int(rounds[b]),
                drafted=int(drafted[b]),
                accepted=int(accepted[b]),
                accept_hist=tuple(int(x) for x in hist[b]),
                finish_reason=reasons[-1],
            )
        )
    gamma = prep.spec.gamma
    stats = Stats(
        mode="speculative" if gamma else "plain",
        gamma=gamma,
        batch_size=n,
        compiled_batch_size=int(tokens.shape[0]),
        cache_length=prep.spec.cache_len,
        generated_tokens=sum(r.generated_tokens for r in row_stats),
        rounds=sum(r.rounds for r in row_stats),
        drafted=sum(r.drafted for r in row_stats),
        accepted=sum(r.accepted for r in row_stats),
        accept_hist=tuple(int(x) for x in hist[:n].sum(axis=0)),
        wall_time_s=wall,
        compile_time_s=compile_s,
        rows=tuple(row_stats),
        policy=None if prep.decision is None else prep.decision.as_dict(),
    )
    texts = None if prep.tokenizer is None else [_decode(prep.tokenizer, t) for t in out_tokens]
    result = GenerationResult(out_tokens, out_lp, reasons, stats, texts)
    for flags, who in ((bad_t[:n], names[0]), (bad_d[:n], names[1])):
        if flags.any():
            bad_rows = [int(i) for i in np.flatnonzero(flags)]
            raise NonFiniteLogitsError(
                f"{who} produced NaN/inf logits (or no finite logit) for rows {bad_rows[:10]}"
                f"{' ...' if len(bad_rows) > 10 else ''}; the tokens of those rows are not trustworthy "
                "(check the weights, dtype and inputs; the result is attached as .result)",
                bad_rows,
                result,
            )
    return result


def _names(target: CausalLM, draft) -> tuple[str, str]:
    kind = "draft model" if isinstance(draft, CausalLM) else "draft"
    return f"target model {target.name!r}", f"{kind} {getattr(draft, 'name', draft)!r}"


def generate(
    target: CausalLM, prompts, *, draft: CausalLM | PromptLookup | str | None = None, **kwargs
) -> GenerationResult:
    """Generate continuations of ``prompts`` with ``target``, speculatively when ``draft`` is given.

    Args:
      target: the model whose distribution the output follows exactly.
      prompts: list of token-id lists (any lengths), an int array ``[B, T]``, or strings (needs a tokenizer).
      draft: a cheaper ``CausalLM`` with the same vocabulary; ``"prompt_lookup"`` (or a ``jaxspec.PromptLookup``)
        to draft by copying n-grams from the row's own prompt and output, with no draft model; or None for plain
        autoregressive decoding.
      gamma: draft tokens per round (static: each value compiles once), or ``"auto"``: pick γ among a few
        compiled values, or plain decoding, from measured costs and the acceptance seen so far
        (``jaxspec.policy``; the decision and its inputs are in ``stats.policy``).
      policy: with ``gamma="auto"``, a ``jaxspec.policy.AutoGamma`` (default: the process-wide one).
      max_new_tokens: int or one int per prompt (traced).
      temperature, top_k, top_p: warping applied to target and draft alike (traced: never recompiles).
        temperature 0 is greedy. top_k 0/None and top_p 1/None mean off.
      eos_token_id: int or ints ending a row; defaults to ``target.eos_token_id``.
      seed: int (row ``b`` uses ``fold_in(key(seed), b)``) or one int per prompt (row uses its own seed only).
      max_length: cache length (prompt + generated); default: bucketed from the prompt and ``max_new_tokens``.
      chat: wrap each string prompt as one user turn with the tokenizer's chat template (generation prompt added).
      acceptance: advanced: the acceptance rule, a hashable ``jaxspec.acceptance.RejectionSampler`` (subclass)
        instance; the default is the exact rule.
      mesh: a ``jax.sharding.Mesh`` with axes ``data``/``model`` or a dict such as ``{"data": 2, "model": 4}``:
        rows and KV caches split over ``data``, the target's weights over ``model`` (see ``jaxspec.sharding``).
        With several processes (``jax.distributed``) every process makes the same call and gets every row.
      shard_draft: on a mesh, shard the draft's weights by the same rules as the target's (default). False
        replicates them over ``model``: no collectives per draft step, but every device reads the whole draft
        each step (worth it for small drafts; see the README's estimate).

    Returns a ``GenerationResult`` with ``tokens``, ``logprobs``, ``finish_reasons``, ``texts`` and ``stats``.
    Raises ``ValueError`` for bad input before compiling, ``NonFiniteLogitsError`` after the call if a model
    produced NaN/inf logits.
    """
    prep = prepare(target, prompts, draft=draft, **kwargs)
    tparams, dparams = _on_mesh(prep, target, prep.draft)  # the drafter used: None when auto chose plain
    start = time.perf_counter()
    if prep.decision is None:
        state, compile_s = loop.generate_program(prep.spec, tparams, dparams, prep.inputs)
    else:  # gamma="auto": the rounds program its cost measurement compiled, after a prefill
        state, compile_s = loop.prefill_program(prep.spec, tparams, dparams, prep.inputs)
        state, seconds = loop.rounds_program(prep.spec, tparams, dparams, state, _scalar(prep, np.iinfo(np.int32).max))
        compile_s += seconds
    state = jax.block_until_ready(state)
    wall = time.perf_counter() - start - compile_s
    return _observe(prep, target, _result(prep, state, wall, compile_s, _names(target, draft)))


def _scalar(prep: Prepared, value: int) -> jax.Array:
    """An int32 scalar argument for the loop programs (replicated over the mesh, if any)."""
    if prep.spec.mesh is None:
        return jnp.int32(value)
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    return sharding.put(np.int32(value), NamedSharding(prep.spec.mesh, P()))


def _observe(prep: Prepared, target: CausalLM, result: GenerationResult) -> GenerationResult:
    """gamma="auto": feed the acceptance seen in this call back into the policy's running estimate."""
    if prep.decision is not None and result.stats.drafted:
        greedy = bool(np.asarray(prep.inputs.sampling.temperature) == 0)
        rows = result.stats.rows
        prep.policy.observe(
            target,
            prep.draft,
            greedy,
            result.stats.accepted,
            result.stats.drafted,
            result.stats.accept_hist,
            batch=prep.inputs.prompt.shape[0],
            passes=result.stats.target_passes,
            row_tokens=[r.generated_tokens for r in rows],
            row_rounds=[r.rounds for r in rows],
        )
    return result


class Stream:
    """Iterator over ``StreamStep``s, one per round; ``.result`` holds the ``GenerationResult`` at the end."""

    def __init__(self, target: CausalLM, draft: CausalLM | None, prep: Prepared):
        self._target, self._draft, self._prep = target, draft, prep
        self.result: GenerationResult | None = None

    def __iter__(self) -> Iterator[StreamStep]:
        prep, target = self._prep, self._target
        tparams, dparams = _on_mesh(prep, target, prep.draft)
        start = time.perf_counter()
        state, compile_s = loop.prefill_program(prep.spec, tparams, dparams, prep.inputs)
        n = prep.num_rows
        emitted = sharding.to_host(prep.inputs.prompt_len)[:n].copy()
        plen = emitted.copy()
        texts_so_far = [""] * n
        one = _scalar(prep, 1)
        while True:
            state, seconds = loop.rounds_program(prep.spec, tparams, dparams, state, one)
            compile_s += seconds
            length, done = sharding.to_host((state.length, state.done))
            length = length[:n]
            tokens = sharding.to_host(state.tokens)[:n] if (length > emitted).any() else None
            new = [tokens[b, emitted[b] : length[b]].tolist() if tokens is not None else [] for b in range(n)]
            texts = None
            if prep.tokenizer is not None:
                texts = []
                for b in range(n):
                    full = _decode(prep.tokenizer, tokens[b, plen[b] : length[b]].tolist()) if new[b] else ""
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
        self.result = _observe(prep, target, _result(prep, state, wall, compile_s, _names(target, self._draft)))


def stream(target: CausalLM, prompts, *, draft: CausalLM | PromptLookup | str | None = None, **kwargs) -> Stream:
    """Like ``generate``, but iterate to receive each row's newly verified tokens after every round."""
    return Stream(target, draft, prepare(target, prompts, draft=draft, **kwargs))
