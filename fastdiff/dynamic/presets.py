"""Named speed/quality presets: ``steps="fast" | "balanced" | "quality"``.

Each preset is a step count of fastdiff's default sampler, DPM-Solver++(2M) (Lu et al. 2022), which reaches
good guided samples in 15-20 steps; 10/20/30 steps trade quality for speed.
"""

from __future__ import annotations

__all__ = ["PRESETS", "DEFAULT_SAMPLER", "default_scheduler", "resolve_steps"]

PRESETS = {"fast": 10, "balanced": 20, "quality": 30}
DEFAULT_SAMPLER = "dpmpp_2m"


def default_scheduler(like):
    """fastdiff's default sampler configured from another scheduler's training schedule (``like``)."""
    from fastdiff.samplers import make_scheduler

    return make_scheduler(DEFAULT_SAMPLER, like=like)


def resolve_steps(steps) -> tuple[int | str, str]:
    """Normalise a ``steps=`` value to (int | "auto", reason). Raises on anything else."""
    if isinstance(steps, bool):
        raise TypeError("steps must be an int, 'auto' or a preset name, not a bool")
    if isinstance(steps, int):
        if steps < 1:
            raise ValueError(f"steps must be >= 1, got {steps}")
        return steps, f"fixed: {steps} steps requested"
    if isinstance(steps, str):
        key = steps.lower()
        if key == "auto":
            return "auto", "auto"
        if key in PRESETS:
            return PRESETS[key], f"preset '{key}': {PRESETS[key]} steps of {DEFAULT_SAMPLER}"
        raise ValueError(
            f"unknown steps preset {steps!r}; valid: an int, 'auto', {', '.join(map(repr, PRESETS))}"
        )
    raise TypeError(
        f"steps must be an int, 'auto' or a preset name ({', '.join(PRESETS)}), got {type(steps).__name__}"
    )
