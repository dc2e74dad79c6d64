"""benchmarks/ptx_report.py keeps working: a small subset of kernels compiled for sm_90a, without spills.

Runs in a subprocess because the report turns the Triton interpreter off for its own process. Skips (with
the script's reason) only where this Triton build cannot compile for CUDA at all.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "ptx_report.py"


def test_subset_compiles_for_hopper_without_spills(tmp_path):
    kernels = "winograd_input,winograd_gemm,winograd_output,gn_silu_one_pass"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--only", kernels, "--match", "float16", "--limit", "1"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    # its fresh Triton cache (every compiled binary) is removed at exit, not left in the temp folder
    assert not list(tmp_path.glob("fastdiff-ptx-report-*")), proc.stderr
    if proc.returncode == 2 and "cannot compile for sm_90a" in proc.stdout:
        pytest.skip(proc.stdout.strip())
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert sorted(r["kernel"] for r in rows) == sorted(kernels.split(",")), proc.stdout + proc.stderr
    for r in rows:
        assert "error" not in r, r
        assert r["registers"] and r["registers"] <= 255
        assert r["spill_stores"] == r["spill_loads"] == 0, r
    gemm = next(r for r in rows if r["kernel"] == "winograd_gemm")
    assert gemm["wgmma"], "the fp16 GEMM should use Hopper's wgmma"
    assert proc.returncode == 0
