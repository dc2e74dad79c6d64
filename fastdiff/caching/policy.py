"""Which steps refresh the cache: the uniform rule, and a schedule planned from a measured step profile.

A :class:`StepProfile` gives each step a weight ``w_k``: how much replaying stale features at step ``k``
costs. Two measurements fill it (:mod:`.profile`):

* ``"sensitivity"`` (the default planner input): the relative change of the final latents when only step
  ``k`` replays the features of step ``k-1``; it measures the harm directly, in the output.
* ``"drift"``: the relative change of the cached feature between consecutive full steps,
  ``||f_k - f_{k-1}|| / ||f_k||`` (Block Caching, Wimbauer et al., CVPR 2024, Sec. 4.1). It is largest at
  the end of sampling, where stale features harm the image least, so it plans worse on fastdiff-tiny
  (kept for comparison and for models where the two agree).

Staleness grows with the distance to the last refresh, so a gap of cached steps after a refresh at ``r``
costs ``sum_k w_k (k - r)``; :func:`plan_refresh` chooses the full steps (first and last included, a
fixed budget) that minimise the total by dynamic programming.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class StepProfile:
    """Measured cost of replaying features per step, against sampling progress (0 = first, 1 = last step)."""

    progress: tuple[float, ...]
    weight: tuple[float, ...]
    source: str = "sensitivity"  # or "drift"
    runs: int = 1

    def __post_init__(self):
        if len(self.progress) != len(self.weight) or len(self.progress) < 2:
            raise ValueError(
                f"StepProfile needs >= 2 (progress, weight) points of equal length, got "
                f"{len(self.progress)} and {len(self.weight)}"
            )
        if any(not math.isfinite(d) or d < 0 for d in self.weight):
            raise ValueError(f"StepProfile weights must be finite and >= 0, got {self.weight}")

    def at(self, num_steps: int) -> np.ndarray:
        """Weight per step for a run of ``num_steps`` (entry 0 is the first step, always full)."""
        p = np.linspace(0.0, 1.0, num_steps)
        d = np.interp(p, np.asarray(self.progress), np.asarray(self.weight))
        d[0] = 0.0
        return d


def uniform_full(step: int, interval: int) -> bool:
    """DeepCache's rule: refresh every ``interval`` steps, counted from the run's first step."""
    return step % interval == 0


def plan_refresh(profile: StepProfile, num_steps: int, num_full: int) -> list[int]:
    """Full steps (0-based, run-relative; first and last included) minimising the summed staleness cost."""
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps!r}")
    if num_full < 1:
        raise ValueError(f"num_full must be >= 1, got {num_full!r}")
    if num_steps <= 2 or num_full >= num_steps:
        return list(range(num_steps))
    n, m = num_steps, max(num_full, 2)
    w = profile.at(n)
    # gap[r, j]: cost of refreshing at r and next at j (steps r+1..j-1 replay r's features)
    k = np.arange(n)
    gap = np.zeros((n, n))
    for r in range(n):
        c = np.cumsum(w[r + 1 :] * (k[r + 1 :] - r))
        gap[r, r + 2 :] = c[: n - r - 2]
    best = np.full((m, n), np.inf)  # best[f, j]: cheapest plan whose (f+1)-th refresh is at j
    prev = np.zeros((m, n), dtype=int)
    best[0, 0] = 0.0
    for f in range(1, m):
        for j in range(1, n):
            cand = best[f - 1, :j] + gap[:j, j]
            r = int(np.argmin(cand))
            best[f, j], prev[f, j] = cand[r], r
    plan, j = [n - 1], n - 1
    for f in range(m - 1, 0, -1):
        j = prev[f, j]
        plan.append(int(j))
    return sorted(set(plan))


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
