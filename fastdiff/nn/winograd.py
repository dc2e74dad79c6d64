"""``WinogradConv2d``: a drop-in ``nn.Conv2d`` that runs eligible 3x3 convs as Winograd F(2x2,3x3) where faster.

Built with :meth:`WinogradConv2d.from_module`, it *shares* the original ``Parameter`` objects: state_dict
keys and values, ``load_state_dict``, ``save_pretrained``, PEFT/LoRA and ``.to()`` behave as before. The
transformed weight ``G g G^T`` is derived data, cached per dtype/device and rebuilt whenever the weight
changes (its ``_version`` counter, storage pointer, dtype or device).

Modes:

* ``"auto"`` -- every new (input shape, dtype, layout) is timed once: Winograd (Triton on CUDA, the PyTorch
  batched-GEMM path on CPU) against ``F.conv2d``; the faster one is kept (see :mod:`fastdiff.kernels.dispatch`)
  and the decision persists across processes. :meth:`plan_summary` lists what was chosen and why.
* ``True`` -- always Winograd: the Triton kernel where it runs compiled (CUDA), else the PyTorch Winograd.
  ``winograd_backend="triton"`` forces the Triton kernel (on CPU: only under ``TRITON_INTERPRET=1``, slow,
  for testing) and ``"torch"`` the PyTorch Winograd.

Whatever the mode, the native conv runs when autograd needs gradients, while tracing/exporting/compiling,
and for input dtypes the kernels do not handle.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fastdiff.kernels import dispatch
from fastdiff.kernels.winograd import (
    SUPPORTED_DTYPES,
    transform_weight,
    winograd_conv2d_torch,
    winograd_conv2d_triton,
)
from fastdiff.ops.conv import conv3x3_candidates, conv3x3_plan_key, triton_native

MODES = ("auto", True)
WINOGRAD_BACKENDS = ("auto", "triton", "torch")


def winograd_ineligible_reason(conv: nn.Module) -> str | None:
    """Why ``conv`` cannot run as Winograd F(2x2,3x3), or None if it can."""
    if not isinstance(conv, nn.Conv2d):
        return f"{type(conv).__name__} is not an nn.Conv2d"
    if tuple(conv.kernel_size) != (3, 3):
        return f"kernel {conv.kernel_size[0]}x{conv.kernel_size[1]}, Winograd F(2x2,3x3) needs 3x3"
    if tuple(conv.stride) != (1, 1):
        return f"stride {tuple(conv.stride)}, Winograd needs stride 1"
    if conv.padding != "same" and tuple(conv.padding) != (1, 1):
        return f"padding {conv.padding!r}, Winograd kernel implements padding 1"
    if conv.padding_mode != "zeros":
        return f"padding_mode {conv.padding_mode!r}, only 'zeros' is supported"
    if tuple(conv.dilation) != (1, 1):
        return f"dilation {tuple(conv.dilation)}, Winograd needs dilation 1"
    if conv.groups != 1:
        return f"groups={conv.groups}, Winograd kernel handles groups=1 only"
    if conv.weight.dtype not in SUPPORTED_DTYPES:
        return f"weight dtype {conv.weight.dtype} is not float32/float16/bfloat16"
    return None


def share_module_state(src: nn.Module, dst: nn.Module) -> nn.Module:
    """Make ``dst`` (an uninitialised instance of a subclass of ``type(src)``) a view of ``src``'s state.

    Attribute dicts are copied shallowly, so Parameters, buffers and child modules are the same objects
    while later re-assignments on one module do not leak into the other.
    """
    for name, value in src.__dict__.items():
        dst.__dict__[name] = type(value)(value) if isinstance(value, dict) else value
    return dst


def inference_only(x: torch.Tensor, *params) -> bool:
    """True when no gradient is needed and nothing traces/compiles the call (fast paths have no backward)."""
    if torch.jit.is_scripting() or torch.jit.is_tracing():
        return False
    if torch.onnx.is_in_onnx_export():
        return False
    compiler = getattr(torch, "compiler", None)
    if compiler is not None and compiler.is_compiling():
        return False
    if torch.is_grad_enabled() and (
        x.requires_grad or any(p is not None and p.requires_grad for p in params)
    ):
        return False
    return True


class TransformedWeightCache:
    """``transform_weight(weight, dtype)``, recomputed only when the weight's data may have changed."""

    def __init__(self):
        self._key = None
        self._value = None
        self.rebuilds = 0

    def get(self, weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        key = (weight._version, weight.data_ptr(), weight.dtype, weight.device, tuple(weight.shape), dtype)
        if key != self._key:
            self._value = transform_weight(weight, dtype)
            self._key = key
            self.rebuilds += 1
        return self._value

    def clear(self) -> None:
        self._key = self._value = None


class WinogradConv2d(nn.Conv2d):
    """``nn.Conv2d`` (3x3, stride 1, padding 1) running Winograd F(2x2,3x3) where it measured faster."""

    @classmethod
    def from_module(
        cls, conv: nn.Conv2d, mode="auto", plan_cache_dir=None, winograd_backend="auto"
    ) -> WinogradConv2d:
        """Wrap ``conv`` sharing its parameters; raises ValueError if it is not eligible."""
        reason = winograd_ineligible_reason(conv)
        if reason is not None:
            raise ValueError(f"cannot convert to WinogradConv2d: {reason}")
        new = share_module_state(conv, cls.__new__(cls))
        new._init_winograd(mode, plan_cache_dir, winograd_backend)
        return new

    def __init__(self, *args, winograd_mode="auto", plan_cache_dir=None, winograd_backend="auto", **kwargs):
        # plain construction must work too: PEFT builds its LoRA convs with type(base_layer)(...)
        super().__init__(*args, **kwargs)
        self._init_winograd(winograd_mode, plan_cache_dir, winograd_backend)

    def _init_winograd(self, mode, plan_cache_dir, winograd_backend="auto") -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be 'auto' or True, got {mode!r}")
        if winograd_backend not in WINOGRAD_BACKENDS:
            raise ValueError(f"winograd_backend must be one of {WINOGRAD_BACKENDS}, got {winograd_backend!r}")
        self.winograd_backend = winograd_backend
        self.winograd_mode = mode
        self.plan_cache_dir = plan_cache_dir
        self.weight_cache = TransformedWeightCache()
        self.plans = {}  # plan key -> record (choice, timings, source)
        self.winograd_eligible = winograd_ineligible_reason(self) is None

    def _choose(self, x: torch.Tensor) -> str:
        key = conv3x3_plan_key(x, self.out_channels, self.bias is not None)
        record = self.plans.get(key)
        if record is not None:
            return record["choice"]
        if self.winograd_mode is True:
            backend = self.winograd_backend
            if backend == "auto":
                backend = "triton" if triton_native(x.device) else "torch"
            choice = f"winograd_{backend}"
            record = {"choice": choice, "source": "forced (winograd=True)"}
        else:
            names = [dispatch.NATIVE, *conv3x3_candidates(x, x.device)]
            runs = {n: (lambda n=n: self._run(n, x)) for n in names}
            choice, record = dispatch.choose(key, runs, x.device, self.plan_cache_dir)
        self.plans[key] = record
        return choice

    def _run(self, choice: str, x: torch.Tensor) -> torch.Tensor:
        bias = self.bias.to(x.dtype) if self.bias is not None else None
        if choice == "winograd_triton":
            return winograd_conv2d_triton(x, self.weight_cache.get(self.weight, x.dtype), bias)
        if choice == "winograd_torch":
            return winograd_conv2d_torch(x, self.weight_cache.get(self.weight, x.dtype), bias)
        return F.conv2d(x, self.weight, self.bias, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (
            not self.winograd_eligible
            or x.dim() != 4
            or x.dtype not in SUPPORTED_DTYPES
            or x.dtype != self.weight.dtype
            or x.device != self.weight.device
            or not inference_only(x, self.weight, self.bias)
        ):
            return super().forward(x)
        return self._run(self._choose(x), x)

    def plan_summary(self) -> dict:
        """Per input shape: the chosen implementation, timings (ms) and where the decision came from."""
        return {key: dict(rec) for key, rec in self.plans.items()}

    def extra_repr(self) -> str:
        return super().extra_repr() + f", winograd={self.winograd_mode!r}"
