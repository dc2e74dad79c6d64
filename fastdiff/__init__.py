"""fastdiff: faster Stable Diffusion inference for diffusers users.

Two levers that multiply:

* cheaper U-Net evaluations: :func:`optimize` (Winograd and fused
  GroupNorm+SiLU Triton kernels, attention backends) and :func:`compile_engine`
  (ONNX Runtime / TensorRT, with INT8 calibration);
* fewer U-Net evaluations: :func:`make_scheduler` (DDIM, DPM-Solver++, UniPC,
  LCM) and dynamic step control (:func:`sample` with :class:`EarlyStop`, the
  drop-in pipelines).

Everything loads on first use: ``import fastdiff`` imports neither torch nor
diffusers, and ``fastdiff.tiny``, ``fastdiff.engines`` and the other
subpackages are reachable as attributes without importing them first.
"""

from fastdiff import _lazy

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS = {
    # cheaper evaluations
    "optimize": "fastdiff.optimize.core",
    "report": "fastdiff.optimize.core",
    "restore": "fastdiff.optimize.core",
    "OptimizeConfig": "fastdiff.optimize.config",
    "compile_engine": "fastdiff.engines",
    "calibrate": "fastdiff.engines",
    # fewer evaluations
    "make_scheduler": "fastdiff.samplers",
    "FastScheduler": "fastdiff.samplers",
    "fit_schedule": "fastdiff.samplers",
    "AdaptiveScheduler": "fastdiff.samplers",
    "step_cache": "fastdiff.caching",
    "sample": "fastdiff.dynamic",
    "resume": "fastdiff.dynamic",
    "draft_and_refine": "fastdiff.dynamic",
    "Controller": "fastdiff.dynamic",
    "StepPlanner": "fastdiff.dynamic",
    "SampleResult": "fastdiff.dynamic",
    "Decision": "fastdiff.dynamic",
    "EarlyStop": "fastdiff.dynamic",
    "FastForward": "fastdiff.dynamic",
    "AutoSteps": "fastdiff.dynamic",
    # drop-in pipelines
    "StableDiffusionPipeline": "fastdiff.pipelines",
    "StableDiffusionImg2ImgPipeline": "fastdiff.pipelines",
    "StableDiffusionXLPipeline": "fastdiff.pipelines",
    "StableDiffusionXLImg2ImgPipeline": "fastdiff.pipelines",
}

_SUBMODULES = (
    "caching",
    "dynamic",
    "engines",
    "installed",
    "kernels",
    "metrics",
    "nn",
    "ops",
    "pipelines",
    "samplers",
    "sweep",  # callable: fastdiff.sweep(spec, out_dir) runs fastdiff.sweep.sweep
    "testing",
    "tiny",
)

__all__ = ["__version__", *_EXPORTS]

# The subpackage fastdiff.optimize shares its name with the function. Import
# the (light) package now so that no later submodule import rebinds
# `fastdiff.optimize` to the module, then drop the module binding so the name
# resolves to the function through __getattr__.
import fastdiff.optimize  # noqa: E402, F401

del optimize  # noqa: F821 - bound by the import system just above
# the same import bound the package to its own name: no `fastdiff.fastdiff` in dir() / completion
del fastdiff

__getattr__, __dir__ = _lazy.attach(__name__, globals(), _EXPORTS, _SUBMODULES)
