"""Optional dependencies and device capabilities, probed once and cached.

Every optional backend goes through here so that a missing package produces
one consistent, actionable error instead of an ImportError deep in a pass.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os

# pip extra that provides each optional module
_EXTRAS = {
    "triton": "triton",
    "xformers": "xformers",
    "flash_attn": "flash-attn",
    "flash_attn_interface": "flash-attn",
    "onnxruntime": "onnxruntime",
    "tensorrt": "tensorrt",
}


class MissingDependencyError(ImportError):
    """An optional package that a requested feature needs is not installed."""


@functools.cache
def is_available(module: str) -> bool:
    """True if `module` can be imported (checked without importing it)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def require(module: str, feature: str):
    """Import and return `module`, or raise naming the pip extra that provides it."""
    if not is_available(module):
        extra = _EXTRAS.get(module, module)
        raise MissingDependencyError(
            f"{feature} needs the '{module}' package, which is not installed. "
            f"Install it with: pip install 'fastdiff[{extra}]'"
        )
    return importlib.import_module(module)


def version_of(module: str) -> str | None:
    """Installed version string of a module, or None if absent or broken."""
    if not is_available(module):
        return None
    try:
        mod = importlib.import_module(module)
    except Exception:  # a broken install (e.g. ABI mismatch) counts as absent
        return None
    return getattr(mod, "__version__", "unknown")


def triton_interpret() -> bool:
    """Whether Triton kernels run through the interpreter (CPU tensors allowed)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def triton_usable(device) -> bool:
    """Can a Triton kernel run on tensors of `device`?

    On CUDA that needs triton installed; on CPU only the interpreter works,
    and it must be enabled before the kernels are defined.
    """
    import torch

    if not is_available("triton"):
        return False
    dev = torch.device(device)
    if dev.type == "cuda":
        return torch.cuda.is_available()
    return dev.type == "cpu" and triton_interpret()


def triton_unusable_reason(device) -> str:
    import torch

    if not is_available("triton"):
        return "triton is not installed (pip install 'fastdiff[triton]' on Linux)"
    dev = torch.device(device)
    if dev.type == "cpu":
        return (
            "Triton kernels run on CPU tensors only through the interpreter; set "
            "TRITON_INTERPRET=1 before importing fastdiff (slow: for testing only)"
        )
    if dev.type == "cuda" and not torch.cuda.is_available():
        return "CUDA is not available"
    return f"Triton does not support device type '{dev.type}'"


def cpu_model() -> str:
    """The CPU's marketing name from /proc/cpuinfo (Linux), else platform's guess."""
    import platform

    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"
