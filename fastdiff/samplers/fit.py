"""Running a scheduler outside a pipeline, and fitting a schedule to a model.

:func:`fit_schedule` picks the ``N`` noise levels of an ``N``-step run that minimise the error
against a reference solution of the same sampler run with many steps, on a few calibration
latents -- in the spirit of "Align Your Steps" (Sabour et al. 2024), which optimises a schedule
per model and sampler, but with a direct objective: the final-sample RMS error.

Parameterisation: the ``N - 1`` gaps in ``log sigma`` between the fixed end points ``sigma_max``
and ``sigma_min`` of the training schedule (``sigma_N = 0``), as a softmax of free logits, so
every candidate is a valid decreasing schedule.  Starting from Karras' schedule, Powell's
derivative-free method (scipy) minimises the calibration error; it needs only sampler runs, so it
works for any black-box model.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable

import numpy as np
import torch

from fastdiff._checks import is_int

from .gmm import rms_errors
from .schedules import build_schedule

OBJECTIVES = ("geomean", "median")


def run_scheduler(
    model_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    latents: torch.Tensor,
    scheduler,
    num_inference_steps: int | None = None,
    generator: torch.Generator | None = None,
    callback: Callable[[int, torch.Tensor, torch.Tensor], None] | None = None,
) -> torch.Tensor:
    """Sample with ``scheduler`` exactly as a diffusers pipeline does (a call of
    :func:`fastdiff.dynamic.sample` that drives ``scheduler`` itself, so it ends the run at its last step).

    ``model_fn(x, t)`` returns the model output (of the scheduler's ``prediction_type``) for the
    VP state ``x`` at timestep ``t`` (a 0-d tensor).  ``latents`` is the initial noise (scaled by
    ``init_noise_sigma``).  ``callback(i, x_next, x0_estimate)`` is called after every step.
    Returns the final sample.
    """
    from fastdiff.dynamic.adapters import InPlaceAdapter
    from fastdiff.dynamic.loop import sample

    # default: the scheduler's own step count (None for the first run: its configured schedule decides)
    scheduler.set_timesteps(
        num_inference_steps if num_inference_steps is not None else scheduler.num_inference_steps
    )
    adapter = InPlaceAdapter(scheduler)
    hook = None
    if callback is not None:
        hook = lambda record, x0: callback(record.tick, adapter.last_sample, x0)  # noqa: E731
    x = latents * scheduler.init_noise_sigma
    return sample(model_fn, x, scheduler=adapter, generator=generator, callback=hook).latents


def _run_on_sigmas(model_fn, latents, scheduler, sigmas) -> torch.Tensor:
    from fastdiff.dynamic.adapters import InPlaceAdapter
    from fastdiff.dynamic.loop import sample

    scheduler.set_timesteps(sigmas=sigmas)
    scheduler.set_begin_index(0)
    x = latents * scheduler.init_noise_sigma
    return sample(model_fn, x, scheduler=InPlaceAdapter(scheduler)).latents


def fit_schedule(
    model_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    latents: torch.Tensor,
    nfe: int,
    name: str = "dpmpp_2m",
    like=None,
    *,
    reference: torch.Tensor | None = None,
    reference_steps: int = 200,
    max_evals: int = 400,
    free_end: bool = False,
    starts=("karras", "exponential"),
    objective: str = "geomean",
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
        max_evals: budget of sampler runs for the optimiser.
        free_end: also fit the last evaluated noise level (>= sigma_min) instead of fixing it
            at sigma_min; pays off with ``final_step="variance"``, whose error is O(sigma^4).
        starts: schedules the optimiser starts from (the budget is split between them): names
            (``"karras"``, ``"exponential"``, ``"trailing"``, ...) or explicit ``nfe + 1`` sigmas.
            Start from the best fixed schedule measured for the model; a start whose end noise
            level is above ``sigma_min`` (``"trailing"``) needs ``free_end=True``.
        objective: ``"geomean"`` (default) minimises the geometric mean over calibration samples of
            the per-sample RMS error; ``"median"`` minimises the median, the statistic the benchmarks
            report.  The median is piecewise flat in the sigmas, so each start first spends half its
            budget on a smooth stand-in, the geometric mean of the middle half of the per-sample errors
            (25th to 75th percentile: near the median, but moving with every sample in it), and then
            polishes the median itself from there.

    Returns:
        ``nfe + 1`` VE sigmas (last 0) for ``make_scheduler(name, like=..., schedule=sigmas)``;
        save them with :func:`save_schedule`.

    The default objective is the geometric mean over calibration samples of the per-sample RMS error
    (smooth, and robust to the rare sample that changes mode); the returned schedule is the best
    by median error among the starts and the optimised candidates.  Calibrate on latents (and, for a
    conditional model, conditions) that cover what the schedule will be used for: on the guided exact
    benchmark a fit on one mixture generalises worse to other mixtures than a fit on several
    (``benchmarks/results/sampler_accuracy.md``).  The ``nfe - 1`` gaps in ``log sigma`` between the fixed
    end points ``sigma_max`` and ``sigma_min`` are parameterised as a softmax of free logits,
    which keeps every candidate schedule strictly decreasing, and optimised with Powell's
    derivative-free method (scipy) starting from Karras' schedule.
    """
    from scipy.optimize import minimize

    from .scheduler import make_scheduler

    if not is_int(nfe) or nfe < 2:
        raise ValueError(f"nfe must be an int >= 2 (the end points are fixed), got {nfe!r}")
    if "schedule" in options:
        raise ValueError("fit_schedule sets `schedule` itself; do not pass it")
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
    sched = make_scheduler(name, like=like, **options)
    ns = sched.noise_schedule
    if reference is None:
        ref_sched = make_scheduler(name, like=like, **{**options, "schedule": "karras"})
        reference = run_scheduler(model_fn, latents, ref_sched, reference_steps)

    log_hi, log_lo = math.log(ns.sigma_max), math.log(ns.sigma_min)

    def sigmas_of(logits: np.ndarray) -> list[float]:
        w = np.exp(logits - logits.max())
        gaps = (log_hi - log_lo) * w / w.sum()
        if free_end:  # the last logit is the unused span above sigma_min
            gaps = gaps[:-1]
        log_s = log_hi - np.concatenate([[0.0], np.cumsum(gaps)])
        if not free_end:
            log_s[-1] = log_lo
        return [*np.exp(np.clip(log_s, log_lo, log_hi)).tolist(), 0.0]

    def per_sample(logits: np.ndarray) -> torch.Tensor | None:
        try:
            out = _run_on_sigmas(model_fn, latents, sched, sigmas_of(logits))
        except ValueError:  # sigmas so close that their timesteps coincide: reject
            return None
        return rms_errors(out, reference)

    def geomean(logits: np.ndarray) -> float:
        # geometric mean of the per-sample RMS errors: smooth, and robust to rare mode changes
        e = per_sample(logits)
        return float("inf") if e is None else float(e.clamp_min(1e-12).log().mean())

    def median(logits: np.ndarray) -> float:
        e = per_sample(logits)
        return float("inf") if e is None else float(e.median())

    def middle_geomean(logits: np.ndarray) -> float:
        e = per_sample(logits)
        if e is None:
            return float("inf")
        log_e = e.clamp_min(1e-12).log().sort().values
        q = len(log_e) // 4
        return float(log_e[q : len(log_e) - q].mean())

    def log_median(logits: np.ndarray) -> float:
        m = median(logits)
        return math.log(m) if 0 < m < float("inf") else float("inf")

    starts = [_start_logits(s, nfe, sched, free_end, log_lo) for s in _as_list_of_starts(starts)]
    candidates = list(starts)
    per_start = max_evals // len(starts)
    for x0 in starts:
        smooth = per_start if objective == "geomean" else per_start // 2
        surrogate = geomean if objective == "geomean" else middle_geomean
        res = minimize(surrogate, x0, method="Powell", options={"maxfev": smooth, "xtol": 1e-3})
        candidates.append(res.x)
        if objective == "median":  # polish the benchmarks' statistic from the smooth objective's basin
            res = minimize(
                log_median, res.x, method="Powell", options={"maxfev": per_start - smooth, "xtol": 1e-3}
            )
            candidates.append(res.x)
    scores = [median(c) for c in candidates]
    best = candidates[int(np.argmin(scores))]
    if verbose:
        print(f"fit_schedule({name}, nfe={nfe}): first start {scores[0]:.3e} -> fitted {min(scores):.3e}")
    return sigmas_of(best)


def _as_list_of_starts(starts) -> list:
    if isinstance(starts, (str, np.ndarray, torch.Tensor)) or (
        len(starts) and isinstance(starts[0], (int, float))
    ):
        return [starts]  # one name or one explicit schedule
    if not len(starts):
        raise ValueError("starts must name at least one schedule")
    return list(starts)


def _start_logits(start, nfe: int, sched, free_end: bool, log_lo: float) -> np.ndarray:
    """Softmax logits of a start schedule: log of its log-sigma gaps (+ unused span above sigma_min)."""
    if isinstance(start, str):
        _, sig = build_schedule(start, nfe, sched.noise_schedule, rho=sched.config.rho)
    else:
        sig = np.asarray([float(v) for v in start], dtype=np.float64)
    sig = sig[sig > 0]
    if len(sig) != nfe:
        raise ValueError(
            f"start schedule {start!r} has {len(sig)} positive sigmas; fit_schedule needs nfe={nfe}"
        )
    logits = np.log(np.maximum(np.diff(-np.log(sig)), 1e-6))
    span = math.log(sig[-1]) - log_lo
    if free_end:
        return np.append(logits, math.log(max(span, 1e-3)) if span > 1e-9 else logits.min() - 3.0)
    if span > 1e-6:
        raise ValueError(
            f"start schedule {start!r} ends at sigma {sig[-1]:.4g} above sigma_min {math.exp(log_lo):.4g}; "
            "pass free_end=True to fit the last noise level"
        )
    return logits


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
