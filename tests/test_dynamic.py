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
from dynamic_helpers import (
    SD_BETAS,
    GaussianRows,
    assert_rows_match_alone,
    dpm,
    gaussian_case,
    reference_loop,
    tiny_unet,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from fastdiff.dynamic import (
    AutoSteps,
    Controller,
    Decision,
    EarlyStop,
    FastForward,
    cfg_model_fn,
    draft_and_refine,
    resume,
    sample,
)
from fastdiff.dynamic.adapters import predicted_x0
from fastdiff.dynamic.auto_steps import high_frequency_energy, prompt_tier
from fastdiff.dynamic.draft import renoise
from fastdiff.samplers import AdaptiveScheduler, make_scheduler
from fastdiff.samplers.gmm import GaussianMixture, GMMDenoiser, rms_errors


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
    assert_rows_match_alone(res, mu, s, x, sch, [4, 9, 6])


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
    assert_rows_match_alone(res, mu, s, x, sch, [8, 12, 20])


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
    ff = EarlyStop.coerce({"rtol": 0.1, "patience": 1, "jumps": 3})  # the form a sweep spec can hold
    assert type(ff) is FastForward and (ff.rtol, ff.patience, ff.jumps) == (0.1, 1, 3)
    assert type(EarlyStop.coerce({"rtol": 0.1})) is EarlyStop
    with pytest.raises(ValueError, match="must not exceed"):
        AutoSteps(min_steps=20, max_steps=10)
    with pytest.raises(ValueError, match="strength"):
        renoise(x, sch, 10, 1.5, torch.randn_like(x))


# ----------------------------------------------------------------------------------------------------------
# step control (#12): controller decisions, FastForward, AdaptiveScheduler
# ----------------------------------------------------------------------------------------------------------
class JumpTo(Controller):
    """Jumps once, after ``at`` steps, to ``tail(sigmas_ahead)``."""

    def __init__(self, at, tail):
        self.at, self.tail = at, tail

    def decide(self, row, steps_done, num_steps, x0_change, sigma, sigmas_ahead):
        if steps_done == self.at:
            return Decision.jump(self.tail(sigmas_ahead))
        return Decision.go_on()


def test_jump_to_the_same_schedule_is_the_plain_run_bit_for_bit():
    sch = make_scheduler("dpmpp_2m", schedule="karras")
    mu, s, x = gaussian_case()
    plain = sample(GaussianRows(mu, s, sch), x, scheduler=sch, num_inference_steps=12)
    same = sample(
        GaussianRows(mu, s, sch),
        x,
        scheduler=sch,
        num_inference_steps=12,
        controller=JumpTo(4, lambda a: a[1:]),
    )
    assert torch.equal(same.latents, plain.latents) and same.nfe_per_sample == [12] * 3
    assert same.trace[3].jumped == [0, 1, 2]
    never = sample(
        GaussianRows(mu, s, sch), x, scheduler=sch, num_inference_steps=12, controller=FastForward(rtol=1e-12)
    )
    assert torch.equal(never.latents, plain.latents), "a row that never converges never jumps"


def test_fast_forward_equals_a_plain_run_on_the_spliced_schedule():
    # independent reference: a scheduler built from the explicit sigmas the row ends up visiting
    sch = make_scheduler("dpmpp_2m", schedule="karras")
    sch.set_timesteps(20)
    full = sch.sigmas_ahead()  # float64 levels, last one 0
    mu, s, x = gaussian_case()
    ctl = FastForward(rtol=0.05, patience=1, min_steps=3, max_sigma=None, jumps=2)
    res = sample(GaussianRows(mu, s, sch), x, scheduler=sch, num_inference_steps=20, controller=ctl)
    assert any(n < 20 for n in res.nfe_per_sample), "some row converged and jumped"
    for r in range(3):
        k = res.steps_run[r]
        if k == 20:
            continue
        done = k - 2  # steps on the original schedule before the 2-step finish
        spliced = [*full[: done + 1], full[-2], 0.0]
        assert res.nfe_per_sample[r] == done + 2 == len(spliced) - 1
        ref_sch = make_scheduler("dpmpp_2m", schedule=spliced)
        solo = sample(
            GaussianRows(mu[r : r + 1], s[r : r + 1], sch),
            x[r : r + 1],
            scheduler=ref_sch,
            num_inference_steps=done + 2,
        )
        assert (res.latents[r] - solo.latents[0]).abs().max() <= 1e-6 * solo.latents.abs().max()


def test_fast_forward_rows_in_a_batch_equal_each_row_alone():
    sch = make_scheduler("dpmpp_2m")
    mu, s, x = gaussian_case()
    ctl = lambda: FastForward(rtol=0.05, patience=1, min_steps=3, jumps=1)  # noqa: E731
    res = sample(GaussianRows(mu, s, sch), x, scheduler=sch, num_inference_steps=25, controller=ctl())
    for r in range(3):
        solo = sample(
            GaussianRows(mu[r : r + 1], s[r : r + 1], sch),
            x[r : r + 1],
            scheduler=sch,
            num_inference_steps=25,
            controller=ctl(),
        )
        assert (
            torch.equal(res.latents[r], solo.latents[0]) and res.nfe_per_sample[r] == solo.nfe_per_sample[0]
        )


def test_jump_decisions_are_validated_and_need_a_reschedulable_scheduler():
    with pytest.raises(ValueError, match="ending at 0"):
        Decision.jump([0.5, 0.1])
    with pytest.raises(ValueError, match="strictly decrease"):
        Decision.jump([0.1, 0.5, 0.0])
    with pytest.raises(ValueError, match="action"):
        Decision("skip")
    with pytest.raises(ValueError, match="jumps"):
        FastForward(jumps=0)
    mu, s, x = gaussian_case()
    with pytest.raises(TypeError, match="Reschedulable"):
        sample(
            GaussianRows(mu, s, dpm()),
            x,
            scheduler=dpm(),
            num_inference_steps=8,
            controller=JumpTo(2, lambda a: (0.0,)),
        )
    sch = make_scheduler("dpmpp_2m")
    with pytest.raises(ValueError, match="below the current"):
        sample(
            GaussianRows(mu, s, sch),
            x,
            scheduler=sch,
            num_inference_steps=8,
            controller=JumpTo(2, lambda a: (99.0, 0.0)),
        )


def test_fast_forward_refuses_a_scheduler_that_cannot_jump_before_any_evaluation():
    """Regression: with a diffusers scheduler FastForward failed only when a row first converged (after
    some evaluations), and a run where no row converged passed, so the same call failed or not by data."""
    mu, s, x = gaussian_case()
    calls = []

    def model(x_, t):
        calls.append(t)
        return GaussianRows(mu, s, dpm())(x_, t)

    for ctl in (FastForward(rtol=1e-12), FastForward(rtol=0.5, patience=1, min_steps=1, max_sigma=None)):
        with pytest.raises(
            TypeError, match=r"FastForward replaces rows' remaining schedules.*make_scheduler"
        ):
            sample(model, x, scheduler=dpm(), num_inference_steps=8, controller=ctl)
    assert calls == [], "refused before the first model evaluation"


def _ode_to(mixture_model, x_vp, sigma_end):
    """Independent reference: the probability-flow ODE (scipy DOP853, float64) from sigma_max to sigma_end,
    then the x0 read-out the sampler also ends with (the denoiser at sigma_end)."""
    from scipy.integrate import solve_ivp

    ns = mixture_model.noise
    n = x_vp.shape[0]
    y0 = (x_vp.double() * math.sqrt(1 + ns.sigma_max**2)).reshape(-1).numpy()

    def rhs(logs, y):
        xv = torch.from_numpy(y).reshape(n, -1)
        return (xv - mixture_model.mixture.denoise(xv, math.exp(logs))).reshape(-1).numpy()

    sol = solve_ivp(
        rhs, (math.log(ns.sigma_max), math.log(sigma_end)), y0, method="DOP853", rtol=1e-11, atol=1e-11
    )
    xe = torch.from_numpy(sol.y[:, -1]).reshape(n, -1)
    return mixture_model.mixture.denoise(xe, sigma_end)


def test_adaptive_converges_to_the_exact_ode_solution_as_the_tolerance_shrinks():
    model = GMMDenoiser(GaussianMixture.random(dims=8, components=3, seed=3))
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    ref = _ode_to(model, x, model.noise.sigma_min)
    errors, nfes = [], []
    for rtol in (1e-2, 1e-3, 1e-4):
        res = sample(model, x, scheduler=AdaptiveScheduler(rtol=rtol, atol=rtol / 10))
        errors.append(float(rms_errors(res.latents, ref).max()))
        nfes.append(sum(res.nfe_per_sample))
    assert errors[0] > errors[1] > errors[2] and errors[2] < 2e-4, errors
    assert nfes[0] < nfes[1] < nfes[2]


def test_adaptive_rows_take_their_own_steps_and_equal_each_row_alone():
    model = GMMDenoiser(GaussianMixture.random(dims=8, components=3, seed=3))
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * torch.tensor(
        [[0.3], [1.0], [3.0]], dtype=torch.float64
    )
    res = sample(model, x, scheduler=AdaptiveScheduler(rtol=0.02, atol=0.003))
    assert len(set(res.nfe_per_sample)) > 1 and res.num_steps == res.nfe_per_sample
    for r in range(3):
        solo = sample(model, x[r : r + 1], scheduler=AdaptiveScheduler(rtol=0.02, atol=0.003))
        assert (
            torch.equal(res.latents[r], solo.latents[0]) and res.nfe_per_sample[r] == solo.nfe_per_sample[0]
        )


def test_adaptive_takes_a_tolerance_not_a_step_count():
    model = GMMDenoiser(GaussianMixture.random(dims=8, components=3, seed=3))
    x = torch.randn(2, 8, dtype=torch.float64)
    with pytest.raises(ValueError, match="num_inference_steps=None"):
        sample(model, x, scheduler=AdaptiveScheduler(), num_inference_steps=10)
    with pytest.raises(ValueError, match="rtol"):
        AdaptiveScheduler(rtol=-1)
    with pytest.raises(RuntimeError, match="max_steps"):
        sample(model, x, scheduler=AdaptiveScheduler(rtol=1e-9, atol=1e-9, max_steps=5))


# ----------------------------------------------------------------------------------------------------------
# fail loud (#16): non-finite values, unknown step keywords, non-tensor model outputs
# ----------------------------------------------------------------------------------------------------------
class NaNAt(GaussianRows):
    """GaussianRows whose output turns NaN (row 1 only) from call ``k`` on."""

    def __init__(self, k, *a):
        super().__init__(*a)
        self.k, self.n = k, 0

    def __call__(self, x, t, rows=None):
        out = super().__call__(x, t, rows=rows)
        self.n += 1
        if self.n > self.k:
            out = out.clone()
            out[1] = float("nan")
        return out


@pytest.mark.parametrize("make", [dpm, lambda: make_scheduler("dpmpp_2m")], ids=["diffusers", "fastdiff"])
def test_nonfinite_model_output_raises_naming_step_t_and_row(make):
    sch = make()
    mu, s, x = gaussian_case()
    with pytest.raises(FloatingPointError, match=r"model output at step index 3 of row\(s\) \[1\] .*t="):
        sample(NaNAt(3, mu, s, sch), x, scheduler=sch, num_inference_steps=8)
    with pytest.warns(RuntimeWarning, match="warned once") as seen:
        res = sample(NaNAt(3, mu, s, sch), x, scheduler=sch, num_inference_steps=8, on_nonfinite="warn")
    assert len([w for w in seen if "NaN/inf" in str(w.message)]) == 1 and res.latents[1].isnan().any()
    assert torch.isfinite(res.latents[[0, 2]]).all()
    with pytest.raises(ValueError, match=r"on_nonfinite must be one of \('raise', 'warn'\), got 'ignore'"):
        sample(GaussianRows(mu, s, sch), x, scheduler=sch, num_inference_steps=8, on_nonfinite="ignore")


def test_nonfinite_latents_after_a_step_are_caught_at_that_step():
    class BadStep(DDIMScheduler):
        def step(self, model_output, timestep, sample, eta=0.0, generator=None, return_dict=True, **kw):
            out = super().step(model_output, timestep, sample, eta=eta, generator=generator, return_dict=True)
            if self.bad_at == 0:
                out.prev_sample[0, 0, 0, 0] = float("inf")
            self.bad_at -= 1
            return out

    sch = BadStep(**SD_BETAS)
    sch.bad_at = 2
    mu, s, x = gaussian_case()
    with pytest.raises(FloatingPointError, match=r"latents after the step at step index 2 of row\(s\) \[0\]"):
        sample(GaussianRows(mu, s, sch), x, scheduler=sch, num_inference_steps=6)


def test_unknown_step_kwargs_raise_naming_the_key_and_the_accepted_ones():
    mu, s, x = gaussian_case()
    ddim = DDIMScheduler(**SD_BETAS)
    with pytest.raises(
        ValueError, match=r"'etaa' is not a keyword of DDIMScheduler.step\(\); accepted: .*'eta'"
    ):
        sample(GaussianRows(mu, s, ddim), x, scheduler=ddim, num_inference_steps=4, step_kwargs={"etaa": 0.5})
    fast = make_scheduler("dpmpp_2m")
    with pytest.raises(
        ValueError, match=r"'eta' is not a keyword of FastScheduler.step\(\); accepted: none.*make_scheduler"
    ):
        sample(GaussianRows(mu, s, fast), x, scheduler=fast, num_inference_steps=4, step_kwargs={"eta": 0.5})
    # diffusers pipelines always pass eta=0.0: a no-op, dropped where step() has no eta
    ok = sample(GaussianRows(mu, s, fast), x, scheduler=fast, num_inference_steps=4, step_kwargs={"eta": 0.0})
    assert ok.finished
    with pytest.raises(TypeError, match="step_kwargs must be a dict"):
        sample(
            GaussianRows(mu, s, fast), x, scheduler=fast, num_inference_steps=4, step_kwargs=[("eta", 0.0)]
        )


def test_a_model_returning_a_tuple_is_named_with_what_to_return():
    sch = dpm()
    x = torch.randn(2, 4, 8, 8)

    def my_unet_fn(x, t):
        return (x,)

    with pytest.raises(TypeError, match=r"got tuple from model_fn '.*my_unet_fn'.*unet\(x, t\)\.sample"):
        sample(my_unet_fn, x, scheduler=sch, num_inference_steps=3)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(generator="seed"), TypeError, r"generator must be a torch.Generator.*got 'seed'"),
        (dict(generator=[torch.Generator(), 3]), TypeError, r"generator must be a torch.Generator"),
        (dict(stop_after=-1), ValueError, r"stop_after must be an int >= 0 .*got -1"),
        (dict(stop_after=True), ValueError, r"stop_after must be an int >= 0 .*got True"),
        (dict(num_inference_steps=0), ValueError, r"num_inference_steps must be positive ints.*got 0"),
        (dict(num_inference_steps=[3, 0]), ValueError, r"num_inference_steps must be positive ints.*got 0"),
    ],
)
def test_bad_generator_pause_and_step_counts_raise_naming_the_argument(kwargs, error, match):
    sch = dpm()
    calls = []
    kwargs = {"num_inference_steps": 3, **kwargs}
    with pytest.raises(error, match=match):
        sample(lambda x, t: calls.append(t) or x, torch.randn(2, 4, 8, 8), scheduler=sch, **kwargs)
    assert not calls  # refused before any model call
