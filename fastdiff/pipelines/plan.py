"""A pure plan of a drop-in pipeline call, built from its keywords before anything runs.

:func:`plan_call` validates fastdiff's keywords (``steps``, ``early_stop``, ``draft``, ``preview_steps``)
and the diffusers keywords they interact with (the keyword checks of both paths are in
:mod:`~fastdiff.pipelines.checks`), and returns a :class:`CallPlan` (or None when the call has
no fastdiff keyword and goes to diffusers unchanged). Every error names the argument, the value received and
what is valid, and is raised before any model runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fastdiff._checks import is_int, is_number
from fastdiff.dynamic.auto_steps import AutoSteps
from fastdiff.dynamic.controllers import EarlyStop
from fastdiff.dynamic.draft import refine_steps
from fastdiff.dynamic.presets import resolve_steps
from fastdiff.pipelines.capture import diffusers_class
from fastdiff.pipelines.checks import check_output_type, check_preview_steps, prompts_per_image

__all__ = ["CallPlan", "DraftSpec", "plan_call"]

DEFAULT_STEPS = 50  # diffusers' default num_inference_steps
_DRAFT_KWARGS = ("prompt", "height", "width", "num_images_per_prompt", "generator", "prompt_embeds")


@dataclass
class DraftSpec:
    """``draft=``: the draft model and how much of the main schedule it replaces."""

    model: object
    # 0.75: on fastdiff-tiny's held-out prompts the best of 0.3 / 0.5 / 0.75 at both 10 and 13 total NFE
    # (attributes 0.819 / 0.799 against 0.750 / 0.743 at 0.5; benchmarks/results/dynamic_steps.md)
    strength: float = 0.75
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
        if _is_pipeline(spec.model):
            _check_lcm_scheduler(spec.model)
        elif not _is_unet(spec.model):
            raise TypeError(
                "draft model must be an LCM pipeline or an LCM UNet2DConditionModel, "
                f"got {type(spec.model).__name__}"
            )
        if not (is_number(spec.strength) and 0.0 < spec.strength <= 1.0):
            raise ValueError(f"draft strength must be in (0, 1], got {spec.strength!r}")
        if not (is_int(spec.steps) and 1 <= spec.steps <= 8):
            raise ValueError(f"draft steps must be an int in [1, 8] (LCM uses 1-4), got {spec.steps!r}")
        return spec

    def pipeline_for(self, pipe):
        """The draft as a pipeline: as given, or ``pipe``'s components with the LCM U-Net and an LCMScheduler."""
        if _is_pipeline(self.model):
            return self.model
        from diffusers import LCMScheduler

        components = {
            **pipe.components,
            "unet": self.model,
            "scheduler": LCMScheduler.from_config(pipe.scheduler.config),
        }
        draft = diffusers_class(pipe)(**components)
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


def _samples_with_lcm(pipe) -> bool:
    """Whether ``pipe.scheduler`` is diffusers' LCMScheduler or fastdiff's ``make_scheduler("lcm")``."""
    from diffusers import LCMScheduler

    from fastdiff.samplers.scheduler import FastScheduler

    scheduler = getattr(pipe, "scheduler", None)
    return isinstance(scheduler, LCMScheduler) or (
        isinstance(scheduler, FastScheduler) and scheduler.config.sampler == "lcm"
    )


def check_default_sampler_fits(pipe, steps) -> None:
    """``steps`` presets and ``"auto"`` swap in DPM-Solver++(2M) with step counts measured on a teacher model;
    on an LCM student (an LCM scheduler, or a U-Net distilled with a guidance embedding) that would run the
    student off the sampler it was distilled for, so such a call is refused before any model runs."""
    unet_config = getattr(getattr(pipe, "unet", None), "config", None)
    if _samples_with_lcm(pipe):
        what = "an LCM scheduler"
    elif getattr(unet_config, "time_cond_proj_dim", None) is not None:
        what = "an LCM-distilled U-Net (time_cond_proj_dim)"
    else:
        return
    raise ValueError(
        f"steps={steps!r} runs DPM-Solver++(2M) for a step count measured on a teacher model, but this "
        f"pipeline has {what}; pass the number of LCM steps as an int (e.g. steps=4)"
    )


def _check_lcm_scheduler(draft_pipe) -> None:
    """A draft pipeline must sample with LCM: its own scheduler would run while the record says "LCM steps"."""
    from fastdiff.samplers.scheduler import FastScheduler

    if _samples_with_lcm(draft_pipe):
        return
    scheduler = getattr(draft_pipe, "scheduler", None)
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
            planner = AutoSteps().with_prompts(prompts_per_image(args, kwargs))
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
