"""Latent Consistency Model multistep sampling (Luo et al. 2023, alg. 1 "multistep LCM sampling").

A consistency model ``f(x, t)`` maps any point of a PF-ODE trajectory to its origin.  LCM
parameterises it with the boundary condition ``f(x, 0) = x`` (eq. 6, after Song et al. 2023)::

    f(x, t) = c_skip(t) x + c_out(t) x0_hat(x, t),
    c_skip = s_d^2 / ((k t)^2 + s_d^2),   c_out = k t / sqrt((k t)^2 + s_d^2),

with ``s_d = 0.5`` and ``k = timestep_scaling = 10`` (diffusers' LCMScheduler convention, ``x`` the
VP state).  Multistep sampling alternates ``x0 = f(x_t, t)`` and re-noising to the next level
``x_{t'} = alpha_{t'} x0 + sigma_{t'} z`` with fresh noise; the last step returns ``x0``.
"""

from __future__ import annotations

import math

import torch


def lcm_boundary_scalings(timestep: float, timestep_scaling: float = 10.0, sigma_data: float = 0.5):
    """``(c_skip, c_out)`` of the consistency-model boundary condition (Luo et al. eq. 6)."""
    st = timestep * timestep_scaling
    c_skip = sigma_data**2 / (st**2 + sigma_data**2)
    c_out = st / math.sqrt(st**2 + sigma_data**2)
    return c_skip, c_out


def lcm_denoised(
    x: torch.Tensor, x0_pred: torch.Tensor, sigma: float, timestep: float, timestep_scaling: float = 10.0
) -> torch.Tensor:
    """Consistency function ``f(x, t)`` for the VE state ``x`` (VP state is ``x / sqrt(1 + sigma^2)``)."""
    c_skip, c_out = lcm_boundary_scalings(timestep, timestep_scaling)
    return c_out * x0_pred + (c_skip / math.sqrt(1.0 + sigma**2)) * x


def lcm_update(denoised: torch.Tensor, sigma_next: float, noise: torch.Tensor | None) -> torch.Tensor:
    """Re-noise the consistency estimate to ``sigma_next`` (VE); returns it unchanged at sigma = 0."""
    if sigma_next == 0.0:
        return denoised
    if noise is None:
        raise ValueError("lcm needs noise to re-noise between steps")
    return denoised + sigma_next * noise
