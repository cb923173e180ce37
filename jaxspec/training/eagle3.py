"""Training an EAGLE-3 head (``jaxspec.models.eagle3``) offline with *training-time test*: the head unrolled for
``steps`` draft steps on its own outputs, as it drafts.

    jaxspec distill --target smollm2-135m-instruct --data train.jsonl --out runs/eagle3 \\
        --new-draft eagle3=4,vocab=8191 --steps 2000 --batch-size 8 --window 256 --save-draft smollm2-eagle3

Two stages, both resumable from ``out_dir``:
  1. ``extract_features``: per position of every record (prompt and output), the target's hidden states entering
     the head's ``aux_layers`` and its final-norm hidden state, one forward pass per batch of records of similar
     length, stored as float16 in ``out_dir/features3.npy`` (``[tokens, (len(aux) + 1) × hidden]``; record ``i``
     owns rows ``offsets[i]:offsets[i+1]`` of ``features3_offsets.npy``). Done once per records and aux layers.
  2. ``train_head``: windows of ``window + 1`` tokens drawn as a pure function of (seed, step). Step 1 reads at
     every position ``i`` the fused target features with token ``i+1`` and predicts token ``i+2``; step ``k`` reads
     the head's own output of step ``k-1`` with token ``i+k`` at position ``i+k-1`` and predicts token ``i+k+1``
     (``ttt_logits``). Its attention sees what drafting shows it: step 1's keys (from real features) up to
     position ``i``, and its own chain's keys of steps 2..k. Loss: the cross-entropy of each step's draft
     distribution against the target's distribution at that position (its final-norm state through its LM head,
     restricted to the draft vocabulary and renormalised), step ``k`` weighted ``STEP_DECAY ** (k-1)``; or, with
     ``loss="tvd"`` (``"rkl"``), the total variation (reverse KL) between the two distributions at temperature 1:
     one minus the total variation is a sampled draft's acceptance, what temperature-1 decoding gains from. The
     target's embedding stays frozen; the head's own LM head starts as the target's draft-vocabulary columns and
     is trained. AdamW (``training.make_optimizer``), orbax checkpoints every ``checkpoint_every`` steps.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from tqdm.auto import tqdm

from jaxspec.core.model import CausalLM
from jaxspec.core.tree_acceptance import accept_tree_row, draw_children
from jaxspec.drafters import eagle
from jaxspec.models import eagle3, llama, quant
from jaxspec.training.common import LOG_FILE, Checkpoints, append_jsonl, due, make_optimizer
from jaxspec.training.eagle import batch_at, check_scales
from jaxspec.training.losses import LOSSES, divergence
from jaxspec.training.offline import choose_vocab, read_data

STEP_DECAY = 0.8  # step k's loss weight is STEP_DECAY ** (k - 1): later steps matter less (fewer rounds reach them)
FEATURES, OFFSETS, ARGMAX = "features3.npy", "features3_offsets.npy", "features3_argmax.npy"
PROGRESS = "features3.progress.json"  # how many batches a pass flushed, so a killed pass goes on from there
FLUSH_EVERY = 32  # batches between flushes of the feature pass


def _offsets(records) -> np.ndarray:
    return np.concatenate([[0], np.cumsum([len(p) + len(o) for p, o in records])]).astype(np.int64)


def extract_features(target: CausalLM, records, aux_layers, out_dir, *, batch_size: int = 8, progress: bool = True):
    """``(features [N, (len(aux_layers) + 1) × hidden] float16 memmap, argmax [N] int32, offsets [R+1])`` of
    ``records`` under ``target``: the taps then the final-norm state (module docstring), and the target's top
    token after each position; reuses ``out_dir``'s files when they were made for the same records and layers,
    and a pass that was killed goes on from its last flushed batch (every ``FLUSH_EVERY`` batches)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    offsets = _offsets(records)
    aux = tuple(int(a) for a in aux_layers)
    width = (len(aux) + 1) * target.config.hidden_size
    done_mark = out_dir / (FEATURES + ".done")
    stamp = f"aux {list(aux)}\n"
    if done_mark.is_file() and done_mark.read_text() == stamp and (out_dir / OFFSETS).is_file():
        if np.array_equal(np.load(out_dir / OFFSETS), offsets):
            return np.load(out_dir / FEATURES, mmap_mode="r"), np.load(out_dir / ARGMAX), offsets
    shape = (int(offsets[-1]), width)
    mark = {"aux": list(aux), "batch_size": batch_size, "records": len(records), "tokens": int(offsets[-1])}
    first = _resume_point(out_dir, mark, offsets, shape)
    mode = "r+" if first else "w+"
    feats = np.lib.format.open_memmap(out_dir / FEATURES, mode=mode, dtype=np.float16, shape=shape)
    argmax = np.lib.format.open_memmap(out_dir / ARGMAX, mode=mode, dtype=np.int32, shape=(shape[0],))
    if not first:
        np.save(out_dir / OFFSETS, offsets)
    init_cache = target.init_cache
    cfg = target.config

    @jax.jit
    def forward(params, tokens):
        positions = jnp.broadcast_to(jnp.arange(tokens.shape[1], dtype=jnp.int32), tokens.shape)
        # the taps and the last layer's output (tap num_layers) of one pass; the latter through the final norm
        logits, tapped, _ = llama.taps_fn(cfg, aux + (cfg.num_layers,))(
            params, tokens, positions, init_cache(*tokens.shape)
        )
        final = _norm(cfg, params["final_norm"], tapped[..., -cfg.hidden_size :])
        feats = jnp.concatenate([tapped[..., : -cfg.hidden_size], final], -1).astype(jnp.float16)
        return feats, jnp.argmax(logits, -1).astype(jnp.int32)

    order = sorted(range(len(records)), key=lambda i: offsets[i + 1] - offsets[i])
    starts = list(range(0, len(order), batch_size))
    skipped = sum(int(offsets[i + 1] - offsets[i]) for i in order[: first * batch_size])
    with tqdm(total=int(offsets[-1]), initial=skipped, disable=not progress, desc="target features", unit="tok") as bar:
        for n, start in enumerate(starts[first:], first):
            chunk = order[start : start + batch_size]
            seqs = [records[i][0] + records[i][1] for i in chunk]
            length = -(-max(map(len, seqs)) // 64) * 64  # few distinct shapes: few compiles
            tokens = np.zeros((batch_size, length), np.int32)
            for b, s in enumerate(seqs):
                tokens[b, : len(s)] = s
            x, top = (np.asarray(a) for a in forward(target.params, jnp.asarray(tokens)))
            for b, i in enumerate(chunk):
                feats[offsets[i] : offsets[i + 1]] = x[b, : len(seqs[b])]
                argmax[offsets[i] : offsets[i + 1]] = top[b, : len(seqs[b])]
            bar.update(sum(map(len, seqs)))
            if (n + 1) % FLUSH_EVERY == 0:  # what a killed pass goes on from
                feats.flush()
                argmax.flush()
                _write_json(out_dir / PROGRESS, {**mark, "batches_done": n + 1})
    feats.flush()
    argmax.flush()
    done_mark.write_text(stamp)
    (out_dir / PROGRESS).unlink(missing_ok=True)
    return np.load(out_dir / FEATURES, mmap_mode="r"), np.load(out_dir / ARGMAX), offsets


def _resume_point(out_dir: Path, mark: dict, offsets, shape) -> int:
    """The batches a killed pass over the same records, layers and batch size flushed (0: start afresh)."""
    try:
        saved = json.loads((out_dir / PROGRESS).read_text())
        same = {k: saved.get(k) for k in mark} == mark and np.array_equal(np.load(out_dir / OFFSETS), offsets)
        on_disk = np.load(out_dir / FEATURES, mmap_mode="r").shape == shape
    except (OSError, ValueError):
        return 0
    return int(saved.get("batches_done", 0)) if same and on_disk else 0


def _write_json(path: Path, doc: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    tmp.replace(path)  # atomic: a kill leaves the old file or the new one


def _norm(cfg: llama.LlamaConfig, params, x):
    return llama.RMSNorm(cfg.rms_norm_eps, cfg.jnp_dtype, cfg.norm_offset).apply({"params": params}, x)


def _dense(params, x):
    y = jnp.einsum("...i,io->...o", x, params["kernel"])
    return y + params["bias"] if "bias" in params else y


def ttt_logits(cfg: eagle3.Eagle3Config, params, tokens, feats, positions, steps: int):
    """Training-time test: ``[steps]`` draft-vocabulary logits ``[B, T, draft vocab]`` (float32) of the head
    unrolled on its own outputs. ``tokens [B, T + steps]`` (token ``i+1`` at index ``i``, teacher-forced),
    ``feats [B, T, feature_size]`` (the target's tapped features at position ``i``), ``positions [B, T]`` (of the
    features). Step ``k`` (from 1) at index ``i`` reads token index ``i+k-1`` at position ``positions[i]+k-1``
    with the head's step-``k-1`` output there (the fused features for step 1), attends to step 1's keys at
    indices ``<= i`` and to its own chain's keys of steps 2..k, and predicts the token after; the same
    computation as drafting with the head's cache (tested against it)."""
    lc = cfg.layer
    h, kvh, d = lc.num_heads, lc.num_kv_heads, lc.head_dim
    assert d is not None
    if lc.sliding_window is not None or lc.attn_softcap is not None:
        raise ValueError("training an EAGLE-3 head on a target with sliding-window or soft-capped attention")
    p = params["layer"]
    batch, length = feats.shape[:2]
    rot = llama.rotation(lc.rotary_dim or d, lc.rope_theta, lc.rope_type, **dict(lc.rope_params))
    scale = lc.attention_multiplier or (lc.query_pre_attn_scalar or d) ** -0.5
    causal = jnp.arange(length)[None, :] <= jnp.arange(length)[:, None]  # [query i, key s]: s <= i
    embed = params["embed"]
    g = _dense(params["fc"], feats.astype(lc.jnp_dtype))
    keys, values, out = [], [], []
    for k in range(steps):
        e = jnp.take(embed, tokens[:, k : k + length], axis=0).astype(lc.jnp_dtype)
        if lc.embed_scale:
            e = e * jnp.asarray(lc.hidden_size**0.5, lc.jnp_dtype)
        if lc.embedding_multiplier != 1.0:
            e = e * lc.embedding_multiplier
        hn = _norm(lc, p["hidden_norm"], g)
        x_in = jnp.concatenate([_norm(lc, p["input_norm"], e), hn], -1)
        a = p["attn"]
        q = _dense(a["q_proj"], x_in).reshape(batch, length, h, d)
        kk = _dense(a["k_proj"], x_in).reshape(batch, length, kvh, d)
        vv = _dense(a["v_proj"], x_in).reshape(batch, length, kvh, d)
        if lc.qk_norm:
            q, kk = _norm(lc, a["q_norm"], q), _norm(lc, a["k_norm"], kk)
        pos = positions + k
        q, kk = llama.apply_rope(q, pos, rot), llama.apply_rope(kk, pos, rot)
        keys.append(kk)
        values.append(vv)
        q = q.reshape(batch, length, kvh, h // kvh, d)
        first = jnp.einsum("btkgd,bskd->bkgts", q, keys[0], preferred_element_type=jnp.float32) * scale
        first = jnp.where(causal[None, None, None], first, jnp.finfo(jnp.float32).min)
        own = [
            jnp.einsum("btkgd,btkd->bkgt", q, kj, preferred_element_type=jnp.float32)[..., None] * scale
            for kj in keys[1:]
        ]
        probs = jax.nn.softmax(jnp.concatenate([first, *own], -1), -1).astype(lc.jnp_dtype)
        att = jnp.einsum("bkgts,bskd->btkgd", probs[..., :length], values[0])
        for j, vj in enumerate(values[1:]):
            att = att + jnp.einsum("bkgt,btkd->btkgd", probs[..., length + j], vj)
        x = (hn if cfg.norm_before_residual else g) + _dense(a["o_proj"], att.reshape(batch, length, h * d))
        mlp = llama.MLP(lc).apply({"params": p["mlp"]}, _norm(lc, p["post_attn_norm"], x))
        x = x + mlp
        f = _norm(lc, params["final_norm"], x)
        out.append(jnp.einsum("bth,hv->btv", f, params["lm_head"], preferred_element_type=jnp.float32))
        g = x
    return jnp.stack(out)


@functools.cache
def train_step_fn(cfg: eagle3.Eagle3Config, steps: int, loss: str = "fkl"):
    """Jitted ``(own, opt_state, shared, tokens, feats, top, positions, mask, schedule) -> (own, opt_state, loss,
    agreement [steps])``: one optimizer step on the loss of the module docstring (``loss``: ``"fkl"`` the
    cross-entropy, ``"tvd"`` or ``"rkl"``; ``schedule = [learning_rate, warmup, total steps]``; ``top [B, W+1]``
    the target's top token after each position); ``agreement[k]``: the share of step k+1's valid positions where
    the head's top draft is the target's top token (greedy acceptance, teacher-forced)."""
    if loss not in LOSSES:
        raise ValueError(f"loss must be one of {list(LOSSES)}, got {loss!r}")
    n_aux = len(cfg.aux_layers)
    hidden = cfg.target_hidden

    ids = jnp.asarray(np.asarray(cfg.vocab_ids), jnp.int32)

    def loss_fn(own, shared, tokens, feats, top, positions, mask):
        params = {"lm_head": shared["head"], **own, "embed": shared["embed"]}  # own lm_head unless shared
        width = tokens.shape[1] - 1  # chains i = 0 .. W-1: step 1 reads token i+1
        pad = steps
        tok = jnp.pad(tokens[:, 1:], ((0, 0), (0, pad)))  # token i+1 at index i
        msk = jnp.pad(mask, ((0, 0), (0, pad + 1)))
        aux = feats[:, :width, : n_aux * hidden]
        final = jnp.pad(feats[:, :, n_aux * hidden :], ((0, 0), (0, pad + 1), (0, 0)))
        top = jnp.pad(top, ((0, 0), (0, pad + 1)))
        logits = ttt_logits(cfg, params, tok, aux, positions[:, :width], steps)
        # the target's logits on the draft vocabulary at every index, once (each step reads them shifted)
        target_logits = jax.lax.stop_gradient(
            jnp.einsum("btd,dv->btv", final[:, 1 : width + steps], shared["head"], preferred_element_type=jnp.float32)
        )
        target_p = jax.nn.softmax(target_logits, -1) if loss == "fkl" else None
        total, agree = jnp.float32(0.0), []
        for k in range(steps):
            # step k+1 at chain i predicts token i+k+2: the target's distribution at index i+k+1
            m = msk[:, k + 1 : k + 1 + width] * msk[:, :width]
            count = jnp.maximum(jnp.sum(m), 1.0)
            if target_p is not None:  # the cross-entropy (forward KL up to the target's entropy)
                per_position = -jnp.sum(target_p[:, k : k + width] * jax.nn.log_softmax(logits[k], -1), -1)
            else:
                per_position = divergence(loss, target_logits[:, k : k + width], logits[k], 1.0)
            total = total + STEP_DECAY**k * jnp.sum(per_position * m) / count
            agree.append(jnp.sum((ids[jnp.argmax(logits[k], -1)] == top[:, k + 1 : k + 1 + width]) * m) / count)
        return total, jnp.stack(agree)

    @jax.jit
    def step(own, opt_state, shared, tokens, feats, top, positions, mask, schedule):
        optimizer = make_optimizer(*schedule)
        args = (own, shared, tokens, feats, top, positions, mask)
        (loss, agree), grads = jax.value_and_grad(loss_fn, has_aux=True)(*args)
        updates, opt_state = optimizer.update(grads, opt_state, own)
        return optax.apply_updates(own, updates), opt_state, loss, agree

    return step


def train_head(
    target: CausalLM,
    data,
    *,
    out_dir,
    steps_ahead: int = 4,
    vocab: int | None = None,
    aux_layers: tuple[int, ...] | None = None,
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
    stop_at: int | None = None,
    train_lm_head: bool | None = None,
    loss: str = "fkl",
) -> tuple[eagle.EagleDrafter, list]:
    """Train a new EAGLE-3 head for ``target`` on ``data`` (a JSONL path or ``read_data``'s list) with
    ``steps_ahead`` steps of training-time test, over a draft vocabulary of the ``vocab`` ids most frequent in it
    (plus the EOS ids; None: the full vocabulary) and the target's ``aux_layers`` (default EAGLE-3's low, middle
    and high), or go on training the EAGLE-3 head ``init`` (its vocabulary and layers stay: do not give ``vocab``
    or ``aux_layers``); resumes from ``out_dir``. ``stop_at``: stop after that step (a checkpoint is written
    there), as a kill would, with the schedule of ``steps``: a later call goes on to ``steps``.
    ``train_lm_head=False``: the head's LM head stays the target's at the draft vocabulary's columns (not trained,
    not stored: ``shared_lm_head``); default True for a new head, ``init``'s choice when going on;
    ``train_lm_head=True`` gives a ``shared_lm_head`` ``init`` its own, starting at the target's columns. ``loss``:
    ``"fkl"`` (the cross-entropy against the target's distribution), ``"tvd"`` or ``"rkl"``. Returns the
    ``EagleDrafter`` and this call's log records (also appended to ``out_dir/distill_log.jsonl``, with each step's
    teacher-forced top-1 agreement)."""
    if quant.format_of(target.params) is not None:
        raise ValueError(
            f"target {target.name!r} has {quant.format_of(target.params)} weights: train the head on the float "
            "target (the head reads its embedding and features as they are), then use it with the quantized one"
        )
    records = read_data(data) if isinstance(data, (str, Path)) else list(data)
    if init is not None:
        if not isinstance(init, eagle.EagleDrafter) or not init.eagle3:
            raise ValueError(f"init must be an EAGLE-3 head (jaxspec.eagle.load), got {getattr(init, 'name', init)!r}")
        if vocab is not None or aux_layers is not None:
            raise ValueError("init: the head keeps its own vocabulary and layers; do not give vocab or aux_layers")
        if init.target_config != target.config:
            raise ValueError(f"init: the EAGLE head {init.name!r} was made for another target than {target.name!r}")
        if train_lm_head is False and not init.shared_lm_head:
            raise ValueError(
                f"train_lm_head=False: the head {init.name!r} has its own LM head (trained); it cannot go back to "
                "the target's: leave train_lm_head out"
            )
    for key, value in (("steps", steps), ("batch_size", batch_size), ("window", window), ("steps_ahead", steps_ahead)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{key} must be an int >= 1, got {value!r}")
    if not learning_rate > 0:
        raise ValueError(f"learning_rate must be > 0, got {learning_rate!r}")
    if loss not in LOSSES:
        raise ValueError(f"loss must be one of {list(LOSSES)}, got {loss!r}")
    if any(t < 0 or t >= target.vocab_size for p, o in records for t in p + o):
        raise ValueError(f"data has token ids outside the target's vocabulary [0, {target.vocab_size})")
    if init is not None:
        cfg = init.config
        assert isinstance(cfg, eagle3.Eagle3Config)
        own = {
            k: jax.tree.map(jnp.asarray, init.params[k])
            for k in eagle3.OWN
            if k != "lm_head" or not init.shared_lm_head
        }
        own_lm_head = not init.shared_lm_head or bool(train_lm_head)
    else:
        vocab_ids: tuple[int, ...] = tuple(range(target.vocab_size))
        if vocab:
            eos = target.eos_token_id
            always = () if eos is None else [eos] if isinstance(eos, int) else eos
            vocab_ids = choose_vocab(records, vocab, vocab_size=target.vocab_size, always=always)
        cfg = eagle3.head_config(target.config, vocab_ids, aux_layers=aux_layers)
        own = {k: v for k, v in eagle3.init_own(cfg, seed).items() if k != "lm_head"}
        own_lm_head = train_lm_head is not False
    columns = eagle3.target_head_columns(cfg, target.config, target.params)  # the shared LM head, or where one starts
    if own_lm_head and "lm_head" not in own:
        own["lm_head"] = columns.astype(cfg.jnp_dtype)
    out_dir = Path(out_dir).resolve()
    feats, argmax, offsets = extract_features(target, records, cfg.aux_layers, out_dir, progress=progress)
    argmax_column = argmax[:, None]
    step_fn = train_step_fn(cfg, steps_ahead, loss)
    shared = {
        "embed": target.params["embed"]["embedding"],
        "head": columns,
    }
    schedule = jnp.asarray([learning_rate, steps // 20 if warmup is None else warmup, steps], jnp.float32)
    state = {"params": own, "opt_state": make_optimizer(*schedule).init(own), "loss": jnp.float32(jnp.nan)}
    log = []
    with (
        Checkpoints(out_dir / "checkpoints") as checkpoints,
        tqdm(total=steps, disable=not progress, desc="EAGLE-3 head") as bar,
    ):
        state, start = checkpoints.restore(state, name="out_dir", what="this head")
        bar.update(min(start, steps))
        own, opt_state, last = state["params"], state["opt_state"], state["loss"]
        seen, t0 = 0, time.perf_counter()
        agree = jnp.zeros(steps_ahead)
        last_step = steps if stop_at is None else min(steps, stop_at)
        for step in range(start, last_step):
            tokens, x, positions, mask = batch_at(
                records, feats, offsets, step, seed=seed, batch_size=batch_size, window=window
            )
            # the same windows (a pure function of seed and step) of the target's top tokens
            top = batch_at(records, argmax_column, offsets, step, seed=seed, batch_size=batch_size, window=window)[1]
            batch = (tokens, x, top[..., 0].astype(np.int32), positions, mask)
            own, opt_state, last, agree = step_fn(own, opt_state, shared, *batch, schedule)
            seen += int(mask.sum())
            done = step + 1
            if due(done, checkpoint_every, steps) or done == last_step:
                checkpoints.save(done, {"params": own, "opt_state": opt_state, "loss": last})
            bar.update(1)
            if due(done, log_every, steps):
                record: dict[str, Any] = {"step": done, "loss": float(last), "tok_s": seen / (time.perf_counter() - t0)}
                record["loss_kind"] = "eagle3" if loss == "fkl" else f"eagle3-{loss}"
                record["agreement"] = [round(float(a), 4) for a in agree]
                bar.set_postfix(loss=f"{record['loss']:.4f}")
                log.append(record)
                append_jsonl(out_dir / LOG_FILE, record)
    name = name or (init.name if init is not None else "eagle3")
    scale = 1.0 if init is None else init.temperature_scale
    head = eagle.EagleDrafter.for_target(target, own, config=cfg, name=name, temperature_scale=scale)
    return dataclasses.replace(head, tree_temperature_scale=None if init is None else init.tree_temperature_scale), log


def from_eagle_head(
    target: CausalLM, head: eagle.EagleDrafter, data, *, aux_layers: tuple[int, ...] | None = None, tokens: int = 2048
) -> eagle.EagleDrafter:
    """A new EAGLE-3 head for ``target`` that starts near the one-layer EAGLE(-1) ``head`` (trained for the same
    target), for ``train_head(init=...)`` to go on from: training then starts from what that head learned instead of
    from random weights.

    The EAGLE head computes ``x0 = e·A + f·B`` (``fc``'s two halves; ``f`` the target's final-norm state, which is
    the last layer's output, tap ``L``, normalized) and runs one decoder layer on it. The EAGLE-3 head gets: ``fc``
    mapping tap ``L`` to ``(w_f ⊙ h_L)·B`` (``w_f`` the target's final-norm scale; the other taps start at zero, so
    ``aux_layers`` must hold ``L``); ``norm_before_residual``, with ``hidden_norm`` scaled by the typical size of
    ``f·B`` so that its output is ``f·B`` up to each token's scale; the attention's input halves
    ``[input_norm(e), hidden_norm(g)]`` projected by the EAGLE head's ``W·diag(w_in)`` composed with ``A`` (the
    embedding half) and alone (the feature half), each scaled by the typical ratio of its part's size to ``x0``'s;
    the attention output, MLP, norms and final norm copied; the LM head the target's at the EAGLE head's draft
    vocabulary. What it cannot carry over: ``e·A`` in the residual (EAGLE-3's residual holds no embedding), and the
    EAGLE head's later draft steps (it feeds back the final-norm state through ``fc``; EAGLE-3 feeds back the
    layer's output as is). The typical sizes are measured on the first ``tokens`` tokens of ``data`` (records as
    ``train_head`` takes; training data, never the benchmark's). ``aux_layers``: default ``(2, L // 2, L)``."""
    tcfg = target.config
    n = tcfg.num_layers
    if quant.format_of(target.params) is not None:
        raise ValueError(
            f"target {target.name!r} has {quant.format_of(target.params)} weights: start from the float one"
        )
    if not isinstance(head, eagle.EagleDrafter) or head.eagle3 or head.config.num_layers != 1:
        raise ValueError(
            f"head must be a one-layer EAGLE head (jaxspec.eagle.load), got {getattr(head, 'name', head)!r}"
        )
    if head.target_config != tcfg:
        raise ValueError(f"head: the EAGLE head {head.name!r} was made for another target than {target.name!r}")
    aux = (2, n // 2, n) if aux_layers is None else tuple(int(a) for a in aux_layers)
    if n not in aux:
        raise ValueError(f"aux_layers must hold {n} (the last layer's output, which the EAGLE head reads), got {aux}")
    width, off = tcfg.hidden_size, tcfg.norm_offset
    f32 = functools.partial(np.asarray, dtype=np.float32)
    fc = f32(head.params["fc"]["kernel"])
    a_half, b_half = fc[:width], fc[width:]
    layers = head.params["layers"]
    layer = jax.tree.map(f32, layers[0] if isinstance(layers, (list, tuple)) else jax.tree.map(lambda x: x[0], layers))
    w_in = layer["input_norm"]["scale"] + off
    w_final = f32(target.params["final_norm"]["scale"]) + off
    e_size, g_size, fb_size = _typical_sizes(target, head, data, tokens, a_half, b_half, w_final)
    vocab_ids = head.config.vocab_ids or tuple(range(tcfg.vocab_size))
    cfg = eagle3.head_config(tcfg, vocab_ids, aux_layers=aux, norm_before_residual=True)
    own = jax.tree.map(f32, eagle3.init_own(cfg))
    fused = np.zeros((len(aux) * width, width), np.float32)
    at = aux.index(n) * width
    fused[at : at + width] = w_final[:, None] * b_half
    own["fc"]["kernel"] = fused
    new = own["layer"]
    for name in ("q_proj", "k_proj", "v_proj"):
        kernel = layer["attn"][name]["kernel"]
        embed_part = e_size * (a_half * w_in[None]) @ kernel
        feature_part = (g_size / fb_size) * w_in[:, None] * kernel
        new["attn"][name]["kernel"] = np.concatenate([embed_part, feature_part], 0)
    new["attn"]["o_proj"] = layer["attn"]["o_proj"]
    new["input_norm"]["scale"] = np.ones(width, np.float32) - off
    new["hidden_norm"]["scale"] = np.full(width, fb_size, np.float32) - off
    new["post_attn_norm"], new["mlp"] = layer["post_attn_norm"], layer["mlp"]
    own["final_norm"]["scale"] = f32(head.params["final_norm"]["scale"])
    dtype = cfg.jnp_dtype
    own = {k: jax.tree.map(lambda x: jnp.asarray(x, dtype), v) for k, v in own.items() if k != "lm_head"}
    name = f"{head.name}-eagle3"
    return eagle.EagleDrafter.for_target(target, own, config=cfg, name=name, temperature_scale=head.temperature_scale)


def _typical_sizes(target: CausalLM, head, data, tokens: int, a_half, b_half, w_final) -> tuple[float, float, float]:
    """Means over the first ``tokens`` tokens of ``data`` of |e|/|x0|, |f·B|/|x0| and |f·B| (RMS sizes; ``x0 = e·A +
    f·B`` as the EAGLE ``head`` computes it at each position)."""
    cfg = target.config
    records = read_data(data) if isinstance(data, (str, Path)) else list(data)
    taps = jax.jit(llama.taps_fn(cfg, (cfg.num_layers,)))
    table = np.asarray(head.params["embed"], np.float32)
    scale = (cfg.hidden_size**0.5 if cfg.embed_scale else 1.0) * cfg.embedding_multiplier

    def rms(x):
        return np.sqrt(np.mean(x * x, -1))

    length = 256  # every record cut or padded to one shape: one compile
    sizes, seen = [], 0
    for prompt, output in records:
        seq = (prompt + output)[: length + 1]
        if len(seq) < 2:
            continue
        ids = np.zeros((1, length), np.int32)
        ids[0, : len(seq) - 1] = seq[:-1]
        positions = jnp.arange(length, dtype=jnp.int32)[None]
        h = np.asarray(taps(target.params, jnp.asarray(ids), positions, target.init_cache(1, length))[1][0], np.float32)
        h = h[: len(seq) - 1]
        f = h / np.sqrt(np.mean(h * h, -1, keepdims=True) + cfg.rms_norm_eps) * w_final
        e = table[np.asarray(seq[1:])] * scale
        fb = f @ b_half
        x0 = e @ a_half + fb
        sizes.append(np.stack([rms(e) / rms(x0), rms(fb) / rms(x0), rms(fb)], -1))
        seen += len(seq) - 1
        if seen >= tokens:
            break
    if not sizes:
        raise ValueError("data: no record of two tokens or more to measure the EAGLE head's feature sizes on")
    e_size, g_size, fb_size = np.concatenate(sizes).mean(0)
    return float(e_size), float(g_size), float(fb_size)


SCALES = (0.5, 0.6, 0.7, 0.75, 0.8, 0.9, 1.0, 1.1, 1.25)  # tune_temperature_scale's default grid


def _forced(target_cfg: llama.LlamaConfig, cfg: eagle3.Eagle3Config, steps: int, target_params, params, tokens):
    """Teacher-forced over ``tokens [B, T]``: the target's logits ``[B, T, V]`` and the head's draft-vocabulary
    logits at each of its ``steps`` draft steps ``[steps, B, T, rows]`` (``ttt_logits`` on the target's taps)."""
    batch, width = tokens.shape
    positions = jnp.broadcast_to(jnp.arange(width, dtype=jnp.int32), tokens.shape)
    _, init_target = llama.model_fns(target_cfg)
    logits, taps, _ = llama.taps_fn(target_cfg, cfg.aux_layers)(
        target_params, tokens, positions, init_target(batch, width)
    )
    padded = jnp.pad(tokens[:, 1:], ((0, 0), (0, steps)))
    return logits, ttt_logits(cfg, params, padded, taps, positions, steps)


@functools.cache
def _agreement_fn(target_cfg: llama.LlamaConfig, cfg: eagle3.Eagle3Config, steps: int, scales: tuple):
    ids = jnp.asarray(np.asarray(cfg.vocab_ids), jnp.int32)

    @jax.jit
    def measure(target_params, params, tokens, start, stop):
        width = tokens.shape[1]
        logits, drafted = _forced(target_cfg, cfg, steps, target_params, params, tokens)
        want = jnp.argmax(logits, -1)  # [B, T]: the target's top token after each position
        p = jax.nn.softmax(logits.astype(jnp.float32), -1)[..., ids]  # at temperature 1, on the draft vocabulary
        counts, accepts = [], []
        for k in range(steps):
            # step k+1 at position i drafts token i+k+2: the target's prediction at position i+k+1
            at = jnp.arange(width) + k + 2
            inside = (at[None] >= start[:, None]) & (at[None] < stop[:, None])
            same = ids[jnp.argmax(drafted[k], -1)] == _shift(want, k + 1)
            counts += [jnp.sum(same & inside), jnp.sum(inside)]
            for scale in scales:  # P(accept) of a draft from q: sum_v min(p_v, q_v)
                accept = jnp.sum(jnp.minimum(_shift(p, k + 1), jax.nn.softmax(drafted[k] / scale, -1)), -1)
                accepts.append(jnp.sum(jnp.where(inside, accept, 0.0)))
        return jnp.stack(counts).reshape(steps, 2), jnp.stack(accepts).reshape(steps, len(scales))

    return measure


def _shift(x, n: int):
    """``x [B, T, ...]`` moved ``n`` positions earlier along T (zeros at the end)."""
    return jnp.pad(x[:, n:], ((0, 0), (0, n)) + ((0, 0),) * (x.ndim - 2))


def _check_head(target: CausalLM, head) -> eagle3.Eagle3Config:
    """``head``'s config, or ``ValueError`` naming ``head`` unless it is an EAGLE-3 head made for ``target``."""
    if not isinstance(head, eagle.EagleDrafter) or not head.eagle3:
        raise ValueError(f"head must be an EAGLE-3 head (jaxspec.eagle.load), got {getattr(head, 'name', head)!r}")
    if head.target_config != target.config:
        raise ValueError(f"head: the EAGLE head {head.name!r} was made for another target than {target.name!r}")
    assert isinstance(head.config, eagle3.Eagle3Config)
    return head.config


def agreement(
    target: CausalLM, head: eagle.EagleDrafter, data, *, steps: int = 4, batch_size: int = 4, scales=None
) -> dict:
    """Teacher-forced agreement of the EAGLE-3 ``head`` with ``target`` on the outputs of ``data`` (a JSONL path or
    ``read_data``'s list), per draft step: ``{"steps": [share of step k's drafts that are the target's top token],
    "accept": [mean P(accept) of a draft sampled at temperature 1 there, sum_v min(p_v, q_v)], "tokens": drafts
    counted per step}``; with ``scales``, ``"by_scale"``: ``{scale: [accept per step]}`` (q at temperature
    ``scale``). Step k reads the head's own step-(k-1) output as drafting does (``ttt_logits``); only drafted
    tokens inside the output count."""
    cfg = _check_head(target, head)
    grid = check_scales(scales) if scales else (head.temperature_scale,)
    measure = _agreement_fn(target.config, cfg, steps, grid)
    records = read_data(data) if isinstance(data, (str, Path)) else list(data)
    order = sorted(range(len(records)), key=lambda i: len(records[i][0]) + len(records[i][1]))
    counts = np.zeros((steps, 2), np.int64)
    accepted = np.zeros((steps, len(grid)))
    for first in range(0, len(order), batch_size):
        chunk = [records[i] for i in order[first : first + batch_size]]
        width = -(-max(len(p) + len(o) for p, o in chunk) // 64) * 64  # few distinct shapes: few compiles
        tokens = np.zeros((batch_size, width), np.int32)
        start, stop = np.zeros(batch_size, np.int32), np.zeros(batch_size, np.int32)
        for b, (prompt, output) in enumerate(chunk):
            tokens[b, : len(prompt) + len(output)] = prompt + output
            start[b], stop[b] = len(prompt), len(prompt) + len(output)
        c, a = measure(target.params, head.params, tokens, start, stop)
        counts += np.asarray(c)
        accepted += np.asarray(a, np.float64)
    total = np.maximum(counts[:, 1], 1)
    out = {
        "steps": [float(x) for x in counts[:, 0] / total],
        "accept": [float(x) for x in accepted[:, 0] / total],
        "tokens": [int(x) for x in counts[:, 1]],
    }
    if scales:
        out["by_scale"] = {s: [float(x) for x in accepted[:, i] / total] for i, s in enumerate(grid)}
    return out


def tune_temperature_scale(target: CausalLM, head: eagle.EagleDrafter, data, *, scales=SCALES, steps: int = 2):
    """The ``temperature_scale`` among ``scales`` under which the EAGLE-3 ``head``'s drafts at temperature 1 are
    accepted most on ``data``'s outputs (teacher-forced: the expected accepted drafts of a ``steps``-draft round,
    a1 + a1·a2 + ...), and ``{scale: [accept per step]}``."""
    table = agreement(target, head, data, steps=steps, scales=scales)["by_scale"]
    best = max(table, key=lambda s: _expected_accepted(table[s]))
    return best, table


def _expected_accepted(accepts) -> float:
    """a1 + a1·a2 + ...: the expected accepted drafts of a chain whose step k is accepted with ``accepts[k]``."""
    run, total = 1.0, 0.0
    for a in accepts:
        run *= a
        total += run
    return total


@functools.cache
def _distributions_fn(target_cfg: llama.LlamaConfig, cfg: eagle3.Eagle3Config, steps: int):
    ids = jnp.asarray(np.asarray(cfg.vocab_ids), jnp.int32)

    @jax.jit
    def run(target_params, params, tokens):
        """``(p [B, T, rows + 1], drafted [steps, B, T, rows])``: the target's distribution at temperature 1 on the
        draft vocabulary with the rest's mass last, and the head's logits at each draft step (``ttt_logits``)."""
        logits, drafted = _forced(target_cfg, cfg, steps, target_params, params, tokens)
        p = jax.nn.softmax(logits.astype(jnp.float32), -1)[..., ids]
        return jnp.concatenate([p, jnp.maximum(1.0 - jnp.sum(p, -1, keepdims=True), 0.0)], -1), drafted

    return run


@functools.cache
def _siblings_fn(branch: int, samples: int):
    parent = jnp.zeros((branch + 1,), jnp.int32).at[0].set(-1)
    rank = jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.arange(branch, dtype=jnp.int32)])

    def one(key, q, p):
        draw, verify = jax.random.split(key)
        kids = draw_children(draw, q, branch)
        tokens = jnp.concatenate([jnp.zeros((1,), jnp.int32), kids])
        parents = parent.at[1:].set(jnp.where(q[kids] > 0, 0, -1))  # a child of zero q is left out, as in trees
        nodes_q = jnp.zeros((branch + 1, q.shape[0]), q.dtype).at[0].set(q)
        nodes_p = jnp.broadcast_to(p, (branch + 1, p.shape[0]))
        n, _, _ = accept_tree_row(verify, parents, tokens, rank, nodes_q, nodes_p, depth=1, branch=branch)
        return n

    @jax.jit
    def accept(key, logits, p, scale):
        """Mean over ``samples`` draws of whether one of ``branch`` children drawn without replacement from
        ``softmax(logits / scale)`` (``[N, rows]``) is accepted against ``p [N, rows + 1]``: ``[N]``."""
        q = jnp.pad(jax.nn.softmax(logits / scale, -1), ((0, 0), (0, 1)))
        keys = jax.random.split(key, (samples, q.shape[0]))
        return jnp.mean(jax.lax.map(lambda k: jax.vmap(one)(k, q, p), keys).astype(jnp.float32), 0)

    return accept


def sibling_acceptance(key, logits, p, scale: float, *, branch: int, samples: int):
    """P(accept) of a tree node's ``branch`` children drawn without replacement from ``softmax(logits / scale)``
    (``logits [N, rows]``) and tried in turn against ``p [N, rows + 1]`` (the last column: mass q never draws) by
    the trees' recursive rejection sampling (``jaxspec.core.tree_acceptance.accept_tree_row``; one level deep,
    traversal verification decides the same), estimated over ``samples`` draws per row: ``[N]``."""
    return _siblings_fn(branch, samples)(key, jnp.asarray(logits, jnp.float32), jnp.asarray(p, jnp.float32), scale)


def tree_acceptance(
    target: CausalLM,
    head: eagle.EagleDrafter,
    data,
    *,
    branch: int,
    scales=SCALES,
    steps: int = 2,
    samples: int = 16,
    seed: int = 0,
    batch_size: int = 4,
) -> dict[float, list[float]]:
    """Teacher-forced acceptance at temperature 1 of a draft tree's sibling sets on ``data``'s outputs: at each
    position and draft step k (1 .. ``steps``, the head's k-th output along the data as ``agreement``'s), the
    probability that one of ``branch`` children drawn without replacement from q at temperature ``scale`` is
    accepted (``sibling_acceptance``, ``samples`` draws a position): ``{scale: [accept per step]}``."""
    cfg = _check_head(target, head)
    if not isinstance(branch, int) or branch < 1:
        raise ValueError(f"branch must be an int >= 1, got {branch!r}")
    grid = check_scales(scales)
    run = _distributions_fn(target.config, cfg, steps)
    records = read_data(data) if isinstance(data, (str, Path)) else list(data)
    records.sort(key=lambda r: len(r[0]) + len(r[1]))  # rows of like lengths share a batch: less padding
    sums, count = np.zeros((len(grid), steps)), np.zeros(steps)
    key = jax.random.key(seed)
    chunk = 256  # positions per Monte Carlo call: one shape, one compile
    for first in range(0, len(records), batch_size):
        part = records[first : first + batch_size]
        width = -(-max(len(p) + len(o) for p, o in part) // 64) * 64
        tokens = np.zeros((batch_size, width), np.int32)
        for b, (prompt, output) in enumerate(part):
            tokens[b, : len(prompt) + len(output)] = prompt + output
        p, drafted = (np.asarray(x) for x in run(target.params, head.params, tokens))
        for k in range(steps):  # step k+1 at index i drafts token i+k+2, whose distribution is p at i+k+1
            rows, at = [], []
            for b, (prompt, output) in enumerate(part):
                i = np.arange(len(prompt) - k - 2, len(prompt) + len(output) - k - 2)
                rows.append(np.full(len(i), b))
                at.append(i)
            b_idx, i_idx = np.concatenate(rows), np.concatenate(at)
            keep = i_idx >= 0
            b_idx, i_idx = b_idx[keep], i_idx[keep]
            count[k] += len(i_idx)
            for start in range(0, len(i_idx), chunk):
                bb, ii = b_idx[start : start + chunk], i_idx[start : start + chunk]
                pad = chunk - len(bb)
                bb, ii = np.pad(bb, (0, pad), mode="edge"), np.pad(ii, (0, pad), mode="edge")
                for s, scale in enumerate(grid):
                    key, sub = jax.random.split(key)
                    got = sibling_acceptance(
                        sub, drafted[k][bb, ii], p[bb, ii + k + 1], scale, branch=branch, samples=samples
                    )
                    sums[s, k] += float(np.sum(np.asarray(got)[: chunk - pad]))
    return {s: [float(x) for x in sums[i] / np.maximum(count, 1)] for i, s in enumerate(grid)}


def tune_tree_temperature_scale(
    target: CausalLM,
    head: eagle.EagleDrafter,
    data,
    *,
    branch: int = 4,
    scales=SCALES,
    steps: int = 2,
    samples: int = 16,
    seed: int = 0,
):
    """The ``tree_temperature_scale`` among ``scales`` under which the EAGLE-3 ``head``'s trees of ``branch``
    children a node accept most at temperature 1 on ``data``'s outputs (``tree_acceptance``: the expected accepted
    depths along a path, a1 + a1·a2 + ...), and ``{scale: [accept per step]}``. Set it with
    ``dataclasses.replace(head, tree_temperature_scale=best)``; ``jaxspec.eagle.save`` keeps it."""
    table = tree_acceptance(target, head, data, branch=branch, scales=scales, steps=steps, samples=samples, seed=seed)
    best = max(table, key=lambda s: _expected_accepted(table[s]))
    return best, table
