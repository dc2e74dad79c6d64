"""Fidelity of an image to a reference: PSNR and SSIM.

Both take images as float tensors in [0, 1] (NCHW or CHW), numpy arrays (HWC/NHWC,
uint8 or float) or PIL images, and return one number per image pair averaged over
the batch (``reduction="mean"``), the worst image's (``"min"``), or the per-image values
(``"none"``). :func:`psnr` also pools the squared error over the batch (``"pooled"``), as image
benchmarks often report it. Both work on any tensor of shape (N, ...) too, e.g. latents, with
``data_range`` per image where the images have different ranges.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from fastdiff.metrics._images import to_nchw


def _pair(a, b):
    a, b = to_nchw(a), to_nchw(b)
    if a.shape != b.shape:
        raise ValueError(f"images must have the same shape, got {tuple(a.shape)} and {tuple(b.shape)}")
    return a, b


def _reduce(values: torch.Tensor, reduction: str, valid: str = "'mean', 'min' or 'none'"):
    if reduction == "mean":
        return float(values.mean())
    if reduction == "min":
        return float(values.min())
    if reduction == "none":
        return values
    raise ValueError(f"reduction must be {valid}, got {reduction!r}")


def _range(data_range, n: int) -> torch.Tensor:
    r = torch.as_tensor(data_range, dtype=torch.float64).flatten()
    if r.numel() not in (1, n):
        raise ValueError(f"data_range must be a number or one per image ({n}), got {r.numel()} values")
    if not torch.isfinite(r).all() or (r <= 0).any():
        raise ValueError(f"data_range must be finite and > 0, got {data_range!r}")
    return r


def psnr(a, b, data_range=1.0, reduction: str = "mean"):
    """Peak signal-to-noise ratio in dB, ``10 log10(data_range^2 / MSE)``; ``inf`` for identical images.

    Args:
        a, b: images (see the module docstring), or tensors of shape (N, ...) such as latents.
        data_range: the peak value: a number, or one per image (e.g. each reference's max - min).
        reduction: "mean" over images, "min" (the worst image), "none" (per image), or "pooled"
            (one PSNR of the squared error averaged over every image; needs a single data_range).
    """
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.ndim not in (3, 4):
        if a.shape != b.shape:
            raise ValueError(f"tensors must have the same shape, got {tuple(a.shape)} and {tuple(b.shape)}")
        a, b = a.detach().double().cpu(), b.detach().double().cpu()
    else:
        a, b = _pair(a, b)
    err = (a - b).pow(2).flatten(1)
    r = _range(data_range, a.shape[0])
    if reduction == "pooled":
        if r.numel() != 1:
            raise ValueError("reduction='pooled' needs one data_range for all images")
        mse = float(err.mean())
        return math.inf if mse == 0 else 10 * math.log10(float(r) ** 2 / mse)
    mse = err.mean(1)
    with torch.no_grad():
        values = torch.where(mse == 0, torch.full_like(mse, math.inf), 10 * torch.log10(r**2 / mse))
    return _reduce(values, reduction, "'mean', 'min', 'none' or 'pooled'")


def _gaussian_window(size: int, sigma: float) -> torch.Tensor:
    x = torch.arange(size, dtype=torch.float64) - (size - 1) / 2
    g = torch.exp(-(x**2) / (2 * sigma**2))
    return g / g.sum()


def ssim(a, b, data_range: float = 1.0, window: int = 11, sigma: float = 1.5, reduction: str = "mean"):
    """Structural similarity (Wang et al. 2004, eq. 13) with an 11x11 Gaussian window (sigma 1.5).

    Local means, variances and covariance are Gaussian-weighted over valid windows of each
    channel; SSIM = (2 mu_a mu_b + C1)(2 sigma_ab + C2) / ((mu_a^2 + mu_b^2 + C1)(sigma_a^2 + sigma_b^2 + C2))
    with C1 = (0.01 L)^2, C2 = (0.03 L)^2, averaged over positions and channels. 1.0 for identical images.
    """
    a, b = _pair(a, b)
    n, c, h, w = a.shape
    if min(h, w) < window:
        raise ValueError(f"images of {h}x{w} are smaller than the {window}x{window} SSIM window")
    g = _gaussian_window(window, sigma)
    kernel = (g[:, None] * g[None, :]).expand(c, 1, window, window).contiguous()
    blur = lambda x: F.conv2d(x, kernel, groups=c)
    mu_a, mu_b = blur(a), blur(b)
    var_a = blur(a * a) - mu_a**2
    var_b = blur(b * b) - mu_b**2
    cov = blur(a * b) - mu_a * mu_b
    c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
    s = ((2 * mu_a * mu_b + c1) * (2 * cov + c2)) / ((mu_a**2 + mu_b**2 + c1) * (var_a + var_b + c2))
    return _reduce(s.flatten(1).mean(1), reduction)
