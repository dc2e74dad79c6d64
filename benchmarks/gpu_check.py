"""The GPU check run by ``benchmarks/gpu_check.sh``: stages with their own time budgets, one JSON line per row.

Stages (seconds of budget; all of them, compiles included, fit in 7 minutes):

  env         10   GPU, driver, versions
  correct    100   compiled kernels at SD1.5/SDXL shapes, fp16 and bf16, vs float64 and vs native
  conv        45   Winograd vs cuDNN per SD1.5 shape, fp16, NHWC and NCHW, cudnn.benchmark=True for both
  groupnorm   25   GroupNorm+SiLU Triton vs eager, GB/s against the 4.3 TB/s copy peak
  fused       25   GroupNorm+SiLU+conv fused vs Triton GN then cuDNN vs eager
  attention   25   SDPA backends (flash, efficient, cudnn, math) at SD shapes
  unet       170   SD1.5-architecture U-Net step, 64^2 latent, batch 2, fp16: eager SDPA, fastdiff.optimize,
                   torch.compile, optimize then torch.compile (needs diffusers: installed by gpu_check.sh)
  sdxl        --   SDXL U-Net step eager vs optimize, only with the time left of the 7 minutes

Every row is appended to ``<out>/gpu_check.jsonl`` and flushed before the next starts, so a timeout keeps
what finished. A stage stops starting rows when its budget is spent, and is interrupted (SIGALRM) 20 s after.
Autotuning is off (``FASTDIFF_TRITON_AUTOTUNE=0``: one GEMM config per shape) to bound compiles.

``--dry-run`` runs every stage on CPU at tiny shapes (Triton through its interpreter, a CPU timer instead of
``do_bench``, ``torch.compile(backend="eager")``), so a typo cannot waste a GPU run; the tests run it.
The kernels are loaded from ``fastdiff/kernels/`` standalone (no diffusers needed); fastdiff itself only in the
U-Net stages.
"""

# every lambda below is timed at once, inside its own loop iteration, so late binding cannot bite:
# ruff: noqa: B023

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
from _standalone_kernels import load_kernels  # noqa: E402

TOTAL_BUDGET_S = 420
BUDGETS = {"env": 10, "correct": 100, "conv": 45, "groupnorm": 25, "fused": 25, "attention": 25, "unet": 170}
COPY_PEAK_GBPS = 4300.0  # H200 device copy, the GroupNorm roofline

SD15_CONVS = [
    (320, 320, 64),
    (640, 640, 32),
    (1280, 1280, 16),
    (2560, 1280, 8),
    (4, 320, 64),
    (1920, 640, 32),
]
SDXL_CONVS = [(320, 320, 128), (640, 640, 64), (1280, 1280, 32)]
TINY_CONVS = [(16, 16, 6), (4, 16, 5)]  # one with GroupNorm (C % 8 == 0), one conv_in-like


class StageTimeout(Exception):
    pass


class Check:
    """Shared state: device, dry run, clock, output file."""

    def __init__(self, out: Path, dry_run: bool):
        self.dry = dry_run
        self.out = out
        self.start = time.monotonic()
        out.mkdir(parents=True, exist_ok=True)
        self.path = out / ("gpu_check_dry_run.jsonl" if dry_run else "gpu_check.jsonl")
        self.path.write_text("")
        import torch

        self.torch = torch
        self.device = torch.device("cpu" if dry_run else "cuda")
        self.failures = 0
        self.stage = "?"
        self.deadline = 0.0

    def row(self, **fields) -> None:
        rec = {"stage": self.stage, "t_s": round(time.monotonic() - self.start, 1), **fields}
        with open(self.path, "a") as f:
            f.write(json.dumps(rec, default=str) + "\n")
            f.flush()
            os.fsync(f.fileno())
        print(json.dumps(rec, default=str), flush=True)
        if rec.get("ok") is False:
            self.failures += 1

    def time_left(self) -> bool:
        return time.monotonic() < self.deadline

    def bench(self, fn) -> float:
        """Seconds per call: do_bench on CUDA; one timed call on the dry run's CPU (the code path, not speed)."""
        if self.dry:
            t0 = time.perf_counter()
            fn()
            return time.perf_counter() - t0
        from triton.testing import do_bench

        return do_bench(fn, warmup=10, rep=50) / 1e3

    def sync(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize()


def rel(y, ref) -> float:
    return ((y.double() - ref).norm() / ref.norm()).item()


# ---------------------------------------------------------------------------------------------------------
# Stages
# ---------------------------------------------------------------------------------------------------------
def stage_env(ck: Check, k) -> None:
    torch = ck.torch
    info = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda}
    from importlib import metadata

    for dist in (
        "triton",
        "transformers",
        "diffusers",
        "onnxruntime",
        "accelerate",
        "safetensors",
        "tensorrt",
    ):
        try:  # metadata, not import: fast, and a broken package cannot stop the check here
            info[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            info[dist] = "absent"
    if ck.device.type == "cuda":
        props = torch.cuda.get_device_properties(0)
        info.update(
            gpu=props.name, sms=props.multi_processor_count, memory_gb=round(props.total_memory / 2**30)
        )
        info["capability"] = list(torch.cuda.get_device_capability())
        with contextlib.suppress(Exception):
            import subprocess

            info["driver"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=10,
            ).stdout.strip()  # fmt: skip
    info["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    ck.row(**info)


def _conv_case(ck, k, n, c, kk, h, dtype, channels_last, seed=0):
    torch = ck.torch
    g = torch.Generator().manual_seed(seed + c + h)
    x = torch.randn(n, c, h, h + 1, generator=g).to(ck.device, dtype)
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    w = (torch.randn(kk, c, 3, 3, generator=g) / (3 * c**0.5)).to(ck.device, dtype)
    b = torch.randn(kk, generator=g).to(ck.device, dtype)
    return x, w, b


def stage_correct(ck: Check, k) -> None:
    """Compiled kernels vs float64 and vs native at real shapes (bounds as in the kernel tests)."""
    torch, F = ck.torch, ck.torch.nn.functional
    shapes = TINY_CONVS if ck.dry else SD15_CONVS[:4] + SDXL_CONVS
    cases = [(torch.float16, True), (torch.float16, False), (torch.bfloat16, True)]
    for cin, cout, h in shapes:
        for dtype, cl in cases:
            if not ck.time_left():
                ck.row(skipped=f"{cin}->{cout}@{h} {dtype} cl={cl}: stage budget spent")
                continue
            x, w, b = _conv_case(ck, k, 2, cin, cout, h, dtype, cl)
            ref = F.conv2d(x.double(), w.double(), b.double(), padding=1)
            out = torch.full(ref.shape, float("nan"), device=ck.device, dtype=dtype)
            if cl:
                out = out.to(memory_format=torch.channels_last)
            y = k.wg.winograd_conv2d_triton(x, k.wg.transform_weight(w, dtype), b, out=out)
            e_w, e_n = rel(y, ref), rel(F.conv2d(x, w, b, padding=1), ref)
            vs_native = rel(y, F.conv2d(x, w, b, padding=1).double())
            row = dict(op="winograd", shape=[2, cin, cout, h, h + 1], dtype=str(dtype)[6:], channels_last=cl,
                       err=e_w, native_err=e_n, vs_native=vs_native)  # fmt: skip
            row["ok"] = bool(not y.isnan().any().item() and e_w <= 3 * e_n)
            if cin % 32 == 0 or (ck.dry and cin % 8 == 0):
                groups = 32 if cin % 32 == 0 else 8
                gw = torch.randn(cin, device=ck.device).to(dtype)
                gb = torch.randn(cin, device=ck.device).to(dtype)
                r_gn = F.silu(F.group_norm(x.double(), groups, gw.double(), gb.double(), 1e-5))
                e_g = rel(k.gn.group_norm_silu_triton(x, groups, gw, gb, 1e-5), r_gn)
                e_gn = rel(F.silu(F.group_norm(x, groups, gw, gb, 1e-5)), r_gn)
                r_f = F.conv2d(r_gn, w.double(), b.double(), padding=1)
                u = k.wg.transform_weight(w, dtype)
                e_f = rel(k.fused.group_norm_silu_conv3x3_triton(x, groups, gw, gb, 1e-5, u, b), r_f)
                e_fn = rel(F.conv2d(F.silu(F.group_norm(x, groups, gw, gb, 1e-5)), w, b, padding=1), r_f)
                row.update(gn_err=e_g, gn_native_err=e_gn, fused_err=e_f, fused_native_err=e_fn)
                row["ok"] = row["ok"] and e_g <= 2 * e_gn and e_f <= 3 * e_fn
            ck.row(**row)


def stage_conv(ck: Check, k) -> None:
    torch, F = ck.torch, ck.torch.nn.functional
    torch.backends.cudnn.benchmark = True  # both sides: cuDNN picks its best algorithm per shape
    shapes = TINY_CONVS[:1] if ck.dry else SD15_CONVS + SDXL_CONVS
    dtype = torch.float32 if ck.dry else torch.float16
    for cin, cout, h in shapes:
        for cl in (True, False):
            if not ck.time_left():
                ck.row(skipped=f"{cin}->{cout}@{h} cl={cl}: stage budget spent")
                continue
            x, w, b = _conv_case(ck, k, 2, cin, cout, h, dtype, cl, seed=1)
            if cl:
                w = w.contiguous(memory_format=torch.channels_last)
            u = k.wg.transform_weight(w, dtype)
            with torch.no_grad():
                t_nat = ck.bench(lambda x=x, w=w, b=b: F.conv2d(x, w, b, padding=1))
                t_win = ck.bench(lambda x=x, u=u, b=b: k.wg.winograd_conv2d_triton(x, u, b))
            flops = 2 * 2 * cout * cin * 9 * h * (h + 1)
            ck.row(shape=f"{cin}->{cout}@{h}x{h + 1}", channels_last=cl, dtype=str(dtype)[6:],
                   cudnn_ms=t_nat * 1e3, winograd_ms=t_win * 1e3, winograd_vs_cudnn=t_nat / t_win,
                   cudnn_tflops=flops / t_nat / 1e12, winograd_eff_tflops=flops / t_win / 1e12)  # fmt: skip


def stage_groupnorm(ck: Check, k) -> None:
    torch, F = ck.torch, ck.torch.nn.functional
    shapes = [(16, 6)] if ck.dry else [(320, 64), (640, 32), (1280, 16), (2560, 8), (320, 128), (960, 64)]
    dtype = torch.float32 if ck.dry else torch.float16
    for c, h in shapes:
        for cl in (True, False):
            if not ck.time_left():
                ck.row(skipped=f"{c}@{h} cl={cl}: stage budget spent")
                continue
            groups = 8 if ck.dry else 32
            x = torch.randn(2, c, h, h, device=ck.device).to(dtype)
            if cl:
                x = x.to(memory_format=torch.channels_last)
            gw, gb = torch.randn(c, device=ck.device).to(dtype), torch.randn(c, device=ck.device).to(dtype)
            t_e = ck.bench(lambda x=x, gw=gw, gb=gb: F.silu(F.group_norm(x, groups, gw, gb, 1e-5)))
            t_t = ck.bench(lambda x=x, gw=gw, gb=gb: k.gn.group_norm_silu_triton(x, groups, gw, gb, 1e-5))
            gbps = 2 * x.numel() * x.element_size() / t_t / 1e9  # one read, one write
            ck.row(shape=f"{c}@{h}x{h}", channels_last=cl, eager_ms=t_e * 1e3, triton_ms=t_t * 1e3,
                   triton_vs_eager=t_e / t_t, triton_gbps=gbps, pct_of_copy_peak=100 * gbps / COPY_PEAK_GBPS)  # fmt: skip


def stage_fused(ck: Check, k) -> None:
    torch, F = ck.torch, ck.torch.nn.functional
    torch.backends.cudnn.benchmark = True
    shapes = [(16, 16, 6)] if ck.dry else [(320, 320, 64), (640, 640, 32), (1280, 1280, 16), (320, 320, 128)]
    dtype = torch.float32 if ck.dry else torch.float16
    groups = 8 if ck.dry else 32
    for cin, cout, h in shapes:
        if not ck.time_left():
            ck.row(skipped=f"{cin}->{cout}@{h}: stage budget spent")
            continue
        x, w, b = _conv_case(ck, k, 2, cin, cout, h, dtype, True, seed=2)
        w = w.contiguous(memory_format=torch.channels_last)
        gw, gb = torch.randn(cin, device=ck.device).to(dtype), torch.randn(cin, device=ck.device).to(dtype)
        u = k.wg.transform_weight(w, dtype)
        t_f = ck.bench(lambda: k.fused.group_norm_silu_conv3x3_triton(x, groups, gw, gb, 1e-5, u, b))
        t_g = ck.bench(
            lambda: F.conv2d(k.gn.group_norm_silu_triton(x, groups, gw, gb, 1e-5), w, b, padding=1)
        )
        t_e = ck.bench(lambda: F.conv2d(F.silu(F.group_norm(x, groups, gw, gb, 1e-5)), w, b, padding=1))
        ck.row(shape=f"{cin}->{cout}@{h}x{h + 1}", fused_ms=t_f * 1e3, gn_triton_then_cudnn_ms=t_g * 1e3,
               eager_ms=t_e * 1e3, fused_vs_gn_then_cudnn=t_g / t_f, fused_vs_eager=t_e / t_f)  # fmt: skip


def stage_attention(ck: Check, k) -> None:
    torch, F = ck.torch, ck.torch.nn.functional
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = {
        "flash": SDPBackend.FLASH_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "math": SDPBackend.MATH,
    }
    # (name, heads, q_len, kv_len, head_dim) at batch 2 (a CFG pair)
    shapes = [("tiny", 2, 64, 64, 16)] if ck.dry else [
        ("sd15 self 64^2", 8, 4096, 4096, 40), ("sd15 cross 64^2", 8, 4096, 77, 40),
        ("sd15 self 32^2", 8, 1024, 1024, 80), ("sd15 self 16^2", 8, 256, 256, 160),
        ("sdxl self 128^2/2", 10, 4096, 4096, 64), ("sdxl cross", 20, 1024, 77, 64),
    ]  # fmt: skip
    dtype = torch.float32 if ck.dry else torch.float16
    for name, heads, lq, lk, d in shapes:
        if not ck.time_left():
            ck.row(skipped=f"{name}: stage budget spent")
            continue
        q = torch.randn(2, heads, lq, d, device=ck.device).to(dtype)
        kk = torch.randn(2, heads, lk, d, device=ck.device).to(dtype)
        v = torch.randn(2, heads, lk, d, device=ck.device).to(dtype)
        ref = F.scaled_dot_product_attention(q.double(), kk.double(), v.double())
        row = {"shape": name}
        for bname, backend in backends.items():
            try:
                with sdpa_kernel(backend):
                    out = F.scaled_dot_product_attention(q, kk, v)
                    row[f"{bname}_ms"] = ck.bench(lambda: F.scaled_dot_product_attention(q, kk, v)) * 1e3
                row[f"{bname}_err"] = rel(out, ref)
            except Exception as err:  # noqa: BLE001 - an unsupported backend is a finding
                row[f"{bname}_ms"] = f"unsupported: {type(err).__name__}"
        ck.row(**row)


def _unet(ck: Check, arch: str):
    torch = ck.torch
    from diffusers import UNet2DConditionModel

    from fastdiff.testing.pipelines import _FULL_UNETS, _TINY_UNETS
    from fastdiff.testing.probe import unet_probe_inputs

    cfg = (_TINY_UNETS if ck.dry else _FULL_UNETS)[arch]
    dtype = torch.float32 if ck.dry else torch.float16
    torch.manual_seed(0)
    with torch.device(ck.device):  # random init directly on the GPU: seconds, not a minute
        unet = UNet2DConditionModel(**cfg)
    unet = unet.to(dtype).eval()
    size = 16 if ck.dry else cfg["sample_size"]
    inputs = unet_probe_inputs(unet, batch=2, size=size, seq_len=77, device=ck.device, dtype=dtype)
    return unet, inputs


def _step_ms(ck: Check, fn, reps: int) -> float:
    torch = ck.torch
    with torch.no_grad():
        for _ in range(3):
            fn()
        ck.sync()
        samples = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            ck.sync()
            samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1e3


def _unet_rows(ck: Check, arch: str, variants: tuple[str, ...]) -> None:
    torch = ck.torch
    import fastdiff

    torch.backends.cudnn.benchmark = True  # the best eager settings, for every variant alike
    unet, inputs = _unet(ck, arch)
    reps = 3 if ck.dry else 20
    with torch.no_grad():
        ref = unet(**inputs).sample.float()
    results = {}
    compile_kw = {"backend": "eager"} if ck.dry else {}
    for variant in variants:
        if not ck.time_left():
            ck.row(arch=arch, variant=variant, skipped="stage budget spent")
            continue
        t0 = time.monotonic()
        try:
            fastdiff.restore(unet)
            model = unet
            if "optimize" in variant:
                fastdiff.optimize(unet, verify=False)
                with torch.no_grad():
                    unet(**inputs)  # first forward at this shape: plans are measured here
            if "compile" in variant:
                model = torch.compile(unet, **compile_kw)
                with torch.no_grad():
                    model(**inputs)  # compile
            setup_s = time.monotonic() - t0
            ms = _step_ms(ck, lambda model=model: model(**inputs), reps)
            with torch.no_grad():
                out = model(**inputs).sample.float()
            results[variant] = ms
            row = dict(arch=arch, variant=variant, step_ms=ms, setup_s=round(setup_s, 1),
                       rel_err_vs_eager=((out - ref).norm() / ref.norm()).item())  # fmt: skip
            if "eager" in results and variant != "eager":
                row["speedup_vs_eager"] = results["eager"] / ms
            if "compile" in results and variant == "optimize+compile":
                row["speedup_vs_compile"] = results["compile"] / ms
            if variant == "optimize":
                rep = fastdiff.report(unet)
                row["passes"] = [(p.name, p.status, len(p.changed)) for p in rep.passes]
                row["plans"] = {
                    k: v.get("choice") for p in rep.passes for d in p.details.values() for k, v in (d.get("plan") or {}).items()
                }  # fmt: skip
            ck.row(**row)
        except Exception as err:  # noqa: BLE001 - record and go on to the next variant
            ck.row(arch=arch, variant=variant, ok=False, error=f"{type(err).__name__}: {str(err)[:300]}")
        finally:
            torch._dynamo.reset() if hasattr(torch, "_dynamo") else None
    fastdiff.restore(unet)
    del unet


def stage_unet(ck: Check, k) -> None:
    _unet_rows(ck, "sd15", ("eager", "optimize", "compile", "optimize+compile"))


def stage_sdxl(ck: Check, k) -> None:
    _unet_rows(ck, "sdxl", ("eager", "optimize"))


STAGES = {
    "env": stage_env,
    "correct": stage_correct,
    "conv": stage_conv,
    "groupnorm": stage_groupnorm,
    "fused": stage_fused,
    "attention": stage_attention,
    "unet": stage_unet,
    "sdxl": stage_sdxl,
}


def _alarm(signum, frame):
    raise StageTimeout("stage ran past its budget")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny shapes, Triton interpreter")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--stages", default=",".join(STAGES), help="comma list of " + ",".join(STAGES))
    args = ap.parse_args(argv)
    os.environ["FASTDIFF_TRITON_AUTOTUNE"] = "0"
    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"  # before the kernels are defined
    else:
        os.environ.pop("TRITON_INTERPRET", None)
    ck = Check(Path(args.out), args.dry_run)
    if not args.dry_run and not ck.torch.cuda.is_available():
        print("no CUDA device: run with --dry-run on a CPU machine")
        return 2
    k = load_kernels()
    signal.signal(signal.SIGALRM, _alarm)
    for name in args.stages.split(","):
        if name not in STAGES:
            raise SystemExit(f"unknown stage {name!r}; stages: {', '.join(STAGES)}")
        left = TOTAL_BUDGET_S - (time.monotonic() - ck.start)
        budget = BUDGETS.get(name, left)  # sdxl: whatever is left
        ck.stage = name
        if left < min(budget, 30) or budget <= 0:
            ck.row(skipped=f"{left:.0f} s left of the {TOTAL_BUDGET_S} s budget")
            continue
        budget = min(budget, left)
        ck.deadline = time.monotonic() + budget
        signal.alarm(int(budget) + 20)
        t0 = time.monotonic()
        try:
            STAGES[name](ck, k)
        except StageTimeout as err:
            ck.row(ok=False, error=str(err))
        except Exception as err:  # noqa: BLE001 - one broken stage must not stop the others
            ck.row(ok=False, error=f"{type(err).__name__}: {str(err)[:500]}")
        finally:
            signal.alarm(0)
        ck.row(stage_done=name, seconds=round(time.monotonic() - t0, 1))
    ck.stage = "summary"
    ck.row(failures=ck.failures, total_s=round(time.monotonic() - ck.start, 1), dry_run=ck.dry)
    return 1 if ck.failures else 0


if __name__ == "__main__":
    sys.exit(main())
