"""Loading a sweep's pipelines and putting one configuration in place (and taking it out again).

Pipelines come from a name (``fastdiff-tiny``, ``fastdiff-tiny:lcm``, a diffusers folder or hub id,
``package.module:factory``) or a callable. diffusers Stable Diffusion / SDXL pipelines are wrapped in
fastdiff's drop-in classes (``from_pipe``, which shares the modules) so every call reports ``out.fastdiff``.
Anything else must subclass :class:`SweepPipeline`.

Only public call keywords are used: ``num_inference_steps``, ``steps``, ``early_stop``, ``draft``,
``guidance_scale``, ``generator``, ``prompt_embeds`` (and its siblings), ``output_type``.
"""

from __future__ import annotations

import importlib
import os
import time
from abc import ABC, abstractmethod
from contextlib import contextmanager

import torch

import fastdiff
from fastdiff.sweep.embeddings import PromptEncoder, StableDiffusionEncoder, StableDiffusionXLEncoder
from fastdiff.sweep.spec import Config, Spec


class SweepPipeline(ABC):
    """A pipeline that is not a diffusers SD/SDXL pipeline, e.g. a stand-in for tests or another model.

    ``__call__`` takes the keywords above (``prompt`` or the embeddings from :meth:`prompt_encoder`) and
    returns an object with ``images`` (float NHWC numpy in [0, 1] for ``output_type="np"``) and
    ``fastdiff.nfe_per_sample``.
    """

    scheduler = None

    @abstractmethod
    def __call__(self, prompt=None, **kwargs): ...

    def prompt_encoder(self) -> PromptEncoder | None:
        """An encoder for the embedding cache; None passes prompts as text."""
        return None

    def timed_module(self) -> torch.nn.Module | None:
        """The denoiser whose forward time is reported as ``unet_s``."""
        return None


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def load(name, spec: Spec, device: str):
    """Build the pipeline ``name`` names on ``device``, wrapped for the sweep."""
    dtype = _dtype(spec.dtype)
    if callable(name):
        pipe = name()
    elif name.startswith("fastdiff-tiny"):
        from fastdiff.tiny import load_pipeline

        variant = name.split(":", 1)[1] if ":" in name else "base"
        pipe = load_pipeline(variant, device=device, dtype=dtype)
    elif ":" in name and not os.path.exists(name):
        module, _, attr = name.partition(":")
        try:
            factory = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as e:
            raise ValueError(f"pipeline {name!r}: cannot import {attr} from {module}: {e}") from e
        pipe = factory()
    else:
        from diffusers import DiffusionPipeline

        pipe = DiffusionPipeline.from_pretrained(name, torch_dtype=dtype).to(device)
    import diffusers

    if isinstance(pipe, diffusers.DiffusionPipeline) and pipe.device != torch.device(device):
        pipe = pipe.to(device)  # a factory's pipeline joins this process's device (one GPU per process)
    return wrap(pipe, name)


def wrap(pipe, name="pipeline"):
    import diffusers

    import fastdiff.pipelines as fp

    if isinstance(pipe, (fp.FastdiffPipelineMixin, SweepPipeline)):
        out = pipe
    elif isinstance(pipe, diffusers.StableDiffusionXLPipeline):
        out = fp.StableDiffusionXLPipeline.from_pipe(pipe)
    elif isinstance(pipe, diffusers.StableDiffusionPipeline):
        out = fp.StableDiffusionPipeline.from_pipe(pipe)
    else:
        raise TypeError(
            f"pipeline {name!r} built a {type(pipe).__name__}; the sweep runs diffusers StableDiffusion / "
            "StableDiffusionXL pipelines or subclasses of fastdiff.sweep.SweepPipeline"
        )
    if isinstance(out, fp.FastdiffPipelineMixin):
        out.set_progress_bar_config(disable=True)
    return out


def prompt_encoder(pipe) -> PromptEncoder | None:
    import diffusers

    if isinstance(pipe, SweepPipeline):
        return pipe.prompt_encoder()
    if isinstance(pipe, diffusers.StableDiffusionXLPipeline):
        return StableDiffusionXLEncoder(pipe)
    return StableDiffusionEncoder(pipe)


def timed_module(pipe) -> torch.nn.Module | None:
    if isinstance(pipe, SweepPipeline):
        return pipe.timed_module()
    return pipe.unet


class Pipelines:
    """The process's loaded pipelines, by name, and their prompt encoders (kept across configurations)."""

    def __init__(self, spec: Spec, device: str):
        self.spec = spec
        self.device = device  # this process's device: cuda:<local rank> under a multi-GPU launch
        self._pipes: dict = {}
        self._encoders: dict = {}
        self.load_s = 0.0

    def get(self, name):
        key = name if isinstance(name, str) else id(name)
        if key not in self._pipes:
            t0 = time.perf_counter()
            self._pipes[key] = load(name, self.spec, self.device)
            self.load_s += time.perf_counter() - t0
            self._encoders[key] = prompt_encoder(self._pipes[key])
        return self._pipes[key], self._encoders[key]


@contextmanager
def configured(pipes: Pipelines, config: Config):
    """The configuration's pipeline with its sampler, ``optimize`` options, engine or step cache in place; the call
    keywords it needs. Everything is undone on exit, also after an error."""
    spec = pipes.spec
    pipe, encoder = pipes.get(config.get("pipeline", spec.pipeline))
    original_scheduler = pipe.scheduler
    changed = []
    try:
        sampler = config.get("sampler")
        if sampler and sampler != "default":
            if sampler.startswith("diffusers:"):
                import diffusers

                cls = getattr(diffusers, sampler.split(":", 1)[1])
                pipe.scheduler = cls.from_config(original_scheduler.config)
            else:
                from fastdiff.samplers import make_scheduler

                opts = dict(config.get("sampler_options") or {})
                if "schedule" in config.options:
                    opts["schedule"] = config.get("schedule")
                pipe.scheduler = make_scheduler(sampler, like=original_scheduler, **opts)
        # in this order: a step cache after optimize, since a pass that swaps a module drops its wrapper
        for key, install in (
            ("optimize", "optimize"),
            ("engine", "compile_engine"),
            ("step_cache", "step_cache"),
        ):
            if config.get(key) is not None:
                getattr(fastdiff, install)(pipe, **config.get(key))  # loads only what the spec uses
                changed.append(pipe)
        kwargs = {"guidance_scale": float(config.get("guidance", spec.guidance))}
        steps = config.get("steps")
        if isinstance(steps, str):
            kwargs["steps"] = steps
        elif steps is not None:
            kwargs["num_inference_steps"] = steps
        es = config.get("early_stop")
        if es:
            kwargs["early_stop"] = es
        draft = config.get("draft")
        if draft is not None:
            draft_pipe, _ = pipes.get(draft["model"])
            kwargs["draft"] = {**draft, "model": draft_pipe}
        if spec.height:
            kwargs["height"] = spec.height
        if spec.width:
            kwargs["width"] = spec.width
        yield pipe, encoder, kwargs
    finally:
        if changed:
            fastdiff.restore(pipe)
        pipe.scheduler = original_scheduler


def uses_cfg(pipe, guidance: float) -> bool:
    """Whether the call runs classifier-free guidance (diffusers' rule: scale > 1, and no guidance
    embedding in the U-Net, as LCM students have)."""
    if isinstance(pipe, SweepPipeline):
        return guidance > 1
    return guidance > 1 and pipe.unet.config.time_cond_proj_dim is None


__all__ = ["Pipelines", "SweepPipeline", "configured", "load", "uses_cfg", "wrap"]
