"""What a drop-in pipeline call reports (``output.fastdiff``) and what ``pipe.refine`` resumes."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from fastdiff.dynamic.records import StepRecord, trace_table
from fastdiff.dynamic.tick import SampleState

if TYPE_CHECKING:
    from fastdiff.caching.stats import StepCacheRun

__all__ = ["FastdiffRecord", "Producer", "RefineState"]


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

    A snapshot: refining it never changes it, so the same preview can be refined again (or differently).
    ``producer`` identifies the pipeline (and its U-Net and VAE) that made the preview: the paused run
    holds that U-Net and the final image is decoded with the refining pipeline's VAE, so only the same
    pipeline, with the same components, may refine it."""

    sample_state: SampleState
    decode_kwargs: dict
    record: FastdiffRecord
    producer: Producer | None = None
    reason: str = ""  # the call's plan, before the run's notes (which the paused run carries on)

    def check_refiner(self, pipe) -> None:
        """Raise ValueError unless ``pipe`` is the pipeline, with the same U-Net and VAE, that made this state."""
        if self.producer is None:
            return
        problem = self.producer.mismatch(pipe)
        if problem is not None:
            raise ValueError(
                f"refine(state): {problem}; a preview can only be refined by the pipeline that made it "
                "(its paused run holds that pipeline's U-Net and conditioning). Refine with that pipeline, "
                "or start a new call on this one"
            )


@dataclass(frozen=True)
class Producer:
    """Weak references to the pipeline that made a preview and to its U-Net and VAE at that time."""

    pipe: weakref.ref
    unet: Callable  # weakref.ref, or a callable returning None for an absent component
    vae: Callable

    @classmethod
    def of(cls, pipe) -> Producer:
        return cls(weakref.ref(pipe), _ref(pipe.unet), _ref(getattr(pipe, "vae", None)))

    def mismatch(self, pipe) -> str | None:
        """None if ``pipe`` is the producer with the same components, else what differs."""
        made_by = self.pipe()
        if made_by is not pipe:
            made = (
                "a pipeline that no longer exists"
                if made_by is None
                else f"{type(made_by).__name__} at {id(made_by):#x}"
            )
            return f"the state was made by {made}, not by this {type(pipe).__name__} at {id(pipe):#x}"
        for name in ("unet", "vae"):
            if getattr(self, name)() is not getattr(pipe, name, None):
                return f"this pipeline's {name} was replaced after the preview was made"
        return None


def _ref(obj):
    """A weak reference, or a callable returning None for an absent component (``vae=None``)."""
    return (lambda: None) if obj is None else weakref.ref(obj)
