"""Where an int8 ``compile_engine`` build (OpenVINO or ONNX Runtime) spends its time, stage by stage (#14).

One ``compile_engine(unet, backend=..., precision="int8")`` (or ``--precision mixed``) build of the full-width
SD1.5-architecture U-Net (random weights) at 256^2, with the same records and options as the
``ov-int8`` row of ``benchmarks/engines.py --suite cpu`` (8 records of 2 prompts x 4 DDIM steps;
every 4th held back; compile_engine splits the rest again). Every stage function is wrapped with a
timer (fastdiff's own, NNCF's statistics passes and algorithms, OpenVINO's read/compile calls),
nested calls are kept as a tree, and the timeline is written to ``results/NAME.{json,md}``.
Nothing here changes what the build does; the wrappers only take timestamps.

    flock /tmp/fastdiff-heavy.lock .venv/bin/python benchmarks/engines_build_profile.py \\
        --name engines-cpu-build-profile-before
"""

from __future__ import annotations

import argparse
import functools
import importlib
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import env_info, write_results  # noqa: E402
from engines_cpu import PeakRSS, _records, header  # noqa: E402

# (module, attribute path, label): what gets a timer. Missing targets (another NNCF or fastdiff
# version) are skipped and listed in the results, never an error.
TARGETS = (
    ("fastdiff.engines.compile", "weights_fingerprint", "weights fingerprint"),
    ("fastdiff.engines.calibration", "CalibrationData.fingerprint", "calibration fingerprint"),
    ("fastdiff.engines.compile", "build", "build (artifacts)"),
    ("fastdiff.engines.export", "export_onnx", "ONNX export (total)"),
    ("torch.onnx", "export", "torch.onnx.export (trace)"),
    ("fastdiff.engines.export", "consolidate_onnx", "ONNX save (streamed)"),
    ("onnx.checker", "check_model", "ONNX checker"),
    ("fastdiff.engines.runtime_ov", "convert", "openvino.convert_model (ONNX)"),
    ("fastdiff.engines.openvino_build", "convert_pytorch", "openvino.convert_model (PyTorch)"),
    ("fastdiff.engines.runtime_ov", "save", "IR save"),
    ("fastdiff.engines.runtime_ov", "quantize", "NNCF quantize (total)"),
    ("fastdiff.engines.runtime_ov", "quantised_layers", "int8 layer census"),
    ("nncf.openvino.graph.nncf_graph_builder", "GraphConverter.create_nncf_graph", "NNCF graph build"),
    (
        "nncf.common.tensor_statistics.aggregator",
        "StatisticsAggregator.collect_statistics",
        "statistics pass",
    ),
    ("nncf.openvino.graph.model_transformer", "OVModelTransformer.transform", "NNCF model transform"),
    ("nncf.openvino.engine", "OVNativeEngine.__init__", "NNCF compile"),
    ("nncf.openvino.engine", "OVNativeEngine.infer", "NNCF infer"),
    ("nncf.quantization.algorithms.smooth_quant.algorithm", "SmoothQuant.apply", "SmoothQuant apply"),
    ("nncf.quantization.algorithms.min_max.algorithm", "MinMaxQuantization.apply", "MinMax apply"),
    (
        "nncf.quantization.algorithms.fast_bias_correction.algorithm",
        "FastBiasCorrection.apply",
        "fast bias correction apply",
    ),
    ("fastdiff.engines.ov_sensitivity", "group_sensitivity", "mixed: group sensitivity (OpenVINO)"),
    ("fastdiff.engines.ov_sensitivity", "mixed_model", "mixed: un-quantise weak groups + compress"),
    ("openvino", "Core.read_model", "ov read_model"),
    ("openvino", "Core.compile_model", "ov compile_model"),
    ("fastdiff.engines.cache", "EngineCache.commit", "cache commit (sha256)"),
    ("fastdiff.engines.cache", "EngineCache.lookup", "cache lookup"),
    ("fastdiff.engines.runtime_ov", "OvRunner.__init__", "runner load"),
    ("fastdiff.engines.compile", "measure_quality", "quality check"),
    ("fastdiff.engines.runtime_ov", "OvRunner.__call__", "engine step"),
    ("diffusers.models.unets.unet_2d_condition", "UNet2DConditionModel.forward", "PyTorch U-Net forward"),
    # ONNX Runtime int8 (--backend onnxruntime)
    ("fastdiff.engines.quantization", "quantize", "ORT quantize (total)"),
    ("fastdiff.engines.quantization", "preprocess", "ORT pre-process (graph optimisation)"),
    ("fastdiff.engines.quantization", "select_nodes", "node selection"),
    ("fastdiff.engines.quantization", "histogram_ranges", "fastdiff grouped calibration"),
    ("onnxruntime.quantization", "quantize_static", "ORT quantize_static"),
    ("onnxruntime.quantization.quantize", "load_model_with_shape_infer", "ORT load + shape inference"),
    ("onnxruntime.quantization.quantize", "create_calibrator", "ORT calibrator (augment + session)"),
    ("onnxruntime.quantization.calibrate", "HistogramCalibrater.collect_data", "ORT calibration pass"),
    ("onnxruntime.quantization.calibrate", "HistogramCalibrater.compute_data", "ORT ranges"),
    ("onnxruntime.quantization.qdq_quantizer", "QDQQuantizer.quantize_model", "ORT Q/DQ insertion"),
    ("onnxruntime.quantization.onnx_model", "ONNXModel.save_model_to_file", "ORT quantised model save"),
    ("onnxruntime", "InferenceSession.__init__", "ORT session create"),
)


class Timeline:
    """Start/end of every wrapped call, with its parent (the call it ran inside)."""

    def __init__(self):
        self.t0 = time.perf_counter()
        self.events: list[dict] = []
        self._stack: list[int] = []
        self.missing: list[str] = []

    def active_at(self, t: float) -> str:
        """The innermost stages running at ``t`` seconds, outermost first ("a > b > c")."""
        chain = [e["stage"] for e in self.events if e["start_s"] <= t <= e.get("end_s", float("inf"))]
        return " > ".join(chain)

    def wrap(self, module: str, path: str, label: str) -> None:
        try:
            owner = importlib.import_module(module)
            *parents, attr = path.split(".")
            for p in parents:
                owner = getattr(owner, p)
            real = getattr(owner, attr)
        except (ImportError, AttributeError):
            self.missing.append(f"{module}.{path}")
            return

        @functools.wraps(real)
        def timed(*args, **kwargs):
            event = {"stage": label, "parent": self._stack[-1] if self._stack else None}
            event["start_s"] = time.perf_counter() - self.t0
            self.events.append(event)
            self._stack.append(len(self.events) - 1)
            try:
                return real(*args, **kwargs)
            finally:
                self._stack.pop()
                event["end_s"] = time.perf_counter() - self.t0

        setattr(owner, attr, timed)

    def summary(self, samples: list[tuple[float, int]] = ()) -> list[dict]:
        """One row per (stage, enclosing stage) in order of first start: calls, total seconds and, from
        ``samples`` ((perf_counter, rss bytes) pairs), the highest RSS sampled during any of its calls."""
        rows: dict[tuple, dict] = {}
        rel = [(t - self.t0, rss) for t, rss in samples]
        for e in self.events:
            parent = self.events[e["parent"]]["stage"] if e["parent"] is not None else ""
            row = rows.setdefault(
                (e["stage"], parent),
                {
                    "stage": e["stage"],
                    "inside": parent,
                    "calls": 0,
                    "total_s": 0.0,
                    "first_start_s": e["start_s"],
                },
            )
            row["calls"] += 1
            row["total_s"] += e.get("end_s", e["start_s"]) - e["start_s"]
            during = [rss for t, rss in rel if e["start_s"] <= t <= e.get("end_s", e["start_s"])]
            if during:
                row["max_rss_gb"] = round(max(row.get("max_rss_gb", 0), max(during) / 2**30), 2)
        for row in rows.values():
            row["total_s"] = round(row["total_s"], 1)
            row["first_start_s"] = round(row["first_start_s"], 1)
        return list(rows.values())


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--name", default="engines-cpu-build-profile")
    p.add_argument("--workdir", default="/tmp/fastdiff-bench-engines-cpu-sd15-256")
    p.add_argument("--calib-prompts", type=int, default=2)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--records", type=int, default=32, help="most calibration records (QuantConfig)")
    p.add_argument("--quality-records", type=int, default=2)
    p.add_argument("--smooth-quant", choices=["on", "off"], default="on")
    p.add_argument(
        "--statistics-hint",
        choices=["engine", "f32", "bf16"],
        default="engine",
        help="QuantConfig.statistics_hint (OpenVINO): precision of NNCF's statistics models",
    )
    p.add_argument(
        "--statistics-batch",
        default="default",
        help="QuantConfig.statistics_batch (OpenVINO): rows per NNCF statistics inference, 'none' for whole "
        "records, or 'default' (QuantConfig's)",
    )
    p.add_argument(
        "--source",
        choices=["pytorch", "onnx"],
        default="pytorch",
        help="ExportConfig.openvino_source: convert the U-Net directly, or through the ONNX export (before #14's fix)",
    )
    p.add_argument("--model", default="sd15-full", choices=["sd15-full", "sd15-half", "tiny"])
    p.add_argument("--side", type=int, default=256, help="image side in px")
    p.add_argument("--backend", default="openvino", choices=["openvino", "onnxruntime"])
    p.add_argument("--precision", default="int8", choices=["int8", "mixed"], help="mixed: OpenVINO only")
    args = p.parse_args(argv)
    if args.precision == "mixed" and args.backend != "openvino":
        p.error("--precision mixed is an OpenVINO precision")

    from engines import _prompts, make_pipeline

    from fastdiff.engines import ExportConfig, GateConfig, QuantConfig, compile_engine

    named = {"none": None, "default": QuantConfig().statistics_batch}
    key = args.statistics_batch.lower()
    statistics_batch = named[key] if key in named else int(key)

    load_before = os.getloadavg()
    pipe, args.side = make_pipeline(args.model, args.side)
    args.guidance = 7.5
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    calib = _records(pipe, args, work, _prompts(args.calib_prompts))
    records_s = time.perf_counter() - t
    fit, held = calib.split(4)
    held = held.subset(args.quality_records)
    cache = work / "profile-cache"
    shutil.rmtree(cache, ignore_errors=True)

    timeline = Timeline()
    for target in TARGETS:
        timeline.wrap(*target)
    timeline.t0 = time.perf_counter()
    with PeakRSS(keep=True) as mem:
        engine = compile_engine(
            pipe.unet,
            backend=args.backend,
            precision=args.precision,
            calibration=fit,
            quality_inputs=held,
            cache_dir=cache,
            install=False,
            gate=GateConfig(min_snr_db=None),
            quant=QuantConfig(
                max_calibration_records=args.records,
                smooth_quant=args.smooth_quant == "on",
                statistics_hint=args.statistics_hint,
                statistics_batch=statistics_batch,
            ),
            export=ExportConfig(openvino_source=args.source),
        )
    total_s = time.perf_counter() - timeline.t0
    quality_s = sum(e["end_s"] - e["start_s"] for e in timeline.events if e["stage"] == "quality check")
    load_after = os.getloadavg()
    shutil.rmtree(cache, ignore_errors=True)

    rows = timeline.summary(mem.samples)
    peak_t, _ = max(mem.samples, key=lambda s: s[1]) if mem.samples else (timeline.t0, 0)
    peak_stage = timeline.active_at(peak_t - timeline.t0)
    meta = env_info()
    meta.update(header())
    meta.update(
        {
            "model": args.model,
            "side_px": args.side,
            "records": {"calibrate": len(fit), "judge": len(held), "recorded_s": round(records_s, 1)},
            "backend": args.backend,
            "smooth_quant": args.smooth_quant == "on" if args.backend == "openvino" else None,
            "statistics_batch": statistics_batch if args.backend == "openvino" else None,
            "statistics_hint": engine.build_info.get("statistics_hint")
            if args.backend == "openvino"
            else None,
            "openvino_source": args.source if args.backend == "openvino" else None,
            "total_s": round(total_s, 1),
            "quality_check_s": round(quality_s, 1),
            "total_without_quality_check_s": round(total_s - quality_s, 1),
            "peak_rss_gb": round(mem.peak / 2**30, 2),
            "peak_at_s": round(peak_t - timeline.t0, 1),
            "peak_stage": peak_stage,
            "quality": engine.quality,
            "load_before": [round(x, 2) for x in load_before],
            "load_after": [round(x, 2) for x in load_after],
            "not_wrapped": timeline.missing,
            "timeline": [
                {**e, "start_s": round(e["start_s"], 2), "end_s": round(e.get("end_s", -1), 2)}
                for e in timeline.events
            ],
        }
    )
    notes = "\n".join(
        [
            f"- One compile_engine(unet, backend='{args.backend}', precision='{args.precision}') of {args.model} "
            f"at {args.side}^2, {len(fit)} records given, at most {args.records} calibrate, quality judged on "
            f"{len(held)} held-back records"
            + (
                f"; SmoothQuant {args.smooth_quant}; NNCF statistics at the "
                f"{engine.build_info.get('statistics_hint')} hint (engine at {engine.build_info.get('hint')}), "
                f"{'whole records' if statistics_batch is None else f'{statistics_batch} row(s)'} per statistics inference."
                if args.backend == "openvino"
                else "."
            ),
            f"- total {total_s:.1f} s = {total_s - quality_s:.1f} s build + {quality_s:.1f} s quality check "
            f"(first compile of the engine + engine and eager PyTorch on the held-back records); "
            f"SNR {engine.quality['snr_db']:.2f} dB (worst record {engine.quality['snr_db_min']:.2f}); "
            f"peak RSS {mem.peak / 2**30:.2f} GB at {peak_t - timeline.t0:.0f} s, in: {peak_stage or '(no stage)'}; "
            f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f}. max_rss_gb: the highest RSS "
            "sampled (every 50 ms) during any call of the row's stage.",
            "- total_s sums every call of the stage; 'inside' is the stage it ran within (nested rows are part of "
            "their parent's time). The full timeline (start/end of every call) is in the JSON.",
        ]
    )
    paths = write_results(
        args.name,
        rows,
        meta,
        ["stage", "inside", "calls", "total_s", "first_start_s", "max_rss_gb"],
        notes=notes,
    )
    print("wrote", *paths)


if __name__ == "__main__":
    main()
