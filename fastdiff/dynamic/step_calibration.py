"""Calibrating and judging ``steps="auto"``: the steps each image needs, rank correlation, the table fit.

The question a step planner must answer is "how many steps does *this* image need?". Here that need is
measured directly: for every image, the fewest steps of a fixed candidate list whose output reaches
``threshold_db`` PSNR against the same noise's long reference run (:func:`steps_needed`). A complexity
signal is worth using only if it predicts that need, judged by Spearman's rank correlation
(:func:`spearman`, Spearman 1904: Pearson's correlation of the ranks).
:func:`fit_bins` turns (signal, need) pairs into the table :class:`~fastdiff.dynamic.AutoSteps` reads.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from fastdiff._checks import is_number

__all__ = ["steps_needed", "spearman", "fit_bins", "NOT_REACHED"]

NOT_REACHED = math.inf  # the need of an image that no candidate brought to the threshold


def steps_needed(psnr_by_steps: Mapping[int, float], threshold_db: float) -> float:
    """Fewest candidate steps whose PSNR against the reference is >= ``threshold_db``.

    Args:
        psnr_by_steps: {steps: PSNR in dB of that step count's image against the reference}.
        threshold_db: the fidelity target.

    Returns:
        The step count, or :data:`NOT_REACHED` (inf) when no candidate reached the threshold.
    """
    if not psnr_by_steps:
        raise ValueError("psnr_by_steps is empty: give at least one {steps: PSNR} entry")
    for steps in sorted(psnr_by_steps):
        value = psnr_by_steps[steps]
        if not is_number(value) or math.isnan(value):
            raise ValueError(f"psnr_by_steps[{steps}] must be a number, got {value!r}")
        if value >= threshold_db:
            return steps
    return NOT_REACHED


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rank correlation of ``x`` and ``y`` (:func:`scipy.stats.spearmanr`; inf ranks last, ties share
    their mean rank); NaN when either is constant."""
    if len(x) != len(y):
        raise ValueError(f"spearman needs equal lengths, got {len(x)} and {len(y)}")
    if len(x) < 2:
        raise ValueError(f"spearman needs at least 2 pairs, got {len(x)}")
    if any(isinstance(v, float) and math.isnan(v) for v in (*x, *y)):
        raise ValueError("spearman got NaN; drop those pairs first")
    if len(set(x)) == 1 or len(set(y)) == 1:
        return math.nan  # scipy returns NaN too, with a warning
    from scipy.stats import spearmanr  # here, not at import: scipy.stats takes ~0.3 s to load

    return float(spearmanr(x, y).statistic)


def fit_bins(
    signal: Sequence[float], need: Sequence[float], *, bins: int, min_steps: int, max_steps: int
) -> list[list[float]]:
    """A step table for one prompt tier: ``[[upper bound of the signal, steps], ...]``.

    Calibration images are split into ``bins`` equal-count groups by signal. A bin's step count is the
    largest need among its images and every lower bin's (so the table never gives a larger signal fewer
    steps), clamped to ``[min_steps, max_steps]``; an image no candidate satisfied counts as
    ``max_steps``. The last bound is ``inf``, so every signal value falls in some bin.
    """
    if len(signal) != len(need) or not signal:
        raise ValueError(
            f"fit_bins needs equal, non-empty signal and need; got {len(signal)} and {len(need)}"
        )
    if not isinstance(bins, int) or bins < 1:
        raise ValueError(f"bins must be an int >= 1, got {bins!r}")
    if not 1 <= min_steps <= max_steps:
        raise ValueError(f"need 1 <= min_steps <= max_steps, got {min_steps} and {max_steps}")
    pairs = sorted(zip(signal, need))
    bins = min(bins, len(pairs))
    table, running = [], min_steps
    for k in range(bins):
        part = pairs[k * len(pairs) // bins : (k + 1) * len(pairs) // bins]
        running = max(running, *(min(n, max_steps) for _, n in part))
        upper = math.inf if k == bins - 1 else float(part[-1][0])
        table.append([upper, int(min(max_steps, running))])
    return table
