"""Step schedules: which noise levels a sampler visits.

A schedule for ``N`` steps is a pair

* ``timesteps``: ``N`` model timesteps (what the U-Net is conditioned on), strictly decreasing;
* ``sigmas``: ``N + 1`` VE noise levels, strictly decreasing, ``sigmas[i]`` the level of
  ``timesteps[i]`` and ``sigmas[N] = 0`` (the last step lands on clean data and returns x0).

Named schedules (``T`` = num_train_timesteps):

``"leading"``   ``t_i = (T // N) * (N - 1 - i) + steps_offset`` (DDIMScheduler's "leading").
                Never starts at ``T - 1``; poor for few steps.
``"trailing"``  ``t_i = round(T - i * T / N) - 1``: starts at ``T - 1`` (Lin et al. 2024, table 2).
``"linspace"``  ``t_i = round(linspace(T - 1, 0, N + 1))[i]`` for ``i < N``: the ``N + 1``-point
                grid of DPMSolverMultistep/UniPC, whose endpoint ``t = 0`` is replaced by sigma = 0.
``"uniform"``   alias of ``"trailing"`` (the best of the uniform spacings at few steps).
``"karras"``    ``sigma_i = (smax^(1/rho) + i/(N-1) (smin^(1/rho) - smax^(1/rho)))^rho``, rho = 7
                (Karras et al. 2022, eq. 5), between ``sigma(T - 1)`` and ``sigma(0)``.
``"exponential"`` log-uniform sigmas between the same end points (uniform in log-SNR).
``"auto"``      the default of every sampler but LCM: ``"trailing"`` for ``N <= trailing_up_to``
                steps, ``"karras"`` above; ``trailing_up_to`` is per sampler (DDIM/Euler 6,
                DPM-Solver++(2M) and UniPC 10, DPM-Solver++(3M) 15, 2M-SDE 20: trailing won at every
                measured NFE up to 20).  Measured on the trained fastdiff-tiny with guidance 5 (held-out
                prompts, ``benchmarks/results/sampler_defaults.md``): trailing beats Karras at 4-10 NFE
                for DPM-Solver++(2M)/(3M) and UniPC and at 4-6 for DDIM (at 8 NFE Karras spends 2 of
                its evaluations below sigma = 0.3, where the guided x0 prediction barely moves, and
                steps h = 0.75-0.89 in log-SNR through sigma 4-0.3 where trailing steps 0.45-0.49;
                ``benchmarks/results/unipc_karras.md``); Karras wins from 15 NFE (3M: 20; trailing's last
                jump from sigma ~ 0.2-0.4 to 0 then dominates its error).
``"lcm"``       LCMScheduler's: ``N`` evenly skipped steps of the ``original_inference_steps``
                distillation grid ``k - 1, 2k - 1, ...`` with ``k = T // original_inference_steps``.

Documented differences from diffusers: DDIMScheduler's and EulerDiscrete's own "linspace"
use ``N`` points including ``t = 0``, and the multistep schedulers' "leading" uses
``T // (N + 1)``; fastdiff uses one definition per name for every sampler (above).

Sigma schedules (Karras, exponential, custom sigmas) yield fractional timesteps.  With
``fractional_timesteps=True`` the model sees ``t(sigma)`` exactly (:class:`NoiseSchedule`);
with ``False`` it sees ``round(t(sigma))`` while the update keeps the unrounded sigma, which
is what diffusers does (the model is then queried at a slightly different noise level than
the solver assumes; ``benchmarks/sampler_accuracy.py`` measures the cost).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from fastdiff._checks import is_int

from .noise_schedule import NoiseSchedule

SPACINGS = ("leading", "trailing", "linspace", "uniform")
SIGMA_SCHEDULES = ("karras", "exponential")
NAMED_SCHEDULES = (*SPACINGS, *SIGMA_SCHEDULES, "lcm", "auto")


def check_schedule_name(schedule: str) -> None:
    if schedule not in NAMED_SCHEDULES:
        raise ValueError(
            f"unknown schedule {schedule!r}; valid: {', '.join(NAMED_SCHEDULES)}, "
            "or an explicit list/tensor of sigmas (float) or timesteps (int)"
        )


def spaced_timesteps(kind: str, n: int, num_train_timesteps: int, steps_offset: int = 0) -> np.ndarray:
    """Integer timesteps of a uniform spacing (see module docstring), float64, decreasing."""
    T = num_train_timesteps
    if kind == "uniform":
        kind = "trailing"
    if kind == "leading":
        ts = (T // n) * np.arange(n - 1, -1, -1, dtype=np.float64) + steps_offset
    elif kind == "trailing":
        ts = np.round(T - np.arange(n, dtype=np.float64) * (T / n)) - 1
    elif kind == "linspace":
        ts = np.round(np.linspace(T - 1, 0, n + 1))[:n]
    else:
        raise ValueError(f"unknown spacing {kind!r}; valid: {', '.join(SPACINGS)}")
    return np.clip(ts, 0, T - 1)


def lcm_timesteps(n: int, num_train_timesteps: int, original_inference_steps: int = 50) -> np.ndarray:
    """LCMScheduler's inference timesteps (Luo et al. 2023, sec. 4.3 skipping-step schedule)."""
    if original_inference_steps > num_train_timesteps:
        raise ValueError("original_inference_steps cannot exceed num_train_timesteps")
    if n > original_inference_steps:
        raise ValueError(
            f"lcm schedule: num_inference_steps ({n}) cannot exceed original_inference_steps "
            f"({original_inference_steps}); pass a larger original_inference_steps or fewer steps"
        )
    k = num_train_timesteps // original_inference_steps
    origin = (np.arange(1, original_inference_steps + 1) * k - 1)[::-1]
    idx = np.floor(np.linspace(0, len(origin), num=n, endpoint=False)).astype(np.int64)
    return origin[idx].astype(np.float64)


def karras_sigmas(n: int, sigma_min: float, sigma_max: float, rho: float = 7.0) -> np.ndarray:
    """Karras et al. (2022) eq. 5: uniform in ``sigma^(1/rho)``; ``n`` values, decreasing."""
    ramp = np.linspace(0.0, 1.0, n)
    lo, hi = sigma_min ** (1.0 / rho), sigma_max ** (1.0 / rho)
    return (hi + ramp * (lo - hi)) ** rho


def exponential_sigmas(n: int, sigma_min: float, sigma_max: float) -> np.ndarray:
    """Uniform in ``log sigma`` (= uniform in log-SNR); ``n`` values, decreasing."""
    return np.exp(np.linspace(np.log(sigma_max), np.log(sigma_min), n))


def _as_float_array(values, what: str) -> np.ndarray:
    if isinstance(values, torch.Tensor):
        values = values.detach().double().cpu().numpy()
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1 or len(arr) == 0:
        raise ValueError(f"{what} must be a non-empty 1-D sequence, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{what} must be finite")
    return arr


def _check_decreasing(arr: np.ndarray, what: str) -> None:
    if np.any(np.diff(arr) >= 0):
        raise ValueError(f"{what} must be strictly decreasing, got {arr.tolist()}")


def is_timestep_list(values) -> bool:
    """Custom schedules: integer dtype -> timesteps, floating dtype -> sigmas (documented rule)."""
    if isinstance(values, torch.Tensor):
        return not values.is_floating_point()
    if isinstance(values, np.ndarray):
        return np.issubdtype(values.dtype, np.integer)
    return all(is_int(v, numpy=True) for v in values)


def build_schedule(
    schedule: str | Sequence | np.ndarray | torch.Tensor,
    num_inference_steps: int | None,
    noise: NoiseSchedule,
    *,
    kind: str | None = None,
    steps_offset: int = 0,
    rho: float = 7.0,
    fractional_timesteps: bool = True,
    original_inference_steps: int = 50,
    trailing_up_to: int = 10,
) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(timesteps[N], sigmas[N + 1])`` in float64 for a named or explicit schedule.

    ``schedule`` may be a name (see module docstring) or an explicit sequence.  An explicit
    sequence is read as timesteps if ``kind == "timesteps"`` or (``kind is None``) if it has an
    integer dtype, else as VE sigmas.  Explicit sigmas may end in 0 (``N = len - 1``) or not
    (0 is appended).  ``num_inference_steps`` is ignored for explicit sequences.
    """
    T = noise.num_train_timesteps
    if isinstance(schedule, str):
        n = num_inference_steps
        if not is_int(n, numpy=True):
            raise ValueError(f"num_inference_steps must be an int for schedule {schedule!r}, got {n!r}")
        if n < 1 or n > T:
            raise ValueError(f"num_inference_steps must be in [1, {T}] (num_train_timesteps), got {n}")
        check_schedule_name(schedule)
        if schedule == "auto":  # the concrete schedule "auto" means for n steps
            schedule = "trailing" if n <= trailing_up_to else "karras"
        if schedule in SPACINGS:
            ts = spaced_timesteps(schedule, n, T, steps_offset)
            if len(np.unique(ts)) != n:
                raise ValueError(f"{schedule!r} spacing gives duplicate timesteps for {n} steps")
            sig = noise.sigma_of_t(ts)
        elif schedule == "lcm":
            ts = lcm_timesteps(n, T, original_inference_steps)
            sig = noise.sigma_of_t(ts)
        else:  # karras or exponential
            if schedule == "karras":
                sig = karras_sigmas(n, noise.sigma_min, noise.sigma_max, rho)
            else:
                sig = exponential_sigmas(n, noise.sigma_min, noise.sigma_max)
            if n == 1:
                sig = np.array([noise.sigma_max])
            ts = noise.t_of_sigma(sig)
            if not fractional_timesteps:
                ts = np.round(ts)
        return ts.astype(np.float64), np.append(sig, 0.0)

    if kind not in (None, "sigmas", "timesteps"):
        raise ValueError(f"kind must be None, 'sigmas' or 'timesteps', got {kind!r}")
    as_timesteps = kind == "timesteps" or (kind is None and is_timestep_list(schedule))
    if as_timesteps:
        ts = _as_float_array(schedule, "timesteps")
        _check_decreasing(ts, "timesteps")
        return ts, np.append(noise.sigma_of_t(ts), 0.0)  # sigma_of_t validates the range
    sig = _as_float_array(schedule, "sigmas")
    if sig[-1] == 0.0:
        sig = sig[:-1]
    if len(sig) == 0:
        raise ValueError("sigmas must contain at least one positive value")
    _check_decreasing(sig, "sigmas")
    ts = noise.t_of_sigma(sig)  # validates the range
    if not fractional_timesteps:
        ts = np.round(ts)
    return ts, np.append(sig, 0.0)
