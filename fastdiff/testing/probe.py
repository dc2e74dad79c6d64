"""Small, valid inputs for any diffusers ``UNet2DConditionModel`` (see :mod:`fastdiff.unet_inputs`)."""

from __future__ import annotations

from fastdiff.unet_inputs import probe_inputs as unet_probe_inputs

__all__ = ["unet_probe_inputs"]
