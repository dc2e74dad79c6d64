"""OpenVINO's compiled-model (blob) cache: does it shorten a cached engine's start, and at what cost?

A cached fastdiff OpenVINO engine starts in a fresh process in two parts: ``compile_engine`` finds the IR in
its cache (seconds), then the first U-Net call compiles the IR for that call's input shape. With OpenVINO's
blob cache (``RuntimeConfig.blob_cache``) that compile imports a blob written the first time the shape was
compiled: "full" (OpenVINO's default CACHE_MODE, the compiled weights in the blob) or "weightless" (its
OPTIMIZE_SIZE mode). "off" compiles from the IR every time.

For each image side, precision (fp32, bf16 where the CPU has it natively, int8) and mode, each start runs in
a fresh process through the public API (``compile_engine`` on a cache hit, install=False, then two calls of
the engine on a CFG batch): seconds in ``compile_engine``, in the first call and in the second call, the
process's peak RSS, and the blob folder's size on disk. Per mode and shape the first start with an empty
blob folder writes the blob ("write"); then ``--reps`` starts with the files in the page cache ("warm") and
one after dropping the page cache ("cold": a first start after a reboot; needs root, else skipped).

The engines are built once (blob cache off, so no blob is written during the build) on the full-width SD1.5
U-Net with random weights; int8 calibrates on ``--calib-prompts`` x 4 steps at 256^2. Larger sides run the
same engines (fastdiff's OpenVINO IR has dynamic spatial axes; the runner reshapes per shape).

Run:  flock /tmp/fastdiff-heavy.lock python benchmarks/engines_blob_cache.py --sides 256 512
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import env_info, load_average, write_results  # noqa: E402

PRECISIONS = ("fp32", "bf16", "int8")
MODES = ("off", "full", "weightless")


def _pipe_and_records(work: Path, calibrated: bool):
    from benchmarks.engines import make_pipeline
    from fastdiff.engines import CalibrationData

    pipe, _ = make_pipeline("sd15-full", 256)
    records = CalibrationData.load(work / "records") if calibrated else None
    return pipe, records


def _engine(pipe, work: Path, precision: str, calibration, blob_cache: str):
    """The engine in ``work/cache`` (built there the first time), not installed."""
    from fastdiff.engines import RuntimeConfig, compile_engine

    return compile_engine(
        pipe,
        backend="openvino",
        precision=precision,
        calibration=calibration,
        cache_dir=work / "cache",
        runtime=RuntimeConfig(blob_cache=blob_cache),
        install=False,
    )


def build(work: Path, precision: str, calib_prompts: int) -> None:
    """Child: build one engine into ``work/cache`` without writing blobs."""
    from fastdiff.engines import CalibrationData, calibrate

    records = work / "records"
    pipe, _ = _pipe_and_records(work, False)
    calibration = None
    if precision == "int8":
        if not records.exists():
            prompts = [f"a photo of object {i}" for i in range(calib_prompts)]
            calibrate(pipe, prompts, num_inference_steps=4, height=256, width=256, save_to=records)
        calibration = CalibrationData.load(records)
    t0 = time.perf_counter()
    info = _engine(pipe, work, precision, calibration, "off").build_info
    print(
        json.dumps(
            {"build_s": round(time.perf_counter() - t0, 1), "hint": info["hint"], "entry": info["entry"]}
        )
    )


def start(work: Path, precision: str, mode: str, side: int) -> None:
    """Child: one cached start; prints seconds per part and the peak RSS."""
    import torch

    from fastdiff.unet_inputs import unet_signature

    pipe, records = _pipe_and_records(work, precision == "int8")
    t0 = time.perf_counter()
    engine = _engine(pipe, work, precision, records, mode)
    t1 = time.perf_counter()
    latent = side // pipe.vae_scale_factor
    inputs = unet_signature(pipe.unet).example_inputs(
        2, latent, latent, generator=torch.Generator().manual_seed(0)
    )
    engine.runner(inputs)
    t2 = time.perf_counter()
    engine.runner(inputs)
    t3 = time.perf_counter()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(
        json.dumps(
            {
                "cache_hit_s": round(t1 - t0, 2),
                "first_call_s": round(t2 - t1, 2),
                "second_call_s": round(t3 - t2, 2),
                "peak_rss_gb": round(peak, 2),
                "hint": engine.build_info["hint"],
            }
        )
    )


def _child(args: list[str]) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, *args],
        capture_output=True,
        text=True,
        env=os.environ | {"PYTHONWARNINGS": "ignore"},
    )
    if out.returncode != 0:
        raise SystemExit(f"child {args} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _drop_page_cache() -> bool:
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("1\n")
        return True
    except OSError:
        return False


def _warm(*folders: Path) -> None:
    """Read an engine's files and its blob folder into the page cache, so 'warm' starts do not depend on
    what ran before."""
    for p in (f for folder in folders if folder.exists() for f in folder.rglob("*")):
        if p.is_file():
            with open(p, "rb") as f:
                while f.read(1 << 24):
                    pass


def _bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.exists() else 0


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sides", type=int, nargs="+", default=[256, 512])
    p.add_argument("--precisions", nargs="+", default=list(PRECISIONS), choices=PRECISIONS)
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    p.add_argument("--reps", type=int, default=2, help="warm starts per mode, shape and precision")
    p.add_argument("--calib-prompts", type=int, default=3)
    p.add_argument("--workdir", type=Path, default=None, help="reuse the engines built there")
    p.add_argument("--name", default="engines-blob-cache")
    p.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        kind, work, precision, *rest = args.child
        if kind == "build":
            build(Path(work), precision, int(rest[0]))
        else:
            start(Path(work), precision, rest[0], int(rest[1]))
        return

    from fastdiff.engines.runtime_ov import openvino_has_bf16

    precisions = [x for x in args.precisions if x != "bf16" or openvino_has_bf16()]
    work = args.workdir or Path(tempfile.mkdtemp(prefix="fastdiff-blob-cache-"))
    import openvino

    from fastdiff.engines.cpu import engine_flags

    meta = env_info() | {
        "load_before": load_average(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cpu_engine_flags": engine_flags(),
        "openvino": openvino.__version__,
    }
    t_start = time.time()
    builds = {x: _child(["--child", "build", str(work), x, str(args.calib_prompts)]) for x in precisions}
    rows, can_drop = [], _drop_page_cache()
    blobs = work / "cache" / "openvino-blobs"
    for side in args.sides:
        for precision in precisions:
            hint, entry = builds[precision]["hint"], Path(builds[precision]["entry"])
            for mode in args.modes:
                folder = blobs / (hint if mode == "full" else f"{hint}-weightless")
                shutil.rmtree(folder, ignore_errors=True)
                runs = []
                if mode != "off":
                    _warm(entry, folder)
                    runs.append(
                        ("write", _child(["--child", "start", str(work), precision, mode, str(side)]))
                    )
                for _ in range(args.reps):
                    _warm(entry, folder)
                    runs.append(("warm", _child(["--child", "start", str(work), precision, mode, str(side)])))
                if can_drop:
                    _drop_page_cache()
                    runs.append(("cold", _child(["--child", "start", str(work), precision, mode, str(side)])))
                blob_gb = _bytes(folder) / 1e9 if mode != "off" else 0.0
                for start_kind in ("write", "warm", "cold"):
                    got = [r for k, r in runs if k == start_kind]
                    if not got:
                        continue
                    row = {
                        "side": side,
                        "precision": precision,
                        "hint": hint,
                        "blob_cache": mode,
                        "start": start_kind,
                    }
                    row["n"] = len(got)
                    for key in ("cache_hit_s", "first_call_s", "second_call_s", "peak_rss_gb"):
                        row[key] = round(statistics.median(r[key] for r in got), 2)
                    row["to_first_image_step_s"] = round(row["cache_hit_s"] + row["first_call_s"], 2)
                    totals = [r["cache_hit_s"] + r["first_call_s"] for r in got]
                    row["to_first_min_s"], row["to_first_max_s"] = (
                        round(min(totals), 2),
                        round(max(totals), 2),
                    )
                    row["blob_gb"] = round(blob_gb, 2)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    meta |= {
        "load_after": load_average(),
        "minutes": round((time.time() - t_start) / 60, 1),
        "builds": builds,
        "page_cache_dropped_for_cold": can_drop,
    }
    write_results(args.name, rows, meta, notes=_notes(rows, meta))


def _spread(row: dict) -> str:
    """' (min-max)' of a row's starts, where it has more than one and the run recorded them."""
    if row["n"] < 2 or "to_first_min_s" not in row:
        return ""
    return f" ({row['to_first_min_s']}-{row['to_first_max_s']})"


def _notes(rows: list[dict], meta: dict) -> str:
    lines = [
        "Generated by `benchmarks/engines_blob_cache.py` (what it measures in its docstring). Full-width SD1.5 "
        "U-Net (random weights), batch 2; every start in a fresh process through compile_engine on a cache hit. "
        f"CPU flags: {', '.join(meta['cpu_engine_flags'])}; OpenVINO {meta['openvino']}. "
        f"Run {meta['date']}, {meta['minutes']} min, load {meta['load_before']} -> {meta['load_after']}. "
        "Medians over the starts counted in `n`. `to_first_image_step_s` = cache_hit_s + first_call_s (median of "
        "the parts); `to_first_min_s` / `to_first_max_s`: the fastest and slowest start's sum (columns added after "
        "the first run, engines-blob-cache). "
        "`blob_gb` is rounded to 0.01 GB (a weightless blob is a few MB).",
        "",
        "## Reading (start to the end of the first U-Net call, against blob_cache='off')",
        "",
    ]
    key = {(r["side"], r["precision"], r["blob_cache"], r["start"]): r for r in rows}
    for (side, precision, mode, start_kind), r in sorted(key.items()):
        base = key.get((side, precision, "off", start_kind))
        if mode == "off" or base is None:
            continue
        lines.append(
            f"- {side}^2 {precision} {start_kind}: {mode} {r['to_first_image_step_s']} s{_spread(r)} against off "
            f"{base['to_first_image_step_s']} s{_spread(base)}; peak RSS {r['peak_rss_gb']} against "
            f"{base['peak_rss_gb']} GB; blob folder {r['blob_gb']} GB"
        )
    lines += [
        "",
        "Builds (seconds; a build found in the work folder's cache is a cache hit): "
        + ", ".join(f"{k} {v['build_s']}" for k, v in meta["builds"].items())
        + ". fastdiff's default since the first run (engines-blob-cache): `RuntimeConfig(blob_cache='off')`.",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
