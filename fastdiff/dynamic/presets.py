"""Named speed/quality presets: ``steps="fast" | "balanced" | "quality"``.

Each preset is a step count of fastdiff's default sampler, DPM-Solver++(2M) (Lu et al. 2022) with
``make_scheduler``'s default schedule (trailing up to 10 steps, Karras above), the best configuration at
every measured NFE from 6 to 20 on the trained model (``benchmarks/results/sampler_defaults.md``).

The counts are chosen by one rule on fastdiff-tiny (shipped weights, guidance 5, 72 held-out prompts),
the share of images whose PSNR against the same noise's converged reference (200 DPM-Solver++(2M) steps,
``benchmarks/_reference.py``) reaches 30 dB (``benchmarks/results/dynamic_steps.md``, fixed-schedule table):

* ``fast`` = 10: the fewest steps with at least half the images there (40 of 72; mean 29.8 dB);
* ``balanced`` = 13: the fewest with at least 75% (58 of 72; mean 36.3 dB);
* ``quality`` = 20: the fewest with at least 95% (71 of 72; mean 46.7 dB, worst 28.3 dB; 25 steps reach
  70 of 72, worst 25.9 dB).

Attribute accuracy (shape colour, background colour and shape all right) does not separate them: on the
144-image draft comparison 10 steps score 0.764 and 13 steps 0.826; the reference scores 0.792 on the
72 images above.
"""

from __future__ import annotations

__all__ = ["PRESETS", "DEFAULT_SAMPLER", "default_scheduler", "resolve_steps"]

PRESETS = {"fast": 10, "balanced": 13, "quality": 20}
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
        return steps, f"fixed: {steps} step{'' if steps == 1 else 's'} requested"
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
