"""The fastdiff sampling loop: one runner for fixed, early-stopped, planned, resumable and drafted sampling.

``sample(model_fn, latents, scheduler=..., num_inference_steps=...)`` runs any diffusers-compatible
scheduler (through :class:`~fastdiff.dynamic.adapters.SchedulerAdapter`) against a model function
``model_fn(x, t) -> prediction`` in the scheduler's ``prediction_type``. Compared with the loop inside a
diffusers pipeline it adds:

* **per-sample control.** A :class:`~fastdiff.dynamic.Controller` (e.g. ``EarlyStop``) may retire single
  rows; the model is then called on the remaining rows only. Each row that can leave early is driven by its
  own scheduler copy, so multistep solver history is never mixed between rows and a row's trajectory is
  exactly the one it would follow alone.
* **step planners.** A :class:`~fastdiff.dynamic.StepPlanner` (e.g. ``AutoSteps``) passed as
  ``num_inference_steps`` picks each row's schedule after a probe.
* **x0 everywhere.** Every step yields the data prediction x0. A row that stops early returns its x0
  prediction, never a still-noisy x_t.
* **pause and resume.** ``stop_after=k`` returns after k steps (0: before the first) with a resumable :class:`SampleState`;
  :func:`resume` continues it, bit-for-bit the same as an uninterrupted run.

One tick of the loop is three functions in :mod:`fastdiff.dynamic.tick`: ``evaluate`` (one batched model
call for every live row), ``step`` (scheduler steps, x0 and its change) and ``retire`` (the controller). Latents are the
scheduler's initial state, as a diffusers pipeline prepares them (noise times ``init_noise_sigma``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch

from fastdiff.dynamic.adapters import SchedulerAdapter, check_scheduler, check_step_kwargs
from fastdiff.dynamic.checks import check_can_jump, check_generator, check_stop_after, steps_per_row
from fastdiff.dynamic.protocols import Controller, StepChoice, StepPlanner
from fastdiff.dynamic.records import SampleResult
from fastdiff.dynamic.tick import RowsHook, SampleState, Track, notify, tick

__all__ = ["SampleState", "sample", "resume", "run"]

NONFINITE = ("raise", "warn")


# ----------------------------------------------------------------------------------------------------------
# public entry points
# ----------------------------------------------------------------------------------------------------------
def sample(
    model_fn: Callable,
    latents: torch.Tensor,
    *,
    scheduler,
    num_inference_steps: int | Sequence[int] | StepPlanner | None = None,
    controller: Controller | None = None,
    callback: Callable | None = None,
    generator=None,
    step_kwargs: dict | None = None,
    start_step: int = 0,
    stop_after: int | None = None,
    on_rows_retired: RowsHook | None = None,
    on_nonfinite: str = "raise",
) -> SampleResult:
    """Run a diffusion sampler, optionally with a per-sample controller or step planner.

    Args:
        model_fn: ``model_fn(x, t)`` returns the scheduler's prediction type for the VP-form input ``x``
            (already passed through ``scheduler.scale_model_input``). ``t`` is a scalar tensor, or a
            per-row vector when rows are at different timesteps. If it accepts a ``rows=`` keyword it
            receives the batch indices of the rows in ``x`` (needed to slice per-row conditioning once
            rows leave the batch); otherwise the model must treat rows independently.
        latents: initial state, (B, ...).
        scheduler: a diffusers-compatible scheduler; it is copied, never mutated. A
            :class:`~fastdiff.dynamic.adapters.SchedulerAdapter` is used as given (e.g. ``InPlaceAdapter``,
            which drives the caller's scheduler itself).
        num_inference_steps: int, a sequence of per-row ints, a :class:`~fastdiff.dynamic.StepPlanner`
            (e.g. ``AutoSteps``: chooses per row after a probe), or None to use ``scheduler``'s current
            timesteps as set by the caller (including ``set_begin_index``).
        controller: a :class:`~fastdiff.dynamic.Controller`, e.g. ``EarlyStop``; may retire rows early.
        callback: ``callback(record: StepRecord, x0: Tensor)`` after every tick; ``x0`` is (B, ...) with
            NaN rows for inactive samples.
        generator: torch.Generator or per-row list, forwarded to stochastic schedulers' ``step``.
        step_kwargs: extra keywords for ``scheduler.step``, e.g. ``{"eta": 0.5}`` for diffusers' DDIM. A key
            its ``step`` does not accept raises (``eta=0.0``, which diffusers pipelines always pass, is
            dropped where it does not apply).
        start_step: first step of the schedule to run (SDEdit/img2img: the latents are already noised to
            that step's timestep). With ``num_inference_steps=None`` and ``start_step=0`` the scheduler's
            ``begin_index`` (if set) decides.
        stop_after: pause after this many ticks and return a resumable state (progressive refinement).
        on_rows_retired: ``on_rows_retired(remaining)`` is called whenever rows leave the batch (a
            controller retired them or their schedule ended), with the ascending long tensor of the batch
            rows still running (empty when the last rows finish). The model's later calls cover exactly
            these rows, in this order (a subset right after a planner's probe, when a row's first
            evaluation is reused: the ``rows=`` keyword of ``model_fn`` says which). Use it to drop
            per-row caches. Not called during a planner's probe.
        on_nonfinite: ``"raise"`` (default): NaN/inf in a model output, x0 prediction or the latents after
            a step raises ``FloatingPointError`` naming the step index, t and the rows; ``"warn"`` warns
            once per run and continues. The check reads norms the loop computes anyway.

    A scheduler implementing :class:`~fastdiff.dynamic.adapters.SelfScheduling` (e.g.
    :class:`fastdiff.samplers.AdaptiveScheduler`) picks its own steps per row: pass
    ``num_inference_steps=None``. A controller may also reschedule a row (:class:`FastForward`).
    """
    # every argument is checked before the first model call; each message names what is valid (#16)
    if not isinstance(on_nonfinite, str) or on_nonfinite not in NONFINITE:
        raise ValueError(f"on_nonfinite must be one of {NONFINITE}, got {on_nonfinite!r}")
    if not callable(model_fn):
        raise TypeError(f"model_fn must be callable as model_fn(x, t), got {type(model_fn).__name__}")
    if not isinstance(latents, torch.Tensor) or latents.ndim < 2:
        raise TypeError("latents must be a torch.Tensor with a batch dimension first, e.g. (B, C, H, W)")
    if not torch.isfinite(latents).all():
        raise ValueError("latents contain NaN or inf; sampling would return NaN images")
    if callback is not None and not callable(callback):
        raise TypeError(f"callback must be callable(record, x0) or None, got {callback!r}")
    check_scheduler(scheduler)
    if controller is not None and not isinstance(controller, Controller):
        raise TypeError(
            f"controller must implement fastdiff.dynamic.Controller (reset, should_stop, decide), got {controller!r}"
        )
    if on_rows_retired is not None and not callable(on_rows_retired):
        raise TypeError(f"on_rows_retired must be callable(remaining_rows) or None, got {on_rows_retired!r}")
    if start_step < 0:
        raise ValueError(f"start_step must be >= 0, got {start_step}")
    check_stop_after(stop_after)
    check_generator(generator)
    batch = latents.shape[0]
    base = scheduler if isinstance(scheduler, SchedulerAdapter) else SchedulerAdapter(scheduler)
    check_step_kwargs(base.scheduler, {} if step_kwargs is None else step_kwargs)
    base.step_kwargs.update(step_kwargs or {})
    check_can_jump(controller, base.scheduler)
    if base.self_scheduling and num_inference_steps is not None:
        raise ValueError(
            f"{type(base.scheduler).__name__} chooses its own steps (from its tolerance); pass "
            f"num_inference_steps=None, got {num_inference_steps!r}"
        )
    if base.self_scheduling and start_step:
        raise ValueError(
            f"{type(base.scheduler).__name__} always starts at its largest sigma; got start_step={start_step}"
        )
    planner = num_inference_steps if isinstance(num_inference_steps, StepPlanner) else None
    counts = None if planner is not None else steps_per_row(num_inference_steps, batch)
    per_row = (
        controller is not None
        or planner is not None
        or base.self_scheduling  # every row picks its own noise levels
        or len(set(counts)) > 1  # rows with different step counts (no planner here)
    )
    if isinstance(generator, list) and len(generator) != batch:
        raise ValueError(f"got {len(generator)} generators for a batch of {batch}")

    state = SampleState(
        model_fn=model_fn,
        tracks=[],
        batch_size=batch,
        controller=controller,
        callback=callback,
        on_rows_retired=on_rows_retired,
        template=latents,
        nfe_per_sample=[0] * batch,
        steps_run=[0] * batch,
        notes=[""] * batch,
        live_rows=list(range(batch)),
        on_nonfinite=on_nonfinite,
    )
    prepared = {}  # step count -> (adapter with timesteps set, begin index); copied per track

    def make_track(rows, n, x):
        if n not in prepared:
            prepared[n] = base.prepared(n, latents.device, start_step)
        template, begin = prepared[n]
        adapter = template.copy()
        if begin >= len(adapter.timesteps):
            raise ValueError(
                f"start_step {start_step} leaves no steps of a {len(adapter.timesteps)}-step schedule"
            )
        gen = generator
        if isinstance(generator, list):
            gen = [generator[int(r)] for r in rows] if len(rows) > 1 else generator[int(rows[0])]
        return Track(rows=rows, adapter=adapter, pos=begin, start=begin, x=x, generator=gen)

    t0 = time.perf_counter()
    if planner is not None:
        _probe(state, planner, make_track, latents)
    elif per_row:
        state.tracks = [make_track(torch.tensor([r]), counts[r], latents[r : r + 1]) for r in range(batch)]
    else:
        state.tracks = [make_track(torch.arange(batch), counts[0], latents)]
    if controller is not None:
        controller.reset(batch)
    state.seconds += time.perf_counter() - t0
    return run(state, stop_after)


def resume(
    state: SampleState, *, stop_after: int | None = None, model_fn: Callable | None = None
) -> SampleResult:
    """Continue a paused run in place. With the same model this equals the uninterrupted run exactly.

    To continue the same preview more than once, resume ``state.copy()``."""
    if not isinstance(state, SampleState):
        raise TypeError(f"resume() needs the SampleState of a paused run, got {type(state).__name__}")
    if state.finished:
        raise ValueError("this sampling run has already finished; there is nothing to resume")
    check_stop_after(stop_after)
    if model_fn is not None:
        state.model_fn = model_fn
    return run(state, stop_after)


def _probe(state: SampleState, planner: StepPlanner, make_track, latents) -> None:
    """Run the planner's probe on per-row tracks, then put every row on its planned schedule."""
    batch = state.batch_size
    n_probe = planner.probe_schedule
    state.tracks = [make_track(torch.tensor([r]), n_probe, latents[r : r + 1]) for r in range(batch)]
    first_outputs = None
    for k in range(min(planner.probe_steps, min(len(tr.timesteps) - tr.pos for tr in state.tracks))):
        used = tick(state, probe=True)
        if k == 0:
            first_outputs = used
    choices = planner.choose(torch.cat([tr.x0 for tr in state.tracks]))
    if len(choices) != batch or not all(isinstance(c, StepChoice) for c in choices):
        raise TypeError(f"{type(planner).__name__}.choose() must return one StepChoice per row ({batch})")
    for r, choice in enumerate(choices):
        state.notes[r] = choice.reason
        tr = state.tracks[r]
        if choice.steps == n_probe:
            continue  # the probe ran the first steps of this very schedule: keep going
        fresh = make_track(tr.rows, choice.steps, latents[r : r + 1])
        if first_outputs is not None and bool(
            torch.as_tensor(fresh.timesteps[fresh.pos]) == torch.as_tensor(tr.timesteps[tr.start])
        ):
            fresh.pending = first_outputs[r]  # same first timestep: reuse that evaluation
        state.tracks[r] = fresh
        state.steps_run[r] = 0
    notify(state)  # rows whose probe already finished their schedule have left


def run(state: SampleState, stop_after: int | None) -> SampleResult:
    """Advance ``state`` by ``stop_after`` ticks (all remaining when None) and report."""
    t0 = time.perf_counter()
    ticks = 0  # schedules may shrink (a controller's jump) or grow (a self-scheduling solver) as they run
    while not state.finished and (stop_after is None or ticks < stop_after):
        tick(state)
        ticks += 1
    state.seconds += time.perf_counter() - t0
    finished = state.finished
    out = torch.empty_like(state.template)
    num_steps, stopped = [0] * state.batch_size, [False] * state.batch_size
    for tr in state.tracks:
        # a row that ran its whole schedule returns its last state, one stopped early or paused its x0
        value = tr.x if tr.done and not tr.stopped_early else tr.x0
        if value is None:  # paused before the first step: nothing denoised yet
            value = tr.x
        out[tr.rows] = value.to(out.dtype)
        for r in tr.rows.tolist():
            num_steps[r] = len(tr.timesteps) - tr.start
            stopped[r] = tr.stopped_early
    return SampleResult(
        latents=out,
        nfe=state.nfe,
        nfe_per_sample=list(state.nfe_per_sample),
        steps_run=list(state.steps_run),
        num_steps=num_steps,
        stopped_early=stopped,
        trace=list(state.trace),
        seconds=state.seconds,
        state=None if finished else state,
        notes=list(state.notes),
        draft=state.draft,
    )
