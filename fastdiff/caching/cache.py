"""The step cache: replay deep U-Net features on cheap steps, refresh them on full steps.

(One file above the usual size: the pre-hook, the unit wrappers, ``keep_rows`` and the gate share one
per-call state machine, and splitting it would spread that state over modules.)

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
* **torch.compile.** The per-call decision is Python state set in the pre-hook before any unit runs, so
  each path (full, cached) is a graph without breaks; reading the timestep is the one data-dependent
  step (see ``benchmarks/results/step_cache.md`` for ``torch._dynamo.explain`` counts).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from fastdiff import installed
from fastdiff.caching.policy import StepProfile, explicit_refresh, plan_refresh, uniform_full
from fastdiff.caching.units import cross_attentions, layout

MODES = ("uniform", "schedule", "adaptive", "off")
_HANDLE_ATTR = "_fastdiff_step_cache"


@dataclass
class StepCacheStats:
    """What the cache did since it was installed (or since :meth:`StepCache.reset_stats`)."""

    runs: int = 0
    steps: int = 0
    full_steps: int = 0
    cached_steps: int = 0
    unet_calls: int = 0
    full_calls: int = 0
    cached_calls: int = 0
    gated_calls: int = 0  # calls in which cross-attention outputs were replayed
    forced_refreshes: int = 0  # calls run in full because the batch did not match the cache
    halved_calls: int = 0  # gated guidance pairs run as the conditional half only (gate_uncond)
    trace: list[dict] = field(default_factory=list)  # per step of the current/last run
    notes: list[str] = field(default_factory=list)

    @property
    def skipped_fraction(self) -> float:
        """Share of U-Net calls that replayed the deep features."""
        return self.cached_calls / self.unet_calls if self.unet_calls else 0.0

    def as_dict(self) -> dict:
        keys = ("runs", "steps", "full_steps", "cached_steps", "unet_calls", "full_calls", "cached_calls")
        out = {k: getattr(self, k) for k in keys}
        out.update(
            gated_calls=self.gated_calls,
            forced_refreshes=self.forced_refreshes,
            halved_calls=self.halved_calls,
            skipped_fraction=round(self.skipped_fraction, 4),
            trace=list(self.trace),
            notes=list(self.notes),
        )
        return out


def _batch_of(tree) -> int | None:
    if isinstance(tree, torch.Tensor):
        return tree.shape[0] if tree.dim() else None
    if isinstance(tree, (tuple, list)):
        for x in tree:
            n = _batch_of(x)
            if n is not None:
                return n
    return None


def _mean_halves(tree):
    if isinstance(tree, torch.Tensor):
        half = tree.shape[0] // 2
        return (tree[:half] + tree[half:]) / 2
    if isinstance(tree, (tuple, list)):
        return type(tree)(_mean_halves(x) for x in tree)
    raise TypeError(f"step_cache: cannot average a cached {type(tree).__name__}")


def _take_rows(tree, index: torch.Tensor):
    if isinstance(tree, torch.Tensor):
        return tree.index_select(0, index.to(tree.device))
    if isinstance(tree, (tuple, list)):
        return type(tree)(_take_rows(x, index) for x in tree)
    raise TypeError(f"step_cache: cannot select rows of a cached {type(tree).__name__}")


class StepCache:
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
        self._external: tuple[int, float] | None = None  # (count, t) of the step announced by begin_step
        self._announced = 0
        self._clear_run()

    # ------------------------------------------------------------------ configuration
    def set(
        self,
        mode: str = "uniform",
        interval: int = 3,
        branch: int = 0,
        refresh: Sequence[int] | StepProfile | None = None,
        threshold: float = 0.1,
        max_skip: int | None = None,
        gate_step: int | None = None,
        gate_uncond: bool = False,
    ) -> StepCache:
        """Change the policy in place (no re-enable needed); clears cached features."""
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        if not isinstance(interval, int) or isinstance(interval, bool) or interval < 1:
            raise ValueError(f"interval must be an int >= 1, got {interval!r}")
        n_branches = self._layout.num_branches
        if not isinstance(branch, int) or isinstance(branch, bool) or not 0 <= branch < n_branches:
            raise ValueError(f"branch must be an int in [0, {n_branches - 1}] for this U-Net, got {branch!r}")
        if mode == "schedule":
            if refresh is None:
                raise ValueError("mode='schedule' needs refresh= (a list of steps or a StepProfile)")
            if not isinstance(refresh, StepProfile):
                refresh = sorted(explicit_refresh(refresh, None))
        elif refresh is not None:
            raise ValueError(f"refresh= is only used with mode='schedule', got mode={mode!r}")
        if not (isinstance(threshold, (int, float)) and math.isfinite(threshold) and threshold > 0):
            raise ValueError(f"threshold must be a finite number > 0, got {threshold!r}")
        if max_skip is not None and (
            not isinstance(max_skip, int) or isinstance(max_skip, bool) or max_skip < 1
        ):
            raise ValueError(f"max_skip must be None or an int >= 1, got {max_skip!r}")
        if gate_step is not None and (
            not isinstance(gate_step, int) or isinstance(gate_step, bool) or gate_step < 0
        ):
            raise ValueError(f"gate_step must be None or an int >= 0 (run-relative step), got {gate_step!r}")
        if not isinstance(gate_uncond, bool) or (gate_uncond and gate_step is None):
            raise ValueError(f"gate_uncond must be a bool and needs gate_step, got {gate_uncond!r}")
        if gate_step is not None and not self._xattn:
            raise ValueError("gate_step was given but this U-Net has no cross-attention to gate")
        self.mode, self.interval, self.branch = mode, interval, branch
        self.refresh, self.threshold, self.gate_step = refresh, float(threshold), gate_step
        self.gate_uncond = gate_uncond
        self.max_skip = max_skip if max_skip is not None else (4 if mode == "adaptive" else None)
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
        self.stats = StepCacheStats()

    # ------------------------------------------------------------------ rows
    def keep_rows(self, index: torch.Tensor, num_rows: int | None = None) -> None:
        """Keep only rows ``index`` of the cached features (rows that left the batch are dropped).

        ``index`` indexes the rows of the previous step. The U-Net batch may hold each row several times
        in consecutive blocks (classifier-free guidance batches ``[uncond; cond]``): pass ``num_rows``,
        the number of rows before this call, and the blocks are inferred as ``batch // num_rows``.
        """
        if not isinstance(index, torch.Tensor) or index.dim() != 1 or index.dtype in (torch.bool,):
            raise ValueError(f"index must be a 1-D integer tensor, got {index!r}")
        if index.is_floating_point() or index.is_complex():
            raise ValueError(f"index must hold integers, got dtype {index.dtype}")
        index = index.long().cpu()
        if index.numel() != index.unique().numel():
            raise ValueError(f"index has repeated rows: {index.tolist()}")
        for slot, store in enumerate(self._slots):
            batch = self._slot_batch[slot]
            if batch is None:
                continue
            rows = batch if num_rows is None else num_rows
            if not isinstance(rows, int) or rows < 1 or batch % rows:
                raise ValueError(f"num_rows must divide the cached batch {batch}, got {num_rows!r}")
            if index.numel() and (int(index.min()) < 0 or int(index.max()) >= rows):
                raise ValueError(f"index {index.tolist()} is out of range for {rows} rows")
            full = torch.cat([index + g * rows for g in range(batch // rows)])
            for k in list(store):
                store[k] = _take_rows(store[k], full)
            gate = self._gate[slot]
            for k in list(gate):
                gate[k] = _take_rows(gate[k], full)
            if self._probe_prev[slot] is not None:
                self._probe_prev[slot] = _take_rows(self._probe_prev[slot], full)
            self._slot_batch[slot] = full.numel()

    # ------------------------------------------------------------------ run state
    def _clear_run(self) -> None:
        self._last_key: tuple | None = None
        self._last_t: tuple | None = None
        self._step = -1  # run-relative index of the current step
        self._slot = -1
        self._run_ts: list[float] | None = None
        self._run_start = 0  # index of the run's first timestep in _run_ts
        self._slots: list[dict] = []
        self._gate: list[dict] = []
        self._slot_batch: list[int | None] = []
        self._probe_prev: list[torch.Tensor | None] = []
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
                self._run_ts = None
                self._note("timesteps left the known schedule: the last step is not forced full")

    def _note(self, text: str) -> None:
        if text not in self.stats.notes:
            self.stats.notes.append(text)

    @property
    def run_length(self) -> int | None:
        return None if self._run_ts is None else len(self._run_ts) - self._run_start

    def _decide_full(self) -> bool | None:
        """Whether the current step runs in full; None = adaptive, decided at the probe."""
        k, n = self._step, self.run_length
        if not self.enabled or self.mode == "off" or k == 0 or (n is not None and k >= n - 1):
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
            return k in self.refresh
        if self.max_skip is not None and self._since_full >= self.max_skip:
            return True
        return None

    # ------------------------------------------------------------------ hooks
    def _pre_hook(self, module, args, kwargs):
        for name in ("down_block_additional_residuals", "mid_block_additional_residual"):
            if kwargs.get(name) is not None and self.enabled and self.mode != "off":
                raise NotImplementedError(
                    f"step_cache does not support ControlNet residuals ({name}); fastdiff.restore the cache first"
                )
        if (
            kwargs.get("down_intrablock_additional_residuals") is not None
            and self.enabled
            and self.mode != "off"
        ):
            raise NotImplementedError("step_cache does not support T2I-Adapter residuals")
        sample = args[0] if args else kwargs["sample"]
        t = args[1] if len(args) > 1 else kwargs["timestep"]
        if self._external is not None:  # announced by begin_step: nothing data-dependent in the traced call
            key, tvals = self._external, (self._external[1],)
            repeat = key == self._last_key
        else:
            tvals = tuple(torch.as_tensor(t).detach().flatten().tolist())
            key = tvals
            # A repeated timestep is another call of the same step, unless every call slot of a step has
            # been seen (PNDM evaluates its first timestep twice as two steps).
            repeat = key == self._last_key and (
                self._calls_per_step is None or self._slot + 1 < self._calls_per_step
            )
        if not repeat:
            if self._last_t is not None and max(tvals) > max(self._last_t):
                self._clear_run()  # a larger timestep: a new run
            if self._step == 0 and self._calls_per_step is None:
                self._calls_per_step = self._slot + 1
            if self._step < 0:
                self.stats.runs += 1
                self.stats.trace = []
            self._last_key, self._last_t = key, tvals
            self._step += 1
            self._slot = 0
            self._accum_step = False
            self._locate(tvals)
            self._step_full = self._decide_full()
            self.stats.steps += 1
            self.stats.trace.append({"step": self._step, "t": tvals[0], "full": self._step_full})
        else:
            self._slot += 1
        while len(self._slots) <= self._slot:
            self._slots.append({})
            self._gate.append({})
            self._slot_batch.append(None)
            self._probe_prev.append(None)
        batch = sample.shape[0]
        self._gating = (
            self.enabled
            and self.gate_step is not None
            and self._step > self.gate_step
            and not (self.run_length is not None and self._step >= self.run_length - 1)
            and self._slot_batch[self._slot] in (batch, batch // 2)
        )
        self._halved = False
        if self._gating and self.gate_uncond and self._is_guidance_pair(sample, t):
            args, kwargs = self._halve(args, kwargs, batch)
            batch //= 2
        self._gating = self._gating and self._slot_batch[self._slot] == batch
        matches = self._slot_batch[self._slot] == batch
        if self._step_full is True:
            self._call = "full"
        elif not matches:
            self._call = "full"
            self.stats.forced_refreshes += 1
        else:
            self._call = "cached" if self._step_full is False else "probe"
        self._slot_batch[self._slot] = batch
        self.stats.unet_calls += 1
        self.stats.gated_calls += self._gating
        self.stats.halved_calls += self._halved
        return (args, kwargs) if self._halved else None

    @staticmethod
    def _is_guidance_pair(sample: torch.Tensor, t) -> bool:
        """A classifier-free guidance batch: the latents are the same rows twice, ``[x; x]``."""
        b = sample.shape[0]
        if b % 2:
            return False
        t = torch.as_tensor(t)
        same_t = t.dim() == 0 or t.numel() == 1 or torch.equal(t[: b // 2], t[b // 2 :])
        return bool(same_t) and torch.equal(sample[: b // 2], sample[b // 2 :])

    def _halve(self, args, kwargs, batch: int):
        """Run only the conditional half (T-GATE, Zhang et al. 2024, Sec. 4: after the gate the two halves differ
        only through cross-attention, which is now the halves' mean), and keep the cache's rows in step."""
        half = batch // 2
        cond = torch.arange(half, batch)

        def take(x):
            if isinstance(x, torch.Tensor) and x.dim() and x.shape[0] == batch:
                return x[half:]
            if isinstance(x, dict):
                return {k: take(v) for k, v in x.items()}
            return x

        slot = self._slot
        if self._slot_batch[slot] == batch:  # first halved call: cached rows follow the conditional half
            store = self._slots[slot]
            for k in list(store):
                store[k] = _take_rows(store[k], cond)
            gate = self._gate[slot]
            for k in list(gate):
                gate[k] = _mean_halves(gate[k])
            if self._probe_prev[slot] is not None:
                self._probe_prev[slot] = _take_rows(self._probe_prev[slot], cond)
            self._slot_batch[slot] = half
        self._halved = True
        return tuple(take(a) for a in args), {k: take(v) for k, v in kwargs.items()}

    def _post_hook(self, module, args, kwargs, output):
        full = self._call == "full"  # a probe call that replayed the deep part counts as cached
        self.stats.full_calls += full
        self.stats.cached_calls += not full
        if self._slot == 0:
            rec = self.stats.trace[-1]
            rec["full"] = full
            if self._step_full is None:
                self._step_full = full
            if not math.isnan(self._signal):
                rec["signal"] = round(self._signal, 5)
                self._signal = float("nan")
            self.stats.full_steps += full
            self.stats.cached_steps += not full
            self._since_full = 0 if full else self._since_full + 1
        if not self._halved:
            return None
        if isinstance(output, tuple):  # both halves of the guidance pair get the one prediction
            return (torch.cat([output[0], output[0]]), *output[1:])
        return type(output)(sample=torch.cat([output.sample, output.sample]))

    def _wrap(self, module: nn.Module, fn) -> None:
        self._originals.append((module, module.__dict__.get("forward")))
        module.forward = fn

    def _unit_forward(self, module: nn.Module):
        original = module.forward
        key = id(module)

        def forward(*args, **kwargs):
            store = self._slots[self._slot]
            if self._call == "cached" and key in self._replayed and key in store:
                return store[key]
            out = original(*args, **kwargs)
            if self._call == "full" and (key in self._replayed or key == self._entry):
                if key == self._entry and self.mode == "off" and self._slot == 0 and key in store:
                    self._record_drift(store[key], out)  # measuring for StepProfile only: a host sync
                if self.mode != "off" or key == self._entry:
                    store[key] = out
            if key == self._probe and self.mode == "adaptive":
                if self._call == "probe":
                    self._decide_at_probe(out)
                else:  # full steps still give the next step its reference
                    self._probe_prev[self._slot] = out[0] if isinstance(out, tuple) else out
            return out

        return forward

    def _record_drift(self, before, after) -> None:
        if isinstance(before, tuple):
            before, after = before[0], after[0]
        if before.shape == after.shape and self._step > 0:
            d = float((after.float() - before.float()).norm() / after.float().norm().clamp_min(1e-12))
            self.stats.trace[-1]["drift"] = round(d, 6)

    def _decide_at_probe(self, out) -> None:
        cur = out[0] if isinstance(out, tuple) else out
        prev = self._probe_prev[self._slot]
        self._probe_prev[self._slot] = cur
        if prev is None or prev.shape != cur.shape:
            self._call = "full"
            return
        if self._slot == 0 and not self._accum_step:
            change = float((cur - prev).abs().mean() / prev.abs().mean().clamp_min(1e-12))
            self._accum += change
            self._accum_step = True
            self._signal = change
        if self._accum >= self.threshold:
            self._call = "full"
            self._accum = 0.0
        else:
            self._call = "cached"

    def _gate_forward(self, module: nn.Module):
        original = module.forward
        key = id(module)

        def forward(*args, **kwargs):
            gate = self._gate[self._slot]
            if self._gating and key in gate:
                return gate[key]
            out = original(*args, **kwargs)
            if (
                self.gate_step is not None
                and self.enabled
                and (self._step <= self.gate_step or key not in gate)
            ):
                gate[key] = out
            return out

        return forward

    def _install(self) -> None:
        units = [u for g in self._layout.producers for u in g] + [u for g in self._layout.up_path for u in g]
        if self._layout.mid is not None:
            units.append(self._layout.mid)
        for u in units:
            self._wrap(u.module, self._unit_forward(u.module))
        for _, attn2 in self._xattn:
            self._wrap(attn2, self._gate_forward(attn2))
        pre = self.unet.register_forward_pre_hook(self._pre_hook, with_kwargs=True)
        post = self.unet.register_forward_hook(self._post_hook, with_kwargs=True)
        self._hook = (pre, post)
        self.unet.__dict__[_HANDLE_ATTR] = self

    def remove(self) -> None:
        """Remove every wrapper and hook and drop cached tensors (what ``fastdiff.restore`` calls)."""
        for module, previous in reversed(self._originals):
            if previous is None:
                module.__dict__.pop("forward", None)
            else:
                module.forward = previous
        self._originals = []
        if self._hook is not None:
            for h in self._hook:
                h.remove()
            self._hook = None
        self.unet.__dict__.pop(_HANDLE_ATTR, None)
        self._clear_run()

    @property
    def installed(self) -> bool:
        return self._hook is not None

    def __repr__(self) -> str:
        return (
            f"StepCache(mode={self.mode!r}, interval={self.interval}, branch={self.branch}, "
            f"gate_step={self.gate_step}, enabled={self.enabled}, installed={self.installed})"
        )


def step_cache(pipe_or_unet, mode: str = "uniform", **options) -> StepCache:
    """Install a step cache on a diffusers pipeline (its ``unet``) or on a ``UNet2DConditionModel``.

    Args:
        pipe_or_unet: a pipeline with ``.unet`` (its ``scheduler.timesteps`` tells the cache where the
            last step is) or the U-Net itself (then call ``handle.set_schedule(timesteps)`` per run).
        mode: ``"uniform"``, ``"schedule"``, ``"adaptive"`` or ``"off"`` (see the module docstring).
        **options: ``interval`` (3), ``branch`` (0 = shallowest), ``refresh`` (schedule mode: steps or a
            :class:`StepProfile`), ``threshold`` (adaptive, 0.1), ``max_skip`` (adaptive, 4),
            ``gate_step`` (cross-attention gating from this run-relative step on), ``gate_uncond``
            (after the gate, run a guidance pair's conditional half only).

    Returns:
        A :class:`StepCache`; ``handle.stats`` counts full and cached steps. ``fastdiff.restore`` (or
        ``fastdiff.installed.undo_all``) on the same object removes it.
    """
    unet = getattr(pipe_or_unet, "unet", None)
    pipe = pipe_or_unet if unet is not None else None
    unet = unet if unet is not None else pipe_or_unet
    if not isinstance(unet, nn.Module):
        raise TypeError(
            f"step_cache needs a pipeline with .unet or a UNet2DConditionModel, got {type(unet)!r}"
        )
    if unet.__dict__.get(_HANDLE_ATTR) is not None:
        raise RuntimeError(
            "a step cache is already installed on this U-Net; change it with handle.set(...) or remove it "
            "with fastdiff.restore first"
        )
    handle = StepCache(unet, pipe)
    handle.set(mode, **options)
    handle._install()
    installed.record(pipe_or_unet, "step_cache", handle.remove, mode=mode, **options)
    return handle
