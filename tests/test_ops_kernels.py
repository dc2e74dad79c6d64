"""Functional API and the dispatch layer: fastdiff.ops.conv3x3 / group_norm_silu / group_norm_silu_conv3x3,
and fastdiff.ops.dispatch (plans, timing, eligibility). Errors name the problem.

"auto" is driven through the Triton path here (the interpreter on CPU, compiled kernels on CUDA) with a fake
timer that makes the alternative win, so an auto test compares a kernel, not PyTorch with PyTorch.
"""

import pytest
import torch
import torch.nn.functional as F

from fastdiff._compat import triton_usable
from fastdiff.ops import conv as ops_conv
from fastdiff.ops import dispatch
from fastdiff.ops import norm as ops_norm
from fastdiff.ops.conv import conv3x3
from fastdiff.ops.norm import group_norm_silu, group_norm_silu_conv3x3

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_triton = pytest.mark.skipif(not triton_usable(DEVICE), reason="needs CUDA or TRITON_INTERPRET=1")


def rel_err(out, ref):
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


@pytest.fixture
def data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 8, 7, 6, generator=g)
    w = torch.randn(12, 8, 3, 3, generator=g) / 8
    b = torch.randn(12, generator=g)
    gamma, beta = torch.randn(8, generator=g), torch.randn(8, generator=g)
    return tuple(t.to(DEVICE) for t in (x, w, b, gamma, beta))


@pytest.fixture
def triton_auto(monkeypatch):
    """Let "auto" consider the Triton implementations here and make them win the timing."""
    monkeypatch.setattr(ops_conv, "conv3x3_candidates", lambda device: ["winograd_triton"])
    monkeypatch.setattr(ops_norm, "triton_native", lambda device: True)
    monkeypatch.setattr(dispatch, "measure", _alt_wins)


def _alt_wins(fns, device):
    """measure() stand-in: every alternative takes half native's time."""
    dispatch.stats["timed"] += 1
    return {name: (1.0 if name == dispatch.NATIVE else 0.5) for name in fns}


@pytest.mark.parametrize(
    "backend",
    ["native", "winograd_torch", pytest.param("winograd_triton", marks=needs_triton)],
)
def test_conv3x3_backends_match_float64(data, backend, tmp_path):
    x, w, b, *_ = data
    ref = F.conv2d(x.double(), w.double(), b.double(), padding=1)
    out = conv3x3(x, w, b, backend=backend, plan_cache_dir=tmp_path)
    assert out.shape == ref.shape and rel_err(out, ref) <= 1e-5


def spy(monkeypatch, module, name):
    """Count calls of ``module.name`` (still calling it)."""
    calls, real = [], getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


@needs_triton
def test_conv3x3_auto_runs_the_winning_kernel(data, tmp_path, triton_auto, monkeypatch):
    x, w, b, *_ = data
    plans = {}
    conv3x3(x, w, b, plan_cache_dir=tmp_path, plans=plans)  # measures
    rec = next(iter(plans.values()))
    assert rec["choice"] == "winograd_triton" and rec["verify"]["passed"]
    calls = spy(monkeypatch, ops_conv, "winograd_conv2d_triton")
    out = conv3x3(x, w, b, plan_cache_dir=tmp_path, plans=plans)  # the planned call runs the kernel
    assert len(calls) == 1
    assert rel_err(out, F.conv2d(x.double(), w.double(), b.double(), padding=1)) <= 1e-5


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


@pytest.mark.parametrize("backend", ["native", pytest.param("gn_triton", marks=needs_triton)])
def test_group_norm_silu_backends(data, backend):
    x, _, _, gamma, beta = data
    ref = F.silu(F.group_norm(x.double(), 4, gamma.double(), beta.double()))
    assert rel_err(group_norm_silu(x, 4, gamma, beta, backend=backend), ref) <= 1e-5


@needs_triton
def test_group_norm_silu_auto_runs_the_winning_kernel(data, tmp_path, triton_auto, monkeypatch):
    x, _, _, gamma, beta = data
    plans = {}
    group_norm_silu(x, 4, gamma, beta, plan_cache_dir=tmp_path, plans=plans)
    assert next(iter(plans.values()))["choice"] == "gn_triton"
    calls = spy(monkeypatch, ops_norm, "group_norm_silu_triton")
    out = group_norm_silu(x, 4, gamma, beta, plan_cache_dir=tmp_path, plans=plans)
    assert len(calls) == 1
    assert rel_err(out, F.silu(F.group_norm(x.double(), 4, gamma.double(), beta.double()))) <= 1e-5


@pytest.mark.parametrize(
    "backend",
    [
        "native",
        pytest.param("gn_triton+native_conv", marks=needs_triton),
        pytest.param("fused_triton", marks=needs_triton),
    ],
)
@pytest.mark.parametrize("scale_shift", [False, True], ids=["plain", "scale_shift"])
def test_group_norm_silu_conv3x3_backends(data, backend, scale_shift):
    x, w, b, gamma, beta = data
    es = et = None
    if scale_shift:
        es, et = torch.randn(2, 8, device=DEVICE), torch.randn(2, 8, device=DEVICE)
    d = lambda t: None if t is None else t.double()
    y = F.group_norm(d(x), 4, d(gamma), d(beta))
    if scale_shift:
        y = y * (1 + d(es)[:, :, None, None]) + d(et)[:, :, None, None]
    ref = F.conv2d(F.silu(y), d(w), d(b), padding=1)
    out = group_norm_silu_conv3x3(
        x, 4, gamma, beta, 1e-5, w, b, extra_scale=es, extra_shift=et, backend=backend
    )
    assert rel_err(out, ref) <= 1e-5


@needs_triton
def test_trainable_group_norm_weight_keeps_its_gradient(data):
    """Only the GroupNorm weight needs a gradient (x does not): every Triton backend must fall back to native,
    or the weight's gradient is silently lost."""
    x, w, b, gamma, beta = data
    gamma = gamma.clone().requires_grad_(True)
    ref_grad = torch.autograd.grad(F.silu(F.group_norm(x, 4, gamma, beta)).square().sum(), gamma)[0]
    out = group_norm_silu(x, 4, gamma, beta, backend="gn_triton")
    assert out.requires_grad
    assert torch.allclose(torch.autograd.grad(out.square().sum(), gamma)[0], ref_grad, rtol=1e-5, atol=1e-6)
    for backend in ("gn_triton+native_conv", "fused_triton"):
        out = group_norm_silu_conv3x3(x, 4, gamma, beta, 1e-5, w, b, backend=backend)
        assert out.requires_grad, backend
    wt = w.clone().requires_grad_(True)  # a trainable conv weight likewise
    assert conv3x3(x, wt, b, backend="winograd_triton").requires_grad


def test_bad_inputs_name_the_problem(data):
    x, w, b, gamma, beta = data
    with pytest.raises(ValueError, match="backend must be one of"):
        conv3x3(x, w, b, backend="cudnn")
    with pytest.raises(ValueError, match=r"\(K, C, 3, 3\)"):
        conv3x3(x, torch.randn(12, 8, 5, 5, device=DEVICE), b)
    with pytest.raises(ValueError, match="channels"):
        conv3x3(x[:, :6], w, b)
    with pytest.raises(ValueError, match="bias"):
        conv3x3(x, w, b[:5])
    with pytest.raises(TypeError, match="dtype"):
        conv3x3(x.half(), w, b)
    with pytest.raises(TypeError, match="dtype"):
        conv3x3(x.int(), w.int(), None)
    with pytest.raises(TypeError, match="torch.Tensor"):
        conv3x3(x.cpu().numpy(), w, b)
    with pytest.raises(ValueError, match="4-D"):
        conv3x3(x[0], w, b)
    with pytest.raises(ValueError, match="divisible"):
        group_norm_silu(x, 3, gamma, beta)
    with pytest.raises(ValueError, match="backend"):
        group_norm_silu(x, 4, gamma, beta, backend="winograd_torch")
    with pytest.raises(ValueError, match="weight"):
        group_norm_silu_conv3x3(x, 4, gamma, beta, 1e-5, w[:, :3], b)
    with pytest.raises(ValueError, match="together"):
        group_norm_silu_conv3x3(x, 4, gamma, beta, 1e-5, w, b, extra_scale=torch.ones(2, 8, device=DEVICE))


@pytest.mark.skipif(DEVICE != "cpu", reason="CPU-only behaviour")
def test_triton_backend_on_cpu_without_interpreter_explains(data, monkeypatch):
    x, w, b, gamma, beta = data
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        conv3x3(x, w, b, backend="winograd_triton")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        group_norm_silu(x, 4, gamma, beta, backend="gn_triton")
    # auto never needs Triton on a CPU
    assert rel_err(group_norm_silu(x, 4, gamma, beta), F.silu(F.group_norm(x, 4, gamma, beta))) < 1e-6
