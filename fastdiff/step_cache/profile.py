"""Measure a :class:`~.policy.DriftProfile` from runs recorded with ``mode="off"``."""

from __future__ import annotations

import math

import numpy as np

from fastdiff.step_cache.policy import DriftProfile


def drift_profile(traces: list[list[dict]]) -> DriftProfile:
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
    return DriftProfile(tuple(grid.tolist()), tuple(mean.tolist()), runs=len(curves))
