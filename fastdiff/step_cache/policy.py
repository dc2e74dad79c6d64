"""Which steps refresh the cache: the uniform rule, and a schedule planned from measured feature drift.

Drift at step ``k`` is the relative change of the cached feature (the input of the branch's partner
layer) between two consecutive full steps, ``d_k = ||f_k - f_{k-1}|| / ||f_k||``. Block Caching
(Wimbauer et al., CVPR 2024, Sec. 4.1) and DeepCache's non-uniform variant (Ma et al. 2024, Sec. 3.3)
both observe that this change is largest at the start and end of sampling; the planner below spends a
fixed number of full steps so that the drift accumulated between refreshes is as even as possible
(the smallest threshold ``τ`` such that greedily refreshing whenever the accumulated drift would exceed
``τ`` needs no more than the budget).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class DriftProfile:
    """Measured feature drift against sampling progress (0 = first step, 1 = last step)."""

    progress: tuple[float, ...]
    drift: tuple[float, ...]
    runs: int = 1

    def __post_init__(self):
        if len(self.progress) != len(self.drift) or len(self.progress) < 2:
            raise ValueError(
                f"DriftProfile needs >= 2 (progress, drift) points of equal length, got "
                f"{len(self.progress)} and {len(self.drift)}"
            )
        if any(not math.isfinite(d) or d < 0 for d in self.drift):
            raise ValueError(f"DriftProfile drift values must be finite and >= 0, got {self.drift}")

    def at(self, num_steps: int) -> np.ndarray:
        """Drift per step for a run of ``num_steps`` (entry 0 is the first step and is 0)."""
        p = np.linspace(0.0, 1.0, num_steps)
        d = np.interp(p, np.asarray(self.progress), np.asarray(self.drift))
        d[0] = 0.0
        return d


def uniform_full(step: int, interval: int) -> bool:
    """DeepCache's rule: refresh every ``interval`` steps, counted from the run's first step."""
    return step % interval == 0


def _greedy(drift: np.ndarray, tau: float) -> list[int]:
    full, acc = [0], 0.0
    for k in range(1, len(drift)):
        acc += drift[k]
        if acc > tau:
            full.append(k)
            acc = 0.0
    if full[-1] != len(drift) - 1:
        full.append(len(drift) - 1)
    return full


def plan_refresh(profile: DriftProfile, num_steps: int, num_full: int) -> list[int]:
    """Steps (0-based, run-relative) that run in full: first, last, and where drift accumulates."""
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps!r}")
    if num_full < 1:
        raise ValueError(f"num_full must be >= 1, got {num_full!r}")
    if num_steps <= 2 or num_full >= num_steps:
        return list(range(num_steps))
    drift = profile.at(num_steps)
    lo, hi = 0.0, float(drift.sum()) + 1.0
    for _ in range(60):  # bisection on tau: the fewest refreshes is monotone in tau
        mid = 0.5 * (lo + hi)
        if len(_greedy(drift, mid)) > max(num_full, 2):
            lo = mid
        else:
            hi = mid
    return _greedy(drift, hi)


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
