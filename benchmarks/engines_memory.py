"""Memory of OpenVINO int8 calibration + quantisation, and the time of a cached engine rebuild (#14).

Each measurement runs in its own process so its peak resident memory is its own.

``stage``: the calibration + quantisation stage of ``compile_engine(..., backend="openvino",
precision="int8")`` alone, through the same ``runtime_ov.quantize``: the fp32 model read from an
existing fp32 engine's ``engine.xml`` (memory-mapped), 32 of 40 synthetic records streamed from
disk (every 5th held back), NNCF post-training quantisation, the int8 model written out, then (in
a child process) its SNR against the fp32 model on held-back records. RSS is sampled every 0.2 s
with its anonymous / file-backed split; the peak so far is appended to ``--log`` every 10 s, so a
run cut short by its time slot still leaves a lower bound (``from-log``). ``--dynamic`` and
``--keep-mapped`` measure the code paths before #14's fixes.

``ort-stage``: the same for ONNX Runtime int8: ``quantize`` with QuantConfig's defaults on an fp32 ONNX
export (written by a child process), 32 of the same synthetic records streamed from disk.

``compare``: FakeQuantize ranges of two int8 models (static vs dynamic calibration).

``rebuild``: a fresh process that calls ``compile_engine`` again on a filled cache (what a user's
second run does): weights fingerprint, cache check, reading the model, then compiling it for the
first input shape (OpenVINO's blob cache) and one step. ``adopt`` fills the cache for this code's
key from an entry of an earlier cache format with the same artifacts.

    flock /tmp/fastdiff-heavy.lock python benchmarks/engines_memory.py stage --side 512 --records 32 \\
        --no-smooth-quant --model-xml /tmp/w/cache/<key>/engine.xml
    flock /tmp/fastdiff-heavy.lock python benchmarks/engines_memory.py rebuild --side 512 --precision fp32 \\
        --records-dir /tmp/w/synthetic-512-40 --cache-dir /tmp/w/cache
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS_DIR, env_info, rss_split_gb, write_results  # noqa: E402
from engines_cpu import PeakRSS, _rss  # noqa: E402

from fastdiff.engines.cpu import cpu_model, engine_flags  # noqa: E402


def _timeline(path: Path, stop: threading.Event, t0: float, what: str, peak: dict):
    """Every 0.2 s: track the VmRSS peak with its anon/file split; every 10 s append a line to ``path``
    (so a run cut short by its slot still leaves a lower bound)."""
    last = 0.0
    while not stop.wait(0.2):
        now = rss_split_gb()  # the IR's weights are mmap'd: file pages
        if now.get("VmRSS", 0) > peak.get("VmRSS", 0):
            peak.update(now, at_s=time.perf_counter() - t0)
        if time.perf_counter() - last >= 10:
            last = time.perf_counter()
            with open(path, "a") as f:
                f.write(
                    f"{what} t={last - t0:.0f}s peak_rss_gb={peak.get('VmRSS', 0):.2f} "
                    f"rss_gb={now.get('VmRSS', 0):.2f} anon_gb={now.get('RssAnon', 0):.2f} "
                    f"file_gb={now.get('RssFile', 0):.2f}\n"
                )


def _records_folder(args) -> Path:
    folder = Path(args.workdir) / f"synthetic-{args.side}-{args.pool}"
    if not folder.is_dir():  # in a child process: the U-Net it needs must not count in this one's memory
        cmd = [sys.executable, __file__, "records", "--side", str(args.side), "--pool", str(args.pool)]
        subprocess.run([*cmd, "--workdir", args.workdir], check=True)
    return folder


def _fit_held(args):
    """Records streamed from disk: every 5th held back to judge quality, the rest (32 of 40) calibrate."""
    from fastdiff.engines import CalibrationData

    fit, held = CalibrationData.load(_records_folder(args)).split(5)
    return fit.subset(args.records), held


def stage(args) -> dict:
    """NNCF calibration + quantisation exactly as compile_engine's OpenVINO int8 build runs it, alone."""
    import resource

    import openvino as ov

    from fastdiff.engines import QuantConfig, runtime_ov
    from fastdiff.engines.mapped import weight_files

    fit, _ = _fit_held(args)
    variant = ("static" if args.static else "dynamic") + ("" if args.release else "-keep")
    out_xml = Path(args.workdir) / f"int8-{args.side}-{len(fit)}-{variant}.xml"
    log = Path(args.log)
    t0 = time.perf_counter()
    base = _rss()
    peak: dict = {}
    stop = threading.Event()
    sampler = threading.Thread(target=_timeline, args=(log, stop, t0, "stage", peak), daemon=True)
    sampler.start()
    model = ov.Core().read_model(args.model_xml)  # mmap'd weights (OpenVINO's default)
    loaded = _rss()
    quantised = runtime_ov.quantize(
        model,
        fit.records,
        num_records=len(fit),
        exclude=QuantConfig().exclude,  # the float islands compile_engine keeps, as there
        smooth_quant=not args.no_smooth_quant,
        static=args.static,
        weights=weight_files(args.model_xml) if args.release else (),
    )
    runtime_ov.save(quantised, out_xml)
    seconds = time.perf_counter() - t0
    stop.set()
    sampler.join()
    int8_layers = len(runtime_ov.quantised_layers(quantised))
    del quantised, model
    row = {
        "what": "calibration + quantisation stage (NNCF) alone",
        "side_px": args.side,
        "records": len(fit),
        "record_kind": "synthetic_inputs (random latents and text embeddings over the timestep range), "
        "streamed from disk",
        "smooth_quant": not args.no_smooth_quant,
        "calibration_shapes": "static" if args.static else "dynamic",
        "mapped_weights": "given back while NNCF runs" if args.release else "kept resident",
        "finished": True,
        "seconds": round(seconds, 1),
        "rss_before_gb": round(base / 2**30, 2),
        "rss_model_loaded_gb": round(loaded / 2**30, 2),
        "peak_rss_gb": round(peak.get("VmRSS", 0), 2),
        "peak_anon_gb": round(peak.get("RssAnon", 0), 2),
        "peak_file_gb": round(peak.get("RssFile", 0), 2),
        "peak_reached_at_s": round(peak.get("at_s", 0), 0),
        "ru_maxrss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
        "int8_layers": int8_layers,
        "int8_xml": str(out_xml),
    }
    if args.snr_records:  # in a child process, so its two compiled models do not count here
        cmd = [sys.executable, __file__, "snr", "--side", str(args.side), "--pool", str(args.pool)]
        cmd += ["--model-xml", args.model_xml, "--int8-xml", str(out_xml), "--workdir", args.workdir]
        cmd += ["--snr-records", str(args.snr_records)]
        done = subprocess.run(cmd, check=True, capture_output=True, text=True)
        row.update(json.loads(done.stdout.strip().splitlines()[-1]))
    return row


def ort_stage(args) -> dict:
    """ONNX Runtime calibration + quantisation alone, through the same ``quantize`` (with QuantConfig's
    defaults) that compile_engine's ONNX Runtime int8 build calls, on an fp32 ONNX export."""
    import resource

    from fastdiff.engines import QuantConfig, quantize

    fit, _ = _fit_held(args)
    onnx_path = Path(args.workdir) / f"unet-{args.side}.onnx"
    if not onnx_path.is_file():  # in a child process: the U-Net must not count in this one's memory
        cmd = [sys.executable, __file__, "export", "--side", str(args.side), "--workdir", args.workdir]
        subprocess.run(cmd, check=True)
    out = Path(args.workdir) / f"ort-int8-{args.side}-{len(fit)}.onnx"
    t0 = time.perf_counter()
    peak: dict = {}
    stop = threading.Event()
    sampler = threading.Thread(
        target=_timeline, args=(Path(args.log), stop, t0, "ort-stage", peak), daemon=True
    )
    sampler.start()
    q = QuantConfig()
    quantize(
        onnx_path,
        fit,
        level=q.level,
        method=q.method,
        exclude=q.exclude,
        percentile=q.percentile,
        max_calibration_records=len(fit),
        calibration_memory_gb=q.calibration_memory_gb,
        out_path=out,
    )
    seconds = time.perf_counter() - t0
    stop.set()
    sampler.join()
    row = {
        "what": "calibration + quantisation stage (ONNX Runtime) alone",
        "side_px": args.side,
        "records": len(fit),
        "record_kind": "synthetic_inputs (random latents and text embeddings over the timestep range), "
        "streamed from disk",
        "finished": True,
        "seconds": round(seconds, 1),
        "peak_rss_gb": round(peak.get("VmRSS", 0), 2),
        "peak_anon_gb": round(peak.get("RssAnon", 0), 2),
        "peak_file_gb": round(peak.get("RssFile", 0), 2),
        "peak_reached_at_s": round(peak.get("at_s", 0), 0),
        "ru_maxrss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
    }
    if args.snr_records:
        cmd = [sys.executable, __file__, "snr", "--side", str(args.side), "--pool", str(args.pool)]
        cmd += ["--model-xml", str(onnx_path), "--int8-xml", str(out), "--workdir", args.workdir]
        cmd += ["--snr-records", str(args.snr_records)]
        done = subprocess.run(cmd, check=True, capture_output=True, text=True)
        row.update(json.loads(done.stdout.strip().splitlines()[-1]))
    return row


def write_export(args) -> None:
    """The fp32 ONNX export an ONNX Runtime build quantises (traced at the smallest latent, as there)."""
    from fastdiff.engines.export import export_onnx
    from fastdiff.testing import tiny_pipeline

    unet = tiny_pipeline("sd15", size="full", seed=0).unet
    export_onnx(
        unet, Path(args.workdir) / f"unet-{args.side}.onnx", sample_shape=(2, 4, 8, 8), external_data=True
    )


def snr(args) -> dict:
    """SNR of the int8 model against the fp32 model it came from, per held-back record (never calibrated on)."""
    from fastdiff.engines.quality import snr_db
    from fastdiff.engines.runtime_ov import OvRunner

    _, held = _fit_held(args)
    held = held.subset(args.snr_records)
    if str(args.int8_xml).endswith(".onnx"):  # ort-stage's models
        from fastdiff.engines.runtime_ort import OrtRunner

        fp32, int8 = OrtRunner(args.model_xml), OrtRunner(args.int8_xml)
    else:
        fp32 = OvRunner(args.model_xml, hint="f32")
        int8 = OvRunner(args.int8_xml, hint="f32")
    values = [snr_db(int8(r).double(), fp32(r).double()) for r in held.records]
    print(
        json.dumps(
            {
                "snr_vs_fp32_db_mean": round(sum(values) / len(values), 2),
                "snr_vs_fp32_db_worst": round(min(values), 2),
                "snr_records": len(values),
            }
        )
    )
    return None


def compare(args) -> dict:
    """How far two int8 models' quantisation parameters are apart: every FakeQuantize's ranges."""
    import numpy as np
    import openvino as ov

    def ranges(path):
        out = {}
        for op in ov.Core().read_model(path).get_ordered_ops():
            if op.get_type_name() == "FakeQuantize":
                lo, hi = (op.input_value(i).get_node() for i in (1, 2))
                if lo.get_type_name() == "Constant" and hi.get_type_name() == "Constant":
                    out[op.get_friendly_name()] = (
                        lo.get_data().astype(np.float64),
                        hi.get_data().astype(np.float64),
                    )
        return out

    a, b = ranges(args.model_xml), ranges(args.int8_xml)
    common = sorted(set(a) & set(b))
    rel = []
    for name in common:
        span = np.maximum(np.abs(a[name][1] - a[name][0]), 1e-30)
        rel.append(float(max(np.max(np.abs(a[name][i] - b[name][i]) / span) for i in (0, 1))))
    row = {
        "what": "int8 models compared: FakeQuantize ranges",
        "fake_quantize_a": len(a),
        "fake_quantize_b": len(b),
        "common": len(common),
        "max_rel_range_diff": round(max(rel), 6) if rel else None,
        "median_rel_range_diff": round(float(np.median(rel)), 8) if rel else None,
    }
    row["what"] += f": {Path(args.model_xml).stem} vs {Path(args.int8_xml).stem}"
    return row


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
    spill = RecordSpill(Path(args.workdir) / f"synthetic-{args.side}-{args.pool}")
    for r in synthetic_inputs(unet, num=args.pool, batch=2, height=latent, width=latent):
        spill.append(r)


def _timed(module, name: str, spent: dict):
    """Wrap ``module.name`` so the seconds spent in it add up in ``spent[name]``."""
    real = getattr(module, name)

    def wrapper(*a, **k):
        t = time.perf_counter()
        try:
            return real(*a, **k)
        finally:
            spent[name] = spent.get(name, 0.0) + time.perf_counter() - t

    setattr(module, name, wrapper)


def _rebuild_call(args):
    from fastdiff.engines import CalibrationData, GateConfig, QuantConfig
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
        verify=args.verify,
    )
    return unet, kwargs, held.records[len(held) // 2]


def rebuild(args) -> dict:
    import fastdiff.engines.compile as compile_mod
    import fastdiff.engines.runtime_ov as runtime_ov
    from fastdiff.engines import compile_engine
    from fastdiff.engines.cache import EngineCache

    unet, kwargs, record = _rebuild_call(args)
    spent: dict = {}
    _timed(compile_mod, "weights_fingerprint", spent)
    _timed(EngineCache, "lookup", spent)
    _timed(runtime_ov, "OvRunner", spent)
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
        "verify": args.verify,
        "cache_hit": engine.cache_hit,
        "compile_engine_s": round(loaded_s, 1),
        "weights_fingerprint_s": round(spent.get("weights_fingerprint", 0), 1),
        "cache_check_s": round(spent.get("lookup", 0), 1),
        "read_model_s": round(spent.get("OvRunner", 0), 1),
        "through_first_step_s": round(first_s, 1),
        "peak_rss_gb": round(mem.peak / 2**30, 2),
        "snr_db": round(engine.quality["snr_db"], 2),
    }


def adopt(args) -> None:
    """Fill the cache under this code's key from an entry of an earlier cache format holding the same
    artifacts (the export did not change), instead of a 10-minute export on the shared machine.

    Only ``build`` (copies the files) and the quality check (the old entry's stored result, measured
    on the same records) are replaced; key, commit and checksums are compile_engine's own.
    """
    import shutil

    import fastdiff.engines.compile as compile_mod
    from fastdiff.engines import compile_engine

    old = Path(args.adopt)
    old_meta = json.loads((old / "meta.json").read_text())

    def copy_build(unet, entry, *rest):
        for f in old.iterdir():
            if f.name != "meta.json":
                shutil.copyfile(f, entry / f.name)

    compile_mod.build = copy_build
    compile_mod.measure_quality = lambda *a, **k: dict(old_meta["quality"]["result"])
    unet, kwargs, _ = _rebuild_call(args)
    engine = compile_engine(unet, **kwargs)
    print(json.dumps({"adopted": str(old), "entry": engine.build_info["entry"], "hit": engine.cache_hit}))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "what",
        choices=["stage", "ort-stage", "rebuild", "records", "export", "from-log", "snr", "compare", "adopt"],
    )
    p.add_argument("--side", type=int, default=512)
    p.add_argument("--records", type=int, default=32, help="stage: records that calibrate")
    p.add_argument("--pool", type=int, default=40, help="synthetic records written; every 5th is held back")
    p.add_argument("--model-xml", help="stage: an fp32 engine.xml from the OpenVINO engine cache")
    p.add_argument("--int8-xml", help="snr / compare: the int8 model (compare: model-xml is the other int8)")
    p.add_argument(
        "--snr-records", type=int, default=4, help="stage: held-back records for the SNR (0: none)"
    )
    p.add_argument(
        "--dynamic", dest="static", action="store_false", help="stage: calibrate with dynamic axes"
    )
    p.add_argument("--no-smooth-quant", action="store_true")
    p.add_argument(
        "--keep-mapped",
        dest="release",
        action="store_false",
        help="stage: keep the IR's mapped pages resident",
    )
    p.add_argument("--verify", default="stat", help="rebuild: compile_engine's verify")
    p.add_argument("--adopt", help="adopt: an earlier-format cache entry with the same artifacts")
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
    if args.what in ("records", "export", "snr", "adopt"):
        return {"records": write_records, "export": write_export, "snr": snr, "adopt": adopt}[args.what](args)
    row = {
        "stage": stage,
        "ort-stage": ort_stage,
        "rebuild": rebuild,
        "from-log": from_log,
        "compare": compare,
    }[args.what](args)
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
        "- stage: NNCF calibration + quantisation alone, in its own process, through the same "
        "runtime_ov.quantize that compile_engine's OpenVINO int8 build calls (the fp32 model read from an "
        "existing engine.xml, records streamed from disk, int8 model written). peak_rss_gb: that process's "
        "VmRSS peak (sampled every 0.2 s; ru_maxrss_gb is the kernel's high-water mark), split into anonymous "
        "memory (peak_anon_gb: the CPU plugin's packed weights, activations) and mapped file pages "
        "(peak_file_gb: the IR's weights). calibration_shapes static: NNCF calibrates a copy reshaped to the "
        "records' shape; mapped_weights given back: madvise(DONTNEED) on the mapped .bin while NNCF runs "
        "(fastdiff/engines/mapped.py). snr_vs_fp32_db: the int8 model against the fp32 model on held-back "
        "records (every 5th of 40, never calibrated on), in a child process.\n"
        "- ort-stage: ONNX Runtime calibration + quantisation alone, in its own process, through the same "
        "quantize() (QuantConfig's defaults) that compile_engine's ONNX Runtime int8 build calls, on an fp32 "
        "ONNX export written by a child process; records as for stage; snr_vs_fp32_db: the int8 ONNX model "
        "against the fp32 one on held-back records, in a child process.\n"
        "- compare: FakeQuantize ranges of two int8 models of the same IR, max |difference| / range width.\n"
        "- rebuild: compile_engine on a filled cache in a fresh process (weights fingerprint, cache check, "
        "reading the model; the parts timed separately), then the first step (per-shape compile from "
        "OpenVINO's blob cache). Rows without verify are from cache format 1 (sha256 of the weights' bytes "
        "copied serially, sha256 of every artifact on each load)."
    )
    cols = [
        "what",
        "side_px",
        "records",
        "smooth_quant",
        "calibration_shapes",
        "mapped_weights",
        "precision",
        "verify",
        "seconds",
        "compile_engine_s",
        "weights_fingerprint_s",
        "cache_check_s",
        "read_model_s",
        "through_first_step_s",
        "peak_rss_gb",
        "peak_anon_gb",
        "peak_file_gb",
        "ru_maxrss_gb",
        "peak_reached_at_s",
        "finished",
        "snr_vs_fp32_db_mean",
        "snr_vs_fp32_db_worst",
        "max_rel_range_diff",
        "load_1min",
        "date",
    ]
    write_results(out.stem, [*prior, row], meta, cols, notes=notes)


if __name__ == "__main__":
    main()
