"""Measure a :class:`~.policy.StepProfile`: per-step sensitivity or gap costs (runs the pipeline), or drift.

:func:`measure_profile` (the planner's default input) replays one step at a time and records the relative
change of the final latents: ``n - 1`` pipeline runs at ``n`` steps. :func:`measure_gaps` (opt-in,
``measure_profile(..., gaps=True)``) measures more: for every pair of steps ``a < b`` of an ``n``-step run with at
least one step between them, steps ``a+1 .. b-1`` replay step ``a``'s features (every other step full), and
each prompt's decoded image is compared with the uncached run's (mean squared error over pixels in
[0, 1]). :func:`profile_from_gaps` averages over the prompts into the profile's ``gap_cost`` (and its
single-step ``weight``, ``b = a + 2``); cost ``(n-1)(n-2)/2`` pipeline runs at ``n`` steps (36 at
``n = 10``); :mod:`.policy` says why it is not the default. Use a short ``n`` either way: a profile is on
a progress axis and reused for any step count. :func:`drift_profile` turns ``mode="off"`` traces into the
cheaper drift profile.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from fastdiff import installed
from fastdiff._checks import is_int
from fastdiff.caching.policy import StepProfile


def _outputs(pipe, prompts, steps: int, seed: int, call_kwargs: dict, output_type: str) -> torch.Tensor:
    """One seeded pipeline run per measurement (prompt ``i`` seeded ``seed + i``): ``output_type`` "pt"
    gives decoded images in [0, 1], "latent" the final latents."""
    gens = [torch.Generator().manual_seed(seed + i) for i in range(len(prompts))]
    out = pipe(prompts, num_inference_steps=steps, generator=gens, output_type=output_type, **call_kwargs)
    return torch.as_tensor(out.images)


def _check_run(num_inference_steps, prompts) -> int:
    """The measurement runs' step count, after checking it and the prompts."""
    n = num_inference_steps
    if not is_int(n) or n < 3:
        raise ValueError(f"num_inference_steps must be an int >= 3, got {n!r}")
    if not prompts:
        raise ValueError("measuring a step profile needs at least one prompt")
    return n


def _measuring_cache(pipe, branch: int):
    """The step cache a measurement installs (mode "off"; removed by the caller): measuring needs the
    uncached run as its reference, so a cache the user installed is an error, not silently replaced."""
    from fastdiff.caching.cache import step_cache
    from fastdiff.caching.hooks import installed_cache

    if installed_cache(pipe) is not None:
        raise RuntimeError(
            "measure_profile / measure_gaps run the pipeline without a step cache and install their own: "
            "call them before fastdiff.step_cache(pipe, ...), or fastdiff.restore(pipe) first"
        )
    return step_cache(pipe, mode="off", branch=branch)


def measure_gaps(
    pipe, prompts: list[str], num_inference_steps: int = 10, branch: int = 0, seed: int = 0, **call_kwargs
) -> np.ndarray:
    """Per-prompt image MSE for every gap: ``mse[a, b, i]`` when steps ``a+1 .. b-1`` replay step ``a``.

    Zero where ``b - a < 2`` (no replayed step). Images are the pipeline's ``output_type="pt"`` (in [0, 1]).
    """
    n = _check_run(num_inference_steps, prompts)
    handle = _measuring_cache(pipe, branch)
    mse = np.zeros((n, n, len(prompts)))
    try:
        ref = _outputs(pipe, prompts, n, seed, call_kwargs, "pt").double()
        for a in range(n - 2):
            for b in range(a + 2, n):
                handle.set("schedule", branch=branch, refresh=[s for s in range(n) if not a < s < b])
                img = _outputs(pipe, prompts, n, seed, call_kwargs, "pt").double()
                mse[a, b] = (img - ref).flatten(1).square().mean(1).numpy()
    finally:
        installed.undo_all(pipe, "step_cache")
    return mse


def profile_from_gaps(mse: np.ndarray) -> StepProfile:
    """The planner's :class:`StepProfile` from :func:`measure_gaps`: mean over prompts, per gap."""
    mse = np.asarray(mse, dtype=float)
    if mse.ndim != 3 or mse.shape[0] != mse.shape[1] or mse.shape[0] < 3 or not np.all(np.isfinite(mse)):
        raise ValueError(f"mse must be a finite (n, n, prompts) array with n >= 3, got shape {mse.shape}")
    e = mse.mean(-1)
    n = e.shape[0]
    gap = np.zeros((n, n))
    for a in range(n):
        for c in range(1, n - a - 1):
            gap[a, c] = e[a, a + c + 1]
    weight = [0.0] + [float(gap[k - 1, 1]) for k in range(1, n - 1)] + [0.0]  # first/last: always full
    grid = np.linspace(0.0, 1.0, n)
    return StepProfile(
        tuple(grid.tolist()),
        tuple(weight),
        source="sensitivity",
        runs=mse.shape[-1],
        gap_cost=tuple(tuple(float(x) for x in row) for row in gap),
    )


def measure_profile(
    pipe,
    prompts: list[str],
    num_inference_steps: int = 10,
    branch: int = 0,
    seed: int = 0,
    gaps: bool = False,
    **call_kwargs,
) -> StepProfile:
    """Sensitivity of the final latents to replaying features at each step (the planner's default input).

    For each inner step ``k`` only step ``k`` replays step ``k-1``'s features; the weight is the relative
    change of the final latents (all prompts as one tensor) against the uncached run: ``n - 1`` runs.
    With ``gaps=True`` it measures every gap on the decoded images instead (:func:`measure_gaps`,
    ``(n-1)(n-2)/2`` runs); on fastdiff-tiny that planned worse at 50 steps (:mod:`.policy`).

    Args:
        pipe: a diffusers pipeline without a step cache installed (one is installed and removed here).
        prompts: calibration prompts (keep them apart from the prompts you evaluate on).
        num_inference_steps: ``n``, the calibration run's length.
        branch: the branch the profile is for (deeper branches replay less, so harm differs).
        call_kwargs: passed to every pipeline call (guidance_scale, height, ...).
    """
    if not isinstance(gaps, bool):
        raise ValueError(f"gaps must be a bool, got {gaps!r}")
    if gaps:
        return profile_from_gaps(
            measure_gaps(pipe, prompts, num_inference_steps, branch, seed, **call_kwargs)
        )
    n = _check_run(num_inference_steps, prompts)
    handle = _measuring_cache(pipe, branch)
    try:
        ref = _outputs(pipe, prompts, n, seed, call_kwargs, "latent").float()
        weight = [0.0]
        for k in range(1, n - 1):
            handle.set("schedule", branch=branch, refresh=[s for s in range(n) if s != k])
            lat = _outputs(pipe, prompts, n, seed, call_kwargs, "latent").float()
            weight.append(float((lat - ref).norm() / ref.norm()))
        weight.append(0.0)  # the last step always runs in full
    finally:
        installed.undo_all(pipe, "step_cache")
    grid = np.linspace(0.0, 1.0, n)
    return StepProfile(tuple(grid.tolist()), tuple(weight), source="sensitivity", runs=len(prompts))


def drift_profile(traces: list[list[dict]]) -> StepProfile:
    """Average the per-step ``drift`` of several run traces (``handle.stats.trace`` after each run).

    Each trace is put on a progress axis from 0 (first step) to 1 (last step), so runs of different
    lengths can be pooled; the profile is their mean on the finest grid among them.
    """
    if not traces:
        raise ValueError("drift_profile needs at least one recorded run trace")
    curves = []
    for i, trace in enumerate(traces):
        drift = [rec.get("drift", 0.0) for rec in trace]
        if len(drift) < 3 or not any(d > 0 for d in drift):
            raise ValueError(
                f"trace {i} has {len(drift)} steps and no drift values: record it with mode='off' on a "
                "run of at least 3 steps"
            )
        curves.append(np.asarray(drift, dtype=float))
    grid = np.linspace(0.0, 1.0, max(len(c) for c in curves))
    mean = np.mean([np.interp(grid, np.linspace(0.0, 1.0, len(c)), c) for c in curves], axis=0)
    if not all(math.isfinite(x) for x in mean):
        raise ValueError("drift values are not finite")
    return StepProfile(tuple(grid.tolist()), tuple(mean.tolist()), source="drift", runs=len(curves))
