"""U-Net kernel benchmark: Winograd 3x3 conv, GroupNorm+SiLU and the fused pair against the native ops.

Shapes are every distinct 3x3 stride-1 conv (and GroupNorm) of the SD1.5 / SDXL U-Net at the given image
size, derived from the architecture (conv_in, resnets, upsampler convs, conv_out; skip concatenations
included). Each row times fastdiff and its baseline side by side in this process and reports the ratio
(baseline time / fastdiff time, > 1 means fastdiff is faster) plus achieved TFLOP/s (direct-conv FLOPs,
2*N*K*C*9*H*W, so Winograd's saving shows up as higher "effective" throughput) and GB/s against the peaks
measured in the same run (an fp32/fp16 matmul and a device copy).

CPU (``--device cpu``): the PyTorch Winograd (batched GEMM over the 16 planes) vs oneDNN's conv, and the
"auto" plan (WinogradConv2d after measuring) vs native: by construction auto keeps a kernel only where it
measured faster. The Triton kernels are not timed on CPU: the interpreter proves correctness, never speed.

CUDA (``--device cuda``): the Triton Winograd (input transform, GEMM, output transform) vs cuDNN (``cudnn.benchmark=True``), Triton GroupNorm+SiLU
vs eager, fused GroupNorm+SiLU+conv vs (Triton GroupNorm+SiLU, then cuDNN conv), via triton.testing.do_bench.

    nice -n 10 python benchmarks/kernel_speed.py --device cpu --arch sd15 --size 512 --batch 2
    python benchmarks/kernel_speed.py --device cuda --arch sd15,sdxl
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from collections import Counter
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import env_info, time_pair, write_results  # noqa: E402

ARCHS = {  # block_out_channels, layers_per_block, GroupNorm groups, latent channels
    "sd15": ((320, 640, 1280, 1280), 2, 32, 4),
    "sdxl": ((320, 640, 1280), 2, 32, 4),
}


def unet_shapes(arch: str, latent: int) -> tuple[Counter, Counter]:
    """Stride-1 3x3 convs {(C_in, C_out, H): count} and GroupNorm->SiLU inputs {(C, H): count} of a
    diffusers UNet2DConditionModel (down resnets, mid, up resnets with skip concatenation, resamplers)."""
    boc, lpb, _, latent_ch = ARCHS[arch]
    convs: Counter = Counter()
    norms: Counter = Counter()

    def resnet(cin, cout, h):
        convs[(cin, cout, h)] += 1
        convs[(cout, cout, h)] += 1
        norms[(cin, h)] += 1
        norms[(cout, h)] += 1

    h, ch = latent, boc[0]
    convs[(latent_ch, ch, h)] += 1  # conv_in
    skips = [ch]
    for i, out in enumerate(boc):
        for _ in range(lpb):
            resnet(ch, out, h)
            ch = out
            skips.append(ch)
        if i < len(boc) - 1:  # Downsample2D conv has stride 2: not a Winograd shape
            h //= 2
            skips.append(ch)
    resnet(ch, ch, h)  # mid block: two resnets
    resnet(ch, ch, h)
    for i, out in enumerate(reversed(boc)):
        for _ in range(lpb + 1):
            resnet(ch + skips.pop(), out, h)
            ch = out
        if i < len(boc) - 1:  # Upsample2D: nearest x2, then a 3x3 conv at the new size
            h *= 2
            convs[(ch, ch, h)] += 1
    norms[(ch, h)] += 1  # conv_norm_out
    convs[(ch, latent_ch, h)] += 1  # conv_out
    return convs, norms


def conv3x3_shapes(arch: str, latent: int) -> Counter:
    return unet_shapes(arch, latent)[0]


def group_norm_shapes(arch: str, latent: int) -> Counter:
    return unet_shapes(arch, latent)[1]


def measure_peaks(device: torch.device, dtype: torch.dtype) -> dict:
    """Matmul TFLOP/s and copy GB/s measured now, on this device."""
    n = 2048 if device.type == "cpu" else 8192
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    src = torch.empty(64 * 2**20 // 4 if device.type == "cpu" else 2**28, device=device, dtype=torch.float32)
    dst = torch.empty_like(src)
    if device.type == "cuda":
        from triton.testing import do_bench

        t_mm = do_bench(lambda: a @ b) / 1e3
        t_cp = do_bench(lambda: dst.copy_(src)) / 1e3
    else:
        t_mm, t_cp = time_pair(lambda: a @ b, lambda: dst.copy_(src), warmup=1, reps=3)
    return {"matmul_tflops": 2 * n**3 / t_mm / 1e12, "copy_gbps": 2 * src.numel() * 4 / t_cp / 1e9}


def _rand(shape, device, dtype, channels_last, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g).to(device=device, dtype=dtype)
    return x.to(memory_format=torch.channels_last) if channels_last and len(shape) == 4 else x


def _conv_row_cpu(arch, cin, cout, h, count, batch, reps, dtype, cache):
    from fastdiff.kernels.winograd import transform_weight, winograd_conv2d_torch
    from fastdiff.nn.winograd import WinogradConv2d

    x = _rand((batch, cin, h, h), "cpu", dtype, False, seed=cin + h)
    conv = torch.nn.Conv2d(cin, cout, 3, padding=1).to(dtype)
    u = transform_weight(conv.weight, dtype)
    with torch.no_grad():
        native = lambda: F.conv2d(x, conv.weight, conv.bias, padding=1)
        wino = lambda: winograd_conv2d_torch(x, u, conv.bias)
        t_nat, t_win = time_pair(native, wino, warmup=1, reps=reps)
        auto = WinogradConv2d.from_module(conv, mode="auto", plan_cache_dir=cache)
        auto(x)  # measures and keeps the plan
        plan = next(iter(auto.plan_summary().values()))
        t_nat2, t_auto = time_pair(native, lambda: auto(x), warmup=1, reps=reps)
        ref = F.conv2d(x.double(), conv.weight.double(), conv.bias.double(), padding=1)
        err = ((wino().double() - ref).norm() / ref.norm()).item()
    flops = 2 * batch * cout * cin * 9 * h * h
    return {
        "arch": arch,
        "shape": f"{cin}->{cout} @{h}x{h}",
        "layers": count,
        "native_ms": t_nat * 1e3,
        "winograd_torch_ms": t_win * 1e3,
        "winograd_vs_native": t_nat / t_win,
        "auto_choice": plan["choice"],
        "auto_vs_native": t_nat2 / t_auto,
        "native_tflops": flops / t_nat / 1e12,
        "winograd_eff_tflops": flops / t_win / 1e12,
        "winograd_rel_err": err,
    }


def bench_conv_cpu(arch, size, batch, reps, dtype):
    cache = tempfile.mkdtemp(prefix="fastdiff-bench-plans-")  # fresh plans: every shape is measured
    rows = []
    for (cin, cout, h), count in sorted(
        conv3x3_shapes(arch, size // 8).items(), key=lambda kv: (-kv[0][2], kv[0])
    ):
        rows.append(_conv_row_cpu(arch, cin, cout, h, count, batch, reps, dtype, cache))
        print(rows[-1], flush=True)
    return rows


def _bench(fn):
    from triton.testing import do_bench

    return do_bench(fn, warmup=25, rep=100) / 1e3


def _conv_row_cuda(arch, cin, cout, h, count, batch, dtype, groups):
    from fastdiff.kernels.fused_norm_conv import group_norm_silu_conv3x3_triton
    from fastdiff.kernels.group_norm_silu import group_norm_silu_triton
    from fastdiff.kernels.winograd import transform_weight, winograd_conv2d_triton

    dev = torch.device("cuda")
    x = _rand((batch, cin, h, h), dev, dtype, True, seed=cin + h)
    w = (_rand((cout, cin, 3, 3), dev, dtype, False, seed=1) / (3 * cin**0.5)).contiguous(
        memory_format=torch.channels_last
    )
    b = _rand((cout,), dev, dtype, False, seed=2)
    u = transform_weight(w, dtype)
    flops = 2 * batch * cout * cin * 9 * h * h
    with torch.no_grad():
        t_nat = _bench(lambda: F.conv2d(x, w, b, padding=1))
        t_win = _bench(lambda: winograd_conv2d_triton(x, u, b))
        ref = F.conv2d(x.double(), w.double(), b.double(), padding=1)
        rel = lambda y: ((y.double() - ref).norm() / ref.norm()).item()
        row = {
            "arch": arch,
            "shape": f"{cin}->{cout} @{h}x{h}",
            "layers": count,
            "cudnn_ms": t_nat * 1e3,
            "winograd_ms": t_win * 1e3,
            "winograd_vs_cudnn": t_nat / t_win,
            "cudnn_tflops": flops / t_nat / 1e12,
            "winograd_eff_tflops": flops / t_win / 1e12,
            "winograd_rel_err": rel(winograd_conv2d_triton(x, u, b)),
            "cudnn_rel_err": rel(F.conv2d(x, w, b, padding=1)),
        }
        if cin % groups == 0 and cin >= 32:  # resnet convs (not conv_in/conv_out)
            gw, gb = _rand((cin,), dev, dtype, False, 3), _rand((cin,), dev, dtype, False, 4)
            t_fused = _bench(lambda: group_norm_silu_conv3x3_triton(x, groups, gw, gb, 1e-5, u, b))
            t_gn = _bench(lambda: group_norm_silu_triton(x, groups, gw, gb, 1e-5))
            t_eager = _bench(lambda: F.conv2d(F.silu(F.group_norm(x, groups, gw, gb, 1e-5)), w, b, padding=1))
            row.update(
                {
                    "fused_ms": t_fused * 1e3,
                    "fused_vs_gn_then_cudnn": (t_gn + t_nat) / t_fused,  # Triton GN+SiLU, then cuDNN
                    "fused_vs_eager": t_eager / t_fused,
                }
            )
    return row


def _gn_row_cuda(arch, c, h, count, batch, dtype, groups):
    from fastdiff.kernels.group_norm_silu import group_norm_silu_triton

    dev = torch.device("cuda")
    x = _rand((batch, c, h, h), dev, dtype, True, seed=c)
    gw, gb = _rand((c,), dev, dtype, False, 3), _rand((c,), dev, dtype, False, 4)
    t_eager = _bench(lambda: F.silu(F.group_norm(x, groups, gw, gb, 1e-5)))
    t_tr = _bench(lambda: group_norm_silu_triton(x, groups, gw, gb, 1e-5))
    return {
        "arch": arch,
        "shape": f"{c} @{h}x{h}",
        "layers": count,
        "eager_ms": t_eager * 1e3,
        "triton_ms": t_tr * 1e3,
        "triton_vs_eager": t_eager / t_tr,
        "triton_gbps": 2 * x.numel() * x.element_size() / t_tr / 1e9,  # one read + one write
    }


def bench_cuda(arch, size, batch, dtype):
    torch.backends.cudnn.benchmark = True
    groups = ARCHS[arch][2]
    convs, norms = unet_shapes(arch, size // 8)
    conv_rows, gn_rows = [], []
    for (cin, cout, h), count in sorted(convs.items(), key=lambda kv: (-kv[0][2], kv[0])):
        conv_rows.append(_conv_row_cuda(arch, cin, cout, h, count, batch, dtype, groups))
        print(conv_rows[-1], flush=True)
    for (c, h), count in sorted(norms.items(), key=lambda kv: (-kv[0][1], kv[0])):
        gn_rows.append(_gn_row_cuda(arch, c, h, count, batch, dtype, groups))
        print(gn_rows[-1], flush=True)
    return conv_rows, gn_rows


def noise_note(rows) -> str:
    """Where auto kept native, the module runs the very same F.conv2d: its ratio should be 1.0, so the spread
    of those ratios measures this run's timing noise."""
    same = [r["auto_vs_native"] for r in rows if r.get("auto_choice") == "native"]
    if not same:
        return ""
    return (
        f" Timing noise in this run: where auto kept native (the identical op) auto_vs_native ranged "
        f"{min(same):.2f}-{max(same):.2f} instead of 1.00; read ratios within that band as ties."
    )


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"]
    )
    p.add_argument("--arch", default=None, help="comma list of sd15,sdxl (cpu default: sd15)")
    p.add_argument(
        "--size", type=int, default=None, help="image size in pixels (default 512 sd15, 1024 sdxl)"
    )
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--reps", type=int, default=3, help="timed repetitions per measurement (CPU)")
    p.add_argument("--dtype", default=None, choices=["float32", "float16", "bfloat16"])
    p.add_argument("--name", default=None, help="results file stem (default kernels_cpu / kernels_<gpu>)")
    args = p.parse_args(argv)
    if args.device == "cuda":
        os.environ.pop("TRITON_INTERPRET", None)
    dtype = getattr(torch, args.dtype or ("float32" if args.device == "cpu" else "float16"))
    archs = (args.arch or ("sd15" if args.device == "cpu" else "sd15,sdxl")).split(",")
    meta = env_info()
    device = torch.device(args.device)
    peaks = measure_peaks(device, dtype)
    meta.update(
        {
            "device": args.device,
            "dtype": str(dtype),
            "batch": args.batch,
            **{f"peak_{k}": round(v, 3) for k, v in peaks.items()},
        }
    )
    print("peaks", peaks, flush=True)
    rows, gn_rows = [], []
    for arch in archs:
        size = args.size or (512 if arch == "sd15" else 1024)
        meta[f"{arch}_image_size"] = size
        if args.device == "cpu":
            rows += bench_conv_cpu(arch, size, args.batch, args.reps, dtype)
        else:
            c, g = bench_cuda(arch, size, args.batch, dtype)
            rows += c
            gn_rows += g
    for r in rows:
        for k in ("native_tflops", "cudnn_tflops", "winograd_eff_tflops"):
            if k in r:
                r[k.replace("tflops", "pct_peak")] = 100 * r[k] / peaks["matmul_tflops"]
    for r in gn_rows:
        r["triton_pct_copy_bw"] = 100 * r["triton_gbps"] / peaks["copy_gbps"]
    name = args.name or (
        "kernels_cpu"
        if args.device == "cpu"
        else "kernels_" + re.sub(r"[^a-z0-9]+", "_", torch.cuda.get_device_name().lower()).strip("_")
    )
    notes = (
        f"batch {args.batch}, {dtype}; ratios are baseline time / fastdiff time (>1: fastdiff faster). "
        f"Measured peaks in this run: matmul {peaks['matmul_tflops']:.2f} TFLOP/s, copy {peaks['copy_gbps']:.1f} GB/s. "
        "TFLOP/s count direct-convolution FLOPs (2*N*K*C*9*H*W)."
    )
    if args.device == "cpu":
        notes += (
            " CPU: PyTorch Winograd (batched GEMM over 16 planes) vs oneDNN F.conv2d; auto = WinogradConv2d "
            "after its own measurement (keeps Winograd only where it won). Triton kernels are not timed on CPU "
            "(interpreter only). The 2-core machine was shared with other jobs during the run (peaks above are "
            "what was left to this process; % of peak can exceed 100 when the load dropped mid-run)."
        )
    notes += noise_note(rows)
    write_results(name, rows, meta, notes=notes)
    if gn_rows:
        write_results(name + "_groupnorm", gn_rows, meta, notes=notes)
    out = os.environ.get("OUT")
    if out:
        import shutil

        from _common import RESULTS_DIR

        for f in RESULTS_DIR.glob(name + "*"):
            shutil.copy(f, out)
    return rows, gn_rows


if __name__ == "__main__":
    main()
