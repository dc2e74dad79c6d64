"""Configuration of :func:`fastdiff.optimize`."""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from numbers import Real

# Keys of OptimizeConfig.extra and the values each accepts.
EXTRA_OPTIONS = {
    "winograd_backend": ("auto", "triton", "torch"),
    "fuse_norm_act_backend": ("auto", "triton", "native", "torch"),
}


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
        from fastdiff.ops.attention import BACKENDS as ATTENTION_BACKENDS  # light; ops load on first use

        for name in ("winograd", "channels_last"):
            value = getattr(self, name)
            if not (value == "auto" and isinstance(value, str)) and not isinstance(value, bool):
                raise ValueError(f"{name} must be 'auto', True or False, got {value!r}")
        for name in ("fuse_norm_act", "verify"):
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise ValueError(f"{name} must be True or False, got {value!r} ({type(value).__name__})")
        if self.attention not in ATTENTION_BACKENDS:
            raise ValueError(
                f"attention must be one of {', '.join(ATTENTION_BACKENDS)}; got {self.attention!r}"
            )
        tol = self.tolerance
        if tol is not None and (
            isinstance(tol, bool) or not isinstance(tol, Real) or not math.isfinite(tol) or tol <= 0
        ):
            raise ValueError(f"tolerance must be a positive finite number or None, got {tol!r}")
        if self.plan_cache_dir is not None and not isinstance(self.plan_cache_dir, (str, os.PathLike)):
            raise ValueError(f"plan_cache_dir must be a path or None, got {self.plan_cache_dir!r}")
        if not isinstance(self.extra, dict):
            raise ValueError(f"extra must be a dict, got {self.extra!r}")
        for key, value in self.extra.items():
            if key not in EXTRA_OPTIONS:
                raise ValueError(
                    f"unknown key {key!r} in extra; valid keys: {', '.join(sorted(EXTRA_OPTIONS))}"
                )
            if value not in EXTRA_OPTIONS[key]:
                raise ValueError(
                    f"extra[{key!r}] must be one of {', '.join(map(repr, EXTRA_OPTIONS[key]))}; got {value!r}"
                )

    @classmethod
    def coerce(cls, config) -> OptimizeConfig:
        """``config`` as an OptimizeConfig: None gives the defaults, anything else must already be one."""
        if config is None:
            return cls()
        if isinstance(config, cls):
            return config
        hint = (
            " (pass its entries as keywords: optimize(pipe, **options))" if isinstance(config, dict) else ""
        )
        raise TypeError(
            f"config must be a fastdiff.OptimizeConfig or None, got {type(config).__name__} {config!r}{hint}"
        )

    def replace(self, **overrides) -> OptimizeConfig:
        """A copy with ``overrides`` applied; unknown names raise TypeError listing the valid ones."""
        names = [f.name for f in dataclasses.fields(self)]
        unknown = sorted(set(overrides) - set(names))
        if unknown:
            raise TypeError(
                f"unknown optimize option(s) {', '.join(unknown)}; valid options: {', '.join(names)}"
            )
        return dataclasses.replace(self, **overrides)
