"""Shared tiny models. Weights use a larger init std than training would, so logits are well separated
(greedy comparisons are then about engine bookkeeping, not float ties)."""

import jax
import numpy as np
import pytest

from jaxspec.models import llama

VOCAB = 96


def tiny_config(**overrides) -> llama.LlamaConfig:
    base = dict(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
        init_std=0.15,
    )
    base.update(overrides)
    return llama.LlamaConfig(**base)


@pytest.fixture(scope="session")
def target():
    return llama.init(tiny_config(), seed=0, name="target")


@pytest.fixture(scope="session")
def unrelated_draft():
    return llama.init(tiny_config(), seed=1, name="unrelated")


@pytest.fixture(scope="session")
def small_draft():
    cfg = tiny_config(hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2, num_kv_heads=1)
    return llama.init(cfg, seed=2, name="small")


@pytest.fixture(scope="session")
def perturbed_draft(target):
    """The target plus noise: agrees often but not always (exercises ragged acceptance and rollback)."""
    leaves, treedef = jax.tree.flatten(target.params)
    rng = np.random.default_rng(3)
    noisy = [x + 0.008 * rng.standard_normal(x.shape).astype(x.dtype) for x in leaves]
    return target.replace(params=jax.tree.unflatten(treedef, noisy), name="perturbed")


@pytest.fixture(scope="session")
def mixed_prompts():
    rng = np.random.default_rng(0)
    return [rng.integers(0, VOCAB, size=int(rng.integers(1, 24))).tolist() for _ in range(21)]
