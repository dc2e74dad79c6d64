"""How busy an image looks: the mean absolute difference of neighbouring pixels.

Not :func:`fastdiff.dynamic.auto_steps.high_frequency_energy`, which measures the spectral energy share of a
latent above a cut-off frequency to pick step counts; this one is an image statistic on the 0-255 scale,
used to check that the tiny model renders plain and textured backgrounds as such.
"""

from __future__ import annotations

import torch

from fastdiff.metrics._images import to_nchw


def neighbour_difference(images) -> torch.Tensor:
    """Per image, mean |x[i+1, j] - x[i, j]| + mean |x[i, j+1] - x[i, j]| over pixels and channels (0-255)."""
    x = to_nchw(images) * 255.0
    if x.shape[-1] < 2 or x.shape[-2] < 2:
        raise ValueError(f"images must be at least 2x2, got {tuple(x.shape[-2:])}")
    vertical = (x[:, :, 1:] - x[:, :, :-1]).abs().flatten(1).mean(1)
    horizontal = (x[..., 1:] - x[..., :-1]).abs().flatten(1).mean(1)
    return vertical + horizontal


__all__ = ["neighbour_difference"]
