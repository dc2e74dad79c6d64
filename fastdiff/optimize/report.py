"""What :func:`fastdiff.optimize` did, in a form that reads well when printed."""

from __future__ import annotations

from dataclasses import dataclass, field


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
        head = f"[{self.name}] {self.status}" + (f": {self.reason}" if self.reason else "")
        out = [head]
        if self.verification is not None:
            out.append(f"  verification {self.verification}")
        if self.changed:
            out.append(f"  changed {len(self.changed)}:")
            for path, note in self.changed[:max_items]:
                extra = self.details.get(path)
                out.append(f"    {path}: {note}" + (f" {extra}" if extra else ""))
            if len(self.changed) > max_items:
                out.append(f"    ... and {len(self.changed) - max_items} more")
        for path, detail in self.details.items():  # a measured winner that disagreed with native
            for key, rec in (detail.get("plan") or {}).items():
                ver = rec.get("verify") if isinstance(rec, dict) else None
                if ver and not ver["passed"]:
                    out.append(
                        f"  {path} {key}: {ver['candidate']} differed from native by {ver['rel_err']:.2e} "
                        f"(tolerance {ver['tolerance']:.0e}): kept native"
                    )
        if self.skipped:
            out.append(f"  skipped {len(self.skipped)}:")
            for path, why in self.skipped[:max_items]:
                out.append(f"    {path}: {why}")
            if len(self.skipped) > max_items:
                out.append(f"    ... and {len(self.skipped) - max_items} more")
        return out


@dataclass
class OptimizeReport:
    """Per-pass record: changed module paths, skipped ones with reasons, verification."""

    passes: list[PassReport] = field(default_factory=list)
    config: object = None
    verification: Verification | None = None  # of the final, fully optimised model

    def __getitem__(self, name: str) -> PassReport:
        for p in self.passes:
            if p.name == name:
                return p
        raise KeyError(f"no pass named {name!r}; passes: {', '.join(p.name for p in self.passes)}")

    def to_dict(self) -> dict:
        def ver(v):
            return None if v is None else {"error": v.error, "tolerance": v.tolerance, "passed": v.passed}

        return {
            "passes": [
                {
                    "name": p.name,
                    "status": p.status,
                    "reason": p.reason,
                    "changed": [list(c) for c in p.changed],
                    "skipped": [list(s) for s in p.skipped],
                    "details": p.details,
                    "verification": ver(p.verification),
                }
                for p in self.passes
            ],
            "verification": ver(self.verification),
        }

    def __str__(self) -> str:
        out = ["fastdiff optimize report"]
        for p in self.passes:
            out += p.lines()
        if self.verification is not None:
            out.append(f"final verification {self.verification}")
        return "\n".join(out)

    __repr__ = __str__
