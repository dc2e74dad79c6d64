"""Drop-in Stable Diffusion XL pipelines with dynamic step control."""

from __future__ import annotations

import torch
from diffusers import StableDiffusionXLImg2ImgPipeline as _DiffusersXLImg2Img
from diffusers import StableDiffusionXLPipeline as _DiffusersXLText2Img
from diffusers.pipelines.stable_diffusion_xl import StableDiffusionXLPipelineOutput

from fastdiff.pipelines._mixin import FastdiffPipelineMixin

__all__ = ["StableDiffusionXLPipeline", "StableDiffusionXLImg2ImgPipeline"]


class _SDXLDecode:
    def _fastdiff_decode(self, latents, output_type="pil", return_dict=True, generator=None):
        """VAE decode (fp16 upcast, latents mean/std), watermark and postprocess, as diffusers' SDXL does."""
        if output_type == "latent":
            image = latents
        else:
            vae = self.vae
            upcast = vae.dtype == torch.float16 and vae.config.force_upcast
            if upcast:
                self.upcast_vae()
            dtype = next(iter(vae.post_quant_conv.parameters())).dtype
            latents = latents.to(dtype)
            mean = getattr(vae.config, "latents_mean", None)
            std = getattr(vae.config, "latents_std", None)
            if mean is not None and std is not None:  # per-channel statistics, broadcast over (B, C, H, W)
                mean_t = latents.new_tensor(mean).view(1, -1, 1, 1)
                std_t = latents.new_tensor(std).view(1, -1, 1, 1)
                latents = latents * std_t / vae.config.scaling_factor + mean_t
            else:
                latents = latents / vae.config.scaling_factor
            image = vae.decode(latents, return_dict=False)[0]
            if upcast:
                vae.to(dtype=torch.float16)
            if getattr(self, "watermark", None) is not None:
                image = self.watermark.apply_watermark(image)
            image = self.image_processor.postprocess(image, output_type=output_type)
        self.maybe_free_model_hooks()
        if not return_dict:
            return (image,)
        return StableDiffusionXLPipelineOutput(images=image)


class StableDiffusionXLPipeline(FastdiffPipelineMixin, _SDXLDecode, _DiffusersXLText2Img):
    """diffusers' ``StableDiffusionXLPipeline`` plus fastdiff's ``steps``, ``early_stop``, ``draft`` and
    ``preview_steps`` keywords (see :class:`fastdiff.StableDiffusionPipeline`)."""


class StableDiffusionXLImg2ImgPipeline(FastdiffPipelineMixin, _SDXLDecode, _DiffusersXLImg2Img):
    """diffusers' ``StableDiffusionXLImg2ImgPipeline`` plus ``steps`` (int/preset), ``early_stop`` and
    ``preview_steps``."""

    _fastdiff_text_to_image = False
