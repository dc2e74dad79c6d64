"""fastdiff: faster Stable Diffusion inference for diffusers users.

Two levers that multiply:

* cheaper U-Net evaluations: :func:`optimize` (Winograd and fused
  GroupNorm+SiLU Triton kernels, attention backends) and :func:`compile_engine`
  (ONNX Runtime / TensorRT, with INT8 calibration);
* fewer U-Net evaluations: :func:`make_scheduler` (DDIM, DPM-Solver++, UniPC,
  LCM) and dynamic step control (:mod:`fastdiff.dynamic`, :func:`sample`).

Samplers, dynamic control, pipelines and engines load lazily on first use.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# Imported eagerly: the subpackage fastdiff.optimize shares its name with the
# function, and importing the subpackage would otherwise bind the module to
# `fastdiff.optimize`. After this line the name is the function for good.
from fastdiff.optimize import OptimizeConfig, optimize, report, restore  # noqa: E402

# public name -> module that defines it
_LAZY = {
    "make_scheduler": "fastdiff.samplers",
    "FastScheduler": "fastdiff.samplers",
    "fit_schedule": "fastdiff.samplers",
    "sample": "fastdiff.dynamic",
    "SampleResult": "fastdiff.dynamic",
    "StableDiffusionPipeline": "fastdiff.pipelines",
    "StableDiffusionImg2ImgPipeline": "fastdiff.pipelines",
    "StableDiffusionXLPipeline": "fastdiff.pipelines",
    "StableDiffusionXLImg2ImgPipeline": "fastdiff.pipelines",
    "compile_engine": "fastdiff.engines",
}

__all__ = ["__version__", "OptimizeConfig", "optimize", "report", "restore", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'fastdiff' has no attribute {name!r}")


def __dir__():
    return sorted(__all__)
