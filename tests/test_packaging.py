"""kernels/ ships as fastdiff.kernels, never as a top-level `kernels` (Hugging Face's package name)."""

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_installed_kernels_subpackage_points_at_repo():
    import fastdiff.kernels

    assert Path(fastdiff.kernels.__file__).resolve().parent == ROOT / "kernels"


@pytest.mark.slow
def test_built_wheel_contains_fastdiff_kernels_only(tmp_path):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(ROOT),
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("fastdiff-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "fastdiff/kernels/__init__.py" in names
    assert not any(n.startswith("kernels/") for n in names)
    # the wheel installs and imports fastdiff.kernels from site-packages
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
        check=True,
        capture_output=True,
    )
    out = subprocess.run(
        [sys.executable, "-c", "import fastdiff.kernels as k; print(k.__file__)"],
        env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"},
        cwd=tmp_path,
        check=True,
        capture_output=True,
        text=True,
    )
    assert str(target) in out.stdout


def test_cli_info_json(capsys):
    import json

    from fastdiff.cli import main

    assert main(["info", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    for key in ("torch", "diffusers", "triton", "xformers", "tensorrt", "onnxruntime", "device", "backends"):
        assert key in info
    assert info["backends"]["attention:auto"] == "usable"
