"""Benchmark: plain vs speculative decoding at batch 1, measured against the analytic speedup bounds.

    python -m jaxspec.bench                         # both pairs, greedy and temperature 1, γ=4
    python -m jaxspec.bench --pair aligned --gamma 4 --max-new-tokens 128 --repeats 3 --json out.json
    python -m jaxspec.bench --quick                 # the same pipeline on tiny models (smoke run, < 1 min)

For each (target, draft) pair it reports:

  * tokens/s of plain decoding (``draft=None``) and of speculative decoding, via ``jaxspec.generate`` after a
    warm-up call (compile excluded); speedup = spec tokens/s ÷ plain tokens/s (median over interleaved runs);
  * α (acceptance rate) and τ (tokens per target pass) from ``result.stats``;
  * c = draft step time ÷ target step time and v = target verify time over γ+1 tokens ÷ target step time, each
    timed as a jitted ``apply_fn(params, tokens[1, T], positions[1, T], cache)`` (cache donated and threaded, as
    inside the loop) at the cache length the generation uses; medians of many interleaved calls;
  * bound A (the issue's):      (1 − α^(γ+1)) / ((1 − α)(γc + 1))
    bound B (CPU-aware):        (1 − α^(γ+1)) / ((1 − α)(γc + v))
    (the numerator is written Σ_{i=0..γ} α^i, so α = 0 and α = 1 need no special case), and
    efficiency = measured speedup ÷ bound, for both bounds. A third reference, "ideal@τ", replaces the
    α-formula by the measured τ and the round by its measured model time (one 2-token + (γ−1) 1-token draft
    steps + one verify pass): its efficiency isolates per-round engine overhead;
  * where the time goes: measured round time (wall minus prefill, ÷ rounds) against the model time of a round
    from the standalone calls (residual = engine overhead + dispatch differences), and, for the first pair, an
    in-loop breakdown: ms per round with a ~zero-cost "null" model swapped into the target and/or draft seat
    (engine alone, verify alone, draft phase alone), each as the slope of wall time over rounds;
  * compile time of ``jaxspec.loop.generate_program`` (explicit ``.lower()`` + ``.compile()``, and what the
    first, cold ``generate()`` call reports as ``stats.compile_time_s``);
  * memory: weight bytes, KV-cache bytes (``jax.eval_shape`` of ``init_cache``), the compiled program's
    ``memory_analysis()``, process peak RSS and, on GPU/TPU, the device's peak ``memory_stats()``.

The pairs (random weights; the efficiency measures engine overhead whatever α is):

  * ``random``: a target and a draft with independent random weights. Greedy α ≈ 0 (the bound is then < 1);
    at temperature 1 both models are close to uniform over the vocabulary, so α is moderate (~0.5).
  * ``aligned``: built so that the draft agrees with the target most of the time, honestly: the target's
    residual-branch outputs (every layer's ``o_proj`` and ``down_proj``) are multiplied by
    ``--residual-scale``, so its logits are dominated by the context-free path
    embed → final_norm → lm_head; the draft (one cheap layer, its residual outputs scaled the same way) uses
    the target's own ``embed``, ``final_norm`` and ``lm_head`` arrays. The layers still perturb the logits
    in a context-dependent way, so the draft is right often but not always (default scale 0.002: greedy
    α ≈ 0.8, temperature-1 α ≈ 0.97; larger scales lower α, e.g. 0.005 gives greedy α ≈ 0.65).

Both pairs use the same two architectures, so c and v are the same for both; only α differs. Default sizes
(float32): target 71 M parameters (hidden 512, 16 layers, MLP 2048, 8 heads / 4 KV heads, vocab 8192), a
memory-bound step; draft 9.5 M parameters (1 layer, 4 heads / 1 KV head of 64,
MLP 512, same hidden and vocab), c ≈ 0.06-0.07. The vocabulary is kept at 8192 because the draft must share the
target's [hidden, vocab] LM head, which dominates its step: with 32 k tokens c would be ~0.1 or more.
Everything here runs unchanged on any backend (CPU, GPU, TPU).

Layout (other modes, e.g. ``--mesh`` and ``--sweep``, are their own modules reusing the rest):

  * ``__main__``: flags, and dispatch to a mode's ``run(args)`` through ``MODES``;
  * ``single``: the default mode (every pair, one γ, then the breakdown and a summary);
  * ``pairs``: model configs and the ``random`` / ``aligned`` pairs (``build_pairs``);
  * ``compare``: plain vs speculative on one pair (``bench_pair``);
  * ``measure``: step, prefill, compile and memory measurements, ``generate`` runs, the in-loop breakdown;
  * ``bounds``: expected tokens per round, bounds A and B (pure functions);
  * ``report``: text tables and the JSON document;
  * ``continuous``: ``--continuous``, static batches (``generate`` calls of B prompts) against the continuous-batching
    engine (``jaxspec.Engine(slots=B)``) on one pool with mixed output lengths: plain, fixed γ, auto (and prompt
    lookup) per slot count, with straggler factor / occupancy, auto's first-call cost and the per-sync host overhead
    (``--pair shipped`` or ``smollm2``; ``--slots``, ``--pool``, ``--continuous-modes``, ``--auto-gammas``).
"""
