"""Draft distillation: train a draft to match the target's next-token distribution on the target's own outputs.

    result = jaxspec.distill(target, draft, prompts, out_dir="runs/distill", steps=200, loss="fkl")
    result.draft                                 # the same draft (apply_fn, config, tokenizer) with new params
    result.alpha_before, result.alpha_after      # {"greedy": α, "t1": α} on the held-out prompts

    jaxspec distill --target jaxspec/code-target --draft jaxspec/code-draft --prompts p.jsonl \\
        --out runs/distill --steps 200 --save-draft checkpoints/code-draft-distilled

Each step draws ``batch_size`` training prompts and continues them with ``jaxspec.generate`` at ``temperature``:
a fraction ``on_policy`` of the rows with the current draft (DistillSpec's on-policy data), the rest with the
target. The loss compares the target's and the draft's temperature-warped next-token distributions at every
position that predicts a generated token (the last prompt position included): forward KL(p‖q), reverse KL(q‖p)
or total variation ½Σ|p−q| (1 − TVD is the acceptance probability of one draft token, so "tvd" optimizes α
directly). The batch and the generation seeds are pure functions of (seed, step), the held-out split is
positional, and params, optimizer state, step and last loss are checkpointed with orbax in ``out_dir``: a killed
run resumes to exactly the parameters of an uninterrupted one. The learning rate, warmup, step count and
temperature are traced: the train step compiles once per (models, loss, batch shape).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from jaxspec.core.model import CausalLM, full_logits
from jaxspec.formats import jsonl
from jaxspec.generation.generate import generate
from jaxspec.generation.inputs import next_pow2
from jaxspec.generation.request import is_int, is_real, tokenize
from jaxspec.models import families, quant
from jaxspec.training.common import LOG_FILE, Checkpoints, append_jsonl, due, make_optimizer, optimizer_step
from jaxspec.training.losses import LOSSES, divergence, weighted_mean

optimizer = make_optimizer
"""``optimizer(learning_rate, warmup, steps)``: distillation's optimizer, ``training.make_optimizer`` with its
defaults (AdamW without weight decay after clipping the gradient norm to 1; warmup then cosine decay)."""


@dataclasses.dataclass(frozen=True)
class DistillResult:
    """What ``distill`` returns.

    Attributes:
      draft: the input draft with the distilled params.
      alpha_before: ``{"greedy": α at temperature 0, "t1": α at temperature 1}`` on the held-out prompts, before.
      alpha_after: the same, after.
      steps: total optimizer steps in the checkpoint (including steps of an earlier, resumed run).
      loss: loss of the last step (from the checkpoint when this call had nothing left to train).
      log: the records (``{"step", "loss", "tok_s", "loss_kind"}``) written to ``out_dir/distill_log.jsonl`` by
        this call.
    """

    draft: CausalLM
    alpha_before: dict
    alpha_after: dict
    steps: int
    loss: float
    log: list


# --------------------------------------------------------------------------------------------- prompts


def read_prompts(path) -> list:
    """Prompts from a JSONL file: ``{"prompt": str | [ids]}`` or Spec-Bench style ``{"turns": [first, ...]}``
    (the first turn is used) per line; blank lines are skipped."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"prompts file {path} does not exist")
    out = []
    try:
        records = list(jsonl.iter_jsonl(path))
    except jsonl.LineError as err:
        raise ValueError(f"{path}: line {err.line} is {err.reason}") from None
    for lineno, record in records:
        if isinstance(record, dict) and "prompt" in record:
            prompt = record["prompt"]
        elif isinstance(record, dict) and isinstance(record.get("turns"), list) and record["turns"]:
            prompt = record["turns"][0]
        else:
            raise ValueError(f'{path}: line {lineno} has neither "prompt" nor a non-empty "turns" list')
        if not (isinstance(prompt, str) or (isinstance(prompt, list) and all(is_int(t) for t in prompt))):
            raise ValueError(f"{path}: line {lineno}: the prompt must be a string or a list of token ids")
        out.append(prompt)
    if not out:
        raise ValueError(f"prompts file {path} has no prompts")
    return out


def _prompt_ids(target: CausalLM, prompts, name: str) -> list[list[int]]:
    if isinstance(prompts, (str, os.PathLike)):
        prompts = read_prompts(prompts)
    if isinstance(prompts, np.ndarray):
        prompts = prompts.tolist()
    if not isinstance(prompts, (list, tuple)) or len(prompts) == 0:
        raise ValueError(f"{name} must be a non-empty list of strings or token-id lists, or a JSONL path")
    try:
        rows = tokenize(target, list(prompts))
    except ValueError as err:
        raise ValueError(f"{name}: {err}") from None
    for i, p in enumerate(rows):
        if not p:
            raise ValueError(f"{name}[{i}] is empty; every prompt needs at least one token")
        if not all(0 <= t < target.vocab_size for t in p):
            raise ValueError(f"{name}[{i}] has a token id outside the vocabulary [0, {target.vocab_size})")
    return rows


# --------------------------------------------------------------------------------------------- loss and step


@functools.cache
def train_step_fn(target: tuple[Callable, Callable], draft: tuple[Callable, Callable], kind: str):
    """Jitted ``(params, opt_state, target_params, tokens [B, T], mask [B, T], temperature, schedule [3]) ->
    (params, opt_state, loss)``: one ``optimizer`` step on the ``mask``-weighted mean of ``divergence(kind)``
    between the target's and the draft's next-token distributions at every position. ``target``/``draft`` =
    ``(apply_fn, init_cache)``; ``temperature`` (float32) and ``schedule`` = ``[learning_rate, warmup, steps]``
    (float32) are traced. Cached: repeated or resumed runs reuse the compiled step."""

    def loss_fn(params, target_params, tokens, mask, temperature):
        t_logits = jax.lax.stop_gradient(full_logits(*target, target_params, tokens))
        d = divergence(kind, t_logits, full_logits(*draft, params, tokens), temperature)
        return weighted_mean(d, mask)

    @jax.jit
    def step(params, opt_state, target_params, tokens, mask, temperature, schedule):
        return optimizer_step(
            loss_fn, optimizer(*schedule), params, opt_state, target_params, tokens, mask, temperature
        )

    return step


# --------------------------------------------------------------------------------------------- data


def _batch_at(
    target: CausalLM,
    draft: CausalLM,
    prompts: list[list[int]],
    step: int,
    *,
    seed: int,
    batch_size: int,
    on_policy: float,
    max_new_tokens: int,
    temperature: float,
    prompt_weight: float = 0.0,
):
    """``(tokens [B, T] int32, mask [B, T] float32)`` for ``step``: a pure function of (seed, step) and the
    models. Rows ``< round(on_policy * B)`` are continued by ``draft``, the rest by ``target``; ``mask`` is 1 at
    the positions whose next token was generated and ``prompt_weight`` at the positions inside the prompt that
    predict a prompt token. ``T`` is a power of two (>= 16): few train-step compiles."""
    rng = np.random.default_rng([seed, step])
    rows = [prompts[i] for i in rng.integers(0, len(prompts), size=batch_size)]
    gen_seed, draft_seed = (int(x) for x in rng.integers(0, 2**31, size=2))
    n_draft = int(round(on_policy * batch_size))
    eos = target.eos_token_id if target.eos_token_id is not None else ()
    kw: dict[str, Any] = dict(max_new_tokens=max_new_tokens, temperature=temperature, eos_token_id=eos)
    outs = []
    if n_draft:
        outs += generate(draft, rows[:n_draft], seed=draft_seed, **kw).tokens
    if n_draft < batch_size:
        outs += generate(target, rows[n_draft:], seed=gen_seed, **kw).tokens
    length = next_pow2(max(len(p) + len(o) for p, o in zip(rows, outs)), 16)
    tokens = np.zeros((batch_size, length), np.int32)
    mask = np.zeros((batch_size, length), np.float32)
    for b, (p, o) in enumerate(zip(rows, outs)):
        tokens[b, : len(p) + len(o)] = p + o
        mask[b, : len(p) - 1] = prompt_weight
        mask[b, len(p) - 1 : len(p) + len(o) - 1] = 1.0
    return tokens, mask


def measure_alpha(
    target: CausalLM, draft: CausalLM, prompts, *, gamma: int = 4, max_new_tokens: int = 64, seed: int = 0
) -> dict:
    """Acceptance rate α of ``draft`` for ``target`` on ``prompts``: greedy (temperature 0) and at temperature 1."""
    out = {}
    for name, temp in (("greedy", 0.0), ("t1", 1.0)):
        rate = generate(
            target, prompts, draft=draft, gamma=gamma, temperature=temp, max_new_tokens=max_new_tokens, seed=seed
        ).stats.acceptance_rate
        out[name] = float("nan") if rate is None else float(rate)
    return out


# --------------------------------------------------------------------------------------------- distill


def _check(
    target,
    draft,
    *,
    steps,
    batch_size,
    max_new_tokens,
    learning_rate,
    warmup,
    seed,
    loss,
    temperature,
    on_policy,
    gamma,
    checkpoint_every,
    log_every,
    prompt_weight=0.0,
):
    if not isinstance(target, CausalLM):
        raise TypeError(f"target must be a jaxspec.CausalLM, got {type(target).__name__}")
    if not isinstance(draft, CausalLM):
        raise TypeError(f"draft must be a jaxspec.CausalLM, got {type(draft).__name__}")
    if quant.format_of(draft.params) is not None:
        raise ValueError(
            f"draft {draft.name!r} has {quant.format_of(draft.params)} weights, which have no gradients: distill its "
            "float weights, then jaxspec.quantize the result (a quantized target is fine)"
        )
    if draft.vocab_size != target.vocab_size:
        raise ValueError(
            f"draft vocab_size ({draft.vocab_size}) != target vocab_size ({target.vocab_size}); "
            "draft and target must share one vocabulary"
        )
    if loss not in LOSSES:
        raise ValueError(f"loss must be one of {list(LOSSES)} (forward KL, reverse KL, total variation), got {loss!r}")
    if not is_real(on_policy) or not 0 <= on_policy <= 1:
        raise ValueError(f"on_policy must be a number in [0, 1], got {on_policy!r}")
    if not is_real(prompt_weight) or not np.isfinite(prompt_weight) or prompt_weight < 0:
        raise ValueError(f"prompt_weight must be a finite number >= 0, got {prompt_weight!r}")
    for name, value in (
        ("steps", steps),
        ("batch_size", batch_size),
        ("max_new_tokens", max_new_tokens),
        ("gamma", gamma),
        ("checkpoint_every", checkpoint_every),
        ("log_every", log_every),
    ):
        if not is_int(value) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    if not is_real(temperature) or not np.isfinite(temperature) or temperature <= 0:
        raise ValueError(
            f"temperature must be a finite number > 0 for distillation (the loss compares "
            f"temperature-warped distributions; 0 would be greedy, which has none), got {temperature!r}"
        )
    if not is_real(learning_rate) or not np.isfinite(learning_rate) or learning_rate <= 0:
        raise ValueError(f"learning_rate must be a finite number > 0, got {learning_rate!r}")
    if warmup is not None and (not is_int(warmup) or not 0 <= warmup <= steps):
        raise ValueError(f"warmup must be None or an int in [0, steps={steps}], got {warmup!r}")
    if not is_int(seed) or not 0 <= seed < 2**32:
        raise ValueError(f"seed must be an int in [0, 2**32), got {seed!r}")


def distill(
    target: CausalLM,
    draft: CausalLM,
    prompts,
    *,
    out_dir,
    steps: int = 200,
    batch_size: int = 8,
    max_new_tokens: int = 64,
    learning_rate: float = 1e-3,
    warmup: int | None = None,
    seed: int = 0,
    loss: str = "fkl",
    temperature: float = 1.0,
    on_policy: float = 0.0,
    heldout=None,
    gamma: int = 4,
    checkpoint_every: int = 50,
    log_every: int = 10,
    prompt_weight: float = 0.0,
    progress: bool = True,
) -> DistillResult:
    """Distill ``target`` into ``draft`` (see the module docstring); resumes from the latest checkpoint in ``out_dir``.

    Args:
      prompts: strings (needs ``target.tokenizer``), token-id lists, or a JSONL path (``read_prompts``).
      heldout: prompts for the α report (same forms); None holds out the last 10% of ``prompts`` (at least one),
        which are then not trained on.
      warmup: learning-rate warmup steps (then cosine decay to ``learning_rate / 10``); None: ``steps // 10``.
      loss: "fkl", "rkl" or "tvd", on distributions warped by ``temperature`` (> 0), which also samples the data.
      on_policy: fraction of each batch (rounded to whole rows) continued by the current draft.
      log_every: steps per record in ``out_dir/distill_log.jsonl`` (and ``result.log``).
      prompt_weight: loss weight of the positions inside the prompt (the target's distribution on the workload's
        own text; 0 trains on generated positions only). The prompt positions come at no generation cost, so a
        weight of 1 multiplies the signal per step when the prompts are long.
    Raises ``ValueError`` (or ``FileNotFoundError`` for a missing prompts file) before anything compiles.
    """
    _check(
        target,
        draft,
        steps=steps,
        batch_size=batch_size,
        max_new_tokens=max_new_tokens,
        learning_rate=learning_rate,
        warmup=warmup,
        seed=seed,
        loss=loss,
        temperature=temperature,
        on_policy=on_policy,
        gamma=gamma,
        checkpoint_every=checkpoint_every,
        log_every=log_every,
        prompt_weight=prompt_weight,
    )
    rows = _prompt_ids(target, prompts, "prompts")
    if heldout is None:
        if len(rows) < 2:
            raise ValueError(
                "prompts must hold at least 2 prompts when heldout=None (the last 10% are held "
                "out for the α report); pass heldout=... explicitly"
            )
        n_held = max(1, len(rows) // 10)
        rows, held = rows[:-n_held], rows[-n_held:]
    else:
        held = _prompt_ids(target, heldout, "heldout")
    warmup = steps // 10 if warmup is None else warmup

    out_dir = Path(out_dir).resolve()
    step_fn = train_step_fn((target.apply_fn, target.init_cache), (draft.apply_fn, draft.init_cache), loss)
    schedule = jnp.asarray([learning_rate, warmup, steps], jnp.float32)
    stacked = families.stack_layers(draft.params)  # trained stacked (nn.scan), returned in the draft's layout
    state = {"params": stacked, "opt_state": optimizer(*schedule).init(stacked), "loss": jnp.float32(jnp.nan)}
    with Checkpoints(out_dir) as checkpoints, tqdm(total=steps, disable=not progress, desc=f"distill ({loss})") as bar:
        state, start = checkpoints.restore(state, name="out_dir", what="this draft")
        bar.update(min(start, steps))
        alpha_before = measure_alpha(target, draft, held, gamma=gamma, max_new_tokens=max_new_tokens, seed=seed)
        params, opt_state, last = state["params"], state["opt_state"], state["loss"]
        log, tokens_seen, t0 = [], 0, time.perf_counter()
        temp = jnp.float32(temperature)
        for step in range(start, steps):
            tokens, mask = _batch_at(
                target,
                draft.replace(params=params),
                rows,
                step,
                seed=seed,
                batch_size=batch_size,
                on_policy=on_policy,
                max_new_tokens=max_new_tokens,
                temperature=temperature,
                prompt_weight=prompt_weight,
            )
            params, opt_state, last = step_fn(params, opt_state, target.params, tokens, mask, temp, schedule)
            tokens_seen += int((mask > 0).sum())
            done = step + 1
            if due(done, checkpoint_every, steps):
                checkpoints.save(done, {"params": params, "opt_state": opt_state, "loss": last})
            tok_s = tokens_seen / (time.perf_counter() - t0)
            bar.update(1)
            bar.set_postfix(loss=f"{float(last):.4f}", tok_s=f"{tok_s:.0f}")
            if due(done, log_every, steps):
                record = {"step": done, "loss": float(last), "tok_s": tok_s, "loss_kind": loss}
                log.append(record)
                append_jsonl(out_dir / LOG_FILE, record)
    new_draft = draft.replace(params=families.layout_like(params, draft.params))
    alpha_after = measure_alpha(target, new_draft, held, gamma=gamma, max_new_tokens=max_new_tokens, seed=seed)
    return DistillResult(new_draft, alpha_before, alpha_after, max(start, steps), float(last), log)
