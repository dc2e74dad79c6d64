"""Which steps refresh the cache: the uniform rule, a schedule planned from a measured step profile, and
the cached-tail rule (:func:`tail_refresh`) for accuracy at a fixed budget of full evaluations.

A :class:`StepProfile` prices replaying stale features. Its default measured form
(:func:`.profile.measure_profile`) gives each step a weight ``w_k``: the relative change of the final
latents when only step ``k`` replays step ``k-1``'s features. Staleness grows with the distance to the last
refresh, so a gap of cached steps after a refresh at ``r`` costs ``sum_k w_k (k - r)``; :func:`plan_refresh`
chooses the full steps (first and last included, a fixed budget) that minimise the total by dynamic
programming, **with no gap longer than** :func:`default_max_gap`: the larger of the uniform gap and a third
of the run.

Why the bound (#13; ``benchmarks/results/step_cache-plan.json``, train prompts only): the single-step
weights cannot see that one long stretch on old features breaks images. With 4 full evaluations the
unbounded planner chose ``0, 1, 3, 9`` of 10 and ``0, 2, 6, 19`` of 20 (gaps of 2/3 of the run): worst
image 8.1 and 6.5 dB against DeepCache's 14.5 and 11.6 dB; every plan tried with a gap over half the run
lost to DeepCache on the worst image, while at 50 steps with 10 and 17 full evaluations (longest gap under
1/5 of the run) the same planner gained on the mean and on the worst image (at 25 full DeepCache was ahead
by about 1 dB). A third of the run is the uniform gap at 4 full evaluations, so the bound only acts at
such small budgets and leaves larger budgets to the weights.

Tried and not the default: the cost of every whole gap measured on decoded images
(:func:`.profile.measure_gaps`, carried as ``gap_cost`` and interpolated bilinearly in (start, replayed
span) progress for other step counts). It avoided the long gap at 4 of 20 but at 50 steps it put the
refreshes into the first steps and lost to the single-step planner at every 50-step budget (and to
DeepCache on the mean) on the same train prompts: the first calibration step's cost does not transfer to
finer step grids. The
``"drift"`` profile (relative change of the cached feature between consecutive full steps; Block Caching,
Wimbauer et al., CVPR 2024, Sec. 4.1) is largest at the end of sampling, where stale features harm the
image least, so it plans worse on fastdiff-tiny (kept for comparison).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fastdiff._checks import is_int


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
    """Longest refresh-to-refresh distance :func:`plan_refresh` allows by default.

    ``max(ceil((n - 1) / (m - 1)), floor((n - 1) / 3))``: never less than the uniform gap (so a plan
    exists), and no stretch longer than a third of the run on one refresh (see the module docstring).
    """
    n, m = num_steps, max(2, num_full)
    return max(math.ceil((n - 1) / (m - 1)), (n - 1) // 3)


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
    if not is_int(v, numpy=True) or v < lo:
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


def tail_refresh(num_steps: int, num_full: int, spacing: str = "block") -> list[int]:
    """Full steps (0-based, first and last included) that leave the low-noise tail of the run cached.

    For a fixed budget of full evaluations this runs a longer, finer schedule over the high- and mid-noise
    steps, where the solver's error is made, and replays features only near the end, where the image is
    nearly settled. ``spacing="block"``: steps ``0 .. num_full - 2`` and the last; ``"alternate"``: every
    other step from the end is cached (``num_steps - 2, num_steps - 4, ...``), so no two cached steps are
    adjacent (needs ``num_steps - num_full <= (num_steps - 1) // 2``).

    Measured against the converged reference on fastdiff-tiny (#13 goal 3, ``benchmarks/step_cache.py --part
    dynamic --cachefit``, chosen on train prompts): at 16 full evaluations, 19 steps of DPM-Solver++(2M)
    Karras (rho 5) with ``tail_refresh(19, 16, "alternate")`` gave a 30.2 dB worst held-out image, against
    29.3 dB for 20 steps planned by :func:`plan_refresh` (which caches mid-run steps) and 28.7 dB for 16
    uncached steps of the same schedule.
    """
    _check_int("num_steps", num_steps, 1)
    _check_int("num_full", num_full, 1)
    if spacing not in ("block", "alternate"):
        raise ValueError(f"spacing must be 'block' or 'alternate', got {spacing!r}")
    n, m = int(num_steps), max(int(num_full), 2)
    if m >= n:
        return list(range(n))
    cached = n - m
    if spacing == "block":
        return list(range(m - 1)) + [n - 1]
    if cached > (n - 1) // 2:
        raise ValueError(
            f"spacing='alternate' caches every other step from the end, so it can cache at most "
            f"{(n - 1) // 2} of {n} steps; {num_full} full evaluations leave {cached} to cache"
        )
    skip = {n - 2 - 2 * i for i in range(cached)}
    return [k for k in range(n) if k not in skip]


def explicit_refresh(steps: Sequence[int], num_steps: int | None) -> set[int]:
    """Validate a user-given list of run-relative refresh steps."""
    out = set()
    for s in steps:
        if not is_int(s, numpy=True) or s < 0:
            raise ValueError(f"refresh steps must be non-negative ints, got {s!r} in {list(steps)!r}")
        out.add(int(s))
    if num_steps is not None and out and max(out) >= num_steps:
        raise ValueError(f"refresh step {max(out)} is outside a run of {num_steps} steps")
    return out
