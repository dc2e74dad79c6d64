"""``make_scheduler`` / ``FastScheduler`` options: checked completely before a scheduler exists.

Every option that would be stored and ignored by the chosen sampler, or that is not finite, raises here with
the option's name, the value received and what is valid (issue #16); the scheduler class only uses them.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .core import check_final_step, check_order_range, sampler_info
from .schedules import NAMED_SCHEDULES, check_schedule_name
from .unipc import check_solver_type

PREDICTION_TYPES = ("epsilon", "v_prediction", "sample")


def check_prediction_type(prediction_type) -> None:
    if prediction_type not in PREDICTION_TYPES:
        raise ValueError(f"prediction_type must be one of {PREDICTION_TYPES}, got {prediction_type!r}")


def as_config_value(schedule):
    """Explicit schedules are stored in the config as plain lists so save_pretrained works."""
    if isinstance(schedule, torch.Tensor):
        return schedule.detach().cpu().tolist()
    if isinstance(schedule, np.ndarray):
        return schedule.tolist()
    if isinstance(schedule, (list, tuple)):
        return [v.item() if isinstance(v, (np.generic, torch.Tensor)) else v for v in schedule]
    return schedule


def positive_number(name: str, value, allow_zero: bool = False) -> float:
    """``value`` as a float: a finite int or float (numpy's too, not a bool), > 0 (>= 0 with ``allow_zero``)."""
    real = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(
        value, (bool, np.bool_)
    )
    if not real or not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{name} must be a finite number {'>= 0' if allow_zero else '> 0'}, got {value!r}")
    return float(value)


def validate_options(sampler: str, **o) -> None:
    """Reject bad values and options that the chosen sampler or schedule would silently ignore.

    Every message names the option, the value received and what is valid (issue #16): a sweep
    that sets ``eta`` on DPM-Solver++ must fail, not report numbers identical to the default.
    """
    info = sampler_info(sampler)
    check_prediction_type(o["prediction_type"])
    check_final_step(o["final_step"])
    schedule = o["schedule"]
    if isinstance(schedule, str):
        check_schedule_name(schedule)
    if schedule is not None and not isinstance(schedule, str):
        explicit = np.asarray(as_config_value(schedule))
        if explicit.ndim != 1 or explicit.size == 0:
            raise ValueError(
                f"schedule must be a name ({', '.join(NAMED_SCHEDULES)}) or a non-empty 1-D list/tensor of "
                f"sigmas (float) or timesteps (int), got {schedule!r}"
            )
    solver_type = o.get("solver_type", "bh2")
    check_solver_type(solver_type)
    if o["schedule_kind"] not in (None, "sigmas", "timesteps"):
        raise ValueError(f"schedule_kind must be None, 'sigmas' or 'timesteps', got {o['schedule_kind']!r}")
    for flag in ("fractional_timesteps", "lower_order_final", "use_corrector"):
        if not isinstance(o[flag], (bool, np.bool_)):
            raise TypeError(f"{flag} must be True or False, got {o[flag]!r} ({type(o[flag]).__name__})")
    for name in ("rho", "eta", "timestep_scaling"):  # eta may be 0, the others must be positive
        positive_number(name, o[name], allow_zero=name == "eta")
    ois = o["original_inference_steps"]
    if not isinstance(ois, (int, np.integer)) or isinstance(ois, (bool, np.bool_)) or ois < 1:
        raise ValueError(f"original_inference_steps must be an int >= 1, got {ois!r}")
    order = o["solver_order"]
    if order is not None:
        if not isinstance(order, (int, np.integer)) or isinstance(order, (bool, np.bool_)):
            raise TypeError(
                f"{sampler}: solver_order must be an int in [1, {info.max_order}] or None, got {order!r} "
                f"({type(order).__name__})"
            )
        check_order_range(info, order)

    # options that only some samplers / schedules read: a non-default value elsewhere is an error
    effective = info.default_schedule if schedule is None else schedule
    ignored = []
    if o["eta"] != 0.0 and sampler != "ddim":
        ignored.append(f"eta={o['eta']!r} applies only to sampler 'ddim'")
    if o["use_corrector"] is not True and sampler != "unipc":
        ignored.append(f"use_corrector={o['use_corrector']!r} applies only to sampler 'unipc'")
    if solver_type != "bh2" and sampler != "unipc":
        ignored.append(f"solver_type={solver_type!r} applies only to sampler 'unipc'")
    if o["lower_order_final"] is not True and info.max_order == 1:
        ignored.append(
            f"lower_order_final={o['lower_order_final']!r} applies only to the multistep samplers "
            "'dpmpp_2m', 'dpmpp_3m', 'dpmpp_2m_sde', 'unipc'"
        )
    if o["final_step"] != "denoised" and sampler == "lcm":
        ignored.append(f"final_step={o['final_step']!r} does not apply to 'lcm' (it always returns its x0)")
    if o["timestep_scaling"] != 10.0 and sampler != "lcm":
        ignored.append(f"timestep_scaling={o['timestep_scaling']!r} applies only to sampler 'lcm'")
    if o["rho"] != 7.0 and effective not in ("karras", "auto"):
        ignored.append(
            f"rho={o['rho']!r} applies only to schedule='karras' or 'auto' (schedule here: {effective!r})"
        )
    if o["original_inference_steps"] != 50 and effective != "lcm":
        ignored.append(
            f"original_inference_steps={o['original_inference_steps']!r} applies only to schedule='lcm' "
            f"(schedule here: {effective!r})"
        )
    if o["schedule_kind"] is not None and isinstance(effective, str):
        ignored.append(
            f"schedule_kind={o['schedule_kind']!r} applies only to an explicit schedule list "
            f"(schedule here: {effective!r})"
        )
    if ignored:
        raise ValueError(f"{sampler}: option(s) that would be silently ignored: " + "; ".join(ignored))
