"""One adapter between the sampling loop and any diffusers-compatible scheduler.

The loop needs five things from a scheduler, and :class:`SchedulerAdapter` provides them for every
diffusers scheduler through public API only (``set_timesteps``, ``set_begin_index``, ``scale_model_input``,
``step``, ``sigmas`` / ``alphas_cumprod``, ``config.prediction_type``):

* ``prepared(num_steps, device, start_step)``: an independent copy with its timesteps set (the caller's
  scheduler is never mutated) and the index of the first step to run;
* ``model_input(x, t)`` and ``step(output, t, x, generator)`` -> (next state, x0 or None);
* ``vp_coefficients(index)``: (alpha_t, sigma_t) of x_t = alpha_t x0 + sigma_t eps at that step, so x0 can
  be recovered from the model output (:func:`predicted_x0`) when the scheduler does not return it.

A scheduler may implement :class:`VPCoefficients` natively (one method); the adapter then asks it instead of
deriving the coefficients from its sigma or alpha-bar tables. Two more optional protocols serve per-row step
control: :class:`Reschedulable` (a controller's ``jump`` replaces the rest of a row's schedule) and
:class:`SelfScheduling` (the scheduler picks each next noise level itself, so every row gets its own copy).
"""

from __future__ import annotations

import copy
import functools
import inspect
import math
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import torch

__all__ = [
    "SchedulerAdapter",
    "InPlaceAdapter",
    "VPCoefficients",
    "Reschedulable",
    "SelfScheduling",
    "predicted_x0",
    "check_scheduler",
    "check_step_kwargs",
]

_REQUIRED = ("set_timesteps", "step", "scale_model_input")
# arguments the loop itself passes to step(); the rest of its keywords are what step_kwargs may set
_LOOP_ARGS = frozenset({"self", "model_output", "timestep", "sample", "generator", "return_dict"})


@runtime_checkable
class VPCoefficients(Protocol):
    """A scheduler that knows the VP coefficients of its own steps."""

    def vp_coefficients(self, index: int) -> tuple[float, float]:
        """(alpha_t, sigma_t) of step ``index`` of the current schedule."""
        ...


@runtime_checkable
class Reschedulable(Protocol):
    """A scheduler whose remaining noise levels can be replaced mid-run, keeping state and solver history."""

    def sigmas_ahead(self) -> list[float]:
        """VE noise levels still ahead: the level of the next step's input first, ending at 0."""
        ...

    def reschedule(self, sigmas: Sequence[float]) -> None:
        """Replace the levels after the current one by ``sigmas`` (decreasing, ending at 0)."""
        ...


@runtime_checkable
class SelfScheduling(Protocol):
    """A scheduler that chooses each next noise level from the state it steps (error-controlled step size,
    e.g. :class:`fastdiff.samplers.AdaptiveScheduler`). Its ``timesteps`` end with the next one to evaluate
    and grow as it runs; the loop gives every row its own copy so that rows pick their own steps."""

    def accepts_step_count(self) -> bool:
        """False: the schedule follows from a tolerance, so ``num_inference_steps`` must be None."""
        ...


def predicted_x0(
    prediction: torch.Tensor, x_vp: torch.Tensor, alpha: float, sigma: float, prediction_type: str
) -> torch.Tensor:
    """Data prediction from a model output on the VP-form input x_t = alpha x0 + sigma eps.

    epsilon: x0 = (x_t - sigma eps) / alpha (Ho et al. 2020, eq. 15); v: x0 = alpha x_t - sigma v
    (Salimans & Ho 2022, with alpha^2 + sigma^2 = 1); sample: the prediction itself.
    """
    if prediction_type == "epsilon":
        return (x_vp - sigma * prediction) / alpha
    if prediction_type == "v_prediction":
        return alpha * x_vp - sigma * prediction
    if prediction_type == "sample":
        return prediction
    raise ValueError(
        f"unknown prediction_type {prediction_type!r}; expected 'epsilon', 'v_prediction' or 'sample'"
    )


def vp_of_ve(sigma: float) -> tuple[float, float]:
    """VP ``(alpha_t, sigma_t)`` of a VE noise level ``sigma = sigma_t / alpha_t``: ``alpha_t = 1 / sqrt(1 + sigma^2)``.

    Python floats (:meth:`fastdiff.samplers.NoiseSchedule.alpha_sigma_vp` is the array form)."""
    alpha = 1.0 / math.sqrt(1.0 + sigma * sigma)
    return alpha, sigma * alpha


def check_scheduler(scheduler) -> None:
    if isinstance(scheduler, SchedulerAdapter):
        return
    for name in _REQUIRED:
        if not callable(getattr(scheduler, name, None)):
            raise TypeError(
                f"scheduler must be diffusers-compatible; {type(scheduler).__name__} has no {name}()"
            )


def check_step_kwargs(scheduler, step_kwargs: dict) -> None:
    """Every key of ``step_kwargs`` must be a keyword of ``scheduler.step`` (#16: a misspelt ``etaa`` was
    dropped silently). Convention kept from diffusers pipelines, which always pass ``eta``: ``eta=0.0``
    (a no-op) is dropped for schedulers without ``eta``; any other value raises."""
    if not isinstance(step_kwargs, dict):
        raise TypeError(f"step_kwargs must be a dict or None, got {type(step_kwargs).__name__}")
    names = step_parameters(type(scheduler))
    if names is None:
        return
    accepted = sorted(names - _LOOP_ARGS)
    for key, value in step_kwargs.items():
        if key in _LOOP_ARGS:
            raise ValueError(f"step_kwargs[{key!r}] is set by the sampling loop itself; pass it to sample()")
        if key in names or (key == "eta" and isinstance(value, (int, float)) and value == 0.0):
            continue
        hint = ""
        if key == "eta":
            hint = ' (fastdiff samplers take eta as a scheduler option: make_scheduler("ddim", eta=...))'
        raise ValueError(
            f"step_kwargs key {key!r} is not a keyword of {type(scheduler).__name__}.step(); "
            f"accepted: {accepted or 'none'}{hint}"
        )


@functools.lru_cache(maxsize=64)
def step_parameters(scheduler_type: type) -> frozenset | None:
    """Keyword names ``scheduler_type.step`` accepts (None: it takes **kwargs). Cached: inspect is slow."""
    params = inspect.signature(scheduler_type.step).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return None
    return frozenset(params)


class SchedulerAdapter:
    """A scheduler copy driving one set of rows; see the module docstring for the contract."""

    def __init__(self, scheduler, step_kwargs: dict | None = None):
        self.scheduler = scheduler
        self.step_kwargs = dict(step_kwargs or {})
        config = getattr(scheduler, "config", None)
        self.prediction_type = getattr(config, "prediction_type", "epsilon")
        self._flow = bool(getattr(config, "use_flow_sigmas", False))

    # ---------------------------------------------------------------- set-up
    @property
    def timesteps(self) -> torch.Tensor:
        return self.scheduler.timesteps

    @property
    def order(self) -> int:
        return getattr(self.scheduler, "order", 1)

    def prepared(self, num_steps: int | None, device, start_step: int) -> tuple[SchedulerAdapter, int]:
        """An independent copy ready to run, and the index of its first step.

        ``num_steps=None`` keeps the timesteps the caller set (and its ``begin_index`` unless
        ``start_step`` is given)."""
        sch = copy.deepcopy(self.scheduler)
        if num_steps is None:
            begin = start_step * self.order if start_step else (getattr(sch, "begin_index", None) or 0)
        else:
            sch.set_timesteps(num_steps, device=device)
            begin = start_step * self.order
            if callable(getattr(sch, "set_begin_index", None)):
                sch.set_begin_index(begin)
        return SchedulerAdapter(sch, self.step_kwargs), begin

    def copy(self) -> SchedulerAdapter:
        """An independent copy in the same state (multistep history included)."""
        return SchedulerAdapter(copy.deepcopy(self.scheduler), self.step_kwargs)

    @property
    def self_scheduling(self) -> bool:
        return isinstance(self.scheduler, SelfScheduling)

    def sigmas_ahead(self) -> tuple[float, ...] | None:
        """The levels still ahead (current first, ending at 0), or None if it cannot be rescheduled."""
        if isinstance(self.scheduler, Reschedulable):
            return tuple(self.scheduler.sigmas_ahead())
        return None

    def reschedule(self, sigmas: Sequence[float]) -> None:
        if not isinstance(self.scheduler, Reschedulable):
            raise TypeError(
                f"a controller asked to jump, but {type(self.scheduler).__name__} cannot replace its "
                "remaining schedule (fastdiff.dynamic.adapters.Reschedulable); use fastdiff.samplers.make_scheduler"
            )
        self.scheduler.reschedule(sigmas)

    # ---------------------------------------------------------------- per step
    def model_input(self, x: torch.Tensor, t) -> torch.Tensor:
        return self.scheduler.scale_model_input(x, t)

    def step_index(self, pos: int, t) -> int:
        """Index of the step about to be taken at position ``pos`` / timestep ``t``, as the scheduler
        itself will pick it: its own ``step_index``, else its ``begin_index``, else the timestep lookup."""
        sch = self.scheduler
        for name in ("step_index", "begin_index"):
            index = getattr(sch, name, None)
            if index is not None:
                return index
        if callable(getattr(sch, "index_for_timestep", None)):
            return sch.index_for_timestep(t)
        return pos

    def vp_coefficients(self, index: int, t) -> tuple[float, float]:
        """(alpha_t, sigma_t) at step ``index`` (timestep ``t``), before that step is taken."""
        sch = self.scheduler
        if isinstance(sch, VPCoefficients):
            return sch.vp_coefficients(index)
        sigmas = getattr(sch, "sigmas", None)
        if sigmas is not None:
            s = float(sigmas[index])
            if self._flow:  # rectified-flow sigmas: x_t = (1 - s) x0 + s eps
                return 1.0 - s, s
            return vp_of_ve(s)  # VE sigma s = sigma_t / alpha_t (Euler, DPM-Solver, UniPC, ...)
        abar_table = sch.alphas_cumprod  # DDIM, DDPM, PNDM, LCM: interpolate alpha-bar at (fractional) t
        tf = float(t)
        lo = int(math.floor(tf))
        hi = min(lo + 1, len(abar_table) - 1)
        w = tf - lo
        abar = float(abar_table[lo]) * (1 - w) + float(abar_table[hi]) * w
        return math.sqrt(abar), math.sqrt(1.0 - abar)

    def step(
        self, output: torch.Tensor, t, x: torch.Tensor, generator
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One scheduler step: (next state, the scheduler's x0 estimate or None if it gives none)."""
        kwargs = {**self.step_kwargs, "generator": generator}
        names = step_parameters(type(self.scheduler))
        if names is not None:  # pass only what this scheduler's step() accepts, as diffusers pipelines do
            kwargs = {k: v for k, v in kwargs.items() if k in names}
        res = self.scheduler.step(output, t, x, return_dict=True, **kwargs)
        x0 = getattr(res, "pred_original_sample", None)
        if x0 is None:
            x0 = getattr(res, "denoised", None)
        return res.prev_sample, x0


class InPlaceAdapter(SchedulerAdapter):
    """Drives the caller's scheduler itself instead of a copy, as a diffusers pipeline does: after the run
    the scheduler is at its end (``step_index``, solver history). For single-track runs only (no controller,
    planner or per-row step counts); :func:`fastdiff.samplers.run_scheduler` uses it.

    ``last_sample`` holds the state after the latest step (for callbacks that want x_{t-1})."""

    last_sample: torch.Tensor | None = None

    def prepared(self, num_steps: int | None, device, start_step: int) -> tuple[SchedulerAdapter, int]:
        if num_steps is not None:
            self.scheduler.set_timesteps(num_steps, device=device)
        begin = start_step * self.order if start_step else (getattr(self.scheduler, "begin_index", None) or 0)
        return self, begin

    def copy(self) -> SchedulerAdapter:
        return self

    def step(self, output, t, x, generator):
        prev, x0 = super().step(output, t, x, generator)
        self.last_sample = prev
        return prev, x0
