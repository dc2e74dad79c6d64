"""Running a scheduler outside a pipeline, and fitting a schedule to a model.

:func:`fit_schedule` picks the ``N`` noise levels of an ``N``-step run that minimise the error
against a reference solution of the same sampler run with many steps, on a few calibration
latents -- in the spirit of "Align Your Steps" (Sabour et al. 2024), which optimises a schedule
per model and sampler, but with a direct objective: the final-sample RMS error.

Parameterisation: the interior knots ``log sigma_1 > ... > log sigma_{N-1}`` between the fixed
end points ``sigma_max`` and ``sigma_min`` of the training schedule (``sigma_N = 0``).  Starting
from Karras' schedule, cyclic coordinate descent moves one knot at a time by a shrinking step
in log-sigma, keeping a move only if the calibration error drops (a derivative-free descent
that needs only sampler runs, so it works for any black-box model).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable

import numpy as np
import torch

from .schedules import karras_sigmas


def run_scheduler(
    model_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    latents: torch.Tensor,
    scheduler,
    num_inference_steps: int | None = None,
    generator: torch.Generator | None = None,
    callback: Callable[[int, torch.Tensor, torch.Tensor], None] | None = None,
) -> torch.Tensor:
    """Sample with ``scheduler`` exactly as a diffusers pipeline does.

    ``model_fn(x, t)`` returns the model output (of the scheduler's ``prediction_type``) for the
    VP state ``x`` at timestep ``t`` (a 0-d tensor).  ``latents`` is the initial noise (scaled by
    ``init_noise_sigma``).  ``callback(i, x_next, x0_estimate)`` is called after every step.
    Returns the final sample.
    """
    if num_inference_steps is not None or scheduler.num_inference_steps is None:
        scheduler.set_timesteps(num_inference_steps)
    else:
        scheduler.set_timesteps(scheduler.num_inference_steps)
    x = latents * scheduler.init_noise_sigma
    for i, t in enumerate(scheduler.timesteps):
        out = model_fn(scheduler.scale_model_input(x, t), t)
        res = scheduler.step(out, t, x, generator=generator)
        x = res.prev_sample
        if callback is not None:
            callback(i, x, res.pred_original_sample)
    return x


def _rms_error(a: torch.Tensor, b: torch.Tensor) -> float:
    """Median over samples of the per-sample RMS difference."""
    d = (a.double() - b.double()).flatten(1)
    return float(d.pow(2).mean(1).sqrt().median())


def fit_schedule(
    model_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    latents: torch.Tensor,
    nfe: int,
    name: str = "dpmpp_2m",
    like=None,
    *,
    reference: torch.Tensor | None = None,
    reference_steps: int = 200,
    sweeps: int = 4,
    initial_step: float = 0.3,
    verbose: bool = False,
    **options,
) -> list[float]:
    """Fit the ``nfe`` sigmas of sampler ``name`` to ``model_fn`` on calibration ``latents``.

    Args:
        model_fn: ``model_fn(x_vp, t) -> model output`` (as for :func:`run_scheduler`).
        latents: calibration noise, e.g. ``torch.randn(8, 4, 64, 64)``; keep it separate from
            the samples you evaluate on.
        nfe: number of steps (= model evaluations) of the schedule to fit (>= 2).
        name, like, **options: the sampler as for :func:`make_scheduler` (``schedule`` is set here).
        reference: target final samples for ``latents``; default: the same sampler with
            ``reference_steps`` Karras steps (the "high-NFE run of the same sampler").
        sweeps: coordinate-descent sweeps over the knots; the step halves after each sweep.

    Returns:
        ``nfe + 1`` VE sigmas (last 0) for ``make_scheduler(name, like=..., schedule=sigmas)``;
        save them with :func:`save_schedule`.
    """
    from .scheduler import make_scheduler

    if not isinstance(nfe, int) or nfe < 2:
        raise ValueError(f"nfe must be an int >= 2 (the end points are fixed), got {nfe!r}")
    if "schedule" in options:
        raise ValueError("fit_schedule sets `schedule` itself; do not pass it")
    base = make_scheduler(name, like=like, **options)
    ns = base.noise_schedule
    if reference is None:
        ref_sched = make_scheduler(name, like=like, schedule="karras", **options)
        reference = run_scheduler(model_fn, latents, ref_sched, reference_steps)

    log_hi, log_lo = math.log(ns.sigma_max), math.log(ns.sigma_min)

    def error(knots: np.ndarray) -> float:
        sig = np.exp(np.concatenate([[log_hi], knots, [log_lo]]))
        sched = make_scheduler(name, like=like, schedule=[*sig.tolist(), 0.0], **options)
        return _rms_error(run_scheduler(model_fn, latents, sched), reference)

    knots = np.log(karras_sigmas(nfe, ns.sigma_min, ns.sigma_max))[1:-1]
    best = error(knots)
    step = initial_step
    for sweep in range(sweeps):
        for j in range(len(knots)):
            for direction in (1.0, -1.0):
                trial = knots.copy()
                trial[j] += direction * step
                upper = log_hi if j == 0 else knots[j - 1]
                lower = log_lo if j == len(knots) - 1 else knots[j + 1]
                margin = 1e-3
                if not (lower + margin < trial[j] < upper - margin):
                    continue
                e = error(trial)
                if e < best:
                    best, knots = e, trial
                    break
        if verbose:
            print(f"fit_schedule sweep {sweep}: error {best:.3e}")
        step *= 0.5
    return [*np.exp(np.concatenate([[log_hi], knots, [log_lo]])).tolist(), 0.0]


def save_schedule(path: str | os.PathLike, sigmas, **metadata) -> None:
    """Write a fitted schedule (and free-form metadata, e.g. model id and sampler) as JSON."""
    sig = [float(s) for s in (sigmas.tolist() if hasattr(sigmas, "tolist") else sigmas)]
    with open(path, "w") as f:
        json.dump({"format": "fastdiff-schedule-v1", "sigmas": sig, "metadata": metadata}, f, indent=1)


def load_schedule(path: str | os.PathLike) -> tuple[list[float], dict]:
    """Read a schedule written by :func:`save_schedule`: returns ``(sigmas, metadata)``."""
    with open(path) as f:
        data = json.load(f)
    if not isinstance(data, dict) or data.get("format") != "fastdiff-schedule-v1":
        raise ValueError(f"{path} is not a fastdiff schedule file (format fastdiff-schedule-v1)")
    return [float(s) for s in data["sigmas"]], dict(data.get("metadata", {}))
