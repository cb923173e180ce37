"""Offline draft distillation: generate the target's outputs once, then train the draft on them.

For a target that is slow to run (a real 135 M model on a CPU), generating fresh continuations every step, as
``jaxspec.distill`` does, costs far more than the training itself. Here the target's outputs are generated once
(``scripts/data/generate_distill_data.py``: JSONL records ``{"prompt_ids": [...], "output_ids": [...]}``) and the draft
is fitted to them by cross-entropy: weight 1 on every generated token (the target's own choice: at temperature 0
exactly the token a greedy verify pass accepts) and ``prompt_weight`` on the prompt's tokens (the workload's text).

    jaxspec distill --target smollm2-135m-instruct --data runs/smol/train_data.jsonl --out runs/smol/distill \\
        --new-draft target_layers=2,vocab=8191 --steps 500 --batch-size 16 --learning-rate 1e-3 \\
        --prompt-weight 0.2 --save-draft checkpoints/smollm2-draft

``--new-draft`` makes the draft to train (``make_draft``): the target's own first K layers with its final norm and
embedding (``target_layers=K``, ``draft_from_target``), or a new small tied-embedding Llama (``hidden=...``,
``new_draft``) whose embedding starts as the target's projected on its top principal directions. ``vocab=N``
restricts either to N ids (``choose_vocab``: the most frequent in the data, then the lowest ids): its LM head, the
largest part of a small draft's step over a 49 k vocabulary, shrinks N/V-fold, and its q = 0 elsewhere stays exact
under rejection sampling (only α can suffer, by the target's mass outside the N ids). Batches are pure functions
of (seed, step) and the run is checkpointed with orbax: a killed run resumes to the same parameters.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from jaxspec.core.model import CausalLM
from jaxspec.formats import jsonl
from jaxspec.models import families, llama
from jaxspec.training.common import LOG_FILE, Checkpoints, append_jsonl, due, make_optimizer, optimizer_step
from jaxspec.training.losses import token_nll, weighted_mean


def read_data(path) -> list[tuple[list[int], list[int]]]:
    """``(prompt_ids, output_ids)`` per line of a JSONL data file (``{"prompt_ids": [...], "output_ids": [...]}``
    records, as ``scripts/data/generate_distill_data.py`` writes them; blank lines skipped). ``ValueError`` names the
    first bad line; ``FileNotFoundError`` for a missing file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"data file {path} does not exist")
    bad = '{path}: line {line} is not a {{"prompt_ids": [...], "output_ids": [...]}} record'
    try:
        records = list(jsonl.iter_jsonl(path))
    except jsonl.LineError as err:
        raise ValueError(bad.format(path=path, line=err.line)) from None
    out = []
    for lineno, rec in records:
        try:
            prompt, output = rec["prompt_ids"], rec["output_ids"]
        except (KeyError, TypeError):
            raise ValueError(bad.format(path=path, line=lineno)) from None
        if not prompt or not all(isinstance(t, int) for t in prompt + output):
            raise ValueError(f"{path}: line {lineno}: prompt_ids must be a non-empty list of ints, output_ids ints")
        out.append((prompt, output))
    if not out:
        raise ValueError(f"data file {path} has no records")
    return out


_SPEC_KEYS = {
    "hidden": "hidden_size",
    "layers": "num_layers",
    "heads": "num_heads",
    "kv_heads": "num_kv_heads",
    "intermediate": "intermediate_size",
    "target_layers": "target_layers",
    "eagle": "eagle_layers",
    "eagle3": "eagle3_steps",
    "vocab": "vocab",
    "lm_head": "lm_head",
    "aux": "aux_layers",
}


def parse_spec(text: str) -> dict:
    """``"hidden=256,layers=2"`` (a ``--new-draft`` spec; keys: hidden, layers, heads, kv_heads, intermediate,
    target_layers, vocab; or eagle with vocab, for ``training.eagle.train_head``; or eagle3 (its steps of
    training-time test) with vocab, lm_head (0: the target's LM head, not trained) and aux (the tapped target
    layers, colon-separated: ``aux=2:15:30``), for ``training.eagle3.train_head``) -> keyword arguments of
    ``make_draft``. ``ValueError`` for an unknown key, a value that is not a positive int (lm_head: 0 or 1; aux:
    distinct ints >= 0), or ``target_layers`` with anything but ``vocab``."""
    out: dict = {}
    for part in filter(None, text.split(",")):
        key, _, value = part.partition("=")
        key = key.strip()
        if key == "lm_head" and value.strip() in ("0", "1"):
            out[key] = int(value)
            continue
        if key == "aux":
            layers = value.strip().split(":")
            if not all(x.isdigit() for x in layers) or len(set(map(int, layers))) != len(layers):
                raise ValueError(f"--new-draft: {part!r}: aux takes distinct target layers, e.g. aux=2:15:30")
            out["aux_layers"] = tuple(map(int, layers))
            continue
        if key not in _SPEC_KEYS or not value.strip().isdigit() or int(value) < 1:
            raise ValueError(f"--new-draft: {part!r} is not KEY=positive int with KEY in {sorted(_SPEC_KEYS)}")
        out[_SPEC_KEYS[key]] = int(value)
    if "eagle_layers" in out and out.keys() - {"eagle_layers", "vocab"}:
        raise ValueError(
            "--new-draft: eagle=K is an EAGLE head of K layers at the target's width (jaxspec.training.eagle); "
            "it combines only with vocab=N"
        )
    if "eagle3_steps" in out and out.keys() - {"eagle3_steps", "vocab", "lm_head", "aux_layers"}:
        raise ValueError(
            "--new-draft: eagle3=K is an EAGLE-3 head trained with K draft steps of training-time test "
            "(jaxspec.training.eagle3); it combines only with vocab=N, lm_head=0|1 and aux=L1:L2:L3"
        )
    for key, spelled in (("lm_head", "lm_head=0|1"), ("aux_layers", "aux=L1:L2:L3")):
        if key in out and "eagle3_steps" not in out:
            raise ValueError(f"--new-draft: {spelled} is for an EAGLE-3 head (eagle3=K)")
    if "target_layers" in out and out.keys() - {"target_layers", "vocab"}:
        raise ValueError(
            "--new-draft: target_layers=K takes the target's first K layers at the target's sizes; "
            "it combines only with vocab=N"
        )
    return out


def make_draft(
    target: CausalLM,
    records=None,
    *,
    target_layers: int | None = None,
    vocab: int | None = None,
    seed: int = 0,
    **sizes,
) -> CausalLM:
    """The draft a ``--new-draft`` spec names: the target's first ``target_layers`` layers
    (``draft_from_target``) or a new small Llama (``new_draft`` with ``sizes``); with ``vocab=N``, restricted to
    the N ids most frequent in ``records`` (the training data) plus the target's EOS ids."""
    vocab_ids: tuple[int, ...] = ()
    if vocab:
        if not records:
            raise ValueError("--new-draft vocab=N chooses the ids from the training data: give --data")
        eos = target.eos_token_id
        vocab_ids = choose_vocab(
            records,
            vocab,
            vocab_size=target.vocab_size,
            always=() if eos is None else [eos] if isinstance(eos, int) else eos,
        )
    if target_layers:
        return draft_from_target(target, range(target_layers), vocab_ids=vocab_ids)
    return new_draft(target, seed=seed, vocab_ids=vocab_ids, **sizes)


def new_draft(
    target: CausalLM,
    *,
    hidden_size: int = 256,
    num_layers: int = 4,
    num_heads: int = 4,
    num_kv_heads: int = 1,
    intermediate_size: int | None = None,
    seed: int = 0,
    vocab_ids=(),
    name: str = "draft",
) -> CausalLM:
    """A small tied-embedding Llama draft for ``target`` (same vocabulary, tokenizer and EOS), its embedding
    initialised as ``E_target @ V[:, :hidden_size] * s`` with ``V`` the right singular vectors of the target's
    centred embedding and ``s`` bringing it to the draft's ``init_std``."""
    cfg = llama.LlamaConfig(
        vocab_size=target.vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 4 * hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        tie_embeddings=True,
        rope_theta=getattr(target.config, "rope_theta", 10000.0),
        vocab_ids=tuple(vocab_ids),
    )
    params = llama.init_params(cfg, seed)
    emb = target.params.get("embed", {}).get("embedding") if isinstance(target.params, dict) else None
    if emb is not None and emb.shape[1] >= hidden_size:
        e = np.asarray(emb, np.float32)
        if cfg.vocab_ids:  # the kept rows, and the mean as the out-of-vocabulary input row
            e = np.concatenate([e[np.asarray(cfg.vocab_ids)], e.mean(0, keepdims=True)])
        _, _, vt = np.linalg.svd(e - e.mean(0), full_matrices=False)
        proj = e @ vt[:hidden_size].T
        proj *= cfg.init_std / max(float(proj.std()), 1e-12)  # the target's directions at the draft's init scale
        params = {**params, "embed": {"embedding": jnp.asarray(proj, cfg.jnp_dtype)}}
    return llama.from_params(cfg, params, tokenizer=target.tokenizer, eos_token_id=target.eos_token_id, name=name)


def choose_vocab(records, size: int, *, vocab_size: int, always=(), prompt_weight: float = 0.2) -> tuple[int, ...]:
    """The ``size`` ids a reduced-vocabulary draft keeps, sorted: ``always`` (e.g. the EOS ids), then the most
    frequent in ``records`` (generated tokens count 1, prompt tokens ``prompt_weight``), then the lowest ids not
    yet kept (in a BPE vocabulary the earliest merges, the tokenizer's most frequent tokens)."""
    if not 0 < size <= vocab_size:
        raise ValueError(f"a reduced vocabulary must keep between 1 and vocab_size={vocab_size} ids, got {size}")
    counts: dict[int, float] = {}
    for prompt, output in records:
        for t in output:
            counts[t] = counts.get(t, 0.0) + 1.0
        for t in prompt:
            counts[t] = counts.get(t, 0.0) + prompt_weight
    ranked = sorted((t for t in counts if counts[t] > 0), key=lambda t: (-counts[t], t))
    keep = dict.fromkeys(int(t) for t in (*always, *ranked))
    for t in range(vocab_size):
        if len(keep) >= size:
            break
        keep.setdefault(t)
    return tuple(sorted(list(keep)[:size]))


def draft_from_target(target: CausalLM, layers, *, vocab_ids=(), name: str = "draft") -> CausalLM:
    """A draft made of some of ``target``'s own layers (a Llama-family target): the chosen decoder layers in order,
    the target's final norm, embedding and LM head, restricted to ``vocab_ids`` when given (its extra
    out-of-vocabulary input row starts as the mean embedding). Distillation then fits it to the target."""
    cfg = target.config
    if not isinstance(cfg, llama.LlamaConfig):
        raise ValueError(f"draft_from_target needs a Llama-family target, got {type(cfg).__name__}")
    layers = [int(i) for i in layers]
    if not layers or not all(0 <= i < cfg.num_layers for i in layers):
        raise ValueError(f"layers must be a non-empty list of layer indices in [0, {cfg.num_layers}), got {layers}")
    dcfg = dataclasses.replace(cfg, num_layers=len(layers), vocab_ids=tuple(vocab_ids))
    params = jax.tree_util.tree_map(np.asarray, families.stack_layers(target.params))
    emb = params["embed"]["embedding"]
    head = None if cfg.tie_embeddings else params["lm_head"]["kernel"]
    if dcfg.vocab_ids:
        ids = np.asarray(dcfg.vocab_ids)
        emb = np.concatenate([emb[ids], emb.mean(0, keepdims=True, dtype=np.float32).astype(emb.dtype)])
        if head is not None:  # the out-of-vocabulary column's logit is always masked
            head = np.concatenate([head[:, ids], np.zeros_like(head[:, :1])], axis=1)
    new = {
        "embed": {"embedding": emb},
        "final_norm": params["final_norm"],
        "layers": jax.tree_util.tree_map(lambda a: a[np.asarray(layers)], params["layers"]),
    }
    if head is not None:
        new["lm_head"] = {"kernel": head}
    new = jax.tree_util.tree_map(jnp.asarray, new)
    return llama.from_params(dcfg, new, tokenizer=target.tokenizer, eos_token_id=target.eos_token_id, name=name)


def batch_at(
    records, step: int, *, seed: int, batch_size: int, prompt_weight: float, max_length: int = 512, positions: int = 192
):
    """``(tokens [B, T] int32, select [B, S] int32, weight [B, S] float32)`` for ``step``, a pure function of
    (seed, step). A batch draws its rows from one padded-length bucket (chosen with probability proportional to
    its size), so short records are not padded to the longest. ``select`` lists the positions whose next token is
    trained on: every position predicting a generated token (weight 1), then prompt positions drawn at random
    (weight ``prompt_weight``) up to ``S = positions`` (padding: weight 0). The LM head, most of a small draft's
    cost over a 49 k vocabulary, runs only at these positions. ``T`` is a power of two >= 64; records are cut to
    ``max_length``."""
    rng = np.random.default_rng([seed, step])
    buckets: dict[int, list[int]] = {}  # records of one padded length share a batch: little padding
    for i, (p, o) in enumerate(records):
        buckets.setdefault(_bucket(len(p) + len(o), max_length), []).append(i)
    sizes = sorted(buckets)
    pick = sizes[rng.choice(len(sizes), p=np.array([len(buckets[k]) for k in sizes]) / len(records))]
    rows = [records[i] for i in rng.choice(buckets[pick], size=batch_size)]
    longest = min(max(len(p) + len(o) for p, o in rows), max_length)
    length = _bucket(longest, max_length)
    tokens = np.zeros((batch_size, length), np.int32)
    select = np.zeros((batch_size, positions), np.int32)
    weight = np.zeros((batch_size, positions), np.float32)
    for b, (p, o) in enumerate(rows):
        seq = (p + o)[:length]
        tokens[b, : len(seq)] = seq
        out = np.arange(len(p) - 1, len(seq) - 1)[:positions]
        n_prompt = min(positions - len(out), len(p) - 1) if prompt_weight > 0 else 0
        prompt = np.sort(rng.choice(len(p) - 1, size=n_prompt, replace=False)) if n_prompt > 0 else out[:0]
        chosen = np.concatenate([out, prompt])
        select[b, : len(chosen)] = chosen
        weight[b, : len(out)] = 1.0
        weight[b, len(out) : len(chosen)] = prompt_weight
    return tokens, select, weight


def _bucket(length: int, max_length: int) -> int:
    return max(64, 1 << (min(length, max_length) - 1).bit_length())


@functools.cache
def train_step_fn(cfg: llama.LlamaConfig):
    """Jitted ``(params, opt_state, tokens [B, T], select [B, S], weight [B, S], schedule [3]) -> (params,
    opt_state, loss)`` for a draft of config ``cfg``: one ``make_optimizer`` step on the weighted next-token
    cross-entropy at the selected positions (``batch_at``'s); ``schedule = [learning_rate, warmup, steps]``
    (float32) is traced. A reduced-vocabulary draft skips labels outside its ids. Cached per config."""
    _, init_cache = llama.model_fns(cfg)

    def loss_fn(params, tokens, select, weight):
        positions = jnp.broadcast_to(jnp.arange(tokens.shape[1], dtype=jnp.int32), tokens.shape)
        x, head = llama.hidden_and_head(cfg, params, tokens, positions, init_cache(*tokens.shape))
        h = jnp.take_along_axis(x, select[:, :, None], axis=1)  # [B, S, D]
        logits = llama.soft_cap(cfg, jnp.einsum("bsd,dv->bsv", h, head, preferred_element_type=jnp.float32))
        labels = jnp.take_along_axis(tokens, jnp.minimum(select + 1, tokens.shape[1] - 1), axis=1)
        if cfg.vocab_ids:  # a reduced vocabulary: labels as rows; ids outside it are not trained on
            labels = llama.to_rows(cfg, labels)
            weight = weight * (labels < len(cfg.vocab_ids))
            labels = jnp.where(labels < len(cfg.vocab_ids), labels, 0)
            logits = logits.at[..., -1].set(-jnp.inf)
        return weighted_mean(token_nll(logits, labels), weight)

    @jax.jit
    def step(params, opt_state, tokens, select, weight, schedule):
        return optimizer_step(loss_fn, make_optimizer(*schedule), params, opt_state, tokens, select, weight)

    return step


def distill_offline(
    draft: CausalLM,
    data,
    *,
    out_dir,
    steps: int = 600,
    batch_size: int = 8,
    learning_rate: float = 1e-3,
    warmup: int | None = None,
    seed: int = 0,
    prompt_weight: float = 0.2,
    max_length: int = 512,
    checkpoint_every: int = 50,
    log_every: int = 10,
    progress: bool = True,
) -> tuple[CausalLM, list]:
    """Train ``draft`` (a Llama-family ``CausalLM``) on ``data`` (a JSONL path or ``read_data``'s list) by weighted
    cross-entropy (``batch_at``, ``train_step_fn``); resumes from the latest checkpoint in ``out_dir``.

    ``warmup`` defaults to ``steps // 20``; the schedule and optimizer are ``training.make_optimizer``'s (AdamW,
    no weight decay). Every ``log_every`` steps a record ``{"step", "loss", "tok_s", "loss_kind"}`` is appended to
    ``out_dir/distill_log.jsonl``. Returns the draft with the trained params and this call's log records.
    """
    records = read_data(data) if isinstance(data, (str, Path)) else list(data)
    for name, value in (("steps", steps), ("batch_size", batch_size), ("checkpoint_every", checkpoint_every)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    if not learning_rate > 0:
        raise ValueError(f"learning_rate must be > 0, got {learning_rate!r}")
    if not prompt_weight >= 0:
        raise ValueError(f"prompt_weight must be >= 0, got {prompt_weight!r}")
    if any(t < 0 or t >= draft.vocab_size for p, o in records for t in p + o):
        raise ValueError(f"data has token ids outside the draft's vocabulary [0, {draft.vocab_size})")
    warmup = steps // 20 if warmup is None else warmup
    out_dir = Path(out_dir).resolve()
    if not isinstance(draft.config, llama.LlamaConfig):
        raise ValueError("offline distillation trains Llama-family drafts (draft.config must be a LlamaConfig)")
    step_fn = train_step_fn(draft.config)
    schedule = jnp.asarray([learning_rate, warmup, steps], jnp.float32)
    stacked = families.stack_layers(draft.params)  # trained stacked (nn.scan), returned in the draft's layout
    state = {
        "params": stacked,
        "opt_state": make_optimizer(*schedule).init(stacked),
        "loss": jnp.float32(jnp.nan),
    }
    log = []
    with Checkpoints(out_dir) as checkpoints, tqdm(total=steps, disable=not progress, desc="distill (offline)") as bar:
        state, start = checkpoints.restore(state, name="out_dir", what="this draft")
        bar.update(min(start, steps))
        params, opt_state, last = state["params"], state["opt_state"], state["loss"]
        seen, t0 = 0, time.perf_counter()
        for step in range(start, steps):
            tokens, select, weight = batch_at(
                records, step, seed=seed, batch_size=batch_size, prompt_weight=prompt_weight, max_length=max_length
            )
            params, opt_state, last = step_fn(params, opt_state, tokens, select, weight, schedule)
            seen += int((weight > 0).sum())
            done = step + 1
            if due(done, checkpoint_every, steps):
                checkpoints.save(done, {"params": params, "opt_state": opt_state, "loss": last})
            bar.update(1)
            if due(done, log_every, steps):
                record = {
                    "step": done,
                    "loss": float(last),
                    "tok_s": seen / (time.perf_counter() - t0),
                    "loss_kind": "ce-offline",
                }
                bar.set_postfix(loss=f"{record['loss']:.4f}")
                log.append(record)
                append_jsonl(out_dir / LOG_FILE, record)
    return draft.replace(params=families.layout_like(params, draft.params)), log
