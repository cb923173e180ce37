"""Model configs and (target, draft) pair construction: ``random`` and ``aligned`` (see the package docstring)."""

from __future__ import annotations

import dataclasses

import numpy as np

from jaxspec.core.model import CausalLM
from jaxspec.models import llama


@dataclasses.dataclass(frozen=True)
class Pair:
    """A (target, draft) pair to benchmark.

    Attributes:
      name: ``"random"`` or ``"aligned"`` (the key in ``PAIRS``).
      target, draft: the two models (float32 Llama, random weights).
      description: one line for the report.
    """

    name: str
    target: CausalLM
    draft: CausalLM
    description: str


def target_config(args) -> llama.LlamaConfig:
    """The target: ``--vocab``, ``--hidden``, ``--target-layers``; MLP 4 × hidden, heads of 64 (hidden // 64 query
    heads, hidden // 128 KV heads, at least 1)."""
    return llama.LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=4 * args.hidden,
        num_layers=args.target_layers,
        num_heads=args.hidden // 64,
        num_kv_heads=max(1, args.hidden // 128),
    )


def draft_config(args) -> llama.LlamaConfig:
    """The draft: ``--draft-layers`` layers of the target's hidden size (so the aligned draft can use the target's
    embed and lm_head) with a narrow attention (4 query heads, 1 KV head, of 64) and MLP (hidden): its step is
    dominated by the ``[hidden, vocab]`` lm_head."""
    return llama.LlamaConfig(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.hidden,
        num_layers=args.draft_layers,
        num_heads=4,
        num_kv_heads=1,
        head_dim=64,
    )


def _scale_residual(params, scale: float):
    """Multiply every layer's residual-branch output projections (attn o_proj, mlp down_proj) by ``scale``."""
    layers = params["layers"]
    attn = dict(layers["attn"], o_proj={"kernel": layers["attn"]["o_proj"]["kernel"] * scale})
    mlp = dict(layers["mlp"], down_proj={"kernel": layers["mlp"]["down_proj"]["kernel"] * scale})
    return dict(params, layers=dict(layers, attn=attn, mlp=mlp))


def random_pair(args) -> Pair:
    """Target and draft with independent random weights (seeds ``--seed`` and ``--seed + 1``)."""
    target = llama.init(target_config(args), seed=args.seed, name="target")
    draft = llama.init(draft_config(args), seed=args.seed + 1, name="draft")
    return Pair("random", target, draft, "independent random weights (greedy α ≈ 0 expected)")


def aligned_pair(args) -> Pair:
    """A draft that agrees with the target most of the time: both models' ``o_proj`` and ``down_proj`` scaled by
    ``--residual-scale``, and the draft shares the target's ``embed``, ``final_norm`` and ``lm_head`` arrays."""
    tcfg, dcfg, s = target_config(args), draft_config(args), args.residual_scale
    tparams = _scale_residual(llama.init_params(tcfg, args.seed), s)
    dparams = _scale_residual(llama.init_params(dcfg, args.seed + 1), s)
    # the draft reads and writes through the target's own embedding, final norm and LM head (same arrays)
    dparams = dict(dparams, embed=tparams["embed"], final_norm=tparams["final_norm"], lm_head=tparams["lm_head"])
    target = llama.from_params(tcfg, tparams, name="target")
    draft = llama.from_params(dcfg, dparams, name="draft")
    desc = f"o_proj/down_proj x{s:g} in both; draft shares the target's embed, final_norm, lm_head"
    return Pair("aligned", target, draft, desc)


PAIRS = {"aligned": aligned_pair, "random": random_pair}


def build_pairs(args) -> list[Pair]:
    """The pair named by ``args.pair``, or every pair for ``both``."""
    kinds = list(PAIRS) if args.pair == "both" else [args.pair]
    return [PAIRS[k](args) for k in kinds]


def make_prompt(vocab_size: int, args) -> np.ndarray:
    """The benchmark prompt: ``args.prompt_len`` random tokens at batch 1, drawn from ``args.seed``."""
    rng = np.random.default_rng(args.seed)
    return rng.integers(0, vocab_size, (1, args.prompt_len)).astype(np.int32)
