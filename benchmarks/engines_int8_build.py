"""NNCF settings against the OpenVINO int8 build time of the full SD1.5 U-Net at 256^2 (#14 goal: < 120 s).

The goal counts export + calibration + quantisation + compile. This benchmark measures the stages
that do not depend on the NNCF settings once (ONNX export, ``openvino.convert_model``, fp32 IR save,
as ``compile_engine``'s int8 build does them) and then, for every candidate, the NNCF call itself
(``fastdiff.engines.runtime_ov.quantize`` on a freshly read fp32 IR, the same records as the
``ov-int8`` row of ``benchmarks/engines.py --suite cpu``: 8 records of 2 prompts x 4 DDIM steps,
every 4th held back, compile_engine's split again: 5 calibrate), the int8 IR save, the engine's first
compile + SNR against eager PyTorch fp32 on the 2 held-back records, and its step time round-robin
with eager. ``est_build_s`` = shared stages + NNCF + save: an estimate of compile_engine's build
without its quality check (it also hashes the weights and the cache entry: ~2 s); the chosen setting
is then confirmed by a real ``compile_engine`` row in ``engines-cpu-sd15-256-avx512``.

Stage times inside NNCF come from the wrappers of ``engines_build_profile.py`` (statistics passes,
the compiles of NNCF's statistics models and of fast bias correction's sub-models).
Rows are appended to ``results/NAME.json`` (several invocations, one file, one lock slot each).

    flock /tmp/fastdiff-heavy.lock .venv/bin/python benchmarks/engines_int8_build.py \\
        --candidates default,sq-off --name engines-cpu-int8-build-256-avx512
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS_DIR, env_info, write_results  # noqa: E402
from engines_build_profile import TARGETS, Timeline  # noqa: E402
from engines_cpu import PeakRSS, _records, header  # noqa: E402

# name -> runtime_ov.quantize options (+ "records": most calibration records, else all 5).
CANDIDATES = {
    "default": {"smooth_quant": True, "bias_correction": "fast"},
    "sq-off": {"smooth_quant": False, "bias_correction": "fast"},
    "bc-off": {"smooth_quant": True, "bias_correction": "none"},
    "sq-off-bc-off": {"smooth_quant": False, "bias_correction": "none"},
    "sq-off-3rec": {"smooth_quant": False, "bias_correction": "fast", "records": 3},
    "bc-off-3rec": {"smooth_quant": True, "bias_correction": "none", "records": 3},
    "default-fold": {"smooth_quant": True, "bias_correction": "fast", "fold_statistics": True},
    "sq-off-bc-off-fold": {"smooth_quant": False, "bias_correction": "none", "fold_statistics": True},
    "sq-off-fold": {"smooth_quant": False, "bias_correction": "fast", "fold_statistics": True},
    "bc-off-fold": {"smooth_quant": True, "bias_correction": "none", "fold_statistics": True},
    "pytorch-sq-off-bc-off-fold": {
        "smooth_quant": False,
        "bias_correction": "none",
        "fold_statistics": True,
        "source": "pytorch",
    },
    "pytorch-sq-off-fold": {
        "smooth_quant": False,
        "bias_correction": "fast",
        "fold_statistics": True,
        "source": "pytorch",
    },
    "pytorch-bc-off-fold": {
        "smooth_quant": True,
        "bias_correction": "none",
        "fold_statistics": True,
        "source": "pytorch",
    },
    "sq-off-bc-off-numpy-stats": {
        "smooth_quant": False,
        "bias_correction": "none",
        "inplace_statistics": False,
    },
    "numpy-stats": {"smooth_quant": True, "bias_correction": "fast", "inplace_statistics": False},
    "sq-off-numpy-stats": {"smooth_quant": False, "bias_correction": "fast", "inplace_statistics": False},
    # compile_engine's int8 settings of 2026-12-06 (statistics at NNCF's f32, the hint on a CPU without
    # bf16) with each of NNCF's overflow fixes: which weights use 7 bits, against u8 x s8 saturation.
    **{
        f"now-overflow-{fix}": {
            "smooth_quant": True,
            "bias_correction": "none",
            "fold_statistics": True,
            "source": "pytorch",
            "overflow_fix": fix,
        }
        for fix in ("first_layer_only", "enable", "disable")
    },
}


def shared_stages(unet, work: Path, sequence_length: int, fresh: bool, timeline: Timeline) -> dict:
    """ONNX export, conversion and fp32 IR save as compile_engine's int8 build does them (timed)."""
    from fastdiff.engines import export as _export
    from fastdiff.engines import runtime_ov
    from fastdiff.engines.config import ExportConfig
    from fastdiff.engines.export import trace_shape
    from fastdiff.unet_inputs import unet_signature

    folder = work / "int8-build"
    timings = folder / "shared.json"
    if timings.is_file() and not fresh:
        return json.loads(timings.read_text())
    folder.mkdir(parents=True, exist_ok=True)
    spec = ExportConfig(sequence_length=sequence_length)
    signature = unet_signature(unet)
    out = {"measured": env_info()["date"], "load_1min": round(os.getloadavg()[0], 2)}
    t = time.perf_counter()
    onnx_path = _export.export_onnx(
        unet,
        folder / "unet.onnx",
        opset=spec.opset,
        dynamic=spec.dynamic,
        sample_shape=trace_shape(signature, spec),
        sequence_length=sequence_length,
    )
    out["onnx_export_s"] = round(time.perf_counter() - t, 1)
    t = time.perf_counter()
    model = runtime_ov.convert(onnx_path)
    out["convert_s"] = round(time.perf_counter() - t, 1)
    t = time.perf_counter()
    runtime_ov.save(model, folder / "fp32.xml")
    del model
    out["fp32_ir_save_s"] = round(time.perf_counter() - t, 1)
    t = time.perf_counter()
    runtime_ov.require_openvino().Core().read_model(str(folder / "fp32.xml"))
    out["fp32_ir_read_s"] = round(time.perf_counter() - t, 1)
    out["shared_s"] = round(sum(v for k, v in out.items() if k.endswith("_s")), 1)
    inside = [e for e in timeline.events if e["parent"] is not None]
    out["export_stages_s"] = {
        e["stage"]: round(e.get("end_s", e["start_s"]) - e["start_s"], 1)
        for e in inside
        if timeline.events[e["parent"]]["stage"] == "ONNX export (total)"
    }
    out["ir"] = str(folder / "fp32.xml")
    timings.write_text(json.dumps(out, indent=1))
    return out


def stage_totals(timeline: Timeline, start: int) -> dict:
    """Seconds per NNCF stage among the events recorded since index ``start``."""
    events = timeline.events[start:]
    parent = {id(e): timeline.events[e["parent"]]["stage"] if e["parent"] is not None else "" for e in events}

    def total(stage, inside=None):
        return round(
            sum(
                e.get("end_s", e["start_s"]) - e["start_s"]
                for e in events
                if e["stage"] == stage and (inside is None or parent[id(e)] == inside)
            ),
            1,
        )

    passes = [
        round(e.get("end_s", e["start_s"]) - e["start_s"], 1)
        for e in events
        if e["stage"] == "statistics pass"
    ]
    return {
        "statistics_passes_s": passes,
        "stats_compile_s": total("NNCF compile", "statistics pass"),
        "stats_infer_s": total("NNCF infer", "statistics pass"),
        "smooth_quant_apply_s": total("SmoothQuant apply"),
        "bias_correction_s": total("fast bias correction apply"),
        "bias_correction_compiles": sum(
            1
            for e in events
            if e["stage"] == "NNCF compile" and parent[id(e)] == "fast bias correction apply"
        ),
        "graph_build_s": total("NNCF graph build"),
    }


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--name", default="engines-cpu-int8-build-256-avx512")
    p.add_argument(
        "--workdir", default=None, help="default: the 256^2 cpu suite's (sd15-full), else per name"
    )
    p.add_argument(
        "--model",
        default="sd15-full",
        choices=["sd15-full", "tiny"],
        help="tiny: fastdiff-tiny's trained U-Net (records from training prompts): trained-weight SNR",
    )
    p.add_argument("--candidates", default="default,sq-off,bc-off,sq-off-bc-off")
    p.add_argument("--reps", type=int, default=3, help="round-robin repetitions of eager and the engine")
    p.add_argument("--fresh-export", action="store_true", help="re-measure the shared stages")
    p.add_argument("--rewrite-notes", action="store_true", help="only rewrite NAME's notes and table")
    args = p.parse_args(argv)
    if args.rewrite_notes:
        args.side = None
        return write(args, None, [], None)
    unknown = set(args.candidates.split(",")) - set(CANDIDATES)
    if unknown:
        raise SystemExit(f"unknown --candidates {sorted(unknown)}; valid: {list(CANDIDATES)}")

    from engines import _prompts, make_pipeline, round_robin

    from fastdiff.engines import QuantConfig, runtime_ov
    from fastdiff.engines.mapped import weight_files
    from fastdiff.engines.quality import measure_quality
    from fastdiff.unet_inputs import unet_signature

    load_before = os.getloadavg()
    pipe, args.side = make_pipeline(args.model, 256)
    args.guidance, args.steps = 7.5, 4
    unet = pipe.unet
    if args.workdir is None:
        sd15 = args.model == "sd15-full"
        args.workdir = f"/tmp/fastdiff-bench-{'engines-cpu-sd15-256-avx512' if sd15 else args.name}"
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    prompts = _prompts(2)
    if args.model == "tiny":  # as engines.py: training-split prompts
        from fastdiff.tiny.data import sample_attributes

        prompts = [a.prompt for a in sample_attributes(2, seed=0, split="train")]
    calib = _records(pipe, args, work, prompts)
    fit, held = calib.split(4)  # as engines_cpu.run_rows
    held = held.subset(2)
    quant = QuantConfig(max_calibration_records=32)
    calib_part, _ = fit.split(quant.holdout_every)  # as compile_engine
    sequence_length = int(calib.records[0]["encoder_hidden_states"].shape[1])
    timeline = Timeline()
    for target in TARGETS:
        timeline.wrap(*target)
    timeline.t0 = time.perf_counter()
    shared = shared_stages(unet, work, sequence_length, args.fresh_export, timeline)
    print("shared stages:", shared, flush=True)
    signature = unet_signature(unet)
    from fastdiff.engines.config import ExportConfig
    from fastdiff.engines.openvino_build import convert_pytorch

    record = held.records[len(held) // 2]

    def eager(r):
        with torch.no_grad():
            return unet(**signature.from_flat(r), return_dict=False)[0]

    core = runtime_ov.require_openvino().Core()
    rows = []
    for name in args.candidates.split(","):
        opts = dict(CANDIDATES[name])
        records = calib_part.subset(min(opts.pop("records", quant.max_calibration_records), 32))
        print(f"candidate {name}: {opts}, {len(records)} records", flush=True)
        start = len(timeline.events)
        source = opts.pop("source", "onnx")
        with PeakRSS() as mem:
            if source == "pytorch":  # compile_engine's ExportConfig(openvino_source="pytorch") route
                t = time.perf_counter()
                model = convert_pytorch(unet, signature, ExportConfig(sequence_length=sequence_length))
                row_shared_s = time.perf_counter() - t
                weights = ()
            else:
                model = core.read_model(shared["ir"])
                row_shared_s = shared["shared_s"]
                weights = weight_files(shared["ir"])
            t = time.perf_counter()
            quantised = runtime_ov.quantize(
                model,
                records.records,
                num_records=len(records),
                exclude=quant.exclude,
                weights=weights,
                **opts,
            )
            quantize_s = time.perf_counter() - t
            del model
            t = time.perf_counter()
            out = work / "int8-build" / f"{name}.xml"
            runtime_ov.save(quantised, out)
            int8_layers = len(runtime_ov.quantised_layers(quantised))
            save_s = time.perf_counter() - t
            del quantised
        stages = stage_totals(timeline, start)
        t = time.perf_counter()
        runner = runtime_ov.OvRunner(out, hint="f32", static=True)
        quality = measure_quality(unet, runner, held)
        quality_s = time.perf_counter() - t
        times = round_robin(
            {"eager": lambda: eager(record), name: (lambda rn: lambda: rn(record))(runner)}, reps=args.reps
        )
        row = {
            "candidate": name,
            "smooth_quant": opts["smooth_quant"],
            "bias_correction": opts["bias_correction"],
            "inplace_statistics": opts.get("inplace_statistics", True),
            "fold_statistics": opts.get("fold_statistics", False),
            "overflow_fix": opts.get("overflow_fix", "first_layer_only"),
            "records": len(records),
            "source": source,
            "shared_s": round(row_shared_s, 1),
            "est_build_s": round(row_shared_s + quantize_s + save_s, 1),
            "quantize_s": round(quantize_s, 1),
            "save_s": round(save_s, 1),
            **stages,
            "quality_check_s": round(quality_s, 1),
            "snr_db": round(quality["snr_db"], 2),
            "snr_db_min": round(quality["snr_db_min"], 2),
            "step_s": round(times[name], 3),
            "eager_step_s": round(times["eager"], 3),
            "vs_eager": round(times["eager"] / times[name], 2),
            "int8_layers": int8_layers,
            "quantize_peak_rss_gb": round(mem.peak / 2**30, 2),
            "load_1min": round(os.getloadavg()[0], 2),
        }
        del runner
        print(f"  {row}", flush=True)
        rows.append(row)
        write(args, shared, rows, load_before)
    write(args, shared, rows, load_before, final=True)


def write(args, shared: dict | None, rows: list[dict], load_before, final: bool = False) -> None:
    """Append this invocation's rows (so far) to the results file, one run number per invocation."""
    path = RESULTS_DIR / f"{args.name}.json"
    prior = json.loads(path.read_text()) if path.is_file() else {"rows": [], "meta": {}}
    run = getattr(args, "_run", None)
    if run is None and shared is None:
        run = 0
    elif run is None:
        run = args._run = 1 + max((r["run"] for r in prior["rows"]), default=0)
    kept = [r for r in prior["rows"] if r["run"] != run]
    new = [{"run": run, **r} for r in rows]
    meta = env_info()
    meta.update(header())
    from fastdiff._compat import version_of

    meta.update(
        {
            "openvino": version_of("openvino"),
            "nncf": version_of("nncf"),
            "model": args.model,
            "side_px": args.side,
        }
    )
    runs = dict(prior["meta"].get("runs", {}))
    if shared is None:  # --rewrite-notes: the file's runs and meta as they are, notes from this code
        meta, new = prior["meta"], []
    else:
        runs[str(run)] = {
            "date": meta["date"],
            "load_before": [round(x, 2) for x in load_before],
            "load_after": [round(x, 2) for x in os.getloadavg()],
            "shared_stages": shared,
            "complete": final,
        }
    meta["runs"] = runs
    cols = [
        "run",
        "candidate",
        "source",
        "smooth_quant",
        "bias_correction",
        "inplace_statistics",
        "fold_statistics",
        "overflow_fix",
        "records",
        "shared_s",
        "est_build_s",
        "quantize_s",
        "statistics_passes_s",
        "stats_compile_s",
        "stats_infer_s",
        "bias_correction_s",
        "snr_db",
        "snr_db_min",
        "step_s",
        "vs_eager",
        "quantize_peak_rss_gb",
        "load_1min",
    ]
    shared_line = "; ".join(
        f"run {r}: {s['shared_stages']['shared_s']} s (ONNX export {s['shared_stages']['onnx_export_s']}, "
        f"convert {s['shared_stages']['convert_s']}, fp32 IR save {s['shared_stages']['fp32_ir_save_s']}, "
        f"read {s['shared_stages']['fp32_ir_read_s']}; measured {s['shared_stages']['measured']})"
        for r, s in sorted(runs.items())
    )
    loads = "; ".join(
        f"run {r} {s['date']}: load before {s['load_before'][0]}, after {s['load_after'][0]}"
        + ("" if s["complete"] else " (incomplete)")
        for r, s in sorted(runs.items())
    )
    notes = "\n".join(
        [
            (
                "- Full-width SD1.5-architecture U-Net, random weights, 256^2 (32^2 latent, batch 2), OpenVINO int8 "
                if meta.get("model", "sd15-full") == "sd15-full"
                else f"- fastdiff-tiny's trained U-Net (shipped weights) at {meta['side_px']}^2, records from 2 "
                "training prompts x 4 steps, guidance 7.5 (not the random-weight SD1.5 U-Net), OpenVINO int8 "
            )
            + "through NNCF (on the ONNX route unless `source` says pytorch), 5 calibration records unless "
            "`records` says fewer (the ov-int8 row's records), SNR vs eager PyTorch fp32 on 2 held-back records. "
            "Random-weight SNR is not trained-weight SNR.",
            "- est_build_s = shared stages (measured once per run, not per candidate) + quantize_s (the NNCF call) + "
            "the int8 IR save; compile_engine adds ~2 s of hashing and its quality check (not included). "
            "Shared stages: " + shared_line + ".",
            "- statistics_passes_s: each NNCF statistics pass (SmoothQuant's first when on, then min-max's); "
            "stats_compile_s: the compiles of their statistics models; stats_infer_s: their inference on the "
            "records; bias_correction_s: fast bias correction's apply (its sub-model compiles and runs).",
            "- source pytorch: the U-Net converted directly (openvino.convert_model on the module, "
            "ExportConfig(openvino_source='pytorch')), timed per row as its shared_s; onnx: the shared ONNX stages.",
            "- inplace_statistics False: NNCF's statistics model returns the raw activations (and weights) "
            "and NNCF reduces them in numpy, instead of reduction ops inside the model (its default).",
            "- fold_statistics True: the weights' reductions NNCF puts in its statistics model are computed with "
            "numpy before OpenVINO compiles it (fastdiff.engines.nncf_folding.fold_constant_statistics), instead of "
            "by OpenVINO's constant folding during the compile.",
            "- overflow_fix: NNCF's OverflowFix, which weights are quantised to half the int8 range (7 bits) so "
            "that u8 x s8 pair sums fit int16 on CPUs without VNNI: first_layer_only (NNCF's default; rows "
            "without the column), enable (every Convolution and MatMul) or disable.",
            "- step_s: median of round-robin repetitions with eager in the same process (vs_eager = eager/step). "
            "Where load_1min is well above 2 (engines-cpu-int8-build-256-avx512: 3-7, other unlocked jobs) "
            "vs_eager is distorted (eager, 2 OpenMP threads, slowed 4-5x against 2.2-3.1 s in quiet runs; "
            "the engine far less); compare step_s between candidates of one run only. A missing source means onnx; a missing "
            "inplace_statistics/fold_statistics means True/False (columns added after run 1).",
            "- Load average: " + loads + ".",
        ]
    )
    write_results(args.name, kept + new, meta, cols, notes=notes)


if __name__ == "__main__":
    main()
