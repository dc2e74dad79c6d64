"""Locate and load the shipped fastdiff-tiny weights."""

from __future__ import annotations

import os
import warnings

import torch

VARIANTS = ("base", "lcm")
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
_WEIGHTS_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "weights")

#: fixed generation whose latents `reference.json` records (see :func:`reference_stats`)
REFERENCE_PROMPT = "a red circle on a striped blue background"
REFERENCE_SETTINGS = {
    "base": dict(num_inference_steps=10, guidance_scale=5.0),
    "lcm": dict(num_inference_steps=4, guidance_scale=5.0),
}


def weights_dir(variant: str = "base", weights_root: str | None = None) -> str:
    """Folder of a variant, loadable with ``diffusers.StableDiffusionPipeline.from_pretrained``."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    # FASTDIFF_TINY_WEIGHTS points at freshly trained weights without reinstalling
    path = os.path.join(weights_root or os.environ.get("FASTDIFF_TINY_WEIGHTS") or _WEIGHTS_ROOT, variant)
    if not os.path.isfile(os.path.join(path, "model_index.json")):
        raise FileNotFoundError(
            f"fastdiff-tiny weights for {variant!r} not found at {path}; train them with scripts/train_tiny.py"
        )
    return path


def load_pipeline(
    variant: str = "base", device="cpu", dtype: torch.dtype = torch.float32, weights_root: str | None = None
):
    """The fastdiff-tiny text-to-image model as a ``diffusers.StableDiffusionPipeline``.

    Args:
        variant: "base" (teacher, PNDM scheduler by default, 64x64 images) or "lcm"
            (consistency-distilled student with ``LCMScheduler``; 1-4 steps, guidance
            scale is an input of the U-Net, not classifier-free guidance).
        device, dtype: where and in what precision to run (weights are stored in float16,
            float32 is the default for CPU). ``dtype`` is a ``torch.dtype`` or its name
            ("float32", "float16", "bfloat16").
    """
    if isinstance(dtype, str):
        dtype = _DTYPES.get(dtype.removeprefix("torch."), dtype)
    if dtype not in _DTYPES.values():
        raise ValueError(f"dtype must be one of {', '.join(_DTYPES)} (or the torch dtype), got {dtype!r}")
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(
            f"device must be a torch device or its name such as 'cpu' or 'cuda', got {device!r}"
        ) from err
    weights = weights_dir(variant, weights_root)
    from diffusers import StableDiffusionPipeline
    from diffusers.utils import logging as dlog
    from transformers.utils import logging as tlog

    # loading a 9 MB model needs no progress bars
    shown = [log for log in (dlog, tlog) if log.is_progress_bar_enabled()]
    for log in shown:
        log.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            # diffusers >= 0.36 prefers `dtype=`; `torch_dtype=` works on every supported version
            warnings.filterwarnings("ignore", message=".*torch_dtype.*", category=FutureWarning)
            pipe = StableDiffusionPipeline.from_pretrained(weights, torch_dtype=dtype, local_files_only=True)
    finally:
        for log in shown:
            log.enable_progress_bar()
    pipe.set_progress_bar_config(disable=True)
    return pipe.to(device)


@torch.no_grad()
def reference_stats(variant: str = "base", weights_root: str | None = None, pipe=None) -> dict:
    """Statistics of a fixed-seed generation's final latents (float32, CPU).

    Recorded at export time in ``weights/reference.json``; the tests regenerate and compare,
    which pins down the weights, the configs and diffusers' sampling code path together.
    """
    pipe = pipe or load_pipeline(variant, weights_root=weights_root)
    gen = torch.Generator("cpu").manual_seed(0)
    out = pipe(REFERENCE_PROMPT, generator=gen, output_type="latent", **REFERENCE_SETTINGS[variant])
    lat = out.images.float()
    pooled = torch.nn.functional.avg_pool2d(lat, 4)  # (1, 4, 4, 4)
    return {
        "prompt": REFERENCE_PROMPT,
        **REFERENCE_SETTINGS[variant],
        "seed": 0,
        "mean": round(lat.mean().item(), 6),
        "std": round(lat.std().item(), 6),
        "abs_mean": round(lat.abs().mean().item(), 6),
        "pooled": [round(v, 6) for v in pooled.flatten().tolist()],
    }
