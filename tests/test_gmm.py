"""The exact Gaussian-mixture model, its reference ODE solution, and schedule fitting."""

from __future__ import annotations

import math

import pytest
import torch

from fastdiff.samplers import fit_schedule, load_schedule, make_scheduler, run_scheduler, save_schedule
from fastdiff.samplers.gmm import (
    GaussianMixture,
    GMMDenoiser,
    median_rms_error,
    probability_flow_reference,
    rms_errors,
)

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


def test_fit_schedule_median_objective_polishes_the_median(problem, monkeypatch):
    """objective="median": per start, a search on the geometric mean of the middle half of the errors, then a
    search on log(median error) from its result; both objectives are checked against the calibration errors
    computed here in float64 from a plain sampler run.  The fit still beats Karras on held-out samples."""
    import scipy.optimize

    model, x, ref = problem
    cal = torch.randn(16, 16, generator=torch.Generator().manual_seed(1))
    cal_ref = probability_flow_reference(model, cal)
    calls = []
    real = scipy.optimize.minimize

    def spy(fun, x0, **kw):
        calls.append((fun, kw["options"]["maxfev"]))
        return real(fun, x0, **kw)

    monkeypatch.setattr(scipy.optimize, "minimize", spy)
    sig = fit_schedule(
        model, cal, 6, "dpmpp_2m", reference=cal_ref, final_step="variance", objective="median", max_evals=80
    )
    assert [n for _, n in calls] == [20, 20, 20, 20]  # two starts, each split between the two searches
    logits = torch.log(torch.tensor([1.0, 1.0, 1.0, 1.0, 1.0])).numpy()  # the uniform log-sigma schedule
    noise = make_scheduler("dpmpp_2m", final_step="variance").noise_schedule
    log_s = torch.linspace(math.log(noise.sigma_max), math.log(noise.sigma_min), 6, dtype=torch.float64)
    uniform = [noise.sigma_max, *log_s[1:-1].exp().tolist(), noise.sigma_min, 0.0]
    out = run_scheduler(model, cal, make_scheduler("dpmpp_2m", schedule=uniform, final_step="variance"))
    expect = math.log(median_rms_error(out, cal_ref))
    assert calls[1][0](logits) == pytest.approx(expect, rel=1e-4)
    log_e = rms_errors(out, cal_ref).log().sort().values  # 16 samples: the middle half is samples 4..11
    assert calls[0][0](logits) == pytest.approx(float(log_e[4:12].mean()), rel=1e-4)
    fitted = median_rms_error(
        run_scheduler(model, x, make_scheduler("dpmpp_2m", schedule=sig, final_step="variance")), ref
    )
    karras = median_rms_error(
        run_scheduler(model, x, make_scheduler("dpmpp_2m", schedule="karras", final_step="variance"), 6), ref
    )
    assert fitted < 0.5 * karras
    with pytest.raises(ValueError, match="objective must be one of .*'geomean', 'median'.*got 'mean'"):
        fit_schedule(model, cal, 6, objective="mean", max_evals=4)


def test_family_denoiser_routes_rows_to_their_mixture():
    """A family of mixtures acts as one model: each row is denoised by its own member (float64, exact),
    for a subset of rows and per-row noise levels, and its reference ODE is the members' references."""
    from fastdiff.samplers.gmm import GMMFamilyDenoiser

    a = GMMDenoiser(
        GaussianMixture.random(dims=5, seed=2), class_labels=torch.arange(3) % 3, guidance_scale=4.0
    )
    b = GMMDenoiser(GaussianMixture.random(dims=5, seed=3), class_labels=[2, 0, 1, 2], guidance_scale=3.0)
    fam = GMMFamilyDenoiser([a, b], [3, 4])
    x = torch.randn(7, 5, dtype=torch.float64) * 3
    torch.testing.assert_close(
        fam.denoise_ve(x, 2.0),
        torch.cat([a.denoise_ve(x[:3], 2.0), b.denoise_ve(x[3:], 2.0)]),
        rtol=0,
        atol=0,
    )
    rows, sig = torch.tensor([1, 4, 6]), torch.tensor([[0.5], [1.5], [3.0]], dtype=torch.float64)
    expect = torch.cat([a.denoise_ve(x[1:2], sig[:1], [1]), b.denoise_ve(x[[4, 6]], sig[1:], [1, 3])])
    torch.testing.assert_close(fam.denoise_ve(x[rows], sig, rows), expect, rtol=0, atol=0)
    xt = torch.randn(7, 5, generator=torch.Generator().manual_seed(0))
    ref = torch.cat([probability_flow_reference(a, xt[:3]), probability_flow_reference(b, xt[3:])])
    torch.testing.assert_close(probability_flow_reference(fam, xt), ref, rtol=0, atol=1e-8)

    with pytest.raises(ValueError, match="share one dimension"):
        GMMFamilyDenoiser([a, GMMDenoiser(GaussianMixture.random(dims=6))], [3, 4])
    with pytest.raises(ValueError, match="one positive row count per member"):
        GMMFamilyDenoiser([a, b], [3])
    with pytest.raises(ValueError, match="has 3 class labels for 4 rows"):
        GMMFamilyDenoiser([a, b], [4, 4])
    with pytest.raises(IndexError, match=r"rows must lie in \[0, 7\)"):
        fam.denoise_ve(x[:1], 1.0, [7])
