"""The step cache: replay deep U-Net features on cheap steps, refresh them on full steps.

The handle's state machine is one class assembled from mixins, one concern per module: :mod:`.steps`
(which step and run a call belongs to, full or cached), :mod:`.hooks` (the U-Net hooks and unit wrappers),
:mod:`.rows` (keeping rows that stay in the batch), :mod:`.stats` (counters); this module holds the
configuration and :func:`step_cache`; :mod:`.pipeline` connects it to fastdiff's drop-in pipelines. The state itself is created here (``__init__``) and in
:meth:`.steps.StepClock._clear_run`.

Design (and why):

* **Compose, don't copy.** The U-Net's own ``forward`` and its blocks' forwards run unchanged; the cache
  replaces the ``forward`` of the units it may replay (resnets, transformer layers, down/upsamplers,
  the mid block, cross-attentions: :mod:`.units`) with a wrapper that either calls the original and keeps
  its output, or returns the kept output. No diffusers block code is copied, so new diffusers versions,
  attention processors and ``fastdiff.optimize`` passes that act inside those modules keep working
  (install the cache *after* ``optimize``: a pass that swaps a module out drops its wrapper).
* **Steps are found from the U-Net's inputs, not from a scheduler index.** A forward pre-hook reads the
  timestep: a new value starts a step; the same value again is another call of the same step (a pipeline
  that runs the unconditional and conditional halves separately), each call with its own cached features
  (a "slot"); a larger value than the last starts a new run, which clears every cached tensor (no state
  leaks between pipeline calls, DeepCache issue #54). The step's place in the schedule comes from
  ``pipe.scheduler.timesteps`` when a pipeline was given (checked at every step, so img2img's shortened
  runs and stale schedules are handled) or from :meth:`StepCache.set_schedule`; without one the last step
  is unknown and only the first is forced full (``stats.notes`` says so).
* **Never silently wrong.** A call whose batch differs from the cached one (rows retired without
  :meth:`StepCache.keep_rows`, a new prompt count) runs in full and is counted in
  ``stats.forced_refreshes``. ControlNet / T2I-Adapter residuals are refused (adapters add in place to
  tensors the cache holds).
* **Modes** (DeepCache, Ma et al. 2024; Block Caching, Wimbauer et al. 2024; FBCache/TeaCache; T-GATE,
  Zhang et al. 2024): ``"uniform"`` refreshes every ``interval`` steps; ``"schedule"`` refreshes at given
  steps or at steps planned from a measured :class:`~.policy.StepProfile` (:func:`.measure_profile`)
  with as many full steps as ``"uniform"`` spends at the same ``interval``; ``"adaptive"`` always computes the producers down to the branch (at least
  one real layer), measures the relative L1 change of the deepest one against the previous step,
  accumulates it since the last refresh and refreshes when the sum reaches ``threshold`` (or after
  ``max_skip`` cached steps); ``"off"`` runs everything (bit-identical to no cache) and records feature drift. ``gate_step`` adds cross-attention gating on top of any mode: after that step every
  cross-attention returns its output from the gate step; with ``gate_uncond=True`` a guidance pair
  ``[x; x]`` then runs once, on the conditional half with the halves' mean cross-attention (T-GATE's
  second saving, which also ends guidance). The first and last steps always run in full.
* **Forecast, optionally** (TaylorSeer, Liu et al. 2025): ``forecast="linear"`` / ``"quadratic"`` make a
  cached step extrapolate the entry feature from the last 2 / 3 full evaluations instead of replaying the
  last one (:mod:`.forecast`; 1 / 2 more copies of the entry feature per call slot). The default stays
  ``"none"``: on train prompts (part forecast-train of ``benchmarks/results/step_cache.md``) linear
  forecasting at strength 0.5 won at 50 steps but lost to replay at 20 steps; quadratic lost everywhere.
* **torch.compile.** The per-call decision is Python state set in the pre-hook before any unit runs, so
  each path (full, cached) is a graph without breaks; reading the timestep is the one data-dependent
  step (see ``benchmarks/results/step_cache.md`` for ``torch._dynamo.explain`` counts).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Sequence

import torch
from torch import nn

from fastdiff import installed
from fastdiff._checks import is_int, is_number
from fastdiff.caching.forecast import AXES, FORECASTS, Forecaster
from fastdiff.caching.hooks import CallHooks, installed_cache
from fastdiff.caching.pipeline import install_rows_hook
from fastdiff.caching.policy import StepProfile, explicit_refresh
from fastdiff.caching.rows import RowSelection
from fastdiff.caching.stats import StepCacheRun, StepCacheStats, run_summary
from fastdiff.caching.steps import StepClock
from fastdiff.caching.units import cross_attentions, layout

__all__ = [
    "MODES",
    "POLICY_OPTIONS",
    "StepCache",
    "StepCacheRun",
    "StepCacheStats",
    "check_policy",
    "step_cache",
]

MODES = ("uniform", "schedule", "adaptive", "off")


class StepCache(StepClock, CallHooks, RowSelection, Forecaster):
    """Handle returned by :func:`step_cache`; holds the policy, the cached features and the stats."""

    def __init__(self, unet: nn.Module, pipe=None):
        self.unet = unet
        self._pipe = pipe
        self._layout = layout(unet)
        self._xattn = cross_attentions(unet)
        self._originals: list[tuple[nn.Module, object]] = []  # (module, instance forward or None)
        self._hook = None
        self.stats = StepCacheStats()
        self.enabled = True
        self.mode = "off"
        self._schedule_override: list[float] | None = None
        self._call_schedule = False  # the override came from a pipeline call (pipeline.begin_call)
        self._external: tuple[int, float] | None = None  # (count, t) of the step announced by begin_step
        self._announced = 0
        self._run_serial = 0  # counts runs (never reset): a rows hook checks it follows the current run
        self._first_batch: int | None = None  # batch of the first call since a pipeline call ended
        self._clear_run()

    # ------------------------------------------------------------------ configuration
    def set(self, mode: str = "uniform", **options) -> StepCache:
        """Change the policy in place (no re-enable needed); clears cached features. Options as for
        :func:`step_cache`; :func:`check_policy` checks those that do not depend on the U-Net."""
        p = check_policy(mode, **options)
        mode, branch, gate_step = p["mode"], p["branch"], p["gate_step"]
        n_branches = self._layout.num_branches
        if branch >= n_branches:
            raise ValueError(f"branch must be an int in [0, {n_branches - 1}] for this U-Net, got {branch!r}")
        if gate_step is not None and not self._xattn:
            raise ValueError("gate_step was given but this U-Net has no cross-attention to gate")
        self.mode, self.interval, self.branch = mode, p["interval"], branch
        self.refresh, self.threshold, self.gate_step = p["refresh"], p["threshold"], gate_step
        self.gate_uncond = p["gate_uncond"]
        self.forecast, self.forecast_axis = p["forecast"], p["forecast_axis"]
        self.forecast_strength, self.max_skip = p["forecast_strength"], p["max_skip"]
        self._replayed = {id(u.module) for u in self._layout.replayed(branch)}
        self._entry = id(self._layout.entry(branch).module)
        # adaptive needs a real layer as its signal: branch 0's only producer is conv_in (linear in x_t)
        self._probe_branch = max(branch, 1) if mode == "adaptive" else branch
        self._probe = id(self._layout.probe(self._probe_branch).module)
        if mode == "adaptive":
            self._replayed -= {
                id(u.module) for g in self._layout.producers[: self._probe_branch + 1] for u in g
            }
        self._clear_run()
        return self

    def set_schedule(self, timesteps) -> None:
        """Tell the cache the next run's timesteps (for loops without ``pipe.scheduler``)."""
        self._schedule_override = [float(t) for t in torch.as_tensor(timesteps).flatten().tolist()]
        self._clear_run()

    def begin_step(self, t) -> None:
        """Announce the next denoising step (timestep ``t``) from the sampling loop, before its U-Net calls.

        Once used, the cache stops reading the timestep inside the U-Net call, which is the only graph
        break ``torch.compile`` meets in a cached U-Net; announce every step from then on.
        """
        self._announced += 1
        self._external = (self._announced, float(torch.as_tensor(t).flatten()[0]))

    def reset(self) -> None:
        """Forget cached features; the next call starts a new run."""
        self._clear_run()

    def reset_stats(self) -> None:
        """Zero the counters (call between pipeline runs); cached features are kept until the next run."""
        self.stats = StepCacheStats()

    def last_run(self) -> StepCacheRun | None:
        """What the cache did in the current or last run (None before the first U-Net call)."""
        return run_summary(self.stats, self.mode, self.enabled, self.forecast)

    @property
    def installed(self) -> bool:
        return self._hook is not None

    def __repr__(self) -> str:
        return (
            f"StepCache(mode={self.mode!r}, interval={self.interval}, branch={self.branch}, "
            f"gate_step={self.gate_step}, forecast={self.forecast!r}"
            + (
                f", forecast_axis={self.forecast_axis!r}, forecast_strength={self.forecast_strength}"
                if self.forecast != "none"
                else ""
            )
            + f", enabled={self.enabled}, installed={self.installed})"
        )


def check_policy(mode: str = "uniform", **options) -> dict:
    """Check a step-cache policy as far as it does not depend on the U-Net; return it normalised
    (``refresh`` sorted, ``max_skip`` defaulted). :meth:`StepCache.set` then checks ``branch`` against the
    U-Net's branches and ``gate_step`` against its cross-attentions; a sweep spec is checked with this alone,
    before any model loads. Raises ``ValueError`` naming the option and what is valid (``TypeError`` for an
    unknown option, as ``fastdiff.optimize`` does)."""
    unknown = sorted(set(options) - set(POLICY_OPTIONS))
    if unknown:
        raise TypeError(f"unknown step cache option {unknown[0]!r}; valid: {', '.join(POLICY_OPTIONS)}")
    return _policy(mode, **options)


def _policy(
    mode: str = "uniform",
    interval: int = 3,
    branch: int = 0,
    refresh: Sequence[int] | StepProfile | None = None,
    threshold: float = 0.1,
    max_skip: int | None = None,
    gate_step: int | None = None,
    gate_uncond: bool = False,
    forecast: str = "none",
    forecast_axis: str = "step",
    forecast_strength: float = 0.5,
) -> dict:
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    if not is_int(interval) or interval < 1:
        raise ValueError(f"interval must be an int >= 1, got {interval!r}")
    if not is_int(branch) or branch < 0:
        raise ValueError(f"branch must be an int >= 0 (0 = shallowest), got {branch!r}")
    if mode == "schedule":
        if refresh is None:
            raise ValueError("mode='schedule' needs refresh= (a list of steps or a StepProfile)")
        if not isinstance(refresh, StepProfile):
            refresh = sorted(explicit_refresh(refresh, None))
    elif refresh is not None:
        raise ValueError(f"refresh= is only used with mode='schedule', got mode={mode!r}")
    if not (isinstance(threshold, (int, float)) and math.isfinite(threshold) and threshold > 0):
        raise ValueError(f"threshold must be a finite number > 0, got {threshold!r}")
    if max_skip is not None and not (is_int(max_skip) and max_skip >= 1):
        raise ValueError(f"max_skip must be None or an int >= 1, got {max_skip!r}")
    if gate_step is not None and (not is_int(gate_step) or gate_step < 0):
        raise ValueError(f"gate_step must be None or an int >= 0 (run-relative step), got {gate_step!r}")
    if not isinstance(gate_uncond, bool) or (gate_uncond and gate_step is None):
        raise ValueError(f"gate_uncond must be a bool and needs gate_step, got {gate_uncond!r}")
    if forecast not in FORECASTS:
        raise ValueError(f"forecast must be one of {', '.join(map(repr, FORECASTS))}, got {forecast!r}")
    if forecast_axis not in AXES:
        raise ValueError(f"forecast_axis must be one of {', '.join(map(repr, AXES))}, got {forecast_axis!r}")
    if not (is_number(forecast_strength) and 0 < forecast_strength <= 1):
        raise ValueError(f"forecast_strength must be a number in (0, 1], got {forecast_strength!r}")
    return dict(
        mode=mode,
        interval=interval,
        branch=branch,
        refresh=refresh,
        threshold=float(threshold),
        max_skip=max_skip if max_skip is not None else (4 if mode == "adaptive" else None),
        gate_step=gate_step,
        gate_uncond=gate_uncond,
        forecast=forecast,
        forecast_axis=forecast_axis,
        forecast_strength=float(forecast_strength),
    )


POLICY_OPTIONS = tuple(inspect.signature(_policy).parameters)[1:]  # step_cache's keywords besides mode


def step_cache(pipe_or_unet, mode: str = "uniform", **options) -> StepCache:
    """Install a step cache on a diffusers pipeline (its ``unet``) or on a ``UNet2DConditionModel``.

    Args:
        pipe_or_unet: a pipeline with ``.unet`` (its ``scheduler.timesteps`` tells the cache where the
            last step is) or the U-Net itself (then call ``handle.set_schedule(timesteps)`` per run).
        mode: ``"uniform"``, ``"schedule"``, ``"adaptive"`` or ``"off"`` (see the module docstring).
        **options: ``interval`` (3), ``branch`` (0 = shallowest), ``refresh`` (schedule mode: steps or a
            :class:`StepProfile`), ``threshold`` (adaptive, 0.1), ``max_skip`` (adaptive, 4),
            ``gate_step`` (cross-attention gating from this run-relative step on), ``gate_uncond``
            (after the gate, run a guidance pair's conditional half only), ``forecast`` (``"none"``: replay
            the cached feature; ``"linear"`` / ``"quadratic"``: extrapolate it from the last 2 / 3 full
            evaluations, :mod:`.forecast`; keeps 1 / 2 more copies of the entry feature), ``forecast_axis``
            (``"step"`` or ``"timestep"``: the variable the extrapolation is linear in), ``forecast_strength``
            (in (0, 1], default 0.5: the share of the forecast blended with plain reuse; 0.5 had the better
            worst image than 1.0 in every setting of part forecast-train).

    On a fastdiff drop-in pipeline (``fastdiff.StableDiffusionPipeline`` ...) it also installs the rows hook
    of :mod:`.pipeline`, so images that stop at different steps (``early_stop=``) keep their own cached
    features; pass the pipeline, not its U-Net, to get it. Each call's ``output.fastdiff.step_cache`` then
    says what the cache did.

    Returns:
        A :class:`StepCache`; ``handle.stats`` counts full and cached steps, ``handle.last_run()`` summarises
        the last run. ``fastdiff.restore`` (or ``fastdiff.installed.undo_all``) on the same object removes it.
    """
    unet = getattr(pipe_or_unet, "unet", None)
    pipe = pipe_or_unet if unet is not None else None
    unet = unet if unet is not None else pipe_or_unet
    if not isinstance(unet, nn.Module):
        raise TypeError(
            f"step_cache needs a pipeline with .unet or a UNet2DConditionModel, got {type(unet)!r}"
        )
    if installed_cache(unet) is not None:
        raise RuntimeError(
            "a step cache is already installed on this U-Net; change it with handle.set(...) or remove it "
            "with fastdiff.restore first"
        )
    handle = StepCache(unet, pipe)
    handle.set(mode, **options)
    handle._install()
    installed.record(pipe_or_unet, "step_cache", handle.remove, mode=mode, **options)
    from fastdiff.pipelines._mixin import FastdiffPipelineMixin  # lazy: the pipelines import this package

    if isinstance(pipe, FastdiffPipelineMixin):  # rows may leave its batch: follow them (see .pipeline)
        install_rows_hook(pipe, handle)
    return handle
