"""Drop-in modules: each subclasses the module it replaces and shares its parameters.

The kernel-backed modules load on first use so that importing fastdiff does
not import Triton.
"""

import importlib

from fastdiff.nn.attention import FastdiffAttnProcessor

_KERNEL_MODULES = {
    "WinogradConv2d": "fastdiff.nn.winograd",
    "GroupNormSiLU": "fastdiff.nn.norm_act",
    "FusedResnetBlock2D": "fastdiff.nn.norm_act",
}

__all__ = ["FastdiffAttnProcessor", *_KERNEL_MODULES]


def __getattr__(name):
    if name in _KERNEL_MODULES:
        return getattr(importlib.import_module(_KERNEL_MODULES[name]), name)
    raise AttributeError(f"module 'fastdiff.nn' has no attribute {name!r}")
