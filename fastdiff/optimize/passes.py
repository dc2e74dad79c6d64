"""The optimisation pass protocol, the built-in passes and their order.

A pass subclasses :class:`Pass`. The kernel passes (Winograd, fused
GroupNorm+SiLU) live in :mod:`fastdiff.optimize.passes_kernels`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from diffusers.models.attention_processor import Attention

from fastdiff.nn.attention import FastdiffAttnProcessor
from fastdiff.ops.attention import AttentionBackendError, backend_status


class Pass(ABC):
    """One reversible transformation of a UNet, applied by :func:`fastdiff.optimize`.

    ``optimize`` first asks every pass :meth:`disabled_reason` and
    :meth:`check` (before any module changes), then calls :meth:`apply` with a
    :class:`~fastdiff.optimize.context.PassContext` through which every edit
    is made, so it can be verified, rolled back and restored.
    """

    name: str

    def disabled_reason(self, config) -> str | None:
        """None if the pass should run with ``config``, else why it does not."""
        return None

    def check(self, unet, config) -> None:  # noqa: B027 - optional hook, no-op by default
        """Raise before anything changes if the pass cannot run as configured."""

    @abstractmethod
    def apply(self, unet, config, ctx) -> None:
        """Edit ``unet`` through ``ctx`` (``ctx.replace_module`` / ``ctx.record``)."""


class AttentionPass(Pass):
    """Install :class:`FastdiffAttnProcessor` on every diffusers ``Attention`` module."""

    name = "attention"

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


class ChannelsLastPass(Pass):
    """Store 4-D weights channels-last (NHWC), the layout cuDNN's fast conv kernels prefer."""

    name = "channels_last"

    def disabled_reason(self, config):
        if config.channels_last == "auto":
            return (
                None if torch.cuda.is_available() else "auto: enabled on CUDA only, where cuDNN prefers NHWC"
            )
        return None if config.channels_last else "disabled by config"

    def apply(self, unet, config, ctx) -> None:
        if config.channels_last == "auto" and ctx.device.type != "cuda":
            ctx.skip("", f"auto: model is on {ctx.device.type}, channels-last is enabled on CUDA only")
            return
        unet.to(memory_format=torch.channels_last)
        ctx.record("", lambda: unet.to(memory_format=torch.contiguous_format), "weights to channels_last")


def default_passes() -> list[Pass]:
    """Passes in application order: norm fusion first (it may absorb a conv), then Winograd, attention, layout."""
    from fastdiff.optimize.passes_kernels import FuseNormActPass, WinogradPass

    return [FuseNormActPass(), WinogradPass(), AttentionPass(), ChannelsLastPass()]
