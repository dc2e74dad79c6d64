"""``FastScheduler``: fastdiff's samplers as a drop-in diffusers scheduler.

The pipeline-facing state is VP, as in DDIMScheduler / DPMSolverMultistepScheduler:
``x_t = alpha_t x0 + sigma_t eps`` with ``init_noise_sigma = 1`` and an identity
``scale_model_input``, so a run can be handed from one scheduler to another mid-way (the
state at a step means the same thing to all of them).  Internally every update happens in VE
form (:mod:`fastdiff.samplers.core`).

Attributes useful beyond pipelines (for dynamic step control):

* ``timesteps``  -- ``N`` model timesteps (int64, or float32 when fractional);
* ``sigmas``     -- ``N + 1`` VE noise levels ``sqrt(1/alpha_bar - 1)``, last one 0;
* ``alpha_t``, ``sigma_t`` -- the VP coefficients of each ``sigmas`` entry;
* :meth:`add_noise` / :meth:`add_noise_to_sigma` -- re-noise an x0 to a timestep / sigma;
* :meth:`sigma_of_timestep` / :meth:`timestep_of_sigma` -- continuous conversions.

This module is about 430 lines because ``FastScheduler`` is diffusers' whole scheduler protocol in one class
(``set_timesteps``, ``step``, ``scale_model_input``, ``add_noise``, indexing, config round trips); option
checks live in :mod:`fastdiff.samplers.options` and the update rules in :mod:`fastdiff.samplers.core`.

Notes for pipeline users: DDIM's ``eta`` is a scheduler option (``make_scheduler("ddim",
eta=0.5)``), not a ``step`` argument, because pipelines always pass their own ``eta=0.0``.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.schedulers.scheduling_utils import KarrasDiffusionSchedulers, SchedulerMixin
from diffusers.utils import BaseOutput
from diffusers.utils.torch_utils import randn_tensor

from fastdiff.dynamic.adapters import predicted_x0

from .core import SAMPLERS, SolverState
from .noise_schedule import SD_TRAINING_CONFIG, NoiseSchedule
from .options import as_config_value, validate_options
from .schedules import build_schedule


@dataclass
class FastSchedulerOutput(BaseOutput):
    """``prev_sample``: state for the next step (VP).  ``pred_original_sample``: the x0 estimate
    of this step (for LCM the consistency-function output).  ``denoised`` aliases it (LCM name)."""

    prev_sample: torch.Tensor
    pred_original_sample: torch.Tensor
    denoised: torch.Tensor | None = None


class FullPrecisionState:
    """Mixin of FastScheduler and AdaptiveScheduler: the update maths runs in float32 (float64 for float64
    input) and a full-precision copy of the state is kept between steps, so fp16 models lose no solver
    accuracy.  Expects ``_shadow`` (None at the start of a run) and ``_step_index``."""

    def _full_precision(self, sample: torch.Tensor) -> torch.Tensor:
        if self._shadow is not None and self._shadow[0] is sample:
            return self._shadow[1]  # the full-precision state behind the low-precision tensor we returned
        return sample.to(torch.float64 if sample.dtype == torch.float64 else torch.float32)

    def _step_output(
        self, x_next: torch.Tensor, denoised: torch.Tensor, sample: torch.Tensor, return_dict: bool
    ):
        """Return ``x_next`` and ``denoised`` in the dtype of ``sample``, remember ``x_next``, count the step."""
        prev = x_next.to(sample.dtype)
        self._shadow = (prev, x_next) if prev.dtype != x_next.dtype else None
        self._step_index += 1
        denoised = denoised.to(sample.dtype)
        if not return_dict:
            return (prev, denoised)
        return FastSchedulerOutput(prev_sample=prev, pred_original_sample=denoised, denoised=denoised)


class FastScheduler(FullPrecisionState, SchedulerMixin, ConfigMixin):
    """One diffusers-compatible scheduler for every fastdiff sampler (see :func:`make_scheduler`)."""

    _compatibles = [e.name for e in KarrasDiffusionSchedulers] + ["LCMScheduler"]
    order = 1  # one model evaluation per step for every sampler here

    @register_to_config
    def __init__(
        self,
        sampler: str = "dpmpp_2m",
        num_train_timesteps: int = 1000,
        beta_start: float = 0.00085,
        beta_end: float = 0.012,
        beta_schedule: str = "scaled_linear",
        trained_betas: list[float] | None = None,
        prediction_type: str = "epsilon",
        schedule: str | list | None = None,
        schedule_kind: str | None = None,
        fractional_timesteps: bool = True,
        solver_order: int | None = None,
        lower_order_final: bool = True,
        use_corrector: bool = True,
        eta: float = 0.0,
        final_step: str = "denoised",
        rho: float = 7.0,
        steps_offset: int = 0,
        original_inference_steps: int = 50,
        timestep_scaling: float = 10.0,
        solver_type: str = "bh2",
    ):
        # @register_to_config has stored every argument in self.config before this body runs
        validate_options(**self.config)
        self.noise_schedule = NoiseSchedule.from_config(self.config)
        self.betas = torch.from_numpy(self.noise_schedule.betas).float()
        self.alphas_cumprod = torch.from_numpy(self.noise_schedule.alphas_cumprod).float()
        self.init_noise_sigma = 1.0
        self.num_inference_steps = None
        self.timesteps = torch.from_numpy(np.arange(num_train_timesteps)[::-1].copy())
        self.sigmas = None
        self._step_index = None
        self._begin_index = None
        self._solver = None
        self._shadow = None
        if not isinstance(schedule, (str, type(None))):
            # validate an explicit schedule now, not at the first pipeline call
            build_schedule(schedule, None, self.noise_schedule, kind=schedule_kind)

    # --- diffusers scheduler protocol ---------------------------------------------------------
    @property
    def step_index(self) -> int | None:
        return self._step_index

    @property
    def begin_index(self) -> int | None:
        return self._begin_index

    def set_begin_index(self, begin_index: int = 0) -> None:
        """Index of the first step actually run (img2img starts part-way; call before stepping)."""
        self._begin_index = begin_index

    def __len__(self) -> int:
        return self.config.num_train_timesteps

    @property
    def schedule_name(self):
        cfg = self.config
        return SAMPLERS[cfg.sampler].default_schedule if cfg.schedule is None else cfg.schedule

    def set_timesteps(
        self,
        num_inference_steps: int | None = None,
        device: str | torch.device | None = None,
        timesteps: list | torch.Tensor | None = None,
        sigmas: list | torch.Tensor | None = None,
    ) -> None:
        """Build the schedule for a run.

        ``timesteps`` / ``sigmas`` override the configured schedule (as in diffusers); else the
        configured schedule is used (named: needs ``num_inference_steps``; explicit: its length
        fixes the step count, and a different ``num_inference_steps`` is an error).
        """
        cfg = self.config
        if timesteps is not None and sigmas is not None:
            raise ValueError("pass at most one of `timesteps` and `sigmas`")
        sched, kind = self.schedule_name, cfg.schedule_kind
        if timesteps is not None:  # diffusers' per-call overrides of the configured schedule
            sched, kind = timesteps, "timesteps"
        elif sigmas is not None:
            sched, kind = sigmas, "sigmas"
        ts, sig = build_schedule(
            sched,
            num_inference_steps,  # explicit lists ignore it
            self.noise_schedule,
            kind=kind,
            steps_offset=cfg.steps_offset,
            rho=cfg.rho,
            fractional_timesteps=cfg.fractional_timesteps,
            original_inference_steps=cfg.original_inference_steps,
            trailing_up_to=SAMPLERS[cfg.sampler].trailing_up_to,
        )
        fixed = timesteps is None and sigmas is None and not isinstance(sched, str)  # a configured list
        if fixed and num_inference_steps not in (None, len(ts)):
            raise ValueError(
                f"this scheduler has a fixed {len(ts)}-step schedule; got num_inference_steps="
                f"{num_inference_steps}. Use {len(ts)} steps or a named schedule."
            )
        self._set_schedule(ts, sig, device)

    def _set_schedule(self, ts: np.ndarray, sig: np.ndarray, device=None) -> None:
        cfg = self.config
        self.num_inference_steps = len(ts)
        integral = np.all(ts == np.round(ts))
        t = torch.from_numpy(np.round(ts).astype(np.int64) if integral else ts.astype(np.float32))
        if cfg.fractional_timesteps and len(torch.unique(t)) != len(t):
            raise ValueError(
                "schedule has noise levels so close that their float32 timesteps coincide; "
                f"timesteps: {t.tolist()}"
            )
        self.timesteps = t.to(device)
        self._sig64 = [float(s) for s in sig]
        self.sigmas = torch.tensor(self._sig64, dtype=torch.float32)
        a, s = NoiseSchedule.alpha_sigma_vp(sig)
        self.alpha_t = torch.from_numpy(a).float()
        self.sigma_t = torch.from_numpy(s).float()
        self._ts64 = [float(v) for v in ts]
        self._solver = SolverState(
            cfg.sampler,
            self._sig64,
            order=cfg.solver_order,
            lower_order_final=cfg.lower_order_final,
            use_corrector=cfg.use_corrector,
            eta=cfg.eta,
            final_step=cfg.final_step,
            timestep_scaling=cfg.timestep_scaling,
            solver_type=cfg.solver_type,
        )
        self._step_index = None
        self._begin_index = None
        self._shadow = None

    def index_for_timestep(self, timestep, schedule_timesteps=None) -> int:
        schedule_timesteps = self.timesteps if schedule_timesteps is None else schedule_timesteps
        t = timestep.to(schedule_timesteps.device) if isinstance(timestep, torch.Tensor) else timestep
        idx = (schedule_timesteps == t).nonzero()
        if len(idx) == 0:
            raise ValueError(f"timestep {float(timestep)} is not in this scheduler's timesteps")
        # as diffusers: with duplicates (rounded sigma schedules) the second match is the one stepped
        return int(idx[1 if len(idx) > 1 else 0])

    def scale_model_input(self, sample: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        """Identity: the model input is the VP state."""
        return sample

    # --- dynamic step control (fastdiff.dynamic.adapters.Reschedulable) ----------------------
    def _position(self, before: str) -> int:
        """Index of the next step to take (the begin index before the first step)."""
        if self._solver is None:
            raise ValueError(f"call set_timesteps() before {before}")
        return self.step_index if self.step_index is not None else (self.begin_index or 0)

    def sigmas_ahead(self) -> list[float]:
        """VE noise levels still ahead: the next step's input level first, ending at 0."""
        return self._sig64[self._position("asking for the remaining schedule") :]

    def reschedule(self, sigmas) -> None:
        """Replace the levels after the current one by ``sigmas`` (strictly decreasing, ending at 0) and
        keep the state and the solver history: a multistep update reads the levels of its history, so the
        next step is the same method on an uneven grid (DPM-Solver++ and UniPC allow any spacing)."""
        i = self._position("reschedule()")
        tail = [float(v) for v in sigmas]
        cur = self._sig64[i]
        if not tail or tail[-1] != 0.0 or any(b >= a for a, b in zip([cur, *tail], tail)):
            raise ValueError(
                f"reschedule needs levels below the current {cur:.6g}, strictly decreasing to 0; got {tail}"
            )
        sig = np.array(self._sig64[: i + 1] + tail, dtype=np.float64)
        ts = np.array(
            self._ts64[: i + 1] + [float(t) for t in self.noise_schedule.t_of_sigma(sig[i + 1 : -1])]
        )
        if not self.config.fractional_timesteps:
            ts = np.round(ts)
        steps, begin, shadow, history = self._step_index, self._begin_index, self._shadow, self._solver
        self._set_schedule(ts, sig, self.timesteps.device)
        # the new SolverState gets the old one's history (its level list is the new one)
        history.sigmas, history.n = self._solver.sigmas, self._solver.n
        self._solver = history
        self._step_index, self._begin_index, self._shadow = steps, begin, shadow

    def step(
        self,
        model_output: torch.Tensor,
        timestep: int | float | torch.Tensor,
        sample: torch.Tensor,
        generator: torch.Generator | None = None,
        return_dict: bool = True,
    ) -> FastSchedulerOutput | tuple:
        """Advance one step.  Update maths runs in float32 (float64 for float64 input) and a
        float32 copy of the state is kept between steps, so fp16 models lose no solver accuracy
        (:class:`FullPrecisionState`)."""
        if self._solver is None:
            raise ValueError("call set_timesteps() before step()")
        if self.step_index is None:  # the first step: where set_begin_index() said, else at `timestep`
            begin = self.begin_index
            self._step_index = self.index_for_timestep(timestep) if begin is None else begin
        i = self.step_index
        if i >= self.num_inference_steps:
            raise IndexError(
                f"all {self.num_inference_steps} steps were already taken; call set_timesteps() again"
            )
        x = self._full_precision(sample)
        sigma, sigma_next = self._sig64[i], self._sig64[i + 1]
        # not dynamic.adapters.vp_of_ve: Python's sigma**2 (a pow call) differs from its sigma * sigma in the
        # last bit for about 1 sigma in 1000, and this scheduler's results are kept bit for bit
        alpha = 1.0 / math.sqrt(1.0 + sigma**2)
        x0 = predicted_x0(model_output.to(x.dtype), x, alpha, sigma * alpha, self.config.prediction_type)

        def noise_fn():
            return randn_tensor(
                model_output.shape, generator=generator, device=model_output.device, dtype=x.dtype
            )

        x_next_ve, denoised = self._solver.step(i, x / alpha, x0, noise_fn, timestep=self._ts64[i])
        x_next = x_next_ve / math.sqrt(1.0 + sigma_next**2)
        return self._step_output(x_next, denoised, sample, return_dict)

    # --- noise / conversions ------------------------------------------------------------------
    def sigma_of_timestep(self, timestep) -> torch.Tensor:
        """Continuous VE sigma of (fractional) timesteps (:class:`NoiseSchedule`)."""
        t = timestep.detach().double().cpu().numpy() if isinstance(timestep, torch.Tensor) else timestep
        return torch.from_numpy(np.atleast_1d(self.noise_schedule.sigma_of_t(t)))

    def timestep_of_sigma(self, sigma) -> torch.Tensor:
        """Continuous (fractional) timestep of VE sigmas."""
        s = sigma.detach().double().cpu().numpy() if isinstance(sigma, torch.Tensor) else sigma
        return torch.from_numpy(np.atleast_1d(self.noise_schedule.t_of_sigma(s)))

    def _sigmas_for(self, timesteps: torch.Tensor) -> list[float]:
        """Sigma of each timestep: the schedule's own sigma when it is a schedule timestep (so the
        img2img start state matches what the solver expects), else the continuous sigma(t)."""
        out = []
        for k, t in enumerate(timesteps.reshape(-1).tolist()):
            if self.sigmas is not None:
                if self.begin_index is not None and self.step_index is None and k == 0:
                    j = self.begin_index
                    if j < self.num_inference_steps and abs(self._ts64[j] - t) < 1e-3:
                        out.append(self._sig64[j])
                        continue
                matches = [j for j, tj in enumerate(self._ts64) if abs(tj - t) < 1e-3]
                if matches:
                    out.append(self._sig64[matches[0]])
                    continue
            out.append(float(self.noise_schedule.sigma_of_t(t)))
        return out

    def add_noise_to_sigma(self, original_samples: torch.Tensor, noise: torch.Tensor, sigma) -> torch.Tensor:
        """VP state at VE noise level ``sigma`` (scalar or per-sample): ``alpha x0 + sigma_t noise``."""
        s = torch.as_tensor(sigma, dtype=torch.float64).reshape(-1)
        alpha = (1.0 / torch.sqrt(1.0 + s**2)).to(original_samples.device, torch.float32)
        sig_vp = (s.to(alpha.device, torch.float32)) * alpha
        shape = (-1,) + (1,) * (original_samples.ndim - 1)
        x = alpha.reshape(shape) * original_samples.float() + sig_vp.reshape(shape) * noise.float()
        return x.to(original_samples.dtype)

    def add_noise(self, original_samples: torch.Tensor, noise: torch.Tensor, timesteps) -> torch.Tensor:
        """Forward-diffuse ``original_samples`` to ``timesteps`` (one per sample, or one for all)."""
        t = torch.as_tensor(timesteps).reshape(-1)
        sig = self._sigmas_for(t)
        if len(sig) == 1 and original_samples.shape[0] != 1:
            sig = sig * original_samples.shape[0]
        return self.add_noise_to_sigma(original_samples, noise, sig)


def _config_of(like) -> Mapping:
    if like is None:
        return {}
    if hasattr(like, "scheduler") and hasattr(like.scheduler, "config"):  # a pipeline
        like = like.scheduler
    if hasattr(like, "config") and isinstance(like.config, Mapping):
        return like.config
    if isinstance(like, Mapping):
        return like
    raise TypeError(
        f"`like` must be a diffusers scheduler, a pipeline, or a scheduler config mapping, got {type(like).__name__}"
    )


# the training schedule, how the model's output reads, and the timestep offset of its training
INHERITED_KEYS = (*SD_TRAINING_CONFIG, "prediction_type", "steps_offset")


def inherited_config(like) -> dict:
    """The training-schedule keys (``INHERITED_KEYS``) a fastdiff sampler takes from ``like``; a zero-terminal-SNR
    schedule is refused, since its sigma_max is infinite (one rule for every fastdiff scheduler)."""
    cfg = _config_of(like)
    if cfg.get("rescale_betas_zero_snr", False):
        raise ValueError(
            "rescale_betas_zero_snr=True (sigma_max = inf) is not supported by fastdiff samplers"
        )
    keys = {k: cfg[k] for k in INHERITED_KEYS if k in cfg and cfg[k] is not None}
    if "trained_betas" in keys:
        keys["trained_betas"] = as_config_value(keys["trained_betas"])
    return keys


# make_scheduler's options: every FastScheduler argument but the sampler name (one list to keep in step)
OPTIONS = tuple(inspect.signature(FastScheduler.__init__).parameters)[2:]


def make_scheduler(name: str, like=None, **options) -> FastScheduler:
    """Create a fastdiff sampler as a diffusers scheduler: ``pipe.scheduler = make_scheduler("unipc", like=pipe.scheduler)``.

    Args:
        name: one of ``"ddim", "euler", "dpmpp_2m", "dpmpp_3m", "dpmpp_2m_sde", "unipc", "lcm"``.
        like: a diffusers scheduler, a pipeline, or a scheduler config; its training schedule
            (``num_train_timesteps, beta_start, beta_end, beta_schedule, trained_betas``),
            ``prediction_type`` and ``steps_offset`` are inherited.  ``None``: Stable Diffusion's.
        **options:
            schedule: ``"auto"`` (default except LCM: ``"trailing"`` up to 10 steps (DDIM/Euler 6,
                DPM-Solver++(3M) 15, 2M-SDE 20), ``"karras"`` above, measured on the trained model in
                ``benchmarks/results/sampler_defaults.md``),
                ``"karras"``, ``"exponential"``, ``"uniform"`` (= ``"trailing"``),
                ``"leading"``, ``"trailing"``, ``"linspace"``, ``"lcm"``, or an explicit list/tensor:
                integer dtype = timesteps, floating dtype = VE sigmas (override with ``schedule_kind``);
                e.g. the output of :func:`fastdiff.samplers.fit_schedule`.
            fractional_timesteps: give the model ``t(sigma)`` exactly (default True) instead of
                diffusers' rounded timestep for sigma schedules.
            solver_order: multistep order (dpmpp_2m: 2, dpmpp_3m: 3, unipc: 2 (1..3)).
            lower_order_final, use_corrector and solver_type ("bh2"/"bh1", UniPC's B(h)), eta (DDIM),
            final_step ("denoised"/"variance"),
            rho (Karras), original_inference_steps / timestep_scaling (LCM), and any inherited key.
    """
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ValueError(f"unknown option(s) {unknown} for make_scheduler; valid: {', '.join(OPTIONS)}")
    kwargs = inherited_config(like)
    # 3 is dpmpp_3m's default anyway; stored in the config, it also makes diffusers'
    # DPMSolverMultistepScheduler.from_config(pipe.scheduler.config) third order (None there means 2)
    if name == "dpmpp_3m" and "solver_order" not in options:
        options["solver_order"] = 3
    if "schedule" in options:
        options["schedule"] = as_config_value(options["schedule"])
    kwargs.update(options)
    return FastScheduler(sampler=name, **kwargs)
