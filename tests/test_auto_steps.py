"""steps="auto": the calibration statistics, the table fit, tier tables, the committed table, presets.

Each statistic is checked against an independent computation (scipy's Spearman, a brute-force "fewest
steps" search, the fitted table's guarantee re-checked image by image).
"""

from __future__ import annotations

import math
import random

import pytest
import torch
from diffusers import DPMSolverMultistepScheduler
from hypothesis import given, settings
from hypothesis import strategies as st

from fastdiff.dynamic import AutoSteps, sample
from fastdiff.dynamic import step_calibration as cal
from fastdiff.dynamic.auto_steps import prompt_tier
from fastdiff.dynamic.presets import PRESETS, resolve_steps

SD_BETAS = dict(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear")

psnr_maps = st.dictionaries(
    st.sampled_from([4, 6, 8, 10, 12, 15, 20, 25, 30]), st.floats(0, 60, allow_nan=False), min_size=1
)


@given(psnr_maps, st.floats(10, 50))
@settings(max_examples=200, deadline=None)
def test_steps_needed_is_the_fewest_candidate_reaching_the_threshold(psnr, threshold):
    reached = [n for n, p in psnr.items() if p >= threshold]  # brute force over every candidate
    expected = min(reached) if reached else math.inf
    assert cal.steps_needed(psnr, threshold) == expected


def test_steps_needed_rejects_bad_input():
    with pytest.raises(ValueError, match="empty"):
        cal.steps_needed({}, 30.0)
    with pytest.raises(ValueError, match=r"psnr_by_steps\[8\].*nan"):
        cal.steps_needed({8: float("nan")}, 30.0)


def test_spearman_handles_unreached_needs_and_known_values():
    assert cal.spearman([1, 2, 3, 4], [10, 20, 30, math.inf]) == pytest.approx(1.0)  # inf ranks last
    assert cal.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert math.isnan(cal.spearman([1, 1, 1], [1, 2, 3]))
    # ties share their mean rank: ranks (1, 2.5, 2.5, 4) and (1, 3, 2, 4), Pearson 4.5 / sqrt(4.5 * 5)
    assert cal.spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(4.5 / math.sqrt(22.5))
    with pytest.raises(ValueError, match="equal lengths"):
        cal.spearman([1, 2], [1, 2, 3])


@given(
    st.lists(
        st.tuples(st.floats(0, 1, allow_nan=False), st.sampled_from([8, 10, 12, 16, 20, 25, math.inf])),
        min_size=1,
        max_size=60,
        unique_by=lambda p: p[0],
    ),
    st.integers(1, 5),
)
@settings(max_examples=200, deadline=None)
def test_fit_bins_gives_every_calibration_image_its_need(pairs, bins):
    signal, need = [p[0] for p in pairs], [p[1] for p in pairs]
    table = cal.fit_bins(signal, need, bins=bins, min_steps=8, max_steps=30)
    bounds, steps = [b for b, _ in table], [n for _, n in table]
    assert len(table) == min(bins, len(pairs)) and bounds[-1] == math.inf
    assert bounds == sorted(bounds) and steps == sorted(steps)
    assert all(8 <= n <= 30 for n in steps)
    for s, n in pairs:  # the table's lookup rule: the first bin whose upper bound holds the signal
        got = next(k for b, k in table if s <= b)
        assert got >= min(n, 30), f"signal {s} needs {n} but the table gives {got}"
    # and it is tight: the largest need (clamped) is exactly the last bin's count
    assert steps[-1] == max(8, min(30, max(need)))


def test_fit_bins_rejects_bad_arguments():
    with pytest.raises(ValueError, match="equal, non-empty"):
        cal.fit_bins([], [], bins=2, min_steps=8, max_steps=30)
    with pytest.raises(ValueError, match="bins must be"):
        cal.fit_bins([0.1], [8], bins=0, min_steps=8, max_steps=30)
    with pytest.raises(ValueError, match="min_steps <= max_steps"):
        cal.fit_bins([0.1], [8], bins=1, min_steps=30, max_steps=8)


class GaussianData:
    """Exact eps-model for data N(mu, s^2 I) on SD's schedule (posterior mean of x0 in closed form)."""

    def __init__(self, mu, s, scheduler):
        self.mu, self.s = mu.double(), s
        self.abar = scheduler.alphas_cumprod.double()

    def __call__(self, x, t, rows=None):
        abar = self.abar[torch.as_tensor(t).long().reshape(-1)].reshape(-1, 1, 1, 1)
        alpha, sigma = abar.sqrt(), (1 - abar).sqrt()
        mu = self.mu if rows is None else self.mu[rows]
        xd = x.double()
        x0 = mu + alpha * self.s**2 / (alpha**2 * self.s**2 + sigma**2) * (xd - alpha * mu)
        return ((xd - alpha * x0) / sigma).to(x.dtype)


def test_tier_table_ignores_the_probe_and_wastes_no_evaluation():
    sch = DPMSolverMultistepScheduler(algorithm_type="dpmsolver++", solver_order=2, **SD_BETAS)
    g = torch.Generator().manual_seed(0)
    mu, x = torch.randn(2, 4, 8, 8, generator=g), torch.randn(2, 4, 8, 8, generator=g)
    table = {
        "signal": "tier",
        "probe_steps": 1,
        "tiers": {"neutral": [[math.inf, 10]], "detailed": [[math.inf, 14]]},
    }
    auto = AutoSteps(
        ["a red circle on a blue background", "a red circle on a noisy blue background"], table=table
    )
    assert auto.probe_steps == 1, "the table's probe length is the default"
    res = sample(GaussianData(mu, 0.5, sch), x, scheduler=sch, num_inference_steps=auto)
    assert res.num_steps == [10, 14]
    assert res.nfe_per_sample == [10, 14], "a one-step probe's evaluation is reused by the chosen schedule"
    assert "probe high-frequency" not in res.notes[0] and "tier 'detailed'" in res.notes[1]
    for r, n in enumerate([10, 14]):  # each row equals a plain run of its chosen length
        solo = sample(
            GaussianData(mu[r : r + 1], 0.5, sch), x[r : r + 1], scheduler=sch, num_inference_steps=n
        )
        assert (res.latents[r] - solo.latents[0]).abs().max() < 1e-5
    # the same prompts get the same steps whatever their x0 looks like
    choices = auto.choose(torch.randn(2, 4, 8, 8) * 100)
    assert [c.steps for c in choices] == [10, 14]


def test_unknown_table_signal_is_refused():
    with pytest.raises(ValueError, match="signal must be one of.*'spectral'"):
        AutoSteps(table={"signal": "spectral", "tiers": {"neutral": [[1.0, 10]]}})


def test_auto_reads_every_held_out_tiny_prompt_into_a_known_tier():
    from fastdiff.tiny.data import list_prompts

    tiers = {prompt_tier(p)[0] for p, _ in list_prompts("heldout")}
    assert tiers <= {"neutral", "detailed"}, "tiny prompts are plain (neutral) or textured (detailed)"


def test_presets_resolve_to_their_step_counts():
    assert set(PRESETS) == {"fast", "balanced", "quality"}
    counts = [PRESETS[k] for k in ("fast", "balanced", "quality")]
    assert counts == sorted(counts) and len(set(counts)) == 3, "fast < balanced < quality"
    for name, n in PRESETS.items():
        assert resolve_steps(name.upper())[0] == n
    assert resolve_steps("auto")[0] == "auto"
    with pytest.raises(ValueError, match="unknown steps preset 'turbo'"):
        resolve_steps("turbo")


def test_spearman_is_invariant_to_monotone_transforms():
    rnd = random.Random(3)
    x = [rnd.random() for _ in range(30)]
    y = [v + rnd.random() * 0.3 for v in x]
    assert cal.spearman(x, y) == pytest.approx(cal.spearman([math.exp(5 * v) for v in x], [v**3 for v in y]))


def test_x0_contrast_is_the_spatial_std_and_the_table_sign_orients_it():
    import numpy as np

    from fastdiff.dynamic.auto_steps import x0_contrast

    scale = torch.tensor([0.1, 1.0, 3.0]).view(3, 1, 1, 1)
    x = torch.randn(3, 4, 8, 8, generator=torch.Generator().manual_seed(1)) * scale
    ref = [np.mean([np.std(x[b, c].numpy().astype(np.float64), ddof=1) for c in range(4)]) for b in range(3)]
    assert x0_contrast(x).tolist() == pytest.approx(ref, rel=1e-5)
    assert x0_contrast(x + 7.0).tolist() == pytest.approx(ref, rel=1e-5), "brightness is not contrast"
    with pytest.raises(ValueError, match="B, C, H, W"):
        x0_contrast(torch.zeros(4, 8, 8))
    bins = [[0.5, 8], [2.0, 12], [math.inf, 20]]
    auto = AutoSteps(None, table={"signal": "x0_contrast", "tiers": {"neutral": bins}})
    assert [c.steps for c in auto.choose(x)] == [8, 12, 20], "more contrast, more steps"
    assert "x0 contrast" in auto.choose(x)[0].reason
    flipped = AutoSteps(
        None,
        table={
            "signal": "x0_contrast",
            "sign": -1,
            "tiers": {"neutral": [[-2.0, 8], [-0.5, 12], [math.inf, 20]]},
        },
    )
    assert [c.steps for c in flipped.choose(x)] == [20, 12, 8], "sign -1: less contrast, more steps"
    with pytest.raises(ValueError, match="sign must be 1 or -1, got 2"):
        AutoSteps(table={"signal": "x0_contrast", "sign": 2, "tiers": {"neutral": bins}})


def test_committed_table_is_calibrated_on_shipped_weights_and_reports_its_signal():
    from fastdiff.dynamic.auto_steps_table import TABLE

    meta = TABLE["meta"]
    assert "/tmp" not in meta["weights"] and "shipped" in meta["weights"]
    assert "train" in meta["prompts"], "calibrated on train-split prompts (held-out ones judge it)"
    assert TABLE["signal"] in ("hf_energy", "x0_contrast", "tier") and 1 <= TABLE["probe_steps"] <= 8
    assert set(meta["spearman_train"]) >= {"tier", "hf_energy@2"}
    chosen = meta["chosen_signal"]
    assert chosen == "none" or abs(meta["spearman_train"][chosen]) >= 0.3, "a weak signal is dropped"
    auto = AutoSteps()
    assert auto.probe_steps == TABLE["probe_steps"] and auto.signal == TABLE["signal"]
