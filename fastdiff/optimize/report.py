"""What :func:`fastdiff.optimize` did, in a form that reads well when printed."""

from __future__ import annotations

from dataclasses import dataclass, field, replace


@dataclass
class Verification:
    """Probe comparison of the optimised UNet against the original."""

    error: float  # max |out - ref| / max |ref|
    tolerance: float
    probe: str

    @property
    def passed(self) -> bool:
        return self.error <= self.tolerance

    def __str__(self) -> str:
        verdict = "ok" if self.passed else "FAILED"
        return f"{verdict}: rel. error {self.error:.2e} (tolerance {self.tolerance:.0e}, probe {self.probe})"


@dataclass
class PassReport:
    name: str
    status: str  # "applied", "disabled", "rolled back", "nothing to do"
    reason: str = ""
    changed: list[tuple[str, str]] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    details: dict[str, dict] = field(default_factory=dict)
    verification: Verification | None = None

    def lines(self, max_items: int = 12) -> list[str]:
        out = [f"[{self.name}] {self.status}" + (f": {self.reason}" if self.reason else "")]
        if self.verification is not None:
            out.append(f"  verification {self.verification}")
        changed = [
            f"{path}: {note}" + (f" {self.details[path]}" if self.details.get(path) else "")
            for path, note in self.changed
        ]
        out += _listing("changed", changed, max_items)
        for path, detail in self.details.items():  # a measured winner that disagreed with native
            for key, rec in (detail.get("plan") or {}).items():
                ver = rec.get("verify") if isinstance(rec, dict) else None
                if ver and not ver["passed"]:
                    out.append(
                        f"  {path} {key}: {ver['candidate']} differed from native by {ver['rel_err']:.2e} "
                        f"(tolerance {ver['tolerance']:.0e}): kept native"
                    )
        out += _listing("skipped", [f"{path}: {why}" for path, why in self.skipped], max_items)
        return out


def _listing(title: str, items: list[str], max_items: int) -> list[str]:
    """``title`` with the count, then the first ``max_items`` items and how many more there are."""
    if not items:
        return []
    out = [f"  {title} {len(items)}:", *(f"    {item}" for item in items[:max_items])]
    if len(items) > max_items:
        out.append(f"    ... and {len(items) - max_items} more")
    return out


@dataclass
class StepCacheSection:
    """The step cache installed on the U-Net (``fastdiff.step_cache``): its settings and what it last did."""

    handle: str  # the handle's repr: mode, interval, branch, gate, enabled
    last_run: object = None  # fastdiff.caching.StepCacheRun of the current/last run, None before one
    totals: dict = field(default_factory=dict)  # counters since installation (StepCacheStats, no trace)

    def lines(self) -> list[str]:
        out = [f"[step_cache] installed: {self.handle}"]
        out.append(f"  last run: {self.last_run}" if self.last_run is not None else "  last run: none yet")
        if self.totals:
            t = self.totals
            out.append(
                f"  since installed: {t['runs']} runs, {t['unet_calls']} U-Net calls, {t['full_calls']} full, "
                f"{t['cached_calls']} cached ({t['skipped_fraction']:.0%} skipped), "
                f"{t['forced_refreshes']} forced refreshes"
            )
        for note in getattr(self.last_run, "notes", ()):
            out.append(f"  note: {note}")
        return out

    def to_dict(self) -> dict:
        run = self.last_run
        return {
            "handle": self.handle,
            "last_run": None if run is None else {**vars(run), "skipped_fraction": run.skipped_fraction},
            "totals": dict(self.totals),
        }


def with_step_cache(report: OptimizeReport, unet) -> OptimizeReport:
    """``report`` with a :class:`StepCacheSection` for the step cache on ``unet`` (a copy; None if none)."""
    from fastdiff.caching.hooks import installed_cache  # lazy: fastdiff.optimize does not need the cache

    handle = installed_cache(unet)
    section = None
    if handle is not None:
        totals = {k: v for k, v in handle.stats.as_dict().items() if k not in ("trace", "notes")}
        section = StepCacheSection(repr(handle), handle.last_run(), totals)
    return replace(report, step_cache=section)


@dataclass
class OptimizeReport:
    """Per-pass record: changed module paths, skipped ones with reasons, verification."""

    passes: list[PassReport] = field(default_factory=list)
    config: object = None
    verification: Verification | None = None  # of the final, fully optimised model
    step_cache: StepCacheSection | None = None  # filled by fastdiff.report when a step cache is installed

    def __getitem__(self, name: str) -> PassReport:
        for p in self.passes:
            if p.name == name:
                return p
        raise KeyError(f"no pass named {name!r}; passes: {', '.join(p.name for p in self.passes)}")

    def to_dict(self) -> dict:
        def ver(v):
            return None if v is None else {"error": v.error, "tolerance": v.tolerance, "passed": v.passed}

        return {
            "passes": [  # every PassReport field, in order; JSON-ready
                {
                    **vars(p),
                    "changed": [list(c) for c in p.changed],
                    "skipped": [list(s) for s in p.skipped],
                    "verification": ver(p.verification),
                }
                for p in self.passes
            ],
            "verification": ver(self.verification),
            "step_cache": None if self.step_cache is None else self.step_cache.to_dict(),
        }

    def __str__(self) -> str:
        out = ["fastdiff optimize report"]
        for p in self.passes:
            out += p.lines()
        if self.verification is not None:
            out.append(f"final verification {self.verification}")
        if self.step_cache is not None:
            out += self.step_cache.lines()
        return "\n".join(out)

    __repr__ = __str__
