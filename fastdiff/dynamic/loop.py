"""The fastdiff sampling loop: one contract for fixed, early-stopped, auto-length and resumable sampling.

``sample(model_fn, latents, scheduler=..., num_inference_steps=...)`` runs any diffusers-compatible
scheduler (``set_timesteps``/``scale_model_input``/``step``) against a model function
``model_fn(x, t) -> prediction`` in the scheduler's ``prediction_type``. Compared with the loop inside a
diffusers pipeline it adds three things:

* **per-sample control.** A controller (e.g. :class:`~fastdiff.dynamic.EarlyStop`) may retire single rows of
  a batch; the model is then called on the remaining rows only. Each row that can leave early is driven by
  its own copy of the scheduler, so multistep solver history (DPM-Solver++, UniPC, ...) is never mixed
  between rows and a row's trajectory is exactly the one it would follow alone.
* **x0 everywhere.** Every step yields the data prediction x0 (taken from the scheduler's output when it
  gives one, otherwise converted from the model output, Ho et al. 2020 eq. 15). A row that stops early
  returns its x0 prediction, never a still-noisy x_t.
* **pause and resume.** ``stop_after=k`` returns after k steps with a resumable :class:`SampleState`;
  :func:`resume` continues it, bit-for-bit the same as an uninterrupted run.

Latents are the scheduler's initial state, as a diffusers pipeline prepares them (noise times
``scheduler.init_noise_sigma``; 1 for VP-form samplers).
"""

from __future__ import annotations

import copy
import functools
import inspect
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

__all__ = ["SampleResult", "SampleState", "StepRecord", "sample", "resume", "predicted_x0"]


# ----------------------------------------------------------------------------------------------------------
# results
# ----------------------------------------------------------------------------------------------------------
@dataclass
class StepRecord:
    """One tick of the loop: every still-active row advanced by one scheduler step.

    Per-row lists have one entry per sample of the batch; rows that were not active hold NaN.
    ``x0_change`` is ||x0_k - x0_{k-1}|| / ||x0_k|| (NaN on a row's first step).
    """

    tick: int
    t: list[float]
    sigma: list[float]
    x0_change: list[float]
    active: list[bool]
    stopped: list[int]  # rows retired by the controller at this tick
    nfe: int  # model calls so far (a batched call counts once)
    seconds: float  # wall time of this tick


@dataclass
class SampleResult:
    """What :func:`sample` returns.

    Attributes:
        latents: final x0 estimate per row: the last scheduler state of rows that ran their whole schedule
            (at sigma=0 that is x0) and the x0 prediction of rows that stopped early. For a paused run
            (``stop_after``) the current x0 prediction, i.e. a preview.
        nfe: number of model calls (a call on a batch counts once).
        nfe_per_sample: model evaluations spent on each row.
        steps_run: scheduler steps taken by each row.
        num_steps: length of each row's schedule (from its start step), e.g. the auto-chosen count.
        stopped_early: per row, whether a controller retired it before its schedule ended.
        trace: one :class:`StepRecord` per tick.
        seconds: wall time of the loop.
        state: resumable state when the run was paused with ``stop_after`` and not finished, else None.
        notes: per-row explanations from controllers (e.g. why an auto step count was chosen).
        draft: for :func:`~fastdiff.dynamic.draft_and_refine`, the LCM draft run.
    """

    latents: torch.Tensor
    nfe: int
    nfe_per_sample: list[int]
    steps_run: list[int]
    num_steps: list[int]
    stopped_early: list[bool]
    trace: list[StepRecord]
    seconds: float
    state: SampleState | None = None
    notes: list[str] = field(default_factory=list)
    draft: SampleResult | None = None  # the draft run of draft_and_refine

    @property
    def finished(self) -> bool:
        return self.state is None

    def trace_table(self) -> dict[str, torch.Tensor]:
        """The trace as (ticks, batch) float tensors: ``t``, ``sigma``, ``x0_change``, ``active``, ``nfe``."""
        if not self.trace:
            return {}
        return {
            "t": torch.tensor([r.t for r in self.trace]),
            "sigma": torch.tensor([r.sigma for r in self.trace]),
            "x0_change": torch.tensor([r.x0_change for r in self.trace]),
            "active": torch.tensor([r.active for r in self.trace]),
            "nfe": torch.tensor([r.nfe for r in self.trace]),
        }


# ----------------------------------------------------------------------------------------------------------
# scheduler helpers
# ----------------------------------------------------------------------------------------------------------
def _vp_coefficients(scheduler, t) -> tuple[float, float]:
    """(alpha_t, sigma_t) of the VP form x_t = alpha_t x0 + sigma_t eps at timestep t (before step)."""
    sigmas = getattr(scheduler, "sigmas", None)
    to_alpha_sigma = getattr(scheduler, "_sigma_to_alpha_sigma_t", None)
    if sigmas is not None and to_alpha_sigma is not None:
        # DPM-Solver/UniPC style: its own (possibly Karras) sigma for this step, not the rounded timestep's
        idx = scheduler.step_index
        if idx is None:
            idx = scheduler.begin_index if getattr(scheduler, "begin_index", None) is not None else None
        if idx is None:
            idx = scheduler.index_for_timestep(t)
        alpha, sigma = to_alpha_sigma(sigmas[idx])
        return float(alpha), float(sigma)
    if sigmas is not None:  # VE-form sigma schedule (Euler family): alpha = 1/sqrt(1+s^2)
        idx = scheduler.step_index
        if idx is None:
            idx = scheduler.index_for_timestep(t) if hasattr(scheduler, "index_for_timestep") else 0
        s = float(sigmas[idx])
        alpha = 1.0 / math.sqrt(1.0 + s * s)
        return alpha, s * alpha
    abar_table = scheduler.alphas_cumprod
    tf = float(t)
    lo = int(math.floor(tf))
    hi = min(lo + 1, len(abar_table) - 1)
    w = tf - lo
    abar = float(abar_table[lo]) * (1 - w) + float(abar_table[hi]) * w
    return math.sqrt(abar), math.sqrt(1.0 - abar)


def predicted_x0(
    prediction: torch.Tensor, x_vp: torch.Tensor, alpha: float, sigma: float, prediction_type: str
):
    """Data prediction from a model output on the VP-form input x_t = alpha x0 + sigma eps.

    epsilon: x0 = (x_t - sigma eps) / alpha (Ho et al. 2020, eq. 15); v: x0 = alpha x_t - sigma v
    (Salimans & Ho 2022, with alpha^2 + sigma^2 = 1); sample: the prediction itself.
    """
    if prediction_type == "epsilon":
        return (x_vp - sigma * prediction) / alpha
    if prediction_type == "v_prediction":
        return alpha * x_vp - sigma * prediction
    if prediction_type == "sample":
        return prediction
    raise ValueError(
        f"unknown prediction_type {prediction_type!r}; expected 'epsilon', 'v_prediction' or 'sample'"
    )


def _sigma_ve(alpha: float, sigma: float) -> float:
    return sigma / alpha if alpha > 0 else float("inf")


@functools.lru_cache(maxsize=64)
def _step_parameters(scheduler_type: type) -> frozenset | None:
    """Keyword names ``scheduler_type.step`` accepts (None: it takes **kwargs). Cached: inspect is slow."""
    params = inspect.signature(scheduler_type.step).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return None
    return frozenset(params)


def _accepted_kwargs(scheduler, kwargs: dict) -> dict:
    names = _step_parameters(type(scheduler))
    return dict(kwargs) if names is None else {k: v for k, v in kwargs.items() if k in names}


def _takes_rows(model_fn) -> bool:
    try:
        params = inspect.signature(model_fn).parameters
    except (TypeError, ValueError):
        return False
    return "rows" in params


# ----------------------------------------------------------------------------------------------------------
# state
# ----------------------------------------------------------------------------------------------------------
@dataclass
class _Track:
    """One scheduler copy driving a set of rows in lock-step."""

    rows: torch.Tensor  # long, indices into the batch
    scheduler: object
    timesteps: torch.Tensor
    pos: int  # index into timesteps of the next step
    start: int  # index of the first step (img2img / SDEdit start)
    x: torch.Tensor
    generator: object = None
    x0: torch.Tensor | None = None
    pending: torch.Tensor | None = None  # a model output already computed for the next step
    done: bool = False
    stopped_early: bool = False
    final: torch.Tensor | None = None

    @property
    def remaining(self) -> int:
        return len(self.timesteps) - self.pos


@dataclass
class SampleState:
    """Everything needed to continue a paused :func:`sample` run (see :func:`resume`)."""

    model_fn: Callable
    tracks: list[_Track]
    batch_size: int
    controller: object
    callback: Callable | None
    step_kwargs: dict
    prediction_type: str
    nfe: int = 0
    nfe_per_sample: list[int] = field(default_factory=list)
    steps_run: list[int] = field(default_factory=list)
    trace: list[StepRecord] = field(default_factory=list)
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    template: torch.Tensor | None = None  # shape/dtype/device of the latents


def _new_scheduler(scheduler, num_steps: int, device, start_step: int):
    sch = copy.deepcopy(scheduler)
    sch.set_timesteps(num_steps, device=device)
    begin = start_step * getattr(sch, "order", 1)
    if hasattr(sch, "set_begin_index"):
        sch.set_begin_index(begin)
    return sch, begin


def _check_inputs(model_fn, latents, scheduler, num_inference_steps, start_step, stop_after):
    if not callable(model_fn):
        raise TypeError(f"model_fn must be callable as model_fn(x, t), got {type(model_fn).__name__}")
    if not isinstance(latents, torch.Tensor) or latents.ndim < 2:
        raise TypeError("latents must be a torch.Tensor with a batch dimension first, e.g. (B, C, H, W)")
    for name in ("set_timesteps", "step", "scale_model_input"):
        if not hasattr(scheduler, name):
            raise TypeError(
                f"scheduler must be diffusers-compatible; {type(scheduler).__name__} has no {name}()"
            )
    if start_step < 0:
        raise ValueError(f"start_step must be >= 0, got {start_step}")
    if stop_after is not None and (not isinstance(stop_after, int) or stop_after < 0):
        raise ValueError(f"stop_after must be a non-negative int or None, got {stop_after!r}")


def _steps_per_row(num_inference_steps, batch: int) -> list[int] | None:
    """Per-row step counts, or None if the scheduler's current timesteps are to be used as they are."""
    if num_inference_steps is None:
        return None
    if isinstance(num_inference_steps, bool):
        raise TypeError("num_inference_steps must be an int, a sequence of ints, an AutoSteps or None")
    if isinstance(num_inference_steps, int):
        counts = [num_inference_steps] * batch
    elif isinstance(num_inference_steps, Sequence):
        counts = list(num_inference_steps)
        if len(counts) != batch:
            raise ValueError(f"num_inference_steps has {len(counts)} entries for a batch of {batch}")
    else:
        raise TypeError(
            "num_inference_steps must be an int, a sequence of ints (one per row), an AutoSteps or None, "
            f"got {type(num_inference_steps).__name__}"
        )
    for n in counts:
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"step counts must be positive ints, got {n!r}")
    return counts


def sample(
    model_fn: Callable,
    latents: torch.Tensor,
    *,
    scheduler,
    num_inference_steps=None,
    controller=None,
    callback: Callable | None = None,
    generator=None,
    step_kwargs: dict | None = None,
    start_step: int = 0,
    stop_after: int | None = None,
) -> SampleResult:
    """Run a diffusion sampler, optionally with a per-sample controller.

    Args:
        model_fn: ``model_fn(x, t)`` returns the scheduler's prediction type for the VP-form input ``x``
            (already passed through ``scheduler.scale_model_input``). ``t`` is a scalar tensor, or a
            per-row vector when rows are at different timesteps. If it accepts a ``rows=`` keyword it
            receives the batch indices of the rows in ``x`` (needed to slice per-row conditioning once
            rows leave the batch); otherwise the model must treat rows independently.
        latents: initial state, (B, ...).
        scheduler: a diffusers-compatible scheduler; it is copied, never mutated.
        num_inference_steps: int, a sequence of per-row ints, an :class:`~fastdiff.dynamic.AutoSteps`
            (chooses per row after a probe), or None to use ``scheduler``'s current timesteps as set by
            the caller (including ``set_begin_index``).
        controller: e.g. :class:`~fastdiff.dynamic.EarlyStop`; may retire rows early.
        callback: ``callback(record: StepRecord, x0: Tensor)`` after every tick; ``x0`` is (B, ...) with
            NaN rows for inactive samples.
        generator: torch.Generator or per-row list, forwarded to stochastic schedulers' ``step``.
        step_kwargs: extra keywords for ``scheduler.step`` (those it accepts), e.g. ``{"eta": 0.0}``.
        start_step: first step of the schedule to run (SDEdit/img2img: the latents are already noised to
            that step's timestep). With ``num_inference_steps=None`` and ``start_step=0`` the scheduler's
            ``begin_index`` (if set) decides.
        stop_after: pause after this many ticks and return a resumable state (progressive refinement).
    """
    _check_inputs(model_fn, latents, scheduler, num_inference_steps, start_step, stop_after)
    from fastdiff.dynamic.auto_steps import AutoSteps  # local: auto_steps imports this module

    batch = latents.shape[0]
    device = latents.device
    auto = num_inference_steps if isinstance(num_inference_steps, AutoSteps) else None
    counts = None if auto is not None else _steps_per_row(num_inference_steps, batch)
    per_row = controller is not None or auto is not None or (counts is not None and len(set(counts)) > 1)
    if isinstance(generator, list) and len(generator) != batch:
        raise ValueError(f"got {len(generator)} generators for a batch of {batch}")

    state = SampleState(
        model_fn=model_fn,
        tracks=[],
        batch_size=batch,
        controller=controller,
        callback=callback,
        step_kwargs=dict(step_kwargs or {}),
        prediction_type=getattr(scheduler.config, "prediction_type", "epsilon"),
        nfe_per_sample=[0] * batch,
        steps_run=[0] * batch,
        notes=[""] * batch,
        template=latents,
    )
    if controller is not None:
        controller.reset(batch)

    prepared = {}  # step count -> (scheduler with timesteps set, begin index); copied per track

    def make_track(rows, n, x):
        if n is None:
            sch = copy.deepcopy(scheduler)
            if start_step:
                begin = start_step * getattr(sch, "order", 1)
            else:
                begin = getattr(sch, "begin_index", None) or 0
        else:
            if n not in prepared:
                prepared[n] = _new_scheduler(scheduler, n, device, start_step)
            template, begin = prepared[n]
            sch = copy.deepcopy(template)
        timesteps = sch.timesteps
        if begin >= len(timesteps):
            raise ValueError(f"start_step {start_step} leaves no steps of a {len(timesteps)}-step schedule")
        gen = generator
        if isinstance(generator, list):
            gen = [generator[int(r)] for r in rows] if len(rows) > 1 else generator[int(rows[0])]
        return _Track(
            rows=rows, scheduler=sch, timesteps=timesteps, pos=begin, start=begin, x=x, generator=gen
        )

    t0 = time.perf_counter()
    if auto is not None:
        state.tracks = [
            make_track(torch.tensor([r]), auto.probe_budget, latents[r : r + 1]) for r in range(batch)
        ]
        probe_ticks = min(auto.probe_steps, min(tr.remaining for tr in state.tracks))
        first_outputs = _advance(state, probe_ticks, keep_first_output=True)
        x0_probe = torch.cat([tr.x0 for tr in state.tracks])
        choices = auto.choose(x0_probe)
        for r, choice in enumerate(choices):
            state.notes[r] = choice.reason
            tr = state.tracks[r]
            if choice.steps == auto.probe_budget:
                continue  # the probe ran the first steps of this very schedule: keep going
            fresh = make_track(tr.rows, choice.steps, latents[r : r + 1])
            if first_outputs is not None and bool(
                torch.as_tensor(fresh.timesteps[fresh.pos]) == torch.as_tensor(tr.timesteps[tr.start])
            ):
                fresh.pending = first_outputs[r]  # same first timestep: reuse that evaluation
            state.tracks[r] = fresh
            state.steps_run[r] = 0
        if controller is not None:
            controller.reset(batch)
    elif per_row:
        state.tracks = [
            make_track(torch.tensor([r]), None if counts is None else counts[r], latents[r : r + 1])
            for r in range(batch)
        ]
    else:
        n = None if counts is None else counts[0]
        state.tracks = [make_track(torch.arange(batch), n, latents)]
    state.seconds += time.perf_counter() - t0
    return _run(state, stop_after)


def resume(
    state: SampleState, *, stop_after: int | None = None, model_fn: Callable | None = None
) -> SampleResult:
    """Continue a paused run. With the same model this equals the uninterrupted run exactly."""
    if not isinstance(state, SampleState):
        raise TypeError(f"resume() needs the SampleState of a paused run, got {type(state).__name__}")
    if all(tr.done for tr in state.tracks):
        raise ValueError("this sampling run has already finished; there is nothing to resume")
    if model_fn is not None:
        state.model_fn = model_fn
    return _run(state, stop_after)


def _run(state: SampleState, stop_after: int | None) -> SampleResult:
    t0 = time.perf_counter()
    budget = max(tr.remaining for tr in state.tracks if not tr.done) if stop_after is None else stop_after
    _advance(state, budget)
    state.seconds += time.perf_counter() - t0
    finished = all(tr.done for tr in state.tracks)
    out = torch.empty_like(state.template)
    for tr in state.tracks:
        value = tr.final if tr.done else tr.x0
        if value is None:  # paused before the first step: nothing denoised yet
            value = tr.x
        out[tr.rows] = value.to(out.dtype)
    return SampleResult(
        latents=out,
        nfe=state.nfe,
        nfe_per_sample=list(state.nfe_per_sample),
        steps_run=list(state.steps_run),
        num_steps=_num_steps(state),
        stopped_early=_stopped(state),
        trace=list(state.trace),
        seconds=state.seconds,
        state=None if finished else state,
        notes=list(state.notes),
    )


def _num_steps(state):
    n = [0] * state.batch_size
    for tr in state.tracks:
        for r in tr.rows.tolist():
            n[r] = len(tr.timesteps) - tr.start
    return n


def _stopped(state):
    s = [False] * state.batch_size
    for tr in state.tracks:
        for r in tr.rows.tolist():
            s[r] = tr.stopped_early
    return s


def _advance(state: SampleState, ticks: int, keep_first_output: bool = False):
    """Advance every live track by up to `ticks` steps. Returns per-track first model outputs on request."""
    takes_rows = _takes_rows(state.model_fn)
    first_outputs = [None] * len(state.tracks) if keep_first_output else None
    batch = state.batch_size
    for _ in range(ticks):
        live = [tr for tr in state.tracks if not tr.done]
        if not live:
            break
        tick_start = time.perf_counter()
        nan = float("nan")
        rec_t, rec_sigma, rec_change = [nan] * batch, [nan] * batch, [nan] * batch
        active = [False] * batch

        # 1. one batched model call for every live track without a cached output
        inputs, coeffs = {}, {}
        for i, tr in enumerate(state.tracks):
            if tr.done:
                continue
            t = tr.timesteps[tr.pos]
            inputs[i] = tr.scheduler.scale_model_input(tr.x, t)
            coeffs[i] = _vp_coefficients(tr.scheduler, t)
        need = [i for i in inputs if state.tracks[i].pending is None]
        outputs = {}
        if need:
            x_in = torch.cat([inputs[i] for i in need])
            rows = torch.cat([state.tracks[i].rows for i in need])
            ts = [torch.as_tensor(state.tracks[i].timesteps[state.tracks[i].pos]) for i in need]
            if all(bool(ts[0] == t) for t in ts[1:]):
                t_arg = ts[0]
            else:
                t_arg = torch.cat([t.reshape(1).expand(len(state.tracks[i].rows)) for t, i in zip(ts, need)])
            pred = state.model_fn(x_in, t_arg, rows=rows) if takes_rows else state.model_fn(x_in, t_arg)
            if pred.shape != x_in.shape:
                raise ValueError(f"model_fn returned shape {tuple(pred.shape)} for input {tuple(x_in.shape)}")
            state.nfe += 1
            offset = 0
            for i in need:
                n = len(state.tracks[i].rows)
                outputs[i] = pred[offset : offset + n]
                offset += n
                for r in state.tracks[i].rows.tolist():
                    state.nfe_per_sample[r] += 1

        # 2. scheduler steps, x0 and its relative change
        x0_full = None
        if state.callback is not None:
            x0_full = torch.full_like(state.template, float("nan"))
        for i, x_vp in inputs.items():
            tr = state.tracks[i]
            out = tr.pending if tr.pending is not None else outputs[i]
            tr.pending = None
            if first_outputs is not None and first_outputs[i] is None:
                first_outputs[i] = out
            t = tr.timesteps[tr.pos]
            alpha, sigma = coeffs[i]
            kwargs = _accepted_kwargs(tr.scheduler, {**state.step_kwargs, "generator": tr.generator})
            res = tr.scheduler.step(out, t, tr.x, return_dict=True, **kwargs)
            x0 = getattr(res, "pred_original_sample", None)
            if x0 is None:
                x0 = getattr(res, "denoised", None)
            if x0 is None:
                x0 = predicted_x0(out, x_vp, alpha, sigma, state.prediction_type)
            change = None
            if tr.x0 is not None:
                diff = (x0 - tr.x0).flatten(1).double().norm(dim=1)
                ref = x0.flatten(1).double().norm(dim=1).clamp_min(1e-12)
                change = diff / ref
            tr.x0 = x0
            tr.x = res.prev_sample
            tr.pos += 1
            for k, r in enumerate(tr.rows.tolist()):
                state.steps_run[r] += 1
                rec_t[r] = float(t)
                rec_sigma[r] = _sigma_ve(alpha, sigma)
                active[r] = True
                if change is not None:
                    rec_change[r] = float(change[k])
            if x0_full is not None:
                x0_full[tr.rows] = x0.to(x0_full.dtype)
            if tr.pos >= len(tr.timesteps):
                tr.done, tr.final = True, tr.x

        # 3. controller: may retire single-row tracks
        stopped = []
        if state.controller is not None:
            for i in inputs:
                tr = state.tracks[i]
                if tr.done or len(tr.rows) != 1:
                    continue
                r = int(tr.rows[0])
                done_steps, total = tr.pos - tr.start, len(tr.timesteps) - tr.start
                if state.controller.should_stop(r, done_steps, total, rec_change[r], sigma=rec_sigma[r]):
                    tr.done, tr.stopped_early, tr.final = True, True, tr.x0
                    stopped.append(r)
        record = StepRecord(
            tick=len(state.trace),
            t=rec_t,
            sigma=rec_sigma,
            x0_change=rec_change,
            active=active,
            stopped=stopped,
            nfe=state.nfe,
            seconds=time.perf_counter() - tick_start,
        )
        state.trace.append(record)
        if state.callback is not None:
            state.callback(record, x0_full)
    return first_outputs
