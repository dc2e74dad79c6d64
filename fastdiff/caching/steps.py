"""Which step of which run a U-Net call belongs to, and whether that step runs in full.

A run's state is reset by :meth:`StepClock._clear_run` (a new run, a policy change, ``reset``); the step's place
in the schedule comes from the pipeline's ``scheduler.timesteps`` or :meth:`StepCache.set_schedule`, and
:meth:`StepClock._decide_full` applies the mode's rule (the first and last steps always run in full).
"""

from __future__ import annotations

import torch

from fastdiff.caching.policy import StepProfile, plan_refresh, uniform_full


class StepClock:
    """Run and step state of :class:`~fastdiff.caching.cache.StepCache` (mixed in)."""

    def _clear_run(self) -> None:
        self._last_key: tuple | None = None
        self._last_t: tuple | None = None
        self._step = -1  # run-relative index of the current step
        self._slot = -1
        self._run_ts: list[float] | None = None
        self._run_start = 0  # index of the run's first timestep in _run_ts
        self._left_schedule = False  # a controller changed the remaining steps (e.g. FastForward's jumps)
        self._slots: list[dict] = []
        self._gate: list[dict] = []
        self._slot_batch: list[int | None] = []
        self._probe_prev: list[torch.Tensor | None] = []
        self._fc_nodes: list[list[float]] = []  # per slot: positions of the entry history (.forecast)
        self._fc_s = 0.0  # the current step's position on the forecast axis
        self._fc_weights: list[float] | None = None  # the current call's forecast weights (None: replay)
        self._accum = 0.0
        self._since_full = 0
        self._step_full: bool | None = None
        self._call = "full"  # "full", "cached" or "probe" (adaptive: decided at the probe)
        self._gating = False
        self._halved = False
        self._signal = float("nan")
        self._accum_step = False
        self._calls_per_step: int | None = None  # learnt from the run's first step

    def _schedule_source(self) -> list[float] | None:
        if self._schedule_override is not None:
            return self._schedule_override
        ts = getattr(getattr(self._pipe, "scheduler", None), "timesteps", None)
        if ts is None:
            return None
        return [float(t) for t in torch.as_tensor(ts).flatten().tolist()]

    def _locate(self, key: tuple) -> None:
        """Place the new step in the run's schedule, or mark the schedule unknown."""
        t = key[0]
        if self._step == 0:
            ts = self._schedule_source()
            self._run_ts, self._run_start = None, 0
            if ts is not None:
                hits = [i for i, s in enumerate(ts) if abs(s - t) <= 1e-4 * max(1.0, abs(s))]
                if hits:
                    self._run_ts, self._run_start = ts, hits[0]
            if self._run_ts is None:
                self._note(
                    "schedule unknown: the last step is not forced full (pass a pipeline or set_schedule)"
                )
        elif self._run_ts is not None:
            i = self._run_start + self._step
            if i >= len(self._run_ts) or abs(self._run_ts[i] - t) > 1e-4 * max(1.0, abs(t)):
                # A timestep on none of the schedule's levels means a controller jumped (FastForward): the
                # few large steps left are far from the cached features' noise level, so they run in full.
                # A timestep elsewhere on the grid (a stale scheduler, rows resumed by refine) keeps caching.
                off_grid = all(abs(s - t) > 1e-4 * max(1.0, abs(s)) for s in self._run_ts)
                self._run_ts, self._left_schedule = None, off_grid
                self._note(
                    "timesteps jumped off the known schedule: the remaining steps run in full"
                    if off_grid
                    else "timesteps left the known schedule: the last step is not forced full"
                )

    def _note(self, text: str) -> None:
        if text not in self.stats.notes:
            self.stats.notes.append(text)

    @property
    def run_length(self) -> int | None:
        return None if self._run_ts is None else len(self._run_ts) - self._run_start

    def _decide_full(self) -> bool | None:
        """Whether the current step runs in full; None = adaptive, decided at the probe."""
        k, n = self._step, self.run_length
        if (
            not self.enabled
            or self.mode == "off"
            or k == 0
            or self._left_schedule
            or (n is not None and k >= n - 1)
        ):
            return True
        if self.mode == "uniform":
            return uniform_full(k, self.interval)
        if self.mode == "schedule":
            if isinstance(self.refresh, StepProfile):
                if n is None:
                    self._note("schedule mode without a known run length: fell back to uniform")
                    return uniform_full(k, self.interval)
                if getattr(self, "_plan_n", None) != n:
                    budget = len(set(range(0, n, self.interval)) | {n - 1})  # what uniform spends
                    self._plan = set(plan_refresh(self.refresh, n, budget))
                    self._plan_n = n
                return k in self._plan
            if n is not None and k == 1 and max(self.refresh, default=0) >= n:  # said once per run
                self._note(
                    f"refresh steps {[s for s in self.refresh if s >= n]} lie beyond this {n}-step run: unused"
                )
            return k in self.refresh
        if self.max_skip is not None and self._since_full >= self.max_skip:
            return True
        return None
