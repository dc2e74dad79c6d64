"""Shared fixtures of the sampling-loop tests (tests/test_dynamic*.py): an exact per-row Gaussian denoiser
(data x0 ~ N(mu_r, s_r^2 I) for row r, so rows converge at different speeds and every result has a
closed-form meaning), a plain diffusers loop as reference, and a tiny random conditional U-Net."""

from __future__ import annotations

import torch
from diffusers import DPMSolverMultistepScheduler, UNet2DConditionModel

from fastdiff.dynamic import sample

SD_BETAS = dict(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear")


def dpm():
    return DPMSolverMultistepScheduler(algorithm_type="dpmsolver++", solver_order=2, **SD_BETAS)


class GaussianRows:
    """Exact eps-model for per-row Gaussian data N(mu_r, s_r^2 I) on SD's schedule; records batch sizes."""

    def __init__(self, mu: torch.Tensor, s: torch.Tensor, scheduler):
        self.mu, self.s = mu.double(), s.double()
        self.abar = scheduler.alphas_cumprod.double()
        self.batch_sizes = []

    def _abar(self, t):
        t = torch.as_tensor(t, dtype=torch.float64)
        lo = t.floor().long().clamp(0, len(self.abar) - 1)
        hi = (lo + 1).clamp(max=len(self.abar) - 1)
        w = t - lo
        return self.abar[lo] * (1 - w) + self.abar[hi] * w

    def __call__(self, x, t, rows=None):
        rows = torch.arange(x.shape[0]) if rows is None else rows
        self.batch_sizes.append(x.shape[0])
        abar = self._abar(t).reshape(-1, *([1] * (x.ndim - 1)))
        alpha, sigma = abar.sqrt(), (1 - abar).sqrt()
        mu, s2 = self.mu[rows], self.s[rows].square().reshape(-1, *([1] * (x.ndim - 1)))
        xd = x.double()
        # posterior mean of x0 given x_t = alpha x0 + sigma eps
        x0 = mu + alpha * s2 / (alpha.square() * s2 + sigma.square()) * (xd - alpha * mu)
        return ((xd - alpha * x0) / sigma).to(x.dtype)


def gaussian_case(batch=3, seed=0):
    """Rows whose x0 prediction settles late (wide data, small mean), later-ish, and at once (near-delta)."""
    g = torch.Generator().manual_seed(seed)
    scale = torch.tensor([0.1, 0.3, 3.0][:batch]).view(-1, 1, 1, 1)
    mu = torch.randn(batch, 4, 8, 8, generator=g) * scale
    s = torch.tensor([1.0, 1.0, 0.02][:batch])
    x = torch.randn(batch, 4, 8, 8, generator=g)
    return mu, s, x


def assert_rows_match_alone(res, mu, s, x, scheduler, steps_per_row, tol=1e-5):
    """Each row of a batched run ``res`` equals that row sampled alone with its own step count (max-abs)."""
    for r, n in enumerate(steps_per_row):
        alone = sample(
            GaussianRows(mu[r : r + 1], s[r : r + 1], scheduler),
            x[r : r + 1],
            scheduler=scheduler,
            num_inference_steps=n,
        )
        assert (res.latents[r] - alone.latents[0]).abs().max() < tol, r


def reference_loop(model, scheduler, x, n):
    sch = type(scheduler).from_config(scheduler.config)
    sch.set_timesteps(n)
    x = x * sch.init_noise_sigma
    for t in sch.timesteps:
        x = sch.step(model(sch.scale_model_input(x, t), t), t, x).prev_sample
    return x


def tiny_unet() -> UNet2DConditionModel:
    """A two-level cross-attention U-Net with 8 channels (random weights): conditioning paths, fast."""
    return UNet2DConditionModel(
        block_out_channels=(8, 16),
        layers_per_block=1,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=8,
        attention_head_dim=4,
        norm_num_groups=4,
        sample_size=8,
    )
