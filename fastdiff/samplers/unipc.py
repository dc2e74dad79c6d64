"""UniPC: unified predictor-corrector (Zhao et al. 2023, alg. 2 "UniPC-p").

Data-prediction variant in log-SNR ``lambda = -log(sigma)`` (VE sigma).  For a step from
``s0`` to ``t`` with ``h = lambda_t - lambda_s0``, ``hh = -h``, ``B(h) = expm1(hh)`` ("bh2", the
default) or ``B(h) = hh`` ("bh1"; the paper's two choices, sec. 3.3; diffusers' ``solver_type``) and
previous points ``r_k = (lambda_{s_k} - lambda_s0) / h``, ``D1_k = (m_k - m0) / r_k``:

UniP-p (predictor, eq. 9)::

    x_t = (sigma_t / sigma_s0) x - expm1(hh) m0 - B(h) sum_k rho^p_k D1_k

UniC-p (corrector, eq. 10), run once the model has been evaluated at the predicted ``x_t``
(so it costs no extra evaluation) and using ``m_t = D(x_t, sigma_t)``::

    x_t^c = (sigma_t / sigma_s0) x - expm1(hh) m0 - B(h) (sum_k rho^c_k D1_k + rho^c_p (m_t - m0))

The ``rho`` solve ``R rho = b`` with ``R_ik = r_k^(i-1)`` and ``b_i = i! phi_{i+1}(hh) / B(h)``
(``phi`` the exponential-integrator functions, alg. 2 lines 3-8).  Order 2 of the predictor and
order 1 of the corrector use the closed forms ``rho = 1/2``.  ``B(h)`` cancels wherever ``rho`` is
solved for, so the variant matters only through those closed forms: the predictor's second-order
difference term and the first-order corrector scale with ``B(h)``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from .dpm_solver import _lam

SOLVER_TYPES = ("bh2", "bh1")


def check_solver_type(solver_type) -> None:
    """Raise a clear error unless ``solver_type`` names one of the paper's two ``B(h)``."""
    if solver_type not in SOLVER_TYPES:
        raise ValueError(f"solver_type (UniPC's B(h)) must be one of {SOLVER_TYPES}, got {solver_type!r}")


def _unipc_coefficients(sigmas: Sequence[float], sigma_t: float, order: int, solver_type: str = "bh2"):
    """Return ``(phi_1, B_h, rks[order-1], b[order])`` for the step ``sigmas[0] -> sigma_t``."""
    lam0 = _lam(sigmas[0])
    h = _lam(sigma_t) - lam0
    hh = -h
    h_phi_1 = math.expm1(hh)
    check_solver_type(solver_type)
    b_h = h_phi_1 if solver_type == "bh2" else hh
    rks = [(_lam(sigmas[k]) - lam0) / h for k in range(1, order)]
    b = []
    h_phi_k = h_phi_1 / hh - 1.0
    factorial = 1
    for i in range(1, order + 1):
        b.append(h_phi_k * factorial / b_h)
        factorial *= i + 1
        h_phi_k = h_phi_k / hh - 1.0 / factorial
    return h_phi_1, b_h, rks, b


def unipc_predict(
    x: torch.Tensor,
    denoised: Sequence[torch.Tensor],
    sigmas: Sequence[float],
    sigma_next: float,
    order: int,
    solver_type: str = "bh2",
) -> torch.Tensor:
    """UniP-``order`` predictor; ``denoised[k]``/``sigmas[k]`` are ``k`` steps back; ``sigma_next > 0``."""
    h_phi_1, b_h, rks, b = _unipc_coefficients(sigmas, sigma_next, order, solver_type)
    m0 = denoised[0]
    out = (sigma_next / sigmas[0]) * x - h_phi_1 * m0
    if order == 1:
        return out
    if order == 2:
        rhos = [0.5]
    else:
        r = np.array([[rk ** (i - 1) for rk in rks] for i in range(1, order)])
        rhos = np.linalg.solve(r, np.array(b[:-1])).tolist()
    res = sum(rho / rk * (denoised[k + 1] - m0) for k, (rho, rk) in enumerate(zip(rhos, rks)))
    return out - b_h * res


def unipc_correct(
    x_prev: torch.Tensor,
    denoised_prev: Sequence[torch.Tensor],
    sigmas_prev: Sequence[float],
    sigma: float,
    denoised: torch.Tensor,
    order: int,
    solver_type: str = "bh2",
) -> torch.Tensor:
    """UniC-``order`` corrector of the step ``sigmas_prev[0] -> sigma``.

    ``x_prev`` is the (corrected) state at ``sigmas_prev[0]``, ``denoised_prev[k]`` the
    x0-predictions ``k`` steps before ``sigma``'s step, ``denoised`` the model's x0-prediction
    at the predicted state at ``sigma``.  Returns the corrected state at ``sigma``.
    """
    h_phi_1, b_h, rks, b = _unipc_coefficients(sigmas_prev, sigma, order, solver_type)
    m0 = denoised_prev[0]
    out = (sigma / sigmas_prev[0]) * x_prev - h_phi_1 * m0
    if order == 1:
        rhos = [0.5]
    else:
        r = np.array([[rk ** (i - 1) for rk in [*rks, 1.0]] for i in range(1, order + 1)])
        rhos = np.linalg.solve(r, np.array(b)).tolist()
    res = rhos[-1] * (denoised - m0)
    for k, (rho, rk) in enumerate(zip(rhos[:-1], rks)):
        res = res + rho / rk * (denoised_prev[k + 1] - m0)
    return out - b_h * res
