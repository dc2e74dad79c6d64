"""What every CPU runner shares: the thread-count check and the flat-record → numpy feed."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch


def check_threads(threads) -> int | None:
    """``threads`` as given when it is None (all cores) or a positive int, else a ValueError naming it."""
    if threads is None:
        return None
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be a positive int (CPU threads) or None (all cores), got {threads!r}")
    return threads


def numpy_feed(inputs: Mapping[str, torch.Tensor], input_names: Sequence[str]) -> dict[str, np.ndarray]:
    """The engine's inputs as contiguous float32 numpy arrays on the CPU; a missing input raises naming it."""
    missing = [n for n in input_names if n not in inputs]
    if missing:
        raise ValueError(f"engine inputs {missing} are missing; the engine takes {list(input_names)}")
    return {n: np.ascontiguousarray(inputs[n].detach().to("cpu", torch.float32).numpy()) for n in input_names}
