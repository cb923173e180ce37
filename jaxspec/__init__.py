"""jaxspec: exact speculative decoding in JAX.

Public API: ``CausalLM`` (the model contract), ``generate`` and ``stream`` (plain or speculative decoding),
``models.llama`` (a built-in Llama-family decoder).
"""

from jaxspec.generate import (
    GenerationResult,
    NonFiniteLogitsError,
    RowStats,
    Stats,
    Stream,
    StreamStep,
    generate,
    stream,
)
from jaxspec.model import CausalLM
from jaxspec.models import llama

__all__ = [
    "CausalLM",
    "GenerationResult",
    "NonFiniteLogitsError",
    "RowStats",
    "Stats",
    "Stream",
    "StreamStep",
    "generate",
    "llama",
    "stream",
]
__version__ = "0.1.0"
