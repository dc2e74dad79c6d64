"""Can Triton kernels run on a device? Probed without importing Triton or anything from fastdiff.

``fastdiff._compat`` re-exports these, so the rule lives in one place and the kernels package stays
standalone (it is importable on a machine that lacks diffusers).
"""

from __future__ import annotations

import importlib.util
import os

import torch


def triton_installed() -> bool:
    try:
        return importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):
        return False


def triton_interpret() -> bool:
    """Whether Triton kernels run through the interpreter (CPU tensors allowed)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def triton_usable(device) -> bool:
    """Can a Triton kernel run on tensors of ``device``? CUDA needs triton; CPU only the interpreter."""
    if not triton_installed():
        return False
    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.cuda.is_available()
    return dev.type == "cpu" and triton_interpret()


def triton_native(device) -> bool:
    """Triton kernels run compiled (not interpreted) on ``device``."""
    return torch.device(device).type == "cuda" and triton_usable(device) and not triton_interpret()


def triton_unusable_reason(device) -> str:
    if not triton_installed():
        return "triton is not installed (pip install triton, Linux only)"
    dev = torch.device(device)
    if dev.type == "cpu":
        return (
            "Triton kernels run on CPU tensors only through the interpreter; set "
            "TRITON_INTERPRET=1 before importing fastdiff (slow: for testing only)"
        )
    if dev.type == "cuda" and not torch.cuda.is_available():
        return "CUDA is not available"
    return f"Triton does not support device type '{dev.type}'"


def check_triton_device(*tensors) -> None:
    """Raise a clear error unless Triton kernels can run on the tensors' (single) device."""
    device = tensors[0].device
    for t in tensors[1:]:
        if t is not None and t.device != device:
            raise ValueError(f"all tensors must be on one device, got {device} and {t.device}")
    if not triton_usable(device):
        raise RuntimeError(f"Triton backend unavailable on {device}: {triton_unusable_reason(device)}")
