"""fastdiff: faster Stable Diffusion inference for diffusers users.

Two levers that multiply:

* cheaper U-Net evaluations: :func:`optimize` (Winograd and fused
  GroupNorm+SiLU Triton kernels, attention backends) and :func:`compile_engine`
  (ONNX Runtime / TensorRT, with INT8 calibration);
* fewer U-Net evaluations: :func:`make_scheduler` (DDIM, DPM-Solver++, UniPC,
  LCM) and dynamic step control (:mod:`fastdiff.dynamic`, :func:`sample`).

Heavy submodules load lazily, so ``import fastdiff`` stays cheap.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# public name -> module that defines it
_LAZY = {
    "optimize": "fastdiff.optimize",
    "OptimizeConfig": "fastdiff.optimize",
    "report": "fastdiff.optimize",
    "restore": "fastdiff.optimize",
    "make_scheduler": "fastdiff.samplers",
    "sample": "fastdiff.dynamic",
    "SampleResult": "fastdiff.dynamic",
    "StableDiffusionPipeline": "fastdiff.pipelines",
    "StableDiffusionImg2ImgPipeline": "fastdiff.pipelines",
    "StableDiffusionXLPipeline": "fastdiff.pipelines",
    "StableDiffusionXLImg2ImgPipeline": "fastdiff.pipelines",
    "compile_engine": "fastdiff.engines",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'fastdiff' has no attribute {name!r}")


def __dir__():
    return sorted(__all__)
