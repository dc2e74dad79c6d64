"""The one dispatch layer: which implementation runs an op, measured per device and shape, and persisted.

Why here: choosing an implementation needs fastdiff's policy (plan cache location, versions, what
``fastdiff.report`` shows) while ``fastdiff/kernels/`` must stay a standalone package of kernels and references (it
is loaded alone on a bare GPU image). ``fastdiff.ops`` is the layer both ``fastdiff.nn`` modules and users
call, so the decision lives beside the ops and nowhere else: ``nn`` modules pass their cached transformed
weight and their ``plans`` dict to the ops, and never re-implement "auto".

Vocabulary (the only names for implementations, used as ``backend=`` values and in plan records):
``"native"`` (PyTorch: cuDNN/oneDNN), ``"winograd_torch"`` (PyTorch batched-GEMM Winograd),
``"winograd_triton"``, ``"gn_triton"`` (Triton GroupNorm+SiLU), ``"gn_triton+native_conv"`` and
``"fused_triton"`` (GroupNorm+SiLU inside the Winograd input transform). ``"auto"`` means "measure".

Eligibility (one rule, :func:`inference_only`): a non-native implementation runs only when no gradient is
needed for ANY input (activations, weights, biases, norm affine parameters) and nothing traces, scripts,
exports or compiles the call; otherwise native runs, whatever the backend asked for. Every op applies it
through :func:`select`, which also resolves ``"auto"``.

Plans: :func:`choose` times each candidate once per key; keys start with the device type and name
(:func:`device_tag`) and contain op, shape, dtype and layout, and each plan file is named after the device
and the torch/triton/fastdiff versions, so a CPU plan is never used on CUDA (or one GPU's on another).
An alternative must beat native by ``margin`` in two rounds; its first win at a real shape is then checked
against native's output at that shape (relative error within a dtype tolerance), and a mismatch keeps
native and is recorded (``verify``) so that ``fastdiff.report`` shows it.

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

from .._cache_dir import cache_dir as _cache_dir

NATIVE = "native"
IMPLEMENTATIONS = (
    NATIVE,
    "winograd_torch",
    "winograd_triton",
    "gn_triton",
    "gn_triton+native_conv",
    "fused_triton",
)
# how much faster than native an alternative must measure to be kept
DEFAULT_MARGIN = 0.03
# relative error ||alt - native|| / ||native|| an alternative may show at its first real shape. Half precision
# Winograd rounds its transformed operands (see tests/test_kernels_winograd.py), so about 3x native's own error.
VERIFY_TOLERANCE = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2}

# counters the tests (and curious users) can read: how many shapes were actually timed
stats = {"timed": 0, "cache_hits": 0}


# ---------------------------------------------------------------------------------------------------------
# Eligibility
# ---------------------------------------------------------------------------------------------------------
def inference_only(*tensors) -> bool:
    """True when no input needs a gradient and nothing traces/scripts/exports/compiles the call."""
    if torch.jit.is_scripting() or torch.jit.is_tracing() or torch.onnx.is_in_onnx_export():
        return False
    if torch.compiler.is_compiling():  # torch >= 2.4 (the pinned minimum) always has torch.compiler
        return False
    return not (torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors))


def check_backend(backend: str, allowed: tuple[str, ...]) -> None:
    if backend not in allowed:
        raise ValueError(f"backend must be one of {', '.join(map(repr, allowed))}; got {backend!r}")


# ---------------------------------------------------------------------------------------------------------
# Keys
# ---------------------------------------------------------------------------------------------------------
def device_name(device: torch.device) -> str:
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "cpu":
        from fastdiff._compat import cpu_model

        return f"cpu-{cpu_model()}-{torch.get_num_threads()}threads"
    return device.type


def device_tag(device: torch.device) -> str:
    """``type:name`` -- the first field of every plan key."""
    device = torch.device(device)
    return f"{device.type}:{device_name(device)}"


def layout_tag(x: torch.Tensor) -> str:
    return (
        "nhwc" if (x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()) else "nchw"
    )


def plan_key(op: str, x: torch.Tensor, **fields) -> str:
    """``device|op|n..|c..|h..|w..|dtype|layout|field..`` for a 4-D input ``x``."""
    n, c, h, w = x.shape
    extra = "".join(f"|{k}{int(v) if isinstance(v, bool) else v}" for k, v in fields.items())
    return f"{device_tag(x.device)}|{op}|n{n}|c{c}|h{h}|w{w}|{str(x.dtype)[6:]}|{layout_tag(x)}{extra}"


def _versions() -> str:
    from fastdiff._compat import version_of

    return "-".join(f"{m}{version_of(m) or 'none'}" for m in ("torch", "triton", "fastdiff"))


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "_", text).strip("_")[:120]


# ---------------------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------------------
def measure(fns: dict[str, Callable[[], object]], device: torch.device, reps: int = 5) -> dict[str, float]:
    """Median seconds per call of each candidate.

    CUDA: ``triton.testing.do_bench`` (L2-flushed, synchronised) with cuDNN autotuning on for the duration,
    so the native conv is timed with its best algorithm; the flag is restored afterwards. CPU: interleaved
    median of ``reps`` calls after one warm-up, so machine noise hits every candidate alike.
    """
    stats["timed"] += 1
    if torch.device(device).type == "cuda":
        import triton.testing

        before = torch.backends.cudnn.benchmark
        torch.backends.cudnn.benchmark = True
        try:
            return {name: triton.testing.do_bench(fn, warmup=10, rep=40) / 1e3 for name, fn in fns.items()}
        finally:
            torch.backends.cudnn.benchmark = before
    for fn in fns.values():
        fn()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - t0)
    return {name: statistics.median(s) for name, s in samples.items()}


# ---------------------------------------------------------------------------------------------------------
# Plan files
# ---------------------------------------------------------------------------------------------------------
class PlanCache:
    """Decisions for one device and library-version combination, persisted as one JSON file."""

    def __init__(self, cache_dir: str | os.PathLike | None, device: torch.device):
        self.dir = Path(cache_dir) if cache_dir else _cache_dir("plans")
        self.path = self.dir / f"{_slug(device_tag(device))}--{_slug(_versions())}.json"
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
            with warnings.catch_warnings():  # keep what other processes wrote meanwhile (quietly: read once)
                warnings.simplefilter("ignore")
                merged = {**self._read(), **self.entries}
            try:
                self.dir.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=".plan-", suffix=".json")
                with os.fdopen(fd, "w") as f:
                    json.dump({"format": 2, "entries": merged}, f, indent=1, sort_keys=True)
                os.replace(tmp, self.path)  # atomic: readers never see half a file
            except OSError as err:  # a read-only home must not break inference
                warnings.warn(f"could not write fastdiff plan cache {self.path}: {err}", stacklevel=3)


_CACHES: dict[tuple[str, str], PlanCache] = {}


def get_plan_cache(cache_dir, device) -> PlanCache:
    device = torch.device(device)
    key = (str(Path(cache_dir).resolve()) if cache_dir else str(_cache_dir("plans")), device_tag(device))
    if key not in _CACHES:
        _CACHES[key] = PlanCache(cache_dir, device)
    return _CACHES[key]


def clear_memory_caches() -> None:
    """Forget loaded plan files (the next lookup re-reads disk); used by tests to emulate a new process."""
    _CACHES.clear()


# ---------------------------------------------------------------------------------------------------------
# Choosing
# ---------------------------------------------------------------------------------------------------------
def winner(times: dict[str, float], margin: float = DEFAULT_MARGIN) -> str:
    """The fastest candidate, but native unless the alternative is faster by more than ``margin``."""
    best = min(times, key=times.get)
    if best != NATIVE and times[best] > (1.0 - margin) * times[NATIVE]:
        return NATIVE
    return best


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    ref64 = ref.detach().double()
    return ((out.detach().double() - ref64).norm() / ref64.norm().clamp_min(1e-30)).item()


def choose(
    key: str,
    candidates: dict[str, Callable[[], object]],
    device: torch.device,
    cache_dir=None,
    margin: float = DEFAULT_MARGIN,
    *,
    tolerance: float | None = None,
    timer: Callable[[dict, torch.device], dict[str, float]] = None,
) -> tuple[str, dict]:
    """Pick the fastest candidate for ``key``; returns (name, record).

    ``candidates`` must contain :data:`NATIVE` and return the op's output. With a single candidate nothing is
    timed. ``tolerance`` (relative error against native) enables the real-shape check of a new winner;
    ``timer`` replaces :func:`measure` (tests drive the decision logic with a fake clock).
    """
    if NATIVE not in candidates:
        raise ValueError(f"candidates must include {NATIVE!r}, got {sorted(candidates)}")
    if len(candidates) == 1:
        return NATIVE, {"choice": NATIVE, "source": "only candidate"}
    timer = timer or measure
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
        times = timer(candidates, device)
        best = winner(times, margin)
        confirm = None
        if best != NATIVE:  # confirm a non-native win with a second round (a busy machine misleads one)
            confirm = timer({NATIVE: candidates[NATIVE], best: candidates[best]}, device)
            if winner(confirm, margin) != best:
                best = NATIVE
        verify = None
        if best != NATIVE and tolerance is not None:  # first win at a real shape: same answer as native?
            err = rel_error(candidates[best](), candidates[NATIVE]())
            verify = {"candidate": best, "rel_err": err, "tolerance": tolerance, "passed": err <= tolerance}
            if not verify["passed"]:
                warnings.warn(
                    f"fastdiff: {best} differs from native by {err:.2e} (tolerance {tolerance:.0e}) for {key}; "
                    "keeping native",
                    stacklevel=2,
                )
                best = NATIVE
    record = {"choice": best, "times_ms": {k: round(v * 1e3, 4) for k, v in times.items()}}
    if confirm is not None:
        record["confirm_ms"] = {k: round(v * 1e3, 4) for k, v in confirm.items()}
    if best != NATIVE:  # the conservative round's speed-up
        record["speedup_vs_native"] = round(
            min(times[NATIVE] / times[best], confirm[NATIVE] / confirm[best]), 3
        )
    if verify is not None:
        record["verify"] = verify
    if failed:
        record["failed"] = failed
    cache.put(key, record)
    return best, {**record, "source": "measured"}


def select(backend, run, x, params, *, key, alternatives, plan_cache_dir=None, plans=None) -> str:
    """Which of ``run``'s implementations (name -> zero-argument call) an op call runs: the one rule for every op.

    Native whenever the call is not inference-only (:func:`inference_only` over ``x`` and ``params``); else a
    forced ``backend`` as asked; else (``"auto"``) the measured winner (:func:`choose`, with the real-shape
    check against native) among native and ``alternatives(device)``, the implementations worth timing on
    ``x``'s device, or native, unmeasured and unrecorded, when there are none. ``key()`` builds the plan key;
    ``plans`` is the calling module's memo of decisions, consulted before the plan cache.
    """
    if backend == NATIVE or not inference_only(x, *params):
        return NATIVE
    if backend != "auto":
        return backend
    candidates = {n: run[n] for n in (NATIVE, *alternatives(x.device))}
    if len(candidates) == 1:
        return NATIVE
    key = key()
    if plans is not None and key in plans:
        return plans[key]["choice"]
    choice, record = choose(key, candidates, x.device, plan_cache_dir, tolerance=VERIFY_TOLERANCE[x.dtype])
    if plans is not None:
        plans[key] = record
    return choice
