"""The state of a sampling run and one tick of it: :func:`evaluate`, :func:`step`, :func:`retire`.

A run is a list of tracks; a track is one scheduler copy driving a set of rows in lock-step (all rows
together, or one row each when rows may leave early or follow different schedules). :func:`tick` advances
every live track by one step: one batched model call for all of them (:func:`evaluate`), a scheduler step
and the x0 prediction per track (:func:`step`), then the controller (:func:`retire`). The entry points are
in :mod:`fastdiff.dynamic.loop`.
"""

from __future__ import annotations

import copy
import inspect
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch

from fastdiff.dynamic.adapters import SchedulerAdapter, predicted_x0
from fastdiff.dynamic.protocols import Controller, Decision
from fastdiff.dynamic.records import SampleResult, StepRecord

__all__ = ["Track", "SampleState", "tick"]

RowsHook = Callable[[torch.Tensor], None]


@dataclass
class Track:
    """One scheduler copy driving a set of rows in lock-step."""

    rows: torch.Tensor  # long, indices into the batch
    adapter: SchedulerAdapter
    pos: int  # index into timesteps of the next step
    start: int  # index of the first step (img2img / SDEdit start)
    x: torch.Tensor
    generator: object = None
    x0: torch.Tensor | None = None
    pending: torch.Tensor | None = None  # a model output already computed for the next step
    done: bool = False
    stopped_early: bool = False

    @property
    def timesteps(self) -> torch.Tensor:
        return self.adapter.timesteps


@dataclass
class SampleState:
    """Everything needed to continue a paused :func:`sample` run (see :func:`resume`).

    :func:`resume` advances the state in place; :meth:`copy` gives an independent snapshot to branch from."""

    model_fn: Callable
    tracks: list[Track]
    batch_size: int
    controller: Controller | None
    callback: Callable | None
    on_rows_retired: RowsHook | None
    template: torch.Tensor  # shape/dtype/device of the latents
    nfe: int = 0
    nfe_per_sample: list[int] = field(default_factory=list)
    steps_run: list[int] = field(default_factory=list)
    trace: list[StepRecord] = field(default_factory=list)
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    live_rows: list[int] = field(default_factory=list)  # rows still running after the last tick
    draft: SampleResult | None = None
    on_nonfinite: str = "raise"
    warned_nonfinite: bool = False

    @property
    def finished(self) -> bool:
        return all(tr.done for tr in self.tracks)

    def copy(self) -> SampleState:
        """An independent snapshot: scheduler copies, controller and generator states are duplicated."""
        clones: dict = {}  # one clone per generator: tracks that share one must share its clone
        return replace(
            self,
            tracks=[_copy_track(tr, clones) for tr in self.tracks],
            controller=copy.deepcopy(self.controller),
            nfe_per_sample=list(self.nfe_per_sample),
            steps_run=list(self.steps_run),
            trace=list(self.trace),
            notes=list(self.notes),
            live_rows=list(self.live_rows),
        )


def _copy_track(tr: Track, clones: dict) -> Track:
    # one deepcopy memo for scheduler and state: a scheduler that keeps a reference to the state it returned
    # (FastScheduler's full-precision shadow of an fp16 state) still recognises it in the copy
    scheduler, x = copy.deepcopy((tr.adapter.scheduler, tr.x))
    adapter = type(tr.adapter)(scheduler, tr.adapter.step_kwargs)
    return replace(tr, adapter=adapter, x=x, generator=_clone(tr.generator, clones))


def _clone(generator, clones: dict):
    if isinstance(generator, list):
        return [_clone(g, clones) for g in generator]
    if isinstance(generator, torch.Generator):
        if id(generator) not in clones:
            g = torch.Generator(generator.device)
            g.set_state(generator.get_state())
            clones[id(generator)] = g
        return clones[id(generator)]
    return generator


def _takes_rows(model_fn) -> bool:
    try:
        return "rows" in inspect.signature(model_fn).parameters
    except (TypeError, ValueError):
        return False


# ----------------------------------------------------------------------------------------------------------
# one tick: evaluate, step, retire
# ----------------------------------------------------------------------------------------------------------
def tick(state: SampleState, probe: bool = False) -> dict[int, torch.Tensor]:
    """Advance every live track by one step; returns the model output each track used.

    During a planner's probe the controller is not asked and ``on_rows_retired`` is not called."""
    tick_start = time.perf_counter()
    live = [i for i, tr in enumerate(state.tracks) if not tr.done]
    nan, batch = float("nan"), state.batch_size
    record = StepRecord(
        tick=len(state.trace),
        t=[nan] * batch,
        sigma=[nan] * batch,
        x0_change=[nan] * batch,
        active=[False] * batch,
        stopped=[],
        nfe=0,
        seconds=0.0,
    )
    inputs = {i: state.tracks[i].adapter.model_input(state.tracks[i].x, _t(state.tracks[i])) for i in live}
    outputs = evaluate(state, inputs)
    x0_full = step(state, inputs, outputs, record)
    if not probe and state.controller is not None:
        retire(state, live, record)
    record.nfe = state.nfe
    record.seconds = time.perf_counter() - tick_start
    state.trace.append(record)
    if state.callback is not None:
        state.callback(record, x0_full)
    if not probe:
        notify(state)
    return outputs


def _t(tr: Track):
    return tr.timesteps[tr.pos]


def evaluate(state: SampleState, inputs: dict[int, torch.Tensor]) -> dict[int, torch.Tensor]:
    """One batched model call for every live track without a reused output; returns each track's output."""
    outputs = {i: state.tracks[i].pending for i in inputs if state.tracks[i].pending is not None}
    need = [i for i in inputs if i not in outputs]
    if not need:
        return outputs
    tracks = [state.tracks[i] for i in need]
    x_in = torch.cat([inputs[i] for i in need])
    rows = torch.cat([tr.rows for tr in tracks])
    ts = [torch.as_tensor(_t(tr)) for tr in tracks]
    if all(bool(ts[0] == t) for t in ts[1:]):
        t_arg = ts[0]
    else:
        t_arg = torch.cat([t.reshape(1).expand(len(tr.rows)) for t, tr in zip(ts, tracks)])
    kwargs = {"rows": rows} if _takes_rows(state.model_fn) else {}  # rows= only for a model that takes it
    pred = state.model_fn(x_in, t_arg, **kwargs)
    if not isinstance(pred, torch.Tensor):
        name = getattr(state.model_fn, "__qualname__", None) or type(state.model_fn).__qualname__
        raise TypeError(
            f"model_fn must return a tensor shaped like its input x {tuple(x_in.shape)}, got "
            f"{type(pred).__name__} from model_fn {name!r}; return the prediction itself, e.g. "
            "`lambda x, t: unet(x, t).sample` for a diffusers UNet (its output is a dataclass or a tuple)"
        )
    if pred.shape != x_in.shape:
        raise ValueError(f"model_fn returned shape {tuple(pred.shape)} for input {tuple(x_in.shape)}")
    state.nfe += 1
    outputs.update(zip(need, pred.split([len(tr.rows) for tr in tracks])))
    for r in rows.tolist():
        state.nfe_per_sample[r] += 1
    return outputs


def _nonfinite(state: SampleState, tr: Track, t, out, x0, record: StepRecord) -> None:
    """Name what went non-finite, where, for which rows; raise or (once per run) warn."""
    rows = tr.rows.tolist()
    if not torch.isfinite(out).all():
        what, bad = "the model output", out
    elif not torch.isfinite(x0).all():
        what, bad = "the x0 prediction", x0
    else:
        what, bad = "the latents after the step", tr.x
    bad_rows = [r for r, ok in zip(rows, torch.isfinite(bad.flatten(1)).all(1).tolist()) if not ok] or rows
    msg = (
        f"NaN/inf in {what} at step index {tr.pos - 1} of row(s) {bad_rows} (tick {record.tick}, "
        f"t={float(t):.6g}); pass on_nonfinite='warn' to continue anyway"
    )
    if state.on_nonfinite == "raise":
        raise FloatingPointError(msg)
    if not state.warned_nonfinite:
        state.warned_nonfinite = True
        warnings.warn(msg + " (warned once per run)", RuntimeWarning, stacklevel=4)


def step(state: SampleState, inputs, outputs, record: StepRecord) -> torch.Tensor | None:
    """Scheduler step of every live track; x0 and its relative change go to the tracks and the record."""
    x0_full = torch.full_like(state.template, float("nan")) if state.callback is not None else None
    for i, x_vp in inputs.items():
        tr = state.tracks[i]
        out = outputs[i]
        tr.pending = None
        t = _t(tr)
        alpha, sigma = tr.adapter.vp_coefficients(tr.adapter.step_index(tr.pos, t), t)
        tr.x, x0 = tr.adapter.step(out, t, tr.x, tr.generator)
        if x0 is None:
            x0 = predicted_x0(out, x_vp, alpha, sigma, tr.adapter.prediction_type)
        # the norms double as the non-finite check (#16): a NaN/inf anywhere makes its row's norm non-finite
        x0_norm = x0.flatten(1).double().norm(dim=1)
        x_norm = torch.linalg.vector_norm(tr.x.flatten(1), dim=1, dtype=torch.float64)
        tr.pos += 1
        if not bool(torch.isfinite(x0_norm.sum() + x_norm.sum())):
            _nonfinite(state, tr, t, out, x0, record)
        change = None
        if tr.x0 is not None:
            change = (x0 - tr.x0).flatten(1).double().norm(dim=1) / x0_norm.clamp_min(1e-12)
        tr.x0 = x0
        sigma_ve = sigma / alpha if alpha > 0 else float("inf")
        for k, r in enumerate(tr.rows.tolist()):
            state.steps_run[r] += 1
            record.t[r] = float(t)
            record.sigma[r] = sigma_ve
            record.active[r] = True
            if change is not None:
                record.x0_change[r] = float(change[k])
        if x0_full is not None:
            x0_full[tr.rows] = x0.to(x0_full.dtype)
        if tr.pos >= len(tr.timesteps):
            tr.done = True
    return x0_full


def retire(state: SampleState, live: list[int], record: StepRecord) -> None:
    """Ask the controller about every single-row track still running: stop (the row keeps its x0), jump
    (its scheduler finishes on the decision's noise levels) or continue."""
    for i in live:
        tr = state.tracks[i]
        if tr.done or len(tr.rows) != 1:
            continue
        r = int(tr.rows[0])
        done_steps, total = tr.pos - tr.start, len(tr.timesteps) - tr.start
        decision = state.controller.decide(
            r, done_steps, total, record.x0_change[r], record.sigma[r], tr.adapter.sigmas_ahead()
        )
        if not isinstance(decision, Decision):
            raise TypeError(
                f"{type(state.controller).__name__}.decide() must return a fastdiff.dynamic.Decision, "
                f"got {decision!r}"
            )
        if decision.action == "stop":
            tr.done = tr.stopped_early = True  # the row keeps its x0 prediction
            record.stopped.append(r)
        elif decision.action == "jump":
            tr.adapter.reschedule(decision.sigmas)
            record.jumped.append(r)


def notify(state: SampleState) -> None:
    """Call ``on_rows_retired`` if the set of running rows shrank since the last call."""
    live = sorted(r for tr in state.tracks if not tr.done for r in tr.rows.tolist())
    if live != state.live_rows:
        state.live_rows = live
        if state.on_rows_retired is not None:
            state.on_rows_retired(torch.tensor(live, dtype=torch.long))
