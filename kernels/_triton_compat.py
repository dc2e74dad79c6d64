"""Guarded Triton import: the kernels modules must import (and their references work) without Triton."""

from __future__ import annotations

try:  # Triton is absent on macOS/Windows and optional everywhere
    import triton
    import triton.language as tl

    HAS_TRITON = True
except Exception:  # pragma: no cover - depends on the platform
    triton = None
    tl = None
    HAS_TRITON = False


def check_triton_device(*tensors) -> None:
    """Raise a clear error unless Triton kernels can run on the tensors' device."""
    from fastdiff._compat import triton_unusable_reason, triton_usable

    device = tensors[0].device
    for t in tensors[1:]:
        if t is not None and t.device != device:
            raise ValueError(f"all tensors must be on one device, got {device} and {t.device}")
    if not HAS_TRITON or not triton_usable(device):
        raise RuntimeError(f"Triton backend unavailable on {device}: {triton_unusable_reason(device)}")


def interpreting() -> bool:
    from fastdiff._compat import triton_interpret

    return triton_interpret()


if HAS_TRITON:

    @triton.jit
    def round_bf16_rne(v):
        """fp32 -> nearest-even bf16 value, still as fp32 (bit arithmetic).

        The Triton interpreter converts fp32 to bf16 by truncation, doubling bf16 rounding error; launchers
        pass EMULATE_BF16=True only when interpreting bf16, so compiled kernels keep the native cast.
        """
        bits = v.to(tl.int32, bitcast=True)
        bits = bits + 0x7FFF + ((bits >> 16) & 1)
        return (bits & -65536).to(tl.float32, bitcast=True)
