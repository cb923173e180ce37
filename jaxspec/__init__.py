"""jaxspec: exact speculative decoding in JAX.

The public API, by the order data flows through it:

  * models: ``CausalLM`` (the model contract), ``load`` (a named model, a jaxspec checkpoint, a Hugging Face
    directory or Hub id, a GGUF file), ``save``, ``export_hf``, ``quantize`` (int8 weights), ``llama`` (a built-in
    Llama-family decoder);
  * drafters: ``Drafter`` (the protocol), ``PromptLookup``, ``LookupFirst`` and ``eagle`` (EAGLE heads over the
    target's hidden states); a draft ``CausalLM`` drafts as it is;
  * generation: ``generate`` and ``stream`` (plain or speculative decoding) with their settings,
    ``GenerationConfig``; structured output (``JsonSchema``, ``Regex``, ``Choice``: ``constraint=``); ``Engine``
    (continuous batching over many requests, results yielded as rows finish); ``policy`` (``gamma="auto"``);
    results ``GenerationResult``, ``Stats``, ``RowStats``, ``StreamStep``;
  * placement: ``sharding`` (meshes, ``shard``, ``plan``) and ``multihost`` (``share_prompts``);
    ``enable_compilation_cache`` (compiled programs kept on disk for later processes);
  * training: ``distill`` (a draft model toward a target).

The packages below hold the implementation, each importing only those before it: ``core``, ``parallel``,
``models``, ``formats``, ``drafters``, ``loop``, ``policy``, ``generation``, ``training``, then ``bench`` and
``cli``.
"""

import os as _os

# jaxspec uses transformers for tokenizers only: its "PyTorch was not found" advice is noise here.
_os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

from jaxspec import policy  # noqa: E402
from jaxspec.core.model import CausalLM  # noqa: E402
from jaxspec.drafters import Drafter, LookupFirst, PromptLookup, eagle  # noqa: E402
from jaxspec.formats.hf_export import export_hf  # noqa: E402
from jaxspec.formats.loader import load  # noqa: E402
from jaxspec.formats.orbax import save  # noqa: E402
from jaxspec.generation.config import GenerationConfig  # noqa: E402
from jaxspec.generation.constraints import Choice, JsonSchema, Regex  # noqa: E402
from jaxspec.generation.engine import Engine, EngineStats, RowResult  # noqa: E402
from jaxspec.generation.generate import Stream, generate, stream  # noqa: E402
from jaxspec.generation.results import GenerationResult, NonFiniteLogitsError, RowStats, Stats, StreamStep  # noqa: E402
from jaxspec.loop.compile_cache import enable_compilation_cache  # noqa: E402
from jaxspec.models import llama  # noqa: E402
from jaxspec.models.quant import quantize  # noqa: E402
from jaxspec.parallel import multihost, sharding  # noqa: E402
from jaxspec.parallel.sharding import shard  # noqa: E402
from jaxspec.training.distill import distill  # noqa: E402
from jaxspec.version import __version__  # noqa: E402

__all__ = [
    "__version__",
    "CausalLM",
    "Choice",
    "Drafter",
    "Engine",
    "EngineStats",
    "GenerationConfig",
    "GenerationResult",
    "JsonSchema",
    "LookupFirst",
    "NonFiniteLogitsError",
    "PromptLookup",
    "Regex",
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
    "quantize",
    "save",
    "shard",
    "sharding",
    "stream",
]
