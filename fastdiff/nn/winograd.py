"""``WinogradConv2d``: a drop-in ``nn.Conv2d`` that runs eligible 3x3 convs as Winograd F(2x2,3x3) where faster.

Built with :meth:`WinogradConv2d.from_module`, it *shares* the original ``Parameter`` objects: state_dict
keys and values, ``load_state_dict``, ``save_pretrained``, PEFT/LoRA and ``.to()`` behave as before. The
transformed weight ``G g G^T`` is derived data, cached per dtype/device and rebuilt whenever the weight
changes (its ``_version`` counter, storage pointer, dtype or device).

Modes:

* ``"auto"`` -- every new (device, input shape, dtype, layout) is timed once by :func:`fastdiff.ops.conv3x3`:
  Winograd (Triton on CUDA, the PyTorch batched-GEMM path on CPU) against ``F.conv2d``; the faster one is
  kept after an output check at that shape (see :mod:`fastdiff.ops.dispatch`), and the decision persists
  across processes. :meth:`plan_summary` lists what was chosen and why.
* ``True`` -- always Winograd: the Triton kernels where they run compiled (CUDA), else the PyTorch Winograd.
  ``winograd_backend="winograd_triton"`` forces the Triton kernels (on CPU: only under
  ``TRITON_INTERPRET=1``, slow, for testing) and ``"winograd_torch"`` the PyTorch Winograd.

Whatever the mode, the native conv runs when any input or parameter needs a gradient, while
tracing/exporting/compiling (:func:`fastdiff.ops.dispatch.inference_only`), and for input dtypes the kernels
do not handle. The module holds no dispatch logic of its own: it passes its cached transformed weight and its
``plans`` memo to :func:`fastdiff.ops.conv3x3`.
"""

from __future__ import annotations

import torch
from torch import nn

from fastdiff.kernels.winograd import SUPPORTED_DTYPES, transform_weight
from fastdiff.ops import dispatch
from fastdiff.ops.conv import conv3x3, conv3x3_plan_key, winograd_implementation

MODES = ("auto", True)
WINOGRAD_BACKENDS = ("auto", "winograd_triton", "winograd_torch")


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


class PlannedModule:
    """Mixin of fastdiff's kernel-backed modules: ``plans`` is their memo of decisions, one per input shape."""

    def plan_summary(self) -> dict:
        """Per input shape: the chosen implementation, timings (ms) and where the decision came from."""
        return {key: dict(rec) for key, rec in self.plans.items()}


class WinogradConv2d(PlannedModule, nn.Conv2d):
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

    def _backend(self, x: torch.Tensor) -> str:
        """``"auto"``, or with ``winograd=True`` the forced Winograd implementation (recorded once per key)."""
        if self.winograd_mode == "auto":
            return "auto"
        backend = self.winograd_backend
        if backend == "auto":
            backend = winograd_implementation(x.device)
        key = conv3x3_plan_key(x, self.out_channels, self.bias is not None)
        self.plans.setdefault(key, {"choice": backend, "source": "forced (winograd=True)"})
        return backend

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (
            not self.winograd_eligible
            or x.dim() != 4
            or x.dtype not in SUPPORTED_DTYPES
            or x.dtype != self.weight.dtype
            or x.device != self.weight.device
            or not dispatch.inference_only(x, self.weight, self.bias)
        ):
            return super().forward(x)
        u = self.weight_cache.get(self.weight, x.dtype)
        return conv3x3(
            x, self.weight, self.bias, backend=self._backend(x), plan_cache_dir=self.plan_cache_dir,
            u=u, plans=self.plans,
        )  # fmt: skip

    def extra_repr(self) -> str:
        return super().extra_repr() + f", winograd={self.winograd_mode!r}"
