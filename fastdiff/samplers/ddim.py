"""DDIM (Song et al. 2021) and Euler (Karras et al. 2022) updates in VE form.

DDIM, eq. 12 of Song et al., in the VP variables of the model::

    x_{t-1} = sqrt(a_{t-1}) x0 + sqrt(1 - a_{t-1} - s_t^2) eps + s_t z,
    s_t(eta) = eta * sqrt((1 - a_{t-1}) / (1 - a_t)) * sqrt(1 - a_t / a_{t-1})      (eq. 16)

with ``a = alpha_bar``.  Dividing by ``sqrt(a_{t-1})`` gives the VE form used here, with
``sigma = sqrt(1/a - 1)``, ``eps = (x - x0) / sigma`` and ``s~ = s_t / sqrt(a_{t-1})``::

    x_next = x0 + sqrt(sigma_next^2 - s~^2) * eps + s~ * z.

With eta = 0 this is exactly one Euler step of the probability-flow ODE
``dx/dsigma = (x - D(x, sigma)) / sigma`` (Karras et al. 2022, eq. 3 / alg. 1), so
:func:`euler_update` and ``ddim_update(eta=0)`` agree to rounding.

Difference by design from diffusers' DDIMScheduler: the next noise level is always the next
entry of the schedule (diffusers uses ``prev_t = t - T // N``, which is wrong for the
"linspace" and "trailing" spacings), and the last step lands on sigma = 0 (diffusers with
``set_alpha_to_one=False`` stops at ``alpha_bar[0]`` and leaves that noise in the output).
"""

from __future__ import annotations

import math

import torch


def ddim_noise_scale(sigma: float, sigma_next: float, eta: float) -> float:
    """VE standard deviation ``s~`` of the fresh noise of a DDIM step (eq. 16 divided by alpha_next)."""
    if eta == 0.0 or sigma_next == 0.0:
        return 0.0
    a, a_next = 1.0 / (1.0 + sigma**2), 1.0 / (1.0 + sigma_next**2)
    var_vp = (1.0 - a_next) / (1.0 - a) * (1.0 - a / a_next)
    return eta * math.sqrt(var_vp / a_next)


def ddim_update(
    x: torch.Tensor,
    denoised: torch.Tensor,
    sigma: float,
    sigma_next: float,
    eta: float = 0.0,
    noise: torch.Tensor | None = None,
) -> torch.Tensor:
    """One DDIM step from ``sigma`` to ``sigma_next`` (VE state ``x``, x0-prediction ``denoised``)."""
    eps = (x - denoised) / sigma
    s = ddim_noise_scale(sigma, sigma_next, eta)
    out = denoised + math.sqrt(max(sigma_next**2 - s**2, 0.0)) * eps
    if s > 0.0:
        if noise is None:
            raise ValueError("ddim with eta > 0 needs noise")
        out = out + s * noise
    return out


def euler_update(x: torch.Tensor, denoised: torch.Tensor, sigma: float, sigma_next: float) -> torch.Tensor:
    """Euler step of the probability-flow ODE ``dx/dsigma = (x - D) / sigma`` (Karras et al. alg. 1)."""
    d = (x - denoised) / sigma
    return x + (sigma_next - sigma) * d
