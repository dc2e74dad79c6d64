"""UniPC's B(h) variant (``solver_type``) under guidance, checked against the float64 PF-ODE solution."""

from __future__ import annotations

import pytest
import torch

from fastdiff.samplers import FastScheduler, make_scheduler, run_scheduler
from fastdiff.samplers.gmm import GaussianMixture, GMMDenoiser, median_rms_error, probability_flow_reference

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def guided():
    mix = GaussianMixture.random(dims=16, components=6, std=0.15, num_classes=3, seed=3)
    model = GMMDenoiser(mix, class_labels=torch.arange(24) % 3, guidance_scale=5.0)
    x = torch.randn(24, 16, generator=torch.Generator().manual_seed(4))
    return model, x, probability_flow_reference(model, x)


def _err(problem, n, **opts):
    model, x, ref = problem
    return median_rms_error(run_scheduler(model, x.clone(), make_scheduler("unipc", **opts), n), ref)


def test_bh1_converges_to_the_exact_guided_solution(guided):
    """bh1 is a different solver (not bh2 under another name) and still second order: doubling the NFE
    from 20 to 40 divides its error by well over 2 (first order would give 2)."""
    e = {n: _err(guided, n, schedule="karras", final_step="variance", solver_type="bh1") for n in (20, 40)}
    e2 = _err(guided, 20, schedule="karras", final_step="variance")
    assert e[20] / e[40] > 3.0, e
    assert abs(e[20] - e2) > 0.01 * e2, (e[20], e2)


def test_bh1_steps_match_diffusers_before_the_last():
    """Every intermediate state of UniPC bh1 (Karras, rounded timesteps) equals diffusers' solver_type="bh1".
    The last step is left out: diffusers' bh1 divides by B(h) = -h = -inf on its step to sigma = 0 and
    returns NaN there; fastdiff's last step returns the x0 estimate and stays finite."""
    from diffusers import UniPCMultistepScheduler

    sd = dict(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear")
    theirs = UniPCMultistepScheduler(**sd, solver_type="bh1", use_karras_sigmas=True)
    ours = make_scheduler("unipc", schedule="karras", solver_type="bh1", fractional_timesteps=False)
    bh2 = make_scheduler("unipc", schedule="karras", fractional_timesteps=False)
    g = torch.Generator().manual_seed(0)
    w = torch.randn(16, 16, generator=g, dtype=torch.float64) / 4.0
    model = lambda x, t: (torch.tanh(x.double() @ w) * 0.8 + 0.2 * torch.sin(t.double() / 150.0)).float()
    n = 7
    for s in (theirs, ours, bh2):
        s.set_timesteps(n)
    assert torch.equal(theirs.timesteps.double(), ours.timesteps.double())
    a = b = c = torch.randn(3, 16, generator=g)
    for i, t in enumerate(theirs.timesteps):
        a = theirs.step(model(a, t), t, a).prev_sample
        b = ours.step(model(b, t), t, b).prev_sample
        c = bh2.step(model(c, t), t, c).prev_sample
        if i < n - 1:
            assert float((a - b).norm() / a.norm()) < 1e-5, i
    assert torch.isfinite(b).all() and not torch.isfinite(a).all()  # the documented diffusers NaN
    assert float((b - c).norm() / c.norm()) > 1e-3  # bh1 is not bh2


def test_solver_type_is_validated_and_saved_with_the_config(tmp_path):
    with pytest.raises(ValueError, match=r"solver_type .* must be one of \('bh2', 'bh1'\), got 'bh3'"):
        make_scheduler("unipc", solver_type="bh3")
    with pytest.raises(ValueError, match="solver_type='bh1' applies only to sampler 'unipc'"):
        make_scheduler("dpmpp_2m", solver_type="bh1")
    sig = [14.6, 5.0, 1.2, 0.3, 0.05, 0.0]
    s = make_scheduler("unipc", schedule=sig, solver_type="bh1", final_step="variance")
    s.save_pretrained(tmp_path)
    loaded = FastScheduler.from_pretrained(tmp_path)
    assert loaded.config.solver_type == "bh1" and loaded.config.schedule == sig
    loaded.set_timesteps(None)
    assert loaded._solver.solver_type == "bh1"
