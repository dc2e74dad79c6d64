"""Functional operators: the reference and fast paths behind fastdiff's modules.

* :func:`attention` — scaled dot-product attention with selectable backends.
* :func:`conv3x3`, :func:`group_norm_silu`, :func:`group_norm_silu_conv3x3` —
  Winograd and fused-normalisation kernels (Triton on CUDA or under the
  Triton interpreter; PyTorch references everywhere), chosen per device and
  shape by :mod:`fastdiff.ops.dispatch`, the one dispatch layer. Loaded on
  first use so that importing fastdiff does not import Triton.
"""

import importlib

from fastdiff.ops.attention import BACKENDS as ATTENTION_BACKENDS
from fastdiff.ops.attention import AttentionBackendError, attention, usable_backends

_KERNEL_OPS = {
    "conv3x3": "fastdiff.ops.conv",
    "group_norm_silu": "fastdiff.ops.norm",
    "group_norm_silu_conv3x3": "fastdiff.ops.norm",
}

__all__ = ["ATTENTION_BACKENDS", "AttentionBackendError", "attention", "usable_backends", *_KERNEL_OPS]


def __getattr__(name):
    if name in _KERNEL_OPS:
        return getattr(importlib.import_module(_KERNEL_OPS[name]), name)
    raise AttributeError(f"module 'fastdiff.ops' has no attribute {name!r}")
