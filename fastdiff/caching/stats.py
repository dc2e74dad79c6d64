"""What a step cache did: counters since installation (:class:`StepCacheStats`)."""

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
