"""Triton kernels for the Stable Diffusion U-Net (ships as ``fastdiff.kernels``).

Each module keeps Triton kernels, their launchers and a plain PyTorch reference side by side:

* :mod:`fastdiff.kernels.winograd` -- Winograd F(2x2, 3x3) convolution (stride 1, padding 1) as three
  kernels (input transform, one batched GEMM over the 16 planes, output transform + bias), plus a CPU
  PyTorch Winograd and a float64 textbook reference.
* :mod:`fastdiff.kernels.group_norm_silu` -- GroupNorm (+SiLU) with fp32 statistics.
* :mod:`fastdiff.kernels.fused_norm_conv` -- GroupNorm + SiLU + Winograd conv: a statistics kernel, then the
  input transform normalises and activates its input tiles while loading them.

This package holds kernels and references only: it imports nothing from the rest of fastdiff (and so
neither diffusers nor transformers), which is what lets ``benchmarks/gpu_check.sh`` load it on a bare
GPU image. Choosing between kernels and native ops is :mod:`fastdiff.ops.dispatch`'s job.
Triton itself is optional (``HAS_TRITON``).
"""


def __getattr__(name):
    if name == "HAS_TRITON":  # resolved lazily so that importing the package does not import Triton
        from ._triton_compat import HAS_TRITON

        return HAS_TRITON
    raise AttributeError(f"module 'fastdiff.kernels' has no attribute {name!r}")


__all__ = ["HAS_TRITON"]
