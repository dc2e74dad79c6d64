"""The built-in optimisation passes and their order.

A pass is any object with ``name``, ``enabled(config) -> bool | str`` (a
string is the reason it is disabled) and ``apply(unet, config, ctx)``. The
kernel passes (Winograd, fused GroupNorm+SiLU) live in
:mod:`fastdiff.optimize.passes_kernels`.
"""

from __future__ import annotations

import torch
from diffusers.models.attention_processor import Attention

from fastdiff.nn.attention import FastdiffAttnProcessor
from fastdiff.ops.attention import AttentionBackendError, backend_status


class AttentionPass:
    """Install :class:`FastdiffAttnProcessor` on every diffusers ``Attention`` module."""

    name = "attention"

    def enabled(self, config):
        return True

    def check(self, unet, config) -> None:
        """Fail before touching the model if a forced backend cannot run here."""
        if config.attention == "auto":
            return
        p = next(unet.parameters())
        reason = backend_status(config.attention, p.device, p.dtype)
        if reason is not None:
            raise AttentionBackendError(
                f"attention backend {config.attention!r} is not usable on {p.device.type} {p.dtype}: {reason}"
            )

    def apply(self, unet, config, ctx) -> None:
        for path, module in unet.named_modules():
            if not isinstance(module, Attention):
                continue
            old = module.processor
            module.set_processor(FastdiffAttnProcessor(config.attention))
            ctx.record(
                path, lambda m=module, o=old: m.set_processor(o), f"FastdiffAttnProcessor({config.attention})"
            )


class ChannelsLastPass:
    """Store 4-D weights channels-last (NHWC), the layout cuDNN's fast conv kernels prefer."""

    name = "channels_last"

    def enabled(self, config):
        if config.channels_last == "auto":
            return (
                True if torch.cuda.is_available() else "auto: enabled on CUDA only, where cuDNN prefers NHWC"
            )
        return True if config.channels_last else "disabled by config"

    def apply(self, unet, config, ctx) -> None:
        device = next(unet.parameters()).device
        if config.channels_last == "auto" and device.type != "cuda":
            ctx.skip("", f"auto: model is on {device.type}, channels-last is enabled on CUDA only")
            return
        unet.to(memory_format=torch.channels_last)
        ctx.record("", lambda: unet.to(memory_format=torch.contiguous_format), "weights to channels_last")


def default_passes() -> list:
    """Passes in application order: norm fusion first (it may absorb a conv), then Winograd, attention, layout."""
    passes = []
    try:
        from fastdiff.optimize.passes_kernels import FuseNormActPass, WinogradPass
    except ModuleNotFoundError as err:
        if err.name != "fastdiff.optimize.passes_kernels":
            raise
        passes += [_Unavailable("fuse_norm_act"), _Unavailable("winograd")]
    else:
        passes += [FuseNormActPass(), WinogradPass()]
    return passes + [AttentionPass(), ChannelsLastPass()]


class _Unavailable:
    def __init__(self, name):
        self.name = name

    def enabled(self, config):
        return "kernel passes are not part of this build"

    def apply(self, unet, config, ctx):  # pragma: no cover - never enabled
        raise RuntimeError(self.name)
