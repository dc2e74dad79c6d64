"""DPM-Solver++ multistep updates (Lu et al. 2022, "DPM-Solver++", alg. 2 and appendix B).

Data-prediction form in log-SNR ``lambda = -log(sigma)`` (VE sigma).  With ``h = lambda_next
- lambda_0`` and the x0-predictions ``m0, m1, m2`` at the current and two previous steps, the
VP update of alg. 2 divided by ``alpha_next`` reads, for the VE state ``x``::

    first order  (= DDIM):  x' = (sigma'/sigma) x - expm1(-h) m0
    2M (midpoint):          x' = (sigma'/sigma) x - expm1(-h) (m0 + D1 / 2),   D1 = (m0 - m1) / r0
    3M:                     x' = (sigma'/sigma) x - expm1(-h) m0 + (expm1(-h)/h + 1) D1
                                 - ((expm1(-h) + h)/h^2 - 1/2) D2

with ``r0 = h_prev / h`` and, for 3M, ``D1 = D1_0 + r0/(r0+r1) (D1_0 - D1_1)``,
``D2 = (D1_0 - D1_1)/(r0 + r1)`` (the third-order multistep of Lu et al., eq. 4.x / alg. in
appendix, as implemented by diffusers' ``multistep_dpm_solver_third_order_update``).

SDE-DPM-Solver++(2M) (Lu et al. 2022, eq. 17 with midpoint difference)::

    x' = (sigma'/sigma) e^{-h} x + (1 - e^{-2h}) (m0 + D1 / 2) + sigma' sqrt(1 - e^{-2h}) z.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch


def _lam(sigma: float) -> float:
    return -math.log(sigma)


def dpmpp_update(
    x: torch.Tensor,
    denoised: Sequence[torch.Tensor],
    sigmas: Sequence[float],
    sigma_next: float,
    order: int,
) -> torch.Tensor:
    """DPM-Solver++ multistep ODE update of order 1, 2 or 3.

    ``denoised[k]`` and ``sigmas[k]`` are the x0-prediction and noise level ``k`` steps back
    (``k = 0`` is the current step); ``order`` of them are used.  ``sigma_next > 0``.
    """
    s0 = sigmas[0]
    h = _lam(sigma_next) - _lam(s0)
    phi = math.expm1(-h)  # e^{-h} - 1
    m0 = denoised[0]
    out = (sigma_next / s0) * x - phi * m0
    if order == 1:
        return out
    r0 = (_lam(s0) - _lam(sigmas[1])) / h
    d1_0 = (m0 - denoised[1]) / r0
    if order == 2:
        return out - (0.5 * phi) * d1_0
    if order != 3:
        raise ValueError(f"DPM-Solver++ order must be 1, 2 or 3, got {order}")
    r1 = (_lam(sigmas[1]) - _lam(sigmas[2])) / h
    d1_1 = (denoised[1] - denoised[2]) / r1
    d1 = d1_0 + (r0 / (r0 + r1)) * (d1_0 - d1_1)
    d2 = (d1_0 - d1_1) / (r0 + r1)
    return out + (phi / h + 1.0) * d1 - ((phi + h) / h**2 - 0.5) * d2


def dpmpp_sde_update(
    x: torch.Tensor,
    denoised: Sequence[torch.Tensor],
    sigmas: Sequence[float],
    sigma_next: float,
    order: int,
    noise: torch.Tensor,
) -> torch.Tensor:
    """SDE-DPM-Solver++ multistep update, order 1 or 2 (the "2M SDE" sampler)."""
    s0 = sigmas[0]
    h = _lam(sigma_next) - _lam(s0)
    decay = -math.expm1(-2.0 * h)  # 1 - e^{-2h}
    m = denoised[0]
    if order == 2:
        r0 = (_lam(s0) - _lam(sigmas[1])) / h
        m = m + (0.5 / r0) * (denoised[0] - denoised[1])
    elif order != 1:
        raise ValueError(f"DPM-Solver++ SDE order must be 1 or 2, got {order}")
    return (sigma_next / s0 * math.exp(-h)) * x + decay * m + (sigma_next * math.sqrt(decay)) * noise
