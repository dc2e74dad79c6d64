"""Schedules, noise-schedule conversions, and bad-input errors of fastdiff samplers."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fastdiff.samplers import NoiseSchedule, build_schedule, make_scheduler
from fastdiff.samplers.schedules import NAMED_SCHEDULES

NS = NoiseSchedule.from_config(None)


def test_noise_schedule_matches_diffusers_and_inverts_exactly():
    from diffusers import DDPMScheduler

    ref = DDPMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear").alphas_cumprod
    np.testing.assert_allclose(NS.alphas_cumprod, ref.double().numpy(), rtol=2e-6)
    t = np.array([0.0, 0.3, 17.5, 500.0, 998.25, 999.0])
    np.testing.assert_allclose(NS.t_of_sigma(NS.sigma_of_t(t)), t, atol=1e-8)
    # at integer t, sigma is the training sigma exactly
    np.testing.assert_allclose(NS.sigma_of_t([10.0]), np.sqrt(1 / NS.alphas_cumprod[10] - 1), rtol=1e-12)
    # between integers log(alpha_bar) is linear
    lab = NS.log_alpha_bar_of_t([10.25])[0]
    assert lab == pytest.approx(0.75 * NS.log_alpha_bar[10] + 0.25 * NS.log_alpha_bar[11], rel=1e-12)


@pytest.mark.parametrize("schedule", [s for s in NAMED_SCHEDULES])
@pytest.mark.parametrize("n", [1, 2, 5, 10, 25])
def test_named_schedule_properties(schedule, n):
    ts, sig = build_schedule(schedule, n, NS, steps_offset=1 if schedule == "leading" else 0)
    assert len(ts) == n and len(sig) == n + 1
    assert sig[-1] == 0.0 and np.all(np.diff(sig) < 0), "sigmas strictly decreasing to 0"
    assert np.all(np.diff(ts) < 0), "no duplicate timesteps, decreasing"
    assert 0 <= ts.min() and ts.max() <= 999
    np.testing.assert_allclose(sig[:-1], NS.sigma_of_t(ts), rtol=1e-9)
    if schedule in ("trailing", "uniform", "linspace", "karras", "exponential"):
        assert ts[0] == pytest.approx(999.0)  # start at the training noise level
    if schedule in ("karras", "exponential") and n > 1:
        assert sig[-2] == pytest.approx(NS.sigma_min)


def test_rounded_sigma_schedules_give_integer_timesteps_like_diffusers():
    from diffusers import DPMSolverMultistepScheduler

    d = DPMSolverMultistepScheduler(
        use_karras_sigmas=True, beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012
    )
    d.set_timesteps(12)
    s = make_scheduler("dpmpp_2m", schedule="karras", fractional_timesteps=False)
    s.set_timesteps(12)
    assert s.timesteps.dtype == torch.int64 and torch.equal(s.timesteps, d.timesteps)
    f = make_scheduler("dpmpp_2m", schedule="karras")
    f.set_timesteps(12)
    assert f.timesteps.is_floating_point()


def test_custom_schedules_by_type():
    s = make_scheduler("dpmpp_2m", schedule=[999, 600, 200, 10])  # ints: timesteps
    s.set_timesteps()
    assert s.timesteps.tolist() == [999, 600, 200, 10]
    s = make_scheduler("dpmpp_2m", schedule=[14.0, 1.0, 0.1, 0.0])  # floats: sigmas (trailing 0 optional)
    s.set_timesteps(3)
    assert s.sigmas.tolist() == pytest.approx([14.0, 1.0, 0.1, 0.0])
    s = make_scheduler("dpmpp_2m", schedule=[500.0, 100.0], schedule_kind="timesteps")
    s.set_timesteps()
    assert s.timesteps.tolist() == [500, 100]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(name="heun"), "unknown sampler 'heun'; valid: ddim, euler, dpmpp_2m"),
        (dict(name="unipc", schedule="cosine"), "unknown schedule 'cosine'; valid: leading"),
        (dict(name="unipc", bogus=1), r"unknown option\(s\) \['bogus'\]"),
        (dict(name="unipc", solver_order=4), r"solver_order must be in \[1, 3\]"),
        (dict(name="ddim", eta=-1.0), r"eta must be a finite number >= 0, got -1.0"),
        (dict(name="unipc", prediction_type="flow"), "prediction_type must be one of"),
        (dict(name="unipc", final_step="exact"), "final_step must be one of"),
        (dict(name="unipc", schedule=[1.0, 2.0]), "strictly decreasing"),
        (dict(name="unipc", schedule=[50.0, 1.0]), r"sigmas must lie in \[sigma_min, sigma_max\]"),
        (dict(name="unipc", schedule=[1500, 10]), r"timesteps must lie in \[0, 999\]"),
        (dict(name="unipc", beta_schedule="sigmoid"), "unknown beta_schedule 'sigmoid'"),
    ],
)
def test_bad_input_raises_clear_errors(kwargs, match):
    name = kwargs.pop("name")
    with pytest.raises(ValueError, match=match):
        make_scheduler(name, **kwargs)


# Options that the chosen sampler or schedule does not read used to be stored and ignored (the
# output was bit-identical to the default, issue #16); each must now name itself, its value and
# where it applies.
@pytest.mark.parametrize(
    "name, kwargs, match",
    [
        ("dpmpp_2m", dict(eta=0.5), r"eta=0.5 applies only to sampler 'ddim'"),
        ("unipc", dict(eta=0.3), r"eta=0.3 applies only to sampler 'ddim'"),
        ("dpmpp_2m", dict(use_corrector=False), r"use_corrector=False applies only to sampler 'unipc'"),
        (
            "unipc",
            dict(schedule="trailing", rho=3.0),
            r"rho=3.0 applies only to schedule='karras'.*'trailing'",
        ),
        ("dpmpp_2m", dict(schedule=[5.0, 1.0, 0.1], rho=5.0), r"rho=5.0 applies only to schedule='karras'"),
        ("ddim", dict(lower_order_final=False), r"lower_order_final=False applies only to the multistep"),
        ("lcm", dict(final_step="variance"), r"final_step='variance' does not apply to 'lcm'"),
        ("unipc", dict(timestep_scaling=5.0), r"timestep_scaling=5.0 applies only to sampler 'lcm'"),
        (
            "unipc",
            dict(schedule="karras", original_inference_steps=20),
            r"original_inference_steps=20 applies",
        ),
        ("unipc", dict(schedule="karras", schedule_kind="sigmas"), r"schedule_kind='sigmas' applies only"),
        ("ddim", dict(eta=float("nan")), r"eta must be a finite number >= 0, got nan"),
        ("ddim", dict(eta=float("inf")), r"eta must be a finite number >= 0, got inf"),
        ("unipc", dict(schedule="karras", rho=float("nan")), r"rho must be a finite number > 0, got nan"),
        ("unipc", dict(schedule="karras", rho=0.0), r"rho must be a finite number > 0, got 0.0"),
        ("unipc", dict(schedule="karras", rho="7"), r"rho must be a finite number > 0, got '7'"),
        (
            "lcm",
            dict(timestep_scaling=float("nan")),
            r"timestep_scaling must be a finite number > 0, got nan",
        ),
        ("lcm", dict(original_inference_steps=0), r"original_inference_steps must be an int >= 1, got 0"),
        ("dpmpp_2m", dict(schedule=[]), r"schedule must be a name .* or a non-empty 1-D list/tensor"),
        (
            "dpmpp_2m",
            dict(schedule=[[14.6, 1.0]]),
            r"schedule must be a name .* or a non-empty 1-D list/tensor",
        ),
    ],
)
def test_options_that_would_be_ignored_or_are_not_finite_raise(name, kwargs, match):
    with pytest.raises(ValueError, match=match):
        make_scheduler(name, **kwargs)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(solver_order="2"), r"solver_order must be an int in \[1, 3\] or None, got '2' \(str\)"),
        (dict(solver_order=2.0), r"solver_order must be an int in \[1, 3\] or None, got 2.0 \(float\)"),
        (dict(solver_order=True), r"solver_order must be an int in \[1, 3\] or None, got True \(bool\)"),
        (dict(use_corrector="no"), r"use_corrector must be True or False, got 'no' \(str\)"),
        (dict(lower_order_final=0), r"lower_order_final must be True or False, got 0 \(int\)"),
        (dict(fractional_timesteps=None), r"fractional_timesteps must be True or False, got None"),
    ],
)
def test_option_types_are_checked(kwargs, match):
    with pytest.raises(TypeError, match=match):
        make_scheduler("unipc", **kwargs)


def test_options_that_apply_are_accepted():
    """The checks above reject only what is ignored: each option where it applies still works."""
    make_scheduler("ddim", eta=0.5)
    make_scheduler("unipc", use_corrector=False, solver_order=3, lower_order_final=False)
    make_scheduler("dpmpp_2m", schedule="karras", rho=5.0)
    make_scheduler("lcm", timestep_scaling=5.0, original_inference_steps=20)
    make_scheduler("unipc", schedule=[5.0, 1.0, 0.1], schedule_kind="sigmas")
    make_scheduler("dpmpp_2m_sde", lower_order_final=False)
    # rounded-to-config values of the defaults are fine (from_pretrained round trips)
    make_scheduler("unipc", schedule="karras", rho=7, eta=0)


@pytest.mark.parametrize("n", [0, -3, 1001])
def test_step_count_out_of_range(n):
    with pytest.raises(ValueError, match=r"num_inference_steps must be in \[1, 1000\]"):
        make_scheduler("unipc").set_timesteps(n)


def test_misc_errors():
    with pytest.raises(TypeError, match="`like` must be"):
        make_scheduler("unipc", like=42)
    with pytest.raises(ValueError, match="rescale_betas_zero_snr"):
        make_scheduler("unipc", like={"rescale_betas_zero_snr": True})
    # the adaptive sampler inherits the training schedule by the same rule: no silent un-rescaled betas
    from fastdiff.samplers import AdaptiveScheduler

    with pytest.raises(ValueError, match="rescale_betas_zero_snr"):
        AdaptiveScheduler(like={"rescale_betas_zero_snr": True})
    with pytest.raises(TypeError, match="`like` must be"):
        AdaptiveScheduler(like=42)
    s = make_scheduler("unipc")
    with pytest.raises(ValueError, match="call set_timesteps"):
        s.step(torch.zeros(1, 4), 999, torch.zeros(1, 4))
    with pytest.raises(ValueError, match="at most one of"):
        s.set_timesteps(timesteps=[999, 10], sigmas=[1.0, 0.5])
    with pytest.raises(ValueError, match="lcm schedule"):
        make_scheduler("lcm").set_timesteps(60)
    s.set_timesteps(2)
    for t in s.timesteps:
        s.step(torch.zeros(1, 4), t, torch.zeros(1, 4))
    with pytest.raises(IndexError, match="already taken"):
        s.step(torch.zeros(1, 4), s.timesteps[-1], torch.zeros(1, 4))


def test_add_noise_uses_schedule_sigma_and_continuous_sigma_elsewhere():
    s = make_scheduler("unipc", schedule="karras", fractional_timesteps=False)
    s.set_timesteps(6)
    x0, noise = torch.ones(1, 3), torch.zeros(1, 3)
    t = s.timesteps[2]
    # rounded timestep: the sample is placed at the schedule's own (unrounded) sigma
    alpha = 1 / (1 + float(s.sigmas[2]) ** 2) ** 0.5
    torch.testing.assert_close(s.add_noise(x0, noise, t.reshape(1)), torch.full((1, 3), alpha))
    a500 = float(s.alphas_cumprod[500]) ** 0.5
    torch.testing.assert_close(s.add_noise(x0, noise, torch.tensor([500])), torch.full((1, 3), a500))


@settings(max_examples=25, deadline=None)
@given(
    name=st.sampled_from(["ddim", "euler", "dpmpp_2m", "dpmpp_3m", "unipc"]),
    schedule=st.sampled_from(["leading", "trailing", "linspace", "karras", "exponential"]),
    n=st.integers(1, 40),
)
def test_fuzz_step_counts_and_schedules(name, schedule, n):
    from fastdiff.samplers import run_scheduler

    s = make_scheduler(name, schedule=schedule)
    x = torch.randn(3, 5, generator=torch.Generator().manual_seed(n))
    out = run_scheduler(lambda v, t: 0.5 * v, x, s, n)  # eps = x/2: a valid smooth toy model
    assert torch.isfinite(out).all() and s.step_index == n
    assert torch.all(s.sigmas[:-1] > s.sigmas[1:])


@settings(max_examples=15, deadline=None)
@given(sig=st.lists(st.floats(0.03, 14.0), min_size=1, max_size=12, unique=True))
def test_fuzz_custom_sigmas(sig):
    sig = sorted(sig, reverse=True)
    if np.any(-np.diff(sig) < 1e-3):  # too close: float32 timesteps would coincide (rejected by design)
        return
    s = make_scheduler("unipc", schedule=sig)
    s.set_timesteps()
    np.testing.assert_allclose(s.sigma_of_timestep(s.timesteps).numpy(), sig, rtol=1e-4)


def test_documented_spacing_differences_from_diffusers():
    """One definition per spacing name in fastdiff (schedules.py docstring); diffusers differs by scheduler."""
    from diffusers import DDIMScheduler, DPMSolverMultistepScheduler

    sd = dict(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", steps_offset=1)
    ours, _ = build_schedule("leading", 7, NS, steps_offset=1)
    ddim = DDIMScheduler(**sd, timestep_spacing="leading")
    ddim.set_timesteps(7)
    assert ours.tolist() == ddim.timesteps.tolist()  # DDIM's "leading": T // N
    dpm = DPMSolverMultistepScheduler(**sd, timestep_spacing="leading")
    dpm.set_timesteps(7)
    assert ours.tolist() != dpm.timesteps.tolist()  # multistep "leading" uses T // (N + 1)
    ours, _ = build_schedule("linspace", 7, NS)
    dpm = DPMSolverMultistepScheduler(**{k: v for k, v in sd.items() if k != "steps_offset"})
    dpm.set_timesteps(7)
    assert ours.tolist() == dpm.timesteps.tolist()  # "linspace": the N + 1 point grid of DPM/UniPC
    ddim = DDIMScheduler(**sd, timestep_spacing="linspace")
    ddim.set_timesteps(7)
    assert ddim.timesteps.tolist()[-1] == 0 and ours[-1] > 0  # DDIM's N-point linspace ends at t = 0


CROSSOVER = {"ddim": 6, "euler": 6, "dpmpp_2m": 10, "dpmpp_3m": 15, "dpmpp_2m_sde": 20, "unipc": 10}


@pytest.mark.parametrize("name", list(CROSSOVER))
@pytest.mark.parametrize("n", [4, 6, 8, 10, 11, 15, 20, 21])
def test_default_schedule_is_trailing_at_few_steps_then_karras(name, n):
    """The default changed from Karras to "auto" (#12): on the trained model with guidance, trailing
    beats Karras at few steps for every sampler and Karras wins above a per-sampler crossover
    (benchmarks/results/sampler_defaults.md)."""
    default = make_scheduler(name)
    default.set_timesteps(n)
    explicit = make_scheduler(name, schedule="trailing" if n <= CROSSOVER[name] else "karras")
    explicit.set_timesteps(n)
    assert default.config.schedule is None and default.schedule_name == "auto"
    assert torch.equal(default.timesteps, explicit.timesteps)
    assert torch.equal(default.sigmas, explicit.sigmas)
    if n <= CROSSOVER[name]:  # trailing: integer timesteps starting at T - 1
        assert default.timesteps[0] == 999 and default.timesteps.dtype == torch.int64
    # "auto" passes rho to its Karras half
    assert make_scheduler(name, rho=3.0).schedule_name == "auto"


def test_lcm_keeps_its_own_default_schedule():
    s = make_scheduler("lcm")
    assert s.schedule_name == "lcm"
