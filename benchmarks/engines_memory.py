"""Memory of OpenVINO int8 calibration + quantisation, and the time of a cached engine rebuild.

Each measurement runs in its own process so its peak resident memory is its own.

``stage``: the calibration + quantisation stage of ``compile_engine(..., backend="openvino",
precision="int8")`` alone: the converted fp32 model (read from an existing fp32 engine's
``engine.xml``), N records streamed from disk one at a time (``CalibrationData.load(folder)``),
NNCF post-training quantisation, the int8 model written out. RSS is sampled every 50 ms; the peak
so far is also appended to ``--log`` every 10 s, so a run cut short by its time slot still leaves
a lower bound.

``rebuild``: a fresh process that calls ``compile_engine`` again on a filled cache (what a user's
second run does): weights fingerprint, cache lookup and checksum, reading the model, compiling it
for the first input shape (OpenVINO's blob cache), first inference excluded.

    flock /tmp/fastdiff-heavy.lock python benchmarks/engines_memory.py stage --side 512 --records 32 \\
        --model-xml /tmp/w/cache/<key>/engine.xml
    flock /tmp/fastdiff-heavy.lock python benchmarks/engines_memory.py rebuild --side 512 --precision int8 \\
        --records-dir /tmp/w/records --cache-dir /tmp/w/cache
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS_DIR, env_info, write_results  # noqa: E402
from engines_cpu import PeakRSS, _rss  # noqa: E402

from fastdiff.engines.cpu import cpu_model, engine_flags  # noqa: E402


def _log_peak(mem: PeakRSS, path: Path, stop: threading.Event, t0: float, what: str):
    while not stop.wait(10.0):
        with open(path, "a") as f:
            f.write(f"{what} t={time.perf_counter() - t0:.0f}s peak_rss_gb={mem.peak / 2**30:.2f}\n")


def stage(args) -> dict:
    import openvino as ov

    from fastdiff.engines import CalibrationData, QuantConfig, runtime_ov

    folder = Path(args.workdir) / f"synthetic-{args.side}-{args.records}"
    if not folder.is_dir():  # in a child process: the U-Net it needs must not count in this one's memory
        cmd = [sys.executable, __file__, "records", "--side", str(args.side), "--records", str(args.records)]
        subprocess.run([*cmd, "--workdir", args.workdir], check=True)
    records = CalibrationData.load(folder)  # a folder: records stay on disk, read one at a time
    log = Path(args.log)
    t0 = time.perf_counter()
    base = _rss()
    with PeakRSS() as mem:
        stop = threading.Event()
        threading.Thread(target=_log_peak, args=(mem, log, stop, t0, "stage"), daemon=True).start()
        model = ov.Core().read_model(args.model_xml)
        loaded = _rss()
        quantised = runtime_ov.quantize(
            model,
            records.records,
            num_records=len(records),
            exclude=QuantConfig().exclude,  # the float islands compile_engine keeps, as there
            smooth_quant=not args.no_smooth_quant,
        )
        with tempfile.TemporaryDirectory() as tmp:
            runtime_ov.save(quantised, Path(tmp) / "engine.xml")
        stop.set()
    return {
        "what": "calibration + quantisation stage (NNCF) alone",
        "side_px": args.side,
        "records": len(records),
        "record_kind": "synthetic_inputs (random latents and text embeddings over the timestep range), "
        "streamed from disk",
        "smooth_quant": not args.no_smooth_quant,
        "seconds": round(time.perf_counter() - t0, 1),
        "rss_before_gb": round(base / 2**30, 2),
        "rss_model_loaded_gb": round(loaded / 2**30, 2),
        "peak_rss_gb": round(mem.peak / 2**30, 2),
        "int8_layers": len(runtime_ov.quantised_layers(quantised)),
    }


def from_log(args) -> dict:
    """A stage run cut short by its time slot: the peak so far from its ``--log`` lines (a lower bound)."""
    lines = [ln.split() for ln in Path(args.log).read_text().splitlines() if ln.startswith("stage ")]
    samples = [(float(t.split("=")[1][:-1]), float(p.split("=")[1])) for _, t, p in lines]
    first_max = next(t for t, p in samples if p == max(q for _, q in samples))
    return {
        "what": "calibration + quantisation stage (NNCF) alone, cut by its time slot before finishing",
        "side_px": args.side,
        "records": args.records,
        "smooth_quant": not args.no_smooth_quant,
        "finished": False,
        "seconds": samples[-1][0],
        "peak_rss_gb": max(p for _, p in samples),
        "peak_reached_at_s": first_max,
        "record_kind": "synthetic_inputs (random latents and text embeddings over the timestep range), "
        "streamed from disk",
    }


def write_records(args) -> None:
    from fastdiff.engines.calibration import synthetic_inputs
    from fastdiff.engines.records import RecordSpill
    from fastdiff.testing import tiny_pipeline

    unet = tiny_pipeline("sd15", size="full", seed=0).unet
    latent = args.side // 8
    spill = RecordSpill(Path(args.workdir) / f"synthetic-{args.side}-{args.records}")
    for r in synthetic_inputs(unet, num=args.records, batch=2, height=latent, width=latent):
        spill.append(r)


def rebuild(args) -> dict:
    from fastdiff.engines import CalibrationData, GateConfig, QuantConfig, compile_engine
    from fastdiff.testing import tiny_pipeline

    unet = tiny_pipeline("sd15", size="full", seed=0).unet
    calib = CalibrationData.load(args.records_dir)
    fit, held = calib.split(4)
    held = held.subset(args.quality_records)
    kwargs = dict(
        backend="openvino",
        precision=args.precision,
        calibration=fit if args.precision in ("int8", "mixed") else held,
        quality_inputs=held,
        cache_dir=args.cache_dir,
        install=False,
        gate=GateConfig(min_snr_db=None),
        quant=QuantConfig(max_calibration_records=args.max_records),
    )
    record = held.records[len(held) // 2]
    t0 = time.perf_counter()
    with PeakRSS() as mem:
        engine = compile_engine(unet, **kwargs)
        loaded_s = time.perf_counter() - t0
        engine.runner(record)  # static shapes: this compiles for the shape (blob cache) and runs once
        first_s = time.perf_counter() - t0
    return {
        "what": "cached rebuild: compile_engine on a filled cache in a fresh process",
        "side_px": args.side,
        "precision": args.precision,
        "cache_hit": engine.cache_hit,
        "compile_engine_s": round(loaded_s, 1),
        "through_first_step_s": round(first_s, 1),
        "peak_rss_gb": round(mem.peak / 2**30, 2),
        "snr_db": round(engine.quality["snr_db"], 2),
    }


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["stage", "rebuild", "records", "from-log"])
    p.add_argument("--side", type=int, default=512)
    p.add_argument("--records", type=int, default=32, help="stage: records that calibrate")
    p.add_argument("--model-xml", help="stage: an fp32 engine.xml from the OpenVINO engine cache")
    p.add_argument("--no-smooth-quant", action="store_true")
    p.add_argument("--workdir", default="/tmp/fastdiff-bench-engines-memory")
    p.add_argument("--log", default="/tmp/fastdiff-bench-engines-memory.log")
    p.add_argument("--records-dir", help="rebuild: calibration records folder used for the first build")
    p.add_argument("--cache-dir", help="rebuild: the engine cache of the first build")
    p.add_argument("--precision", default="int8")
    p.add_argument("--max-records", type=int, default=32)
    p.add_argument("--quality-records", type=int, default=2)
    p.add_argument("--name", default="engines-cpu-memory", help="results name; each run is appended")
    args = p.parse_args(argv)
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    torch.set_grad_enabled(False)
    if args.what == "records":
        return write_records(args)
    row = {"stage": stage, "rebuild": rebuild, "from-log": from_log}[args.what](args)
    row.update(
        cpu=cpu_model(),
        cpu_engine_flags=engine_flags(),
        load_1min=round(os.getloadavg()[0], 2),
        date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    )
    print(json.dumps(row, indent=1), flush=True)
    out = RESULTS_DIR / f"{args.name}.json"
    prior = json.loads(out.read_text())["rows"] if out.is_file() else []
    meta = env_info()
    meta["cpu_engine_flags"] = engine_flags()
    notes = (
        "- stage: NNCF calibration + quantisation alone, in its own process (the fp32 model read from an "
        "existing engine.xml, records streamed from disk, int8 model written); peak_rss_gb is that process's "
        "peak, rss_model_loaded_gb its RSS once the model was read. rebuild: compile_engine on a filled cache "
        "in a fresh process (weights fingerprint, lookup and checksums, reading the model), then the first "
        "step (per-shape compile from OpenVINO's blob cache)."
    )
    cols = [
        "what",
        "side_px",
        "records",
        "smooth_quant",
        "precision",
        "seconds",
        "compile_engine_s",
        "through_first_step_s",
        "rss_model_loaded_gb",
        "peak_rss_gb",
        "peak_reached_at_s",
        "finished",
        "load_1min",
        "date",
    ]
    write_results(out.stem, [*prior, row], meta, cols, notes=notes)


if __name__ == "__main__":
    main()
