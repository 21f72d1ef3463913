"""2.0 import path `speedtronic.distributed.outer`: speedtronic_diloco's outer loop."""

from __future__ import annotations

from speedtronic_diloco.outer import LOGGER, MasterOuterLoop, NesterovOuterOptimizer, OuterState

__all__ = [
    "LOGGER",
    "MasterOuterLoop",
    "NesterovOuterOptimizer",
    "OuterState",
]
