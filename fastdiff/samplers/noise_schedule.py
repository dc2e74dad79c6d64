"""The training noise schedule of a discrete-time diffusion model, made continuous.

A Stable-Diffusion-style model is trained on ``T`` (usually 1000) discrete steps with
cumulative products ``alpha_bar[t] = prod_{s<=t} (1 - beta_s)``.  The forward process is
the variance-preserving (VP) marginal

    x_t = alpha_t * x0 + sigma_t * eps,   alpha_t = sqrt(alpha_bar[t]),  sigma_t = sqrt(1 - alpha_bar[t]).

fastdiff's samplers work with the variance-exploding (VE) noise level of Karras et al. (2022)

    sigma = sigma_t / alpha_t = sqrt(1 / alpha_bar - 1),    x_ve = x_t / alpha_t = x0 + sigma * eps,

and with the log signal-to-noise ratio ``lambda = log(alpha_t / sigma_t) = -log(sigma)`` of
DPM-Solver (Lu et al. 2022).  ``sigma`` lives in (0, inf); sigma = 0 is clean data.

Fractional timesteps.  ``log alpha_bar`` is interpolated *linearly* between the integer
training steps.  This gives a continuous, strictly monotone map ``t -> sigma(t)`` on
``[0, T - 1]`` whose inverse ``sigma -> t`` is exact (no iteration), so schedules defined in
sigma (Karras, exponential, fitted) can hand the U-Net the timestep whose noise level *is*
that sigma.  (diffusers interpolates ``log sigma`` instead and rounds the result.)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import torch

BETA_SCHEDULES = ("linear", "scaled_linear", "squaredcos_cap_v2")

# Stable Diffusion 1.x/2.x/XL training schedule: what every SD checkpoint ships in scheduler_config.json.
SD_TRAINING_CONFIG = {
    "num_train_timesteps": 1000,
    "beta_start": 0.00085,
    "beta_end": 0.012,
    "beta_schedule": "scaled_linear",
    "trained_betas": None,
}


def training_betas(
    num_train_timesteps: int = 1000,
    beta_start: float = 0.00085,
    beta_end: float = 0.012,
    beta_schedule: str = "scaled_linear",
    trained_betas: Sequence[float] | np.ndarray | None = None,
) -> np.ndarray:
    """Return the ``beta_t`` of a diffusers training config, computed as diffusers does (float32)."""
    if trained_betas is not None:
        betas = np.asarray(trained_betas, dtype=np.float32)
        if betas.ndim != 1 or len(betas) < 2:
            raise ValueError(f"trained_betas must be a 1-D sequence of >= 2 values, got shape {betas.shape}")
        return betas.astype(np.float64)
    if num_train_timesteps < 2:
        raise ValueError(f"num_train_timesteps must be >= 2, got {num_train_timesteps}")
    t = num_train_timesteps
    if beta_schedule == "linear":
        betas = torch.linspace(beta_start, beta_end, t, dtype=torch.float32)
    elif beta_schedule == "scaled_linear":
        betas = torch.linspace(beta_start**0.5, beta_end**0.5, t, dtype=torch.float32) ** 2
    elif beta_schedule == "squaredcos_cap_v2":
        # Nichol & Dhariwal (2021) eq. 17, with the usual 0.999 cap on beta.
        f = lambda s: math.cos((s + 0.008) / 1.008 * math.pi / 2) ** 2
        betas = torch.tensor(
            [min(1 - f((i + 1) / t) / f(i / t), 0.999) for i in range(t)], dtype=torch.float32
        )
    else:
        raise ValueError(f"unknown beta_schedule {beta_schedule!r}; valid: {', '.join(BETA_SCHEDULES)}")
    return betas.double().numpy()


class NoiseSchedule:
    """Continuous view of a discrete VP training schedule (see module docstring).

    All conversions are in float64.  ``t`` may be any real in ``[0, T - 1]``; ``sigma`` any
    real in ``[sigma_min, sigma_max] = [sigma(0), sigma(T - 1)]``.
    """

    def __init__(self, betas: np.ndarray):
        betas = np.asarray(betas, dtype=np.float64)
        if np.any(betas <= 0) or np.any(betas >= 1):
            raise ValueError("betas must lie in (0, 1)")
        self.betas = betas
        self.num_train_timesteps = len(betas)
        self.alphas_cumprod = np.cumprod(1.0 - betas)
        self.log_alpha_bar = np.log(self.alphas_cumprod)  # strictly decreasing in t
        self._grid = np.arange(self.num_train_timesteps, dtype=np.float64)
        self.sigma_min = float(self.sigma_of_t(0.0))
        self.sigma_max = float(self.sigma_of_t(self.num_train_timesteps - 1.0))

    @classmethod
    def from_config(cls, config: Mapping | None = None) -> NoiseSchedule:
        """Build from a diffusers scheduler config (dict/FrozenDict); missing keys take SD's values."""
        cfg = dict(SD_TRAINING_CONFIG)
        if config is not None:
            cfg.update({k: config[k] for k in SD_TRAINING_CONFIG if k in config})
        return cls(training_betas(**cfg))

    # --- t <-> log alpha_bar --------------------------------------------------------------------
    def _check_t(self, t: np.ndarray) -> None:
        if np.any(~np.isfinite(t)) or np.any(t < 0) or np.any(t > self.num_train_timesteps - 1):
            raise ValueError(
                f"timesteps must lie in [0, {self.num_train_timesteps - 1}] (the training range), got "
                f"min {np.min(t):.6g}, max {np.max(t):.6g}"
            )

    def log_alpha_bar_of_t(self, t) -> np.ndarray:
        """Piecewise-linear interpolation of ``log alpha_bar`` at (fractional) ``t``."""
        t = np.asarray(t, dtype=np.float64)
        self._check_t(t)
        return np.interp(t, self._grid, self.log_alpha_bar)

    def sigma_of_t(self, t) -> np.ndarray:
        """VE noise level ``sigma(t) = sqrt(1 / alpha_bar(t) - 1)``."""
        return np.sqrt(np.expm1(-self.log_alpha_bar_of_t(t)))

    def t_of_sigma(self, sigma) -> np.ndarray:
        """Exact inverse of :meth:`sigma_of_t` (``log alpha_bar = -log(1 + sigma^2)``)."""
        sigma = np.asarray(sigma, dtype=np.float64)
        lo, hi = self.sigma_min * (1 - 1e-9), self.sigma_max * (1 + 1e-9)
        if np.any(~np.isfinite(sigma)) or np.any(sigma < lo) or np.any(sigma > hi):
            raise ValueError(
                f"sigmas must lie in [sigma_min, sigma_max] = [{self.sigma_min:.6g}, {self.sigma_max:.6g}] "
                f"(timesteps 0..{self.num_train_timesteps - 1}), got min {np.min(sigma):.6g}, max {np.max(sigma):.6g}"
            )
        lab = -np.log1p(sigma**2)
        # np.interp needs increasing x: log_alpha_bar decreases with t, so flip both axes.
        t = np.interp(-lab, -self.log_alpha_bar, self._grid)
        return np.clip(t, 0.0, self.num_train_timesteps - 1.0)

    @staticmethod
    def alpha_sigma_vp(sigma) -> tuple[np.ndarray, np.ndarray]:
        """VP ``(alpha_t, sigma_t)`` of a VE ``sigma`` (``alpha_t = 1 / sqrt(1 + sigma^2)``)."""
        sigma = np.asarray(sigma, dtype=np.float64)
        alpha = 1.0 / np.sqrt(1.0 + sigma**2)
        return alpha, sigma * alpha
