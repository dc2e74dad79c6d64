"""Capture what a diffusers pipeline prepares for its denoising loop, without re-implementing it.

Contract of :func:`capture_inputs`: it calls the diffusers class's own ``__call__`` of ``pipe`` with the
caller's arguments, ``num_inference_steps`` and ``output_type="latent"`` on a private copy of
``scheduler``, and stops it at the first U-Net evaluation: a forward pre-hook registered *first*
(``prepend=True``, so no other hook - NFE counters, calibration recorders, feature caches - sees the
aborted call) records the U-Net's inputs and raises; a spy on ``scheduler.scale_model_input`` records the
initial latents. Everything diffusers does before denoising (prompt encoding, image preprocessing, img2img
noising, SDXL's extra conditioning, ``timestep_cond`` of guidance-embedded U-Nets) is therefore diffusers'
code, for every keyword it accepts. Generators are consumed exactly as diffusers' own call would consume
them up to that point. The pipeline's progress bar and scheduler are restored afterwards.

:class:`PreparedInputs` holds the result: the initial latents, a guided model function over the captured
conditioning, the scheduler copy (timesteps set, ``begin_index`` as diffusers left it) and the step
diffusers would start at.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass

import torch

from fastdiff.dynamic.guidance import GuidedUNet

__all__ = ["PreparedInputs", "capture_inputs", "diffusers_class"]


class _Captured(Exception):
    """Raised by the U-Net pre-hook to stop diffusers' loop at its first evaluation."""


@dataclass
class PreparedInputs:
    """What diffusers prepared for denoising (see the module docstring)."""

    latents: torch.Tensor  # initial state (x_T times init_noise_sigma, or the noised image for img2img)
    model_fn: GuidedUNet  # the U-Net with the captured conditioning and classifier-free guidance
    scheduler: object  # a copy of the scheduler, with diffusers' set_timesteps applied
    start_step: int  # first step diffusers would run (img2img skips the first ones)
    seconds: float


def diffusers_class(pipe) -> type:
    """The diffusers pipeline class ``pipe`` derives from (fastdiff's drop-in classes skipped)."""
    return next(c for c in type(pipe).__mro__ if c.__module__.startswith("diffusers."))


def capture_inputs(pipe, args, kwargs, num_inference_steps: int, scheduler) -> PreparedInputs:
    """Run ``pipe``'s diffusers ``__call__(*args, **kwargs)`` up to its first U-Net call; see the module."""
    t0 = time.perf_counter()
    scheduler = copy.deepcopy(scheduler)
    box = {}
    original_scale = scheduler.scale_model_input

    def spy(sample, *a, **k):
        box.setdefault("state", sample)
        return original_scale(sample, *a, **k)

    def pre_hook(module, hook_args, hook_kwargs):
        box["args"], box["kwargs"] = hook_args, hook_kwargs
        raise _Captured

    scheduler.scale_model_input = spy
    handle = pipe.unet.register_forward_pre_hook(pre_hook, with_kwargs=True, prepend=True)
    bar_config = getattr(pipe, "_progress_bar_config", None)
    pipe._progress_bar_config = {**(bar_config or {}), "disable": True}  # the aborted loop's bar is noise
    original_scheduler, pipe.scheduler = pipe.scheduler, scheduler
    try:
        with torch.no_grad():
            diffusers_class(pipe).__call__(
                pipe, *args, num_inference_steps=num_inference_steps, output_type="latent", **kwargs
            )
    except _Captured:
        pass
    finally:
        pipe.scheduler = original_scheduler
        handle.remove()
        del scheduler.scale_model_input
        if bar_config is None:
            del pipe._progress_bar_config
        else:
            pipe._progress_bar_config = bar_config
    if "kwargs" not in box:
        raise RuntimeError(
            "the diffusers pipeline returned without evaluating its U-Net (zero denoising steps?); "
            "check num_inference_steps and strength"
        )
    unet_kwargs = dict(box["kwargs"])
    unet_kwargs.pop("return_dict", None)
    model_input = box["args"][0] if box["args"] else unet_kwargs.pop("sample")
    ehs = unet_kwargs.pop("encoder_hidden_states")
    t_first = box["args"][1] if len(box["args"]) > 1 else unet_kwargs.pop("timestep")
    # LatentConsistencyModelPipeline has no such property: it never runs classifier-free guidance
    do_cfg = bool(getattr(pipe, "do_classifier_free_guidance", False))
    state = box.get("state", model_input)
    latents = state.chunk(2)[0] if do_cfg else state
    # where diffusers started (img2img skips the first steps; not every scheduler has begin_index)
    begin = getattr(scheduler, "begin_index", None) or 0
    hits = (scheduler.timesteps[begin:].to(torch.as_tensor(t_first).device) == t_first).nonzero().flatten()
    if len(hits):
        begin += int(hits[0])
    model_fn = GuidedUNet(
        pipe.unet,
        latents.shape[0],
        ehs,
        guidance_scale=float(pipe.guidance_scale),
        do_cfg=do_cfg,
        guidance_rescale=float(getattr(pipe, "guidance_rescale", 0.0) or 0.0),
        unet_kwargs=unet_kwargs,
    )
    return PreparedInputs(
        latents=latents.clone(),
        model_fn=model_fn,
        scheduler=scheduler,
        start_step=begin // getattr(scheduler, "order", 1),
        seconds=time.perf_counter() - t0,
    )
