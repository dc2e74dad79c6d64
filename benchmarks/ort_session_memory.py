"""What an ONNX Runtime calibration session costs in memory when the caller holds the weights (#14).

``compile_engine`` calibrates with the caller's PyTorch U-Net in the process. This measures one
calibration-style session (no graph optimisation, no memory arena) over a full-width SD1.5 export at
512^2, one batch-2 run, with the weights also held as numpy arrays in the process (standing in for
the PyTorch U-Net), in four ways of giving ORT the weights:

- ``file``: ORT maps the weights from the export's data file (fastdiff before this change);
- ``add_external_initializers``: the held arrays replace the file's tensors through that API;
- ``add_initializer``: the held arrays through ``SessionOptions.add_initializer``;
- ``add_initializer, no pre-packing``: the same with ``session.disable_prepacking`` (fastdiff now).

Each mode runs in a fresh child process; RSS is split into anonymous and file-mapped pages.

    flock /tmp/fastdiff-heavy.lock .venv/bin/python benchmarks/ort_session_memory.py \\
        --onnx /tmp/fastdiff-bench-engines-memory/unet-512.onnx
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import env_info, load_average, rss_split_gb, write_results  # noqa: E402

MODES = ("file", "add_external_initializers", "add_initializer", "add_initializer, no pre-packing")


def child(onnx_path: str, mode: str, side: int) -> dict:
    """One session in this process; returns the memory and time figures as a dict."""
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx.external_data_helper import ExternalDataInfo, uses_external_data

    base = Path(onnx_path).parent
    model = onnx.load(onnx_path, load_external_data=False)
    held_arrays = {}  # the weights the caller holds (the PyTorch U-Net's, unprefixed by the export)
    for init in model.graph.initializer:
        if (
            uses_external_data(init)
            and init.name.startswith("unet.")
            and init.data_type == onnx.TensorProto.FLOAT
        ):
            info = ExternalDataInfo(init)
            held_arrays[init.name] = np.fromfile(
                base / info.location, dtype=np.float32, count=info.length // 4, offset=info.offset or 0
            ).reshape(tuple(init.dims))
    row = {"mode": mode, "held_gb": round(sum(a.nbytes for a in held_arrays.values()) / 2**30, 2)}
    before = rss_split_gb()
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.enable_cpu_mem_arena = False
    values = [ort.OrtValue.ortvalue_from_numpy(a) for a in held_arrays.values()]
    if mode == "add_external_initializers":
        options.add_external_initializers(list(held_arrays), values)
    elif mode.startswith("add_initializer"):
        for name, value in zip(held_arrays, values):
            options.add_initializer(name, value)
    if mode.endswith("no pre-packing"):
        options.add_session_config_entry("session.disable_prepacking", "1")
    t = time.perf_counter()
    session = ort.InferenceSession(onnx_path, options, providers=["CPUExecutionProvider"])
    row["session_s"] = round(time.perf_counter() - t, 1)
    created = rss_split_gb()
    latent = side // 8
    shapes = {"sample": (2, 4, latent, latent), "encoder_hidden_states": (2, 77, 768), "timestep": (2,)}
    rng = np.random.default_rng(0)
    feed = {i.name: rng.standard_normal(shapes[i.name]).astype(np.float32) for i in session.get_inputs()}
    peak, stop = [0.0], threading.Event()

    def watch():
        while not stop.wait(0.05):
            peak[0] = max(peak[0], rss_split_gb()["VmRSS"])

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    t = time.perf_counter()
    session.run(None, feed)
    row["run_s"] = round(time.perf_counter() - t, 1)
    stop.set()
    watcher.join()
    after = rss_split_gb()
    row.update(
        {
            "rss_before_session_gb": round(before["VmRSS"], 2),
            "session_added_gb": round(created["VmRSS"] - before["VmRSS"], 2),
            "peak_during_run_gb": round(max(peak[0], after["VmRSS"]), 2),
            "after_run_anon_gb": round(after["RssAnon"], 2),
            "after_run_file_gb": round(after["RssFile"], 2),
        }
    )
    return row


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--onnx", required=True, help="an fp32 export_onnx file of the U-Net with external data")
    p.add_argument("--side", type=int, default=512, help="image side in px")
    p.add_argument("--name", default="ort-session-memory")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.onnx, args.child, args.side)))
        return
    load_before = load_average()
    rows = []
    for mode in MODES:
        out = subprocess.run(
            [sys.executable, __file__, "--onnx", args.onnx, "--side", str(args.side), "--child", mode],
            capture_output=True,
            text=True,
            check=True,
        )
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(rows[-1], flush=True)
    meta = {**env_info(), "onnx": args.onnx, "side_px": args.side, "load_before": load_before}
    meta["load_after"] = load_average()
    notes = (
        f"- One ORT session as fastdiff's calibration makes them (no graph optimisation, no memory arena) over "
        f"{Path(args.onnx).name} at {args.side}^2, one batch-2 run, each mode in a fresh process holding the "
        "export's fp32 `unet.*` tensors as numpy arrays (standing in for the caller's PyTorch U-Net; held_gb). "
        "session_added_gb: RSS added by creating the session; peak_during_run_gb: the process peak during the "
        "run (sampled every 50 ms); after_run_*: anonymous and file-mapped RSS after it.\n"
        f"- Load average before {load_before}, after {meta['load_after']}."
    )
    for path in write_results(args.name, rows, meta, notes=notes):
        print("wrote", path)


if __name__ == "__main__":
    main()
