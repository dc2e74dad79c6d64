"""A pure plan of a drop-in pipeline call, built from its keywords before anything runs.

:func:`plan_call` validates fastdiff's keywords (``steps``, ``early_stop``, ``draft``, ``preview_steps``)
and the diffusers keywords they interact with, and returns a :class:`CallPlan` (or None when the call has
no fastdiff keyword and goes to diffusers unchanged). Every error names the argument, the value received and
what is valid, and is raised before any model runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from fastdiff.dynamic.auto_steps import AutoSteps
from fastdiff.dynamic.controllers import EarlyStop
from fastdiff.dynamic.draft import refine_steps
from fastdiff.dynamic.presets import resolve_steps

__all__ = [
    "CallPlan",
    "DraftSpec",
    "check_call_kwargs",
    "check_eta",
    "check_latents",
    "check_output_type",
    "plan_call",
]

OUTPUT_TYPES = ("pil", "np", "pt", "latent")
DEFAULT_STEPS = 50  # diffusers' default num_inference_steps
_DRAFT_KWARGS = ("prompt", "height", "width", "num_images_per_prompt", "generator", "prompt_embeds")


@dataclass
class DraftSpec:
    """``draft=``: the draft model and how much of the main schedule it replaces."""

    model: object
    # 0.5: on fastdiff-tiny the 30-step run's attribute accuracy at 2.9x its speed; 0.3 was 4.6x faster but
    # lost 17 points of accuracy (benchmarks/results/dynamic_steps_draft.md)
    strength: float = 0.5
    steps: int = 4
    guidance_scale: float | None = None

    @classmethod
    def coerce(cls, value) -> DraftSpec:
        if isinstance(value, dict):
            unknown = set(value) - {"model", "strength", "steps", "guidance_scale"}
            if unknown or "model" not in value:
                raise ValueError(
                    f"draft dict needs 'model' and accepts strength, steps, guidance_scale; got keys {sorted(value)}"
                )
            spec = cls(**value)
        elif isinstance(value, tuple):
            if len(value) != 2:
                raise ValueError(f"draft tuple must be (model, strength), got {len(value)} items")
            spec = cls(model=value[0], strength=value[1])
        else:
            spec = cls(model=value)
        if not (_is_pipeline(spec.model) or _is_unet(spec.model)):
            raise TypeError(
                "draft model must be an LCM pipeline or an LCM UNet2DConditionModel, "
                f"got {type(spec.model).__name__}"
            )
        if _is_pipeline(spec.model):
            _check_lcm_scheduler(spec.model)
        strength = spec.strength
        if isinstance(strength, bool) or not isinstance(strength, (int, float)) or not 0.0 < strength <= 1.0:
            raise ValueError(f"draft strength must be in (0, 1], got {strength!r}")
        if not isinstance(spec.steps, int) or isinstance(spec.steps, bool) or not 1 <= spec.steps <= 8:
            raise ValueError(f"draft steps must be an int in [1, 8] (LCM uses 1-4), got {spec.steps!r}")
        return spec

    def pipeline_for(self, pipe):
        """The draft as a pipeline: as given, or ``pipe``'s components with the LCM U-Net and an LCMScheduler."""
        if _is_pipeline(self.model):
            return self.model
        from diffusers import LCMScheduler

        base = next(c for c in type(pipe).__mro__ if c.__module__.startswith("diffusers."))
        components = {
            **pipe.components,
            "unet": self.model,
            "scheduler": LCMScheduler.from_config(pipe.scheduler.config),
        }
        draft = base(**components)
        draft.set_progress_bar_config(disable=True)
        return draft

    def call_kwargs(self, kwargs: dict, draft_pipe) -> dict:
        """The main call's keywords that the draft pipeline shares, with the draft's guidance scale."""
        out = {k: v for k, v in kwargs.items() if k in _DRAFT_KWARGS}
        guidance = self.guidance_scale
        if guidance is None:
            # a full LCM takes guidance as a U-Net input (time_cond_proj_dim): give it the call's scale;
            # an LCM-LoRA'd U-Net runs without CFG (its recommended scale is 1-2)
            embedded = getattr(draft_pipe.unet.config, "time_cond_proj_dim", None) is not None
            guidance = float(kwargs.get("guidance_scale", 7.5)) if embedded else 1.0
        out["guidance_scale"] = guidance
        return out


def _is_pipeline(obj) -> bool:
    from diffusers import DiffusionPipeline

    return isinstance(obj, DiffusionPipeline)


def _check_lcm_scheduler(draft_pipe) -> None:
    """A draft pipeline must sample with LCM: its own scheduler would run while the record says "LCM steps"."""
    from diffusers import LCMScheduler

    from fastdiff.samplers.scheduler import FastScheduler

    scheduler = getattr(draft_pipe, "scheduler", None)
    if isinstance(scheduler, LCMScheduler):
        return
    if isinstance(scheduler, FastScheduler) and scheduler.config.sampler == "lcm":
        return
    name = type(scheduler).__name__
    if isinstance(scheduler, FastScheduler):
        name += f"(sampler={scheduler.config.sampler!r})"
    raise ValueError(
        f"draft model {type(draft_pipe).__name__} has a {name} scheduler; a draft pipeline must sample "
        "with diffusers' LCMScheduler or fastdiff.make_scheduler('lcm') (set draft_pipe.scheduler), "
        "or pass its LCM U-Net as draft={'model': unet} to use an LCMScheduler built from this pipeline's"
    )


def _is_unet(obj) -> bool:
    # duck-typed: an engine-backed U-Net stand-in is accepted like a UNet2DConditionModel
    return callable(obj) and getattr(getattr(obj, "config", None), "in_channels", None) is not None


@dataclass
class CallPlan:
    """What a fastdiff call will do. ``kwargs`` are the diffusers keywords left for preparation."""

    num_inference_steps: int  # the schedule diffusers prepares (for auto steps: the longest)
    reason: str
    use_default_sampler: bool  # presets and auto steps run fastdiff's default sampler
    planner: AutoSteps | None
    controller: EarlyStop | None
    draft: DraftSpec | None
    preview_steps: int | None
    output_type: str
    return_dict: bool
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)

    @property
    def generator(self):
        return self.kwargs.get("generator")

    @property
    def step_kwargs(self) -> dict:
        return {"eta": self.kwargs.get("eta", 0.0)}


def check_preview_steps(preview_steps) -> None:
    if preview_steps is not None and (
        not isinstance(preview_steps, int) or isinstance(preview_steps, bool) or preview_steps < 1
    ):
        raise ValueError(f"preview_steps must be an int >= 1 or None, got {preview_steps!r}")


MAX_STEPS = 1000  # SD-family training schedules have 1000 timesteps


def check_output_type(output_type) -> None:
    if output_type not in OUTPUT_TYPES:
        raise ValueError(
            f"output_type must be one of {', '.join(map(repr, OUTPUT_TYPES))}, got {output_type!r}"
        )


def _positive_int(name: str, value, upper: int | None = None, multiple: int = 1) -> None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= 1
    ok = ok and (upper is None or value <= upper) and value % multiple == 0
    if not ok:
        valid = f"an int >= 1{f' and <= {upper}' if upper else ''}{f', a multiple of {multiple}' if multiple > 1 else ''}"
        raise ValueError(f"{name} must be {valid}, got {value!r}")


def check_call_kwargs(args: tuple, kwargs: dict) -> None:
    """Diffusers keywords that diffusers itself accepts silently or fails on obscurely, checked on both paths.

    Guidance ``<= 1`` disabling classifier-free guidance is diffusers' convention and is kept.
    """
    prompt = args[0] if args else kwargs.get("prompt")
    if isinstance(prompt, (list, tuple)) and (not prompt or not all(isinstance(p, str) for p in prompt)):
        raise ValueError(f"prompt must be a string or a non-empty list of strings, got {prompt!r}")
    if kwargs.get("num_images_per_prompt") is not None:
        _positive_int("num_images_per_prompt", kwargs["num_images_per_prompt"])
    for name in ("height", "width"):
        if kwargs.get(name) is not None:
            _positive_int(name, kwargs[name], multiple=8)
    if kwargs.get("num_inference_steps") is not None:
        _positive_int("num_inference_steps", kwargs["num_inference_steps"], upper=MAX_STEPS)
    scale = kwargs.get("guidance_scale")
    if scale is not None and (
        isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale)
    ):
        raise ValueError(
            f"guidance_scale must be a finite number (<= 1 disables classifier-free guidance), got {scale!r}"
        )
    rescale = kwargs.get("guidance_rescale")
    if rescale is not None and (
        isinstance(rescale, bool) or not isinstance(rescale, (int, float)) or not 0.0 <= rescale <= 1.0
    ):
        raise ValueError(f"guidance_rescale must be a number in [0, 1] (0: off), got {rescale!r}")
    generator = kwargs.get("generator")
    gens = generator if isinstance(generator, list) else [generator]
    if generator is not None and not all(isinstance(g, torch.Generator) for g in gens):
        raise TypeError(
            f"generator must be a torch.Generator, a list of them (one per image) or None, got {generator!r}"
        )
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
    import inspect

    eta = kwargs.get("eta")
    if eta is None:
        return
    if isinstance(eta, bool) or not isinstance(eta, (int, float)) or not math.isfinite(eta) or eta < 0:
        raise ValueError(f"eta must be a finite number >= 0 (0: deterministic DDIM), got {eta!r}")
    if eta == 0:
        return
    params = inspect.signature(type(scheduler).step).parameters
    takes_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    if "eta" not in params and not takes_kwargs:
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
    prompts = _prompts(args, kwargs)
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


def plan_call(
    args: tuple,
    kwargs: dict,
    *,
    steps=None,
    early_stop=None,
    draft=None,
    preview_steps=None,
    text_to_image: bool = True,
) -> CallPlan | None:
    """Validate a call's keywords and plan it; None means "no fastdiff keyword: diffusers' own loop"."""
    controller = EarlyStop.coerce(early_stop)
    if steps is None and controller is None and draft is None and preview_steps is None:
        return None
    check_preview_steps(preview_steps)
    kwargs = dict(kwargs)
    if kwargs.get("callback_on_step_end") is not None or kwargs.get("callback") is not None:
        raise ValueError(
            "callback_on_step_end/callback cannot be combined with fastdiff keywords (steps, early_stop, "
            "draft, preview_steps): fastdiff runs its own loop; call without them to use diffusers' loop"
        )
    if kwargs.get("denoising_end") is not None:
        raise ValueError(
            f"denoising_end={kwargs['denoising_end']!r} (SDXL base+refiner) cannot be combined with fastdiff "
            "keywords; leave it unset"
        )
    output_type = kwargs.pop("output_type", "pil")
    return_dict = kwargs.pop("return_dict", True)
    check_output_type(output_type)
    num_inference_steps = kwargs.pop("num_inference_steps", None)

    planner, use_default = None, False
    if steps is not None:
        if num_inference_steps is not None:
            raise ValueError(
                f"pass either steps= or num_inference_steps=, not both (got steps={steps!r}, "
                f"num_inference_steps={num_inference_steps!r})"
            )
        n, reason = resolve_steps(steps)
        use_default = isinstance(steps, str)
        if n == "auto":
            if not text_to_image:
                raise ValueError("steps='auto' is available for text-to-image pipelines only")
            planner = AutoSteps().with_prompts(_prompts(args, kwargs))
            n, reason = planner.max_steps, "auto steps per image"
    else:
        n = num_inference_steps or DEFAULT_STEPS
        reason = f"fixed: {n} steps (num_inference_steps)"

    spec = None
    if draft is not None:
        spec = DraftSpec.coerce(draft)
        if not text_to_image:
            raise ValueError("draft= is available for text-to-image pipelines only")
        if planner is not None:
            raise ValueError("draft= cannot be combined with steps='auto'")
        n_refine = refine_steps(n, spec.strength)  # rejects a strength that leaves no step, before any run
        reason = (
            f"draft: {spec.steps} LCM step(s), x0 re-noised to strength {spec.strength}, "
            f"then {n_refine} of {n} steps of the main model"
        )
    if controller is not None:
        reason += f"; early stop {controller!r}"
    return CallPlan(
        num_inference_steps=n,
        reason=reason,
        use_default_sampler=use_default,
        planner=planner,
        controller=controller,
        draft=spec,
        preview_steps=preview_steps,
        output_type=output_type,
        return_dict=return_dict,
        args=tuple(args),
        kwargs=kwargs,
    )


def _prompts(args, kwargs) -> list[str] | None:
    """One prompt per image (``num_images_per_prompt`` copies, prompt-major as diffusers lays them out)."""
    prompt = args[0] if args else kwargs.get("prompt")
    n = kwargs.get("num_images_per_prompt") or 1
    if isinstance(prompt, str):
        return [prompt] * n
    if isinstance(prompt, (list, tuple)):
        return [p for p in prompt for _ in range(n)]
    return None
