"""``gamma="auto"`` inside an engine run: γ re-decided between decode calls, once the run has seen acceptance.

An ``Engine`` run decides γ when it starts (``choose_gamma``), and a policy that has never measured the pair's
acceptance then *probes*: the first wave of rows runs speculatively. ``Regamma.between``, which the engine calls
before each refill, feeds what the run has seen since the last call into the policy (the finished rows' accept
histograms, the decode calls' round time) and asks it again (``AutoGamma.decide(running=γ)``). When the answer is
another γ, the run's state is converted in one compiled program (``switch_program``: a new accept histogram, and for
plain decoding no drafter state) and decoding goes on with that γ's rounds program, compiled once per γ and reused
by later runs. A run that went plain stays plain: plain rounds measure no acceptance to re-decide from, and the
rows in flight have no drafter state (an EAGLE head's features, a draft model's cache) to speculate from.

A row's ``accept_hist`` counts its rounds at the γ it finished with (a change restarts the in-flight rows'
histograms, after the policy has counted them); its ``drafted`` and ``accepted`` count every round.
"""

from __future__ import annotations

import dataclasses
import time

import jax.numpy as jnp
import numpy as np

from jaxspec import loop
from jaxspec import policy as policy_lib
from jaxspec.generation import inputs as inputs_lib
from jaxspec.generation.generate import mesh_key
from jaxspec.generation.request import Request
from jaxspec.parallel import sharding


def _switch(spec: loop.LoopSpec, state: loop.State) -> loop.State:
    """``state`` as the loop of ``spec`` takes it: an empty accept histogram of ``spec.gamma + 1`` bins, and the
    drafter's state kept (it does not depend on γ) or, for plain decoding, none."""
    batch = state.tokens.shape[0]
    draft_state = state.draft_state if spec.gamma > 0 else spec.drafter.init_state(batch, spec.cache_len)
    hist = jnp.zeros((batch, spec.gamma + 1), jnp.int32)
    return loop.constrain_state(spec, dataclasses.replace(state, accept_hist=hist, draft_state=draft_state))


switch_program = loop.Program(_switch, donate_argnums=(1,))


def _counts(hist, gamma: int) -> tuple[int, int]:
    """(accepted, drafted) of an accept histogram of rounds at ``gamma`` drafts."""
    return int(sum(n * h for n, h in enumerate(hist))), int(gamma * sum(hist))


class Regamma:
    """The engine's hook for ``gamma="auto"`` (see the module docstring): ``between`` before each refill, ``close``
    when the run ends.

    Attributes:
      switches: one dict per change of γ: ``sync`` (decode calls before it), ``gamma``, ``reason``.
    """

    def __init__(self, request: Request, shape: inputs_lib.Buckets, decision, policy: policy_lib.AutoGamma | None):
        assert policy is not None  # choose_gamma returns it with the decision
        self.request, self.shape, self.policy = request, shape, policy
        self.decision = decision
        self.key = mesh_key(request.mesh, request.shard_draft)
        self.switches: list[dict] = []
        self._rows = 0  # finished rows already counted
        # batch width -> (decode seconds, rounds, its rounds program's compile seconds) when last counted
        self._decode: dict[int, tuple[float, int, float]] = {}
        self._seen = False  # whether this run has counted any acceptance

    def summary(self) -> dict:
        """``EngineStats.policy``: the run's first decision, with ``switches``."""
        return {**self.decision.as_dict(), "switches": list(self.switches)}

    def _count(self, run, rows_hist) -> None:
        """Feed the policy what the run saw since the last call: the rows finished since (at the running γ) and
        the decode calls' rounds at each batch width (not at a width whose rounds program was compiled among them: a
        program's first run pays one-time costs)."""
        request, stats, gamma = self.request, run.stats, run.spec.gamma
        new, self._rows = rows_hist[self._rows :], len(rows_hist)
        if gamma > 0 and new:
            hist = tuple(int(x) for x in np.sum(new, axis=0))
            self.policy.observe(request.target, request.drafter, request.greedy, *_counts(hist, gamma), hist)
            self._seen = True
        for width, seconds in list(run.decode_s.items()):  # each batch width the loop ran at since the last call
            ran = run.stats.widths.get(width, 0)
            compiled = stats.compiles.get(f"rounds[{width}]", 0.0)  # this width's rounds program: compile seconds
            before_s, before_rounds, before_compiled = self._decode.get(width, (0.0, 0, 0.0))
            self._decode[width] = (seconds, ran, compiled)
            if ran == before_rounds:
                continue
            self.policy.observe_call(
                request.target,
                request.drafter,
                width,
                stats.cache_length,
                gamma,
                rounds=(seconds - before_s, ran - before_rounds),
                fresh=compiled > before_compiled,
                mesh_key=self.key,
            )

    def between(self, run, state: loop.State, draft_params, rows_hist, width: int):
        """Before a refill of ``run`` (an ``EngineRun``; ``rows_hist``: the accept histograms of its finished rows
        so far; ``width``: the batch the loop goes on at): count what was seen, re-decide for that batch, and on a
        change of γ convert ``state`` and set ``run.spec``, ``run.drafter`` and ``run.stats`` (``gamma``,
        ``policy``). Returns ``(state, draft_params)`` for the loop to go on with. Its time (the policy's, the
        conversion's) counts in ``run.stats.wall_time_s``, compilation in ``compile_time_s``."""
        start, compiled = time.perf_counter(), run.stats.compile_time_s
        out = self._between(run, state, draft_params, rows_hist, width)
        run.stats.wall_time_s += time.perf_counter() - start - (run.stats.compile_time_s - compiled)
        return out

    def _between(self, run, state: loop.State, draft_params, rows_hist, width: int):
        self._count(run, rows_hist)
        spec, request = run.spec, self.request
        if spec.gamma == 0 or not self._seen:
            return state, draft_params
        decision = self.policy.decide(
            request.target,
            request.drafter,
            width,
            run.stats.cache_length,
            int(np.mean(request.max_new)),
            request.greedy,
            mesh_key=self.key,
            prompt_tokens=self.shape.prompt_len,
            running=spec.gamma,
        )
        if decision.gamma == spec.gamma:
            return state, draft_params
        # the rows in flight: their histograms at the old γ are counted now, as the new state starts them afresh
        hist, done = sharding.to_host((state.accept_hist, state.done))
        flight = tuple(int(x) for x in hist[~done].sum(axis=0))
        if sum(flight):
            self.policy.observe(request.target, request.drafter, request.greedy, *_counts(flight, spec.gamma), flight)
        new_spec = inputs_lib.loop_spec(request, spec.cache_len, decision.gamma)
        drafter = request.drafter if decision.gamma > 0 else None
        _, draft_params = inputs_lib.place_params(request.target, drafter, spec.mesh, request.shard_draft)
        state, compile_s = switch_program(new_spec, state)
        run.stats.compile_time_s += compile_s
        run.spec, run.drafter = new_spec, drafter
        self.switches.append({"sync": run.stats.syncs, "gamma": decision.gamma, "reason": decision.reason})
        run.stats.gamma, run.stats.policy = decision.gamma, self.summary()
        return state, draft_params

    def close(self, run, rows_hist) -> None:
        """At the end of ``run``: count what the last decode calls saw."""
        self._count(run, rows_hist)
