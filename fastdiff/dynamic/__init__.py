"""Dynamic step control: spend U-Net evaluations only where the image needs them.

* :func:`sample` / :func:`resume`: the sampling loop with per-sample control, x0 tracking and pause/resume
  (:mod:`~fastdiff.dynamic.loop`); results in :mod:`~fastdiff.dynamic.records`.
* Extension points (:mod:`~fastdiff.dynamic.protocols`): a :class:`Controller` returns a :class:`Decision`
  per row and step: continue, stop (:class:`EarlyStop`) or jump to a shorter finish (:class:`FastForward`);
  a :class:`StepPlanner` picks each row's step count (:class:`AutoSteps`). Error-controlled step size is a
  self-scheduling scheduler (:class:`fastdiff.samplers.AdaptiveScheduler`), driven by the same loop.
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
from fastdiff.dynamic.controllers import EarlyStop, FastForward
from fastdiff.dynamic.draft import draft_and_refine
from fastdiff.dynamic.guidance import GuidedUNet, cfg_model_fn
from fastdiff.dynamic.loop import SampleState, resume, sample
from fastdiff.dynamic.presets import PRESETS
from fastdiff.dynamic.protocols import Controller, Decision, StepChoice, StepPlanner
from fastdiff.dynamic.records import SampleResult, StepRecord

__all__ = [
    "AutoSteps",
    "Controller",
    "Decision",
    "EarlyStop",
    "FastForward",
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
