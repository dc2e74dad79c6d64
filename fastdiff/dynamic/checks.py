"""Argument checks that :func:`fastdiff.dynamic.sample` shares with :func:`~fastdiff.dynamic.resume`, the
controllers and planners and the drop-in pipelines (sample's own checks open its body); every one runs before
any model call.

Each message names the argument, the value received and what is valid (issue #16).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fastdiff._checks import is_int
from fastdiff.dynamic.adapters import Reschedulable

__all__ = [
    "check_can_jump",
    "check_generator",
    "check_positive_int",
    "check_stop_after",
    "steps_per_row",
]


def check_positive_int(name: str, value, upper: int | None = None, multiple: int = 1) -> None:
    """``value`` must be an int >= 1 (and <= ``upper``, and a multiple of ``multiple``, where given)."""
    if not (is_int(value) and value >= 1 and (upper is None or value <= upper) and value % multiple == 0):
        valid = f"an int >= 1{f' and <= {upper}' if upper else ''}{f', a multiple of {multiple}' if multiple > 1 else ''}"
        raise ValueError(f"{name} must be {valid}, got {value!r}")


def check_stop_after(stop_after) -> None:
    if stop_after is not None and not (is_int(stop_after) and stop_after >= 0):
        raise ValueError(
            f"stop_after must be an int >= 0 (steps before pausing; 0: before the first) or None, got {stop_after!r}"
        )


def check_generator(generator, per: str = "row", none_in_list: bool = True) -> None:
    """None, a torch.Generator, or a list of them (one per row of :func:`sample`, one per image of a pipeline).

    ``sample`` lets a row's entry be None (that row draws from the global RNG); a pipeline's list may not hold
    None (``none_in_list=False``): diffusers' latents preparation reads the first generator's device."""
    gens = generator if isinstance(generator, list) else [generator]
    ok = all(isinstance(g, torch.Generator) or (g is None and none_in_list) for g in gens)
    if generator is not None and not ok:
        raise TypeError(
            f"generator must be a torch.Generator, a list of them (one per {per}) or None, got {generator!r}"
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
        if not is_int(n) or n < 1:
            raise ValueError(
                f"num_inference_steps must be positive ints (one per row or one for all), got {n!r}"
            )
    return counts
