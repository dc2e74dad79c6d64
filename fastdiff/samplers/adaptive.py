"""Error-controlled step size: a tolerance instead of a step count (DPM-Solver++ multistep, orders 1 and 2).

Adaptive step size after DPM-Solver (Lu et al. 2022, sec. 4 / alg. 4, "DPM-Solver-12") and "Gotta Go
Fast" (Jolicoeur-Martineau et al. 2021): two updates of different order from the same point, the difference
is the local error estimate of the lower one, a step is accepted when the scaled error is <= 1, and the
higher-order result is kept (local extrapolation). Those methods are single-step, so the estimate costs an
extra model evaluation per step (2 NFE per step for DPM-Solver-12, 3 for -23). Here the pair is the
*multistep* DPM-Solver++ in data-prediction form (Lu et al. 2022b, alg. 2): with step ``h`` in log-SNR
``lambda = -log sigma`` and the x0 predictions ``D0`` (now) and ``D1`` (previous step, ``h_prev`` ago),

    first order  x_1 = (sigma'/sigma) x - expm1(-h) D0                      (DDIM)
    second order x_2 = x_1 - expm1(-h) / 2 * (h / h_prev) (D0 - D1)         (2M)

so the estimate ``x_2 - x_1`` needs no model evaluation at all, for any trial ``h``: the step size is chosen
before the step (shrink ``h`` until the error is within tolerance) and every step costs one evaluation.
The error norm is DPM-Solver's: on the VP state, RMS of ``(x_2 - x_1) / max(atol, rtol * max(|x_2|,
|x_prev|))`` (alg. 4), per row. The first step has no history: a first-order step of ``h_init``. The run
ends with a step to ``sigma_end`` (default: the training schedule's smallest sigma) and one to 0 that
returns the x0 prediction there (``final_step="denoised"``) or ``(x + D) / 2`` (``"variance"``, see
:mod:`fastdiff.samplers.core`).

Driven by :func:`fastdiff.dynamic.sample` with ``num_inference_steps=None``: the scheduler implements
:class:`fastdiff.dynamic.adapters.SelfScheduling`, so every row gets its own copy and takes its own steps;
``SampleResult.nfe_per_sample`` says what each row cost.
"""

from __future__ import annotations

import math

import torch
from diffusers.configuration_utils import FrozenDict

from fastdiff._checks import is_int
from fastdiff.dynamic.adapters import predicted_x0, vp_of_ve

from .core import check_final_step
from .dpm_solver import dpmpp_update
from .noise_schedule import NoiseSchedule
from .options import check_prediction_type, positive_number
from .scheduler import FullPrecisionState, inherited_config

__all__ = ["AdaptiveScheduler"]


class AdaptiveScheduler(FullPrecisionState):
    """DPM-Solver++(2M) with error-controlled step size; see the module docstring.

    Args:
        rtol, atol: tolerance of the local error (DPM-Solver's defaults for images are rtol 0.05, atol
            0.0078 on [-1, 1] data); smaller means more, smaller steps.
        like: a diffusers scheduler, pipeline or config whose training schedule and prediction type to use.
        h_init: log-SNR length of the first (first-order) step.
        safety: factor on the step-size update ``h * safety * err^(-1/2)``.
        max_growth: a step is at most this many times the previous one.
        sigma_end: last non-zero noise level (default: the training schedule's smallest).
        final_step: "denoised" or "variance", as :func:`make_scheduler`.
        max_steps: give up (error) after this many steps of one run.
    """

    order = 1
    init_noise_sigma = 1.0

    def __init__(
        self,
        rtol: float = 0.05,
        atol: float = 0.0078,
        like=None,
        *,
        h_init: float = 0.5,
        safety: float = 0.9,
        max_growth: float = 3.0,
        sigma_end: float | None = None,
        final_step: str = "denoised",
        max_steps: int = 1000,
        h_min: float = 1e-3,
        keep: str = "corrected",
    ):
        if keep not in ("corrected", "predicted"):
            raise ValueError(f"AdaptiveScheduler keep must be 'corrected' or 'predicted', got {keep!r}")
        self.keep = keep
        self.h_min = positive_number("AdaptiveScheduler h_min", h_min)
        self.rtol = positive_number("AdaptiveScheduler rtol", rtol, allow_zero=True)
        self.atol = positive_number("AdaptiveScheduler atol", atol, allow_zero=True)
        if self.rtol == 0 and self.atol == 0:
            raise ValueError("AdaptiveScheduler needs rtol > 0 or atol > 0")
        self.h_init = positive_number("AdaptiveScheduler h_init", h_init)
        self.safety = positive_number("AdaptiveScheduler safety", safety)
        if not 0 < self.safety <= 1:
            raise ValueError(f"AdaptiveScheduler safety must be in (0, 1], got {safety!r}")
        self.max_growth = positive_number("AdaptiveScheduler max_growth", max_growth)
        if self.max_growth <= 1:
            raise ValueError(f"AdaptiveScheduler max_growth must be > 1, got {max_growth!r}")
        check_final_step(final_step)
        if not is_int(max_steps) or max_steps < 2:
            raise ValueError(f"AdaptiveScheduler max_steps must be an int >= 2, got {max_steps!r}")
        keys = inherited_config(like)
        self.prediction_type = keys.get("prediction_type", "epsilon")
        check_prediction_type(self.prediction_type)
        self.noise_schedule = NoiseSchedule.from_config(keys)
        self.alphas_cumprod = torch.from_numpy(self.noise_schedule.alphas_cumprod).float()
        ns = self.noise_schedule
        self.sigma_end = (
            ns.sigma_min if sigma_end is None else positive_number("AdaptiveScheduler sigma_end", sigma_end)
        )
        if not ns.sigma_min * (1 - 1e-9) <= self.sigma_end < ns.sigma_max:
            raise ValueError(
                f"AdaptiveScheduler sigma_end must lie in [{ns.sigma_min:.6g}, {ns.sigma_max:.6g}), got {sigma_end!r}"
            )
        self.final_step = final_step
        self.max_steps = max_steps
        self.config = FrozenDict({**keys, "prediction_type": self.prediction_type})
        self.set_timesteps()

    # --- the loop's contract -----------------------------------------------------------------------
    def accepts_step_count(self) -> bool:
        return False  # fastdiff.dynamic.adapters.SelfScheduling

    def set_timesteps(self, num_inference_steps=None, device=None) -> None:
        """Start a run at the training schedule's largest sigma. The step count follows from the tolerance."""
        if num_inference_steps is not None:
            raise ValueError(
                "AdaptiveScheduler picks its steps from rtol/atol; pass num_inference_steps=None, "
                f"got {num_inference_steps!r}"
            )
        self._sig = [self.noise_schedule.sigma_max]
        self._ts = [float(self.noise_schedule.num_train_timesteps - 1)]
        self._hist: list[tuple[torch.Tensor, float]] = []  # accepted (x0 prediction, sigma), newest first
        self._last = None  # (VE state, history, predictor order) at the start of the step being taken
        self._h = self.h_init
        self._shadow = None
        self._step_index = 0
        self.errors: list[float] = []  # scaled error of each step, judged at its end (NaN: none)
        self.rejected = 0  # evaluations spent on rejected steps

    @property
    def timesteps(self) -> torch.Tensor:
        """Model timesteps visited so far and the next one (empty once finished)."""
        return torch.tensor(self._ts, dtype=torch.float32)  # one per non-zero level of self._sig

    @property
    def sigmas(self) -> torch.Tensor:
        return torch.tensor(self._sig, dtype=torch.float32)

    @property
    def step_index(self) -> int:
        return self._step_index

    def scale_model_input(self, sample: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        return sample

    def vp_coefficients(self, index: int) -> tuple[float, float]:
        return vp_of_ve(self._sig[index])

    # --- one step ----------------------------------------------------------------------------------
    def _scaled_error(self, diff_vp, x_high_vp, x_prev_vp) -> float:
        scale = torch.maximum(x_high_vp.abs(), x_prev_vp.abs()) * self.rtol
        scale = scale.clamp_min(self.atol) if self.atol > 0 else scale
        err = (diff_vp / scale).flatten(1).pow(2).mean(1).sqrt()
        return float(err.max())  # rows share a copy only outside sample(); then the worst row decides

    def _predict(self, x, hist, s_next) -> torch.Tensor:
        """DPM-Solver++ multistep predictor from the accepted history (newest first): order 2 once there is
        a previous step, else 1."""
        d = [h[0] for h in hist]
        s = [h[1] for h in hist]
        return dpmpp_update(x, d, s, s_next, min(2, len(d)))

    def step(self, model_output, timestep, sample, generator=None, return_dict: bool = True):
        i = self._step_index
        if i >= len(self._sig) or self._sig[i] == 0.0:
            raise IndexError("this adaptive run has finished; call set_timesteps() to start another")
        x_vp = self._full_precision(sample)
        sigma = self._sig[i]
        alpha, sigma_vp = vp_of_ve(sigma)
        d1 = predicted_x0(model_output.to(x_vp.dtype), x_vp, alpha, sigma_vp, self.prediction_type)
        x = x_vp / alpha  # VE state
        if i + 1 >= self.max_steps:
            raise RuntimeError(
                f"AdaptiveScheduler took {self.max_steps} evaluations without finishing (now sigma {sigma:.4g}); "
                f"loosen rtol/atol ({self.rtol}, {self.atol}) or raise max_steps"
            )
        err, accepted = float("nan"), True
        if self._last is not None:  # judge the step that led here, now that D is known at its end
            x_prev, hist_prev, order = self._last
            s0 = hist_prev[0][1]
            h = math.log(s0) - math.log(sigma)
            phi = math.expm1(-h)
            d0 = hist_prev[0][0]
            # corrector: D linear between the step's two ends, integrated exactly (coefficient h + phi)
            x_corr = (sigma / s0) * x_prev - phi * d0 + ((h + phi) / h) * (d1 - d0)
            err = self._scaled_error(alpha * (x_corr - x), alpha * x_corr, x_prev / math.sqrt(1.0 + s0 * s0))
            accepted = err <= 1.0 or h <= self.h_min
            factor = self.safety * err ** (-1.0 / (order + 1)) if err > 0 else self.max_growth
            if not accepted:
                self.rejected += 1
                h_new = max(h * min(0.9, max(0.2, factor)), self.h_min)  # strictly shorter
                x_next = self._retry(x_prev, hist_prev, s0, h_new, order)
            else:
                if self.keep == "corrected":
                    x = x_corr
                self._h = h * min(self.max_growth, max(0.2, factor))
        if accepted:
            hist = [(d1, sigma), *self._hist][:2]
            if sigma <= self.sigma_end * (1 + 1e-9):
                x_next, s_next = (0.5 * (x + d1) if self.final_step == "variance" else d1), 0.0
                self._last = None
            else:
                s_next = self._next_level(sigma, self._h)
                x_next = self._predict(x, hist, s_next)
                self._last = (x, hist, min(2, len(hist)))
            self._hist = hist
        else:
            s_next = self._sig[-1]  # set by _retry
        if s_next > 0:
            self._ts.append(float(self.noise_schedule.t_of_sigma(s_next)))
        if accepted:
            self._sig.append(s_next)
        self.errors.append(err)
        return self._step_output(x_next / math.sqrt(1.0 + s_next * s_next), d1, sample, return_dict)

    def _next_level(self, sigma: float, h: float, stretch: bool = True) -> float:
        h_left = math.log(sigma) - math.log(self.sigma_end)
        # a sliver before sigma_end would cost a whole evaluation: stretch the step (not when retrying)
        if h >= h_left or (stretch and h_left - h < 0.2 * h):
            return self.sigma_end
        return sigma * math.exp(-h)

    def _retry(self, x_prev, hist_prev, s0, h, order) -> torch.Tensor:
        """Rejected: back to the step's start (its D is known) and a shorter step from there."""
        s_next = self._next_level(s0, h, stretch=False)
        self._sig.append(s_next)
        self._hist = hist_prev
        self._last = (x_prev, hist_prev, order)
        return self._predict(x_prev, hist_prev, s_next)

    def __repr__(self) -> str:
        return (
            f"AdaptiveScheduler(rtol={self.rtol}, atol={self.atol}, h_init={self.h_init}, "
            f"sigma_end={self.sigma_end:.4g}, final_step={self.final_step!r})"
        )
