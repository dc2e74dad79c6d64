"""Measured per-shape dispatch with a persistent plan cache.

A kernel is only worth using where it is faster than the native op *on this device, for this shape*. The
:class:`Planner` times each candidate once per distinct key (op, shapes, dtype, layout), keeps the fastest
(an alternative must beat the native candidate by ``margin``, so timing noise never selects a slower
kernel), and stores the decision in a JSON file keyed by device name and library versions
(torch, triton, fastdiff). The next process reads the file instead of timing again; a corrupt file is
ignored and rewritten.

Cache directory: ``plan_cache_dir`` argument, else ``$FASTDIFF_CACHE_DIR/plans``, else
``~/.cache/fastdiff/plans``.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch

NATIVE = "native"
# how much faster than native an alternative must measure to be kept
DEFAULT_MARGIN = 0.03

# counters the tests (and curious users) can read: how many shapes were actually timed
stats = {"timed": 0, "cache_hits": 0}


def default_cache_dir() -> Path:
    env = os.environ.get("FASTDIFF_CACHE_DIR")
    if env:
        return Path(env) / "plans"
    return Path.home() / ".cache" / "fastdiff" / "plans"


def device_name(device: torch.device) -> str:
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "cpu":
        from fastdiff._compat import cpu_model  # lead-owned helper (model string of the host CPU)

        return f"cpu-{cpu_model()}-{torch.get_num_threads()}threads"
    return device.type


def _versions() -> str:
    from fastdiff._compat import version_of

    return "-".join(f"{m}{version_of(m) or 'none'}" for m in ("torch", "triton", "fastdiff"))


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "_", text).strip("_")[:120]


def measure(fns: dict[str, Callable[[], object]], device: torch.device, reps: int = 5) -> dict[str, float]:
    """Median seconds per call of each candidate.

    CUDA: ``triton.testing.do_bench`` (L2-flushed, synchronised) with cuDNN autotuning on, so the native
    conv is timed with its best algorithm. CPU: interleaved median of ``reps`` calls after one warm-up, so
    machine noise hits every candidate alike.
    """
    stats["timed"] += 1
    if torch.device(device).type == "cuda":
        import triton.testing

        torch.backends.cudnn.benchmark = True
        return {name: triton.testing.do_bench(fn, warmup=10, rep=40) / 1e3 for name, fn in fns.items()}
    for fn in fns.values():
        fn()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - t0)
    return {name: statistics.median(s) for name, s in samples.items()}


class PlanCache:
    """Decisions for one device and library-version combination, persisted as one JSON file."""

    def __init__(self, cache_dir: str | os.PathLike | None, device: torch.device):
        self.dir = Path(cache_dir) if cache_dir else default_cache_dir()
        self.path = self.dir / f"{_slug(device_name(device))}--{_slug(_versions())}.json"
        self._lock = threading.Lock()
        self.entries: dict[str, dict] = self._read()

    def _read(self) -> dict[str, dict]:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as err:
            warnings.warn(f"ignoring unreadable fastdiff plan cache {self.path}: {err}", stacklevel=3)
            return {}
        if not isinstance(data, dict) or not isinstance(data.get("entries"), dict):
            warnings.warn(f"ignoring malformed fastdiff plan cache {self.path}", stacklevel=3)
            return {}
        return {k: v for k, v in data["entries"].items() if isinstance(v, dict) and "choice" in v}

    def get(self, key: str) -> dict | None:
        return self.entries.get(key)

    def put(self, key: str, record: dict) -> None:
        with self._lock:
            self.entries[key] = record
            merged = {**self._read_quiet(), **self.entries}  # keep what other processes wrote meanwhile
            try:
                self.dir.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=".plan-", suffix=".json")
                with os.fdopen(fd, "w") as f:
                    json.dump({"format": 1, "entries": merged}, f, indent=1, sort_keys=True)
                os.replace(tmp, self.path)  # atomic: readers never see half a file
            except OSError as err:  # a read-only home must not break inference
                warnings.warn(f"could not write fastdiff plan cache {self.path}: {err}", stacklevel=3)

    def _read_quiet(self) -> dict[str, dict]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return self._read()


_CACHES: dict[tuple[str, str], PlanCache] = {}


def get_plan_cache(cache_dir, device) -> PlanCache:
    device = torch.device(device)
    key = (str(Path(cache_dir).resolve()) if cache_dir else str(default_cache_dir()), device_name(device))
    cache = _CACHES.get(key)
    if cache is None:
        cache = _CACHES[key] = PlanCache(cache_dir, device)
    return cache


def clear_memory_caches() -> None:
    """Forget loaded plan files (the next lookup re-reads disk); used by tests to emulate a new process."""
    _CACHES.clear()


def _winner(times: dict[str, float], margin: float) -> str:
    best = min(times, key=times.get)
    if best != NATIVE and times[best] > (1.0 - margin) * times[NATIVE]:
        return NATIVE
    return best


def choose(
    key: str,
    candidates: dict[str, Callable[[], object]],
    device: torch.device,
    cache_dir=None,
    margin: float = DEFAULT_MARGIN,
) -> tuple[str, dict]:
    """Pick the fastest candidate for ``key``; returns (name, record).

    ``candidates`` must contain :data:`NATIVE`. With a single candidate nothing is timed.
    """
    if NATIVE not in candidates:
        raise ValueError(f"candidates must include {NATIVE!r}, got {sorted(candidates)}")
    if len(candidates) == 1:
        return NATIVE, {"choice": NATIVE, "source": "only candidate"}
    cache = get_plan_cache(cache_dir, device)
    record = cache.get(key)
    if record is not None and record["choice"] in candidates:
        stats["cache_hits"] += 1
        return record["choice"], {**record, "source": "plan cache"}
    failed = {}
    with torch.no_grad():
        for name in [n for n in candidates if n != NATIVE]:
            try:  # a kernel that cannot compile or run on this device is never chosen
                candidates[name]()
            except Exception as err:  # noqa: BLE001 - any failure disqualifies the candidate
                failed[name] = f"{type(err).__name__}: {str(err)[:200]}"
                warnings.warn(
                    f"fastdiff: {name} failed for {key}, using native: {failed[name]}", stacklevel=2
                )
        candidates = {n: fn for n, fn in candidates.items() if n not in failed}
        if len(candidates) == 1:
            record = {"choice": NATIVE, "failed": failed}
            cache.put(key, record)
            return NATIVE, {**record, "source": "measured"}
        times = measure(candidates, device)
        best = _winner(times, margin)
        confirm = None
        if best != NATIVE:  # confirm a non-native win with a second round (a busy machine misleads one)
            confirm = measure({NATIVE: candidates[NATIVE], best: candidates[best]}, device)
            if _winner(confirm, margin) != best:
                best = NATIVE
    speedup = times[NATIVE] / times[best]
    if confirm is not None and best != NATIVE:
        speedup = min(speedup, confirm[NATIVE] / confirm[best])  # report the conservative round
    record = {
        "choice": best,
        "times_ms": {k: round(v * 1e3, 4) for k, v in times.items()},
        "speedup_vs_native": round(speedup, 3),
    }
    if failed:
        record["failed"] = failed
    if confirm is not None:
        record["confirm_ms"] = {k: round(v * 1e3, 4) for k, v in confirm.items()}
    cache.put(key, record)
    return best, {**record, "source": "measured"}
