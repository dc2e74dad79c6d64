"""Dynamic step control: spend U-Net evaluations only where the image needs them.

* :func:`sample` / :func:`resume`: the sampling loop with per-sample control, x0 tracking and pause/resume.
* :class:`EarlyStop`: stop each sample once its x0 prediction has converged.
* :class:`AutoSteps`: choose each sample's step count from its prompt and a probe.
* :data:`PRESETS`: "fast" / "balanced" / "quality" = 10 / 20 / 30 steps of DPM-Solver++(2M).
* :func:`cfg_model_fn` / :class:`GuidedUNet`: model functions with classifier-free guidance.
* :func:`draft_and_refine`: LCM draft, re-noise, finish with the main model (SDEdit-style).
"""

from fastdiff.dynamic.auto_steps import AutoSteps, StepChoice, high_frequency_energy, prompt_tier
from fastdiff.dynamic.controllers import Controller, EarlyStop
from fastdiff.dynamic.draft import draft_and_refine, renoise
from fastdiff.dynamic.guidance import GuidedUNet, cfg_model_fn, rescale_guidance, slice_rows
from fastdiff.dynamic.loop import SampleResult, SampleState, StepRecord, predicted_x0, resume, sample
from fastdiff.dynamic.presets import DEFAULT_SAMPLER, PRESETS, default_scheduler, resolve_steps

__all__ = [
    "AutoSteps",
    "Controller",
    "DEFAULT_SAMPLER",
    "EarlyStop",
    "GuidedUNet",
    "PRESETS",
    "SampleResult",
    "SampleState",
    "StepChoice",
    "StepRecord",
    "cfg_model_fn",
    "default_scheduler",
    "draft_and_refine",
    "high_frequency_energy",
    "predicted_x0",
    "prompt_tier",
    "renoise",
    "rescale_guidance",
    "resolve_steps",
    "resume",
    "sample",
    "slice_rows",
]
