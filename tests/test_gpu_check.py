"""benchmarks/gpu_check.sh: its CPU dry run exercises every stage (so a typo cannot waste a GPU run), and the
kernel modules it loads import nothing that the bare GPU image lacks (diffusers, transformers)."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STAGES = ("env", "correct", "conv", "groupnorm", "fused", "attention", "unet", "sdxl")


def test_dry_run_passes_every_stage(tmp_path):
    """About a minute on two cores (two torch.compile traces of a tiny U-Net): the price of never wasting
    a GPU run on a typo."""
    # the script runs `python`: make it this interpreter even when the venv is not activated
    path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    env = {**os.environ, "OUT": str(tmp_path), "PATH": path}
    env.pop("TRITON_INTERPRET", None)  # the script sets what it needs
    proc = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "--dry-run"],
        capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    rows = [json.loads(line) for line in (tmp_path / "gpu_check_dry_run.jsonl").read_text().splitlines()]
    failed = [r for r in rows if r.get("ok") is False or "skipped" in r]
    assert not failed, failed
    assert [r["stage_done"] for r in rows if "stage_done" in r] == list(STAGES)
    for stage in STAGES:  # every stage produced at least one result row
        assert any(r["stage"] == stage and "stage_done" not in r for r in rows), stage
    unet = {r["variant"]: r for r in rows if r["stage"] == "unet" and "variant" in r}
    assert set(unet) == {"eager", "optimize", "compile", "optimize+compile"}
    assert all(r["rel_err_vs_eager"] < 1e-4 for r in unet.values())
    assert rows[-1]["failures"] == 0 and proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]


def test_gpu_check_imports_only_the_stdlib_at_module_level():
    """torch, Triton, fastdiff and diffusers load inside the stages that need them, so a missing package
    costs its stage, never the whole GPU run."""
    import ast

    allowed = set(sys.stdlib_module_names) | {"_standalone_kernels", "__future__"}
    for script in ("gpu_check.py", "_standalone_kernels.py"):
        tree = ast.parse((ROOT / "benchmarks" / script).read_text())
        for node in tree.body:
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
                assert {n.split(".")[0] for n in names} <= allowed, (script, names)


def _modules_after(code: str) -> set[str]:
    script = textwrap.dedent(code) + "\nimport sys, json\nprint(json.dumps(sorted(sys.modules)))\n"
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return {m.split(".")[0] for m in json.loads(proc.stdout.splitlines()[-1])}


def test_standalone_kernels_import_no_diffusers_or_transformers():
    """What gpu_check.py and ptx_report.py do: load fastdiff/kernels/ by path, then run nothing else of fastdiff."""
    mods = _modules_after(
        """
        import importlib, sys, types
        pkg = types.ModuleType("k"); pkg.__path__ = ["fastdiff/kernels"]; sys.modules["k"] = pkg
        for m in ("winograd", "group_norm_silu", "fused_norm_conv"):
            importlib.import_module("k." + m)
        """
    )
    assert "triton" in mods and not mods & {"diffusers", "transformers", "fastdiff"}


def test_fastdiff_kernels_and_ops_import_no_diffusers_or_transformers():
    mods = _modules_after(
        """
        import fastdiff.kernels.winograd, fastdiff.kernels.group_norm_silu, fastdiff.kernels.fused_norm_conv
        import fastdiff.ops.dispatch, fastdiff.ops.conv, fastdiff.ops.norm
        """
    )
    assert not mods & {"diffusers", "transformers"}
