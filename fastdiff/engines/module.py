"""``EngineUNet``: an ``nn.Module`` that stands in for ``pipe.unet`` and runs a compiled engine."""

from __future__ import annotations

import types

import torch
from torch import nn

from ..unet_inputs import UNetSignature

_UNSUPPORTED = (
    "class_labels",
    "attention_mask",
    "encoder_attention_mask",
    "down_block_additional_residuals",
    "mid_block_additional_residual",
    "down_intrablock_additional_residuals",
)


class EngineUNet(nn.Module):
    """Drop-in replacement for a diffusers ``UNet2DConditionModel`` backed by an ONNX Runtime or TensorRT engine.

    Keeps the U-Net call signature, ``config``, ``dtype``, ``device`` and the attributes
    the Stable Diffusion / SDXL pipelines read. The original U-Net is kept (not as a
    submodule) in ``fastdiff_original_unet`` so ``fastdiff.restore(pipe)`` can put it back.

    Attributes:
        quality: agreement with the PyTorch U-Net on held-back inputs (snr_db, cosine, ...).
        backend, precision: what the engine runs.
        cache_hit: whether the engine came from the on-disk cache.
        artifact: path of the engine file (ONNX model or TensorRT plan).
    """

    def __init__(
        self,
        runner,
        unet: nn.Module,
        signature: UNetSignature,
        *,
        backend: str,
        precision: str,
        quality: dict | None = None,
        cache_hit: bool = False,
        artifact=None,
        build_info: dict | None = None,
    ):
        super().__init__()
        self.runner = runner
        self.signature = signature
        self.config = unet.config
        self.backend = backend
        self.precision = precision
        self.quality = dict(quality or {})
        self.cache_hit = cache_hit
        self.artifact = artifact
        self.build_info = dict(build_info or {})
        self._dtype = unet.dtype
        self._device = unet.device
        # Attributes pipelines read from pipe.unet (shapes only; no weights are kept here).
        add = getattr(unet, "add_embedding", None)
        if add is not None and hasattr(add, "linear_1"):
            lin = add.linear_1
            self.add_embedding = types.SimpleNamespace(
                linear_1=types.SimpleNamespace(in_features=lin.in_features, out_features=lin.out_features)
            )
        else:
            self.add_embedding = None
        self.encoder_hid_proj = None
        # diffusers' U-Net passes explicit upsample sizes when the latent is not a multiple of this; a graph
        # traced at a multiple has no such path (see forward)
        self._up_factor = 2 ** int(getattr(unet, "num_upsamplers", 0))
        object.__setattr__(self, "fastdiff_original_unet", unet)

    @property
    def dtype(self) -> torch.dtype:
        return self._dtype

    @property
    def device(self) -> torch.device:
        return self._device

    def restore_target(self) -> nn.Module:
        """The PyTorch U-Net this engine replaced."""
        return self.fastdiff_original_unet

    def to(self, *args, **kwargs):
        # The engine is bound to its backend's device; pipe.to(...) must not fail on it.
        return self

    def forward(
        self,
        sample: torch.Tensor,
        timestep,
        encoder_hidden_states: torch.Tensor,
        class_labels=None,
        timestep_cond: torch.Tensor | None = None,
        attention_mask=None,
        cross_attention_kwargs: dict | None = None,
        added_cond_kwargs: dict | None = None,
        down_block_additional_residuals=None,
        mid_block_additional_residual=None,
        down_intrablock_additional_residuals=None,
        encoder_attention_mask=None,
        return_dict: bool = True,
    ):
        local = locals()
        given = [name for name in _UNSUPPORTED if local[name] is not None]
        if given:
            raise NotImplementedError(
                f"the {self.backend} engine was compiled without {given} inputs (ControlNet/T2I-Adapter residuals, "
                "masks, class labels); run these with the PyTorch U-Net (fastdiff.restore(pipe))"
            )
        if cross_attention_kwargs and cross_attention_kwargs.get("scale", 1.0) != 1.0:
            raise NotImplementedError(
                "a LoRA scale cannot change inside a compiled engine: fuse the LoRA with the wanted scale, then compile"
            )
        inputs = self.signature.to_flat(
            sample,
            timestep,
            encoder_hidden_states,
            timestep_cond=timestep_cond,
            added_cond_kwargs=added_cond_kwargs,
        )
        try:
            out = self.runner(inputs)
        except Exception as e:
            h, w, f = *sample.shape[-2:], self._up_factor
            if h % f or w % f:
                raise ValueError(
                    f"the {self.backend} engine cannot run a {h}x{w} latent: it was traced at a latent size that "
                    f"its {f}x upsampling divides, and {h}x{w} is not a multiple of {f} (image sides: multiples of "
                    f"{f} x the VAE's scale factor); use such a size, or the PyTorch U-Net (fastdiff.restore(pipe))"
                ) from e
            raise
        out = out.to(device=sample.device, dtype=sample.dtype)
        if not return_dict:
            return (out,)
        from diffusers.models.unets.unet_2d_condition import UNet2DConditionOutput

        return UNet2DConditionOutput(sample=out)

    def extra_repr(self) -> str:
        q = self.quality
        snr = f", snr_db={q['snr_db']:.1f}" if "snr_db" in q else ""
        return f"backend={self.backend}, precision={self.precision}, cache_hit={self.cache_hit}{snr}"
