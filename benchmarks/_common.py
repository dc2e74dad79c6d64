"""Shared plumbing for fastdiff benchmarks: environment facts and result files.

Every benchmark writes ``benchmarks/results/<name>.json`` (machine-readable,
with the full environment) and ``<name>.md`` (a table headed by hardware,
versions and date), so README figures can be traced to a file.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import statistics
import time
from pathlib import Path

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def _cpu_flags() -> list[str]:
    from fastdiff.engines.cpu import cpu_flags

    have = cpu_flags()
    return [w for w in ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8", "fma") if w in have]


def _family(meta: dict) -> str:
    """ " family F model M" where the results file recorded it (files before 2026-12-07 did not)."""
    fm = meta.get("cpu_family_model")
    return f" family {fm.replace('/', ' model ')}" if fm and fm != "?/?" else ""


def env_info() -> dict:
    """Hardware, library versions and date for a results file."""
    import torch

    from fastdiff._compat import cpu_model, cpuinfo_field, version_of

    info = {
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu_model(),
        # "AMD EPYC" names several generations here (family 25 and 26 have both been lent)
        "cpu_family_model": "/".join(cpuinfo_field(k) or "?" for k in ("cpu family", "model")),
        "cpu_flags": _cpu_flags(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
    }
    for mod in (
        "diffusers",
        "transformers",
        "triton",
        "onnx",
        "onnxruntime",
        "xformers",
        "tensorrt",
        "fastdiff",
    ):
        info[mod] = version_of(mod)
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
        info["cuda"] = torch.version.cuda
    else:
        info["gpu"] = None
    return info


def hardware_line(meta: dict) -> str:
    dev = (
        meta.get("gpu")
        or f"{meta['cpu']}{_family(meta)} ({meta['cpu_count']} cores, {meta['torch_threads']} torch threads)"
    )
    libs = ", ".join(f"{k} {meta[k]}" for k in ("torch", "diffusers", "triton", "onnxruntime") if meta.get(k))
    return f"{dev}; {libs}; {meta['date']}"


def markdown_table(rows: list[dict], columns: list[str] | None = None) -> str:
    if not rows:
        return "(no rows)\n"
    columns = columns or list(rows[0])

    def fmt(v):
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 1e4 else f"{v:.0f}"
        return "" if v is None else str(v)

    out = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    out += ["| " + " | ".join(fmt(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(out) + "\n"


def write_results(
    name: str, rows: list[dict], meta: dict | None = None, columns: list[str] | None = None, notes: str = ""
) -> tuple[Path, Path]:
    """Write ``results/<name>.json`` and ``results/<name>.md``; return both paths."""
    meta = meta or env_info()
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    jpath, mpath = RESULTS_DIR / f"{name}.json", RESULTS_DIR / f"{name}.md"
    jpath.write_text(json.dumps({"meta": meta, "rows": rows, "notes": notes}, indent=2, default=str) + "\n")
    md = f"# {name}\n\n{hardware_line(meta)}\n\n" + (notes.strip() + "\n\n" if notes else "")
    mpath.write_text(md + markdown_table(rows, columns))
    return jpath, mpath


def rss_split_gb() -> dict:
    """This process's VmRSS split into anonymous memory (RssAnon) and mapped file pages (RssFile), GiB."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile"):
                out[key] = int(value.split()[0]) / 2**20
    return out


def load_average() -> str:
    """The 1, 5 and 15 minute load averages, as results files quote them."""
    import os

    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def log_run(log_path, label: str, load_before: str, t0: float) -> None:
    """Append ``HH:MM:SS label: N s, load before -> after`` to a sweep folder's run log."""
    import time

    with open(log_path, "a") as f:
        f.write(
            f"{time.strftime('%H:%M:%S')} {label}: {time.time() - t0:.0f} s, load {load_before} -> {load_average()}\n"
        )


def time_fn(fn, *, warmup: int = 1, reps: int = 5) -> float:
    """Median wall time of ``fn()`` in seconds (CPU; use triton's do_bench on CUDA)."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def time_pair(fn_a, fn_b, *, warmup: int = 1, reps: int = 5) -> tuple[float, float]:
    """Interleaved medians of two callables, so machine noise hits both alike."""
    for _ in range(warmup):
        fn_a()
        fn_b()
    ta, tb = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn_a()
        t1 = time.perf_counter()
        fn_b()
        t2 = time.perf_counter()
        ta.append(t1 - t0)
        tb.append(t2 - t1)
    return statistics.median(ta), statistics.median(tb)
