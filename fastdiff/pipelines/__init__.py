"""Drop-in diffusers pipelines with fastdiff's dynamic step control.

``fastdiff.StableDiffusionPipeline.from_pretrained(...)`` (or ``.from_pipe(pipe)``) behaves exactly like
diffusers' class and adds the call keywords ``steps``, ``early_stop``, ``draft`` and ``preview_steps``, a
``refine()`` method and a ``fastdiff`` record on every output.

Map: keywords are validated and planned in :mod:`~fastdiff.pipelines.plan` (add a keyword there), diffusers'
prepared inputs are captured in :mod:`~fastdiff.pipelines.capture`, the mixin in ``_mixin`` runs the plan
with :mod:`fastdiff.dynamic`, records are in :mod:`~fastdiff.pipelines.records`, and a new pipeline family is
a subclass of the mixin and the diffusers class with a ``_fastdiff_decode`` (see ``stable_diffusion.py``).
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
