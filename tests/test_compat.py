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
