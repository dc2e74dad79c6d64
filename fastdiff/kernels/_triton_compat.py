"""Guarded Triton import: the kernels modules must import (and their references work) without Triton."""

from __future__ import annotations

from ._device import check_triton_device, triton_interpret

try:  # Triton is absent on macOS/Windows and optional everywhere
    import triton
    import triton.language as tl

    HAS_TRITON = True
except Exception:  # pragma: no cover - depends on the platform
    triton = None
    tl = None
    HAS_TRITON = False

__all__ = ["HAS_TRITON", "check_triton_device", "tl", "triton", "triton_interpret"]


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
