"""CPU benchmark of compiled U-Net engines: PyTorch eager fp32 vs ONNX Runtime fp32 vs ONNX Runtime int8.

One process, one input, all variants timed round-robin (so machine noise hits them
alike). Quality of every engine is measured on held-back recorded U-Net inputs
(SNR in dB and cosine similarity against the PyTorch U-Net's output).

    nice -n 10 python benchmarks/engines.py --model sd15-half
    nice -n 10 python benchmarks/engines.py --model sd15-full --reps 3 --calib-prompts 2 --steps 6

End to end on fastdiff-tiny (attribute accuracy on 144 held-out images): ``benchmarks/engines_tiny_e2e.py``.

Models: ``sd15-full`` is the published SD1.5 U-Net configuration with random weights at
256x256 (32x32 latents); ``sd15-half`` halves every channel count (same depth and layout);
``tiny`` is fastdiff's trained tiny model (``fastdiff.tiny.load_pipeline("base")``).
Random-weight U-Nets make the speed figures representative, not the quantisation error:
activation statistics of trained weights differ.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import env_info, write_results  # noqa: E402

from fastdiff.engines import calibrate, export_onnx, layer_sensitivity, quantize  # noqa: E402
from fastdiff.engines.quality import measure_quality  # noqa: E402
from fastdiff.engines.quantization import qdq_summary  # noqa: E402
from fastdiff.engines.runtime_ort import OrtRunner  # noqa: E402

WORDS = "a red blue green yellow cat dog bird car tree house boat small big photo of on the in".split()


def _prompts(n: int, seed: int = 0) -> list[str]:
    g = torch.Generator().manual_seed(seed)
    colors, things = WORDS[1:5], WORDS[5:11]
    out = []
    for _ in range(n):
        c = colors[int(torch.randint(len(colors), (1,), generator=g))]
        t = things[int(torch.randint(len(things), (1,), generator=g))]
        out.append(f"a photo of a {c} {t}")
    return out


def make_pipeline(model: str, side_px: int | None = None):
    """(pipeline, image side in px) for the requested model."""
    from diffusers import DDIMScheduler

    if model == "tiny":
        from fastdiff.tiny import load_pipeline

        pipe = load_pipeline("base")
        side = pipe.unet.config.sample_size * pipe.vae_scale_factor
    else:
        from fastdiff.testing import tiny_pipeline

        pipe = tiny_pipeline("sd15", size="full", seed=0)
        if model == "sd15-half":
            from diffusers import UNet2DConditionModel

            cfg = dict(pipe.unet.config)
            cfg["block_out_channels"] = [c // 2 for c in cfg["block_out_channels"]]
            torch.manual_seed(0)
            pipe.unet = UNet2DConditionModel.from_config(cfg).eval()
        elif model != "sd15-full":
            raise SystemExit(f"unknown --model {model!r}; valid: tiny, sd15-full, sd15-half")
        side = side_px or 256
    if model != "tiny":  # the tiny model keeps its reference scheduler
        pipe.scheduler = DDIMScheduler.from_config(pipe.scheduler.config)
    pipe.set_progress_bar_config(disable=True)
    return pipe, side


def round_robin(fns: dict, reps: int, warmup: int = 1) -> dict[str, float]:
    """Median seconds per callable, timed in interleaved rounds."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    samples = {k: [] for k in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in samples.items()}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="sd15-half", choices=["tiny", "sd15-full", "sd15-half"])
    p.add_argument("--calib-prompts", type=int, default=4)
    p.add_argument("--steps", type=int, default=8, help="sampler steps per calibration run")
    p.add_argument("--levels", default="conv,conv+ffn,conv+ffn+qkv,all")
    p.add_argument("--methods", default="percentile")
    p.add_argument("--act-types", default="uint8", help="activation int8 types to try: uint8,int8")
    p.add_argument("--guidance", type=float, default=7.5)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--sensitivity", action="store_true", help="also run the per-category sensitivity sweep")
    p.add_argument("--name", default=None, help="results file name (default engines-<model>)")
    p.add_argument("--workdir", default=None)
    p.add_argument(
        "--suite", default="onnx", choices=["onnx", "cpu"], help="cpu: see benchmarks/engines_cpu.py"
    )
    p.add_argument(
        "--rows", default="eager,ort-fp32,ov-plain-fp32,ov-plain-default,ov-fp32,ov-bf16,ov-int8,ov-mixed"
    )
    p.add_argument("--records", type=int, default=32, help="cpu suite: most calibration records used")
    p.add_argument("--quality-records", type=int, default=2, help="cpu suite: held-back records judged")
    p.add_argument("--ort-level", default="conv+ffn+qkv")
    p.add_argument("--side", type=int, default=None, help="image side in px (sd15 models; default 256)")
    p.add_argument(
        "--min-group-snr-db",
        type=float,
        default=None,
        help="cpu suite, ov-mixed: groups whose int8-alone SNR is below it stay in high precision "
        "(default: QuantConfig's)",
    )
    p.add_argument("--note", default="", help="cpu suite: a line about this run, added to the results notes")
    p.add_argument(
        "--isolate",
        action="store_true",
        help="cpu suite: build and time each row of --rows in its own process (with its own eager row), one "
        "after another, written as one run; every row's engines held in one process do not fit in 24 GB",
    )
    p.add_argument(
        "--run", type=int, default=None, help="cpu suite: the run number to write (--isolate sets it)"
    )
    args = p.parse_args(argv)
    if args.suite == "cpu" and args.isolate:
        return cpu_suite_isolated(args, sys.argv[1:] if argv is None else list(argv))
    if args.suite == "cpu":
        return cpu_suite(args)
    logging.basicConfig(level=logging.WARNING)
    torch.manual_seed(0)

    pipe, side = make_pipeline(args.model)
    unet = pipe.unet
    work = Path(args.workdir or tempfile.mkdtemp(prefix="fastdiff-bench-engines-"))
    work.mkdir(parents=True, exist_ok=True)
    log = lambda *a: print(f"[{time.strftime('%H:%M:%S')}]", *a, flush=True)

    t0 = time.perf_counter()
    if args.model == "tiny":  # calibrate on training-split prompts; e2e evaluates held-out ones
        from fastdiff.tiny.data import sample_attributes

        prompts = [a.prompt for a in sample_attributes(args.calib_prompts, seed=0, split="train")]
    else:
        prompts = _prompts(args.calib_prompts)
    calib = calibrate(pipe, prompts, args.steps, guidance_scale=args.guidance, height=side, width=side)
    calib_s = time.perf_counter() - t0
    fit, held = calib.split(4)
    log(f"calibration: {len(calib)} records in {calib_s:.0f}s; {len(fit)} fit, {len(held)} held back")

    t0 = time.perf_counter()
    first = held.records[0]
    fp32_path = export_onnx(
        unet,
        work / "unet.onnx",
        sample_shape=tuple(first["sample"].shape),
        sequence_length=first["encoder_hidden_states"].shape[1],
    )
    export_s = time.perf_counter() - t0
    log(f"export {export_s:.0f}s")

    variants = {"ort-fp32": {"path": fp32_path, "build_s": export_s}}
    for act in args.act_types.split(","):
        for method in args.methods.split(","):
            ranges = work / f"ranges-{method}-{act}.json"
            for level in args.levels.split(","):
                t0 = time.perf_counter()
                qpath = quantize(
                    fp32_path,
                    fit,
                    level=level,
                    method=method,
                    activation_type=act,
                    out_path=work / f"unet-{level.replace('+', '-')}-{method}-{act}.onnx",
                    calibration_cache=ranges,
                )
                name = f"ort-int8 {level} {method}" + ("" if act == "uint8" else f" {act}")
                variants[name] = {"path": qpath, "build_s": time.perf_counter() - t0, "level": level}
                log(f"quantised {name} in {variants[name]['build_s']:.0f}s")

    rows = []
    runners = {}
    for name, v in variants.items():
        runners[name] = OrtRunner(v["path"])
        q = measure_quality(unet, runners[name], held)
        summary = qdq_summary(v["path"]) if name != "ort-fp32" else None
        rows.append(
            {
                "variant": name,
                "quantised_layers": sum(summary["quantised"].values()) if summary else 0,
                "snr_db": round(q["snr_db"], 2),
                "snr_db_min": round(q["snr_db_min"], 2),
                "cosine": round(q["cosine"], 6),
                "build_s": round(v["build_s"], 1),
            }
        )
        log(f"{name}: SNR {q['snr_db']:.2f} dB (min {q['snr_db_min']:.2f}), cosine {q['cosine']:.6f}")

    # Time one U-Net step (the CFG pair: batch 2) for every variant, round-robin.
    record = held.records[len(held) // 2]
    fns = {"torch-eager-fp32": lambda: _eager(unet, record)}
    fns.update({name: (lambda r=r: r(record)) for name, r in runners.items()})
    times = round_robin(fns, args.reps)
    eager = times["torch-eager-fp32"]
    rows.insert(0, {"variant": "torch-eager-fp32", "quantised_layers": 0, "snr_db": None, "cosine": 1.0})
    for row in rows:
        t = times[row["variant"]]
        row["ms_per_step"] = round(1000 * t, 1)
        row["speedup_vs_eager"] = round(eager / t, 2)
    log(json.dumps(rows, indent=1))

    notes = [
        f"Model: {args.model} U-Net ({sum(p.numel() for p in unet.parameters()) / 1e6:.0f} M params), "
        f"one step = batch 2 (CFG pair) at {side}x{side} px, latent {tuple(record['sample'].shape)}.",
        f"Calibration: {args.calib_prompts} prompts x {args.steps} {type(pipe.scheduler).__name__} steps, "
        f"guidance {args.guidance} = {len(calib)} "
        f"recorded U-Net calls; every 4th held back for quality ({len(held)}), the rest calibrate ({len(fit)}).",
        f"Timing: median of {args.reps} round-robin repetitions after 1 warm-up, all variants in one process.",
        "int8: ONNX Runtime quantize_static QDQ, per-channel symmetric int8 weights, per-tensor activations "
        "(uint8 asymmetric unless noted); float islands: time embedding, conv_in, conv_out, norms, attention matmuls.",
    ]
    extra = {}
    if args.sensitivity:
        sens = layer_sensitivity(fp32_path, fit, held.subset(2), by="category")
        extra["sensitivity"] = sens
        notes.append(
            "Per-category sensitivity (only that category int8; SNR vs ORT fp32): "
            + ", ".join(f"{s['group']} {s['snr_db']:.1f} dB ({s['num_nodes']})" for s in sens)
        )
        log(json.dumps(sens, indent=1))
    meta = env_info()
    meta.update({"model": args.model, "calibration_s": round(calib_s, 1), **extra})
    name = args.name or f"engines-{args.model}"
    cols = [
        "variant",
        "quantised_layers",
        "ms_per_step",
        "speedup_vs_eager",
        "snr_db",
        "snr_db_min",
        "cosine",
        "build_s",
    ]
    paths = write_results(name, rows, meta, cols, notes="\n".join(f"- {n}" for n in notes))
    log("wrote", *paths)


def _without(argv: list[str], *flags: str) -> list[str]:
    """``argv`` less each of ``flags`` (a bare switch for --isolate, else with its value, either spelling)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in flags:
            skip = a != "--isolate"
        elif not any(a.startswith(f + "=") for f in flags):
            out.append(a)
    return out


def cpu_suite_isolated(args, argv: list[str]) -> None:
    """``--isolate``: every row of ``--rows`` in a child process of its own, one after another, under one run
    number, so a run of every row fits in memory and each row's peak memory is its own. Each child times
    its row against its own eager row (ratios stay within a process)."""
    import subprocess

    from _common import RESULTS_DIR

    if not args.name:
        raise SystemExit("--isolate needs --name (the results file every child appends to)")
    path = RESULTS_DIR / f"{args.name}.json"
    prior = json.loads(path.read_text())["rows"] if path.is_file() else []
    run = args.run or 1 + max((r["run"] for r in prior), default=0)
    base = _without(argv, "--isolate", "--rows", "--note", "--run")
    failed = []
    for i, row in enumerate(r for r in args.rows.split(",") if r != "eager"):
        note = ["--note", args.note] if args.note and i == 0 else []
        child = [sys.executable, __file__, *base, "--rows", f"eager,{row}", "--run", str(run), *note]
        print(f"[{time.strftime('%H:%M:%S')}] run {run}: {row} in its own process", flush=True)
        if subprocess.run(child).returncode != 0:
            failed.append(row)
    if failed:
        raise SystemExit(f"run {run}: rows that failed (see above): {failed}")


def cpu_suite(args):
    """Rows of benchmarks/engines_cpu.py appended to one results file (several invocations, one file)."""
    import os

    from _common import RESULTS_DIR
    from engines_cpu import EXTRA_ROWS, ROWS, header, run_rows

    from fastdiff.engines.cpu import has_bf16, has_vnni

    args.rows = args.rows.split(",")
    unknown = set(args.rows) - set(ROWS) - set(EXTRA_ROWS)
    if unknown:
        raise SystemExit(f"unknown --rows {sorted(unknown)}; valid: {list(ROWS + EXTRA_ROWS)}")
    pipe, args.side = make_pipeline(args.model, args.side)
    name = args.name or f"engines-cpu-{args.model}-{args.side}"
    work = Path(args.workdir or f"/tmp/fastdiff-bench-{name}")
    work.mkdir(parents=True, exist_ok=True)
    prompts = _prompts(args.calib_prompts)
    if args.model == "tiny":
        from fastdiff.tiny.data import sample_attributes

        prompts = [a.prompt for a in sample_attributes(args.calib_prompts, seed=0, split="train")]
    rows = run_rows(pipe, args, work, prompts, round_robin)
    path = RESULTS_DIR / f"{name}.json"
    prior = json.loads(path.read_text())["rows"] if path.is_file() else []
    run = args.run or 1 + max((r["run"] for r in prior), default=0)
    load = os.getloadavg()[0]
    new = [{"run": run, "variant": k, "load_1min": round(load, 2), **v} for k, v in rows.items()]
    meta = env_info()
    meta.update(header())
    meta.update(
        {"model": args.model, "side_px": args.side, "calib_prompts": args.calib_prompts, "steps": args.steps}
    )
    cols = [
        "run",
        "variant",
        "step_s",
        "vs_eager",
        "snr_db",
        "snr_db_min",
        "build_s",
        "build_without_quality_s",
        "quality_check_s",
        "first_call_s",
        "cache_hit",
        "peak_rss_gb",
        "quantize_peak_rss_gb",
        "min_group_snr_db",
        "high_precision_layers",
        "load_1min",
    ]
    if any("picked" in r for r in prior + new):  # ov-auto: the precision it installed
        cols.insert(cols.index("step_s"), "picked")
    notes = (
        f"- {args.model} U-Net, one step = batch 2 (CFG pair) at {args.side}x{args.side} px; SNR vs eager PyTorch "
        f"fp32 on {args.quality_records} held-back recorded inputs; calibration {args.calib_prompts} prompts x "
        f"{args.steps} steps (records streamed to disk), at most {args.records} records calibrate.\n"
        "- vs_eager: median of round-robin repetitions in one process (each run times its rows against its own "
        "eager row). peak_rss_gb: process peak while the row was built and judged (it includes the U-Net and "
        "everything built before it in that run).\n"
        "- CPU flags that matter here: "
        + ", ".join(meta["cpu_engine_flags"])
        + (
            ". AVX2-only: no VNNI (int8 dot products saturate) and no AVX512-BF16/AMX (bf16 emulated); "
            "the issue's figures came from an AVX-512/VNNI/BF16 machine."
            if not has_vnni() and not has_bf16()
            else ""
        )
        + "\n- build_s: compile_engine's wall time (export, quantisation, OpenVINO/ORT build and its quality "
        "check on the held-back records); quality_check_s: that check alone (the engine's first compile, engine "
        "and eager PyTorch on the held-back records; 0 on a cache hit that has the result), build_without_quality_s "
        "the rest; first_call_s: the first step after it (per-shape compile). The rows of one "
        "run are built one after another in one process: a row's peak_rss_gb includes what the earlier rows of "
        "its run still hold; in a run with one row besides eager it is that row's own peak."
    )
    if path.is_file():  # notes written for earlier runs stay; this run's --note is added
        notes = json.loads(path.read_text()).get("notes") or notes
    if args.note and f"- run {run}: " not in notes:
        notes = notes.rstrip() + f"\n- run {run}: {args.note}"
    paths = write_results(name, prior + new, meta, cols, notes=notes)
    print("wrote", *paths)


@torch.no_grad()
def _eager(unet, record):
    added = None
    if "text_embeds" in record:
        added = {"text_embeds": record["text_embeds"], "time_ids": record["time_ids"]}
    return unet(
        record["sample"],
        record["timestep"],
        record["encoder_hidden_states"],
        timestep_cond=record.get("timestep_cond"),
        added_cond_kwargs=added,
        return_dict=False,
    )[0]


if __name__ == "__main__":
    main()
