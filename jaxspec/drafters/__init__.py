"""Drafters: what proposes each round's draft tokens. ``base`` holds the protocol the loop calls (``Drafter``,
``Proposal``, ``NoDraft``); each other module is one drafter: ``draft_model`` (a draft ``CausalLM``), ``lookup``
(prompt lookup and ``LookupFirst``), ``eagle`` (EAGLE heads over the target's hidden states).

A new drafter is one module here: a frozen-dataclass subclass of ``Drafter`` implementing ``draft`` (and, if it
keeps state, ``init_state`` and ``prefill``). The loop never asks which drafter it runs.
"""

from jaxspec.drafters.base import Drafter, NoDraft, Proposal
from jaxspec.drafters.draft_model import ModelDrafter
from jaxspec.drafters.lookup import LookupFirst, PromptLookup

__all__ = ["Drafter", "LookupFirst", "ModelDrafter", "NoDraft", "PromptLookup", "Proposal"]
