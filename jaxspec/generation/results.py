"""What a generation returns: ``GenerationResult``, ``Stats`` / ``RowStats``, ``StreamStep``, and
``NonFiniteLogitsError``; ``build_result`` reads them off the loop's final state (the last stage of ``generate``)."""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxspec import loop
from jaxspec.parallel import sharding
from jaxspec.policy.cost import position_counts

FINISH_REASONS = {loop.FINISH_EOS: "eos", loop.FINISH_LENGTH: "length", loop.FINISH_CACHE: "cache"}
"""Finish codes stored on device -> the names in ``GenerationResult.finish_reasons`` (a row not finished:
``"running"``)."""


class NonFiniteLogitsError(FloatingPointError):
    """A model produced NaN/+inf logits (or no finite logit) at a position that decided a token.

    Attributes:
      rows: the affected rows (indices into the prompts), sorted.
      result: the (untrustworthy) ``GenerationResult``, so nothing computed is lost.
    """

    def __init__(self, message: str, rows: list[int], result: GenerationResult):
        super().__init__(message)
        self.rows = rows
        self.result = result


@dataclasses.dataclass(frozen=True)
class _Counts:
    """The counters shared by ``RowStats`` (one prompt) and ``Stats`` (a call, summed over prompts)."""

    generated_tokens: int
    rounds: int  # target forward passes after prefill (summed over rows for a call)
    drafted: int
    accepted: int
    accept_hist: tuple[int, ...]  # accept_hist[n] = verify rounds in which exactly n drafts were accepted; length γ+1
    forced_tokens: int = 0  # emitted tokens that were the only one their row's constraint allowed

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
        """For each draft position i: P(draft i accepted | the drafts before it were accepted); length γ."""
        reached, accepted = position_counts(self.accept_hist)
        return tuple(a / r if r else None for a, r in zip(accepted, reached))


@dataclasses.dataclass(frozen=True)
class RowStats(_Counts):
    """One prompt's figures.

    Attributes:
      generated_tokens: tokens generated for this prompt (prompt excluded).
      rounds: target passes this row took part in after prefill: verify rounds, plus the plain steps taken when
        an abstaining drafter (prompt lookup) had nothing to propose for any row.
      drafted, accepted: draft tokens verified / accepted for this row (0 for plain decoding).
      accept_hist: ``accept_hist[n]`` = this row's verify rounds in which exactly n drafts were accepted (length
        γ+1; for plain decoding, every round in ``accept_hist[0]``). ``rounds - sum(accept_hist)`` is the number
        of plain steps taken while the drafter abstained.
      finish_reason: ``"eos"`` | ``"length"`` (``max_new_tokens``) | ``"cache"`` (end of the KV cache).
      forced_tokens: with a constraint, the tokens it forced (the only one its state allowed; proposed for free).
      complete: with a constraint, whether the output matches it in full (False: it stopped inside the
        structure, at ``max_new_tokens`` or the cache's end); None without one.
    """

    finish_reason: str = "running"
    complete: bool | None = None


@dataclasses.dataclass(frozen=True)
class Stats(_Counts):
    """One call's figures: the counters summed over prompts (see ``RowStats``), plus the call's shape and timing.

    Attributes:
      mode: ``"speculative"`` or ``"plain"``.
      gamma: draft tokens per round (0 for plain decoding).
      batch_size: prompts in the call; ``compiled_batch_size`` the bucketed batch the loop compiled for.
      cache_length: KV-cache length (prompt + generated) the loop compiled for.
      wall_time_s: run time on device, compilation excluded.
      compile_time_s: compilation during this call (0 when the shapes were seen before).
      rows: one ``RowStats`` per prompt.
      policy: with ``gamma="auto"``, the decision and its inputs (``jaxspec.policy.Decision.as_dict()``: α estimate,
        c, v, round costs, expected speed-ups, reason); None otherwise.
    """

    mode: str = "plain"
    gamma: int = 0
    batch_size: int = 0
    compiled_batch_size: int = 0
    cache_length: int = 0
    wall_time_s: float = 0.0
    compile_time_s: float = 0.0
    rows: tuple[RowStats, ...] = ()
    policy: dict | None = None

    @property
    def target_passes(self) -> int:
        """Batched verify passes the loop ran (the slowest row's rounds); ``rounds`` sums rows."""
        return max((r.rounds for r in self.rows), default=0)

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens ÷ ``wall_time_s`` (NaN when no time was measured)."""
        return self.generated_tokens / self.wall_time_s if self.wall_time_s > 0 else float("nan")

    def summary(self) -> str:
        """One line: mode, tokens, target passes, γ/α/τ when speculative, time, tokens/s, compile time."""
        parts = [f"{self.mode}", f"{self.generated_tokens} tokens", f"{self.target_passes} target passes"]
        if self.acceptance_rate is not None:
            parts += [f"γ={self.gamma}", f"α={self.acceptance_rate:.3f}", f"τ={self.tokens_per_round:.2f}"]
        parts += [f"{self.wall_time_s:.3f}s", f"{self.tokens_per_s:.1f} tok/s"]
        if self.compile_time_s:
            parts.append(f"compiled in {self.compile_time_s:.1f}s")
        return ", ".join(parts)


@dataclasses.dataclass(frozen=True)
class GenerationResult:
    """What ``generate`` returns (and ``Stream.result`` holds), one entry per prompt in every list.

    Attributes:
      tokens: generated ids per prompt (prompt excluded).
      logprobs: per prompt, ``[len(tokens[b])] float32``: the target's log-probability of each generated token
        (raw logits, before warping), from the verify pass.
      finish_reasons: ``"eos"`` | ``"length"`` | ``"cache"`` per prompt.
      stats: the call's ``Stats``.
      texts: the decoded tokens when the target has a tokenizer, else None.
    """

    tokens: list[list[int]]
    logprobs: list[np.ndarray]
    finish_reasons: list[str]
    stats: Stats
    texts: list[str] | None = None


@dataclasses.dataclass(frozen=True)
class StreamStep:
    """Newly verified tokens per prompt after one round (empty lists for rows with nothing new).

    Attributes:
      tokens: new ids per prompt.
      texts: with a tokenizer, the new text per prompt (held back while it ends in an incomplete UTF-8
        sequence); else None.
    """

    tokens: list[list[int]]
    texts: list[str] | None = None


def decode(tokenizer, ids: list[int]) -> str:
    """Text of ``ids``, special tokens skipped (how ``texts`` are made)."""
    return tokenizer.decode(ids, skip_special_tokens=True)


def build_result(
    state: loop.State,
    *,
    num_rows: int,
    gamma: int,
    cache_len: int,
    tokenizer,
    policy: dict | None,
    wall_time_s: float,
    compile_time_s: float,
    model_names: tuple[str, str],
    automata: tuple | None = None,
) -> GenerationResult:
    """The ``GenerationResult`` of the loop's final ``state`` (rows past ``num_rows`` are batch padding, dropped).

    ``gamma`` and ``cache_len`` are the compiled loop's, ``policy`` goes to ``Stats.policy``, ``model_names``
    (target, draft) name the culprit in the error. Raises ``NonFiniteLogitsError`` (result attached) if a model
    produced non-finite logits for some row. ``automata``: the rows' compiled constraints (``RowStats.complete``).
    """
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
            state.forced,
            None if state.grammar is None else state.grammar.state,
        )
    )
    tokens, logprobs, length, plen, finish, rounds, drafted, accepted, hist, bad_t, bad_d, forced, where = host
    n = num_rows

    def complete(b: int) -> bool | None:
        automaton = None if automata is None else automata[b]
        return None if automaton is None else bool(automaton.final[int(where[b])])

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
                forced_tokens=int(forced[b]),
                finish_reason=reasons[-1],
                complete=complete(b),
            )
        )
    stats = Stats(
        mode="speculative" if gamma else "plain",
        gamma=gamma,
        batch_size=n,
        compiled_batch_size=int(tokens.shape[0]),
        cache_length=cache_len,
        generated_tokens=sum(r.generated_tokens for r in row_stats),
        rounds=sum(r.rounds for r in row_stats),
        drafted=sum(r.drafted for r in row_stats),
        accepted=sum(r.accepted for r in row_stats),
        accept_hist=tuple(int(x) for x in hist[:n].sum(axis=0)),
        forced_tokens=sum(r.forced_tokens for r in row_stats),
        wall_time_s=wall_time_s,
        compile_time_s=compile_time_s,
        rows=tuple(row_stats),
        policy=policy,
    )
    texts = None if tokenizer is None else [decode(tokenizer, t) for t in out_tokens]
    result = GenerationResult(out_tokens, out_lp, reasons, stats, texts)
    for flags, who in ((bad_t[:n], model_names[0]), (bad_d[:n], model_names[1])):
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
