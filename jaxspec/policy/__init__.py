"""Automatic γ (``generate(..., gamma="auto")``), in four modules:

  * ``cost``: the pure cost model: ``Costs``, ``Decision``, ``expected_tokens``, ``expected_speedup``, ``round_costs``,
    ``GAMMAS``;
  * ``timing``: the measured inputs: ``time_step``, ``time_rounds``, ``measure_costs``;
  * ``auto``: the policy, ``AutoGamma``, with its running acceptance estimates;
  * ``store``: measured costs kept on disk across processes (``AutoGamma(keep_costs=...)``).

``DEFAULT`` is the process-wide ``AutoGamma`` that ``generate`` uses unless given ``policy=``.
"""

from jaxspec.policy.auto import Acceptance, AutoGamma, BatchState
from jaxspec.policy.cost import GAMMAS, Costs, Decision, expected_speedup, expected_tokens, round_costs
from jaxspec.policy.timing import measure_costs, time_rounds, time_step

__all__ = [
    "DEFAULT",
    "GAMMAS",
    "Acceptance",
    "AutoGamma",
    "BatchState",
    "Costs",
    "Decision",
    "expected_speedup",
    "expected_tokens",
    "measure_costs",
    "round_costs",
    "time_rounds",
    "time_step",
]

DEFAULT = AutoGamma()
