"""Drop-in Stable Diffusion 1.x/2.x pipelines with dynamic step control."""

from __future__ import annotations

from diffusers import StableDiffusionImg2ImgPipeline as _DiffusersImg2Img
from diffusers import StableDiffusionPipeline as _DiffusersText2Img
from diffusers.pipelines.stable_diffusion import StableDiffusionPipelineOutput

from fastdiff.pipelines._mixin import FastdiffPipelineMixin

__all__ = ["StableDiffusionPipeline", "StableDiffusionImg2ImgPipeline"]


class _SDDecode:
    def _fastdiff_decode(self, latents, output_type="pil", return_dict=True, generator=None):
        """VAE decode, safety checker and postprocessing, as at the end of diffusers' SD ``__call__``."""
        if output_type == "latent":
            image, nsfw = latents, None
        else:
            scaled = latents.to(self.vae.dtype) / self.vae.config.scaling_factor
            image = self.vae.decode(scaled, return_dict=False, generator=generator)[0]
            image, nsfw = self.run_safety_checker(image, self._execution_device, latents.dtype)
        denormalize = [True] * image.shape[0] if nsfw is None else [not flagged for flagged in nsfw]
        image = self.image_processor.postprocess(image, output_type=output_type, do_denormalize=denormalize)
        self.maybe_free_model_hooks()
        if not return_dict:
            return (image, nsfw)
        return StableDiffusionPipelineOutput(images=image, nsfw_content_detected=nsfw)


class StableDiffusionPipeline(FastdiffPipelineMixin, _SDDecode, _DiffusersText2Img):
    """diffusers' ``StableDiffusionPipeline`` plus fastdiff's call keywords.

    Extra keywords (everything else goes to diffusers):
        steps: int, ``"fast"``/``"balanced"``/``"quality"`` (10/13/20 steps of DPM-Solver++(2M)) or
            ``"auto"`` (the calibrated table's count; see benchmarks/results/dynamic_steps.md).
        early_stop: True, a dict of :class:`~fastdiff.dynamic.EarlyStop` options (with ``jumps``: a
            :class:`~fastdiff.dynamic.FastForward`), or an EarlyStop / FastForward.
        draft: an LCM pipeline or LCM U-Net, or ``{"model": ..., "strength": 0.75, "steps": 4}``:
            draft in 1-4 LCM steps, re-noise its x0 to ``strength`` and finish with this model.
        preview_steps: stop after k steps; ``output.images`` is the x0 preview and
            ``output.fastdiff.state`` resumes with :meth:`refine`.

    The output has a ``fastdiff`` attribute (:class:`~fastdiff.pipelines.FastdiffRecord`). Conventions kept
    from diffusers (``guidance_scale <= 1`` disables classifier-free guidance, default sizes, img2img
    strength) are listed in ``__call__``'s docstring.
    """


class StableDiffusionImg2ImgPipeline(FastdiffPipelineMixin, _SDDecode, _DiffusersImg2Img):
    """diffusers' ``StableDiffusionImg2ImgPipeline`` plus ``steps`` (int/preset), ``early_stop`` and
    ``preview_steps`` (see :class:`StableDiffusionPipeline`)."""

    _fastdiff_text_to_image = False
