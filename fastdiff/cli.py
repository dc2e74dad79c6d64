"""The ``fastdiff`` command line.

* ``fastdiff info`` — versions, device and usable backends: what a bug report needs.
* ``fastdiff demo`` — generate a comparison grid with the shipped tiny model.
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
    backends["engine:tensorrt"] = (
        "usable"
        if is_available("tensorrt") and device == "cuda"
        else "unusable: needs CUDA and pip install 'fastdiff[tensorrt]'"
    )
    info["backends"] = backends
    return info


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
    sub = parser.add_subparsers(dest="command", required=True)
    p_info = sub.add_parser("info", help="versions, device and usable backends")
    p_info.add_argument("--json", action="store_true", help="print JSON")
    sub.add_parser("demo", help="generate a comparison grid with the shipped tiny model", add_help=False)

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["demo"]:
        from fastdiff.demo import main as demo_main

        return demo_main(argv[1:]) or 0
    args = parser.parse_args(argv)
    if args.command == "info":
        info = collect_info()
        print(json.dumps(info, indent=2)) if args.json else _print_info(info)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
