"""Dynamic step control: spend U-Net evaluations only where the image needs them.

* :func:`sample` / :func:`resume`: the sampling loop with per-sample control, x0 tracking and pause/resume
  (:mod:`~fastdiff.dynamic.loop`); results in :mod:`~fastdiff.dynamic.records`.
* Extension points (:mod:`~fastdiff.dynamic.protocols`): a :class:`Controller` retires rows
  (:class:`EarlyStop`), a :class:`StepPlanner` picks each row's step count (:class:`AutoSteps`).
* Schedulers are driven through :mod:`~fastdiff.dynamic.adapters` (any diffusers-compatible scheduler).
* :func:`draft_and_refine`: LCM draft, re-noise, finish with the main model (SDEdit-style).
* :func:`cfg_model_fn` / :class:`GuidedUNet`: model functions with classifier-free guidance.
* :data:`PRESETS`: "fast" / "balanced" / "quality" step counts of fastdiff's default sampler.

Where to add things: a stopping rule is a :class:`Controller`; a step-count policy is a
:class:`StepPlanner`; a scheduler that needs special handling implements
:class:`~fastdiff.dynamic.adapters.VPCoefficients` or is handled in
:class:`~fastdiff.dynamic.adapters.SchedulerAdapter`.
"""

from fastdiff.dynamic.auto_steps import AutoSteps
from fastdiff.dynamic.controllers import EarlyStop
from fastdiff.dynamic.draft import draft_and_refine
from fastdiff.dynamic.guidance import GuidedUNet, cfg_model_fn
from fastdiff.dynamic.loop import SampleState, resume, sample
from fastdiff.dynamic.presets import PRESETS
from fastdiff.dynamic.protocols import Controller, StepChoice, StepPlanner
from fastdiff.dynamic.records import SampleResult, StepRecord

__all__ = [
    "AutoSteps",
    "Controller",
    "EarlyStop",
    "GuidedUNet",
    "PRESETS",
    "SampleResult",
    "SampleState",
    "StepChoice",
    "StepPlanner",
    "StepRecord",
    "cfg_model_fn",
    "draft_and_refine",
    "resume",
    "sample",
]
