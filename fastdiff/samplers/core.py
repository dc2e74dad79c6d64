"""The sampling core: one driver for every update rule, in VE sigma / log-SNR space.

Every sampler is a sequence of updates ``x_{i+1} = rule(x_i, D_i, history, sigma_i, sigma_{i+1})``
on the VE state ``x = x_t / alpha_t`` (k-diffusion convention), where ``D_i`` is the model's
x0-prediction at step ``i``.  The rules are the pure functions of :mod:`.ddim`,
:mod:`.dpm_solver`, :mod:`.unipc` and :mod:`.lcm`; :class:`SolverState` keeps the short
history the multistep rules need and decides the order of each step:

* warm-up: a ``k``-step method uses order ``min(k, i + 1)`` at step ``i``;
* ``lower_order_final``: as in DPM-Solver++ (Lu et al. 2022, sec. 5 "stability at few steps"),
  the last steps drop to order <= 2 / 1 when ``N < 15`` (DPM-Solver++) or ``order <= N - i``
  (UniPC);
* the last step goes to sigma = 0 and returns an x0 estimate.  ``final_step="denoised"``
  returns the model's x0-prediction ``D_N`` (what every diffusers scheduler does);
  ``final_step="variance"`` takes one Euler step of the probability-flow ODE in the variance
  ``u = sigma^2`` instead, ``x0 = x - u * dx/du = (x + D) / 2``.  Along the ODE
  ``dx/du = -grad log p_u(x) / 2`` stays finite as ``u -> 0`` for a smooth data density, so this
  last step is second-order accurate in sigma (error O(sigma^4)) where returning ``D`` is only
  O(sigma^2); the benchmark measures it.

All arithmetic is done in float32 (float64 for float64 inputs) whatever the model dtype.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .ddim import ddim_update, euler_update
from .dpm_solver import dpmpp_sde_update, dpmpp_update
from .lcm import lcm_denoised, lcm_update
from .unipc import check_solver_type, unipc_correct, unipc_predict


@dataclass(frozen=True)
class SamplerInfo:
    """Static facts about a sampler name."""

    name: str
    description: str
    max_order: int  # highest supported solver order
    default_order: int
    default_schedule: str
    stochastic: bool  # draws fresh noise between steps
    # schedule="auto" (the default) is "trailing" up to this many steps and "karras" above: the
    # crossover measured per sampler on fastdiff-tiny (benchmarks/results/sampler_defaults.md)
    trailing_up_to: int = 10


SAMPLERS: dict[str, SamplerInfo] = {
    s.name: s
    for s in (
        SamplerInfo("ddim", "DDIM (Song et al. 2021, eq. 12), eta >= 0", 1, 1, "auto", False, 6),
        SamplerInfo(
            "euler", "Euler on the PF-ODE in sigma (Karras et al. 2022, alg. 1)", 1, 1, "auto", False, 6
        ),
        SamplerInfo("dpmpp_2m", "DPM-Solver++(2M) (Lu et al. 2022, alg. 2)", 3, 2, "auto", False),
        SamplerInfo("dpmpp_3m", "DPM-Solver++(3M) multistep", 3, 3, "auto", False, 15),
        SamplerInfo("dpmpp_2m_sde", "SDE-DPM-Solver++(2M) (Lu et al. 2022)", 2, 2, "auto", True, 20),
        SamplerInfo(
            "unipc", "UniPC-p with UniC corrector, B(h) bh2|bh1 (Zhao et al. 2023)", 3, 2, "auto", False
        ),
        SamplerInfo("lcm", "LCM multistep (Luo et al. 2023, alg. 1)", 1, 1, "lcm", True),
    )
}

FINAL_STEPS = ("denoised", "variance")


# the option rules SolverState, make_scheduler's validation (.options) and AdaptiveScheduler share
def sampler_info(name: str) -> SamplerInfo:
    """``SAMPLERS[name]``; an unknown name raises with the valid ones."""
    if name not in SAMPLERS:
        raise ValueError(f"unknown sampler {name!r}; valid: {', '.join(SAMPLERS)}")
    return SAMPLERS[name]


def check_order_range(info: SamplerInfo, order: int) -> None:
    if not 1 <= order <= info.max_order:
        raise ValueError(f"{info.name}: solver_order must be in [1, {info.max_order}], got {order}")


def check_final_step(final_step) -> None:
    if final_step not in FINAL_STEPS:
        raise ValueError(f"final_step must be one of {FINAL_STEPS}, got {final_step!r}")


class SolverState:
    """Per-run state of one sampler over a fixed sigma schedule (``sigmas[-1] == 0``)."""

    def __init__(
        self,
        name: str,
        sigmas: list[float],
        *,
        order: int | None = None,
        lower_order_final: bool = True,
        use_corrector: bool = True,
        eta: float = 0.0,
        final_step: str = "denoised",
        timestep_scaling: float = 10.0,
        solver_type: str = "bh2",
    ):
        info = sampler_info(name)
        order = info.default_order if order is None else order
        check_order_range(info, order)
        check_final_step(final_step)
        if eta < 0:
            raise ValueError(f"eta must be >= 0, got {eta}")
        check_solver_type(solver_type)
        self.name = name
        self.sigmas = [float(s) for s in sigmas]
        self.n = len(self.sigmas) - 1
        self.order = order
        self.lower_order_final = lower_order_final
        self.use_corrector = use_corrector
        self.eta = eta
        self.final_step = final_step
        self.timestep_scaling = timestep_scaling
        self.solver_type = solver_type
        self.denoised_hist: list[torch.Tensor] = []  # newest first
        self.sigma_hist: list[float] = []
        self.last_x: torch.Tensor | None = None  # UniPC: state the last predictor started from
        self.last_order = 1

    def step_order(self, i: int) -> int:
        """Order used at step ``i`` (see module docstring)."""
        order = min(self.order, i + 1)
        if self.name == "unipc":
            if self.lower_order_final:
                order = min(order, self.n - i)
        elif self.lower_order_final and self.n < 15:
            if i == self.n - 1:
                order = 1
            elif i == self.n - 2:
                order = min(order, 2)
        return max(order, 1)

    def step(
        self,
        i: int,
        x: torch.Tensor,
        denoised: torch.Tensor,
        noise_fn: Callable[[], torch.Tensor],
        timestep: float | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Advance from ``sigmas[i]`` to ``sigmas[i + 1]``.

        ``x`` is the VE state at step ``i`` and ``denoised`` the model's x0-prediction there.
        Returns ``(x_next, x0_estimate)``.  ``noise_fn()`` is called only when fresh noise is needed.
        """
        if not 0 <= i < self.n:
            raise IndexError(f"step index {i} out of range for {self.n} steps")
        sigma, sigma_next = self.sigmas[i], self.sigmas[i + 1]
        name = self.name

        if name == "unipc" and self.use_corrector and self.last_x is not None and i > 0:
            # UniC: refine the state the model was just evaluated at, reusing that evaluation.
            x = unipc_correct(
                self.last_x,
                self.denoised_hist,
                self.sigma_hist,
                sigma,
                denoised,
                self.last_order,
                self.solver_type,
            )
        if name == "lcm":
            denoised = lcm_denoised(x, denoised, sigma, float(timestep), self.timestep_scaling)
        self.denoised_hist.insert(0, denoised)  # newest first; third-order rules read three
        self.sigma_hist.insert(0, sigma)
        del self.denoised_hist[3:], self.sigma_hist[3:]

        if sigma_next == 0.0:
            if self.final_step == "variance" and name != "lcm":
                return 0.5 * (x + denoised), denoised
            return denoised, denoised

        # warm-up counts the steps actually taken (img2img starts part-way through the schedule)
        order = min(self.step_order(i), len(self.denoised_hist))
        if name == "ddim":
            noise = noise_fn() if self.eta > 0 else None
            x_next = ddim_update(x, denoised, sigma, sigma_next, self.eta, noise)
        elif name == "euler":
            x_next = euler_update(x, denoised, sigma, sigma_next)
        elif name in ("dpmpp_2m", "dpmpp_3m"):
            x_next = dpmpp_update(x, self.denoised_hist, self.sigma_hist, sigma_next, order)
        elif name == "dpmpp_2m_sde":
            x_next = dpmpp_sde_update(x, self.denoised_hist, self.sigma_hist, sigma_next, order, noise_fn())
        elif name == "unipc":
            self.last_x, self.last_order = x, order
            x_next = unipc_predict(
                x, self.denoised_hist, self.sigma_hist, sigma_next, order, self.solver_type
            )
        else:  # lcm
            x_next = lcm_update(denoised, sigma_next, noise_fn())
        return x_next, denoised
