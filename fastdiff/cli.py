"""The ``fastdiff`` command line.

* ``fastdiff info`` — versions, device and usable backends: what a bug report needs.
* ``fastdiff demo`` — generate a comparison grid with the shipped tiny model.
* ``fastdiff sweep SPEC`` — a quality/speed sweep from a TOML/YAML/JSON spec (:mod:`fastdiff.sweep`);
  on several processes: ``torchrun --nproc_per_node N -m fastdiff.cli sweep SPEC`` or
  ``accelerate launch --multi_gpu --num_processes N -m fastdiff.cli sweep SPEC``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys

# Before torch loads: OpenMP threads that spin-wait make shared or
# oversubscribed CPUs (laptops running other work, CI runners) many times
# slower. Users can still set their own policy.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def collect_info() -> dict:
    """Environment facts and which fastdiff backends can run here."""
    import torch

    import fastdiff
    from fastdiff._compat import cpu_model, is_available, triton_unusable_reason, triton_usable, version_of
    from fastdiff.ops.attention import BACKENDS, backend_status

    device = "cuda" if torch.cuda.is_available() else "cpu"
    info = {
        "fastdiff": fastdiff.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda if torch.cuda.is_available() else None,
        "device": torch.cuda.get_device_name() if device == "cuda" else f"cpu: {cpu_model()}",
    }
    for mod in (
        "diffusers",
        "transformers",
        "accelerate",
        "triton",
        "onnx",
        "onnxruntime",
        "openvino",
        "nncf",
        "tensorrt",
        "xformers",
        "flash_attn",
    ):
        info[mod] = version_of(mod) or "not installed"

    dtype = torch.float16 if device == "cuda" else torch.float32
    backends = {}
    for b in BACKENDS:
        reason = backend_status(b, device, dtype)
        backends[f"attention:{b}"] = "usable" if reason is None else f"unusable: {reason}"
    backends["triton kernels"] = (
        "usable" if triton_usable(device) else f"unusable: {triton_unusable_reason(device)}"
    )
    if is_available("onnxruntime"):
        import onnxruntime

        backends["engine:onnxruntime"] = "usable, providers " + ", ".join(
            onnxruntime.get_available_providers()
        )
    else:
        backends["engine:onnxruntime"] = "unusable: pip install 'fastdiff[onnxruntime]'"
    backends["engine:openvino"] = _openvino_status()
    backends["engine:tensorrt"] = (
        "usable"
        if is_available("tensorrt") and device == "cuda"
        else "unusable: needs CUDA and pip install 'fastdiff[tensorrt]'"
    )
    info["backends"] = backends
    return info


def _openvino_status() -> str:
    """OpenVINO on this CPU: which precisions run natively (what ``precision="auto"`` chooses between)."""
    from fastdiff._compat import is_available
    from fastdiff.engines.cpu import engine_flags, has_vnni

    if not is_available("openvino"):
        return "unusable: pip install 'fastdiff[openvino]'"
    from fastdiff.engines.runtime_ov import openvino_has_bf16

    bf16 = "bf16 native" if openvino_has_bf16() else "bf16 not native (runs at f32)"
    int8 = "int8 with VNNI" if has_vnni() else "int8 without VNNI (7-bit weights on every layer)"
    if not is_available("nncf"):
        int8 = "int8 needs nncf: pip install 'fastdiff[openvino]'"
    return f"usable on CPU ({', '.join(engine_flags()) or 'flags unknown'}): {bf16}, {int8}"


def _print_info(info: dict) -> None:
    width = max(len(k) for k in info)
    for key, value in info.items():
        if key == "backends":
            continue
        print(f"{key:<{width}}  {value}")
    print("\nbackends:")
    width = max(len(k) for k in info["backends"])
    for key, value in info["backends"].items():
        print(f"  {key:<{width}}  {value}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="fastdiff", description="fastdiff: faster Stable Diffusion inference"
    )
    from fastdiff import __version__

    parser.add_argument("--version", action="version", version=f"fastdiff {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    p_info = sub.add_parser("info", help="versions, device and usable backends")
    p_info.add_argument("--json", action="store_true", help="print JSON")
    sub.add_parser("demo", help="generate a comparison grid with the shipped tiny model", add_help=False)

    p_sweep = sub.add_parser(
        "sweep",
        help="run or resume a quality/speed sweep from a spec file",
        description="Run (or resume) the sweep described by SPEC (TOML, YAML or JSON; see fastdiff.sweep). "
        "Finished items in OUT are skipped. Several processes: torchrun --standalone --nproc_per_node N "
        "-m fastdiff.cli sweep SPEC (CPU or GPU), or accelerate launch --multi_gpu --num_processes N "
        "-m fastdiff.cli sweep SPEC.",
    )
    p_sweep.add_argument("spec", help="spec file (.toml, .yaml, .yml or .json)")
    p_sweep.add_argument("--out", help="output folder (default: sweep-out/<spec name>)")
    p_sweep.add_argument("--extend", action="store_true", help="add configurations/prompts/seeds to OUT")
    p_sweep.add_argument(
        "--check", action="store_true", help="validate the spec and print the plan; run nothing"
    )
    p_sweep.add_argument("--collate-only", action="store_true", help="re-write tables and plots from OUT")
    p_sweep.add_argument("--no-progress", action="store_true", help="no progress bars")

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["demo"]:  # the demo's own parser (fastdiff.demo.main) takes its options
        from fastdiff.demo import main as demo_main

        return demo_main(argv[1:]) or 0
    args = parser.parse_args(argv)
    if args.command == "info":
        info = collect_info()
        print(json.dumps(info, indent=2)) if args.json else _print_info(info)
    elif args.command == "sweep":
        return _sweep(parser, args)
    return 0


def writable_dir(path: str, option: str) -> str | None:
    """Create folder ``path`` and test-write a file in it; None if that worked, else why not (naming ``option``).

    Output folders are checked this way before any generation, so an unwritable ``--out`` fails in a second
    instead of after minutes of work."""
    import tempfile

    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".fastdiff-write-test-"):
            pass
    except OSError as err:
        reason = err.strerror or type(err).__name__
        return (
            f"{option} {path!r} is not a writable folder ({reason}); "
            "pass a folder you can create and write, e.g. --out ./fastdiff-out"
        )
    return None


def _sweep(parser: argparse.ArgumentParser, args) -> int:
    from pathlib import Path

    from fastdiff.sweep import SpecError, collate, parse_spec, sweep

    out = args.out or str(Path("sweep-out") / Path(args.spec).stem)

    def check_out() -> None:  # after the spec is known good (a bad spec creates no folder), before any run
        problem = writable_dir(out, "--out")
        if problem is not None:
            parser.error(problem)

    if args.collate_only:
        if not (Path(out) / "sweep.json").exists():
            parser.error(f"--collate-only: {out} holds no sweep (no sweep.json)")
        check_out()
        result = collate(out)
    else:
        try:  # a bad spec, or OUT holding a different sweep: a message, not a traceback
            spec = parse_spec(args.spec)
            if args.check:
                from fastdiff.sweep.store import chunks_of

                n = sum(len(ch) for c in spec.configs for ch in chunks_of(spec, c))
                print(
                    f"{args.spec}: valid; {len(spec.configs)} configurations x {len(spec.prompts)} prompts x "
                    f"{len(spec.seeds)} seeds = {n} items -> {out}"
                )
                return 0
            check_out()
            result = sweep(args.spec, out, extend=args.extend, progress=not args.no_progress)
        except SpecError as e:
            print(f"fastdiff sweep: error: {e}", file=sys.stderr)
            return 2
    if result is not None:  # the main process
        print((Path(out) / "summary.md").read_text())
        print(
            f"rows: {Path(out) / 'rows.csv'}  plot: {Path(out) / 'pareto.png'}  grid: {Path(out) / 'grid.png'}"
        )
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
