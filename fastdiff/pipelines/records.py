"""What a drop-in pipeline call reports (``output.fastdiff``) and what ``pipe.refine`` resumes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from fastdiff.dynamic.records import StepRecord, trace_table
from fastdiff.dynamic.tick import SampleState

if TYPE_CHECKING:
    from fastdiff.caching.stats import StepCacheRun

__all__ = ["FastdiffRecord", "RefineState"]


@dataclass
class FastdiffRecord:
    """What fastdiff did in one pipeline call (``output.fastdiff``).

    nfe: U-Net calls (a guided call on a doubled batch counts once), draft model included.
    steps: scheduler steps run per image; num_steps: each image's schedule length.
    reason: why this many steps (fixed, preset, auto table row, early stop, draft).
    timings: seconds for "prepare" (prompt encoding etc.), "draft", "denoise", "decode", "total".
    state: for ``preview_steps``, the resumable state to pass to ``pipe.refine``.
    trace: the sampling loop's per-step records (see :meth:`trace_table`).
    step_cache: with a step cache installed (``fastdiff.step_cache(pipe)``), what it did in this call's run:
        full / cached evaluations, skipped fraction, mode, refresh steps; None without one.
    """

    mode: str
    nfe: int
    steps: list[int]
    num_steps: list[int]
    reason: str
    timings: dict[str, float]
    stopped_early: list[bool] = field(default_factory=list)
    nfe_per_sample: list[int] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    state: RefineState | None = None
    trace: list[StepRecord] = field(default_factory=list, repr=False)
    step_cache: StepCacheRun | None = None

    def trace_table(self) -> dict[str, torch.Tensor]:
        """Per-step, per-image ``t``, ``sigma``, ``x0_change``, ``active`` and ``nfe`` as tensors."""
        return trace_table(self.trace)


@dataclass
class RefineState:
    """A paused pipeline run: pass to ``pipe.refine(state)`` to continue to the final image.

    A snapshot: refining it never changes it, so the same preview can be refined again (or differently)."""

    sample_state: SampleState
    decode_kwargs: dict
    record: FastdiffRecord
