"""3x3 convolution with selectable implementations (vocabulary of :mod:`fastdiff.ops.dispatch`).

``conv3x3(x, weight, bias)`` equals ``F.conv2d(x, weight, bias, stride=1, padding=1)``.

Backends:

* ``"native"`` -- ``F.conv2d`` (cuDNN on CUDA, oneDNN on CPU).
* ``"winograd_triton"`` -- the Winograd F(2x2,3x3) Triton kernels of :mod:`fastdiff.kernels.winograd`. Run on
  CUDA, or on CPU only under ``TRITON_INTERPRET=1`` (slow; for testing). Otherwise a RuntimeError says why.
* ``"winograd_torch"`` -- Winograd as a batched GEMM over the 16 transformed planes in plain PyTorch (any
  device). On a CPU it beats oneDNN only for some shapes (many channels, small images).
* ``"auto"`` -- measured: the first call with a new (device, shape, dtype, layout) times the candidates
  usable on this device against native and keeps the fastest after checking its output against native at
  that shape (:func:`fastdiff.ops.dispatch.choose`); afterwards the decision is a lookup, persisted across
  processes. Never slower than native beyond timing noise.

Every non-native backend runs only for inference (:func:`fastdiff.ops.dispatch.inference_only`); when a
gradient is needed, native runs. ``u`` (the transformed weight, :func:`~fastdiff.kernels.winograd.
transform_weight`) lets modules pass their cached copy; ``plans`` is a module's memo of decisions.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fastdiff.kernels._device import triton_native
from fastdiff.kernels.winograd import (
    SUPPORTED_DTYPES,
    transform_weight,
    winograd_conv2d_torch,
    winograd_conv2d_triton,
)
from fastdiff.ops import dispatch

BACKENDS = ("auto", "native", "winograd_triton", "winograd_torch")


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


def winograd_implementation(device: torch.device) -> str:
    """The Winograd that runs on ``device``: the Triton kernels where they run compiled, else PyTorch's."""
    return "winograd_triton" if triton_native(device) else "winograd_torch"


def conv3x3_candidates(device: torch.device) -> list[str]:
    """Alternatives to native that "auto" may time here: :func:`winograd_implementation` where it can win
    (compiled Triton, or PyTorch's on CPU). The interpreter is never a candidate (always slow)."""
    impl = winograd_implementation(device)
    return [impl] if impl == "winograd_triton" or torch.device(device).type == "cpu" else []


def conv3x3_plan_key(x: torch.Tensor, k: int, has_bias: bool) -> str:
    return dispatch.plan_key("conv3x3", x, k=k, bias=has_bias)


def conv3x3(
    x, weight, bias=None, *, backend: str = "auto", plan_cache_dir=None, u=None, plans=None
) -> torch.Tensor:
    """3x3, stride-1, padding-1 convolution (groups 1, dilation 1) with the chosen backend."""
    dispatch.check_backend(backend, BACKENDS)
    check_conv3x3_inputs(x, weight, bias)
    get_u = (lambda: u) if u is not None else (lambda: transform_weight(weight, x.dtype))
    run = {
        dispatch.NATIVE: lambda: F.conv2d(x, weight, bias, padding=1),
        "winograd_triton": lambda: winograd_conv2d_triton(x, get_u(), bias),
        "winograd_torch": lambda: winograd_conv2d_torch(x, get_u(), bias),
    }
    choice = dispatch.select(
        backend, run, x, (weight, bias),
        key=lambda: conv3x3_plan_key(x, weight.shape[0], bias is not None), alternatives=conv3x3_candidates,
        plan_cache_dir=plan_cache_dir, plans=plans,
    )  # fmt: skip
    return run[choice]()
