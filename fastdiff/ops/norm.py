"""GroupNorm+SiLU and GroupNorm+SiLU+3x3 conv with selectable implementations.

* ``group_norm_silu(x, G, w, b, eps)`` == ``F.silu(F.group_norm(x, G, w, b, eps))``
* ``group_norm_silu_conv3x3(x, G, gw, gb, eps, cw, cb)`` == ``F.conv2d(that, cw, cb, padding=1)``; with
  ``extra_scale``/``extra_shift`` (N, C) the norm's output becomes ``y * (1 + extra_scale) + extra_shift``
  before SiLU (diffusers' "scale_shift" time embedding).

Backends (vocabulary of :mod:`fastdiff.ops.dispatch`): ``"native"`` (the PyTorch expression above),
``"gn_triton"`` (the kernels of :mod:`fastdiff.kernels.group_norm_silu`), for the conv chain also
``"gn_triton+native_conv"`` and ``"fused_triton"`` (:mod:`fastdiff.kernels.fused_norm_conv`), and
``"auto"``: measured per shape where Triton runs compiled (CUDA); native elsewhere, e.g. on a CPU, where the
Triton interpreter is for testing only. Triton backends on CPU need ``TRITON_INTERPRET=1``. Non-native
implementations run only for inference (:func:`fastdiff.ops.dispatch.inference_only` over every input,
norm affine parameters included).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fastdiff.kernels._device import triton_native
from fastdiff.kernels.fused_norm_conv import group_norm_silu_conv3x3_reference, group_norm_silu_conv3x3_triton
from fastdiff.kernels.group_norm_silu import (
    SUPPORTED_DTYPES,
    affine_silu_triton,
    check_group_norm_inputs,
    group_norm_scale_shift_triton,
    group_norm_silu_reference,
    group_norm_silu_triton,
)
from fastdiff.kernels.winograd import transform_weight
from fastdiff.ops import dispatch
from fastdiff.ops.conv import check_conv3x3_inputs

GN_BACKENDS = ("auto", "native", "gn_triton")
GN_CONV_BACKENDS = ("auto", "native", "gn_triton+native_conv", "fused_triton")


def _check(x, num_groups, weight, bias):
    check_group_norm_inputs(x, num_groups, weight, bias)
    if x.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"x dtype must be one of float32/float16/bfloat16, got {x.dtype}")


def _triton_where_compiled(run):
    """The alternatives "auto" times: every Triton implementation where Triton runs compiled (CUDA), else none."""
    return lambda device: [n for n in run if n != dispatch.NATIVE] if triton_native(device) else []


def group_norm_silu(
    x, num_groups, weight=None, bias=None, eps=1e-5, *, backend="auto", plan_cache_dir=None, plans=None
):
    """SiLU(GroupNorm(x)) with fp32 statistics; NCHW or channels_last; fp32/fp16/bf16."""
    dispatch.check_backend(backend, GN_BACKENDS)
    _check(x, num_groups, weight, bias)
    run = {
        dispatch.NATIVE: lambda: group_norm_silu_reference(x, num_groups, weight, bias, eps),
        "gn_triton": lambda: group_norm_silu_triton(x, num_groups, weight, bias, eps),
    }
    choice = dispatch.select(
        backend, run, x, (weight, bias),
        key=lambda: dispatch.plan_key("gn_silu", x, g=num_groups), alternatives=_triton_where_compiled(run),
        plan_cache_dir=plan_cache_dir, plans=plans,
    )  # fmt: skip
    return run[choice]()


def _gn_triton_chain(x, num_groups, gn_weight, gn_bias, eps, es, et):
    if es is None:
        return group_norm_silu_triton(x, num_groups, gn_weight, gn_bias, eps)
    scale, shift = group_norm_scale_shift_triton(
        x, num_groups, gn_weight, gn_bias, eps, extra_scale=es, extra_shift=et
    )
    return affine_silu_triton(x, scale, shift)


def group_norm_silu_conv3x3(
    x,
    num_groups,
    gn_weight,
    gn_bias,
    eps,
    conv_weight,
    conv_bias=None,
    *,
    extra_scale=None,
    extra_shift=None,
    backend="auto",
    plan_cache_dir=None,
    u=None,
    plans=None,
):
    """conv3x3(SiLU(GroupNorm(x) [* (1 + s) + t])) -- the activation is never written with "fused_triton"."""
    dispatch.check_backend(backend, GN_CONV_BACKENDS)
    _check(x, num_groups, gn_weight, gn_bias)
    if not isinstance(conv_weight, torch.Tensor) or conv_weight.dim() != 4:
        raise ValueError("conv_weight must be a (K, C, 3, 3) tensor")
    check_conv3x3_inputs(x, conv_weight, conv_bias)
    if (extra_scale is None) != (extra_shift is None):
        raise ValueError("extra_scale and extra_shift must be given together")
    es, et = extra_scale, extra_shift
    args = (x, num_groups, gn_weight, gn_bias, eps, es, et)
    get_u = (lambda: u) if u is not None else (lambda: transform_weight(conv_weight, x.dtype))
    run = {
        dispatch.NATIVE: lambda: group_norm_silu_conv3x3_reference(
            x, num_groups, gn_weight, gn_bias, eps, conv_weight, conv_bias, es, et
        ),
        "gn_triton+native_conv": lambda: F.conv2d(_gn_triton_chain(*args), conv_weight, conv_bias, padding=1),
        "fused_triton": lambda: group_norm_silu_conv3x3_triton(
            x, num_groups, gn_weight, gn_bias, eps, get_u(), conv_bias, extra_scale=es, extra_shift=et
        ),
    }
    choice = dispatch.select(
        backend, run, x, (gn_weight, gn_bias, conv_weight, conv_bias, es, et),
        key=lambda: dispatch.plan_key(
            "gn_silu_conv3x3", x, g=num_groups, k=conv_weight.shape[0], bias=conv_bias is not None, ss=es is not None
        ),
        alternatives=_triton_where_compiled(run), plan_cache_dir=plan_cache_dir, plans=plans,
    )  # fmt: skip
    return run[choice]()
