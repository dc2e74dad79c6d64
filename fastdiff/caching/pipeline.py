"""The step cache on fastdiff's drop-in pipelines: rows that leave the batch, and each call's cache stats.

``fastdiff.StableDiffusionPipeline`` and its siblings run :func:`fastdiff.sample`, whose rows may stop at
different steps (``early_stop``, per-image step counts). The cache holds its features row by row, so when
rows leave the batch it must keep the remaining rows' features, in the remaining rows' order
(:meth:`~fastdiff.caching.StepCache.keep_rows`), or the next cached step would replay another image's
features (or, as the cache does on any batch it does not recognise, run in full).

:func:`~fastdiff.caching.step_cache` on such a pipeline installs a :class:`RowsRetiredHook` as
``pipe.fastdiff_on_rows_retired`` (the pipeline hands it to ``fastdiff.sample`` as ``on_rows_retired``, which
calls it with the absolute rows still running). The hook turns those rows into positions within the rows
of the previous U-Net call; with classifier-free guidance the U-Net batch is ``[uncond rows; cond rows]``
and ``keep_rows`` keeps both blocks. A hook the user had set is called after it; ``fastdiff.restore`` puts
that hook back. :func:`finish_call` is what the pipeline calls at the end of each call: it returns the
run's :class:`~fastdiff.caching.stats.StepCacheRun` (``output.fastdiff.step_cache``) and re-arms the hook.

When the hook cannot follow the rows (a run it did not see from its start), it resets the cache instead:
the next call runs in full, never with another row's features.
"""

from __future__ import annotations

import weakref

import torch

from fastdiff import installed
from fastdiff.caching.hooks import installed_cache
from fastdiff.caching.stats import StepCacheRun

__all__ = ["RowsRetiredHook", "begin_call", "finish_call", "install_rows_hook"]

HOOK_ATTR = "fastdiff_on_rows_retired"  # FastdiffPipelineMixin's integration point


class RowsRetiredHook:
    """``on_rows_retired`` for a pipeline with a step cache: keeps the cached features of the rows still running.

    ``rows`` (a resumed run's rows at the pause) binds the hook to a run that starts with those rows; the
    pipeline's own hook starts every call with all the rows of the call's first U-Net evaluation.
    """

    def __init__(self, cache, pipe, inner=None, rows: list[int] | None = None):
        self.cache = cache
        self.inner = inner  # the user's hook, called after this one
        self._pipe = weakref.ref(pipe)
        self._initial = rows
        self._bound: weakref.WeakSet = weakref.WeakSet()  # hooks of paused runs made from this one
        self.rearm()

    def rearm(self) -> None:
        """Forget the rows of the last call; the next notification belongs to a new call (or a resumed run)."""
        self.prev = None if self._initial is None else list(self._initial)
        self.serial = None  # the cache run prev belongs to; None: the run the next notification finds

    def __call__(self, remaining: torch.Tensor) -> None:
        try:
            self._follow([int(r) for r in remaining.tolist()])
        finally:
            if self.inner is not None:
                self.inner(remaining)

    def _follow(self, rows: list[int]) -> None:
        cache = self.cache
        pipe = self._pipe()
        # the same test diffusers' pipelines and fastdiff's capture use for a guided [uncond; cond] batch
        blocks = 2 if bool(getattr(pipe, "do_classifier_free_guidance", False)) else 1
        prev, known = self.prev, True
        if prev is None:
            first = cache._first_batch  # the call's first U-Net evaluation covered every row
            known = first is not None and first % blocks == 0
            prev = list(range(first // blocks)) if known else []
        elif self.serial is not None and self.serial != cache._run_serial:
            known = False  # the cache started a run this hook did not follow (an interrupted call)
        known = known and set(rows) <= set(prev) and cache._holds_rows(len(prev), blocks)
        if known:
            if len(rows) < len(prev):
                index = torch.tensor([prev.index(r) for r in rows], dtype=torch.long)
                cache.keep_rows(index, num_rows=len(prev))
            self.prev, self.serial = rows, cache._run_serial
            return
        cache.reset()  # the next call starts a new run, in full, with exactly these rows
        cache._note(
            "rows left the batch in a run the rows hook had not followed: cache reset (one full step)"
        )
        self.prev, self.serial = rows, cache._run_serial + 1

    def bound_to(self, rows: list[int]) -> RowsRetiredHook:
        """A hook for a paused run that resumes with ``rows`` (``pipe.refine``)."""
        hook = RowsRetiredHook(self.cache, self._pipe(), self.inner, rows=list(rows))
        self._bound.add(hook)
        return hook


def install_rows_hook(pipe, cache) -> RowsRetiredHook:
    """Set ``pipe.fastdiff_on_rows_retired`` (composing with a hook already set); recorded for restore."""
    had = HOOK_ATTR in vars(pipe)
    previous = vars(pipe).get(HOOK_ATTR)
    hook = RowsRetiredHook(cache, pipe, inner=getattr(pipe, HOOK_ATTR))
    setattr(pipe, HOOK_ATTR, hook)

    def undo() -> None:
        if vars(pipe).get(HOOK_ATTR) is not hook:
            return  # replaced since: the newer hook stays
        if had:
            setattr(pipe, HOOK_ATTR, previous)
        else:
            delattr(pipe, HOOK_ATTR)

    installed.record(pipe, "step_cache_rows_hook", undo)
    return hook


def begin_call(pipe, timesteps) -> None:
    """Start of a drop-in pipeline call whose rows share one schedule: tell the cache its timesteps.

    fastdiff samples on a copy of ``pipe.scheduler``, so without this the cache cannot see where the run
    ends (the last step would not be forced full and a profile schedule would fall back to uniform).
    :func:`finish_call` forgets the schedule again.
    """
    cache = installed_cache(pipe.unet)
    if cache is not None:
        cache.set_schedule(timesteps)
        cache._call_schedule = True


def finish_call(pipe, state=None) -> StepCacheRun | None:
    """End of a drop-in pipeline call: the cache's run summary, and the hook re-armed for the next call.

    ``state``: the paused run's :class:`~fastdiff.dynamic.tick.SampleState` of a ``preview_steps`` call (its
    hook is bound to the rows still running, for ``pipe.refine``), or None when the run finished. Either way
    the cache forgets the run, so no later call can replay its features whatever its timesteps (a refine
    starts with one full step: another call may have run in between).
    """
    cache = installed_cache(pipe.unet)
    if cache is None:
        return None
    summary = cache.last_run()
    hook = vars(pipe).get(HOOK_ATTR)
    if isinstance(hook, RowsRetiredHook):
        for h in (hook, *hook._bound):
            h.rearm()
        if state is not None and state.on_rows_retired is hook:
            state.on_rows_retired = hook.bound_to(state.live_rows)
    cache.reset()
    cache._first_batch = None
    if cache._call_schedule:  # set by begin_call for this call only
        cache._schedule_override, cache._call_schedule = None, False
    return summary
