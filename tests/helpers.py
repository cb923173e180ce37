"""Test utilities shared by every test package: where the fixtures are; the suite's XLA flags; tiny model configs;
counting XLA compilations; tiny Hugging Face tokenizers; a model resized to another vocabulary size; chunked cached
decoding."""

import contextlib
import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.monitoring
import jax.numpy as jnp
import numpy as np

from jaxspec.core.acceptance import BlockVerifier
from jaxspec.loop import executables
from jaxspec.models import llama

ROOT = Path(__file__).resolve().parent.parent  # the repository
# The suite compiles hundreds of small programs whose run time is negligible, so compiling is most of its time:
# XLA:CPU's cheapest settings (no LLVM optimisation, no fusion emitters) halve it. What a program computes does not
# change (greedy comparisons and parity tolerances pass either way); programs users build (CLI, bench, notebooks
# run by hand) compile with XLA's defaults, and so do the tests that decode the real model for hundreds of tokens
# (the docs' examples, the notebooks), whose unoptimised programs would run 3x slower.
TEST_XLA_FLAGS = (
    "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true --xla_cpu_use_fusion_emitters=false"
)
FIXTURES_DIR = ROOT / "tests" / "fixtures"  # every test package's data
# LLVM's O1 instead of XLA's default O2 for the tests that decode the real model (run_optimised): on SmolLM2 they
# compile about a fifth faster and decode as fast (two prompts of 64 tokens, plain and with the head:
# docs/history/test-suite.md).
OPTIMISED_XLA_FLAGS = "--xla_backend_optimization_level=1"


def run_optimised(directory: Path, module: str, call: str, *args: str, timeout: int = 1200):
    """Run ``module.call(*args)`` (``module`` a file in ``directory``) in a Python process of its own whose programs
    are optimised (``OPTIMISED_XLA_FLAGS`` in place of the suite's ``TEST_XLA_FLAGS``), with the real model's layers
    stacked (``$JAXSPEC_LAYERS``: a third of the compile time at the same decoding speed on optimised programs) and
    eight simulated CPU devices, as the suite has. For the tests that decode the real model: unoptimised, its
    programs run 3 to 4 times slower than they compile faster. Returns the finished ``subprocess.CompletedProcess``
    (output captured as text)."""
    flags = os.environ.get("XLA_FLAGS", "")
    for flag in TEST_XLA_FLAGS.split():
        flags = flags.replace(flag, "")
    env = dict(os.environ, XLA_FLAGS=f"{flags} {OPTIMISED_XLA_FLAGS}".strip(), JAXSPEC_LAYERS="stacked")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    code = (
        "import sys, jax; jax.config.update('jax_num_cpu_devices', 8); sys.path.insert(0, sys.argv[1]); "
        f"import {module}; {module}.{call}(*sys.argv[2:])"
    )
    command = [sys.executable, "-c", code, str(directory), *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)


_BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"
_TRACE = "/jax/core/compile/jaxpr_trace_duration"


# Releases of compiled programs for memory-map pressure (jaxspec.loop.executables.make_room): the library's threshold
# acts between tests; within a test a release waits until HELD_HIGH of the limit (tests/conftest.py says why).
RELEASE_HIGH = executables.HIGH
HELD_HIGH = 0.9


@contextlib.contextmanager
def count_compiles():
    """Counts backend compilations and traces inside the block: ``with count_compiles() as c: ...; c["compiles"]``."""
    counts = {"compiles": 0, "traces": 0}

    def listener(name, duration, **kwargs):
        if name == _BACKEND_COMPILE:
            counts["compiles"] += 1
        elif name == _TRACE:
            counts["traces"] += 1

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield counts
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)


def tiny_hf_tokenizer(text: str = "def f(x): return x + 1\n", vocab_size: int = 64):
    """A byte-level BPE ``PreTrainedTokenizerFast`` trained on ``text`` (ids < vocab_size), EOS ``<eos>``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<eos>"], show_progress=False, initial_alphabet=[]
    )
    tok.train_from_iterator([text] * 50, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")


def five_token_tokenizer():
    """A byte-level BPE ``PreTrainedTokenizerFast`` of exactly five ids: ``a`` 0, ``b`` 1, ``c`` 2, ``ab`` 3 and
    the special ``</s>`` 4 (its EOS), for constraints over the exactness tests' 5-token models."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"a": 0, "b": 1, "c": 2, "ab": 3, "</s>": 4}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[("a", "b")]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>")


VOCAB = 96
SMALL_DRAFT = dict(hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2, num_kv_heads=1)


def tiny_config(**overrides) -> llama.LlamaConfig:
    base = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        init_std=0.15,
    )
    base.update(overrides)
    return llama.LlamaConfig(**base)


def resized(model, vocab: int):
    """``model`` with ``vocab`` rows in its embedding and LM head (cut, or padded with random rows): a family's
    smaller or larger padded table."""
    rng = np.random.default_rng(vocab)
    params = dict(model.params)

    def fit(x, axis):
        have = x.shape[axis]
        if vocab <= have:
            return jnp.take(x, jnp.arange(vocab), axis=axis)
        shape = list(x.shape)
        shape[axis] = vocab - have
        return jnp.concatenate([x, jnp.asarray(0.15 * rng.standard_normal(shape), x.dtype)], axis=axis)

    params["embed"] = {"embedding": fit(params["embed"]["embedding"], 0)}
    params["lm_head"] = {"kernel": fit(params["lm_head"]["kernel"], 1)}
    return llama.init(tiny_config(vocab_size=vocab), seed=0).replace(params=params, name=f"{model.name}-{vocab}")


def decode_in_chunks(model, tokens, prompt_lens, chunk):
    """Prefill each row's prompt, then feed the rest ``chunk`` tokens at a time at per-row positions."""
    batch, total = tokens.shape
    cache = model.init_cache(batch, total + chunk)
    apply = jax.jit(model.apply_fn)
    plen = max(prompt_lens)
    positions = np.broadcast_to(np.arange(plen), (batch, plen))
    logits, cache = apply(model.params, jnp.asarray(tokens[:, :plen]), jnp.asarray(positions), cache)
    out = np.zeros((batch, total, model.vocab_size), np.float32)
    for b, n in enumerate(prompt_lens):
        out[b, :n] = logits[b, :n]
    start = np.asarray(prompt_lens)
    while (start < total).any():
        pos = np.minimum(start[:, None] + np.arange(chunk)[None], total - 1)
        logits, cache = apply(model.params, jnp.asarray(np.take_along_axis(tokens, pos, 1)), jnp.asarray(pos), cache)
        for b in range(batch):
            for j in range(chunk):
                if start[b] + j < total:
                    out[b, start[b] + j] = logits[b, j]
        start = start + chunk
    return out


def check_window_logits_at_last_only(apply_fn, init_cache, params, feats_width: int, vocab_size: int):
    """An EAGLE head's ``last_only`` pass (drafting's window) gives the last position's logits as the whole pass gives
    them, and the same hidden states and cache; the other positions' logits differ (control)."""
    tokens, positions = jnp.asarray([[4, 7, 9, 30]]), jnp.arange(4)[None]
    feats = jax.random.normal(jax.random.key(5), (1, 4, feats_width))
    full, x, cache = apply_fn(params, tokens, feats, positions, init_cache(1, 8))
    last, x1, cache1 = apply_fn(params, tokens, feats, positions, init_cache(1, 8), last_only=True)
    assert last.shape == (1, 1, vocab_size)
    np.testing.assert_allclose(np.asarray(last), np.asarray(full[:, -1:]), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(x1), np.asarray(x))
    np.testing.assert_array_equal(np.asarray(cache1.k), np.asarray(cache.k))
    finite = np.isfinite(np.asarray(full[0, 0]))
    assert not np.allclose(np.asarray(last[0, 0])[finite], np.asarray(full[0, 0])[finite])


@dataclasses.dataclass(frozen=True)
class PrefixRatioOnly(BlockVerifier):
    """A wrong block rule, the negative control of block verification's tests: a prefix stops with the probability of
    its ratio alone (``h_i = w_i``), the residual's mass left out; plausible-looking, and not the target's
    distribution."""

    def stop_probabilities(self, weight, mass):
        return weight
