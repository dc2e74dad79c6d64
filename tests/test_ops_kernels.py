"""Functional API: fastdiff.ops.conv3x3 / group_norm_silu / group_norm_silu_conv3x3 backends and errors."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from fastdiff.kernels import dispatch  # noqa: E402

from fastdiff._compat import triton_usable  # noqa: E402
from fastdiff.ops.conv import conv3x3  # noqa: E402
from fastdiff.ops.norm import group_norm_silu, group_norm_silu_conv3x3  # noqa: E402

needs_triton = pytest.mark.skipif(not triton_usable("cpu"), reason="needs TRITON_INTERPRET=1 on CPU")


def rel_err(out, ref):
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


@pytest.fixture
def data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 8, 7, 6, generator=g)
    w = torch.randn(12, 8, 3, 3, generator=g) / 8
    b = torch.randn(12, generator=g)
    gamma, beta = torch.randn(8, generator=g), torch.randn(8, generator=g)
    return x, w, b, gamma, beta


@pytest.mark.parametrize(
    "backend", ["torch", "winograd_torch", "auto", pytest.param("triton", marks=needs_triton)]
)
def test_conv3x3_backends_match_conv2d(data, backend, tmp_path):
    x, w, b, *_ = data
    ref = F.conv2d(x.double(), w.double(), b.double(), padding=1)
    out = conv3x3(x, w, b, backend=backend, plan_cache_dir=tmp_path)
    assert out.shape == ref.shape and rel_err(out, ref) <= 1e-5


def test_conv3x3_auto_times_each_shape_once(data, tmp_path):
    x, w, b, *_ = data
    before = dispatch.stats["timed"]
    conv3x3(x, w, b, plan_cache_dir=tmp_path)
    timed = dispatch.stats["timed"] - before
    assert timed >= 1  # native vs CPU Winograd measured
    conv3x3(x, w, b, plan_cache_dir=tmp_path)
    assert dispatch.stats["timed"] - before == timed  # decision reused
    conv3x3(x[:, :, :5], w, b, plan_cache_dir=tmp_path)  # a new resolution adds an entry
    assert dispatch.stats["timed"] - before > timed


@pytest.mark.parametrize("backend", ["torch", "auto", pytest.param("triton", marks=needs_triton)])
def test_group_norm_silu_backends(data, backend):
    x, _, _, gamma, beta = data
    ref = F.silu(F.group_norm(x.double(), 4, gamma.double(), beta.double()))
    assert rel_err(group_norm_silu(x, 4, gamma, beta, backend=backend), ref) <= 1e-5


@pytest.mark.parametrize("backend", ["torch", "auto", pytest.param("triton", marks=needs_triton)])
def test_group_norm_silu_conv3x3_backends(data, backend):
    x, w, b, gamma, beta = data
    d = lambda t: t.double()
    ref = F.conv2d(F.silu(F.group_norm(d(x), 4, d(gamma), d(beta))), d(w), d(b), padding=1)
    out = group_norm_silu_conv3x3(x, 4, gamma, beta, 1e-5, w, b, backend=backend)
    assert rel_err(out, ref) <= 1e-5


def test_bad_inputs_name_the_problem(data):
    x, w, b, gamma, beta = data
    with pytest.raises(ValueError, match="backend must be one of"):
        conv3x3(x, w, b, backend="cudnn")
    with pytest.raises(ValueError, match=r"\(K, C, 3, 3\)"):
        conv3x3(x, torch.randn(12, 8, 5, 5), b)
    with pytest.raises(ValueError, match="channels"):
        conv3x3(x[:, :6], w, b)
    with pytest.raises(ValueError, match="bias"):
        conv3x3(x, w, b[:5])
    with pytest.raises(TypeError, match="dtype"):
        conv3x3(x.half(), w, b)
    with pytest.raises(TypeError, match="dtype"):
        conv3x3(x.int(), w.int(), None)
    with pytest.raises(TypeError, match="torch.Tensor"):
        conv3x3(x.numpy(), w, b)
    with pytest.raises(ValueError, match="4-D"):
        conv3x3(x[0], w, b)
    with pytest.raises(ValueError, match="divisible"):
        group_norm_silu(x, 3, gamma, beta)
    with pytest.raises(ValueError, match="backend"):
        group_norm_silu(x, 4, gamma, beta, backend="winograd_torch")
    with pytest.raises(ValueError, match="weight"):
        group_norm_silu_conv3x3(x, 4, gamma, beta, 1e-5, w[:, :3], b)


def test_triton_backend_on_cpu_without_interpreter_explains(data, monkeypatch):
    x, w, b, gamma, beta = data
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        conv3x3(x, w, b, backend="triton")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        group_norm_silu(x, 4, gamma, beta, backend="triton")
    # auto never needs Triton on a CPU
    assert rel_err(group_norm_silu(x, 4, gamma, beta), F.silu(F.group_norm(x, 4, gamma, beta))) < 1e-6
