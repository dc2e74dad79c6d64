"""3x3 convolution with selectable backends: native PyTorch, Winograd in Triton, Winograd in PyTorch.

``conv3x3(x, weight, bias)`` equals ``F.conv2d(x, weight, bias, stride=1, padding=1)``.

Backends:

* ``"torch"`` -- the reference, ``F.conv2d`` (cuDNN on CUDA, oneDNN on CPU).
* ``"triton"`` -- the fused Winograd F(2x2,3x3) kernel of :mod:`fastdiff.kernels.winograd`. Runs on CUDA, or
  on CPU only under ``TRITON_INTERPRET=1`` (slow; for testing). Otherwise raises a RuntimeError saying why.
* ``"winograd_torch"`` -- Winograd as a batched GEMM over the 16 transformed planes in plain PyTorch (any
  device). On a CPU it beats oneDNN only for some shapes (many channels, small images).
* ``"auto"`` -- measured: the first call with a new (shape, dtype, layout) times the candidates usable on this
  device against ``F.conv2d`` and keeps the fastest (see :mod:`fastdiff.kernels.dispatch`); afterwards the
  decision is a dictionary lookup, persisted across processes. Never slower than native beyond timing noise.

The functional form transforms the weight on every call; :class:`fastdiff.nn.winograd.WinogradConv2d`
caches the transformed weight and should be preferred inside models.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fastdiff._compat import triton_interpret, triton_usable
from fastdiff.kernels import dispatch
from fastdiff.kernels.winograd import (
    SUPPORTED_DTYPES,
    transform_weight,
    winograd_conv2d_torch,
    winograd_conv2d_triton,
)

BACKENDS = ("auto", "triton", "torch", "winograd_torch")


def check_conv3x3_inputs(x, weight, bias=None) -> None:
    """Raise TypeError/ValueError naming what is wrong with a conv3x3 call."""
    for name, t in (("x", x), ("weight", weight)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if bias is not None and not isinstance(bias, torch.Tensor):
        raise TypeError(f"bias must be a torch.Tensor or None, got {type(bias).__name__}")
    if x.dim() != 4:
        raise ValueError(f"x must be 4-D (N, C, H, W), got shape {tuple(x.shape)}")
    if weight.dim() != 4 or tuple(weight.shape[2:]) != (3, 3):
        raise ValueError(f"weight must have shape (K, C, 3, 3), got {tuple(weight.shape)}")
    if weight.shape[1] != x.shape[1]:
        raise ValueError(f"x has {x.shape[1]} channels but weight expects {weight.shape[1]} (groups=1 only)")
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ValueError(f"bias must have shape ({weight.shape[0]},), got {tuple(bias.shape)}")
    if x.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"x dtype must be one of float32/float16/bfloat16, got {x.dtype}")
    if weight.dtype != x.dtype or (bias is not None and bias.dtype != x.dtype):
        raise TypeError(f"x, weight and bias must share a dtype; got {x.dtype}, {weight.dtype}"
                        + (f", {bias.dtype}" if bias is not None else ""))  # fmt: skip
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and t.device != x.device:
            raise ValueError(f"{name} is on {t.device} but x is on {x.device}")


def _check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(map(repr, BACKENDS))}; got {backend!r}")


def layout_tag(x: torch.Tensor) -> str:
    return (
        "nhwc" if (x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()) else "nchw"
    )


def triton_native(device: torch.device) -> bool:
    """Triton kernels run compiled (not interpreted) on this device."""
    device = torch.device(device)
    return device.type == "cuda" and triton_usable(device) and not triton_interpret()


def conv3x3_candidates(x: torch.Tensor, device: torch.device) -> list[str]:
    """Alternatives to native that "auto" may time here. The interpreter is never a candidate (always slow)."""
    if triton_native(device):
        return ["winograd_triton"]
    if device.type == "cpu":
        return ["winograd_torch"]
    return []


def conv3x3_plan_key(x: torch.Tensor, k: int, has_bias: bool) -> str:
    n, c, h, w = x.shape
    return f"conv3x3|n{n}|c{c}|k{k}|h{h}|w{w}|{str(x.dtype)[6:]}|{layout_tag(x)}|bias{int(has_bias)}"


def conv3x3(x, weight, bias=None, *, backend: str = "auto", plan_cache_dir=None) -> torch.Tensor:
    """3x3, stride-1, padding-1 convolution (groups 1, dilation 1) with the chosen backend."""
    _check_backend(backend)
    check_conv3x3_inputs(x, weight, bias)
    if backend == "torch":
        return F.conv2d(x, weight, bias, padding=1)
    if backend == "triton":
        return winograd_conv2d_triton(x, transform_weight(weight, x.dtype), bias)
    if backend == "winograd_torch":
        return winograd_conv2d_torch(x, transform_weight(weight, x.dtype), bias)
    # auto
    run = {
        dispatch.NATIVE: lambda: F.conv2d(x, weight, bias, padding=1),
        "winograd_triton": lambda: winograd_conv2d_triton(x, transform_weight(weight, x.dtype), bias),
        "winograd_torch": lambda: winograd_conv2d_torch(x, transform_weight(weight, x.dtype), bias),
    }
    names = [dispatch.NATIVE, *conv3x3_candidates(x, x.device)]
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad):
        names = [dispatch.NATIVE]  # the Triton path has no backward
    choice, _ = dispatch.choose(
        conv3x3_plan_key(x, weight.shape[0], bias is not None),
        {n: run[n] for n in names},
        x.device,
        plan_cache_dir,
    )
    return run[choice]()
