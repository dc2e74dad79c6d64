"""What a step cache did: counters since installation (:class:`StepCacheStats`) and per run (:class:`StepCacheRun`)."""

from __future__ import annotations

from dataclasses import dataclass, field


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
    run_calls: list[int] = field(default_factory=lambda: [0, 0, 0])  # current/last run: calls, full, forced

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


@dataclass(frozen=True)
class StepCacheRun:
    """What the cache did in one denoising run (``output.fastdiff.step_cache`` of a pipeline call).

    full_evals / cached_evals: U-Net calls that ran the deep part / replayed it (a guidance pair batched in
    one call counts once); refresh_steps: run-relative steps whose first call ran in full (the first and
    last step of a known schedule always do); forced_refreshes: calls run in full because the batch did
    not match the cached rows.
    """

    mode: str
    enabled: bool
    steps: int
    full_evals: int
    cached_evals: int
    refresh_steps: tuple[int, ...]
    forced_refreshes: int
    notes: tuple[str, ...]
    forecast: str = "none"  # how cached steps got the entry feature (see fastdiff.caching.forecast)

    @property
    def skipped_fraction(self) -> float:
        """Share of this run's U-Net calls that replayed the deep features."""
        calls = self.full_evals + self.cached_evals
        return self.cached_evals / calls if calls else 0.0

    def __str__(self) -> str:
        return (
            f"{self.full_evals} full / {self.cached_evals} cached U-Net evaluations "
            f"({self.skipped_fraction:.0%} skipped) over {self.steps} steps, mode {self.mode!r}"
            + (f", forecast {self.forecast!r}" if self.forecast != "none" else "")
            + ("" if self.enabled else " (disabled)")
            + f", refresh steps {list(self.refresh_steps)}"
            + (f", {self.forced_refreshes} forced refreshes" if self.forced_refreshes else "")
        )


def run_summary(
    stats: StepCacheStats, mode: str, enabled: bool, forecast: str = "none"
) -> StepCacheRun | None:
    """The :class:`StepCacheRun` of the current or last run in ``stats`` (None before the first run)."""
    if not stats.trace:
        return None
    calls, full, forced = stats.run_calls
    return StepCacheRun(
        mode=mode,
        enabled=enabled,
        steps=len(stats.trace),
        full_evals=full,
        cached_evals=calls - full,
        refresh_steps=tuple(r["step"] for r in stats.trace if r["full"]),
        forced_refreshes=forced,
        notes=tuple(stats.notes),
        forecast=forecast,
    )
