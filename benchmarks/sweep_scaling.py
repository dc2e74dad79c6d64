"""Scaling of ``fastdiff sweep`` across processes, and what the prompt-embedding cache saves.

The same spec (fastdiff-tiny, two configurations, held-out prompts) runs on 1 process and on 2 processes
(``torchrun --standalone --nproc_per_node 2``; gloo on CPU), one torch thread each, into fresh folders.
Items per second are measured over the sweep phase (first process's start of work to the last process's
end, model loading included, interpreter start-up excluded) and end to end (the launch command's wall
time). The cache is measured on one process: text-encoder calls and encode seconds with and without it.

    flock /tmp/fastdiff-heavy.lock python benchmarks/sweep_scaling.py [--prompts 48]

Writes ``benchmarks/results/sweep_scaling.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from _common import env_info, write_results  # noqa: E402

GOAL = 1.8


def spec(n_prompts: int, cache: bool = True) -> dict:
    return {
        "pipeline": "fastdiff-tiny",
        "reference": "dpm 12",
        "prompts": {"tiny": "heldout", "limit": n_prompts},
        "seeds": [0],
        "guidance": 5.0,
        "batch_size": 4,
        "metrics": ["psnr", "attributes", "nfe", "wall_s"],
        "configs": [
            {"name": "dpm 12", "sampler": "dpmpp_2m", "steps": 12},
            {"name": "unipc 6", "sampler": "unipc", "steps": 6},
        ],
        "embedding_cache": cache,
    }


def launch(spec_path: Path, out: Path, procs: int) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE")
    if procs == 1:
        cmd = [sys.executable, "-m", "fastdiff.cli", "sweep"]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={procs}"]
        cmd += ["-m", "fastdiff.cli", "sweep"]
    t0 = time.perf_counter()
    subprocess.run(
        [*cmd, str(spec_path), "--out", str(out), "--no-progress"],
        env=env,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    wall = time.perf_counter() - t0
    stats = [json.loads(p.read_text()) for p in sorted((out / "log").glob("stats-*.json"))]
    items = sum(s["items_written"] for s in stats)
    span = max(s["work_end_unix"] for s in stats) - min(s["work_start_unix"] for s in stats)
    return {
        "processes": procs,
        "items": items,
        "sweep_s": round(span, 2),
        "items_per_s": items / span,
        "end_to_end_s": round(wall, 2),
        "items_per_s_end_to_end": items / wall,
        "text_encoder_calls": sum(s["text_encoder_calls"] for s in stats),
        "encode_s": round(sum(s["encode_s"] for s in stats), 3),
        "load_s": round(max(s["load_s"] for s in stats), 2),
    }


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=48)
    args = ap.parse_args(argv)
    load_before = os.getloadavg()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for name, cache in (("on", True), ("off", False)):
            (tmp / f"spec-{name}.json").write_text(json.dumps(spec(args.prompts, cache)))
        one = launch(tmp / "spec-on.json", tmp / "one", 1)
        two = launch(tmp / "spec-on.json", tmp / "two", 2)
        off = launch(tmp / "spec-off.json", tmp / "off", 1)
        same = _same_images(tmp / "one", tmp / "two")
    load_after = os.getloadavg()
    speedup = two["items_per_s"] / one["items_per_s"]
    e2e = two["items_per_s_end_to_end"] / one["items_per_s_end_to_end"]
    for r, label in (
        (one, "1 process, cache on"),
        (two, "2 processes, cache on"),
        (off, "1 process, cache off"),
    ):
        rows.append({"run": label, **{k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()}})
    meta = env_info()
    meta["loadavg_before"] = [round(x, 2) for x in load_before]
    meta["loadavg_after"] = [round(x, 2) for x in load_after]
    verdict = "met" if speedup >= GOAL else "not met"
    saved = off["encode_s"] - one["encode_s"]
    notes = (
        f"Spec: fastdiff-tiny, {args.prompts} held-out prompts x 1 seed x 2 configurations (DPM-Solver++ 12 steps "
        "as reference, UniPC 6 steps), guidance 5, batches of 4, metrics psnr/attributes/nfe; one torch thread "
        "per process (OMP_NUM_THREADS=1); 2 processes by torchrun (gloo). "
        f"**Scaling, sweep phase: {speedup:.2f}x items/s with 2 processes vs 1 (goal >= {GOAL}x: {verdict}).** "
        f"End to end including interpreter start-up: {e2e:.2f}x. Images of the 2-process run identical to the "
        f"1-process run: {same}. Load average before {meta['loadavg_before']}, after {meta['loadavg_after']} "
        "(a shared 2-core machine; run under the heavy-job lock). "
        f"Prompt-embedding cache: {one['text_encoder_calls']} text-encoder calls with it vs "
        f"{off['text_encoder_calls']} without ({args.prompts} prompts + 1 negative; without the cache every batch "
        f"encodes its prompts and the negative again), {saved:.2f} s of encoding saved on one process "
        f"({one['encode_s']} s vs {off['encode_s']} s)."
    )
    write_results("sweep_scaling", rows, meta, list(rows[0]), notes)
    print(notes)


def _same_images(a: Path, b: Path) -> bool:
    pa = sorted(p.relative_to(a) for p in (a / "items").rglob("*.png"))
    pb = sorted(p.relative_to(b) for p in (b / "items").rglob("*.png"))
    return pa == pb and all((a / p).read_bytes() == (b / p).read_bytes() for p in pa)


if __name__ == "__main__":
    main()
