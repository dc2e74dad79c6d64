"""Which steps refresh the cache: the uniform rule, and a schedule planned from a measured step profile.

A :class:`StepProfile` prices replaying stale features. Its measured form (:func:`.profile.measure_profile`)
holds a **gap cost** ``G[a, c]``: the mean squared change of the decoded images (against the uncached run,
train prompts) when the ``c`` steps after a full step ``a`` replay its features and every other step runs in
full, for every ``a`` and ``c`` of a short calibration run. :func:`plan_refresh` chooses the full steps
(first and last included, a fixed budget, no gap longer than a bound) that minimise the summed cost of
their gaps by dynamic programming; squared errors of separate gaps add when they are independent, so the
sum estimates the plan's mean squared error.

Why a measured gap cost, and why in image space (``benchmarks/results/step_cache-plan.json``, train
prompts): the earlier planner priced a gap as ``sum_k w_k (k - r)``, from single-step sensitivities ``w_k``
of the final *latents*. Measured directly, longer gaps do not follow any one power of the distance, and at
4 full steps of 10 it chose ``0, 1, 3, 9`` (one long gap), which broke images that DeepCache's ``0, 3, 6, 9``
keeps. The matrix also shows the latent norm mis-ranking those plans against the image metric, so the cost
is measured on decoded images, the quantity the goal is judged on.

Other step counts: a gap of ``c`` replayed steps after step ``r`` of an ``n``-step run covers progress
``r / (n-1)`` to ``(r + c) / (n-1)``; its cost is ``G`` interpolated bilinearly at (start, replayed span) on
the calibration grid, zero for no replayed step. Profiles without a measured ``gap_cost`` (hand-made, or the
``"drift"`` profile: relative change of the cached feature between consecutive full steps, Block Caching,
Wimbauer et al., CVPR 2024, Sec. 4.1) price a gap as ``sum_k w_k (k - r)`` from their per-step weights.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class StepProfile:
    """Measured cost of replaying features, against sampling progress (0 = first, 1 = last step).

    ``weight[i]``: replaying only the step at ``progress[i]`` (from the step before). ``gap_cost``
    (optional, on the same grid): ``gap_cost[a][c]`` for ``c`` replayed steps after full step ``a``
    (``gap_cost[a][0] = 0``; entries past the run's end are ignored).
    """

    progress: tuple[float, ...]
    weight: tuple[float, ...]
    source: str = "sensitivity"  # or "drift"
    runs: int = 1
    gap_cost: tuple[tuple[float, ...], ...] | None = None

    def __post_init__(self):
        if len(self.progress) != len(self.weight) or len(self.progress) < 2:
            raise ValueError(
                f"StepProfile needs >= 2 (progress, weight) points of equal length, got "
                f"{len(self.progress)} and {len(self.weight)}"
            )
        if any(not math.isfinite(d) or d < 0 for d in self.weight):
            raise ValueError(f"StepProfile weights must be finite and >= 0, got {self.weight}")
        if self.gap_cost is not None:
            g = np.asarray(self.gap_cost, dtype=float)
            n = len(self.progress)
            if g.shape != (n, n) or not np.all(np.isfinite(g)) or np.any(g < 0):
                raise ValueError(
                    f"StepProfile gap_cost must be a {n}x{n} table of finite values >= 0 (one row per "
                    f"progress point), got shape {g.shape}"
                )

    def at(self, num_steps: int) -> np.ndarray:
        """Weight per step for a run of ``num_steps`` (entry 0 is the first step, always full)."""
        p = np.linspace(0.0, 1.0, num_steps)
        d = np.interp(p, np.asarray(self.progress), np.asarray(self.weight))
        d[0] = 0.0
        return d


def uniform_full(step: int, interval: int) -> bool:
    """DeepCache's rule: refresh every ``interval`` steps, counted from the run's first step."""
    return step % interval == 0


def default_max_gap(num_steps: int, num_full: int) -> int:
    """Longest refresh-to-refresh distance :func:`plan_refresh` allows by default: twice the uniform one.

    A safety bound, not the planner's main guard (the measured gap cost is): it keeps any profile, measured
    or hand-made, from leaving one stretch of the run on features refreshed far back.
    """
    return 2 * math.ceil((num_steps - 1) / max(1, num_full - 1))


def _measured_costs(profile: StepProfile, n: int) -> np.ndarray:
    g = np.asarray(profile.gap_cost, dtype=float)
    m = g.shape[0]
    # entries past the calibration run's end: the same span started as late as it fits
    for c in range(m):
        last = m - 2 - c
        if last >= 0:
            g[last + 1 :, c] = g[last, c]
        else:
            g[:, c] = g[0, max(0, m - 2)] if c else 0.0
    g[:, 0] = 0.0
    scale = (m - 1) / (n - 1)  # calibration steps per step of this run
    cost = np.zeros((n, n))
    for r in range(n):
        for j in range(r + 2, n):
            x, y = min(r * scale, m - 1.0), min((j - r - 1) * scale, m - 1.0)
            x0, y0 = min(int(x), m - 2), min(int(y), m - 2)
            fx, fy = x - x0, y - y0
            cost[r, j] = (
                g[x0, y0] * (1 - fx) * (1 - fy)
                + g[x0 + 1, y0] * fx * (1 - fy)
                + g[x0, y0 + 1] * (1 - fx) * fy
                + g[x0 + 1, y0 + 1] * fx * fy
            )
    return cost


def gap_costs(profile: StepProfile, num_steps: int) -> np.ndarray:
    """``cost[r, j]``: steps ``r+1 .. j-1`` replay step ``r``'s features (see the module docstring)."""
    n = num_steps
    if profile.gap_cost is not None and len(profile.progress) >= 3 and n >= 3:
        return _measured_costs(profile, n)
    w = profile.at(n)
    k = np.arange(n)
    cost = np.zeros((n, n))
    for r in range(n):
        c = np.cumsum(w[r + 1 :] * (k[r + 1 :] - r))
        cost[r, r + 2 :] = c[: n - r - 2]
    return cost


def _check_int(name: str, v, lo: int) -> None:
    if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v < lo:
        raise ValueError(f"{name} must be an int >= {lo}, got {v!r}")


def plan_refresh(
    profile: StepProfile, num_steps: int, num_full: int, max_gap: int | None = None
) -> list[int]:
    """Full steps (0-based, run-relative; first and last included) minimising the summed gap cost.

    Exactly ``min(max(num_full, 2), num_steps)`` steps, no two consecutive full steps further apart than
    ``max_gap`` (default :func:`default_max_gap`; raised to the smallest feasible bound
    ``ceil((num_steps - 1) / (num_full - 1))`` if given lower). Dynamic programming over refresh
    positions: ``best[f, j]`` is the cheapest plan whose ``(f+1)``-th full step is step ``j``.
    """
    _check_int("num_steps", num_steps, 1)
    _check_int("num_full", num_full, 1)
    if max_gap is not None:
        _check_int("max_gap", max_gap, 1)
    if num_steps <= 2 or num_full >= num_steps:
        return list(range(num_steps))
    n, m = int(num_steps), max(int(num_full), 2)
    bound = max(default_max_gap(n, m) if max_gap is None else int(max_gap), math.ceil((n - 1) / (m - 1)))
    gap = gap_costs(profile, n)
    gap[np.arange(n)[None, :] - np.arange(n)[:, None] > bound] = np.inf
    best = np.full((m, n), np.inf)
    prev = np.zeros((m, n), dtype=int)
    best[0, 0] = 0.0
    for f in range(1, m):
        for j in range(f, n):
            cand = best[f - 1, :j] + gap[:j, j]
            r = int(np.argmin(cand))
            best[f, j], prev[f, j] = cand[r], r
    plan, j = [n - 1], n - 1
    for f in range(m - 1, 0, -1):
        j = int(prev[f, j])
        plan.append(j)
    return sorted(plan)


def explicit_refresh(steps: Sequence[int], num_steps: int | None) -> set[int]:
    """Validate a user-given list of run-relative refresh steps."""
    out = set()
    for s in steps:
        if not isinstance(s, (int, np.integer)) or isinstance(s, bool) or s < 0:
            raise ValueError(f"refresh steps must be non-negative ints, got {s!r} in {list(steps)!r}")
        out.add(int(s))
    if num_steps is not None and out and max(out) >= num_steps:
        raise ValueError(f"refresh step {max(out)} is outside a run of {num_steps} steps")
    return out
