"""fastdiff._compat: install hints name real packages or real extras (there is no 'fastdiff[triton]')."""

import pytest

from fastdiff import _compat
from fastdiff.kernels import _device


def test_missing_module_without_an_extra_suggests_the_package_itself():
    with pytest.raises(_compat.MissingDependencyError, match=r"pip install surely_not_a_module_fd") as err:
        _compat.require("surely_not_a_module_fd", "a feature")
    assert "fastdiff[" not in str(err.value)


def test_missing_module_with_an_extra_suggests_the_extra(monkeypatch):
    monkeypatch.setattr(_compat, "is_available", lambda module: False)
    with pytest.raises(_compat.MissingDependencyError, match=r"fastdiff\[tensorrt\]"):
        _compat.require("tensorrt", "the TensorRT engine")


def test_missing_triton_hint_is_installable(monkeypatch):
    monkeypatch.setattr(_device, "triton_installed", lambda: False)
    reason = _compat.triton_unusable_reason("cuda")
    assert "pip install triton" in reason and "fastdiff[" not in reason


def test_cpuinfo_field_matches_the_whole_key(monkeypatch):
    """/proc/cpuinfo has both "model" and "model name" (in either order here): each asks for its own line,
    not the first that starts with the same letters (benchmarks record the CPU family and model: one marketing name,
    "AMD EPYC", has named two generations of the machines here)."""
    import io

    from fastdiff import _compat

    text = "processor\t: 0\nmodel name\t: AMD EPYC\ncpu family\t: 26\nmodel\t\t: 2\nflags\t\t: fpu avx2\n"
    monkeypatch.setattr(_compat, "open", lambda *a, **k: io.StringIO(text), raising=False)
    assert _compat.cpuinfo_field("model") == "2"
    assert _compat.cpuinfo_field("model name") == "AMD EPYC"
    assert _compat.cpuinfo_field("cpu family") == "26"
    assert _compat.cpuinfo_field("flags") == "fpu avx2"
    assert _compat.cpuinfo_field("bogomips") is None
