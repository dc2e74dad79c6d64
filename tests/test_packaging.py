"""The kernels ship as fastdiff.kernels, never as a top-level `kernels` (Hugging Face's package name), and
nothing in the source tree shadows a dependency when Python runs from the repo root or from benchmarks/."""

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_installed_kernels_subpackage_points_at_repo():
    import fastdiff.kernels

    assert Path(fastdiff.kernels.__file__).resolve().parent == ROOT / "fastdiff" / "kernels"


def _importable_names(folder: Path) -> set[str]:
    """What `import NAME` finds in ``folder`` when it is on sys.path (a script's dir, or the root under -m)."""
    names = {p.stem for p in folder.glob("*.py")}
    return names | {p.name for p in folder.iterdir() if p.is_dir() and any(p.glob("*.py"))}


def test_no_module_in_the_tree_shadows_a_dependency():
    from importlib.metadata import packages_distributions

    # installed top-level modules, plus Hugging Face's `kernels`, which transformers >= 5.25 imports
    # (not necessarily installed here)
    taken = (set(packages_distributions()) | {"kernels"}) - {"fastdiff"}
    for folder in (ROOT, ROOT / "benchmarks"):
        clash = _importable_names(folder) & taken
        assert not clash, f"{sorted(clash)} in {folder} would shadow installed packages of that name"


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


def test_cli_version(capsys):
    import fastdiff
    from fastdiff.cli import main

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"fastdiff {fastdiff.__version__}"


def test_cli_info_json(capsys):
    import json

    from fastdiff.cli import main

    assert main(["info", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    for key in ("torch", "diffusers", "triton", "xformers", "tensorrt", "onnxruntime", "device", "backends"):
        assert key in info
    assert info["backends"]["attention:auto"] == "usable"


def test_cli_info_reports_openvino_and_what_this_cpu_runs_natively(monkeypatch):
    """OpenVINO is a backend like the others: its version, and bf16/int8 as this CPU runs them."""
    import fastdiff.engines.cpu as cpu
    import fastdiff.engines.runtime_ov as rov
    from fastdiff.cli import collect_info

    pytest.importorskip("openvino")
    info = collect_info()
    assert info["openvino"] != "not installed" and "nncf" in info
    monkeypatch.setattr(rov, "openvino_has_bf16", lambda: False)
    monkeypatch.setattr(cpu, "cpu_flags", lambda: frozenset({"avx2", "fma"}))
    status = collect_info()["backends"]["engine:openvino"]
    assert status.startswith("usable on CPU (avx2, fma)") and "bf16 not native" in status
    assert "int8 without VNNI" in status
    monkeypatch.setattr(rov, "openvino_has_bf16", lambda: True)
    monkeypatch.setattr(cpu, "cpu_flags", lambda: frozenset({"avx512f", "avx512_vnni", "avx512_bf16"}))
    status = collect_info()["backends"]["engine:openvino"]
    assert "bf16 native" in status and "int8 with VNNI" in status
