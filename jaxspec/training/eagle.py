"""Training an EAGLE head (``jaxspec.eagle``) offline, on the target's stored outputs.

    jaxspec distill --target smollm2-135m-instruct --data runs/smol/train_data.jsonl --out runs/eagle \\
        --new-draft eagle=1,vocab=8191 --steps 2000 --batch-size 8 --learning-rate 1e-3 \\
        --save-draft my-head

Two stages, both resumable from ``out_dir``:
  1. ``extract_features``: the target's final-norm hidden states at every position of every record (prompt and
     output), one forward pass per batch of records of similar length, stored as float16 in
     ``out_dir/features.npy`` (with ``features_offsets.npy``: record ``i`` owns rows ``offsets[i]:offsets[i+1]``).
     Done once; a later run over the same records reuses them.
  2. ``train_head``: windows of ``window + 1`` tokens (and their features) drawn as a pure function of
     (seed, step). Pass 1 reads the real pairs ``(f_j, token j+1)`` and predicts ``f_{j+1}``; pass 2 reads the
     head's own predictions ``(f̂_{j+1}, token j+2)``, as the second draft step does at inference. Loss: the
     cross-entropy of both passes' draft distributions against the target's distribution at the next position
     (restricted to the draft vocabulary and renormalised there; weights 1 and 0.7) plus 0.1 × a Huber loss
     between ``f̂_{j+1}`` and ``f_{j+1}``. The target's embedding and LM head stay frozen (they are not part of
     the head). AdamW (``training.make_optimizer``), orbax checkpoints every ``checkpoint_every`` steps.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from tqdm.auto import tqdm

from jaxspec.core.model import CausalLM
from jaxspec.drafters import eagle
from jaxspec.models import eagle as eagle_model
from jaxspec.models import families, llama
from jaxspec.training.common import LOG_FILE, Checkpoints, append_jsonl, due, make_optimizer
from jaxspec.training.offline import choose_vocab, read_data

PASS2_WEIGHT, FEATURE_WEIGHT = 0.7, 0.1
FEATURES, OFFSETS = "features.npy", "features_offsets.npy"


def _offsets(records) -> np.ndarray:
    return np.concatenate([[0], np.cumsum([len(p) + len(o) for p, o in records])]).astype(np.int64)


def extract_features(target: CausalLM, records, out_dir, *, batch_size: int = 8, progress: bool = True):
    """``(features [N, hidden] float16 memmap, offsets [R+1])`` of ``records`` under ``target`` (module
    docstring); reuses ``out_dir``'s files when they were made for the same records (same offsets)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    offsets = _offsets(records)
    hidden = target.config.hidden_size
    done_mark = out_dir / (FEATURES + ".done")
    if done_mark.is_file() and (out_dir / OFFSETS).is_file():
        if np.array_equal(np.load(out_dir / OFFSETS), offsets):
            return np.load(out_dir / FEATURES, mmap_mode="r"), offsets
    feats = np.lib.format.open_memmap(out_dir / FEATURES, mode="w+", dtype=np.float16, shape=(int(offsets[-1]), hidden))
    apply = llama.features_fn(target.config)
    init_cache = target.init_cache

    @jax.jit
    def forward(params, tokens):
        positions = jnp.broadcast_to(jnp.arange(tokens.shape[1], dtype=jnp.int32), tokens.shape)
        _, x, _ = apply(params, tokens, positions, init_cache(*tokens.shape))
        return x.astype(jnp.float16)

    order = sorted(range(len(records)), key=lambda i: offsets[i + 1] - offsets[i])
    with tqdm(total=int(offsets[-1]), disable=not progress, desc="target features", unit="tok") as bar:
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            seqs = [records[i][0] + records[i][1] for i in chunk]
            length = -(-max(map(len, seqs)) // 64) * 64  # few distinct shapes: few compiles
            tokens = np.zeros((batch_size, length), np.int32)
            for b, s in enumerate(seqs):
                tokens[b, : len(s)] = s
            x = np.asarray(forward(target.params, jnp.asarray(tokens)))
            for b, i in enumerate(chunk):
                feats[offsets[i] : offsets[i + 1]] = x[b, : len(seqs[b])]
            bar.update(sum(map(len, seqs)))
    feats.flush()
    np.save(out_dir / OFFSETS, offsets)
    done_mark.write_text("ok\n")
    return np.load(out_dir / FEATURES, mmap_mode="r"), offsets


def batch_at(records, feats, offsets, step: int, *, seed: int, batch_size: int, window: int):
    """``(tokens [B, W+1] int32, feats [B, W+1, hidden] float32, positions [B, W+1] int32, mask [B, W+1])`` for
    ``step``, a pure function of (seed, step): ``batch_size`` records drawn at random, each cut to a random window
    of ``W + 1 = window + 1`` tokens at its true positions (shorter records padded, mask 0)."""
    rng = np.random.default_rng([seed, step])
    width = window + 1
    tokens = np.zeros((batch_size, width), np.int32)
    out = np.zeros((batch_size, width, feats.shape[1]), np.float32)
    positions = np.zeros((batch_size, width), np.int32)
    mask = np.zeros((batch_size, width), np.float32)
    for b, i in enumerate(rng.integers(len(records), size=batch_size)):
        seq = records[i][0] + records[i][1]
        start = int(rng.integers(len(seq) - width + 1)) if len(seq) > width else 0
        n = min(len(seq) - start, width)
        tokens[b, :n] = seq[start : start + n]
        out[b, :n] = feats[offsets[i] + start : offsets[i] + start + n]
        positions[b] = np.arange(start, start + width)
        mask[b, :n] = 1.0
    return tokens, out, positions, mask


@functools.cache
def train_step_fn(cfg: llama.LlamaConfig, cache_len: int):
    """Jitted ``(own, opt_state, shared, tokens, feats, positions, mask, schedule) -> (own, opt_state, loss)``:
    one optimizer step on the loss of the module docstring (``schedule = [learning_rate, warmup, steps]``)."""
    apply_fn, init_cache = eagle_model.head_fns(cfg)

    def loss_fn(own, shared, tokens, feats, positions, mask):
        params = {**own, **shared}
        head = shared["head"][:, :-1]  # the draft vocabulary's columns (the last is the masked extra row)
        cache = init_cache(tokens.shape[0], cache_len)
        _, f1, _ = apply_fn(params, tokens[:, 1:-1], feats[:, :-2], positions[:, :-2], cache, False)
        _, f2, _ = apply_fn(params, tokens[:, 2:], f1, positions[:, 1:-1], cache, False)

        def xent(pred, real, m):
            target = jax.nn.softmax(jnp.einsum("btd,dv->btv", real, head, preferred_element_type=jnp.float32), -1)
            logq = jax.nn.log_softmax(jnp.einsum("btd,dv->btv", pred, head, preferred_element_type=jnp.float32), -1)
            return jnp.sum(-jnp.sum(jax.lax.stop_gradient(target) * logq, -1) * m) / jnp.maximum(jnp.sum(m), 1.0)

        m1, m2 = mask[:, 1:-1], mask[:, 2:]
        huber = jnp.mean(optax.huber_loss(f1.astype(jnp.float32), feats[:, 1:-1]), -1)
        feature = jnp.sum(huber * m1) / jnp.maximum(jnp.sum(m1), 1.0)
        return xent(f1, feats[:, 1:-1], m1) + PASS2_WEIGHT * xent(f2, feats[:, 2:], m2) + FEATURE_WEIGHT * feature

    @jax.jit
    def step(own, opt_state, shared, tokens, feats, positions, mask, schedule):
        optimizer = make_optimizer(*schedule)
        loss, grads = jax.value_and_grad(loss_fn)(own, shared, tokens, feats, positions, mask)
        updates, opt_state = optimizer.update(grads, opt_state, own)
        return optax.apply_updates(own, updates), opt_state, loss

    return step


SCALES = (0.5, 0.6, 0.7, 0.75, 0.8, 0.9, 1.0, 1.1, 1.25)  # tune_temperature_scale's default grid


@functools.cache
def _agreement_fn(target_cfg: llama.LlamaConfig, cfg: llama.LlamaConfig, scales: tuple):
    apply_target = llama.features_fn(target_cfg)
    apply_head, init_head = eagle_model.head_fns(cfg)
    _, init_target = llama.model_fns(target_cfg)
    ids = jnp.asarray(cfg.vocab_ids if cfg.vocab_ids else np.arange(cfg.vocab_size), jnp.int32)

    @jax.jit
    def hits(target_params, params, tokens, start, stop):
        batch, width = tokens.shape
        positions = jnp.broadcast_to(jnp.arange(width, dtype=jnp.int32), tokens.shape)
        logits, feats, _ = apply_target(target_params, tokens, positions, init_target(batch, width))
        want = jnp.argmax(logits, -1)  # [B, T]: the target's prediction of token i + 1
        p = jax.nn.softmax(logits.astype(jnp.float32), -1)[..., ids]  # at temperature 1, on the draft vocabulary
        cache = init_head(batch, width)

        # step 1 at i: (f_i, token i+1) -> f^_{i+1}, drafting token i+2; step 2: (f^_{i+1}, token i+2) -> token i+3
        _, f1, _ = apply_head(params, tokens[:, 1:], feats[:, :-1], positions[:, :-1], cache, False)
        _, f2, _ = apply_head(params, tokens[:, 2:], f1[:, :-1], positions[:, 1:-1], cache, False)
        counts, accepts = [], []
        for k, pred in ((2, f1), (3, f2)):
            drafted_at = jnp.arange(pred.shape[1]) + k  # the token each position drafts
            inside = (drafted_at >= start[:, None]) & (drafted_at < stop[:, None])
            # the head's logits over its own vocabulary (the masked extra row left out)
            rows = jnp.einsum(
                "btd,dv->btv", pred, params["head"][:, : ids.shape[0]], preferred_element_type=jnp.float32
            )
            same = ids[jnp.argmax(rows, -1)] == want[:, k - 1 :]
            counts += [jnp.sum(same & inside), jnp.sum(inside)]
            for scale in scales:  # P(accept) of a draft from q: sum_v min(p_v, q_v)
                accept = jnp.sum(jnp.minimum(p[:, k - 1 :], jax.nn.softmax(rows / scale, -1)), -1)
                accepts.append(jnp.sum(jnp.where(inside, accept, 0.0)))
        return jnp.stack(counts), jnp.stack(accepts).reshape(2, len(scales))

    return hits


def _measure(target: CausalLM, head, data, batch_size: int, scales: tuple | None = None):
    """Counts ``[hits 1, drafted 1, hits 2, drafted 2]`` and mean acceptance ``[2, len(scales)]`` (steps 1 and 2;
    ``scales`` default: the head's own)."""
    if not isinstance(head, eagle.EagleDrafter):
        raise ValueError(f"head must be an EagleDrafter (jaxspec.eagle.load), got {type(head).__name__}")
    if head.target_config != target.config:
        raise ValueError(f"head: the EAGLE head {head.name!r} was made for another target than {target.name!r}")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
    records = read_data(data) if isinstance(data, (str, Path)) else list(data)
    hits = _agreement_fn(target.config, head.config, scales or (head.temperature_scale,))
    order = sorted(range(len(records)), key=lambda i: len(records[i][0]) + len(records[i][1]))
    total = np.zeros(4, np.int64)
    accepted: float | np.ndarray = 0.0
    for first in range(0, len(order), batch_size):
        chunk = [records[i] for i in order[first : first + batch_size]]
        width = -(-max(len(p) + len(o) for p, o in chunk) // 64) * 64  # few distinct shapes: few compiles
        tokens = np.zeros((batch_size, width), np.int32)
        start, stop = np.zeros(batch_size, np.int32), np.zeros(batch_size, np.int32)
        for b, (prompt, output) in enumerate(chunk):
            tokens[b, : len(prompt) + len(output)] = prompt + output
            start[b], stop[b] = len(prompt), len(prompt) + len(output)
        counts, accepts = hits(target.params, head.params, tokens, start, stop)
        total += np.asarray(counts)
        accepted = accepted + np.asarray(accepts, np.float64)
    return total, accepted / np.maximum(total[[1, 3]], 1)[:, None]


def agreement(target: CausalLM, head: eagle.EagleDrafter, data, *, batch_size: int = 4) -> dict:
    """Teacher-forced top-1 agreement of ``head`` with ``target`` on the outputs of ``data`` (a JSONL path or
    ``read_data``'s list): ``{"step1", "step2", "tokens", "accept1", "accept2"}``. Step 1 reads the target's real
    feature ``f_i`` with token ``i+1`` and drafts token ``i+2``; step 2 reads the head's own predicted feature with
    token ``i+2`` and drafts token ``i+3``, as the first two draft steps do in a round (the second attending to
    its own pass, as in training). A draft counts as agreeing when it is the target's own top-1 at that position;
    only drafted tokens inside the output count. ``accept1`` / ``accept2``: the mean probability that a draft
    sampled at temperature 1 is accepted there, ``sum_v min(p_v, q_v)`` (p the target's softmax, q the head's at
    its ``temperature_scale``). Held-out measures for choosing a head without decoding (greedy α follows the
    agreement, temperature-1 α the acceptance: docs/history/humaneval.md)."""
    total, accept = _measure(target, head, data, batch_size)
    return {
        "step1": total[0] / max(total[1], 1),
        "step2": total[2] / max(total[3], 1),
        "tokens": int(total[1]),
        "accept1": float(accept[0, 0]),
        "accept2": float(accept[1, 0]),
    }


def check_scales(scales) -> tuple[float, ...]:
    """``scales`` as floats, or ``ValueError`` naming ``scales`` unless it holds finite numbers > 0, at least one."""
    try:
        grid = tuple(float(s) for s in scales)
    except (TypeError, ValueError):
        raise ValueError(f"scales must be a sequence of numbers, got {scales!r}") from None
    if not grid or not all(0 < s < float("inf") for s in grid):
        raise ValueError(f"scales must be finite numbers > 0, at least one, got {scales!r}")
    return grid


def tune_temperature_scale(
    target: CausalLM, head: eagle.EagleDrafter, data, *, scales=SCALES, batch_size: int = 4
) -> tuple[float, dict]:
    """The ``temperature_scale`` among ``scales`` under which ``head``'s drafts at temperature 1 are accepted
    most on ``data``'s outputs (teacher-forced, as in ``agreement``; best: the most accepted drafts of a
    two-draft round, ``a1 + a1 * a2``), and ``{scale: (accept1, accept2)}`` for every scale. Records sampled from
    the target at temperature 1 (``scripts/data/generate_distill_data.py --temperature 1``) match how the scale is used.
    Set it with ``dataclasses.replace(head, temperature_scale=best)``; ``jaxspec.eagle.save`` keeps it."""
    scales = check_scales(scales)
    _, accept = _measure(target, head, data, batch_size, scales)
    table = {s: (float(accept[0, i]), float(accept[1, i])) for i, s in enumerate(scales)}
    best = max(scales, key=lambda s: table[s][0] * (1 + table[s][1]))
    return best, table


def train_head(
    target: CausalLM,
    data,
    *,
    out_dir,
    num_layers: int | None = None,
    vocab: int | None = None,
    init: eagle.EagleDrafter | None = None,
    steps: int = 1000,
    batch_size: int = 8,
    window: int = 256,
    learning_rate: float = 1e-3,
    warmup: int | None = None,
    seed: int = 0,
    checkpoint_every: int = 100,
    log_every: int = 25,
    progress: bool = True,
    name: str | None = None,
) -> tuple[eagle.EagleDrafter, list]:
    """Train a new ``num_layers``-layer head (default 1) for ``target`` on ``data`` (a JSONL path or
    ``read_data``'s list), restricted to the ``vocab`` ids most frequent in it (plus the EOS ids; None: the full
    vocabulary), or go on training the head ``init`` (e.g. a shipped head, tuned on your own workload's data; its
    layers, vocabulary and ``temperature_scale`` stay, so ``num_layers`` and ``vocab`` must not be given); resumes
    from ``out_dir``. Returns the ``EagleDrafter`` and this call's log records (also appended to
    ``out_dir/distill_log.jsonl``). A new head drafts at scale 1: ``tune_temperature_scale`` picks one."""
    records = read_data(data) if isinstance(data, (str, Path)) else list(data)
    if init is not None:
        if not isinstance(init, eagle.EagleDrafter):
            raise ValueError(f"init must be an EagleDrafter (jaxspec.eagle.load), got {type(init).__name__}")
        if num_layers is not None or vocab is not None:
            raise ValueError("init: the head keeps its own layers and vocabulary; do not give num_layers or vocab")
        if init.target_config != target.config:
            raise ValueError(f"init: the EAGLE head {init.name!r} was made for another target than {target.name!r}")
    num_layers = 1 if num_layers is None else num_layers
    for key, value in (("steps", steps), ("batch_size", batch_size), ("window", window), ("num_layers", num_layers)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{key} must be an int >= 1, got {value!r}")
    if not learning_rate > 0:
        raise ValueError(f"learning_rate must be > 0, got {learning_rate!r}")
    if any(t < 0 or t >= target.vocab_size for p, o in records for t in p + o):
        raise ValueError(f"data has token ids outside the target's vocabulary [0, {target.vocab_size})")
    vocab_ids: tuple[int, ...] = ()
    if vocab:
        eos = target.eos_token_id
        always = () if eos is None else [eos] if isinstance(eos, int) else eos
        vocab_ids = choose_vocab(records, vocab, vocab_size=target.vocab_size, always=always)
    cfg: llama.LlamaConfig
    if init is not None:
        if not isinstance(init.config, llama.LlamaConfig):  # an EAGLE-3 head
            raise ValueError(f"init: {init.name!r} is an EAGLE-3 head: train it with jaxspec.training.eagle3")
        cfg = init.config
    else:
        cfg = eagle_model.head_config(target.config, num_layers=num_layers, vocab_ids=vocab_ids)
    out_dir = Path(out_dir).resolve()
    feats, offsets = extract_features(target, records, out_dir, progress=progress)
    longest = int(np.max(np.diff(offsets)))
    step_fn = train_step_fn(cfg, max(longest, window + 1) + 1)
    shared = eagle_model.shared_params(cfg, target.params)
    schedule = jnp.asarray([learning_rate, steps // 20 if warmup is None else warmup, steps], jnp.float32)
    if init is not None:
        own = families.stack_layers({k: init.params[k] for k in eagle_model.OWN})
        own = jax.tree.map(lambda x: jnp.asarray(x, cfg.jnp_dtype), own)
    else:
        own = eagle_model.init_own(cfg, seed)
    state = {"params": own, "opt_state": make_optimizer(*schedule).init(own), "loss": jnp.float32(jnp.nan)}
    log = []
    with (
        Checkpoints(out_dir / "checkpoints") as checkpoints,
        tqdm(total=steps, disable=not progress, desc="EAGLE head") as bar,
    ):
        state, start = checkpoints.restore(state, name="out_dir", what="this head")
        bar.update(min(start, steps))
        own, opt_state, last = state["params"], state["opt_state"], state["loss"]
        seen, t0 = 0, time.perf_counter()
        for step in range(start, steps):
            batch = batch_at(records, feats, offsets, step, seed=seed, batch_size=batch_size, window=window)
            own, opt_state, last = step_fn(own, opt_state, shared, *batch, schedule)
            seen += int(batch[3].sum())
            done = step + 1
            if due(done, checkpoint_every, steps):
                checkpoints.save(done, {"params": own, "opt_state": opt_state, "loss": last})
            bar.update(1)
            if due(done, log_every, steps):
                record: dict[str, Any] = {"step": done, "loss": float(last), "tok_s": seen / (time.perf_counter() - t0)}
                record["loss_kind"] = "eagle"
                bar.set_postfix(loss=f"{record['loss']:.4f}")
                log.append(record)
                append_jsonl(out_dir / LOG_FILE, record)
    name = name or (init.name if init is not None else "eagle")
    scale = 1.0 if init is None else init.temperature_scale  # kept from the head trained on (tune it again)
    head = eagle.EagleDrafter.for_target(target, own, config=cfg, name=name, temperature_scale=scale)
    return dataclasses.replace(head, tree_temperature_scale=None if init is None else init.tree_temperature_scale), log
