"""Shared machinery of fastdiff's drop-in pipelines.

How a call with fastdiff keywords works, without re-implementing prompt encoding, image preprocessing,
img2img noising or SDXL's extra conditioning:

1. **capture**: diffusers' own ``__call__`` runs up to its first U-Net evaluation, where a forward pre-hook
   records the U-Net's inputs (text embeddings, ``added_cond_kwargs``, ``timestep_cond``, ...) and aborts.
   A spy on ``scheduler.scale_model_input`` records the initial latents. Everything a pipeline does before
   denoising is therefore exactly diffusers' code, for every keyword it accepts.
2. **denoise** with :func:`fastdiff.dynamic.sample` (early stop, auto steps, preview/resume, LCM draft).
3. **decode** the final x0 as the diffusers pipeline would (VAE, safety checker / watermark, postprocess).

A call without fastdiff keywords is passed to diffusers unchanged; only the ``fastdiff`` record (NFE,
timings) is attached to its output.
"""

from __future__ import annotations

import copy
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from fastdiff.dynamic.auto_steps import AutoSteps
from fastdiff.dynamic.controllers import EarlyStop
from fastdiff.dynamic.draft import renoise
from fastdiff.dynamic.guidance import GuidedUNet
from fastdiff.dynamic.loop import SampleResult, SampleState, resume, sample
from fastdiff.dynamic.presets import default_scheduler, resolve_steps

__all__ = ["FastdiffRecord", "RefineState", "FastdiffPipelineMixin"]


@dataclass
class FastdiffRecord:
    """What fastdiff did in one pipeline call (``output.fastdiff``).

    nfe: U-Net calls (a guided call on a doubled batch counts once), draft model included.
    steps: scheduler steps run per image; num_steps: each image's schedule length.
    reason: why this many steps (fixed, preset, auto table row, early stop, draft).
    timings: seconds for "prepare" (prompt encoding etc.), "draft", "denoise", "decode", "total".
    state: for ``preview_steps``, the resumable state to pass to ``pipe.refine``.
    trace: the sampling loop's per-step records (see :meth:`trace_table`).
    """

    mode: str
    nfe: int
    steps: list[int]
    num_steps: list[int]
    reason: str
    timings: dict[str, float]
    stopped_early: list[bool] = field(default_factory=list)
    nfe_per_sample: list[int] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    state: RefineState | None = None
    trace: list = field(default_factory=list, repr=False)  # fastdiff.dynamic.StepRecord per tick

    def trace_table(self) -> dict[str, torch.Tensor]:
        """Per-step, per-image ``t``, ``sigma``, ``x0_change``, ``active`` and ``nfe`` as tensors."""
        return SampleResult.trace_table(self)


@dataclass
class RefineState:
    """A paused pipeline run: pass to ``pipe.refine(state)`` to continue to the final image."""

    sample_state: SampleState
    decode_kwargs: dict
    record: FastdiffRecord
    unet_calls_before: int


class _Captured(Exception):
    """Raised by the U-Net pre-hook to stop diffusers' loop at its first evaluation."""


@dataclass
class _Capture:
    latents: torch.Tensor
    unet_kwargs: dict
    encoder_hidden_states: torch.Tensor
    do_cfg: bool
    guidance_scale: float
    guidance_rescale: float
    scheduler: object
    start_step: int
    seconds: float


class _CallCounter:
    """Counts forward calls of a module (NFE) through a forward pre-hook."""

    def __init__(self, module):
        self.count = 0
        self._handle = module.register_forward_pre_hook(self._hook)

    def _hook(self, module, args):
        self.count += 1

    def remove(self):
        self._handle.remove()


FASTDIFF_KEYWORDS = ("steps", "early_stop", "draft", "preview_steps")


class FastdiffPipelineMixin:
    """Adds ``steps``, ``early_stop``, ``draft`` and ``preview_steps`` to a diffusers pipeline's ``__call__``,
    and :meth:`refine`. Mixed in before the diffusers class, so ``from_pretrained``/``from_pipe`` and every
    other method are diffusers' own."""

    _fastdiff_text_to_image = True  # img2img variants set False (no auto steps / draft there)

    # ------------------------------------------------------------------ public API
    def __call__(
        self, *args, steps=None, early_stop=None, draft=None, preview_steps: int | None = None, **kwargs
    ):
        controller = EarlyStop.coerce(early_stop)
        if steps is None and controller is None and draft is None and preview_steps is None:
            return self._fastdiff_passthrough(args, kwargs)
        return self._fastdiff_call(args, kwargs, steps, controller, draft, preview_steps)

    def refine(
        self,
        state: RefineState,
        *,
        preview_steps: int | None = None,
        output_type: str | None = None,
        return_dict: bool | None = None,
    ):
        """Continue a run started with ``preview_steps``; the final image equals an uninterrupted run.

        ``preview_steps`` pauses again after that many more steps (another preview). ``output_type`` and
        ``return_dict`` default to those of the original call.
        """
        if not isinstance(state, RefineState):
            raise TypeError(
                f"refine() needs output.fastdiff.state from a preview call, got {type(state).__name__}"
            )
        if state.sample_state.tracks and all(tr.done for tr in state.sample_state.tracks):
            raise ValueError("this run has already been refined to the end")
        _check_preview_steps(preview_steps)
        decode_kwargs = dict(state.decode_kwargs)
        if output_type is not None:
            decode_kwargs["output_type"] = output_type
        if return_dict is not None:
            decode_kwargs["return_dict"] = return_dict
        counter = _CallCounter(self.unet)
        t0 = time.perf_counter()
        try:
            with torch.no_grad():
                result = resume(state.sample_state, stop_after=preview_steps)
        finally:
            counter.remove()
        denoise = time.perf_counter() - t0
        record = copy.copy(state.record)
        record.timings = dict(record.timings)
        record.timings["denoise"] = record.timings.get("denoise", 0.0) + denoise
        return self._fastdiff_finish(result, record, decode_kwargs, extra_nfe=state.unet_calls_before)

    # ------------------------------------------------------------------ passthrough
    def _fastdiff_passthrough(self, args, kwargs):
        counter = _CallCounter(self.unet)
        t0 = time.perf_counter()
        try:
            output = super().__call__(*args, **kwargs)
        finally:
            counter.remove()
        total = time.perf_counter() - t0
        n = getattr(self, "_num_timesteps", None) or kwargs.get("num_inference_steps", 50)
        batch = _output_batch(output)
        record = FastdiffRecord(
            mode="diffusers",
            nfe=counter.count,
            steps=[int(n)] * batch,
            num_steps=[int(n)] * batch,
            reason="no fastdiff keyword: diffusers' own loop",
            timings={"total": total},
            stopped_early=[False] * batch,
            nfe_per_sample=[counter.count] * batch,
        )
        return self._fastdiff_attach(output, record)

    # ------------------------------------------------------------------ fastdiff path
    def _fastdiff_call(self, args, kwargs, steps, controller, draft, preview_steps):
        _check_preview_steps(preview_steps)
        if kwargs.get("callback_on_step_end") is not None or kwargs.get("callback") is not None:
            raise ValueError(
                "callback_on_step_end/callback cannot be combined with fastdiff keywords (steps, early_stop, "
                "draft, preview_steps): fastdiff runs its own loop; call without them to use diffusers' loop"
            )
        if kwargs.get("denoising_end") is not None:
            raise ValueError("denoising_end (SDXL base+refiner) cannot be combined with fastdiff keywords")
        output_type = kwargs.pop("output_type", "pil")
        return_dict = kwargs.pop("return_dict", True)
        if output_type not in ("pil", "np", "pt", "latent"):
            raise ValueError(f"output_type must be 'pil', 'np', 'pt' or 'latent', got {output_type!r}")

        scheduler = self.scheduler
        auto = None
        if steps is not None:
            if kwargs.get("num_inference_steps") is not None:
                raise ValueError("pass either steps= or num_inference_steps=, not both")
            n, reason = resolve_steps(steps)
            if n == "auto" or isinstance(steps, str):
                scheduler = default_scheduler(like=self.scheduler)
            if n == "auto":
                if not self._fastdiff_text_to_image:
                    raise ValueError("steps='auto' is available for text-to-image pipelines only")
                auto = AutoSteps()
                n = auto.max_steps
                reason = "auto steps per image"
        else:
            n = kwargs.pop("num_inference_steps", None) or 50
            reason = f"fixed: {n} steps (num_inference_steps)"
        kwargs.pop("num_inference_steps", None)
        if auto is not None:
            auto = auto.with_prompts(_prompt_of(args, kwargs))

        draft_spec = _DraftSpec.coerce(draft) if draft is not None else None
        if draft_spec is not None:
            if not self._fastdiff_text_to_image:
                raise ValueError("draft= is available for text-to-image pipelines only")
            if auto is not None:
                raise ValueError("draft= cannot be combined with steps='auto'")

        cap = self._fastdiff_capture(args, kwargs, n, scheduler)
        model_fn = GuidedUNet(
            self.unet,
            cap.latents.shape[0],
            cap.encoder_hidden_states,
            guidance_scale=cap.guidance_scale,
            do_cfg=cap.do_cfg,
            guidance_rescale=cap.guidance_rescale,
            unet_kwargs=cap.unet_kwargs,
        )
        generator = kwargs.get("generator")
        step_kwargs = {"eta": kwargs.get("eta", 0.0)}
        timings = {"prepare": cap.seconds}
        draft_calls = 0
        counter = _CallCounter(self.unet)
        try:
            with torch.no_grad():
                if draft_spec is not None:
                    t0 = time.perf_counter()
                    x0_draft, draft_calls, draft_steps = self._fastdiff_draft(draft_spec, args, kwargs, cap)
                    timings["draft"] = time.perf_counter() - t0
                    noise = _randn_like(cap.latents, generator)
                    x_t, start, refine_steps = renoise(x0_draft, cap.scheduler, n, draft_spec.strength, noise)
                    reason = (
                        f"draft: {draft_steps} LCM step(s), x0 re-noised to strength {draft_spec.strength}, "
                        f"then {refine_steps} of {n} steps of the main model"
                    )
                    if refine_steps == 0:
                        raise ValueError(f"draft strength {draft_spec.strength} leaves no refine step of {n}")
                    latents, start_step, num = x_t, start, n
                else:
                    latents, start_step = cap.latents, cap.start_step
                    num = auto if auto is not None else None
                t0 = time.perf_counter()
                result = sample(
                    model_fn,
                    latents,
                    scheduler=cap.scheduler,
                    num_inference_steps=num,
                    controller=controller,
                    generator=generator,
                    step_kwargs=step_kwargs,
                    start_step=0 if isinstance(num, AutoSteps) else start_step,
                    stop_after=preview_steps,
                )
                timings["denoise"] = time.perf_counter() - t0
        finally:
            counter.remove()
        if controller is not None:
            reason += f"; early stop {controller!r}"
        record = FastdiffRecord(
            mode="fastdiff",
            nfe=0,
            steps=[],
            num_steps=[],
            reason=reason,
            timings=timings,
        )
        decode_kwargs = {"output_type": output_type, "return_dict": return_dict, "generator": generator}
        return self._fastdiff_finish(result, record, decode_kwargs, extra_nfe=draft_calls)

    def _fastdiff_finish(self, result, record, decode_kwargs, extra_nfe: int):
        t0 = time.perf_counter()
        with torch.no_grad():
            output = self._fastdiff_decode(result.latents, **decode_kwargs)
        record.timings["decode"] = time.perf_counter() - t0
        record.timings["total"] = sum(v for k, v in record.timings.items() if k in _TIMED)
        record.nfe = result.nfe + extra_nfe
        record.nfe_per_sample = [n + extra_nfe for n in result.nfe_per_sample]
        record.steps = result.steps_run
        record.num_steps = result.num_steps
        record.stopped_early = result.stopped_early
        record.notes = [n for n in result.notes]
        record.trace = result.trace
        if any(record.notes):
            record.reason = record.reason + " | " + " | ".join(dict.fromkeys(n for n in record.notes if n))
        if result.state is not None:
            record.state = RefineState(result.state, decode_kwargs, copy.copy(record), extra_nfe)
        else:
            record.state = None
        return self._fastdiff_attach(output, record)

    def _fastdiff_attach(self, output, record):
        self.fastdiff_record = record  # also reachable when return_dict=False returns a tuple
        if not isinstance(output, tuple):
            output.fastdiff = record
        return output

    # ------------------------------------------------------------------ capture
    @contextmanager
    def _fastdiff_swapped_scheduler(self, scheduler):
        if scheduler is self.scheduler:
            yield
            return
        original = self.scheduler
        self.scheduler = scheduler
        try:
            yield
        finally:
            self.scheduler = original

    def _fastdiff_capture(self, args, kwargs, num_inference_steps, scheduler) -> _Capture:
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
        handle = self.unet.register_forward_pre_hook(pre_hook, with_kwargs=True)
        bar_config = getattr(self, "_progress_bar_config", None)
        self._progress_bar_config = {**(bar_config or {}), "disable": True}  # the aborted loop's bar is noise
        try:
            with self._fastdiff_swapped_scheduler(scheduler), torch.no_grad():
                super().__call__(
                    *args, num_inference_steps=num_inference_steps, output_type="latent", **kwargs
                )
        except _Captured:
            pass
        finally:
            handle.remove()
            del scheduler.scale_model_input
            if bar_config is None:
                del self._progress_bar_config
            else:
                self._progress_bar_config = bar_config
        if "kwargs" not in box:
            raise RuntimeError(
                "the diffusers pipeline returned without evaluating its U-Net (zero denoising steps?); "
                "check num_inference_steps and strength"
            )
        unet_kwargs = dict(box["kwargs"])
        unet_kwargs.pop("return_dict", None)
        model_input = box["args"][0] if box["args"] else unet_kwargs.pop("sample")
        ehs = unet_kwargs.pop("encoder_hidden_states")
        do_cfg = bool(self.do_classifier_free_guidance)
        state = box.get("state", model_input)
        latents = state.chunk(2)[0] if do_cfg else state
        # where diffusers started (img2img skips the first steps; not every scheduler has begin_index)
        t_first = box["args"][1] if len(box["args"]) > 1 else unet_kwargs.pop("timestep")
        order = getattr(scheduler, "order", 1)
        begin = getattr(scheduler, "begin_index", None) or 0
        timesteps = scheduler.timesteps
        hits = (timesteps[begin:].to(torch.as_tensor(t_first).device) == t_first).nonzero().flatten()
        if len(hits):
            begin += int(hits[0])
        return _Capture(
            latents=latents.clone(),
            unet_kwargs=unet_kwargs,
            encoder_hidden_states=ehs,
            do_cfg=do_cfg,
            guidance_scale=float(self.guidance_scale),
            guidance_rescale=float(getattr(self, "guidance_rescale", 0.0) or 0.0),
            scheduler=scheduler,
            start_step=begin // order,
            seconds=time.perf_counter() - t0,
        )

    # ------------------------------------------------------------------ draft
    def _fastdiff_draft(self, spec, args, kwargs, cap):
        """Run the LCM draft; returns (x0, U-Net calls, steps)."""
        draft_pipe = spec.pipeline_for(self)
        draft_kwargs = {
            k: v
            for k, v in kwargs.items()
            if k in ("prompt", "height", "width", "num_images_per_prompt", "generator", "prompt_embeds")
        }
        guidance = spec.guidance_scale
        if guidance is None:
            # a full LCM takes guidance as a U-Net input (time_cond_proj_dim): give it the call's scale;
            # an LCM-LoRA'd U-Net runs without CFG (its recommended scale is 1-2)
            embedded = getattr(draft_pipe.unet.config, "time_cond_proj_dim", None) is not None
            guidance = float(kwargs.get("guidance_scale", 7.5)) if embedded else 1.0
        draft_kwargs["guidance_scale"] = guidance
        counter = _CallCounter(draft_pipe.unet)
        try:
            out = draft_pipe(
                *args[:1],
                num_inference_steps=spec.steps,
                latents=cap.latents / getattr(cap.scheduler, "init_noise_sigma", 1.0),
                output_type="latent",
                **draft_kwargs,
            )
        finally:
            counter.remove()
        x0 = out.images if hasattr(out, "images") else out[0]
        return x0.to(cap.latents.dtype), counter.count, spec.steps


_TIMED = ("prepare", "draft", "denoise", "decode")


@dataclass
class _DraftSpec:
    model: object
    # 0.5: on fastdiff-tiny the 30-step run's attribute accuracy at 2.9x its speed; 0.3 was 4.6x faster but
    # lost 17 points of accuracy (benchmarks/results/dynamic_steps_draft.md)
    strength: float = 0.5
    steps: int = 4
    guidance_scale: float | None = None

    @classmethod
    def coerce(cls, value) -> _DraftSpec:
        if isinstance(value, dict):
            unknown = set(value) - {"model", "strength", "steps", "guidance_scale"}
            if unknown or "model" not in value:
                raise ValueError(
                    f"draft dict needs 'model' and accepts strength, steps, guidance_scale; got keys {sorted(value)}"
                )
            spec = cls(**value)
        elif isinstance(value, tuple):
            if len(value) != 2:
                raise ValueError("draft tuple must be (model, strength)")
            spec = cls(model=value[0], strength=value[1])
        else:
            spec = cls(model=value)
        if not (hasattr(spec.model, "unet") or _is_unet(spec.model)):
            raise TypeError(
                "draft model must be an LCM pipeline or an LCM UNet2DConditionModel, "
                f"got {type(spec.model).__name__}"
            )
        if not isinstance(spec.strength, (int, float)) or not 0.0 < spec.strength <= 1.0:
            raise ValueError(f"draft strength must be in (0, 1], got {spec.strength!r}")
        if not isinstance(spec.steps, int) or not 1 <= spec.steps <= 8:
            raise ValueError(f"draft steps must be an int in [1, 8] (LCM uses 1-4), got {spec.steps!r}")
        return spec

    def pipeline_for(self, pipe):
        """The draft as a pipeline: as given, or ``pipe``'s components with the LCM U-Net and an LCMScheduler."""
        if hasattr(self.model, "unet"):
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


def _is_unet(obj) -> bool:
    return hasattr(obj, "config") and hasattr(obj.config, "in_channels") and callable(obj)


def _check_preview_steps(preview_steps):
    if preview_steps is not None and (
        not isinstance(preview_steps, int) or isinstance(preview_steps, bool) or preview_steps < 1
    ):
        raise ValueError(f"preview_steps must be an int >= 1, got {preview_steps!r}")


def _prompt_of(args, kwargs):
    prompt = args[0] if args else kwargs.get("prompt")
    n = kwargs.get("num_images_per_prompt") or 1
    if isinstance(prompt, str):
        return [prompt] * n
    if isinstance(prompt, (list, tuple)):
        return [p for p in prompt for _ in range(n)]
    return None


def _randn_like(x: torch.Tensor, generator) -> torch.Tensor:
    from diffusers.utils.torch_utils import randn_tensor

    return randn_tensor(x.shape, generator=generator, device=x.device, dtype=x.dtype)


def _output_batch(output) -> int:
    images = output[0] if isinstance(output, tuple) else output.images
    return len(images)
