"""What the CPU can do for int8 and bf16 engines, read once from ``/proc/cpuinfo``.

Two facts decide CPU engine settings:

* **VNNI** (``avx512_vnni`` / ``avx_vnni``): without it, x86 int8 GEMMs multiply u8 x s8 with
  ``vpmaddubsw``, whose pairwise sums saturate at int16 (2 * 255 * 127 > 32767). ONNX Runtime's
  documented remedy is ``reduce_range`` (7-bit weights). On this project's AVX2-only EPYC the
  saturation took the tiny U-Net's int8 SNR from 25 dB (the Q/DQ graph evaluated in float) to 12 dB.
  OpenVINO's remedy is NNCF's overflow fix on every layer (``QuantConfig.overflow_fix``): 17.9 -> 26.5 dB
  on the full SD1.5 U-Net at 256^2 there.
* **bf16** (``avx512_bf16`` or AMX ``amx_bf16``): only then does bf16 inference run natively;
  elsewhere it is emulated and slower than fp32.
"""

from __future__ import annotations

import functools

from fastdiff._compat import cpu_model, cpuinfo_field  # noqa: F401 - cpu_model re-exported for benchmarks


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU feature flags of the first processor (empty where /proc/cpuinfo is unavailable)."""
    return frozenset((cpuinfo_field("flags") or "").split())


def has_vnni(flags: frozenset[str] | None = None) -> bool:
    flags = cpu_flags() if flags is None else flags
    return bool({"avx512_vnni", "avx_vnni", "amx_int8"} & flags)


def has_bf16(flags: frozenset[str] | None = None) -> bool:
    flags = cpu_flags() if flags is None else flags
    return bool({"avx512_bf16", "amx_bf16"} & flags)


def has_amx(flags: frozenset[str] | None = None) -> bool:
    """AMX tiles (Intel Xeon since Sapphire Rapids): OpenVINO then runs int8 and bf16 on other kernels."""
    flags = cpu_flags() if flags is None else flags
    return bool({"amx_int8", "amx_bf16"} & flags)


def engine_flags(flags: frozenset[str] | None = None) -> list[str]:
    """The flags that change CPU engine numerics or speed (recorded in cache keys and benchmarks)."""
    flags = cpu_flags() if flags is None else flags
    wanted = ("avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_bf16", "amx_int8")
    return [f for f in wanted if f in flags]
