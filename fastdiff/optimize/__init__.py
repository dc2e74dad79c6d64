"""One-call optimisation of diffusers UNets: :func:`optimize`, :func:`report`, :func:`restore`."""

from fastdiff.optimize.config import OptimizeConfig
from fastdiff.optimize.context import PassContext
from fastdiff.optimize.core import optimize, report, restore
from fastdiff.optimize.report import OptimizeReport, PassReport, Verification

__all__ = [
    "OptimizeConfig",
    "OptimizeReport",
    "PassContext",
    "PassReport",
    "Verification",
    "optimize",
    "report",
    "restore",
]
