"""LCM draft, then refine with the main model (SDEdit, Meng et al. 2022).

A latent consistency model (Luo et al. 2023) maps noise to a plausible image in 1-4 evaluations, but its
details are soft. Its x0 is re-noised to a fraction ``strength`` of the main schedule,
x_t = alpha_t x0 + sigma_t eps (the forward process, Ho et al. 2020 eq. 4), and the main model runs only
the last ``int(N * strength)`` steps.

Only the draft's x0 (``denoised``) is handed over: LCM re-noises between its own steps with its own
schedule, and its intermediate ``prev_sample`` is not a valid state for another model's solver.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch

from fastdiff.dynamic.loop import SampleResult, sample

__all__ = ["renoise", "draft_and_refine"]


def renoise(x0: torch.Tensor, scheduler, num_inference_steps: int, strength: float, noise: torch.Tensor):
    """Noise x0 to where a ``strength`` fraction of an N-step schedule remains.

    Returns (x_t, start_step, refine_steps); like diffusers' img2img, ``refine_steps = int(N * strength)``.
    ``scheduler`` is copied, not mutated.
    """
    if not 0.0 < strength <= 1.0:
        raise ValueError(f"strength must be in (0, 1], got {strength}")
    if noise.shape != x0.shape:
        raise ValueError(f"noise shape {tuple(noise.shape)} differs from x0 shape {tuple(x0.shape)}")
    sch = copy.deepcopy(scheduler)
    sch.set_timesteps(num_inference_steps, device=x0.device)
    refine_steps = min(int(num_inference_steps * strength), num_inference_steps)
    start = num_inference_steps - refine_steps
    if refine_steps == 0:
        return x0, start, 0
    t = sch.timesteps[start * getattr(sch, "order", 1)]
    x_t = sch.add_noise(x0, noise, torch.as_tensor(t).reshape(1))
    return x_t, start, refine_steps


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
    generator: torch.Generator | None = None,
    controller=None,
) -> SampleResult:
    """Draft with ``draft_fn`` (an LCM) on ``draft_scheduler`` (an LCMScheduler), re-noise its x0 to
    ``strength`` and finish with ``model_fn`` on ``scheduler``.

    The returned result is the refinement's, with the draft's evaluations added to ``nfe`` /
    ``nfe_per_sample`` and the draft run itself in ``result.draft``.
    """
    if not isinstance(draft_steps, int) or draft_steps < 1:
        raise ValueError(f"draft_steps must be an int >= 1 (LCM uses 1-4), got {draft_steps!r}")
    draft = sample(
        draft_fn, latents, scheduler=draft_scheduler, num_inference_steps=draft_steps, generator=generator
    )
    x0 = draft.latents  # an LCM's last step returns its denoised x0
    if noise is None:
        noise = torch.randn(x0.shape, generator=generator, dtype=x0.dtype, device="cpu").to(x0.device)
    x_t, start, refine_steps = renoise(x0, scheduler, num_inference_steps, strength, noise)
    if refine_steps == 0:
        result = draft
    else:
        result = sample(
            model_fn,
            x_t,
            scheduler=scheduler,
            num_inference_steps=num_inference_steps,
            start_step=start,
            controller=controller,
            generator=generator,
        )
        result.nfe += draft.nfe
        result.nfe_per_sample = [a + b for a, b in zip(result.nfe_per_sample, draft.nfe_per_sample)]
        result.seconds += draft.seconds
    result.draft = draft
    return result
