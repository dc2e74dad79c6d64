"""Checks of the diffusers keywords a drop-in pipeline call receives, run before any model (#16).

diffusers accepts some bad values silently (a latents tensor of any shape, NaN guidance, ``eta`` its
scheduler drops) or fails on them late and obscurely; these checks raise first, naming the argument, the
value received and what is valid. :func:`prompts_per_image` is the one prompt expansion (auto steps and the
latents check use it).
"""

from __future__ import annotations

import difflib
import inspect
import math

import torch

from fastdiff._checks import is_int, is_number
from fastdiff.dynamic.adapters import step_parameters
from fastdiff.dynamic.checks import check_generator, check_positive_int

__all__ = [
    "MAX_STEPS",
    "OUTPUT_TYPES",
    "check_call_kwargs",
    "check_known_kwargs",
    "check_eta",
    "check_latents",
    "check_output_type",
    "check_preview_steps",
    "prompts_per_image",
]

OUTPUT_TYPES = ("pil", "np", "pt", "latent")


def check_preview_steps(preview_steps) -> None:
    if preview_steps is not None and not (is_int(preview_steps) and preview_steps >= 1):
        raise ValueError(f"preview_steps must be an int >= 1 or None, got {preview_steps!r}")


MAX_STEPS = 1000  # SD-family training schedules have 1000 timesteps


def check_output_type(output_type) -> None:
    if output_type not in OUTPUT_TYPES:
        raise ValueError(
            f"output_type must be one of {', '.join(map(repr, OUTPUT_TYPES))}, got {output_type!r}"
        )


# diffusers' SD/SDXL pipelines still take these through ``**kwargs`` (deprecated, with a warning)
_DEPRECATED_DIFFUSERS = ("callback", "callback_steps")


def check_known_kwargs(diffusers_call, fastdiff_call, kwargs: dict) -> None:
    """Raise on a keyword that neither ``fastdiff_call`` (its keyword-only parameters: ``steps`` ...) nor
    ``diffusers_call`` names.

    diffusers' ``__call__`` ends in ``**kwargs`` and ignores what it does not know, so a misspelt keyword
    (``step="fast"``, ``num_inference_step=8``) would run the defaults without a word."""
    params = inspect.signature(diffusers_call).parameters
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    known = {n for n, p in params.items() if p.kind in named}
    if not known or not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return  # a wrapper that hides the signature; or no **kwargs, so diffusers raises itself
    known |= set(_DEPRECATED_DIFFUSERS)
    ours = [n for n, p in inspect.signature(fastdiff_call).parameters.items() if p.kind is p.KEYWORD_ONLY]
    unknown = sorted(k for k in kwargs if k not in known)
    if unknown:
        close = difflib.get_close_matches(unknown[0], [*known, *ours], n=2)
        hint = f"; did you mean {' or '.join(map(repr, close))}?" if close else ""
        raise TypeError(
            f"unknown keyword argument(s) {', '.join(map(repr, unknown))}{hint} fastdiff adds "
            f"{', '.join(ours)}; the rest are the diffusers pipeline's own "
            f"({', '.join(sorted(known - set(_DEPRECATED_DIFFUSERS)))})"
        )


def check_call_kwargs(args: tuple, kwargs: dict) -> None:
    """Diffusers keywords that diffusers itself accepts silently or fails on obscurely, checked on both paths.

    Guidance ``<= 1`` disabling classifier-free guidance is diffusers' convention and is kept.
    """
    prompt = args[0] if args else kwargs.get("prompt")
    if isinstance(prompt, (list, tuple)) and (not prompt or not all(isinstance(p, str) for p in prompt)):
        raise ValueError(f"prompt must be a string or a non-empty list of strings, got {prompt!r}")
    if kwargs.get("num_images_per_prompt") is not None:
        check_positive_int("num_images_per_prompt", kwargs["num_images_per_prompt"])
    for name in ("height", "width"):
        if kwargs.get(name) is not None:
            check_positive_int(name, kwargs[name], multiple=8)
    if kwargs.get("num_inference_steps") is not None:
        check_positive_int("num_inference_steps", kwargs["num_inference_steps"], upper=MAX_STEPS)
    scale = kwargs.get("guidance_scale")
    if scale is not None and not (is_number(scale) and math.isfinite(scale)):
        raise ValueError(
            f"guidance_scale must be a finite number (<= 1 disables classifier-free guidance), got {scale!r}"
        )
    rescale = kwargs.get("guidance_rescale")
    if rescale is not None and not (is_number(rescale) and 0.0 <= rescale <= 1.0):
        raise ValueError(f"guidance_rescale must be a number in [0, 1] (0: off), got {rescale!r}")
    check_generator(kwargs.get("generator"), per="image", none_in_list=False)
    for name in ("callback_on_step_end", "callback"):
        hook = kwargs.get(name)
        if hook is not None and not callable(hook):
            raise TypeError(f"{name} must be callable or None, got {hook!r}")
    if "return_dict" in kwargs and not isinstance(kwargs["return_dict"], bool):
        raise TypeError(f"return_dict must be True or False, got {kwargs['return_dict']!r}")
    if "output_type" in kwargs:
        check_output_type(kwargs["output_type"])


def check_eta(kwargs: dict, scheduler) -> None:
    """``eta`` must be a finite number >= 0, and not 0 only where the scheduler that runs takes it per call.

    diffusers drops ``eta`` silently for schedulers whose ``step()`` has no such argument; a sweep over eta
    would then report identical images, so fastdiff raises instead."""
    eta = kwargs.get("eta")
    if eta is None:
        return
    if not (is_number(eta) and math.isfinite(eta) and eta >= 0):
        raise ValueError(f"eta must be a finite number >= 0 (0: deterministic DDIM), got {eta!r}")
    if eta == 0:
        return
    names = step_parameters(type(scheduler))  # None: step() takes **kwargs
    if names is not None and "eta" not in names:
        from fastdiff.samplers.scheduler import FastScheduler

        name = type(scheduler).__name__
        hint = "use a DDIMScheduler or DDPM-type scheduler that takes eta"
        if isinstance(scheduler, FastScheduler):
            name += f"(sampler={scheduler.config.sampler!r})"
            hint = "fastdiff samplers take eta when made: fastdiff.make_scheduler('ddim', eta=...)"
        raise ValueError(
            f"eta={eta!r} would be ignored: the scheduler this call runs, {name}, takes no eta per step "
            f"(steps= presets and 'auto' run fastdiff's default sampler); {hint}, or leave eta unset"
        )


def check_latents(pipe, args: tuple, kwargs: dict) -> None:
    """Text-to-image ``latents=``: a finite tensor shaped (images, U-Net channels, height/8, width/8).

    diffusers uses any tensor it is given: a wrong shape denoises an image of that shape, NaN gives NaN."""
    latents = kwargs.get("latents")
    if latents is None:
        return
    if not isinstance(latents, torch.Tensor):
        raise TypeError(f"latents must be a torch.Tensor or None, got {type(latents).__name__}")
    scale = getattr(pipe, "vae_scale_factor", 8)
    size = getattr(pipe, "default_sample_size", None) or pipe.unet.config.sample_size
    height = (kwargs.get("height") or size * scale) // scale
    width = (kwargs.get("width") or size * scale) // scale
    prompts = prompts_per_image(args, kwargs)
    if prompts is not None:
        batch = len(prompts)
    elif kwargs.get("prompt_embeds") is not None:
        batch = kwargs["prompt_embeds"].shape[0] * (kwargs.get("num_images_per_prompt") or 1)
    else:
        batch = latents.shape[0]
    expected = (batch, pipe.unet.config.in_channels, height, width)
    if tuple(latents.shape) != expected:
        raise ValueError(
            f"latents must have shape {expected} (images, U-Net in_channels, height/{scale}, width/{scale}), "
            f"got {tuple(latents.shape)}"
        )
    if not torch.isfinite(latents).all():
        raise ValueError("latents contain NaN or inf; sampling would return NaN images")


def prompts_per_image(args, kwargs) -> list[str] | None:
    """One prompt per image (``num_images_per_prompt`` copies, prompt-major as diffusers lays them out)."""
    prompt = args[0] if args else kwargs.get("prompt")
    n = kwargs.get("num_images_per_prompt") or 1
    if isinstance(prompt, str):
        return [prompt] * n
    if isinstance(prompt, (list, tuple)):
        return [p for p in prompt for _ in range(n)]
    return None
