"""Draft with a fast model, then refine with the main model (SDEdit, Meng et al. 2022).

A latent consistency model (Luo et al. 2023) maps noise to a plausible image in 1-4 evaluations, but its
details are soft. Its x0 is re-noised to a fraction ``strength`` of the main schedule,
x_t = alpha_t x0 + sigma_t eps (the forward process, Ho et al. 2020 eq. 4), and the main model runs only
the last ``int(N * strength)`` steps.

Only the draft's x0 (``denoised``) is handed over: LCM re-noises between its own steps with its own
schedule, and its intermediate ``prev_sample`` is not a valid state for another model's solver.

:func:`draft_and_refine` is the one runner for this (the drop-in pipelines call it too): both runs go
through :func:`~fastdiff.dynamic.sample`, the refinement's NFE and trace continue the draft's count, and
the re-noising noise comes from the call's generator (:func:`noise_like`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch

from fastdiff._checks import is_int, is_number
from fastdiff.dynamic.loop import resume, sample
from fastdiff.dynamic.records import SampleResult

__all__ = ["renoise", "refine_steps", "draft_and_refine", "noise_like"]


def refine_steps(num_inference_steps: int, strength: float) -> int:
    """Steps of an N-step schedule left for the refinement: ``int(N * strength)``, as diffusers' img2img.

    Raises a ValueError naming both values when the strength is outside (0, 1] or leaves no step."""
    if not (is_number(strength) and 0.0 < strength <= 1.0):
        raise ValueError(f"strength must be in (0, 1], got {strength!r}")
    n = min(int(num_inference_steps * strength), num_inference_steps)
    if n == 0:
        raise ValueError(
            f"draft strength {strength} leaves no refine step of {num_inference_steps} "
            f"(int({num_inference_steps} * {strength}) = 0); use strength >= {1 / num_inference_steps:.3g} "
            "or more steps"
        )
    return n


def renoise(x0: torch.Tensor, scheduler, num_inference_steps: int, strength: float, noise: torch.Tensor):
    """Noise x0 to where a ``strength`` fraction of an N-step schedule remains.

    Returns (x_t, start_step, refine_steps); like diffusers' img2img, ``refine_steps = int(N * strength)``
    (:func:`refine_steps`, which raises when that leaves no step). ``scheduler`` is copied, not mutated.
    """
    n_refine = refine_steps(num_inference_steps, strength)
    if noise.shape != x0.shape:
        raise ValueError(f"noise shape {tuple(noise.shape)} differs from x0 shape {tuple(x0.shape)}")
    sch = copy.deepcopy(scheduler)
    sch.set_timesteps(num_inference_steps, device=x0.device)
    first = num_inference_steps - n_refine
    t = sch.timesteps[first * getattr(sch, "order", 1)]
    x_t = sch.add_noise(x0, noise, torch.as_tensor(t).reshape(1))
    return x_t, first, n_refine


def noise_like(x: torch.Tensor, generator=None) -> torch.Tensor:
    """Standard normal noise shaped like ``x``, drawn as diffusers' ``randn_tensor`` draws it: on the
    generator's device, one draw per row when ``generator`` is a per-row list."""
    if isinstance(generator, list):
        rows = [
            torch.randn((1, *x.shape[1:]), generator=g, device=g.device, dtype=x.dtype) for g in generator
        ]
        return torch.cat(rows).to(x.device)
    device = generator.device if generator is not None else x.device
    return torch.randn(x.shape, generator=generator, device=device, dtype=x.dtype).to(x.device)


def draft_and_refine(
    draft_fn: Callable,
    model_fn: Callable,
    latents: torch.Tensor,
    *,
    draft_scheduler,
    draft_steps: int,
    scheduler,
    num_inference_steps: int,
    strength: float,
    noise: torch.Tensor | None = None,
    generator=None,
    controller=None,
    step_kwargs: dict | None = None,
    stop_after: int | None = None,
    callback: Callable | None = None,
    on_rows_retired: Callable | None = None,
) -> SampleResult:
    """Draft with ``draft_fn`` (an LCM) on ``draft_scheduler`` (an LCMScheduler), re-noise its x0 to
    ``strength`` and finish with ``model_fn`` on ``scheduler``.

    ``strength`` is checked before the draft runs. ``noise`` defaults to :func:`noise_like` with
    ``generator``, drawn after the draft. The result is the refinement's; its ``nfe``,
    ``nfe_per_sample``, trace and ``seconds`` continue the draft's, and ``result.draft`` is the draft run.
    ``controller``, ``step_kwargs``, ``stop_after``, ``callback`` and ``on_rows_retired`` apply to the
    refinement as in :func:`~fastdiff.dynamic.sample`; a paused refinement resumes with
    :func:`~fastdiff.dynamic.resume`.
    """
    if not (is_int(draft_steps) and draft_steps >= 1):
        raise ValueError(f"draft_steps must be an int >= 1 (LCM uses 1-4), got {draft_steps!r}")
    refine_steps(num_inference_steps, strength)
    draft = sample(
        draft_fn, latents, scheduler=draft_scheduler, num_inference_steps=draft_steps, generator=generator
    )
    x0 = draft.latents  # an LCM's last step returns its denoised x0
    if noise is None:
        noise = noise_like(x0, generator)
    x_t, first, _ = renoise(x0, scheduler, num_inference_steps, strength, noise)
    # set the refinement up paused before its first step, so that it counts on from the draft, then run it
    state = sample(
        model_fn,
        x_t,
        scheduler=scheduler,
        num_inference_steps=num_inference_steps,
        start_step=first,
        controller=controller,
        generator=generator,
        step_kwargs=step_kwargs,
        stop_after=0,
        callback=callback,
        on_rows_retired=on_rows_retired,
    ).state
    state.nfe += draft.nfe
    state.nfe_per_sample = [a + b for a, b in zip(state.nfe_per_sample, draft.nfe_per_sample)]
    state.seconds += draft.seconds
    state.draft = draft
    return resume(state, stop_after=stop_after)
