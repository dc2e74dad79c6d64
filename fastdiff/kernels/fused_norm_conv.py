"""GroupNorm + SiLU + 3x3 conv without materialising the activation.

Unfused, ``conv(silu(group_norm(x)))`` writes the normalised activation and reads it back. Here

1. :func:`~fastdiff.kernels.group_norm_silu.group_norm_scale_shift_triton` reduces the fp32 statistics into
   per-(n, c) ``scale``/``shift`` (a few KB), then
2. the Winograd kernel of :mod:`fastdiff.kernels.winograd` computes ``silu(x * scale + shift)`` for every
   input value it loads, before the input transform.

Zero padding belongs to the convolution's input, i.e. it applies AFTER norm + SiLU: padded taps are 0, not
``silu(shift)``; the kernel masks them after the activation.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .group_norm_silu import group_norm_scale_shift_triton
from .winograd import winograd_conv2d_triton


def group_norm_silu_conv3x3_reference(
    x, num_groups, gn_weight, gn_bias, eps, conv_weight, conv_bias=None, extra_scale=None, extra_shift=None
):
    """Unfused PyTorch: GroupNorm -> (optional y * (1 + s) + t) -> SiLU -> conv2d(padding=1)."""
    y = F.group_norm(x, num_groups, gn_weight, gn_bias, eps)
    if extra_scale is not None:
        y = y * (1 + extra_scale[:, :, None, None]) + extra_shift[:, :, None, None]
    return F.conv2d(F.silu(y), conv_weight, conv_bias, padding=1)


def group_norm_silu_conv3x3_triton(
    x: torch.Tensor,
    num_groups: int,
    gn_weight: torch.Tensor | None,
    gn_bias: torch.Tensor | None,
    eps: float,
    u: torch.Tensor,
    conv_bias: torch.Tensor | None = None,
    *,
    extra_scale: torch.Tensor | None = None,
    extra_shift: torch.Tensor | None = None,
) -> torch.Tensor:
    """Fused GroupNorm+SiLU+Winograd conv; ``u`` is ``transform_weight(conv_weight, x.dtype)``."""
    scale, shift = group_norm_scale_shift_triton(
        x, num_groups, gn_weight, gn_bias, eps, extra_scale=extra_scale, extra_shift=extra_shift
    )
    return winograd_conv2d_triton(x, u, conv_bias, norm_scale=scale, norm_shift=shift)
