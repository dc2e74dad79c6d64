"""What a sampling run reports: one :class:`StepRecord` per tick and a :class:`SampleResult`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from fastdiff.dynamic.tick import SampleState

__all__ = ["StepRecord", "SampleResult", "trace_table"]


@dataclass
class StepRecord:
    """One tick of the loop: every still-active row advanced by one scheduler step.

    Per-row lists have one entry per sample of the batch; rows that were not active hold NaN.
    ``x0_change`` is ||x0_k - x0_{k-1}|| / ||x0_k|| (NaN on a row's first step).
    """

    tick: int
    t: list[float]
    sigma: list[float]
    x0_change: list[float]
    active: list[bool]
    stopped: list[int]  # rows retired by the controller at this tick
    nfe: int  # model calls so far (a batched call counts once; a draft's calls included)
    seconds: float  # wall time of this tick
    jumped: list[int] = field(default_factory=list)  # rows whose controller replaced their remaining schedule


def trace_table(trace: list[StepRecord]) -> dict[str, torch.Tensor]:
    """A trace as (ticks, batch) float tensors: ``t``, ``sigma``, ``x0_change``, ``active``, ``nfe``."""
    if not trace:
        return {}
    return {
        k: torch.tensor([getattr(r, k) for r in trace]) for k in ("t", "sigma", "x0_change", "active", "nfe")
    }


@dataclass
class SampleResult:
    """What :func:`~fastdiff.dynamic.sample` returns.

    Attributes:
        latents: final x0 estimate per row: the last scheduler state of rows that ran their whole schedule
            (at sigma=0 that is x0) and the x0 prediction of rows that stopped early. For a paused run
            (``stop_after``) the current x0 prediction, i.e. a preview.
        nfe: number of model calls (a call on a batch counts once), a draft's included.
        nfe_per_sample: model evaluations spent on each row.
        steps_run: scheduler steps taken by each row.
        num_steps: length of each row's schedule (from its start step), e.g. the planned count.
        stopped_early: per row, whether a controller retired it before its schedule ended.
        trace: one :class:`StepRecord` per tick.
        seconds: wall time of the loop.
        state: resumable state when the run was paused with ``stop_after`` and not finished, else None.
        notes: per-row explanations from a step planner (e.g. why an auto step count was chosen).
        draft: for :func:`~fastdiff.dynamic.draft_and_refine`, the draft run.
    """

    latents: torch.Tensor
    nfe: int
    nfe_per_sample: list[int]
    steps_run: list[int]
    num_steps: list[int]
    stopped_early: list[bool]
    trace: list[StepRecord]
    seconds: float
    state: SampleState | None = None
    notes: list[str] = field(default_factory=list)
    draft: SampleResult | None = None

    @property
    def finished(self) -> bool:
        return self.state is None

    def trace_table(self) -> dict[str, torch.Tensor]:
        """The trace as (ticks, batch) float tensors: ``t``, ``sigma``, ``x0_change``, ``active``, ``nfe``."""
        return trace_table(self.trace)
