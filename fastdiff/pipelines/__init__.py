"""Drop-in diffusers pipelines with fastdiff's dynamic step control.

``fastdiff.StableDiffusionPipeline.from_pretrained(...)`` (or ``.from_pipe(pipe)``) behaves exactly like
diffusers' class and adds the call keywords ``steps``, ``early_stop``, ``draft`` and ``preview_steps``, a
``refine()`` method and a ``fastdiff`` record on every output.
"""

from fastdiff.pipelines._mixin import FastdiffPipelineMixin
from fastdiff.pipelines.records import FastdiffRecord, RefineState
from fastdiff.pipelines.stable_diffusion import StableDiffusionImg2ImgPipeline, StableDiffusionPipeline
from fastdiff.pipelines.stable_diffusion_xl import StableDiffusionXLImg2ImgPipeline, StableDiffusionXLPipeline

__all__ = [
    "FastdiffPipelineMixin",
    "FastdiffRecord",
    "RefineState",
    "StableDiffusionImg2ImgPipeline",
    "StableDiffusionPipeline",
    "StableDiffusionXLImg2ImgPipeline",
    "StableDiffusionXLPipeline",
]
