"""Refresh planner (#13): guarantees of plan_refresh, optimality against brute force, the long-gap failure.

References are independent of the planner: plan costs are summed straight from the profile's gap table
(or from the per-step weights) over every possible plan.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from fastdiff.caching import StepProfile, plan_refresh
from fastdiff.caching.policy import default_max_gap, gap_costs

# The previous planner's input measured on fastdiff-tiny (benchmarks/results/step_cache-tiny50.json before
# the gap fix: single steps replayed alone, pooled latent change, 10-step calibration).
PREVIOUS_WEIGHTS = (0.0, 0.319, 0.0857, 0.1329, 0.032, 0.0317, 0.0191, 0.0201, 0.0305, 0.0)


def _grid(n):
    return tuple(i / (n - 1) for i in range(n))


def _measured(rng, n_cal):
    """A random measured-style profile: gap_cost[a][c] for c replayed steps after a (0 past the end)."""
    g = np.zeros((n_cal, n_cal))
    for a in range(n_cal):
        for c in range(1, n_cal - a - 1):
            g[a, c] = g[a, c - 1] + rng.random() * (2.0 if a < 2 else 0.3)
    weight = [0.0] + [g[k - 1, 1] for k in range(1, n_cal - 1)] + [0.0]
    return StepProfile(_grid(n_cal), tuple(weight), gap_cost=tuple(map(tuple, g)))


def _bound(n, m, max_gap=None):
    m = max(m, 2)
    return max(default_max_gap(n, m) if max_gap is None else max_gap, math.ceil((n - 1) / (m - 1)))


@pytest.mark.parametrize("seed", range(4))
def test_plan_keeps_first_last_budget_and_gap_bound(seed):
    rng = np.random.default_rng(seed)
    prof = _measured(rng, int(rng.integers(4, 11)))
    flat = StepProfile(_grid(5), tuple(rng.random(5)))
    for n in (3, 4, 7, 10, 20, 33, 50):
        for m in sorted({1, 2, 3, 4, n // 3, n // 2, n - 1, n, n + 2} - {0}):
            for p in (prof, flat):
                for max_gap in (None, 1, 3):
                    plan = plan_refresh(p, n, m, max_gap=max_gap)
                    assert plan[0] == 0 and plan[-1] == n - 1, (n, m, plan)
                    assert plan == sorted(set(plan))
                    assert len(plan) == min(n, max(m, 2)), (n, m, plan)
                    assert max(np.diff(plan)) <= _bound(n, m, max_gap), (n, m, max_gap, plan)


@pytest.mark.parametrize("seed", range(3))
def test_plan_minimises_the_measured_gap_cost(seed):
    rng = np.random.default_rng(10 + seed)
    n = 9
    prof = _measured(rng, n)
    table = np.asarray(prof.gap_cost)

    def cost(plan):  # straight from the table: gap r -> j replays j - r - 1 steps after r
        return sum(table[r, j - r - 1] for r, j in zip(plan, plan[1:]))

    for m in (3, 4, 5):
        bound = _bound(n, m)
        plans = [
            [0, *mid, n - 1]
            for mid in itertools.combinations(range(1, n - 1), m - 2)
            if max(np.diff([0, *mid, n - 1])) <= bound
        ]
        best = min(cost(p) for p in plans)
        got = plan_refresh(prof, n, m)
        assert cost(got) == pytest.approx(best), (m, got)


def test_measured_cost_maps_gaps_by_progress():
    rng = np.random.default_rng(3)
    prof = _measured(rng, 6)
    table = np.asarray(prof.gap_cost)
    same = gap_costs(prof, 6)
    for r in range(6):
        for j in range(r + 2, 6):
            assert same[r, j] == pytest.approx(table[r, j - r - 1])
    fine = gap_costs(prof, 11)  # half-size steps: step 2r starts where calibration step r did
    assert fine[2, 5] == pytest.approx(table[1, 1])  # 2 replayed half steps = 1 calibration step
    assert fine[4, 9] == pytest.approx(table[2, 2])
    assert fine[2, 4] == pytest.approx(0.5 * table[1, 1])  # one half step: halfway from 0
    assert all(fine[r, r + 1] == 0 for r in range(10))


def test_long_gap_of_the_previous_planner_is_refused():
    """With <= 4 full evaluations the old planner left one long gap before the last step and broke images.

    Fails on the previous plan_refresh (no bound): it returned 0, 1, 3, 9 at 4 of 10 and 0, 2, 6, 19 at
    4 of 20 for this profile (gaps of 2/3 of the run).
    """
    prof = StepProfile(_grid(10), PREVIOUS_WEIGHTS)
    assert plan_refresh(prof, 10, 4) == [0, 3, 6, 9]  # the only plan with no gap over a third of the run
    for n, m, longest in ((20, 4, 7), (10, 3, 5), (50, 4, 17), (31, 4, 10)):
        plan = plan_refresh(prof, n, m)
        assert len(plan) == m and max(np.diff(plan)) <= longest, (n, m, plan)
    # larger budgets keep the measured placement: the 50-step plan is the unbounded one
    assert plan_refresh(prof, 50, 10) == plan_refresh(prof, 50, 10, max_gap=49)
    assert plan_refresh(prof, 50, 10)[:4] == [0, 3, 6, 9]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(num_steps=0, num_full=2), "num_steps"),
        (dict(num_steps=10, num_full=0), "num_full"),
        (dict(num_steps=10, num_full=2.5), "num_full"),
        (dict(num_steps=10, num_full=3, max_gap=0), "max_gap"),
        (dict(num_steps=10, num_full=3, max_gap=True), "max_gap"),
    ],
)
def test_bad_plan_arguments_name_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        plan_refresh(StepProfile(_grid(3), (0.0, 1.0, 0.0)), **kwargs)


def test_bad_gap_table_is_refused():
    with pytest.raises(ValueError, match="gap_cost must be a 3x3"):
        StepProfile(_grid(3), (0.0, 1.0, 0.0), gap_cost=((0.0, 1.0), (0.0, 0.0)))
    with pytest.raises(ValueError, match="gap_cost"):
        StepProfile(_grid(3), (0.0, 1.0, 0.0), gap_cost=((0.0, -1.0, 0), (0, 0, 0), (0, 0, 0)))


# ----------------------------------------------------------------------------------- tail_refresh (#13 goal 3)
def test_tail_refresh_hand_written_plans():
    from fastdiff.caching import tail_refresh

    assert tail_refresh(20, 16) == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 19]
    assert tail_refresh(18, 16, "alternate") == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 15, 17]
    assert tail_refresh(7, 4, "alternate") == [0, 2, 4, 6]
    assert tail_refresh(7, 4) == [0, 1, 2, 6]
    assert tail_refresh(5, 1) == [0, 4]  # the first and last steps always run in full
    assert tail_refresh(4, 9) == [0, 1, 2, 3]


@pytest.mark.parametrize("spacing", ["block", "alternate"])
def test_tail_refresh_caches_only_the_tail(spacing):
    from fastdiff.caching import tail_refresh

    for n in range(1, 40):
        for m in range(1, n + 3):
            k = n - max(m, 2)
            if spacing == "alternate" and k > (n - 1) // 2:
                with pytest.raises(ValueError, match="at most"):
                    tail_refresh(n, m, spacing)
                continue
            full = tail_refresh(n, m, spacing)
            assert full == sorted(set(full)) and full[0] == 0 and full[-1] == n - 1
            assert len(full) == min(max(m, 2), n)
            cached = [s for s in range(n) if s not in full]
            if not cached:
                continue
            if spacing == "block":  # one run of cached steps ending just before the last step
                assert cached == list(range(n - 1 - len(cached), n - 1))
            else:  # no two cached steps adjacent, all within the last 2 * len(cached) steps
                assert all(b - a >= 2 for a, b in itertools.pairwise(cached))
                assert cached[0] >= n - 1 - 2 * len(cached)


def test_tail_refresh_rejects_bad_input():
    from fastdiff.caching import tail_refresh

    with pytest.raises(ValueError, match="spacing must be"):
        tail_refresh(10, 5, "middle")
    with pytest.raises(ValueError, match="num_steps must be an int"):
        tail_refresh(0, 5)
    with pytest.raises(ValueError, match="num_full must be an int"):
        tail_refresh(10, 2.5)
