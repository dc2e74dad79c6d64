"""fastdiff.dynamic: the sampling loop, EarlyStop, AutoSteps, pause/resume, LCM draft + refine.

Most tests use an exact per-row Gaussian denoiser (data x0 ~ N(mu_r, s_r^2 I) for row r), so that rows
converge at different speeds and every result has a closed-form meaning; a tiny random U-Net checks the
conditioning path.
"""

from __future__ import annotations

import math

import pytest
import torch
from diffusers import DDIMScheduler, EulerDiscreteScheduler
from dynamic_helpers import SD_BETAS, GaussianRows, dpm, gaussian_case, reference_loop, tiny_unet
from hypothesis import given, settings
from hypothesis import strategies as st

from fastdiff.dynamic import AutoSteps, EarlyStop, cfg_model_fn, draft_and_refine, resume, sample
from fastdiff.dynamic.adapters import predicted_x0
from fastdiff.dynamic.auto_steps import high_frequency_energy, prompt_tier
from fastdiff.dynamic.draft import renoise


@pytest.mark.parametrize(
    "make", [dpm, lambda: DDIMScheduler(**SD_BETAS), lambda: EulerDiscreteScheduler(**SD_BETAS)], ids=str
)
def test_sample_matches_plain_diffusers_loop(make):
    sch = make()
    mu, s, x = gaussian_case()
    model = GaussianRows(mu, s, sch)
    ref = reference_loop(model, sch, x, 7)
    res = sample(model, x * sch.init_noise_sigma, scheduler=sch, num_inference_steps=7)
    assert torch.equal(res.latents, ref)
    assert res.nfe == 7 and res.steps_run == [7, 7, 7] and res.stopped_early == [False] * 3
    assert len(res.trace) == 7 and res.finished
    assert sch.num_inference_steps is None, "the caller's scheduler must not be mutated"


def test_early_stop_per_sample_equals_solo_runs_and_shrinks_batch():
    sch = dpm()
    mu, s, x = gaussian_case()
    model = GaussianRows(mu, s, sch)
    stop = dict(rtol=0.05, patience=2, min_steps=3, max_sigma=None)
    res = sample(model, x, scheduler=sch, num_inference_steps=30, controller=EarlyStop(**stop))
    assert len(set(res.steps_run)) > 1, "rows must stop at different steps for this test to mean anything"
    assert any(res.stopped_early) and min(res.steps_run) < 30
    # the model saw only the rows still running: batch sizes never grow and end below the full batch
    assert model.batch_sizes == sorted(model.batch_sizes, reverse=True) and model.batch_sizes[-1] < 3
    assert res.nfe_per_sample == res.steps_run
    for r in range(3):
        solo_model = GaussianRows(mu[r : r + 1], s[r : r + 1], sch)
        solo = sample(
            solo_model, x[r : r + 1], scheduler=sch, num_inference_steps=30, controller=EarlyStop(**stop)
        )
        assert solo.steps_run == [res.steps_run[r]]
        err = (res.latents[r] - solo.latents[0]).norm() / solo.latents[0].norm()
        assert err < 1e-5


def test_early_stop_returns_x0_prediction_not_noisy_state():
    sch = dpm()
    mu, s, x = gaussian_case()
    model = GaussianRows(mu, s, sch)
    seen = []
    res = sample(
        model,
        x,
        scheduler=sch,
        num_inference_steps=30,
        controller=EarlyStop(rtol=0.05, patience=1, min_steps=2, max_sigma=None),
        callback=lambda rec, x0: seen.append(x0.clone()),
    )
    r = 2  # the near-delta row converges at once
    k = res.steps_run[r]
    assert res.stopped_early[r] and k < 30
    assert torch.equal(res.latents[r], seen[k - 1][r])
    # the scheduler state at that step still carries noise; x0 is (nearly) the final answer
    x_t = sample(model, x, scheduler=sch, num_inference_steps=30, stop_after=k).state.tracks[0].x[r]
    exact = reference_loop(model, sch, x, 30)[r]
    assert (res.latents[r] - exact).norm() < 0.01 * (x_t - exact).norm()


def test_early_stop_waits_for_low_noise():
    sch = dpm()
    mu, s, x = gaussian_case()
    res = sample(
        GaussianRows(mu, s, sch),
        x,
        scheduler=sch,
        num_inference_steps=30,
        controller=EarlyStop(rtol=0.05, patience=1, min_steps=2, max_sigma=1.0),
    )
    assert res.stopped_early[2], "the near-delta row converges at once and must still stop"
    for rec in res.trace:
        for r in rec.stopped:
            assert rec.sigma[r] <= 1.0
    # without the guard it stops at the first allowed step, at a high noise level
    early = sample(
        GaussianRows(mu, s, sch),
        x,
        scheduler=sch,
        num_inference_steps=30,
        controller=EarlyStop(rtol=0.05, patience=1, min_steps=2, max_sigma=None),
    )
    assert early.steps_run[2] == 2 < res.steps_run[2]


def test_trace_has_what_a_notebook_plots():
    sch = dpm()
    mu, s, x = gaussian_case()
    res = sample(GaussianRows(mu, s, sch), x, scheduler=sch, num_inference_steps=5)
    table = res.trace_table()
    assert table["t"].shape == (5, 3) and table["sigma"].shape == (5, 3)
    assert torch.isnan(table["x0_change"][0]).all() and torch.isfinite(table["x0_change"][1:]).all()
    assert (table["sigma"][1:] < table["sigma"][:-1]).all()
    assert table["nfe"].tolist() == [1, 2, 3, 4, 5]


@settings(max_examples=6, deadline=None)
@given(k=st.integers(0, 9), per_row=st.booleans())
def test_pause_and_resume_equals_uninterrupted_run(k, per_row):
    sch = dpm()
    mu, s, x = gaussian_case()
    controller = EarlyStop(rtol=1e-9) if per_row else None  # never fires, but forces per-row solvers
    full = sample(GaussianRows(mu, s, sch), x, scheduler=sch, num_inference_steps=10, controller=controller)
    model = GaussianRows(mu, s, sch)
    part = sample(model, x, scheduler=sch, num_inference_steps=10, controller=controller, stop_after=k)
    assert not part.finished and part.steps_run == [k] * 3
    done = resume(part.state)
    assert (done.latents - full.latents).abs().max() <= 1e-5 * full.latents.abs().max()
    assert done.nfe == 10
    with pytest.raises(ValueError, match="already finished"):
        resume(part.state)


def test_preview_is_the_current_x0_prediction():
    sch = dpm()
    mu, s, x = gaussian_case()
    seen = []
    part = sample(
        GaussianRows(mu, s, sch),
        x,
        scheduler=sch,
        num_inference_steps=10,
        stop_after=4,
        callback=lambda rec, x0: seen.append(x0),
    )
    assert torch.equal(part.latents, seen[-1])


def test_per_row_step_counts_equal_solo_runs():
    sch = dpm()
    mu, s, x = gaussian_case()
    res = sample(GaussianRows(mu, s, sch), x, scheduler=sch, num_inference_steps=[4, 9, 6])
    assert res.steps_run == [4, 9, 6] and res.nfe == 9
    for r, n in enumerate([4, 9, 6]):
        solo = sample(
            GaussianRows(mu[r : r + 1], s[r : r + 1], sch), x[r : r + 1], scheduler=sch, num_inference_steps=n
        )
        assert (res.latents[r] - solo.latents[0]).abs().max() < 1e-5


def test_auto_steps_reuses_probe_and_matches_fixed_runs():
    sch = dpm()
    mu, s, x = gaussian_case()
    table = {"tiers": {t: [[1.0, n]] for t, n in (("simple", 8), ("neutral", 12), ("detailed", 20))}}
    auto = AutoSteps(
        ["a plain disc", "a cat", "a detailed striped wall"], min_steps=8, max_steps=30, table=table
    )
    res = sample(GaussianRows(mu, s, sch), x, scheduler=sch, num_inference_steps=auto)
    assert res.num_steps == [8, 12, 20] and res.steps_run == [8, 12, 20]
    # probe = 2 steps of the 8-step schedule; row 0 continues it, the others reuse the shared first evaluation
    assert res.nfe_per_sample == [8, 12 + 1, 20 + 1]
    assert "tier 'simple'" in res.notes[0] and "tier 'detailed'" in res.notes[2]
    for r, n in enumerate([8, 12, 20]):
        solo = sample(
            GaussianRows(mu[r : r + 1], s[r : r + 1], sch), x[r : r + 1], scheduler=sch, num_inference_steps=n
        )
        assert (res.latents[r] - solo.latents[0]).abs().max() < 1e-5


def test_prompt_tiers_and_high_frequency_energy():
    assert prompt_tier("a flat red circle")[0] == "simple"
    assert prompt_tier("an intricate, detailed 4k city")[0] == "detailed"
    assert prompt_tier("a plain striped square")[0] == "detailed", "detail words win"
    assert prompt_tier("a dog") == ("neutral", []) and prompt_tier(None)[0] == "neutral"
    yy, xx = torch.meshgrid(torch.arange(16.0), torch.arange(16.0), indexing="ij")
    smooth = torch.sin(2 * math.pi * xx / 16).expand(1, 4, 16, 16)
    checker = ((xx + yy) % 2 * 2 - 1).expand(1, 4, 16, 16)
    e = high_frequency_energy(torch.cat([smooth, checker, smooth + 5.0]))
    assert e[0] < 1e-6 and e[1] > 0.99 and e[2] < 1e-6  # the mean (brightness) is not texture
    with pytest.raises(ValueError, match="B, C, H, W"):
        high_frequency_energy(torch.zeros(3, 16, 16))


def test_auto_steps_table_lookup_and_clamping():
    table = {
        "tiers": {"simple": [[0.2, 8], [1.0, 12]], "neutral": [[1.0, 16]], "detailed": [[0.2, 14], [1.0, 40]]}
    }
    auto = AutoSteps(
        ["a simple flat circle", "a textured checkered square"], min_steps=8, max_steps=30, table=table
    )
    yy, xx = torch.meshgrid(torch.arange(16.0), torch.arange(16.0), indexing="ij")
    smooth = torch.sin(2 * math.pi * xx / 16).expand(1, 4, 16, 16)
    checker = ((xx + yy) % 2 * 2 - 1).expand(1, 4, 16, 16)
    simple_smooth, detailed_checker = auto.choose(torch.cat([smooth, checker]))
    assert simple_smooth.steps == 8 and detailed_checker.steps == 30  # 40 clamped to max_steps
    assert "clamped to [8, 30]" in detailed_checker.reason and "tier 'detailed'" in detailed_checker.reason


def test_committed_calibration_table_is_well_formed():
    from fastdiff.dynamic.auto_steps_table import TABLE

    assert set(TABLE["tiers"]) == {"simple", "neutral", "detailed"}
    for rows in TABLE["tiers"].values():
        bounds, steps = [r[0] for r in rows], [r[1] for r in rows]
        assert bounds == sorted(bounds) and bounds[-1] >= 1.0, "energy bins ascend and cover [0, 1]"
        assert steps == sorted(steps), "more high-frequency energy never gets fewer steps"
        assert all(1 <= n <= 50 for n in steps)
    assert TABLE["meta"]["psnr_target_db"] >= 28


def test_draft_and_refine_renoises_only_x0():
    sch = dpm()
    mu, s, x = gaussian_case()
    main = GaussianRows(mu, s, sch)
    draft_model = GaussianRows(mu, s, sch)
    from diffusers import LCMScheduler

    lcm = LCMScheduler(**SD_BETAS)
    noise = torch.randn(x.shape, generator=torch.Generator().manual_seed(3))
    res = draft_and_refine(
        draft_model,
        main,
        x,
        draft_scheduler=lcm,
        draft_steps=4,
        scheduler=sch,
        num_inference_steps=30,
        strength=0.3,
        noise=noise,
    )
    assert res.draft.nfe == 4 and res.steps_run == [9, 9, 9] and res.nfe == 4 + 9
    # the refinement started from x0_draft noised to the timestep 21 of 30: recompute that state by hand
    x_t, start, n = renoise(res.draft.latents, sch, 30, 0.3, noise)
    sch2 = dpm()
    sch2.set_timesteps(30)
    abar = sch2.alphas_cumprod[sch2.timesteps[21]]
    assert start == 21 and n == 9
    assert torch.allclose(x_t, abar.sqrt() * res.draft.latents + (1 - abar).sqrt() * noise, atol=1e-6)
    manual = sample(main, x_t, scheduler=sch, num_inference_steps=30, start_step=21)
    assert torch.equal(manual.latents, res.latents) and manual.steps_run == [9, 9, 9]
    # the near-delta row lands on its data point (SDEdit keeps the distribution, not the exact sample)
    assert (res.latents[2] - mu[2]).norm() / mu[2].norm() < 0.05


def test_guided_unet_rows_match_full_batch():
    torch.manual_seed(0)
    unet = tiny_unet().eval()
    cond, uncond = torch.randn(3, 5, 8), torch.randn(3, 5, 8)
    fn = cfg_model_fn(unet, cond, uncond, guidance_scale=4.0)
    x = torch.randn(3, 4, 8, 8)
    t = torch.tensor(500)
    with torch.no_grad():
        full = fn(x, t)
        sub = fn(x[[0, 2]], t, rows=torch.tensor([0, 2]))
        vec = fn(x, torch.tensor([500, 500, 500]))
    assert torch.allclose(sub, full[[0, 2]], atol=1e-5)
    assert torch.allclose(vec, full, atol=1e-5)
    with pytest.raises(ValueError, match="differs"):
        cfg_model_fn(unet, cond, uncond[:2])


def test_predicted_x0_inverts_the_forward_process():
    x0, eps = torch.randn(2, 4, 4, 4), torch.randn(2, 4, 4, 4)
    alpha, sigma = 0.6, 0.8
    xt = alpha * x0 + sigma * eps
    assert torch.allclose(predicted_x0(eps, xt, alpha, sigma, "epsilon"), x0, atol=1e-5)
    v = alpha * eps - sigma * x0
    assert torch.allclose(predicted_x0(v, xt, alpha, sigma, "v_prediction"), x0, atol=1e-5)
    with pytest.raises(ValueError, match="prediction_type"):
        predicted_x0(eps, xt, alpha, sigma, "flow")


def test_bad_inputs_raise_clear_errors():
    sch = dpm()
    x = torch.randn(2, 4, 8, 8)
    model = GaussianRows(torch.zeros(2, 4, 8, 8), torch.ones(2), sch)
    with pytest.raises(TypeError, match="callable"):
        sample(None, x, scheduler=sch, num_inference_steps=5)
    with pytest.raises(TypeError, match="diffusers-compatible"):
        sample(model, x, scheduler=object(), num_inference_steps=5)
    with pytest.raises(ValueError, match="2 entries for a batch of"):
        sample(model, torch.randn(3, 4, 8, 8), scheduler=sch, num_inference_steps=[5, 6])
    with pytest.raises(ValueError, match="positive"):
        sample(model, x, scheduler=sch, num_inference_steps=0)
    with pytest.raises(ValueError, match="returned shape"):
        sample(lambda x, t: x[:1], x, scheduler=sch, num_inference_steps=3)
    with pytest.raises(ValueError, match="rtol"):
        EarlyStop(rtol=0)
    with pytest.raises(ValueError, match="patience"):
        EarlyStop(patience=0)
    with pytest.raises(ValueError, match="max_sigma"):
        EarlyStop(max_sigma=-1.0)
    with pytest.raises(ValueError, match="valid: rtol"):
        EarlyStop.coerce({"tol": 0.1})
    with pytest.raises(TypeError, match="early_stop"):
        EarlyStop.coerce("yes")
    assert EarlyStop.coerce(True).rtol == EarlyStop().rtol and EarlyStop.coerce(False) is None
    with pytest.raises(ValueError, match="must not exceed"):
        AutoSteps(min_steps=20, max_steps=10)
    with pytest.raises(ValueError, match="strength"):
        renoise(x, sch, 10, 1.5, torch.randn_like(x))
