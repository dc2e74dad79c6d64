"""GroupNorm+SiLU and GroupNorm+SiLU+3x3 conv with selectable backends.

* ``group_norm_silu(x, G, w, b, eps)`` == ``F.silu(F.group_norm(x, G, w, b, eps))``
* ``group_norm_silu_conv3x3(x, G, gw, gb, eps, cw, cb)`` == ``F.conv2d(that, cw, cb, padding=1)``

Backends: ``"torch"`` (the reference above), ``"triton"`` (the kernels of
:mod:`fastdiff.kernels.group_norm_silu` / :mod:`fastdiff.kernels.fused_norm_conv`; CUDA, or CPU under
``TRITON_INTERPRET=1`` only) and ``"auto"`` (measured per shape on CUDA like :func:`fastdiff.ops.conv3x3`;
"torch" wherever no Triton kernel can run natively, e.g. on a CPU).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from fastdiff.kernels import dispatch
from fastdiff.kernels.fused_norm_conv import group_norm_silu_conv3x3_triton
from fastdiff.kernels.group_norm_silu import (
    SUPPORTED_DTYPES,
    check_group_norm_inputs,
    group_norm_silu_triton,
)
from fastdiff.kernels.winograd import transform_weight
from fastdiff.ops.conv import check_conv3x3_inputs, layout_tag, triton_native

BACKENDS = ("auto", "triton", "torch")


def _check(backend, x, num_groups, weight, bias):
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(map(repr, BACKENDS))}; got {backend!r}")
    check_group_norm_inputs(x, num_groups, weight, bias)
    if x.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"x dtype must be one of float32/float16/bfloat16, got {x.dtype}")


def _run(backend, x, key, ref, fast, plan_cache_dir):
    """Run the reference or the Triton path: forced by ``backend``, else the measured per-shape winner.

    "auto" keeps the reference where Triton does not run compiled or where gradients are needed.
    """
    if backend == "torch":
        return ref()
    if backend == "triton":
        return fast()
    if not triton_native(x.device) or (torch.is_grad_enabled() and x.requires_grad):
        return ref()
    choice, _ = dispatch.choose(key, {dispatch.NATIVE: ref, "triton": fast}, x.device, plan_cache_dir)
    return fast() if choice == "triton" else ref()


def group_norm_silu(x, num_groups, weight=None, bias=None, eps=1e-5, *, backend="auto", plan_cache_dir=None):
    """SiLU(GroupNorm(x)) with fp32 statistics; NCHW or channels_last; fp32/fp16/bf16."""
    _check(backend, x, num_groups, weight, bias)
    ref = lambda: F.silu(F.group_norm(x, num_groups, weight, bias, eps))
    fast = lambda: group_norm_silu_triton(x, num_groups, weight, bias, eps)
    n, c, h, w = x.shape
    key = f"gn_silu|n{n}|c{c}|g{num_groups}|h{h}|w{w}|{str(x.dtype)[6:]}|{layout_tag(x)}"
    return _run(backend, x, key, ref, fast, plan_cache_dir)


def group_norm_silu_conv3x3(
    x,
    num_groups,
    gn_weight,
    gn_bias,
    eps,
    conv_weight,
    conv_bias=None,
    *,
    backend="auto",
    plan_cache_dir=None,
):
    """conv3x3(SiLU(GroupNorm(x))) -- the normalised activation is never written with "triton"."""
    _check(backend, x, num_groups, gn_weight, gn_bias)
    if not isinstance(conv_weight, torch.Tensor) or conv_weight.dim() != 4:
        raise ValueError("conv_weight must be a (K, C, 3, 3) tensor")
    check_conv3x3_inputs(x, conv_weight, conv_bias)
    ref = lambda: F.conv2d(F.silu(F.group_norm(x, num_groups, gn_weight, gn_bias, eps)), conv_weight, conv_bias, padding=1)  # fmt: skip
    fast = lambda: group_norm_silu_conv3x3_triton(
        x, num_groups, gn_weight, gn_bias, eps, transform_weight(conv_weight, x.dtype), conv_bias
    )
    n, c, h, w = x.shape
    key = (
        f"gn_silu_conv3x3|n{n}|c{c}|g{num_groups}|k{conv_weight.shape[0]}|h{h}|w{w}|"
        f"{str(x.dtype)[6:]}|{layout_tag(x)}|bias{int(conv_bias is not None)}"
    )
    return _run(backend, x, key, ref, fast, plan_cache_dir)
