"""Measure a :class:`~.policy.StepProfile`: per-step sensitivity (runs the pipeline) or feature drift.

:func:`measure_profile` is the planner's input: for each inner step ``k`` of an ``n``-step run it replays
step ``k-1``'s features at step ``k`` only, and records the relative change of the final latents against
the uncached run. Cost: ``n - 1`` pipeline runs at ``n`` steps (use a short ``n``; the profile is put on a
progress axis and reused for any step count). :func:`drift_profile` turns ``mode="off"`` traces into
the cheaper drift profile.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from fastdiff import installed
from fastdiff.caching.policy import StepProfile


def _latents(pipe, prompts, steps: int, seed: int, call_kwargs: dict) -> torch.Tensor:
    gens = [torch.Generator().manual_seed(seed + i) for i in range(len(prompts))]
    out = pipe(prompts, num_inference_steps=steps, generator=gens, output_type="latent", **call_kwargs)
    return out.images.float()


def measure_profile(
    pipe, prompts: list[str], num_inference_steps: int = 10, branch: int = 0, seed: int = 0, **call_kwargs
) -> StepProfile:
    """Sensitivity of the final latents to replaying features at each step (see the module docstring).

    Args:
        pipe: a diffusers pipeline without a step cache installed (one is installed and removed here).
        prompts: calibration prompts (keep them apart from the prompts you evaluate on).
        num_inference_steps: ``n``; costs ``n - 1`` pipeline runs.
        branch: the branch the profile is for (deeper branches replay less, so harm differs).
        call_kwargs: passed to every pipeline call (guidance_scale, height, ...).
    """
    from fastdiff.caching.cache import step_cache

    n = num_inference_steps
    if not isinstance(n, int) or n < 3:
        raise ValueError(f"num_inference_steps must be an int >= 3, got {n!r}")
    if not prompts:
        raise ValueError("measure_profile needs at least one prompt")
    handle = step_cache(pipe, mode="off", branch=branch)
    try:
        ref = _latents(pipe, prompts, n, seed, call_kwargs)
        weight = [0.0]
        for k in range(1, n - 1):
            handle.set("schedule", branch=branch, refresh=[s for s in range(n) if s != k])
            lat = _latents(pipe, prompts, n, seed, call_kwargs)
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
