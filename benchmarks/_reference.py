"""The converged reference every fastdiff-tiny fidelity benchmark compares against (#12, #13).

``benchmarks/reference_convergence.py`` (results in ``results/reference_convergence.md``) solved the held-out
images of ``step_control.py`` and ``step_cache.py`` with several solvers from the same noise. The former
reference, 100 steps of DPM-Solver++(2M) Karras, is not converged: on one of the 24 step_control images it is
33.5 dB from the 200-step solutions (criterion: >= 40 dB on every image), while 200 steps of DPM-Solver++(2M)
and of the third-order DPM-Solver++(3M) agree with each other at >= 54.6 dB on every image (65.9 dB with the
``"variance"`` final step on both). A 1e-3 perturbation of the noise moves no image by more than 48 dB, so the
gap is the 100-step run's discretisation error, not an ill-conditioned ODE.

The reference is therefore 200 steps of DPM-Solver++(2M) on the Karras schedule, starting at t=999 whatever
the caller's own scheduler does (diffusers' ``"leading"`` spacing starts a 100-step run at t=901, a different
initial-value problem), with the final step ``"variance"`` (an Euler step in sigma^2 from sigma_min to 0, the
more accurate of the two read-outs at the same cost; see ``fastdiff/samplers/core.py``).
"""

from __future__ import annotations


def reference_config() -> dict:
    """The converged reference as a ``fastdiff.sweep`` configuration.

    The same run outside the sweep: ``make_scheduler(c["sampler"], like=pipe.scheduler,
    schedule=c["schedule"], **c["sampler_options"])`` for ``c["steps"]`` steps, from the benchmark's noise.
    """
    return {
        "name": "reference dpmpp_2m karras 200 variance",
        "sampler": "dpmpp_2m",
        "schedule": "karras",
        "steps": 200,
        "sampler_options": {"final_step": "variance"},
    }


def reference_scheduler(like):
    """``(scheduler, steps)`` of :func:`reference_config`, with the training schedule taken from ``like``."""
    from fastdiff.samplers import make_scheduler

    c = reference_config()
    return make_scheduler(c["sampler"], like=like, schedule=c["schedule"], **c["sampler_options"]), c["steps"]
