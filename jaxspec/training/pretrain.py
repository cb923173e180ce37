"""Train a Llama-architecture language model from scratch with optax: the recipe for the shipped pair.

    jaxspec train --run runs/pair --model target --steps 1100
    jaxspec train --run runs/pair --model draft --teacher target --steps 1500
    jaxspec train --run runs/pair --export target checkpoints/code-target --bf16

The run directory holds the tokenizer, the encoded corpus and one orbax checkpoint manager per model. A killed
run resumes from its latest checkpoint (parameters, optimizer state and step; batches are a pure function of the
seed and step, so a resumed run sees the same data as an uninterrupted one). ``--teacher`` trains by
distillation: the loss is the cross-entropy against the teacher's next-token distribution (forward KL), with the
teacher's latest checkpoint in the same run; held-out loss is always reported against the real next tokens.
``--export`` writes a model's latest parameters with the run's tokenizer as a ``jaxspec.save`` directory.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np
import optax

from jaxspec.core.model import full_logits
from jaxspec.formats.orbax import save
from jaxspec.models import llama
from jaxspec.training import corpus
from jaxspec.training.common import Checkpoints, append_jsonl, due, make_optimizer, optimizer_step

PAIR_CONFIGS: dict[str, dict[str, Any]] = {
    "target": dict(hidden_size=384, intermediate_size=1024, num_layers=6, num_heads=6, num_kv_heads=2),
    "draft": dict(
        hidden_size=128, intermediate_size=384, num_layers=2, num_heads=2, num_kv_heads=1, tie_embeddings=True
    ),
}
"""The shipped pair's ``LlamaConfig`` fields (all but ``vocab_size``, the run's tokenizer's) by model name: one
tokenizer for both; the draft is far cheaper per decode step."""


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Hyper-parameters of one ``train`` call (each is also a ``--flag`` of ``jaxspec train``).

    Attributes:
      steps: total optimizer steps of the run (a resumed run trains up to this many).
      batch_size: windows per batch (``B``).
      seq_len: tokens per window (``T``; a window holds ``T + 1`` tokens: inputs and next-token labels).
      learning_rate: peak learning rate, reached after ``warmup`` steps; cosine decay to a tenth of it at ``steps``.
      warmup: linear warmup steps.
      weight_decay: AdamW's decoupled weight decay.
      seed: parameter initialisation and batch sampling (batches are a pure function of (seed, step)).
      checkpoint_every: steps between orbax checkpoints (and one at the last step).
      eval_every: steps between held-out loss evaluations (and one at the last step).
    """

    steps: int = 6000
    batch_size: int = 16
    seq_len: int = 256
    learning_rate: float = 3e-3
    warmup: int = 200
    weight_decay: float = 0.1
    seed: int = 0
    checkpoint_every: int = 250
    eval_every: int = 500


def prepare_run(run: Path, vocab_size: int = 4096) -> None:
    """Make the run's tokenizer (``run/tokenizer``, ``vocab_size`` ids) and encoded corpus splits
    (``run/train.npy``, ``run/heldout.npy``: 1-D int token streams), each only if it is not there yet."""
    tok_dir = run / "tokenizer"
    if not (tok_dir / "tokenizer.json").exists():
        corpus.train_tokenizer(tok_dir, vocab_size)
    for split in ("train", "heldout"):
        path = run / f"{split}.npy"
        if not path.exists():
            np.save(path, corpus.encode_split(tok_dir, split))


def model_config(name: str, vocab_size: int) -> llama.LlamaConfig:
    """The ``LlamaConfig`` of the pair's model ``name`` ("target" or "draft") over a ``vocab_size`` vocabulary."""
    return llama.LlamaConfig(vocab_size=vocab_size, **PAIR_CONFIGS[name])


def batch_at(data: np.ndarray, cfg: TrainConfig, step: int) -> np.ndarray:
    """Training batch ``step``: ``[B, seq_len + 1]`` windows of the token stream ``data`` at random offsets, a pure
    function of (``cfg.seed``, ``step``), so a resumed run sees the same batches as an uninterrupted one."""
    rng = np.random.default_rng([cfg.seed, step])
    starts = rng.integers(0, len(data) - cfg.seq_len - 1, size=cfg.batch_size)
    return np.stack([data[s : s + cfg.seq_len + 1] for s in starts])


def make_loss(apply_fn, init_cache):
    """``loss_fn(params, batch [B, T + 1]) -> scalar``: mean next-token cross-entropy against the batch's own
    tokens, for the model ``(apply_fn, init_cache)``."""

    def loss_fn(params, batch):
        logits = full_logits(apply_fn, init_cache, params, batch[:, :-1])
        return optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:]).mean()

    return loss_fn


def make_distill_loss(apply_fn, init_cache, teacher_apply, teacher_init_cache, teacher_params):
    """``loss_fn(params, batch [B, T + 1]) -> scalar``: mean cross-entropy of the student ``(apply_fn,
    init_cache)`` against the frozen teacher's next-token distribution (= forward KL + the teacher's entropy)."""

    def loss_fn(params, batch):
        inputs = batch[:, :-1]
        teacher = jax.nn.softmax(full_logits(teacher_apply, teacher_init_cache, teacher_params, inputs))
        logits = full_logits(apply_fn, init_cache, params, inputs)
        return optax.softmax_cross_entropy(logits, jax.lax.stop_gradient(teacher)).mean()

    return loss_fn


def optimizer(cfg: TrainConfig) -> optax.GradientTransformation:
    """The pair's optimizer: ``make_optimizer`` with ``cfg``'s schedule and weight decay, ``b2`` = 0.95."""
    return make_optimizer(cfg.learning_rate, cfg.warmup, cfg.steps, weight_decay=cfg.weight_decay, b2=0.95)


def tokenizer_vocab_size(run: Path) -> int:
    """The number of ids of the run's tokenizer (``run/tokenizer/tokenizer.json``)."""
    return len(json.loads((run / "tokenizer" / "tokenizer.json").read_text())["model"]["vocab"])


def latest_params(run: Path, name: str, mcfg: llama.LlamaConfig | None = None):
    """``(params, config, step)``: the latest checkpointed parameters of model ``name`` in ``run``, its config
    (``mcfg``, else ``run/<name>_config.json``) and the checkpoint's step. ``FileNotFoundError`` when it has none."""
    run = Path(run).resolve()
    if mcfg is None:
        fields = json.loads((run / f"{name}_config.json").read_text())
        kwargs: dict[str, Any] = {k: tuple(map(tuple, v)) if k == "rope_params" else v for k, v in fields.items()}
        mcfg = llama.LlamaConfig(**kwargs)
    with Checkpoints(run / f"ckpt_{name}", max_to_keep=None, create=False) as checkpoints:
        if checkpoints.latest_step is None:
            raise FileNotFoundError(f"no checkpoint of {name!r} in {run}; train it first")
        abstract = jax.eval_shape(lambda: llama.init_params(mcfg, 0))
        opt_state = jax.eval_shape(optimizer(TrainConfig()).init, abstract)
        state, step = checkpoints.restore({"params": abstract, "opt_state": opt_state}, what=f"model {name!r}")
    return state["params"], mcfg, step


def train(
    run: Path,
    name: str,
    cfg: TrainConfig,
    mcfg: llama.LlamaConfig | None = None,
    teacher: str | None = None,
    teacher_cfg: llama.LlamaConfig | None = None,
) -> dict:
    """Train model ``name`` (config ``mcfg``, else the pair's) on ``run/train.npy`` (made by ``prepare_run``);
    resumes from the latest checkpoint in ``run/ckpt_<name>``. Logs to ``run/<name>_log.jsonl`` and stdout.

    With ``teacher`` (a model name in the same run, config ``teacher_cfg`` or its saved one), distill from its
    latest checkpoint instead of the labels. Returns ``{"params": ..., "config": mcfg}``.
    """
    run = Path(run).resolve()
    data = np.load(run / "train.npy")
    heldout = np.load(run / "heldout.npy")
    mcfg = mcfg or model_config(name, tokenizer_vocab_size(run))
    apply_fn, init_cache = llama.model_fns(mcfg)
    loss_fn = make_loss(apply_fn, init_cache)
    eval_loss = jax.jit(loss_fn)
    if teacher is not None:
        t_params, t_cfg, t_step = latest_params(run, teacher, teacher_cfg)
        print(f"distilling from {teacher} (step {t_step})", flush=True)
        loss_fn = make_distill_loss(apply_fn, init_cache, *llama.model_fns(t_cfg), t_params)
    opt = optimizer(cfg)

    @jax.jit
    def train_step(params, opt_state, batch):
        return optimizer_step(loss_fn, opt, params, opt_state, batch)

    span = cfg.seq_len + 1
    eval_batch = np.stack([heldout[i : i + span] for i in range(0, min(64, len(heldout) // span) * span, span)])

    params = llama.init_params(mcfg, cfg.seed)
    with Checkpoints(run / f"ckpt_{name}") as checkpoints:
        state, start_step = checkpoints.restore(
            {"params": params, "opt_state": opt.init(params)}, what=f"model {name!r}"
        )
        if checkpoints.latest_step is not None:
            print(f"resumed {name} at step {start_step}", flush=True)
        (run / f"{name}_config.json").write_text(json.dumps(dataclasses.asdict(mcfg), indent=2))
        n_params = sum(x.size for x in jax.tree.leaves(state["params"]))
        print(f"{name}: {n_params / 1e6:.2f} M params, {len(data) / 1e6:.1f} M train tokens", flush=True)

        params, opt_state = state["params"], state["opt_state"]
        t0, tokens = time.perf_counter(), 0
        for step in range(start_step, cfg.steps):
            params, opt_state, loss = train_step(params, opt_state, batch_at(data, cfg, step))
            tokens += cfg.batch_size * cfg.seq_len
            done = step + 1
            if due(done, cfg.checkpoint_every, cfg.steps):
                checkpoints.save(done, {"params": params, "opt_state": opt_state})
            if due(done, 50, cfg.steps):
                record = {"step": done, "loss": float(loss), "tok_s": tokens / (time.perf_counter() - t0)}
                if due(done, cfg.eval_every, cfg.steps):
                    record["heldout_loss"] = float(eval_loss(params, eval_batch))
                append_jsonl(run / f"{name}_log.jsonl", record)
                print(json.dumps(record), flush=True)
    return {"params": params, "config": mcfg}


def export(run: Path, name: str, out_dir: Path, bf16: bool = False) -> Path:
    """Save model ``name``'s latest parameters with the run's tokenizer as a ``jaxspec.save`` directory
    (``bf16``: weights stored in bfloat16, loaded back as the config's float32)."""
    from transformers import AutoTokenizer

    run = Path(run).resolve()
    params, mcfg, step = latest_params(run, name)
    tokenizer = AutoTokenizer.from_pretrained(str(run / "tokenizer"))
    model = llama.from_params(
        mcfg, params, tokenizer=tokenizer, eos_token_id=tokenizer.eos_token_id, name=Path(out_dir).name
    )
    print(f"exporting {name} (step {step}, {model.num_params / 1e6:.2f} M params) to {out_dir}", flush=True)
    return save(model, out_dir, storage_dtype="bfloat16" if bf16 else None)
