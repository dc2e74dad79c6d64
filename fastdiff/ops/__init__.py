"""Functional operators: the reference and fast paths behind fastdiff's modules.

* :func:`attention` — scaled dot-product attention with selectable backends.
* :func:`conv3x3`, :func:`group_norm_silu`, :func:`group_norm_silu_conv3x3` —
  Winograd and fused-normalisation kernels (Triton on CUDA or under the
  Triton interpreter; PyTorch references everywhere).
"""

from fastdiff.ops.attention import BACKENDS as ATTENTION_BACKENDS
from fastdiff.ops.attention import AttentionBackendError, attention, usable_backends
from fastdiff.ops.conv import conv3x3
from fastdiff.ops.norm import group_norm_silu, group_norm_silu_conv3x3

__all__ = [
    "ATTENTION_BACKENDS",
    "AttentionBackendError",
    "attention",
    "conv3x3",
    "group_norm_silu",
    "group_norm_silu_conv3x3",
    "usable_backends",
]
