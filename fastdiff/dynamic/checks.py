"""Argument checks of :func:`fastdiff.sample` / :func:`fastdiff.dynamic.resume`: every one before any model call.

Each message names the argument, the value received and what is valid (issue #16).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fastdiff.dynamic.adapters import Reschedulable, check_scheduler
from fastdiff.dynamic.protocols import Controller

__all__ = ["NONFINITE", "check_can_jump", "check_inputs", "check_stop_after", "steps_per_row"]

NONFINITE = ("raise", "warn")


def check_stop_after(stop_after) -> None:
    if stop_after is not None and (
        not isinstance(stop_after, int) or isinstance(stop_after, bool) or stop_after < 0
    ):
        raise ValueError(
            f"stop_after must be an int >= 0 (steps before pausing; 0: before the first) or None, got {stop_after!r}"
        )


def check_can_jump(controller, scheduler) -> None:
    """A controller that reschedules rows (``reschedules = True``, e.g. FastForward) needs a scheduler that can
    replace its remaining levels: refused up front, not when the first row converges."""
    if getattr(controller, "reschedules", False) and not isinstance(scheduler, Reschedulable):
        raise TypeError(
            f"{type(controller).__name__} replaces rows' remaining schedules, which {type(scheduler).__name__} "
            "cannot do (fastdiff.dynamic.adapters.Reschedulable); use a fastdiff.samplers.make_scheduler(...) "
            "scheduler"
        )


def check_inputs(
    model_fn,
    latents,
    scheduler,
    controller,
    start_step,
    stop_after,
    on_rows_retired,
    callback=None,
    on_nonfinite="raise",
    generator=None,
):
    if not isinstance(on_nonfinite, str) or on_nonfinite not in NONFINITE:
        raise ValueError(f"on_nonfinite must be one of {NONFINITE}, got {on_nonfinite!r}")
    if not callable(model_fn):
        raise TypeError(f"model_fn must be callable as model_fn(x, t), got {type(model_fn).__name__}")
    if not isinstance(latents, torch.Tensor) or latents.ndim < 2:
        raise TypeError("latents must be a torch.Tensor with a batch dimension first, e.g. (B, C, H, W)")
    if not torch.isfinite(latents).all():
        raise ValueError("latents contain NaN or inf; sampling would return NaN images")
    if callback is not None and not callable(callback):
        raise TypeError(f"callback must be callable(record, x0) or None, got {callback!r}")
    check_scheduler(scheduler)
    if controller is not None and not isinstance(controller, Controller):
        raise TypeError(
            f"controller must implement fastdiff.dynamic.Controller (reset, should_stop, decide), got {controller!r}"
        )
    if on_rows_retired is not None and not callable(on_rows_retired):
        raise TypeError(f"on_rows_retired must be callable(remaining_rows) or None, got {on_rows_retired!r}")
    if start_step < 0:
        raise ValueError(f"start_step must be >= 0, got {start_step}")
    check_stop_after(stop_after)
    gens = generator if isinstance(generator, list) else [generator]
    if not all(g is None or isinstance(g, torch.Generator) for g in gens):
        raise TypeError(
            f"generator must be a torch.Generator, a list of them (one per row) or None, got {generator!r}"
        )


def steps_per_row(num_inference_steps, batch: int) -> list[int | None]:
    """Per-row step counts; None for every row: the scheduler's current timesteps are used as they are."""
    if num_inference_steps is None:
        return [None] * batch
    what = "num_inference_steps must be an int, a sequence of ints (one per row), a StepPlanner or None"
    if isinstance(num_inference_steps, bool):
        raise TypeError(f"{what}, got a bool")
    if isinstance(num_inference_steps, int):
        counts = [num_inference_steps] * batch
    elif isinstance(num_inference_steps, Sequence):
        counts = list(num_inference_steps)
        if len(counts) != batch:
            raise ValueError(f"num_inference_steps has {len(counts)} entries for a batch of {batch}")
    else:
        raise TypeError(f"{what}, got {type(num_inference_steps).__name__}")
    for n in counts:
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(
                f"num_inference_steps must be positive ints (one per row or one for all), got {n!r}"
            )
    return counts
