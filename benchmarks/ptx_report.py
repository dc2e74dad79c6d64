"""Offline Hopper compile report: every shipped Triton kernel, config and launchable variant, for sm_90a.

Triton compiles for a GPU target without a GPU (``triton.compile(ASTSource(...), target=GPUTarget("cuda",
90, 32))``); the PTX is then assembled with Triton's bundled ptxas in verbose mode, whose log gives registers
and spill bytes per thread. Recorded per variant: registers, spill stores/loads (bytes), shared memory
(Triton's metadata), whether the PTX uses ``wgmma`` (Hopper tensor cores) or ``mma.sync``, ptxas warnings,
and the compile time.

Variants are what dispatch can launch: dtype (fp32/fp16/bf16), layout (NCHW or channels_last: the stride
that equals 1 is specialised to a constant, as Triton's launcher does), fused or not, bias or not, every
GEMM autotune config, and, for the GroupNorm kernels, every block shape that the SD1.5 (512^2) and SDXL
(1024^2) U-Nets produce at batch 2 on a 132-SM H200. Pointers and the channel/tile/stride integers are
marked divisible by 16, as they are at those shapes.

The kernel modules are loaded from ``fastdiff/kernels/`` by path, so nothing else of fastdiff (nor diffusers) is
imported; this script runs unchanged with another Triton (e.g. the GPU image's 3.6) on ``sys.path``.

    python benchmarks/ptx_report.py            # all variants -> results/ptx_sm90.{json,md}
    python benchmarks/ptx_report.py --limit 1 --match float16  # a quick subset, printed only
    other-triton/bin/python benchmarks/ptx_report.py --limit 3 --name ptx_sm90_triton36  # subset, written
"""

from __future__ import annotations

import argparse
import atexit
import datetime as dt
import glob
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)  # compile, never interpret
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # Triton's default today; silences 3.9's warning
# a fresh compile cache, so compile times are real compiles (not cache hits) and old binaries never answer;
# removed at exit (it holds every compiled binary)
os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="fastdiff-ptx-report-")
atexit.register(shutil.rmtree, os.environ["TRITON_CACHE_DIR"], ignore_errors=True)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _standalone_kernels import load_kernels  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
SMS_H200 = 132
BATCH = 2


def _ptxas_path() -> str:
    import triton

    try:
        from triton.backends.nvidia.compiler import get_ptxas

        try:
            return get_ptxas(90).path
        except TypeError:  # older Triton: get_ptxas() without the arch
            return get_ptxas().path
    except Exception:  # noqa: BLE001 - fall back to the bundled binaries
        bindir = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
        for cand in ("ptxas-blackwell", "ptxas"):
            hits = glob.glob(str(bindir / cand))
            if hits:
                return hits[0]
    raise RuntimeError("no ptxas found in this Triton build")


def cuda_compile_unavailable_reason() -> str | None:
    """None if this Triton build can compile for sm_90a here, else why not."""
    try:
        import triton  # noqa: F401
        from triton.backends.compiler import GPUTarget  # noqa: F401
        from triton.compiler import ASTSource  # noqa: F401
    except Exception as err:  # noqa: BLE001
        return f"Triton with the CUDA backend is not importable: {err}"
    try:
        path = _ptxas_path()
    except Exception as err:  # noqa: BLE001
        return str(err)
    if not os.access(path, os.X_OK):
        return f"ptxas at {path} is not executable"
    return None


_SPILL = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")
_REGS = re.compile(r"Used (\d+) registers")


def ptxas_stats(ptx: str, arch: str = "sm_90a") -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.ptx"
        src.write_text(ptx)
        cmd = [
            _ptxas_path(),
            "-v",
            "--regAllocOptLevel=2",
            f"--gpu-name={arch}",
            str(src),
            "-o",
            str(src) + ".o",
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode and "regAllocOptLevel" in proc.stderr:  # older ptxas: no such flag
            cmd.remove("--regAllocOptLevel=2")
            proc = subprocess.run(cmd, capture_output=True, text=True)
    log = proc.stdout + proc.stderr
    if proc.returncode:
        raise RuntimeError(f"ptxas failed: {log[-500:]}")
    spills, regs = _SPILL.search(log), _REGS.search(log)
    return {
        "registers": int(regs.group(1)) if regs else None,
        "spill_stores": int(spills.group(1)) if spills else 0,
        "spill_loads": int(spills.group(2)) if spills else 0,
        "ptxas_warnings": [ln.strip() for ln in log.splitlines() if "warning" in ln.lower()],
    }


def compile_variant(fn, types_: dict, constexprs: dict, div16: set, num_warps: int, num_stages: int) -> dict:
    """Compile one specialisation of ``fn`` for sm_90a and describe the result."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature, consts = {}, dict(constexprs)
    for name in fn.arg_names:
        signature[name] = "constexpr" if name in consts else types_[name]
    attrs = {
        (fn.arg_names.index(name),): [["tt.divisibility", 16]]
        for name in fn.arg_names
        if name not in consts and (signature[name].startswith("*") or name in div16)
    }
    t0 = time.perf_counter()
    kernel = triton.compile(
        ASTSource(fn, signature, consts, attrs),
        target=GPUTarget("cuda", 90, 32),
        options={"num_warps": num_warps, "num_stages": num_stages},
    )
    seconds = time.perf_counter() - t0
    ptx = kernel.asm["ptx"]
    meta = kernel.metadata
    shared = meta.shared if hasattr(meta, "shared") else meta.get("shared")
    return {
        **ptxas_stats(ptx),
        "shared_bytes": shared,
        "wgmma": "wgmma.mma_async" in ptx,
        "mma_sync": "mma.sync" in ptx,
        "compile_s": round(seconds, 2),
    }


# ---------------------------------------------------------------------------------------------------------
# What dispatch can launch
# ---------------------------------------------------------------------------------------------------------
_PTR = {"float32": "*fp32", "float16": "*fp16", "bfloat16": "*bf16"}
DTYPES = ("float32", "float16", "bfloat16")
LAYOUTS = ("nchw", "nhwc")


def _int_types(fn, unit: str | None) -> tuple[dict, dict]:
    """i32 for every integer argument, except the unit stride, which Triton specialises to 1."""
    types_ = {name: "i32" for name in fn.arg_names}
    return types_, ({unit: 1} if unit else {})


def sd_shapes() -> tuple[set, set]:
    """Distinct (C, H*W) GroupNorm inputs of SD1.5 at 512^2 and SDXL at 1024^2; SD convs' (C, K)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from kernel_speed import unet_shapes  # the architecture's shapes

    norms, convs = set(), set()
    for arch, latent in (("sd15", 64), ("sdxl", 128)):
        c_shapes, n_shapes = unet_shapes(arch, latent)
        norms |= {(c, h * h) for c, h in n_shapes}
        convs |= {(c, k) for c, k, _ in c_shapes}
    return norms, convs


def variants(wg, gn) -> Iterator[tuple[str, str, object, dict, dict, set, int, int]]:
    """(kernel, variant, fn, types, constexprs, div16, num_warps, num_stages) for everything launchable."""
    import triton

    strides_x = {"nchw": "sxw", "nhwc": "sxc"}
    strides_y = {"nchw": "syw", "nhwc": "syc"}
    for dtype in DTYPES:
        for layout in LAYOUTS:
            for fuse in (False, True):
                for cfg in wg.INPUT_CONFIGS:
                    fn = wg._winograd_input_kernel
                    types_, unit = _int_types(fn, strides_x[layout])
                    types_.update(x_ptr=_PTR[dtype], v_ptr=_PTR[dtype], scale_ptr="*fp32", shift_ptr="*fp32")
                    const = {**unit, "FUSE_NORM": fuse, "EMULATE_BF16": False}
                    const.update({k: v for k, v in cfg.items() if k.startswith("BLOCK")})
                    div = {"C", "P", "sxn", "sxc", "sxh"} - set(unit)
                    yield ("winograd_input", f"{dtype} {layout} {'fused' if fuse else 'plain'}", fn, types_,
                           const, div, cfg["num_warps"], 1)  # fmt: skip
        for cfg in wg.GEMM_CONFIGS:
            fn = wg._winograd_gemm_kernel
            types_, _ = _int_types(fn, None)
            types_.update(v_ptr=_PTR[dtype], u_ptr=_PTR[dtype], m_ptr="*fp32")
            const = {"UPCAST": False, "IEEE": dtype == "float32"}
            const.update({k: v for k, v in cfg.items() if k.startswith("BLOCK")})
            yield (
                "winograd_gemm",
                dtype,
                fn,
                types_,
                const,
                {"P", "C", "K"},
                cfg["num_warps"],
                cfg["num_stages"],
            )
        for layout in LAYOUTS:
            for bias in (False, True):
                for cfg in wg.OUTPUT_CONFIGS:
                    fn = wg._winograd_output_kernel
                    types_, unit = _int_types(fn, strides_y[layout])
                    types_.update(m_ptr="*fp32", bias_ptr=_PTR[dtype], y_ptr=_PTR[dtype])
                    const = {**unit, "HAS_BIAS": bias, "EMULATE_BF16": False}
                    const.update({k: v for k, v in cfg.items() if k.startswith("BLOCK")})
                    div = {"K", "P", "syn", "syc", "syh"} - set(unit)
                    yield ("winograd_output", f"{dtype} {layout} {'bias' if bias else 'no bias'}", fn, types_,
                           const, div, cfg["num_warps"], 1)  # fmt: skip

    # GroupNorm: the block shapes the launchers derive from the SD shapes (see group_norm_silu.py)
    norms, _ = sd_shapes()
    one_pass, two_pass = set(), set()
    for c, hw in sorted(norms):
        cg = c // 32
        bhw, bcg = triton.next_power_of_2(hw), triton.next_power_of_2(cg)
        if bhw * bcg <= gn.ONE_PASS_MAX_ELEMENTS:
            one_pass.add((bhw, bcg, min(16, max(1, bhw * bcg // 512))))
        else:
            block_cg = min(bcg, 64)
            block_hw = max(16, min(bhw, 4096 // block_cg))
            blocks = triton.cdiv(hw, block_hw)
            split = max(1, min(blocks, triton.cdiv(4 * SMS_H200, BATCH * 32)))
            hw_per_split = triton.cdiv(triton.cdiv(hw, split), block_hw) * block_hw
            split = triton.cdiv(hw, hw_per_split)
            two_pass.add((block_hw, block_cg, max(2, triton.next_power_of_2(split))))
    gn_strides = {"nchw": "sxhw", "nhwc": "sxc"}
    for dtype in DTYPES:
        for layout in LAYOUTS:
            for bhw, bcg, warps in sorted(one_pass):
                fn = gn._gn_silu_one_pass_kernel
                types_, unit = _int_types(fn, gn_strides[layout])
                types_.update(
                    x_ptr=_PTR[dtype], y_ptr=_PTR[dtype], gamma_ptr=_PTR[dtype], beta_ptr=_PTR[dtype]
                )
                types_["eps"] = "fp32"
                const = {**unit, "HAS_WEIGHT": True, "HAS_BIAS": True, "APPLY_SILU": True, "EMULATE_BF16": False,
                         "BLOCK_HW": bhw, "BLOCK_CG": bcg}  # fmt: skip
                yield ("gn_silu_one_pass", f"{dtype} {layout} {bhw}x{bcg}", fn, types_, const,
                       {"C", "HW", "sxn"} - set(unit), warps, 1)  # fmt: skip
            for bhw, bcg, _ in sorted(two_pass):
                fn = gn._gn_stats_kernel
                types_, unit = _int_types(fn, gn_strides[layout])
                types_.update(x_ptr=_PTR[dtype], part_ptr="*fp32")
                const = {**unit, "BLOCK_HW": bhw, "BLOCK_CG": bcg}
                yield ("gn_stats", f"{dtype} {layout} {bhw}x{bcg}", fn, types_, const,
                       {"C", "HW", "sxn"} - set(unit), 4, 1)  # fmt: skip
            fn = gn._affine_silu_kernel
            types_, _ = _int_types(fn, None)
            types_.update(x_ptr=_PTR[dtype], y_ptr=_PTR[dtype], scale_ptr="*fp32", shift_ptr="*fp32")
            const = {
                "CHANNELS_LAST": layout == "nhwc",
                "APPLY_SILU": True,
                "EMULATE_BF16": False,
                "BLOCK": 1024,
            }
            yield ("gn_affine_silu", f"{dtype} {layout}", fn, types_, const, {"C", "HW", "TOTAL"}, 4, 1)
        for _, bcg, bs in sorted(two_pass):
            for extra in (False, True):
                fn = gn._gn_finalize_kernel
                types_, _ = _int_types(fn, None)
                types_.update(part_ptr="*fp32", gamma_ptr=_PTR[dtype], beta_ptr=_PTR[dtype],
                              escale_ptr=_PTR[dtype], eshift_ptr=_PTR[dtype], scale_ptr="*fp32", shift_ptr="*fp32")  # fmt: skip
                types_["eps"] = "fp32"
                const = {
                    "HAS_WEIGHT": True,
                    "HAS_BIAS": True,
                    "HAS_EXTRA": extra,
                    "BLOCK_S": bs,
                    "BLOCK_CG": bcg,
                }
                yield ("gn_finalize", f"{dtype} split{bs} cg{bcg}{' scale_shift' if extra else ''}", fn, types_,
                       const, {"C"}, 4, 1)  # fmt: skip


def _config_label(const: dict, warps: int, stages: int) -> str:
    blocks = "x".join(str(v) for k, v in const.items() if k.startswith("BLOCK"))
    return f"{blocks} w{warps} s{stages}"


def run(limit: int | None = None, only: str | None = None, match: str | None = None) -> list[dict]:
    """Compile the variants (``only``: comma list of kernel names; ``match``: substring of the variant;
    ``limit``: at most that many per kernel) and return one row each."""
    kernels = load_kernels()
    wg, gn = kernels.wg, kernels.gn
    rows, seen, per_kernel = [], set(), {}
    kernels = only.split(",") if only else None
    for kernel, variant, fn, types_, const, div, warps, stages in variants(wg, gn):
        if (kernels and kernel not in kernels) or (match and match not in variant):
            continue
        if limit is not None and per_kernel.get(kernel, 0) >= limit:
            continue
        per_kernel[kernel] = per_kernel.get(kernel, 0) + 1
        key = (kernel, variant, _config_label(const, warps, stages))
        if key in seen:
            continue
        seen.add(key)
        row = {"kernel": kernel, "variant": variant, "config": key[2]}
        try:
            row.update(compile_variant(fn, types_, const, div, warps, stages))
        except Exception as err:  # noqa: BLE001 - a failed compile is a result, recorded as such
            row["error"] = f"{type(err).__name__}: {str(err)[:300]}"
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def write(rows: list[dict], name: str, subset: int | None = None) -> None:
    import torch
    import triton

    ok = [r for r in rows if "error" not in r]
    spilling = [r for r in ok if r["spill_stores"] or r["spill_loads"]]
    meta = {
        "target": "cuda sm_90a (GPUTarget('cuda', 90, 32)), compiled offline without a GPU",
        "triton": triton.__version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "ptxas": subprocess.run([_ptxas_path(), "--version"], capture_output=True, text=True)
        .stdout.strip()
        .splitlines()[-1],
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "host": platform.node(),
        "load": os.getloadavg(),
        "variants": len(rows),
        "subset": subset,
        "failed": len(rows) - len(ok),
        "spilling": len(spilling),
        "max_registers": max((r["registers"] or 0 for r in ok), default=None),
        "total_compile_s": round(sum(r["compile_s"] for r in ok), 1),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    verdict = (
        "**Zero spill bytes in every variant.**"
        if not spilling and ok and len(ok) == len(rows)
        else f"**{len(spilling)} variants spill, {meta['failed']} failed to compile.**"
    )
    lines = [
        f"# {name}: Triton kernels compiled for Hopper (sm_90a) on a CPU machine",
        "",
        f"Triton {meta['triton']}, torch {meta['torch']}, {meta['ptxas']}, Python {meta['python']}; "
        f"{meta['date']}; load {tuple(round(x, 2) for x in meta['load'])}. Generated by "
        "`benchmarks/ptx_report.py`; registers and spills from `ptxas -v`, shared memory from Triton's "
        "metadata, per thread.",
        "",
        f"{verdict} {len(rows)} variants{' (a subset: at most ' + str(subset) + ' per kernel)' if subset else ''}, max {meta['max_registers']} registers, "
        f"{meta['total_compile_s']} s of compiles in all.",
        "",
        "| kernel | variant | config (blocks, warps, stages) | regs | spill st/ld B | smem B | wgmma | mma.sync | compile s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        if "error" in r:
            lines.append(
                f"| {r['kernel']} | {r['variant']} | {r['config']} | FAILED: {r['error'][:80]} | | | | | |"
            )
            continue
        lines.append(
            f"| {r['kernel']} | {r['variant']} | {r['config']} | {r['registers']} | "
            f"{r['spill_stores']}/{r['spill_loads']} | {r['shared_bytes']} | {'yes' if r['wgmma'] else 'no'} | "
            f"{'yes' if r['mma_sync'] else 'no'} | {r['compile_s']} |"
        )
    warnings_ = sorted({w for r in ok for w in r["ptxas_warnings"]})
    if warnings_:
        lines += ["", "ptxas warnings:", *[f"- `{w}`" for w in warnings_]]
    (RESULTS / f"{name}.md").write_text("\n".join(lines) + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--limit", type=int, default=None, help="at most N variants per kernel (no files written)"
    )
    ap.add_argument("--only", default=None, help="comma list of kernel names, e.g. winograd_gemm,gn_stats")
    ap.add_argument(
        "--match", default=None, help="only variants whose description contains this, e.g. float16"
    )
    ap.add_argument(
        "--name", default=None, help="results file stem (default ptx_sm90; given: written for a subset too)"
    )
    ap.add_argument(
        "--update",
        action="store_true",
        help="replace the selected kernels' rows in the existing results file",
    )
    args = ap.parse_args(argv)
    reason = cuda_compile_unavailable_reason()
    if reason:
        print(f"cannot compile for sm_90a here: {reason}")
        return 2
    rows = run(args.limit, args.only, args.match)
    if args.update:  # e.g. after changing one kernel's config: recompile it, keep the other kernels' rows
        name = args.name or "ptx_sm90"
        old = json.loads((RESULTS / f"{name}.json").read_text())
        subset = old["meta"].get("subset")
        fresh = {r["kernel"] for r in rows}
        write([r for r in old["rows"] if r["kernel"] not in fresh] + rows, name, subset)
    elif args.name or (args.limit is None and args.only is None and args.match is None):
        write(rows, args.name or "ptx_sm90", args.limit)
    bad = [r for r in rows if "error" in r or r["spill_stores"] or r["spill_loads"]]
    print(f"{len(rows)} variants, {len(bad)} failing or spilling")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
