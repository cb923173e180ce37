"""Device benchmark: what a speculative round costs on an accelerator, at real model shapes with random weights
(a pass's cost does not depend on the weights' values; acceptance does, and is measured on the real models elsewhere).

    python scripts/studies/device_costs.py [OUT_DIR] [--shapes smollm2-135m,llama-3.1-8b] [--budget-s 330]

For each shape (bfloat16 weights and caches, float32 logits), at batch 1 and a cache of ``cache_len`` slots with the
new tokens at ``position``: the target's one-token step and its verify passes over 2..33 tokens (a chain's γ+1, a
tree's root and nodes; v = verify ÷ step),
and for an EAGLE-1-style head and an EAGLE-3 head (8191 or 32000 draft ids) the draft phase of a round of γ (the
window pass over γ+1 pairs, then γ−1 one-token steps), as c per draft token (÷ γ ÷ step). Calls are interleaved call
by call in blocks; figures are medians. Then whole ``jaxspec.generate`` loops (``--loop-modes``: plain, the
EAGLE-1 head at γ=2, the EAGLE-3 head at γ=3, the EAGLE-1 head's trees (5, 3, 6) and (6, 4, 10); α ≈ 0 with random
heads, so each pass yields one token) as ms per target pass, the loop's own overheads included; ``plain_pad`` and
``eagle3_pad`` run the target (and the head) with one-row weight products computed over two rows (``min_rows=2``),
``plain*2`` two copies of each row. First, a tree round's acceptance alone under each rule
(``--acceptance-trees``). Prints one JSON object per figure and appends each to ``OUT_DIR/device_costs.jsonl`` as it
goes (a timeout keeps what was measured). Stops starting new sections past ``--budget-s``.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

START = time.perf_counter()

SHAPES = {
    "tiny": dict(  # a smoke run anywhere
        vocab_size=1024,
        hidden_size=128,
        intermediate_size=256,
        num_layers=4,
        num_heads=2,
        num_kv_heads=1,
        rope_theta=10000.0,
        tie_embeddings=True,
        draft_vocab=255,
        cache_len=256,
        position=64,
    ),
    # SmolLM2-135M-Instruct's config (tied embeddings), and Llama-3.1-8B's
    "smollm2-135m": dict(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_layers=30,
        num_heads=9,
        num_kv_heads=3,
        rope_theta=100000.0,
        tie_embeddings=True,
        draft_vocab=8191,
        cache_len=1024,
        position=320,
    ),
    "llama-3.1-8b": dict(
        vocab_size=128256,
        hidden_size=4096,
        intermediate_size=14336,
        num_layers=32,
        num_heads=32,
        num_kv_heads=8,
        rope_theta=500000.0,
        tie_embeddings=False,
        draft_vocab=32000,
        cache_len=2048,
        position=640,
    ),
}
VERIFY_WIDTHS = (2, 3, 4, 5, 7, 12, 17, 25, 33)  # chains' γ+1, and trees' N+1 (root and nodes)
GAMMAS = (2, 3, 4, 6)


def emit(out, **rec):
    rec["t_s"] = round(time.perf_counter() - START, 1)
    line = json.dumps(rec)
    print(line, flush=True)
    if out:
        with open(os.path.join(out, "device_costs.jsonl"), "a") as f:
            f.write(line + "\n")


def build(name: str):
    from jaxspec.core.model import CausalLM
    from jaxspec.drafters.eagle import EagleDrafter, _head_fns
    from jaxspec.models import eagle as eagle_model
    from jaxspec.models import eagle3, llama
    from jaxspec.models.llama_config import LlamaConfig

    s = dict(SHAPES[name])
    draft_vocab, cache_len, position = s.pop("draft_vocab"), s.pop("cache_len"), s.pop("position")
    cfg = LlamaConfig(**s, head_dim=s["hidden_size"] // s["num_heads"], dtype="bfloat16")
    target = llama.init(cfg, seed=0, name=name)
    ids = tuple(range(draft_vocab))
    e1cfg = eagle_model.head_config(cfg, vocab_ids=ids)
    e1 = EagleDrafter.for_target(target, eagle_model.init_own(e1cfg, 1), config=e1cfg, name="eagle1")
    e3cfg = eagle3.head_config(cfg, ids)
    e3 = EagleDrafter.for_target(
        target, {k: v for k, v in eagle3.init_own(e3cfg, 2).items() if k != "lm_head"}, config=e3cfg, name="eagle3"
    )

    def fused_window(cfg3):  # the EAGLE-3 window pass reads the target's three tapped layers through fc
        head_apply, init_cache = _head_fns(cfg3)

        def apply_fn(params, tokens, positions, cache):
            feats = jnp.zeros((*tokens.shape, cfg3.feature_size), cfg3.jnp_dtype)
            logits, _, cache = head_apply(params, tokens, feats, positions, cache)
            return logits, cache

        return CausalLM(apply_fn, e3.params, init_cache, cfg3.vocab_size, config=cfg3, name="eagle3_window")

    return target, e1, e3, fused_window(e3cfg), cache_len, position


def step_costs(out, name: str, iters: int, blocks: int):
    from jaxspec.bench.measure import StepTimer

    t0 = time.perf_counter()
    target, e1, e3, e3_window, cache_len, position = build(name)
    cases = {"target_1": (target, 1)}
    cases.update({f"target_{w}": (target, w) for w in VERIFY_WIDTHS})
    for head, window in ((e1, e1.as_model()), (e3, e3_window)):
        cases[f"{head.name}_1"] = (head.as_model(), 1)
        cases.update({f"{head.name}_window_{g + 1}": (window, g + 1) for g in GAMMAS})
    timer = StepTimer(cases, cache_len, position, seed=0)
    emit(out, section="steps", shape=name, event="compiled", build_and_compile_s=round(time.perf_counter() - t0, 1))
    for _ in range(blocks):
        timer.block(iters)
    ms = {k: round(v * 1e3, 4) for k, v in timer.medians().items()}
    step = ms["target_1"]
    v = {w: round(ms[f"target_{w}"] / step, 3) for w in VERIFY_WIDTHS}  # by width (a chain's γ+1, a tree's N+1)
    c = {}
    for head in ("eagle1", "eagle3"):
        c[head] = {g: round((ms[f"{head}_window_{g + 1}"] + (g - 1) * ms[f"{head}_1"]) / g / step, 3) for g in GAMMAS}
    emit(
        out,
        section="steps",
        shape=name,
        batch=1,
        cache_len=cache_len,
        calls=timer.count(),
        ms=ms,
        v_by_width=v,
        c_by_gamma=c,
    )
    return target, e1, e3


QUANT_WIDTHS = (1, 3, 5, 9, 17)


def quant_costs(out, name: str, iters: int, blocks: int):
    """The target's one-token step and passes over 3..17 tokens in bfloat16 and each ``jaxspec.quantize`` format,
    interleaved; returns the int8 target (and its EAGLE-1 head) for the loops."""
    from jaxspec.bench.measure import StepTimer
    from jaxspec.drafters.eagle import EagleDrafter
    from jaxspec.models import quant

    t0 = time.perf_counter()
    target, e1, _, _, cache_len, position = build(name)
    models = {"bfloat16": target, **{fmt: quant.quantize(target, fmt) for fmt in quant.FORMATS}}
    cases = {f"{fmt}_{w}": (m, w) for fmt, m in models.items() for w in QUANT_WIDTHS}
    timer = StepTimer(cases, cache_len, position, seed=0)
    emit(out, section="quant", shape=name, event="compiled", build_and_compile_s=round(time.perf_counter() - t0, 1))
    for _ in range(blocks):
        timer.block(iters)
    ms = {k: round(v * 1e3, 4) for k, v in timer.medians().items()}
    emit(
        out,
        section="quant",
        shape=name,
        batch=1,
        cache_len=cache_len,
        calls=timer.count(),
        weight_bytes={fmt: m.param_bytes for fmt, m in models.items()},
        ms=ms,
        step_vs_bfloat16={fmt: round(ms[f"{fmt}_1"] / ms["bfloat16_1"], 3) for fmt in models},
        v_by_width={fmt: {w: round(ms[f"{fmt}_{w}"] / ms[f"{fmt}_1"], 3) for w in QUANT_WIDTHS[1:]} for fmt in models},
    )
    q = models["int8"].replace(name=f"{name}-int8")
    return q, EagleDrafter.for_target(q, {k: e1.params[k] for k in ("fc", "layers", "final_norm")}, config=e1.config)


def padded(target, e3):
    """``{"plain_pad": target, "eagle3_pad": head}`` with every weight product over one row computed over two
    (``LlamaConfig.min_rows``), the same weights."""
    from jaxspec.drafters.eagle import EagleDrafter
    from jaxspec.models import eagle3, families

    t = families.with_min_rows(target, 2).replace(name=f"{target.name}-pad")
    e3cfg = eagle3.head_config(t.config, e3.config.vocab_ids)
    head = EagleDrafter.for_target(t, {k: v for k, v in e3.params.items() if k in eagle3.OWN}, config=e3cfg)
    return {"plain_pad": None, "eagle3_pad": head, "_target_pad": t}


def loop_costs(out, target, e1, e3, repeats: int, new_tokens: int, batch: int, modes: list[str]):
    import jaxspec

    rng = np.random.default_rng(0)
    prompt = rng.integers(0, target.vocab_size, (batch, 64)).astype(np.int32)
    heads = {"plain": None, "eagle1": e1, "eagle3": e3}

    def setting(mode):  # HEAD@G: a chain of G; HEAD@D.B.W: a tree of depth D, branch B, width W; HEAD*R: R rows
        head, _, at = mode.partition("@")
        head, _, rows = head.partition("*")
        model = heads["_target_pad"] if head.endswith("_pad") else target
        g = None if not at else tuple(int(x) for x in at.split(".")) if "." in at else int(at)
        return model, heads[head], g, int(rows or 1)

    if any(m.partition("@")[0].partition("*")[0].endswith("_pad") for m in modes):
        heads.update(padded(target, e3))
    runs = {m: setting(m) for m in modes}
    kw = dict(max_new_tokens=new_tokens, temperature=0.0)

    def call(model, draft, g, rows, seed):  # rows > 1: the batch's prompts repeated, timed per pass all the same
        p = np.repeat(prompt, rows, axis=0)
        if draft is None:
            return jaxspec.generate(model, p, seed=seed, **kw)
        if isinstance(g, tuple):
            return jaxspec.generate(model, p, draft=draft, tree=g, seed=seed, **kw)
        return jaxspec.generate(model, p, draft=draft, gamma=g, seed=seed, **kw)

    t0 = time.perf_counter()
    for setting_ in runs.values():  # compile
        call(*setting_, 0)
    emit(
        out,
        section="loop",
        shape=target.name,
        batch=batch,
        event="compiled",
        compile_s=round(time.perf_counter() - t0, 1),
    )
    per_pass = {m: [] for m in runs}
    tau = {}
    for r in range(repeats):
        for mode, setting_ in runs.items():
            st = call(*setting_, r).stats
            per_pass[mode].append(st.wall_time_s / st.target_passes * 1e3)
            tau[mode] = round(st.generated_tokens / st.rounds, 3)
    ms = {m: round(statistics.median(v), 4) for m, v in per_pass.items()}
    emit(
        out,
        section="loop",
        shape=target.name,
        batch=batch,
        new_tokens=new_tokens,
        repeats=repeats,
        ms_per_target_pass=ms,
        tau_random_heads=tau,
        round_over_plain_step={m: round(ms[m] / ms["plain"], 3) for m in ms},
    )


def tree_of(depth: int, branch: int, width: int):
    """``(parent, rank)`` of a full tree of that shape: level 1 the root's ``branch`` children, each further level
    ``width`` nodes, ``branch`` children to each of the level above's first nodes."""
    nodes = branch + (depth - 1) * width
    parent, rank = np.full(nodes + 1, -1, np.int32), np.zeros(nodes + 1, np.int32)
    parent[1 : branch + 1], rank[1 : branch + 1] = 0, np.arange(branch)
    above, at = list(range(1, branch + 1)), branch + 1
    for _ in range(depth - 1):
        level = list(range(at, at + width))
        for i, node in enumerate(level):
            parent[node], rank[node] = above[(i // branch) % len(above)], i % branch
        above, at = level, at + width
    return parent, rank


def acceptance_costs(out, trees: list[str], vocab: int, iters: int):
    """A tree round's acceptance alone, each rule (recursive rejection sampling; traversal verification, whose walk
    is a while loop over up to twice the nodes), batch 1, over ``vocab`` ids: ms per round, median of ``iters``.
    The target's p is the drafter's q with noise, so rounds accept some paths and give up others."""
    from jaxspec.core import tree_acceptance

    rules = {"recursive": tree_acceptance.accept_tree, "traversal": tree_acceptance.traverse_tree}
    for shape in trees:
        depth, branch, width = (int(x) for x in shape.split("."))
        parent, rank = (jnp.asarray(x)[None] for x in tree_of(depth, branch, width))
        nodes = parent.shape[1]
        k_logits, k_noise, k_tok = jax.random.split(jax.random.key(0), 3)
        logits = 3.0 * jax.random.normal(k_logits, (1, nodes, vocab), jnp.float32)
        q = jax.nn.softmax(logits, -1)
        p = jax.nn.softmax(logits + jax.random.normal(k_noise, logits.shape, jnp.float32), -1)
        token = jax.random.categorical(k_tok, logits).astype(jnp.int32)  # each node's token from its parent's q
        token = jnp.take_along_axis(token, jnp.maximum(parent, 0), axis=1)
        for name, rule in rules.items():
            fn = jax.jit(functools.partial(rule, depth=depth, branch=branch))
            keys = jax.random.split(jax.random.key(1), iters + 1)[:, None]
            t = time.perf_counter()
            jax.block_until_ready(fn(keys[0], parent, token, rank, q, p))
            compile_s = time.perf_counter() - t
            times = []
            for k in keys[1:]:
                t = time.perf_counter()
                jax.block_until_ready(fn(k, parent, token, rank, q, p))
                times.append(time.perf_counter() - t)
            emit(
                out,
                section="acceptance",
                tree=shape,
                vocab=vocab,
                rule=name,
                ms=round(1000 * statistics.median(times), 3),
                compile_s=round(compile_s, 2),
            )


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", nargs="?", default=os.environ.get("OUT", ""))
    p.add_argument("--shapes", default="smollm2-135m,llama-3.1-8b", help="shapes whose steps are timed")
    p.add_argument("--loop-shapes", default="smollm2-135m", help="shapes whose whole loops are timed")
    p.add_argument("--loop-batches", default="1")
    p.add_argument(
        "--loop-modes",
        default="plain,eagle1@2,eagle3@3,eagle1@5.3.6,eagle1@6.4.10",
        help="plain, HEAD@GAMMA (a chain) and HEAD@D.B.W (a tree: depth, branch, width), HEAD eagle1, eagle3, "
        "plain_pad or eagle3_pad (the target and head with one-row products over two rows); HEAD*R runs R copies "
        "of each row (plain*2: does a pass over two rows cost less than over one?)",
    )
    p.add_argument("--quant-shapes", default="", help="shapes whose bfloat16, int8 and w8a8 steps are timed")
    p.add_argument("--quant-loops", default="plain,eagle1@2", help="loop modes run over the int8 target")
    p.add_argument(
        "--acceptance-trees",
        default="10.4.16,6.4.10",
        help="tree shapes D.B.W whose acceptance alone is timed under each rule (SmolLM2's and Llama's vocabularies)",
    )
    p.add_argument("--budget-s", type=float, default=330.0)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--blocks", type=int, default=3)
    p.add_argument("--loop-repeats", type=int, default=5)
    p.add_argument("--new-tokens", type=int, default=128)
    a = p.parse_args(argv)
    if a.out:
        os.makedirs(a.out, exist_ok=True)
    emit(
        a.out,
        section="env",
        jax=jax.__version__,
        backend=jax.default_backend(),
        devices=[str(d) for d in jax.devices()],
        argv=sys.argv[1:],
    )
    if a.acceptance_trees:
        for vocab in (SHAPES["smollm2-135m"]["vocab_size"], SHAPES["llama-3.1-8b"]["vocab_size"]):
            try:
                acceptance_costs(a.out, a.acceptance_trees.split(","), vocab, a.iters)
            except Exception as e:
                emit(a.out, section="error", acceptance=vocab, error=f"{type(e).__name__}: {e}"[:2000])
    for name in [s for s in a.quant_shapes.split(",") if s]:
        if time.perf_counter() - START > a.budget_s:
            emit(a.out, section="skipped", shape=name, reason="budget")
            continue
        try:
            q, qe1 = quant_costs(a.out, name, a.iters, a.blocks)
            if a.quant_loops and time.perf_counter() - START < a.budget_s:
                loop_costs(a.out, q, qe1, None, a.loop_repeats, a.new_tokens, 1, a.quant_loops.split(","))
        except Exception as e:
            emit(a.out, section="error", shape=name, error=f"{type(e).__name__}: {e}"[:2000])
    step_shapes = [s for s in a.shapes.split(",") if s]
    loop_shapes = [s for s in a.loop_shapes.split(",") if s]
    for name in dict.fromkeys(step_shapes + loop_shapes):
        if time.perf_counter() - START > a.budget_s:
            emit(a.out, section="skipped", shape=name, reason="budget")
            continue
        try:
            models = step_costs(a.out, name, a.iters, a.blocks) if name in step_shapes else build(name)[:3]
        except Exception as e:  # keep the other sections' figures
            emit(a.out, section="error", shape=name, error=f"{type(e).__name__}: {e}"[:2000])
            continue
        if name not in loop_shapes:
            continue
        for batch in (int(b) for b in a.loop_batches.split(",")):
            if time.perf_counter() - START > a.budget_s:
                emit(a.out, section="skipped", shape=name, batch=batch, reason="budget")
                continue
            try:
                loop_costs(a.out, *models, a.loop_repeats, a.new_tokens, batch, a.loop_modes.split(","))
            except Exception as e:
                emit(a.out, section="error", shape=name, batch=batch, error=f"{type(e).__name__}: {e}"[:2000])
        del models


if __name__ == "__main__":
    main()
