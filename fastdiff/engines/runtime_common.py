"""What every CPU runner shares: the argument checks (the configs use them too) and the flat-record → numpy feed."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

import numpy as np
import torch

from fastdiff._checks import is_int


def check_choice(name: str, value, valid: Collection) -> None:
    """``value`` must be one of ``valid``: else a ValueError naming the argument, the choices and the value."""
    if value not in valid:
        raise ValueError(f"{name} must be one of {list(valid)}, got {value!r}")


def check_count(name: str, value, meaning: str) -> None:
    """``value`` must be None or an int >= 1 (not a bool); ``meaning`` says what it counts and what None means."""
    if value is not None and not (is_int(value) and value >= 1):
        raise ValueError(f"{name} must be a positive int {meaning}, got {value!r}")


def check_threads(threads) -> int | None:
    """``threads`` as given when it is None (all cores) or a positive int, else a ValueError naming it."""
    check_count("threads", threads, "(CPU threads) or None (all cores)")
    return threads


def numpy_feed(inputs: Mapping[str, torch.Tensor], input_names: Sequence[str]) -> dict[str, np.ndarray]:
    """The engine's inputs as contiguous float32 numpy arrays on the CPU; a missing input raises naming it."""
    missing = [n for n in input_names if n not in inputs]
    if missing:
        raise ValueError(f"engine inputs {missing} are missing; the engine takes {list(input_names)}")
    return {n: np.ascontiguousarray(inputs[n].detach().to("cpu", torch.float32).numpy()) for n in input_names}
