"""Optional dependencies and device capabilities, probed once and cached.

Every optional backend goes through here so that a missing package produces
one consistent, actionable error instead of an ImportError deep in a pass.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util

# pip extra of fastdiff that provides each optional module (modules without one are installed by name)
_EXTRAS = {
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
        extra = _EXTRAS.get(module)
        how = f"pip install 'fastdiff[{extra}]'" if extra else f"pip install {module}"
        raise MissingDependencyError(
            f"{feature} needs the '{module}' package, which is not installed. Install it with: {how}"
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


# Triton capability probes live with the kernels (which must not import fastdiff); one rule, re-exported.
from fastdiff.kernels._device import triton_native, triton_unusable_reason, triton_usable  # noqa: E402

__all__ = [
    "MissingDependencyError",
    "cpu_model",
    "is_available",
    "require",
    "triton_native",
    "triton_unusable_reason",
    "triton_usable",
    "version_of",
]


def cpuinfo_field(name: str) -> str | None:
    """The first processor's ``name`` field in /proc/cpuinfo (Linux); None where there is none."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, sep, value = line.partition(":")
                if sep and key.strip() == name:  # exact: "model" is not "model name"
                    return value.strip()
    except OSError:
        pass
    return None


def cpu_model() -> str:
    """The CPU's marketing name from /proc/cpuinfo (Linux), else platform's guess."""
    import platform

    return cpuinfo_field("model name") or platform.processor() or "unknown CPU"
