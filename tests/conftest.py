"""Shared tiny models. Weights use a larger init std than training would, so logits are well separated
(greedy comparisons are then about engine bookkeeping, not float ties)."""

import jax

# Eight simulated CPU devices for the mesh tests (must precede any use of the backend; no effect elsewhere).
jax.config.update("jax_num_cpu_devices", 8)

# No persistent compilation cache shared by the xdist workers any more: with layers held split (larger programs),
# two full-suite runs each crashed a worker inside jax's cache write / compile-and-write path (a segfault in
# put_executable_and_time, an abort in backend_compile_and_load), both in tests/test_shipped.py.

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from helpers import SMALL_DRAFT, VOCAB, tiny_config  # noqa: E402,F401  (tests import VOCAB/tiny_config from here)

from jaxspec.models import llama  # noqa: E402


@pytest.fixture(scope="session")
def target():
    return llama.init(tiny_config(), seed=0, name="target")


@pytest.fixture(scope="session")
def unrelated_draft():
    return llama.init(tiny_config(), seed=1, name="unrelated")


@pytest.fixture(scope="session")
def small_draft():
    return llama.init(tiny_config(**SMALL_DRAFT), seed=2, name="small")


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
