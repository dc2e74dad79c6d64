"""fastdiff samplers: fewer U-Net evaluations for the same quality.

* :func:`make_scheduler` -- DDIM, Euler, DPM-Solver++ 2M/3M/2M-SDE, UniPC, LCM as a drop-in
  diffusers scheduler (:class:`FastScheduler`);
* :class:`AdaptiveScheduler` -- DPM-Solver++(2M) with error-controlled step size (a tolerance, not a
  step count; per row under :func:`fastdiff.dynamic.sample`);
* :func:`fit_schedule` -- choose the sigmas of an N-step run for a given model;
* the pure update rules (:mod:`.ddim`, :mod:`.dpm_solver`, :mod:`.unipc`, :mod:`.lcm`) and the
  driver :class:`SolverState`;
* :mod:`.gmm` -- an exactly solvable Gaussian-mixture model for accuracy studies.
"""

from .adaptive import AdaptiveScheduler
from .core import SAMPLERS, SolverState
from .fit import fit_schedule, load_schedule, run_scheduler, save_schedule
from .noise_schedule import NoiseSchedule, training_betas
from .scheduler import FastScheduler, FastSchedulerOutput, make_scheduler
from .schedules import build_schedule, exponential_sigmas, karras_sigmas

__all__ = [
    "SAMPLERS",
    "AdaptiveScheduler",
    "FastScheduler",
    "FastSchedulerOutput",
    "NoiseSchedule",
    "SolverState",
    "build_schedule",
    "exponential_sigmas",
    "fit_schedule",
    "karras_sigmas",
    "load_schedule",
    "make_scheduler",
    "run_scheduler",
    "save_schedule",
    "training_betas",
]
