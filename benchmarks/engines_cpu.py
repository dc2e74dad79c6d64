"""CPU engines side by side: eager fp32, torch.compile, ONNX Runtime, plain OpenVINO and fastdiff's OpenVINO.

Run through ``benchmarks/engines.py --suite cpu`` (same arguments). Each invocation times its rows
and eager fp32 round-robin in one process (ratios are within a process), measures every row's SNR
against eager PyTorch fp32 on held-back calibration records, and records build time and peak
resident memory while the row was built and run (sampled from /proc/self/status every 50 ms).
Rows are appended to one results file (``--name``), so a model too slow for one 15-minute slot
is measured over several invocations; calibration records are recorded once into
``--workdir/records`` (streamed to disk) and reused.

    flock /tmp/fastdiff-heavy.lock python benchmarks/engines.py --suite cpu --model sd15-full \\
        --rows eager,ort-fp32,ov-plain-fp32,ov-plain-default,ov-fp32 --name engines-cpu-sd15-256
"""

from __future__ import annotations

import argparse
import copy
import json
import threading
import time
from pathlib import Path

import torch

from fastdiff.engines import CalibrationData, calibrate, compile_engine
from fastdiff.engines.cpu import cpu_model, engine_flags
from fastdiff.engines.quality import measure_quality

ROWS = (
    "eager",
    "compile",
    "ort-fp32",
    "ort-int8",
    "ov-plain-fp32",
    "ov-plain-default",
    "ov-fp32",
    "ov-bf16",
    "ov-int8",
    "ov-mixed",
)
# Not one of the rows (so not required in "every row in one run"): what precision="auto" installs,
# and PyTorch's own bf16 (the U-Net cast to bfloat16: what a PyTorch user on a CPU with native bf16 does).
EXTRA_ROWS = ("ov-auto", "eager-bf16")
# The peers fastdiff's engines are compared with; not fastdiff engines, so never "fastdiff's best".
BASELINE_ROWS = ("eager", "eager-bf16", "compile", "ov-plain-fp32", "ov-plain-default")


class PeakRSS:
    """Peak resident set size of this process while the block runs (bytes), sampled every 50 ms.
    ``keep=True`` also keeps every sample as ``(time.perf_counter(), bytes)`` in ``samples``."""

    def __init__(self, keep: bool = False):
        self.keep = keep
        self.samples: list[tuple[float, int]] = []

    def __enter__(self):
        self.peak = _rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self):
        while not self._stop.wait(0.05):
            rss = _rss()
            self.peak = max(self.peak, rss)
            if self.keep:
                self.samples.append((time.perf_counter(), rss))

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss())
        return False


def _rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _records(pipe, args, work: Path, prompts) -> CalibrationData:
    folder = work / "records"
    if (folder / "meta.json").is_file():
        return CalibrationData.load(folder)
    return calibrate(
        pipe,
        prompts,
        num_inference_steps=args.steps,
        guidance_scale=args.guidance,
        height=args.side,
        width=args.side,
        save_to=folder,
    )


def _plain_openvino(unet, record, hint: str | None):
    """What a user gets from two lines of OpenVINO: convert from PyTorch, compile with defaults."""
    import openvino as ov

    from fastdiff.engines.export import FlatUNet
    from fastdiff.unet_inputs import unet_signature

    sig = unet_signature(unet)
    flat = FlatUNet(unet, sig).eval()
    example = tuple(record[n] for n in sig.input_names)
    with torch.no_grad():
        model = ov.convert_model(flat, example_input=example)
    config = {"INFERENCE_PRECISION_HINT": hint} if hint else {}
    compiled = ov.Core().compile_model(model, "CPU", config)
    req = compiled.create_infer_request()

    def run(r):
        req.infer([r[n].numpy() for n in sig.input_names])
        return torch.from_numpy(req.get_output_tensor(0).data.copy())

    return run, compiled.get_property("INFERENCE_PRECISION_HINT")


def run_rows(pipe, args, work: Path, prompts, round_robin) -> dict:
    unet = pipe.unet
    calib = _records(pipe, args, work, prompts)
    fit, held = calib.split(4)
    held = held.subset(args.quality_records)
    record = held.records[len(held) // 2]
    print(f"records: {len(calib)} ({len(fit)} calibrate, {len(held)} judge)", flush=True)

    def eager(r):
        with torch.no_grad():
            return unet(**unet_kwargs(unet, r), return_dict=False)[0]

    fns, rows = {"eager": lambda: eager(record)}, {}
    for name in args.rows:
        if name == "eager":
            continue
        print(f"building {name} ...", flush=True)
        t0 = time.perf_counter()
        with PeakRSS() as mem:
            runner, info = _build(name, pipe, unet, fit, held, record, work, args)
            build_s = time.perf_counter() - t0
            runner(record)  # first call: static shapes compile here
            first_s = time.perf_counter() - t0 - build_s
            # compile_engine rows measured the same records against eager fp32 already (its gate).
            quality = info.pop("quality", None) or measure_quality(unet, runner, held)
        rows[name] = {
            "build_s": round(build_s, 1),
            "first_call_s": round(first_s, 1),
            "peak_rss_gb": round(mem.peak / 2**30, 2),
            "snr_db": round(quality["snr_db"], 2),
            "snr_db_min": round(quality["snr_db_min"], 2),
            **info,
        }
        if "quality_check_s" in info:
            rows[name]["build_without_quality_s"] = round(build_s - info["quality_check_s"], 1)
        fns[name] = (lambda rn: lambda: rn(record))(runner)
        print(f"  {name}: {rows[name]}", flush=True)
    with PeakRSS() as mem:
        times = round_robin(fns, reps=args.reps, warmup=1)
    rows["eager"] = {"build_s": 0.0, "peak_rss_gb": round(mem.peak / 2**30, 2), "snr_db": float("inf")}
    for name, sec in times.items():
        rows[name]["step_s"] = round(sec, 3)
        rows[name]["vs_eager"] = round(times["eager"] / sec, 2)
    return rows


def held_back_setup(side: int, workdir, calib_prompts: int = 4, held: int = 8):
    """(pipe, side, work, calib, held records): the full SD1.5 U-Net at ``side`` px, its calibration records
    (``calib_prompts`` prompts x 8 steps, recorded once into ``workdir``) and ``held`` of the held-back ones
    (every 4th): what the single-question bf16 scripts judge on."""
    from engines import _prompts, make_pipeline

    work = Path(workdir)
    work.mkdir(parents=True, exist_ok=True)
    pipe, side = make_pipeline("sd15-full", side)
    calib = _records(
        pipe, argparse.Namespace(steps=8, guidance=7.5, side=side), work, _prompts(calib_prompts)
    )
    return pipe, side, work, calib, calib.split(4)[1].subset(held).records


def plain_ir(unet, record, work: Path) -> Path:
    """``work/fp32.xml``: the plain OpenVINO conversion of the flat U-Net (the timestep in the graph, weights
    kept f32), converted from ``record``'s shapes once and reused."""
    import openvino as ov

    from fastdiff.engines.export import FlatUNet
    from fastdiff.unet_inputs import unet_signature

    ir = work / "fp32.xml"
    if not ir.is_file():
        sig = unet_signature(unet)
        with torch.no_grad():
            model = ov.convert_model(
                FlatUNet(unet, sig).eval(), example_input=tuple(record[n] for n in sig.input_names)
            )
        ov.save_model(model, ir, compress_to_fp16=False)
        del model
    return ir


def pytorch_bf16(unet):
    """A step of ``unet`` cast to bfloat16 on a flat record, as a PyTorch user with native bf16 runs it: the
    timestep as given (diffusers embeds it in fp32, then casts), every other input bf16; the output fp32."""
    half = copy.deepcopy(unet).to(torch.bfloat16)

    def run(r):
        kwargs = {
            k: v.to(torch.bfloat16) if torch.is_tensor(v) and k != "timestep" else v
            for k, v in unet_kwargs(unet, r).items()
        }
        with torch.no_grad():
            return half(**kwargs, return_dict=False)[0].float()

    return run


def unet_kwargs(unet, record):
    from fastdiff.unet_inputs import unet_signature

    return unet_signature(unet).from_flat(record)


def _build(name, pipe, unet, fit, held, record, work: Path, args):
    from fastdiff.engines import GateConfig, QuantConfig

    level = {"level": args.ort_level} if name.startswith("ort") else {}
    mixed = (
        {"min_group_snr_db": args.min_group_snr_db}
        if name == "ov-mixed" and getattr(args, "min_group_snr_db", None) is not None
        else {}
    )
    quant = QuantConfig(max_calibration_records=args.records, **level, **mixed)
    common = dict(cache_dir=work / "cache", install=False, gate=GateConfig(min_snr_db=None), quant=quant)
    if name == "eager-bf16":
        return pytorch_bf16(unet), {}
    if name == "compile":
        compiled = torch.compile(unet)

        def run(r):
            with torch.no_grad():
                return compiled(**unet_kwargs(unet, r), return_dict=False)[0]

        return run, {}
    if name.startswith("ov-plain"):
        run, hint = _plain_openvino(unet, record, "f32" if name.endswith("fp32") else None)
        return run, {"hint": str(hint)}
    backend, precision = name.split("-")
    backend = {"ort": "onnxruntime", "ov": "openvino"}[backend]
    calibration = fit if precision in ("int8", "mixed", "auto") else held
    if precision == "auto":  # as a user gets it: the default quality gate decides what passes
        common["gate"] = GateConfig()
    with _quantize_stage_memory() as stage:
        engine = compile_engine(
            unet,
            backend=backend,
            precision=precision,
            calibration=calibration,
            quality_inputs=held,
            **common,
        )
    info = {"cache_hit": engine.cache_hit, "quality": engine.quality, **stage}
    if precision == "auto":  # what it picked, and the step times it raced on (CPUs without VNNI)
        info.update(picked=engine.precision, auto_race=engine.build_info.get("auto_race"))
        precision = engine.precision
    if backend == "openvino" and precision in ("int8", "mixed"):
        info.update(smooth_quant=quant.smooth_quant, bias_correction=quant.bias_correction)
    if "high_precision_layers" in engine.build_info:
        info["high_precision_layers"] = len(engine.build_info["high_precision_layers"])
        info["int8_layers"] = engine.build_info["int8_layers"]
    if precision == "mixed":
        sens = engine.build_info.get("sensitivity") or []
        info["float_groups"] = [s["group"] for s in sens if s["snr_db"] < quant.min_group_snr_db]
        info["group_snr_db"] = {s["group"]: round(s["snr_db"], 2) for s in sens}
        info["min_group_snr_db"] = quant.min_group_snr_db
    return engine.runner, info


class _quantize_stage_memory:
    """Peak RSS and seconds of the NNCF calibration + quantisation call inside compile_engine (OpenVINO),
    and the seconds of compile_engine's quality check (``quality_check_s``: the engine's first compile
    and both the engine and eager PyTorch on the held-back records; 0 when the cache had the result)."""

    def __enter__(self):
        from fastdiff.engines import compile as compile_mod
        from fastdiff.engines import runtime_ov

        self.info, self._module, self._real = {"quality_check_s": 0.0}, runtime_ov, runtime_ov.quantize
        self._compile, self._measure = compile_mod, compile_mod.measure_quality

        def timed_quality(*args, **kwargs):
            t0 = time.perf_counter()
            out = self._measure(*args, **kwargs)
            self.info["quality_check_s"] = round(time.perf_counter() - t0, 1)
            return out

        compile_mod.measure_quality = timed_quality

        def measured(*args, **kwargs):
            start = _rss()
            t0 = time.perf_counter()
            with PeakRSS() as mem:
                out = self._real(*args, **kwargs)
            self.info.update(
                quantize_s=round(time.perf_counter() - t0, 1),
                quantize_start_rss_gb=round(start / 2**30, 2),
                quantize_peak_rss_gb=round(mem.peak / 2**30, 2),
                quantize_records=kwargs.get("num_records"),
            )
            return out

        runtime_ov.quantize = measured
        return self.info

    def __exit__(self, *exc):
        self._module.quantize = self._real
        self._compile.measure_quality = self._measure
        return False


def header() -> dict:
    return {"cpu": cpu_model(), "cpu_engine_flags": engine_flags()}


def merge_into(path: Path, meta: dict, rows: dict) -> dict:
    """Append this invocation's rows (and its meta) to the results JSON at ``path``."""
    data = json.loads(path.read_text()) if path.is_file() else {"runs": []}
    data["runs"].append({"meta": meta, "rows": rows})
    path.write_text(json.dumps(data, indent=1, default=str))
    return data
