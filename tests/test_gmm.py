"""The exact Gaussian-mixture model, its reference ODE solution, and schedule fitting."""

from __future__ import annotations

import math

import pytest
import torch

from fastdiff.samplers import fit_schedule, load_schedule, make_scheduler, run_scheduler, save_schedule
from fastdiff.samplers.gmm import GaussianMixture, GMMDenoiser, median_rms_error, probability_flow_reference

pytestmark = pytest.mark.usefixtures("one_thread")


def test_single_gaussian_denoiser_is_the_closed_form_posterior_mean():
    mu = torch.randn(1, 5, dtype=torch.float64)
    mix = GaussianMixture(mu, std=0.3)
    x = torch.randn(7, 5, dtype=torch.float64)
    for sigma in (0.01, 0.5, 20.0):
        expect = mu + 0.09 / (0.09 + sigma**2) * (x - mu)
        torch.testing.assert_close(mix.denoise(x, sigma), expect, rtol=1e-12, atol=1e-12)


def test_mixture_denoiser_matches_monte_carlo_posterior_mean():
    mix = GaussianMixture.random(dims=3, components=4, std=0.4, seed=3)
    g = torch.Generator().manual_seed(0)
    x0 = mix.sample(400_000, generator=g)
    sigma = 0.8
    xs = x0 + sigma * torch.randn(x0.shape, generator=g, dtype=torch.float64)
    # E[x0 | x near q] from samples in a small ball around a query point vs the closed form
    q = 0.5 * (mix.means[:1] + mix.means[1:2])  # between two modes, where the weights matter
    near = (xs - q).norm(dim=1) < 0.25
    assert near.sum() > 150
    mc = x0[near].mean(0, keepdim=True)
    torch.testing.assert_close(mix.denoise(q, sigma), mc, rtol=0, atol=0.08)


def test_class_conditioning_restricts_the_mixture():
    mix = GaussianMixture.random(dims=4, components=6, num_classes=3, seed=1)
    x = torch.randn(6, 4, dtype=torch.float64) * 2
    labels = torch.arange(6) % 3
    d = mix.denoise(x, 0.7, class_labels=labels)
    for i in range(6):
        keep = mix.classes == labels[i]
        sub = GaussianMixture(mix.means[keep], mix.std, weights=torch.exp(mix.log_weights[keep]))
        torch.testing.assert_close(d[i : i + 1], sub.denoise(x[i : i + 1], 0.7), rtol=1e-12, atol=1e-12)


def test_reference_ode_matches_the_analytic_single_gaussian_flow():
    """For one Gaussian the PF-ODE solution is x0 = mu + s / sqrt(s^2 + sigma^2) (x - mu)."""
    mu = torch.randn(1, 6, dtype=torch.float64)
    model = GMMDenoiser(GaussianMixture(mu, std=0.15))
    x_t = torch.randn(4, 6, dtype=torch.float64)
    smax = model.noise.sigma_max
    x_ve = x_t * math.sqrt(1 + smax**2)
    exact = mu + 0.15 / math.sqrt(0.15**2 + smax**2) * (x_ve - mu)
    ref = probability_flow_reference(model, x_t)
    assert float((ref - exact).abs().max()) < 1e-8


def test_eps_model_is_consistent_with_the_denoiser():
    mix = GaussianMixture.random(dims=8, components=3)
    model = GMMDenoiser(mix)
    x = torch.randn(5, 8, dtype=torch.float64)
    t = 321.5  # fractional
    sigma = float(model.noise.sigma_of_t(t))
    alpha = 1 / math.sqrt(1 + sigma**2)
    eps = model(x, torch.tensor(t))
    x0 = (x - alpha * sigma * eps) / alpha
    torch.testing.assert_close(x0, mix.denoise(x / alpha, sigma))


@pytest.fixture(scope="module")
def problem():
    mix = GaussianMixture.random(dims=16, components=4, std=0.15, seed=0)
    model = GMMDenoiser(mix)
    x = torch.randn(24, 16, generator=torch.Generator().manual_seed(0))
    return model, x, probability_flow_reference(model, x)


@pytest.mark.parametrize(
    "name, opts",
    [("ddim", {}), ("dpmpp_2m", {"final_step": "variance"}), ("unipc", {"final_step": "variance"})],
)
def test_error_decreases_with_nfe(problem, name, opts):
    model, x, ref = problem
    errs = [
        median_rms_error(run_scheduler(model, x, make_scheduler(name, **opts), n), ref)
        for n in (10, 20, 40, 80)
    ]
    assert all(a > b for a, b in zip(errs, errs[1:])), errs
    if name != "ddim":  # second-order methods: 8x NFE must buy far more than 8x error
        assert errs[0] / errs[-1] > 30, errs


def test_variance_final_step_removes_the_final_interval_floor(problem):
    model, x, ref = problem
    run = lambda fs: median_rms_error(
        run_scheduler(model, x, make_scheduler("unipc", schedule="karras", final_step=fs), 100), ref
    )
    assert run("variance") < 0.1 * run("denoised")


def test_fit_schedule_beats_karras_on_held_out_samples(problem, tmp_path):
    model, x, ref = problem
    cal = torch.randn(16, 16, generator=torch.Generator().manual_seed(1))
    sig = fit_schedule(model, cal, 6, "dpmpp_2m", final_step="variance", max_evals=80)
    assert len(sig) == 7 and sig[-1] == 0.0 and all(a > b for a, b in zip(sig, sig[1:]))
    fitted = median_rms_error(
        run_scheduler(model, x, make_scheduler("dpmpp_2m", schedule=sig, final_step="variance")), ref
    )
    karras = median_rms_error(
        run_scheduler(model, x, make_scheduler("dpmpp_2m", schedule="karras", final_step="variance"), 6), ref
    )
    assert fitted < 0.5 * karras
    path = tmp_path / "sched.json"
    save_schedule(path, sig, model="gmm", sampler="dpmpp_2m")
    loaded, meta = load_schedule(path)
    assert loaded == sig and meta == {"model": "gmm", "sampler": "dpmpp_2m"}
    path.write_text("{}")
    with pytest.raises(ValueError, match="not a fastdiff schedule"):
        load_schedule(path)
    with pytest.raises(ValueError, match="nfe must be an int >= 2"):
        fit_schedule(model, cal, 1)


def test_fit_schedule_from_a_trailing_start_with_a_free_end(problem):
    """A start whose last noise level is above sigma_min (trailing) is fitted with free_end and
    ends no worse than the start on held-out samples; without free_end it is a clear error."""
    model, x, ref = problem
    cal = torch.randn(16, 16, generator=torch.Generator().manual_seed(1))
    sig = fit_schedule(model, cal, 5, "unipc", starts="trailing", free_end=True, max_evals=60)
    assert len(sig) == 6 and sig[-1] == 0.0 and all(a > b for a, b in zip(sig, sig[1:]))
    fitted = median_rms_error(run_scheduler(model, x, make_scheduler("unipc", schedule=sig)), ref)
    trailing = median_rms_error(run_scheduler(model, x, make_scheduler("unipc", schedule="trailing"), 5), ref)
    assert fitted < trailing
    with pytest.raises(ValueError, match="ends at sigma .* above sigma_min.*free_end=True"):
        fit_schedule(model, cal, 5, "unipc", starts="trailing", max_evals=4)
    with pytest.raises(ValueError, match="has 3 positive sigmas; fit_schedule needs nfe=5"):
        fit_schedule(model, cal, 5, "unipc", starts=[[10.0, 1.0, 0.1, 0.0]], max_evals=4)
