"""Kernel passes for :func:`fastdiff.optimize`: fused GroupNorm+SiLU(+conv) and Winograd 3x3 convs.

* :class:`FuseNormActPass` (``fuse_norm_act``) swaps every eligible diffusers ``ResnetBlock2D`` for a
  :class:`~fastdiff.nn.norm_act.FusedResnetBlock2D` and the UNet's ``conv_norm_out`` + ``conv_act`` pair for
  :class:`~fastdiff.nn.norm_act.GroupNormSiLU` + ``nn.Identity`` (SD1.5: 22 blocks x 2 + 1 = 45 pairs).
  It needs Triton kernels that run compiled (CUDA); on other devices it changes nothing and says why.
* :class:`WinogradPass` (``winograd``) swaps every eligible 3x3 conv for
  :class:`~fastdiff.nn.winograd.WinogradConv2d` in the configured mode and reports each skipped conv
  with the precise reason. With ``"auto"`` the per-shape choice is measured lazily at the first forward
  with that shape and shows up in ``fastdiff.report()`` through ``plan_summary()``.

Both share the original Parameters, so state_dict, LoRA loading and ``.to()`` keep working, and both are
undone exactly by ``fastdiff.restore``.
"""

from __future__ import annotations

import torch
from diffusers.models.resnet import ResnetBlock2D
from torch import nn

from fastdiff._compat import triton_native, triton_unusable_reason, triton_usable
from fastdiff.nn.norm_act import FusedResnetBlock2D, GroupNormSiLU, fused_resnet_ineligible_reason
from fastdiff.nn.winograd import WinogradConv2d, winograd_ineligible_reason
from fastdiff.optimize.passes import Pass

# config.extra values (see OptimizeConfig.extra) -> the dispatch vocabulary of fastdiff.ops.dispatch:
# (GroupNormSiLU backend, FusedResnetBlock2D backend) and WinogradConv2d's winograd_backend
_NORM_BACKENDS = {
    "auto": ("auto", "auto"),
    "triton": ("gn_triton", "fused_triton"),
    "native": ("native", "native"),
    "torch": ("native", "native"),
}
_WINOGRAD_BACKENDS = {"auto": "auto", "triton": "winograd_triton", "torch": "winograd_torch"}


def _eligible(unet, ctx, kind: type, done: type, ineligible_reason) -> list[tuple[str, nn.Module]]:
    """(path, module) of every ``kind`` submodule that is not a ``done`` one already and is eligible;
    each other ``kind`` submodule is reported to ``ctx`` as skipped, with the reason."""
    out = []
    for path, module in unet.named_modules():
        if isinstance(module, kind):
            reason = f"already a {done.__name__}" if isinstance(module, done) else ineligible_reason(module)
            if reason is None:
                out.append((path, module))
            else:
                ctx.skip(path, reason)
    return out


class FuseNormActPass(Pass):
    """GroupNorm -> SiLU (-> 3x3 conv) chains to fused Triton kernels."""

    name = "fuse_norm_act"

    def disabled_reason(self, config):
        return None if config.fuse_norm_act else "disabled by config (fuse_norm_act=False)"

    @staticmethod
    def backend_for(device: torch.device, config) -> tuple[str | None, str]:
        """(backend, why): "auto" where Triton runs compiled, "triton" when forced via
        ``config.extra["fuse_norm_act_backend"]`` (tests use it with the interpreter), else None."""
        forced = config.extra.get("fuse_norm_act_backend")  # a valid key of _NORM_BACKENDS (OptimizeConfig)
        if forced is not None:
            return forced, "forced by config.extra"
        if triton_native(device):
            return "auto", "Triton kernels, measured per shape"
        if device.type != "cpu":
            return None, triton_unusable_reason(device)
        why = triton_unusable_reason(device)
        if triton_usable(device):  # on cpu: through the interpreter
            why = "the Triton interpreter is for testing only"
        return None, f"no fused kernel beats PyTorch on cpu: {why}"

    def apply(self, unet, config, ctx) -> None:
        backend, why = self.backend_for(ctx.device, config)
        if backend is None:
            ctx.skip("", why)
            return
        eligible = _eligible(unet, ctx, ResnetBlock2D, FusedResnetBlock2D, fused_resnet_ineligible_reason)
        for path, block in eligible:
            fused = FusedResnetBlock2D.from_module(
                block, backend=_NORM_BACKENDS[backend][1], plan_cache_dir=config.plan_cache_dir
            )
            ctx.replace_module(path, fused, f"FusedResnetBlock2D({backend})")
            chains = ["norm2+silu+conv2"]
            if block.upsample is None and block.downsample is None:
                chains.insert(0, "norm1+silu+conv1")
            ctx.detail(path, fused=chains)
        norm_out, act = getattr(unet, "conv_norm_out", None), getattr(unet, "conv_act", None)
        if type(norm_out) is nn.GroupNorm and isinstance(act, nn.SiLU):
            ctx.replace_module(
                "conv_norm_out",
                GroupNormSiLU.from_module(
                    norm_out, backend=_NORM_BACKENDS[backend][0], plan_cache_dir=config.plan_cache_dir
                ),
                f"GroupNormSiLU({backend})",
            )
            ctx.replace_module("conv_act", nn.Identity(), "Identity (SiLU fused into conv_norm_out)")
        elif norm_out is not None:
            ctx.skip("conv_norm_out", "not an nn.GroupNorm followed by nn.SiLU")


class WinogradPass(Pass):
    """Eligible 3x3 convs to WinogradConv2d (measured per shape with winograd="auto")."""

    name = "winograd"

    def disabled_reason(self, config):
        return "disabled by config (winograd=False)" if config.winograd is False else None

    def apply(self, unet, config, ctx) -> None:
        # winograd=True runs the Triton kernel where it is compiled (CUDA), the PyTorch Winograd elsewhere;
        # config.extra["winograd_backend"] = "triton" | "torch" forces one (tests use the interpreter)
        backend = _WINOGRAD_BACKENDS[
            config.extra.get("winograd_backend", "auto")
        ]  # checked by OptimizeConfig
        for path, conv in _eligible(unet, ctx, nn.Conv2d, WinogradConv2d, winograd_ineligible_reason):
            new = WinogradConv2d.from_module(
                conv, mode=config.winograd, plan_cache_dir=config.plan_cache_dir, winograd_backend=backend
            )
            ctx.replace_module(path, new, f"WinogradConv2d({config.winograd!r})")
            ctx.detail(path, channels=f"{conv.in_channels}->{conv.out_channels}", mode=config.winograd)
        if ctx.device.type == "cuda" and ctx.changed and not torch.backends.cudnn.benchmark:
            # the plans were timed against cuDNN's autotuned algorithms; run native convs the same way
            torch.backends.cudnn.benchmark = True
            ctx.record("", lambda: setattr(torch.backends.cudnn, "benchmark", False), "cudnn.benchmark=True")
