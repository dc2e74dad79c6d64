"""One int8 OpenVINO engine compiled with the f32 and with the bf16 inference hint, beside eager fp32.

Until 2026-12-05 compile_engine's int8 engines ran their unquantised layers (attention's activation
matmuls, softmax, GroupNorm, the float islands) at the f32 hint, mixed engines at bf16 where the CPU
has it; these runs made bf16 (where native) the int8 default too. Speed round-robin in one process
against eager PyTorch fp32, and SNR against eager on held-back records, on an engine
``engines.py --suite cpu`` already built (its cache folder) and the records it recorded (``--workdir``).

    flock /tmp/fastdiff-heavy.lock python benchmarks/engines_int8_hint.py --model sd15-full --side 512 \\
        --engine /tmp/fastdiff-bench-512/cache/<key>/engine.xml --workdir /tmp/fastdiff-bench-512
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import env_info, write_results  # noqa: E402
from engines import make_pipeline, round_robin  # noqa: E402

from fastdiff.engines import CalibrationData  # noqa: E402
from fastdiff.engines.cpu import engine_flags  # noqa: E402
from fastdiff.engines.quality import measure_quality  # noqa: E402
from fastdiff.engines.runtime_ov import OvRunner, openvino_has_bf16  # noqa: E402
from fastdiff.unet_inputs import unet_signature  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="sd15-full", choices=["sd15-full", "sd15-half", "tiny"])
    ap.add_argument("--side", type=int, default=None)
    ap.add_argument("--engine", required=True, help="engine.xml of an int8 engine built for this model")
    ap.add_argument("--workdir", required=True, help="the engines.py --workdir holding records/")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--name", default=None)
    args = ap.parse_args(argv)
    if not openvino_has_bf16():
        raise SystemExit("this CPU has no native bf16 in OpenVINO (AVX512-BF16 or AMX): nothing to compare")
    pipe, side = make_pipeline(args.model, args.side)
    unet = pipe.unet
    held = CalibrationData.load(Path(args.workdir) / "records").split(4)[1].subset(2)
    record = held.records[len(held) // 2]
    signature = unet_signature(unet)

    def eager():
        with torch.no_grad():
            return unet(**signature.from_flat(record), return_dict=False)[0]

    fns, rows = {"eager fp32": eager}, {}
    for hint in ("f32", "bf16"):
        runner = OvRunner(args.engine, hint=hint)
        quality = measure_quality(unet, runner, held)
        rows[f"int8, {hint} hint"] = {
            "snr_db": round(quality["snr_db"], 2),
            "snr_db_min": round(quality["snr_db_min"], 2),
        }
        fns[f"int8, {hint} hint"] = (lambda rn: lambda: rn(record))(runner)
    times = round_robin(fns, reps=args.reps, warmup=1)
    rows["eager fp32"] = {"snr_db": float("inf")}
    load = round(os.getloadavg()[0], 2)
    out = [
        {
            "variant": k,
            "step_s": round(times[k], 3),
            "vs_eager": round(times["eager fp32"] / times[k], 2),
            **v,
            "load_1min": load,
        }
        for k, v in rows.items()
    ]
    meta = env_info()
    meta.update(
        {"model": args.model, "side_px": side, "engine": str(args.engine), "cpu_engine_flags": engine_flags()}
    )
    notes = (
        f"- {args.model} U-Net at {side}x{side} px, batch 2 (one CFG step); one int8 IR (compile_engine's defaults) "
        "compiled twice by OpenVINO's CPU plugin, with INFERENCE_PRECISION_HINT f32 (int8 engines' hint until "
        "2026-12-05) and bf16 (mixed engines' hint where native, and int8's since); SNR vs eager PyTorch fp32 on 2 held-back records; "
        "speed: median of round-robin repetitions in one process.\n"
        "- Random weights: the SNR is not representative of a trained U-Net."
    )
    print(write_results(args.name or f"engines-cpu-int8-hint-{args.model}-{side}", out, meta, notes=notes))


if __name__ == "__main__":
    main()
