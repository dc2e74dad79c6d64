"""Configuration of :func:`fastdiff.optimize`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from fastdiff.ops.attention import BACKENDS as ATTENTION_BACKENDS


@dataclass
class OptimizeConfig:
    """What :func:`fastdiff.optimize` does to a UNet.

    Attributes:
        winograd: "auto" keeps Winograd F(2x2,3x3) only for the conv shapes
            where it measured faster than the native conv on this device;
            True forces it on every eligible 3x3 conv (the Triton kernel where
            Triton runs compiled, i.e. CUDA; the PyTorch Winograd elsewhere);
            False disables it.
        fuse_norm_act: fuse GroupNorm→SiLU (and, in ResnetBlock2D, the
            following 3x3 conv) into single kernels. Acts where Triton runs
            compiled (CUDA); on CPU no fused kernel beats PyTorch, so the
            pass records why and changes nothing.
        attention: attention backend for every diffusers ``Attention`` module:
            one of "auto", "sdpa", "flash", "efficient", "cudnn", "math",
            "xformers", "flash_attn". Only "auto" falls back silently.
        channels_last: store conv weights channels-last. "auto" enables it on
            CUDA, where cuDNN prefers NHWC, and leaves CPU models alone.
        verify: run the original and optimised UNet on a probe input after
            each pass and roll back any pass whose output differs beyond
            ``tolerance`` (max-abs error over max-abs value).
        tolerance: override the dtype-aware default (fp32 1e-4, fp16 1e-2,
            bf16 4e-2).
        plan_cache_dir: where measured per-shape dispatch plans persist;
            default ``$FASTDIFF_CACHE_DIR/plans`` or ``~/.cache/fastdiff/plans``.
        extra: room for passes added later (name -> options). Recognised
            now: ``"winograd_backend": "triton"`` and
            ``"fuse_norm_act_backend": "triton"`` force the Triton kernels
            even where they only run interpreted (tests use this under
            ``TRITON_INTERPRET=1``).
    """

    winograd: bool | str = "auto"
    fuse_norm_act: bool = True
    attention: str = "auto"
    channels_last: bool | str = "auto"
    verify: bool = True
    tolerance: float | None = None
    plan_cache_dir: str | None = None
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.winograd not in ("auto", True, False):
            raise ValueError(f"winograd must be 'auto', True or False, got {self.winograd!r}")
        if not isinstance(self.fuse_norm_act, bool):
            raise ValueError(f"fuse_norm_act must be True or False, got {self.fuse_norm_act!r}")
        if self.attention not in ATTENTION_BACKENDS:
            raise ValueError(
                f"attention must be one of {', '.join(ATTENTION_BACKENDS)}; got {self.attention!r}"
            )
        if self.channels_last not in ("auto", True, False):
            raise ValueError(f"channels_last must be 'auto', True or False, got {self.channels_last!r}")
        if self.tolerance is not None and not self.tolerance > 0:
            raise ValueError(f"tolerance must be a positive float, got {self.tolerance!r}")

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    def replace(self, **overrides) -> OptimizeConfig:
        """A copy with ``overrides`` applied; unknown names raise TypeError listing the valid ones."""
        unknown = sorted(set(overrides) - set(self.field_names()))
        if unknown:
            raise TypeError(
                f"unknown optimize option(s) {', '.join(unknown)}; valid options: {', '.join(self.field_names())}"
            )
        return dataclasses.replace(self, **overrides)
