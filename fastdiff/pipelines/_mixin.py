"""The drop-in pipelines' adapter between diffusers' ``__call__`` and fastdiff's sampling runner.

A call with fastdiff keywords is three steps, each in its own module:

1. **plan** (:mod:`~fastdiff.pipelines.plan`): validate the keywords and decide steps, sampler, planner,
   controller, draft and preview, before anything runs;
2. **capture** (:mod:`~fastdiff.pipelines.capture`): diffusers' own ``__call__`` prepares the latents and
   conditioning and is stopped at its first U-Net evaluation;
3. **run and decode**: :func:`fastdiff.dynamic.sample` (or :func:`~fastdiff.dynamic.draft_and_refine` for a
   draft) denoises; the final x0 is decoded as the diffusers pipeline would (``_fastdiff_decode``).

A call without fastdiff keywords is passed to diffusers unchanged; only the ``fastdiff`` record (NFE,
timings) is attached to its output. Records are in :mod:`~fastdiff.pipelines.records`.
"""

from __future__ import annotations

import copy
import time

import torch

from fastdiff.caching.pipeline import begin_call, finish_call
from fastdiff.dynamic.checks import check_can_jump
from fastdiff.dynamic.draft import draft_and_refine
from fastdiff.dynamic.loop import resume, sample
from fastdiff.dynamic.presets import default_scheduler
from fastdiff.pipelines.capture import capture_inputs
from fastdiff.pipelines.checks import (
    check_call_kwargs,
    check_eta,
    check_known_kwargs,
    check_latents,
    check_output_type,
    check_preview_steps,
)
from fastdiff.pipelines.plan import CallPlan, check_default_sampler_fits, plan_call
from fastdiff.pipelines.records import FastdiffRecord, Producer, RefineState
from fastdiff.pipelines.unet_calls import UNetCalls

__all__ = ["FastdiffPipelineMixin"]

_TIMED = ("prepare", "draft", "denoise", "decode")


class FastdiffPipelineMixin:
    """Adds ``steps``, ``early_stop``, ``draft`` and ``preview_steps`` to a diffusers pipeline's ``__call__``,
    and :meth:`refine`. Mixed in before the diffusers class, so ``from_pretrained``/``from_pipe`` and every
    other method are diffusers' own. A subclass provides ``_fastdiff_decode(latents, output_type,
    return_dict, generator)``."""

    _fastdiff_text_to_image = True  # img2img variants set False (no auto steps / draft there)
    # Integration point for per-row U-Net caches: called as fastdiff.dynamic.sample's on_rows_retired with
    # the image rows still running whenever images leave the batch (early stop, different step counts).
    # With guidance the U-Net batch is [uncond rows; cond rows], i.e. rows and rows + batch_size.
    fastdiff_on_rows_retired = None

    @classmethod
    def from_pipe(cls, pipeline, **kwargs):
        """diffusers' ``from_pipe``, refusing anything that is not a loaded pipeline (a model id, say)."""
        from diffusers import DiffusionPipeline

        if not isinstance(pipeline, DiffusionPipeline):
            raise TypeError(
                f"from_pipe needs a loaded diffusers pipeline, got {type(pipeline).__name__} {pipeline!r}; "
                "to load by model id or path use from_pretrained"
            )
        return super().from_pipe(pipeline, **kwargs)

    def __call__(
        self, *args, steps=None, early_stop=None, draft=None, preview_steps: int | None = None, **kwargs
    ):
        """diffusers' ``__call__`` with fastdiff's keywords (see the class docstring for ``steps``,
        ``early_stop``, ``draft`` and ``preview_steps``). Every argument is checked before any model runs;
        a failed call leaves the pipeline as it was and ``fastdiff_record`` None.

        Conventions kept from diffusers on purpose (documented here instead of raising):

        * ``guidance_scale <= 1`` disables classifier-free guidance: one U-Net evaluation per step and
          ``negative_prompt`` unused. An LCM U-Net with ``time_cond_proj_dim`` takes the scale as an input.
        * ``height``/``width`` None means the U-Net's ``sample_size`` times the VAE's scale factor.
        * img2img runs the last ``int(num_inference_steps * strength)`` steps of the schedule; ``steps=``
          counts the full schedule the same way.
        * ``num_images_per_prompt`` copies are laid out prompt-major.
        * ``output_type="latent"`` returns the latents undecoded and skips the safety checker.
        * ``steps`` presets and ``"auto"`` run fastdiff's default sampler for that call only (refused on
          an LCM student: LCM scheduler or distilled U-Net);
          ``pipe.scheduler`` runs otherwise and is never changed.

        Departures from diffusers: ``eta`` other than 0 raises where the scheduler that runs would drop
        it; empty prompt lists, non-positive sizes and counts, non-finite guidance and more than 1000
        steps raise instead of failing late or silently; so does a keyword that neither fastdiff nor the
        diffusers pipeline names (diffusers ignores it).
        """
        self.fastdiff_record = None  # a failed call must not leave the previous call's record behind
        check_known_kwargs(super().__call__, FastdiffPipelineMixin.__call__, kwargs)
        check_call_kwargs(args, kwargs)
        if self._fastdiff_text_to_image:
            check_latents(self, args, kwargs)
        plan = plan_call(
            args,
            kwargs,
            steps=steps,
            early_stop=early_stop,
            draft=draft,
            preview_steps=preview_steps,
            text_to_image=self._fastdiff_text_to_image,
        )
        runs = self.scheduler
        if plan is not None and plan.use_default_sampler:
            check_default_sampler_fits(self, steps)
            runs = default_scheduler(like=self.scheduler)
        check_eta(kwargs, runs)
        if plan is None:
            return self._fastdiff_passthrough(args, kwargs)
        check_can_jump(plan.controller, runs)  # before diffusers' preparation runs the text encoder
        return self._fastdiff_run(plan, runs)

    def refine(
        self,
        state: RefineState,
        *,
        preview_steps: int | None = None,
        output_type: str | None = None,
        return_dict: bool | None = None,
    ):
        """Continue a run started with ``preview_steps``; the final image equals an uninterrupted run.

        ``state`` is not changed: refining the same preview again gives the same result. ``preview_steps``
        pauses again after that many more steps (another preview, with its own state). ``output_type`` and
        ``return_dict`` default to those of the original call. Only the pipeline that made the preview,
        with the same U-Net and VAE, may refine it (ValueError otherwise).
        """
        self.fastdiff_record = None  # a failed refine must not leave the previous call's record behind
        if not isinstance(state, RefineState):
            raise TypeError(
                f"refine() needs output.fastdiff.state from a preview call, got {type(state).__name__}"
            )
        state.check_refiner(self)
        check_preview_steps(preview_steps)
        decode_kwargs = dict(state.decode_kwargs)
        if output_type is not None:
            check_output_type(output_type)
            decode_kwargs["output_type"] = output_type
        if return_dict is not None:
            if not isinstance(return_dict, bool):
                raise TypeError(f"return_dict must be True, False or None, got {return_dict!r}")
            decode_kwargs["return_dict"] = return_dict
        t0 = time.perf_counter()
        with torch.no_grad():
            result = resume(state.sample_state.copy(), stop_after=preview_steps)
        timings = dict(state.record.timings)
        timings["denoise"] = timings.get("denoise", 0.0) + time.perf_counter() - t0
        return self._fastdiff_finish(result, state.reason, timings, decode_kwargs)

    # ------------------------------------------------------------------ the two paths
    def _fastdiff_passthrough(self, args, kwargs):
        t0 = time.perf_counter()
        with UNetCalls(self.unet) as counter:
            output = super().__call__(*args, **kwargs)
        total = time.perf_counter() - t0
        n = getattr(self, "_num_timesteps", None) or kwargs.get("num_inference_steps", 50)
        batch = len(output[0] if isinstance(output, tuple) else output.images)
        record = FastdiffRecord(
            mode="diffusers",
            nfe=counter.calls,
            steps=[int(n)] * batch,
            num_steps=[int(n)] * batch,
            reason="no fastdiff keyword: diffusers' own loop",
            timings={"total": total},
            stopped_early=[False] * batch,
            nfe_per_sample=[counter.calls] * batch,
            step_cache=finish_call(self),
        )
        return self._fastdiff_attach(output, record)

    def _fastdiff_run(self, plan: CallPlan, scheduler):
        main = capture_inputs(self, plan.args, plan.kwargs, plan.num_inference_steps, scheduler)
        timings = {"prepare": main.seconds}
        options = dict(
            controller=plan.controller,
            generator=plan.generator,
            step_kwargs={"eta": plan.kwargs.get("eta", 0.0)},
            stop_after=plan.preview_steps,
            on_rows_retired=self.fastdiff_on_rows_retired,
        )
        t0 = time.perf_counter()
        with torch.no_grad():
            if plan.draft is not None:
                draft_pipe = plan.draft.pipeline_for(self)
                init_sigma = getattr(main.scheduler, "init_noise_sigma", 1.0)
                draft = capture_inputs(
                    draft_pipe,
                    plan.args[:1],
                    {**plan.draft.call_kwargs(plan.kwargs, draft_pipe), "latents": main.latents / init_sigma},
                    plan.draft.steps,
                    draft_pipe.scheduler,
                )
                result = draft_and_refine(
                    draft.model_fn,
                    main.model_fn,
                    draft.latents,
                    draft_scheduler=draft.scheduler,
                    draft_steps=plan.draft.steps,
                    scheduler=main.scheduler,
                    num_inference_steps=plan.num_inference_steps,
                    strength=plan.draft.strength,
                    **options,
                )
                timings["draft"] = draft.seconds + result.draft.seconds
            else:
                if plan.planner is None:  # one schedule for every row: the step cache can see where it ends
                    begin_call(self, main.scheduler.timesteps[main.start_step :])
                try:
                    result = sample(
                        main.model_fn,
                        main.latents,
                        scheduler=main.scheduler,
                        num_inference_steps=plan.planner,
                        start_step=0 if plan.planner is not None else main.start_step,
                        **options,
                    )
                except BaseException:
                    finish_call(self)  # a step cache forgets the failed run's features and schedule
                    raise
        timings["denoise"] = time.perf_counter() - t0 - timings.get("draft", 0.0)
        decode_kwargs = dict(
            output_type=plan.output_type, return_dict=plan.return_dict, generator=plan.generator
        )
        return self._fastdiff_finish(result, plan.reason, timings, decode_kwargs)

    def _fastdiff_finish(self, result, reason: str, timings: dict, decode_kwargs: dict):
        """Decode ``result`` and attach its record; a paused run's state is marked as made by this pipeline
        (see :meth:`RefineState.check_refiner`)."""
        t0 = time.perf_counter()
        with torch.no_grad():
            output = self._fastdiff_decode(result.latents, **decode_kwargs)
        timings["decode"] = time.perf_counter() - t0
        timings["total"] = sum(v for k, v in timings.items() if k in _TIMED)
        notes = " | ".join(dict.fromkeys(n for n in result.notes if n))
        record = FastdiffRecord(
            mode="fastdiff",
            nfe=result.nfe,
            steps=result.steps_run,
            num_steps=result.num_steps,
            reason=f"{reason} | {notes}" if notes else reason,
            timings=timings,
            stopped_early=result.stopped_early,
            nfe_per_sample=list(result.nfe_per_sample),
            notes=list(result.notes),
            trace=result.trace,
            step_cache=finish_call(self, result.state),  # also re-arms the cache's rows hook
        )
        if result.state is not None:
            record.state = RefineState(
                result.state, decode_kwargs, copy.copy(record), Producer.of(self), reason=reason
            )
        return self._fastdiff_attach(output, record)

    def _fastdiff_attach(self, output, record: FastdiffRecord):
        self.fastdiff_record = record  # also reachable when return_dict=False returns a tuple
        if not isinstance(output, tuple):
            output.fastdiff = record
        return output
