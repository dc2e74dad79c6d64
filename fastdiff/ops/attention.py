"""Functional attention with selectable backends.

``attention(q, k, v, backend=...)`` takes ``(batch, heads, seq, head_dim)``
tensors, like ``F.scaled_dot_product_attention``:

* ``"sdpa"`` lets PyTorch pick among its fused kernels;
* ``"flash"``, ``"efficient"``, ``"cudnn"``, ``"math"`` force one SDPA kernel
  through ``torch.nn.attention.sdpa_kernel``;
* ``"xformers"`` calls ``xformers.ops.memory_efficient_attention``;
* ``"flash_attn"`` calls FlashAttention (FA3's ``flash_attn_interface`` on
  Hopper when installed, else FA2's ``flash_attn``);
* ``"auto"`` is plain SDPA, PyTorch's own capability-based choice.

Asking for a backend that is missing or cannot run on the inputs' device and
dtype raises :class:`AttentionBackendError` naming what to install or use;
only ``"auto"`` never fails for that reason.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from fastdiff._compat import MissingDependencyError, is_available, require

BACKENDS = ("auto", "sdpa", "flash", "efficient", "cudnn", "math", "xformers", "flash_attn")

_SDPA_KERNELS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "math": SDPBackend.MATH,
}


class AttentionBackendError(RuntimeError):
    """The requested attention backend cannot run here."""


def check_backend_name(backend: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"unknown attention backend {backend!r}; valid: {', '.join(BACKENDS)}")


def _sdpa(q, k, v, attn_mask, scale, kernel):
    if kernel is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=scale)
    if kernel in (SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION) and q.device.type != "cuda":
        raise AttentionBackendError(
            f"SDPA backend {kernel.name} needs CUDA tensors, got {q.device.type}; on CPU use 'auto', 'sdpa', 'flash' or 'math'"
        )
    try:
        with sdpa_kernel([kernel]):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=scale)
    except RuntimeError as err:
        raise AttentionBackendError(
            f"SDPA backend {kernel.name} cannot run these inputs (device={q.device.type}, dtype={q.dtype}, "
            f"head_dim={q.shape[-1]}, mask={'yes' if attn_mask is not None else 'no'}): {err} "
            f"Use backend='auto' or 'sdpa' to let PyTorch choose."
        ) from err


def xformers_bias(attn_mask, q, k):
    """An xFormers ``attn_bias`` tensor for a boolean or additive mask, or None.

    xFormers wants an additive bias in the query's dtype (a float32 mask with fp16 queries is
    refused) whose last dimension sits in storage padded to a multiple of 8 elements; diffusers'
    text masks have 77 keys. So: cast, broadcast to (B, H, Sq, Sk), and write into a zero-padded
    (B, H, Sq, ceil8(Sk)) buffer, returning the (B, H, Sq, Sk) view, as xFormers' docs prescribe.
    """
    if attn_mask is None:
        return None
    if attn_mask.dtype == torch.bool:
        bias = torch.zeros(attn_mask.shape, dtype=q.dtype, device=q.device).masked_fill(
            ~attn_mask, float("-inf")
        )
    else:
        bias = attn_mask.to(q.dtype)
    shape = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    bias = bias.expand(shape)
    keys = shape[3]
    padded = torch.zeros(*shape[:3], keys + (-keys) % 8, dtype=q.dtype, device=q.device)
    padded[..., :keys] = bias
    return padded[..., :keys]


def _xformers(q, k, v, attn_mask, scale):
    xops = require("xformers", "attention backend 'xformers'").ops
    if q.device.type != "cuda":
        raise AttentionBackendError("xformers attention needs CUDA tensors; use backend='auto' on CPU")
    bias = xformers_bias(attn_mask, q, k)
    # xformers layout is (B, S, H, D)
    out = xops.memory_efficient_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_bias=bias, scale=scale
    )
    return out.transpose(1, 2)


@functools.cache
def _flash_attn_fn(head_dim: int, dtype: torch.dtype, device: str = "cuda"):
    """(function, "fa3" | "fa2") for this head dim: FA3 only where a real call at ``head_dim`` works.

    Many FA3 builds support only some head dims (SD1.5 has 40, 80 and 160), so a probe at 64 says
    nothing about the model: probe the head dim the call has, once per (head_dim, dtype).
    """
    if (
        device != "cuda" or (torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9)
    ) and is_available("flash_attn_interface"):
        import flash_attn_interface  # FA3, Hopper only

        fn = flash_attn_interface.flash_attn_func
        try:
            x = torch.zeros(1, 8, 1, head_dim, dtype=dtype, device=device)
            fn(x, x, x)
            return fn, "fa3"
        except (RuntimeError, ValueError, TypeError):  # head dim or dtype not built into this FA3
            pass
    return require("flash_attn", "attention backend 'flash_attn'").flash_attn_func, "fa2"


def _flash_attn(q, k, v, attn_mask, scale):
    if q.device.type != "cuda" or q.dtype not in (torch.float16, torch.bfloat16):
        raise AttentionBackendError(
            f"flash_attn needs CUDA fp16/bf16 tensors, got {q.device.type} {q.dtype}; use backend='auto'"
        )
    if attn_mask is not None:
        raise AttentionBackendError("flash_attn does not take an attention mask; use backend='sdpa'")
    fn, version = _flash_attn_fn(q.shape[-1], q.dtype)
    out = fn(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), softmax_scale=scale)
    if version == "fa3" and isinstance(out, tuple):  # FA3 also returns the log-sum-exp
        out = out[0]
    return out.transpose(1, 2)


def attention(q, k, v, *, attn_mask=None, scale=None, backend: str = "auto"):
    """Scaled dot-product attention over ``(batch, heads, seq, head_dim)`` tensors.

    Args:
        q, k, v: query ``(B, H, Sq, D)``, key and value ``(B, H, Sk, D)``.
        attn_mask: optional boolean (True = keep) or additive mask broadcastable to ``(B, H, Sq, Sk)``.
        scale: softmax scale; ``1/sqrt(D)`` when None.
        backend: one of :data:`BACKENDS`.

    Returns:
        ``(B, H, Sq, D)`` tensor in the dtype of ``q``.
    """
    check_backend_name(backend)
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(
            f"attention expects 4-D (batch, heads, seq, head_dim) tensors, got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if backend in ("auto", "sdpa"):
        return _sdpa(q, k, v, attn_mask, scale, None)
    if backend in _SDPA_KERNELS:
        return _sdpa(q, k, v, attn_mask, scale, _SDPA_KERNELS[backend])
    if backend == "xformers":
        return _xformers(q, k, v, attn_mask, scale)
    return _flash_attn(q, k, v, attn_mask, scale)


def backend_status(backend: str, device="cpu", dtype=torch.float32, head_dim: int = 64) -> str | None:
    """None if ``backend`` runs on ``device``/``dtype`` here, else the reason it does not.

    Probed with a tiny real call, so the answer reflects this build of PyTorch
    and this device, not a table of what should work.
    """
    check_backend_name(backend)
    device = torch.device(device)
    try:
        q = torch.randn(1, 2, 8, head_dim, device=device, dtype=dtype)
        attention(q, q, q, backend=backend)
    except (AttentionBackendError, MissingDependencyError) as err:
        return str(err)
    except RuntimeError as err:  # e.g. a kernel not compiled for this GPU
        return f"{backend} failed on {device.type} {dtype}: {err}"
    return None


def usable_backends(device="cpu", dtype=torch.float32) -> list[str]:
    """The attention backends that run on ``device`` and ``dtype`` in this environment."""
    return [b for b in BACKENDS if backend_status(b, device, dtype) is None]
