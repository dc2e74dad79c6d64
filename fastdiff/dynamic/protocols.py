"""The two extension points of :func:`fastdiff.dynamic.sample`: controllers and step planners.

* A :class:`Controller` decides, after every step of a row, what that row does next: a :class:`Decision`
  to continue, to stop (e.g. :class:`~fastdiff.dynamic.EarlyStop`: the row returns its x0 prediction and
  leaves the batch) or to jump, i.e. to finish on a new, shorter tail of noise levels (e.g.
  :class:`~fastdiff.dynamic.FastForward`). A controller that only stops overrides ``should_stop``; one that
  reschedules overrides ``decide`` and sets the class attribute ``reschedules = True``, so that
  :func:`~fastdiff.dynamic.sample` refuses a scheduler that cannot jump before any model evaluation
  (instead of only when some row first converges).
* A :class:`StepPlanner` chooses each row's schedule length after a short probe (e.g.
  :class:`~fastdiff.dynamic.AutoSteps`): the loop runs ``probe_steps`` steps of a ``probe_schedule``-step
  schedule, hands the x0 prediction to :meth:`StepPlanner.choose` and continues every row on its chosen
  schedule (the probe's steps are kept when the choice equals the probe schedule).

To add one, subclass the protocol (or just implement its methods) and pass it as ``controller=`` or
``num_inference_steps=``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

__all__ = ["Controller", "Decision", "StepPlanner", "StepChoice"]


@dataclass(frozen=True)
class Decision:
    """What one row does after a step: ``"continue"``, ``"stop"`` or ``"jump"``.

    ``jump`` replaces the row's remaining schedule: ``sigmas`` are the VE noise levels (sigma_t/alpha_t)
    the row visits after its current one, strictly decreasing and ending at 0. The row keeps its state and
    solver history; its scheduler must implement :class:`~fastdiff.dynamic.adapters.Reschedulable`.
    Build them with :meth:`go_on`, :meth:`stop` and :meth:`jump`."""

    action: str
    sigmas: tuple[float, ...] = ()

    def __post_init__(self):
        if self.action not in ("continue", "stop", "jump"):
            raise ValueError(f"Decision action must be 'continue', 'stop' or 'jump', got {self.action!r}")
        if self.action == "jump":
            s = self.sigmas
            if not s or s[-1] != 0.0 or any(not math.isfinite(v) or v < 0 for v in s):
                raise ValueError(f"a jump needs finite noise levels >= 0 ending at 0, got {s!r}")
            if any(b >= a for a, b in zip(s, s[1:])):
                raise ValueError(f"a jump's noise levels must strictly decrease, got {s!r}")
        elif self.sigmas:
            raise ValueError(f"only a jump carries noise levels, got {self.action!r} with {self.sigmas!r}")

    @classmethod
    def go_on(cls) -> Decision:
        return _CONTINUE

    @classmethod
    def stop(cls) -> Decision:
        return _STOP

    @classmethod
    def jump(cls, sigmas: Sequence[float]) -> Decision:
        return cls("jump", tuple(float(v) for v in sigmas))


_CONTINUE, _STOP = Decision("continue"), Decision("stop")


@runtime_checkable
class Controller(Protocol):
    """Per-row control. Subclasses override :meth:`should_stop` (stop or not) or :meth:`decide` (any
    :class:`Decision`); the loop calls :meth:`decide`, whose default asks :meth:`should_stop`."""

    def reset(self, batch_size: int) -> None:
        """Called once before the first step of a run (not during a planner's probe)."""

    def should_stop(self, row: int, steps_done: int, num_steps: int, x0_change: float, sigma: float) -> bool:
        """After each step of ``row``: ``steps_done`` of its ``num_steps``-step schedule have run,
        ``x0_change`` = ||x0_k - x0_{k-1}|| / ||x0_k|| (NaN after its first step) and ``sigma`` is the
        VE noise level sigma/alpha of the step just taken. Return True to retire the row now."""
        return False

    def decide(
        self,
        row: int,
        steps_done: int,
        num_steps: int,
        x0_change: float,
        sigma: float,
        sigmas_ahead: tuple[float, ...] | None,
    ) -> Decision:
        """After each step of ``row``: the arguments of :meth:`should_stop`, plus ``sigmas_ahead``, the
        VE noise levels still ahead of the row (its current level first, ending at 0), or None when its
        scheduler cannot be rescheduled. Default: stop when :meth:`should_stop` says so."""
        if self.should_stop(row, steps_done, num_steps, x0_change, sigma=sigma):
            return Decision.stop()
        return Decision.go_on()


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
