"""Check that transformers loads directories written by ``jaxspec.export_hf`` and gives the same logits.

Needs torch, so it is not part of the test suite; run it with the fixture venv:
    python scripts/check_export.py export DIR        # (jaxspec env) write variants + expected logits under DIR
    /tmp/torchvenv/bin/python scripts/check_export.py verify DIR   # (torch env) load each with transformers
"""

import json
import sys
from pathlib import Path

import numpy as np


def export(root: Path) -> None:
    import jax

    from jaxspec.formats.hf_export import export_hf
    from jaxspec.models import llama

    base = dict(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2, init_std=0.2
    )
    variants = {
        "llama3_tied_bias": dict(
            tie_embeddings=True,
            qkv_bias=True,
            o_bias=True,
            rope_type="llama3",
            rope_params={
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16,
            },
        ),
        "qwen2": dict(qkv_bias=True, tie_embeddings=True),
        "qwen3": dict(qk_norm=True, head_dim=16, num_kv_heads=1),
        "mistral": dict(sliding_window=8),
        "linear": dict(rope_type="linear", rope_params={"factor": 4.0}),
        "phi3": dict(sliding_window=8),  # written with model_type="phi3": fused qkv_proj / gate_up_proj
    }
    ids = (np.arange(40).reshape(1, 40) * 7) % 64
    for name, extra in variants.items():
        model = llama.init(llama.LlamaConfig(**{**base, **extra}), seed=1, eos_token_id=2)
        leaves, tree = jax.tree.flatten(model.params)
        rng = np.random.default_rng(0)
        model = model.replace(
            params=jax.tree.unflatten(
                tree, [np.asarray(x) + rng.normal(0, 0.1, x.shape).astype(x.dtype) for x in leaves]
            )
        )
        export_hf(model, root / name, model_type="phi3" if name == "phi3" else None)
        np.savez(root / name / "jaxspec_logits.npz", ids=ids, logits=np.asarray(model.logits(ids)))


def verify(root: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    for d in sorted(p for p in root.iterdir() if p.is_dir()):
        ref = np.load(d / "jaxspec_logits.npz")
        model = AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32)
        with torch.no_grad():
            out = model(torch.tensor(ref["ids"])).logits.numpy()
        diff = float(np.abs(out - ref["logits"]).max())
        print(json.dumps({"variant": d.name, "class": type(model).__name__, "max_abs_diff": diff}))
        assert diff < 1e-4, d.name


if __name__ == "__main__":
    {"export": export, "verify": verify}[sys.argv[1]](Path(sys.argv[2]))
