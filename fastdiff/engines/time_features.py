"""The timestep's sinusoidal features, computed in float32 outside an OpenVINO engine.

A diffusers U-Net embeds the timestep as ``sin``/``cos`` of ``t * f_k`` (:class:`diffusers.models.embeddings.Timesteps`)
before its first layer. Under OpenVINO's bf16 hint that arithmetic runs in bf16 like the rest of the
graph: t = 999 or 501 is not even representable (8 significant bits), and ``t * f_k`` reaches hundreds
of radians, so the embedding every ResNet block adds is wrong by whole periods. On the full SD1.5 U-Net
(256^2, AMX Xeon, 2026-12-08) the bf16 engine's step came out at 24.3 dB against eager fp32 at t = 999
and 28.1 dB at t = 501, but 37.9 dB at t = 1; PyTorch's own bf16 U-Net, which computes these features in
fp32 and casts after, stays at 37.1-37.6 dB at every t. ``precise`` marks on the embedding's nodes
did not change it (a probe; no results file holds it). With the features computed here in float32 and the graph starting at them, the
bf16 engine gives 37.4-38.0 dB at every timestep, at the same speed
(``benchmarks/results/engines-time-features.md``).

So an OpenVINO engine converted from PyTorch takes, in place of the timestep, a ``(batch, channels)``
float32 tensor of these features under the input name ``timestep``; the model carries
:data:`RT_KEY` in its runtime info, and whoever feeds it (:class:`~fastdiff.engines.runtime_ov.OvRunner`,
NNCF's calibration) calls :meth:`TimeFeatures.feed` on the flat inputs. Engines without the key (other
backends, the ONNX route) take the timestep as before. SDXL's ``time_ids`` (image sizes such as 1024) are
embedded the same way by ``add_time_proj`` and still are, in the graph: a probe on a tiny random-weight
SDXL U-Net (no results file holds it) saw the bf16 step a few dB worse at sizes 768/1344 than at sizes of 1,
a smaller effect that was left as it is.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import types
from collections.abc import Mapping

import torch

RT_KEY = "fastdiff_time_features"


@dataclasses.dataclass(frozen=True)
class TimeFeatures:
    """The settings of a U-Net's ``time_proj`` (diffusers' ``Timesteps``)."""

    num_channels: int
    flip_sin_to_cos: bool
    downscale_freq_shift: float
    scale: float

    @classmethod
    def of(cls, unet) -> TimeFeatures | None:
        """The U-Net's settings, or None when its ``time_proj`` is not diffusers' ``Timesteps``
        (e.g. a Fourier projection): such a U-Net keeps the timestep input."""
        from diffusers.models.embeddings import Timesteps

        proj = getattr(unet, "time_proj", None)
        if type(proj) is not Timesteps or not hasattr(unet, "get_time_embed"):
            return None
        return cls(
            int(proj.num_channels),
            bool(proj.flip_sin_to_cos),
            float(proj.downscale_freq_shift),
            float(proj.scale),
        )

    @classmethod
    def of_model(cls, model) -> TimeFeatures | None:
        """The settings an ``openvino.Model`` was converted with (its runtime info), or None."""
        info = model.get_rt_info()
        if RT_KEY not in info:
            return None
        return cls(**json.loads(info[RT_KEY].astype(str)))

    def tag(self, model) -> None:
        """Record these settings in ``model``'s runtime info (saved with the IR)."""
        model.set_rt_info(json.dumps(dataclasses.asdict(self), sort_keys=True), RT_KEY)

    def __call__(self, timestep: torch.Tensor) -> torch.Tensor:
        """``(batch,)`` timesteps -> ``(batch, num_channels)`` float32 features, as ``Timesteps`` computes them."""
        from diffusers.models.embeddings import get_timestep_embedding

        t = torch.as_tensor(timestep).detach().to("cpu", torch.float32).reshape(-1)
        return get_timestep_embedding(
            t,
            self.num_channels,
            flip_sin_to_cos=self.flip_sin_to_cos,
            downscale_freq_shift=self.downscale_freq_shift,
            scale=self.scale,
        )

    def feed(self, flat: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``flat`` with its ``timestep`` replaced by the features (a timestep already of feature shape
        raises: features of features would be silently wrong)."""
        t = flat["timestep"]
        if t.ndim > 1:
            raise ValueError(
                f"timestep has shape {tuple(t.shape)}; this engine computes its features from (batch,) timesteps"
            )
        return {**flat, "timestep": self(t)}

    @contextlib.contextmanager
    def traced_without(self, unet):
        """While the block runs, ``unet`` takes these features as its ``timestep`` (its own projection
        skipped), so that a trace starts at them. The instance attribute is removed afterwards."""
        unet.get_time_embed = types.MethodType(
            lambda _self, sample, timestep: timestep.to(sample.dtype), unet
        )
        try:
            yield
        finally:
            del unet.get_time_embed
