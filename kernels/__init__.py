"""Triton kernels for the Stable Diffusion U-Net (ships as ``fastdiff.kernels``).

Each module keeps a Triton kernel, its launcher and a plain PyTorch reference side by side:

* :mod:`fastdiff.kernels.winograd` -- Winograd F(2x2, 3x3) convolution (stride 1, padding 1) with the input
  transform, the 16 tile GEMMs and the output transform fused in one kernel, plus a CPU PyTorch Winograd
  (batched GEMM over the 16 transformed planes).
* :mod:`fastdiff.kernels.group_norm_silu` -- GroupNorm (+SiLU) with fp32 statistics.
* :mod:`fastdiff.kernels.fused_norm_conv` -- GroupNorm + SiLU + Winograd conv: a statistics kernel, then the
  conv kernel normalises and activates its input tiles while loading them.

Import as ``fastdiff.kernels.<module>``; Triton itself is optional (``HAS_TRITON``).
"""

from ._triton_compat import HAS_TRITON

__all__ = ["HAS_TRITON"]
