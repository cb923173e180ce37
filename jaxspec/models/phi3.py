"""Phi-3 (transformers' ``Phi3ForCausalLM``, ``model_type: "phi3"``): the Llama module, only a record.

Its math is Llama's: RMSNorm (w * y), RoPE (rotate-half), grouped-query attention without biases, SwiGLU, an
optional untied LM head, and a Mistral-style ``sliding_window`` when the config sets one. Only the checkpoint
layout differs: q/k/v are one ``qkv_proj`` and gate/up one ``gate_up_proj`` tensor, rows in that order, which the
weight table splits on import and concatenates on export. ``longrope`` configs (Phi-3 128k, Phi-3.5) load
(``jaxspec.models.rope``), and a partial rotary factor (Phi-4-mini: RoPE on the first 3/4 of each head).
"""

from __future__ import annotations

import dataclasses
import functools

from jaxspec.models import families, llama
from jaxspec.models.families import Weight
from jaxspec.models.llama_config import build_config, common_hf_config

# what a LlamaConfig must have to be a Phi-3 model
_PHI3 = dict(qkv_bias=False, o_bias=False, qk_norm=False, norm_offset=0.0, embed_scale=False, mlp_activation="silu")


def weights(cfg: llama.LlamaConfig) -> list[Weight]:
    """Llama's weight table with q/k/v and gate/up taken as rows of the fused tensors."""
    assert cfg.head_dim is not None  # LlamaConfig.__post_init__ sets it
    q, kv, mlp = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim, cfg.intermediate_size
    fused = {
        "q_proj": ("self_attn.qkv_proj", 0, q),
        "k_proj": ("self_attn.qkv_proj", q, q + kv),
        "v_proj": ("self_attn.qkv_proj", q + kv, q + 2 * kv),
        "gate_proj": ("mlp.gate_up_proj", 0, mlp),
        "up_proj": ("mlp.gate_up_proj", mlp, 2 * mlp),
    }
    out = []
    for w in llama.weights(cfg):
        if w.path[-1] == "kernel" and w.path[-2] in fused:
            hf, start, stop = fused[w.path[-2]]
            w = dataclasses.replace(w, hf=f"model.layers.{{i}}.{hf}.weight", rows=(start, stop))
        out.append(w)
    return out


def config_to_hf(cfg: llama.LlamaConfig, model_type: str | None = None) -> dict:
    """The transformers ``config.json`` dict of ``cfg`` as a ``"phi3"`` / ``Phi3ForCausalLM`` model (``model_type``
    is not read: this record only exports as Phi-3): the Llama-layout fields, ``sliding_window`` (None when unset),
    ``pad_token_id`` None, a partial rotary factor and LongRoPE's original length at the top level, where Phi-3
    reads them. Raises ``ValueError`` when ``cfg`` is not a Phi-3 model: biases, QK norm, a norm offset, scaled
    embeddings, an MLP activation other than SiLU, or a RoPE type transformers' Phi-3 does not take."""
    other = {k: getattr(cfg, k) for k, v in _PHI3.items() if getattr(cfg, k) != v}
    if cfg.rope_type not in ("default", "linear", "longrope", "yarn", "llama3"):
        other["rope_type"] = cfg.rope_type
    if other:
        raise ValueError(f"export_hf(model_type='phi3'): Phi-3 has {_PHI3}; this config has {other}")
    config = common_hf_config(cfg, "phi3", "Phi3ForCausalLM")
    original = dict(cfg.rope_params).get("original_max_position_embeddings")
    if original is not None:  # Phi3Config's own (4096) would take precedence over the RoPE parameters'
        config["original_max_position_embeddings"] = int(original)
    # Phi3Config's default pad_token_id (32000) is an embedding row: out of range for a smaller vocabulary
    return {**config, "sliding_window": cfg.sliding_window, "pad_token_id": None}


FAMILY = families.register(
    dataclasses.replace(
        llama.FAMILY,
        name="phi3",
        weights=weights,
        architectures={"phi3": "Phi3ForCausalLM"},
        config_from_hf=functools.partial(build_config, qkv_bias=False, o_bias=False, sliding=True, partial=True),
        config_to_hf=config_to_hf,
        layout_of="llama",
    )
)
