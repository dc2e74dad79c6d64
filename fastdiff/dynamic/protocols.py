"""The two extension points of :func:`fastdiff.dynamic.sample`: controllers and step planners.

* A :class:`Controller` decides, after every step of a row, whether that row has done enough work
  (e.g. :class:`~fastdiff.dynamic.EarlyStop`). A retired row returns its x0 prediction and leaves the batch.
* A :class:`StepPlanner` chooses each row's schedule length after a short probe (e.g.
  :class:`~fastdiff.dynamic.AutoSteps`): the loop runs ``probe_steps`` steps of a ``probe_schedule``-step
  schedule, hands the x0 prediction to :meth:`StepPlanner.choose` and continues every row on its chosen
  schedule (the probe's steps are kept when the choice equals the probe schedule).

To add one, subclass the protocol (or just implement its methods) and pass it as ``controller=`` or
``num_inference_steps=``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

__all__ = ["Controller", "StepPlanner", "StepChoice"]


@runtime_checkable
class Controller(Protocol):
    """Per-row stopping rule. Subclasses override :meth:`should_stop`; this default never stops."""

    def reset(self, batch_size: int) -> None:
        """Called once before the first step of a run (not during a planner's probe)."""

    def should_stop(self, row: int, steps_done: int, num_steps: int, x0_change: float, sigma: float) -> bool:
        """After each step of ``row``: ``steps_done`` of its ``num_steps``-step schedule have run,
        ``x0_change`` = ||x0_k - x0_{k-1}|| / ||x0_k|| (NaN after its first step) and ``sigma`` is the
        VE noise level sigma/alpha of the step just taken. Return True to retire the row now."""
        return False


@dataclass
class StepChoice:
    """The schedule length a planner picked for one row, and why (shown in ``SampleResult.notes``)."""

    steps: int
    reason: str
    tier: str = ""
    keywords: list[str] | None = None
    hf_energy: float = float("nan")


@runtime_checkable
class StepPlanner(Protocol):
    """Chooses each row's step count from a probe of its x0 prediction."""

    probe_steps: int  # steps run before planning
    probe_schedule: int  # length of the schedule whose first steps are the probe

    def choose(self, x0_probe: torch.Tensor) -> list[StepChoice]:
        """One :class:`StepChoice` per row of ``x0_probe`` (B, ...)."""
        ...
