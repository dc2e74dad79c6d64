"""Turn the image types users hold (PIL, numpy, torch) into one float NCHW tensor in [0, 1]."""

from __future__ import annotations

import numpy as np
import torch


def to_nchw(images) -> torch.Tensor:
    """Images as float64 NCHW in [0, 1].

    Accepts a PIL image or list of them, a numpy array (HWC / NHWC; uint8 in [0, 255] or
    float in [0, 1]) or a torch tensor (CHW / NCHW float in [0, 1], or uint8).
    """
    from PIL import Image

    if isinstance(images, Image.Image):
        images = np.asarray(images.convert("RGB"))
    if isinstance(images, (list, tuple)):
        if not images:
            raise ValueError("empty list of images")
        return torch.cat([to_nchw(im) for im in images])
    if isinstance(images, np.ndarray):
        arr = images
        if arr.ndim == 2:
            arr = arr[..., None]
        if arr.ndim == 3:
            arr = arr[None]
        if arr.ndim != 4:
            raise ValueError(f"numpy images must be HW, HWC or NHWC, got shape {images.shape}")
        # a copy, as arr may be read-only (np.asarray of a PIL image)
        t = torch.tensor(np.ascontiguousarray(arr)).permute(0, 3, 1, 2)
    elif isinstance(images, torch.Tensor):
        t = images.detach().cpu()
        if t.ndim == 3:
            t = t[None]
        if t.ndim != 4:
            raise ValueError(f"tensor images must be CHW or NCHW, got shape {tuple(images.shape)}")
    else:
        raise TypeError(f"expected PIL image(s), numpy array or torch tensor, got {type(images).__name__}")
    if t.dtype == torch.uint8:
        return t.double() / 255.0
    if not t.is_floating_point():
        raise TypeError(f"images must be uint8 or floating point, got {t.dtype}")
    return t.double()
