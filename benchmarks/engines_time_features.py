"""Does computing the timestep's sin/cos features in float32, outside the OpenVINO graph, fix bf16's error?

OpenVINO's bf16 engine of the full SD1.5 U-Net sat at ~30 dB per step against eager fp32 while PyTorch's own
bf16 U-Net (the module cast to bfloat16) gave ~37 dB. A probe traced it to the timestep: under the bf16 hint
the graph's first operations (t * f_k, sin, cos) run in bf16, where t = 999 is not representable and
t * f_k reaches hundreds of radians. Since this change fastdiff's OpenVINO graph starts at the features,
computed in float32 (:mod:`fastdiff.engines.time_features`). This script measures, side by side in one
process on the same inputs:

* ``timestep in the graph``: the plain conversion (``openvino.convert_model`` of the flat U-Net, what
  fastdiff built before and what a plain OpenVINO user gets), compiled with the bf16 hint;
* ``fastdiff (fp32 features)``: ``compile_engine(precision="bf16")`` with this change;
* ``PyTorch bf16``: the U-Net cast to bfloat16 (the timestep embedded in fp32 by diffusers, then cast);

SNR against eager fp32 at fixed timesteps (999, 750, 501, 261, 1; one recorded input with its timestep
replaced) and on held-back calibration records; step time: median of --reps interleaved calls.

Run:  flock /tmp/fastdiff-heavy.lock python benchmarks/engines_time_features.py --workdir /tmp/fastdiff-bf16
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from benchmarks._common import env_info, load_average, write_results  # noqa: E402

TIMESTEPS = (999.0, 750.0, 501.0, 261.0, 1.0)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--side", type=int, default=256)
    p.add_argument("--workdir", default="/tmp/fastdiff-time-features")
    p.add_argument("--held", type=int, default=8, help="held-back records judged")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--name", default="engines-time-features")
    args = p.parse_args(argv)

    import openvino as ov
    from engines import round_robin
    from engines_cpu import held_back_setup, plain_ir, pytorch_bf16, unet_kwargs

    from fastdiff.engines import GateConfig, compile_engine
    from fastdiff.engines.quality import snr_db
    from fastdiff.unet_inputs import unet_signature

    pipe, side, work, _, held = held_back_setup(args.side, args.workdir, held=args.held)
    unet = pipe.unet
    sig = unet_signature(unet)
    names = sig.input_names
    torch_bf16 = pytorch_bf16(unet)

    def eager(r):
        with torch.no_grad():
            return unet(**unet_kwargs(unet, r), return_dict=False)[0]

    ir = plain_ir(unet, held[0], work)  # the plain conversion, timestep in the graph
    plain = ov.Core().read_model(ir)
    plain.reshape({n: list(held[0][n].shape) for n in names})
    plain_req = (
        ov.Core().compile_model(plain, "CPU", {"INFERENCE_PRECISION_HINT": "bf16"}).create_infer_request()
    )

    def plain_run(r):
        plain_req.infer({n: r[n].numpy() for n in names})
        return torch.from_numpy(plain_req.get_output_tensor(0).data.copy())

    engine = compile_engine(
        unet,
        backend="openvino",
        precision="bf16",
        cache_dir=work / "cache",
        install=False,
        gate=GateConfig(min_snr_db=None),
    )
    variants = {
        "timestep in the graph (plain conversion, bf16 hint)": plain_run,
        "fastdiff (fp32 features, bf16 hint)": engine.runner,
        "PyTorch bf16 (U-Net cast to bfloat16)": torch_bf16,
    }
    inputs = []
    for t in TIMESTEPS:
        r = dict(held[0])
        r["timestep"] = torch.full_like(r["timestep"], t)
        inputs.append((f"t = {t:g}", [r]))
    inputs.append(
        (f"{len(held)} held-back records (t {sorted({float(r['timestep'][0]) for r in held})})", held)
    )
    rows = []
    for what, records in inputs:
        refs = [eager(r) for r in records]
        row = {"input": what}
        for label, fn in variants.items():
            snrs = [snr_db(fn(r), ref) for r, ref in zip(records, refs)]
            row[label] = round(statistics.mean(snrs), 2)
            if len(records) > 1:
                row[label + " worst"] = round(min(snrs), 2)
        rows.append(row)
        print(row, flush=True)
    times = round_robin(
        {"eager fp32": lambda: eager(held[0]), **{k: (lambda f=f: f(held[0])) for k, f in variants.items()}},
        args.reps,
    )
    rows.append({"input": "step s (median)", **{k: round(v, 4) for k, v in times.items()}})
    rows.append(
        {"input": "vs eager fp32", **{k: round(times["eager fp32"] / v, 2) for k, v in times.items()}}
    )
    meta = env_info()
    meta.update({"side_px": side, "load_1min": load_average(), "reps": args.reps})
    notes = (
        f"- Full-width SD1.5 U-Net, random weights (seed 0), batch 2 (CFG pair) at {side}x{side} px; SNR (dB) of each "
        "variant's step against eager PyTorch fp32 on the same inputs; the t rows take one recorded input with its "
        "timestep replaced; step s: median of interleaved calls after one warm-up, one process.\n"
        "- 'timestep in the graph' is openvino.convert_model of the flat U-Net, as fastdiff converted before "
        "fastdiff/engines/time_features.py; 'fastdiff' is compile_engine(precision='bf16') with it."
    )
    cols = ["input", "eager fp32", *[c for label in variants for c in (label, label + " worst")]]
    print("wrote", *write_results(args.name, rows, meta, cols, notes=notes))


if __name__ == "__main__":
    main()
