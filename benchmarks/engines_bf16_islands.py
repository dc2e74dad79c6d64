"""Where does OpenVINO's bf16 lose its SNR on the full SD1.5 U-Net, and can f32 islands buy it back?

Issue #14's goal is >= 5x eager fp32 per U-Net step at >= 30 dB. On the AMX Xeon bf16 reaches 4.59x at
30.16 dB and int8 5.98x at 25.97 dB (results/engines-cpu-sd15-256-amx.md): bf16 sits on the threshold, so
any int8 layer added to it falls below 30 dB unless bf16's own error can be cut cheaply somewhere. This
script asks which operations that error comes from: it compiles OpenVINO's fp32 IR of the U-Net with the
bf16 hint while keeping one class of operations in f32 (OpenVINO's per-node "precise" runtime attribute,
which the CPU plugin honours as "keep original precision"), and measures each variant's SNR against eager
PyTorch fp32 on held-back calibration records and its step time. An f32 island that recovers several dB
for a few percent of time would leave room for int8 elsewhere; one that recovers little says the error is
spread over the network.

The attribute is written into the IR's XML (OpenVINO's Python API does not expose it): a measurement
technique, not something fastdiff installs. Kernel time per precision comes from OpenVINO's performance
counters (a separate compile with PERF_COUNT on, one call).

Run:  flock /tmp/fastdiff-heavy.lock python benchmarks/engines_bf16_islands.py --workdir /tmp/fastdiff-bf16
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from benchmarks._common import env_info, load_average, write_results  # noqa: E402

# Operation classes kept in f32, by the IR's layer types (the PyTorch frontend's names).
ISLANDS = {
    "none (bf16)": (),
    "group norm": ("GroupNormalization", "MVN"),
    "attention core": ("ScaledDotProductAttention", "Softmax"),
    "matmul (linear layers)": ("MatMul",),
    "elementwise (adds, activations, concat)": (
        "Add",
        "Multiply",
        "Swish",
        "Gelu",
        "Divide",
        "Subtract",
        "Concat",
    ),
    "elementwise + matmul": ("Add", "Multiply", "Swish", "Gelu", "Divide", "Subtract", "Concat", "MatMul"),
    "convolution": ("Convolution",),
}
PRECISE = '\t<rt_info>\n\t\t\t\t<attribute name="precise" version="0" />\n\t\t\t</rt_info>\n\t\t</layer>'


def mark_f32(xml: str, types: tuple[str, ...]) -> tuple[str, int]:
    """``xml`` with every layer of ``types`` marked "precise" (kept in f32); and how many were marked."""
    if not types:
        return xml, 0
    kinds = "|".join(types)
    pattern = rf'<layer id="\d+" name="[^"]*" type="(?:{kinds})" version="[^"]*">.*?</layer>'
    return re.subn(pattern, lambda m: m.group(0)[: -len("</layer>")] + PRECISE, xml, flags=re.S)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--side", type=int, default=256)
    p.add_argument("--workdir", default="/tmp/fastdiff-bf16-islands")
    p.add_argument("--calib-prompts", type=int, default=4)
    p.add_argument("--held", type=int, default=8, help="held-back records judged")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--name", default="engines-bf16-islands")
    args = p.parse_args(argv)

    import openvino as ov
    from engines import round_robin
    from engines_cpu import held_back_setup, plain_ir, unet_kwargs

    from fastdiff.engines.quality import snr_db
    from fastdiff.unet_inputs import unet_signature

    pipe, side, work, calib, held = held_back_setup(args.side, args.workdir, args.calib_prompts, args.held)
    unet = pipe.unet
    sig = unet_signature(unet)
    names = sig.input_names
    feeds = [{n: r[n].numpy() for n in names} for r in held]

    def eager(r):
        with torch.no_grad():
            return unet(**unet_kwargs(unet, r), return_dict=False)[0]

    refs = [eager(r) for r in held]
    ir = plain_ir(unet, held[0], work)
    xml = ir.read_text()
    core = ov.Core()

    def compile_variant(types, hint, perf=False):
        text, marked = mark_f32(xml, types)
        path = work / "variant.xml"
        path.write_text(text)
        bin_path = work / "variant.bin"
        if not bin_path.exists():
            bin_path.symlink_to(ir.with_suffix(".bin"))
        model = core.read_model(path)
        model.reshape({n: list(feeds[0][n].shape) for n in names})
        cfg = {"INFERENCE_PRECISION_HINT": hint, "PERFORMANCE_HINT": "LATENCY", "PERF_COUNT": perf}
        return core.compile_model(model, "CPU", cfg).create_infer_request(), marked

    def step_seconds(fn):  # median of --reps calls after one warm-up
        return round_robin({"fn": fn}, args.reps)["fn"]

    eager_s = step_seconds(lambda: eager(held[0]))
    rows = []
    for label, types in [("f32 hint (reference speed)", None), *ISLANDS.items()]:
        hint = "f32" if types is None else "bf16"
        try:
            req, marked = compile_variant(types or (), hint)
        except RuntimeError as e:  # OpenVINO refuses some markings; say so instead of dropping the row
            rows.append({"f32 island": label, "marked": None, "error": str(e).strip().splitlines()[-1]})
            print(rows[-1], flush=True)
            continue

        def infer(f, req=req):
            req.infer(f)
            return torch.from_numpy(req.get_output_tensor(0).data.copy())

        snrs = [snr_db(infer(f), ref) for f, ref in zip(feeds, refs)]
        step = step_seconds(lambda req=req: req.infer(feeds[0]))
        del req
        prof_req, _ = compile_variant(types or (), hint, perf=True)
        prof_req.infer(feeds[0])
        kernel = {"bf16": 0.0, "f32": 0.0}
        for info in prof_req.get_profiling_info():
            ms = info.real_time.total_seconds() * 1e3
            kernel["bf16" if "bf16" in info.exec_type else "f32"] += ms
        del prof_req
        rows.append(
            {
                "f32 island": label,
                "marked": marked,
                "snr_mean_db": round(statistics.mean(snrs), 2),
                "snr_worst_db": round(min(snrs), 2),
                "step_s": round(step, 4),
                "vs_eager": round(eager_s / step, 2),
                "f32_kernel_share": round(kernel["f32"] / max(sum(kernel.values()), 1e-9), 3),
                "load_1min": load_average(),
            }
        )
        print(rows[-1], flush=True)

    meta = env_info()
    meta.update({"side_px": side, "held_records": len(held), "eager_step_s": round(eager_s, 4)})
    bf16 = next(r for r in rows if r["f32 island"] == "none (bf16)")
    notes = (
        f"- Full-width SD1.5 U-Net, random weights (seed 0), batch 2 (CFG pair) at {side}x{side} px; SNR against "
        f"eager PyTorch fp32 on {len(held)} held-back calibration records (every 4th of {len(calib)}, spread over "
        f"the timesteps); eager fp32 step {eager_s:.3f} s; step_s: median of {args.reps} calls after one warm-up, "
        "one variant compiled at a time in one process.\n"
        "- f32 island: the IR layer types marked 'precise' (kept in f32) under the bf16 hint; marked: how many "
        "layers. OpenVINO fuses some marked layers into others (e.g. MatMul into FullyConnected, GroupNorm into "
        "MVN), so a marking does not always reach the kernel: f32_kernel_share is the share of kernel time in f32 "
        "kernels by OpenVINO's performance counters (one call, its own compile).\n"
        f"- Plain bf16 here: {bf16['snr_mean_db']} dB mean, {bf16['snr_worst_db']} dB worst, {bf16['vs_eager']}x "
        "eager. Reading: see the README of benchmarks (engines section) and results/engines-cpu-goals.md."
    )
    cols = ["f32 island", "marked", "snr_mean_db", "snr_worst_db", "step_s", "vs_eager", "f32_kernel_share"]
    cols += ["load_1min"] + (["error"] if any("error" in r for r in rows) else [])
    print("wrote", *write_results(args.name, rows, meta, cols, notes=notes))


if __name__ == "__main__":
    main()
