"""Speedtronic optimizers: Muon, Muon+, cautious wrapping, hybrid routing and LR schedules."""

from __future__ import annotations

from speedtronic_optim.__about__ import __version__
from speedtronic_optim.adamw import make_adamw
from speedtronic_optim.build import build_optimizer
from speedtronic_optim.cautious import CautiousOptimizer
from speedtronic_optim.hybrid import HybridOptimizer
from speedtronic_optim.muon import Muon
from speedtronic_optim.newton_schulz import (
    COEFFICIENT_SETS,
    fast_work_dtype,
    newton_schulz,
    post_polar_normalize,
)
from speedtronic_optim.routing import ParameterRouting, route_parameters
from speedtronic_optim.schedules import (
    build_lr_scheduler,
    lr_lambda,
    warmup_constant,
    warmup_cosine,
    warmup_stable_decay,
)

__all__ = [
    "COEFFICIENT_SETS",
    "CautiousOptimizer",
    "HybridOptimizer",
    "Muon",
    "ParameterRouting",
    "__version__",
    "build_lr_scheduler",
    "build_optimizer",
    "fast_work_dtype",
    "lr_lambda",
    "make_adamw",
    "newton_schulz",
    "post_polar_normalize",
    "route_parameters",
    "warmup_constant",
    "warmup_cosine",
    "warmup_stable_decay",
]
