"""jaxspec: exact speculative decoding in JAX.

Public API: ``CausalLM`` (the model contract), ``generate`` and ``stream`` (plain or speculative decoding),
``Engine`` (continuous batching over many requests, results yielded as rows finish), ``Drafter`` (the drafter
protocol; ``PromptLookup`` is one; ``eagle.EagleDrafter`` drafts from the target's hidden states; ``LookupFirst``
copies where prompt lookup matches and drafts with another drafter elsewhere),
``models.llama`` (a built-in Llama-family decoder), ``load`` (jaxspec orbax checkpoints and Hugging Face
safetensors directories), ``save`` (orbax) and ``export_hf``; ``sharding`` (meshes, ``shard``, ``plan``) and
``multihost`` (``share_prompts``) for generation across devices and processes; ``enable_compilation_cache`` (compiled
programs kept on disk for later processes).
"""

import os as _os

# jaxspec uses transformers for tokenizers only: its "PyTorch was not found" advice is noise here.
_os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

from jaxspec import eagle, multihost, policy, sharding
from jaxspec.checkpoint import load, save  # noqa: E402
from jaxspec.compile_cache import enable_compilation_cache
from jaxspec.distill import distill
from jaxspec.drafters import Drafter, LookupFirst, PromptLookup
from jaxspec.engine import Engine, EngineStats, RowResult  # noqa: E402
from jaxspec.generate import Stream, generate, stream  # noqa: E402
from jaxspec.hf_export import export_hf
from jaxspec.model import CausalLM
from jaxspec.models import llama
from jaxspec.results import GenerationResult, NonFiniteLogitsError, RowStats, Stats, StreamStep
from jaxspec.sharding import shard

__all__ = [
    "CausalLM",
    "Drafter",
    "Engine",
    "EngineStats",
    "GenerationResult",
    "LookupFirst",
    "NonFiniteLogitsError",
    "PromptLookup",
    "RowResult",
    "RowStats",
    "Stats",
    "Stream",
    "StreamStep",
    "distill",
    "eagle",
    "enable_compilation_cache",
    "export_hf",
    "generate",
    "llama",
    "load",
    "multihost",
    "policy",
    "save",
    "shard",
    "sharding",
    "stream",
]
__version__ = "0.1.0"
