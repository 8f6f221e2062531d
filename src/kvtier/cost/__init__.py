"""The cost model: prefill/decode seconds, reload seconds per tier, break-even prefix length.

Measured calibration lives in ``kvtier.cost.calibration`` (imported on its own).
"""

from kvtier.cost.compute import DEFAULT_MBU, DEFAULT_MFU, ComputeModel, RooflineCompute
from kvtier.cost.model import DEFAULT_MAX_TOKENS, Comparison, CostModel
from kvtier.cost.transfer import DEFAULT_LOAD_OVERHEADS, LoadOverheads, TransferPath

__all__ = [
    "DEFAULT_LOAD_OVERHEADS",
    "DEFAULT_MAX_TOKENS",
    "DEFAULT_MBU",
    "DEFAULT_MFU",
    "Comparison",
    "ComputeModel",
    "CostModel",
    "LoadOverheads",
    "RooflineCompute",
    "TransferPath",
]
