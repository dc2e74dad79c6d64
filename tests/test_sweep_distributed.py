"""fastdiff.sweep on fastdiff-tiny across processes (torchrun, gloo on CPU).

``accelerate launch --cpu --num_processes N`` starts one process unless accelerate is configured for
multi-CPU with MPI, so the CPU test launches with ``torchrun`` (what ``accelerate launch --multi_gpu``
runs underneath); the sweep code path is the same under either.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fastdiff.sweep import collate

pytestmark = pytest.mark.slow  # each test launches 2-3 multi-process runs of the real model (~20 s each)

TIMING = ("wall_s", "unet_s", "encode_s", "finished", "env", "peak_mem_mib", "peak_mem_kind")
SPEC = {
    "pipeline": "fastdiff-tiny",
    "reference": "dpm 6",
    "prompts": [
        "a red circle on a blue background",
        "a yellow square on a striped green background",
        "a white triangle on a checkered purple background",
    ],
    "seeds": [0, 1],
    "guidance": 5.0,
    "batch_size": 2,
    "metrics": ["psnr", "ssim", "attributes", "nfe", "unet_s", "wall_s", "peak_mem"],
    "configs": [
        {"name": "dpm 6", "sampler": "dpmpp_2m", "steps": 6},
        {"name": "early stop", "sampler": "unipc", "steps": 6, "early_stop": {"rtol": 0.05, "min_steps": 3}},
    ],
}


def _env():
    env = dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="PASSIVE", PYTHONUNBUFFERED="1")
    env.pop("WORLD_SIZE", None)
    return env


def _launch(spec_path, out, procs: int):
    if procs == 1:
        cmd = [sys.executable, "-m", "fastdiff.cli", "sweep", str(spec_path)]
    else:
        torchrun = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={procs}",
            # torchrun's agent logs go to a mkdtemp folder in /tmp that it never removes, unless told where
            f"--log-dir={Path(out).parent / 'torchrun-logs'}",
        ]
        cmd = [*torchrun, "-m", "fastdiff.cli", "sweep", str(spec_path)]
    return subprocess.Popen(
        [*cmd, "--out", str(out), "--no-progress"],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _run(spec_path, out, procs):
    p = _launch(spec_path, out, procs)
    text, _ = p.communicate(timeout=300)
    assert p.returncode == 0, text[-3000:]
    return text


def _comparable(folder):
    rows = collate(folder, plots=False).rows
    out = {}
    for r in rows:
        out[r["id"]] = {k: v for k, v in r.items() if k not in TIMING}
        out[r["id"]]["png"] = (Path(folder) / r["image"]).read_bytes()
    return out


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep1")
    spec = root / "spec.json"
    spec.write_text(json.dumps(SPEC))
    _run(spec, root / "out", 1)
    return spec, root / "out"


def test_two_processes_give_the_rows_of_one_bit_for_bit(one_process, tmp_path):
    spec, single = one_process
    _run(spec, tmp_path / "out", 2)
    a, b = _comparable(single), _comparable(tmp_path / "out")
    assert len(a) == 2 * 3 * 2
    assert a == b  # same ids, parameters, metrics (floats exactly) and PNG bytes
    stats = [json.loads(p.read_text()) for p in sorted((tmp_path / "out" / "log").glob("stats-*.json"))]
    assert [s["num_processes"] for s in stats] == [2, 2]
    assert all(s["items_written"] > 0 for s in stats)  # the work really was shared
    assert sum(s["items_written"] for s in stats) == 12
    # the embedding cache: at most every prompt plus the empty negative once per process
    assert sum(s["text_encoder_calls"] for s in stats) <= (3 + 1) * 2
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())["summary"]
    assert {s["config"] for s in summary} == {"dpm 6", "early stop"}


def test_worker_killed_mid_sweep_then_rerun_completes_every_item_once(one_process, tmp_path):
    spec, single = one_process
    out = tmp_path / "out"
    p = _launch(spec, out, 2)
    deadline = time.time() + 240
    while time.time() < deadline and p.poll() is None:
        if (out / "items").exists() and any((out / "items").rglob("*.json")):
            break
        time.sleep(0.05)
    assert p.poll() is None, "the sweep finished before the test could kill a worker"
    logs = sorted((out / "log").glob("events-1-*.jsonl")) or sorted((out / "log").glob("events-0-*.jsonl"))
    worker = int(logs[0].stem.split("-")[-1])
    os.kill(worker, signal.SIGKILL)
    p.communicate(timeout=120)
    assert p.returncode != 0
    done = sum(1 for _ in (out / "items").rglob("*.json"))
    assert 0 < done < 12
    _run(spec, out, 1)  # resume on one process
    ids = [
        json.loads(line)["id"]
        for f in (out / "log").glob("events-*.jsonl")
        for line in f.read_text().splitlines()
    ]
    assert len(ids) == len(set(ids)) == 12  # every item written exactly once over both runs
    assert _comparable(out) == _comparable(single)
