"""Fused GroupNorm+SiLU modules: ``GroupNormSiLU`` and a ``ResnetBlock2D`` with fused norm->SiLU->conv.

Both are built with ``from_module`` and share the original Parameters (state_dict unchanged). Their
``backend`` is a value of :mod:`fastdiff.ops.dispatch`'s vocabulary: ``"auto"`` (Triton kernels where they
run compiled and measured faster per shape, native otherwise), ``"native"``, or a forced Triton
implementation (``"gn_triton"``; for the block also ``"gn_triton+native_conv"`` / ``"fused_triton"``; on CPU
only under ``TRITON_INTERPRET=1``). The modules only call :func:`fastdiff.ops.group_norm_silu` and
:func:`fastdiff.ops.group_norm_silu_conv3x3` (with their cached transformed conv weight and ``plans`` memo):
when any input or parameter needs a gradient, or the model is traced/exported/compiled, native runs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from diffusers.models.resnet import ResnetBlock2D
from torch import nn

from fastdiff.kernels.group_norm_silu import SUPPORTED_DTYPES
from fastdiff.nn.winograd import (
    PlannedModule,
    TransformedWeightCache,
    WinogradConv2d,
    share_module_state,
    winograd_ineligible_reason,
)
from fastdiff.ops import dispatch
from fastdiff.ops.norm import GN_BACKENDS, GN_CONV_BACKENDS, group_norm_silu, group_norm_silu_conv3x3


class GroupNormSiLU(PlannedModule, nn.GroupNorm):
    """``nn.GroupNorm`` followed by SiLU in one kernel (replace the SiLU that followed it by ``nn.Identity``)."""

    @classmethod
    def from_module(cls, norm: nn.GroupNorm, backend="auto", plan_cache_dir=None) -> GroupNormSiLU:
        if not isinstance(norm, nn.GroupNorm):
            raise TypeError(f"expected an nn.GroupNorm, got {type(norm).__name__}")
        new = share_module_state(norm, cls.__new__(cls))
        new._init_fused(backend, plan_cache_dir)
        return new

    def __init__(self, *args, backend="auto", plan_cache_dir=None, **kwargs):
        super().__init__(*args, **kwargs)
        self._init_fused(backend, plan_cache_dir)

    def _init_fused(self, backend, plan_cache_dir) -> None:
        dispatch.check_backend(backend, GN_BACKENDS)
        self.backend = backend
        self.plan_cache_dir = plan_cache_dir
        self.plans = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4 or x.dtype not in SUPPORTED_DTYPES:
            return F.silu(F.group_norm(x, self.num_groups, self.weight, self.bias, self.eps))
        return group_norm_silu(
            x, self.num_groups, self.weight, self.bias, self.eps,
            backend=self.backend, plan_cache_dir=self.plan_cache_dir, plans=self.plans,
        )  # fmt: skip


def fused_resnet_ineligible_reason(block: nn.Module) -> str | None:
    """Why ``block`` cannot become a :class:`FusedResnetBlock2D`, or None."""
    if not isinstance(block, ResnetBlock2D):
        return f"{type(block).__name__} is not a diffusers ResnetBlock2D"
    if not isinstance(block.nonlinearity, nn.SiLU):
        return f"activation is {type(block.nonlinearity).__name__}, only SiLU is fused"
    for name in ("norm1", "norm2"):
        if type(getattr(block, name)) is not nn.GroupNorm:
            return f"{name} is {type(getattr(block, name)).__name__}, not nn.GroupNorm"
    if block.time_embedding_norm not in ("default", "scale_shift"):
        return f"time_embedding_norm {block.time_embedding_norm!r} is not 'default' or 'scale_shift'"
    return None


class FusedResnetBlock2D(PlannedModule, ResnetBlock2D):
    """diffusers ``ResnetBlock2D`` whose GroupNorm->SiLU->3x3 conv chains run as one fused operation.

    ``norm1 -> SiLU -> conv1`` (when the block does not resample in between) and
    ``norm2 [-> (1 + scale) * . + shift] -> SiLU -> dropout -> conv2`` (when dropout is inactive) each
    become GroupNorm statistics + one Winograd conv that normalises its input while loading it. The
    "scale_shift" time embedding is folded into the per-channel affine map of the norm. Everything else
    (temb projection, shortcut, output_scale_factor, up/down sampling) is the original code.
    """

    @classmethod
    def from_module(cls, block: ResnetBlock2D, backend="auto", plan_cache_dir=None) -> FusedResnetBlock2D:
        reason = fused_resnet_ineligible_reason(block)
        if reason is not None:
            raise ValueError(f"cannot fuse this ResnetBlock2D: {reason}")
        new = share_module_state(block, cls.__new__(cls))
        new._init_fused(backend, plan_cache_dir)
        return new

    def __init__(self, *args, backend="auto", plan_cache_dir=None, **kwargs):
        super().__init__(*args, **kwargs)
        reason = fused_resnet_ineligible_reason(self)
        if reason is not None:
            raise ValueError(f"FusedResnetBlock2D cannot be built with these arguments: {reason}")
        self._init_fused(backend, plan_cache_dir)

    def _init_fused(self, backend, plan_cache_dir) -> None:
        dispatch.check_backend(backend, GN_CONV_BACKENDS)
        self.backend = backend
        self.plan_cache_dir = plan_cache_dir
        self.plans = {}
        self.weight_caches = {"conv1": TransformedWeightCache(), "conv2": TransformedWeightCache()}

    def _unfused(self, x, norm, conv, es, et, dropout=None):
        """The original module sequence (what runs for training and wherever native is chosen)."""
        y = norm(x)
        if es is not None:
            y = y * (1 + es[:, :, None, None]) + et[:, :, None, None]
        y = self.nonlinearity(y)
        return conv(y if dropout is None else dropout(y))

    def _norm_act_conv(self, x, norm, conv, name, es=None, et=None):
        # an eligible conv has a kernel dtype (float32/float16/bfloat16), so x matching it has one too
        fusable = winograd_ineligible_reason(conv) is None and x.dtype == conv.weight.dtype
        params = (x, norm.weight, norm.bias, conv.weight, conv.bias, es, et)
        if not fusable or not dispatch.inference_only(*params):  # forward() already ran native as a whole
            return self._unfused(x, norm, conv, es, et)
        cache = conv.weight_cache if isinstance(conv, WinogradConv2d) else self.weight_caches[name]
        return group_norm_silu_conv3x3(
            x, norm.num_groups, norm.weight, norm.bias, norm.eps, conv.weight, conv.bias,
            extra_scale=es, extra_shift=et, backend=self.backend, plan_cache_dir=self.plan_cache_dir,
            u=cache.get(conv.weight, x.dtype), plans=self.plans,
        )  # fmt: skip

    def forward(self, input_tensor: torch.Tensor, temb: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        if (
            args
            or kwargs.get("scale") is not None
            or self.backend == dispatch.NATIVE
            or (self.time_embedding_norm == "scale_shift" and self.time_emb_proj is None)
        ):
            return super().forward(input_tensor, temb, *args, **kwargs)  # keeps diffusers' deprecation path

        if self.upsample is None and self.downsample is None:
            hidden = self._norm_act_conv(input_tensor, self.norm1, self.conv1, "conv1")
        else:  # resampling sits between SiLU and conv1: original sequence
            hidden = self.nonlinearity(self.norm1(input_tensor))
            if self.upsample is not None:
                if hidden.shape[0] >= 64:
                    input_tensor, hidden = input_tensor.contiguous(), hidden.contiguous()
                input_tensor, hidden = self.upsample(input_tensor), self.upsample(hidden)
            else:
                input_tensor, hidden = self.downsample(input_tensor), self.downsample(hidden)
            hidden = self.conv1(hidden)

        if self.time_emb_proj is not None:
            if not self.skip_time_act:
                temb = self.nonlinearity(temb)
            temb = self.time_emb_proj(temb)[:, :, None, None]

        es = et = None
        if self.time_embedding_norm == "default":
            if temb is not None:
                hidden = hidden + temb
        else:  # scale_shift
            if temb is None:
                raise ValueError("`temb` should not be None when `time_embedding_norm` is 'scale_shift'")
            es, et = (t[:, :, 0, 0] for t in torch.chunk(temb, 2, dim=1))

        if self.training and self.dropout.p > 0:  # dropout sits between SiLU and conv2: unfused
            hidden = self._unfused(hidden, self.norm2, self.conv2, es, et, self.dropout)
        else:
            hidden = self._norm_act_conv(hidden, self.norm2, self.conv2, "conv2", es, et)

        if self.conv_shortcut is not None:
            if self.training:
                input_tensor = input_tensor.contiguous()
            input_tensor = self.conv_shortcut(input_tensor)
        return (input_tensor + hidden) / self.output_scale_factor
