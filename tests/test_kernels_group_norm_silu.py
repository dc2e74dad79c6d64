"""GroupNorm+SiLU and fused GroupNorm+SiLU+Winograd conv kernels against float64 references.

Half precision: the kernels compute in fp32 and round once on output, so their error is compared with
the native PyTorch path (F.group_norm + F.silu in that dtype on this device) on the same inputs: <= 2x.
The fused conv adds Winograd's operand roundings (see test_kernels_winograd.py): <= 3x native.
Compiled kernels run where CUDA exists; the interpreter (set by conftest.py) only where it does not.
"""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from fastdiff._compat import triton_usable
from fastdiff.kernels import fused_norm_conv as fk
from fastdiff.kernels import group_norm_silu as gk
from fastdiff.kernels.winograd import transform_weight

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(
    not triton_usable(DEVICE), reason="Triton unusable here (no CUDA and TRITON_INTERPRET!=1)"
)


def rel_err(out, ref):
    return ((out.double() - ref).norm() / ref.norm()).item()


def make(n, c, h, w, dtype=torch.float32, seed=0, affine=True):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, c, h, w, generator=g) * 2 + 0.5  # non-zero mean exercises the centring
    gamma = torch.randn(c, generator=g) if affine else None
    beta = torch.randn(c, generator=g) if affine else None
    to = dict(device=DEVICE, dtype=dtype)
    return x.to(**to), (gamma.to(**to) if affine else None), (beta.to(**to) if affine else None)


def gn_silu64(x, groups, gamma, beta, eps=1e-5):
    d = lambda t: None if t is None else t.double()
    return F.silu(F.group_norm(x.double(), groups, d(gamma), d(beta), eps))


def poisoned_like(x):
    return torch.full_like(x, float("nan"))  # keeps x's memory format


@pytest.mark.parametrize(
    "shape,groups",
    [((2, 16, 5, 7), 4), ((1, 32, 24, 24), 8), ((2, 6, 1, 1), 3), ((1, 64, 33, 17), 32), ((1, 10, 3, 5), 1)],
    ids=["odd-hw", "split", "1x1", "sd-groups", "one-group"],
)
@pytest.mark.parametrize("one_pass", [True, False], ids=["one-pass", "stats+apply"])
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
def test_group_norm_silu_fp32(shape, groups, one_pass, channels_last):
    x, gamma, beta = make(*shape, affine=groups != 1)
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    out = poisoned_like(x)
    # splits=3 forces the cross-program Chan combination even for small images
    y = gk.group_norm_silu_triton(x, groups, gamma, beta, one_pass=one_pass, splits=3, out=out)
    assert y.data_ptr() == out.data_ptr() and not y.isnan().any()
    assert y.stride() == x.stride()
    assert rel_err(y, gn_silu64(x, groups, gamma, beta)) <= 1e-5


def test_statistics_survive_large_mean():
    """Welford/Chan merging keeps precision where sum/sum-of-squares would cancel catastrophically."""
    x, gamma, beta = make(1, 8, 32, 32)
    x = x * 0.01 + 1000.0
    ref = gn_silu64(x, 2, gamma, beta)
    y = gk.group_norm_silu_triton(x, 2, gamma, beta, one_pass=False, splits=4)
    ours = rel_err(y, ref)
    assert ours <= 2 * rel_err(F.silu(F.group_norm(x, 2, gamma, beta)), ref)  # as good as PyTorch's fp32
    # the textbook E[x^2] - E[x]^2 in fp32 is far worse on this input, so the bound above has teeth
    xg = x.view(1, 2, -1)
    var = (xg * xg).mean(-1, keepdim=True) - xg.mean(-1, keepdim=True) ** 2
    naive = ((xg - xg.mean(-1, keepdim=True)) * var.clamp_min(0).add(1e-5).rsqrt()).view_as(x)
    naive = F.silu(naive * gamma.view(1, -1, 1, 1) + beta.view(1, -1, 1, 1))
    assert rel_err(naive, ref) > 10 * ours


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("one_pass", [True, False], ids=["one-pass", "stats+apply"])
def test_group_norm_silu_half_within_twice_native(dtype, one_pass):
    x, gamma, beta = make(2, 32, 12, 12, dtype=dtype, seed=3)
    ref = gn_silu64(x, 8, gamma, beta)
    native = rel_err(F.silu(F.group_norm(x, 8, gamma, beta, 1e-5)), ref)
    y = gk.group_norm_silu_triton(x, 8, gamma, beta, one_pass=one_pass)
    assert y.dtype == dtype
    assert rel_err(y, ref) <= 2 * native


@settings(max_examples=6, deadline=None)
@given(
    n=st.integers(1, 2),
    groups=st.integers(1, 4),
    cg=st.integers(1, 5),
    h=st.integers(1, 12),
    w=st.integers(1, 12),
    channels_last=st.booleans(),
    one_pass=st.booleans(),
)
def test_group_norm_silu_fuzz(n, groups, cg, h, w, channels_last, one_pass):
    assume(cg * h * w > 1)  # one value per group is rejected (as PyTorch does)
    x, gamma, beta = make(n, groups * cg, h, w, seed=h * 13 + w)
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    y = gk.group_norm_silu_triton(x, groups, gamma, beta, one_pass=one_pass, splits=2)
    assert rel_err(y, gn_silu64(x, groups, gamma, beta)) <= 1e-5


def test_group_norm_bad_inputs():
    x, gamma, beta = make(1, 6, 4, 4)
    with pytest.raises(ValueError, match="divisible"):
        gk.group_norm_silu_triton(x, 4, gamma, beta)
    with pytest.raises(ValueError, match="weight"):
        gk.group_norm_silu_triton(x, 3, gamma[:4], beta)
    with pytest.raises(ValueError, match="4-D"):
        gk.group_norm_silu_triton(x[0], 3, gamma, beta)
    with pytest.raises(ValueError, match="more than one value"):
        gk.group_norm_silu_triton(x[:, :, :1, :1], 6, gamma, beta)
    with pytest.raises(TypeError, match="support"):
        gk.group_norm_silu_triton(x.double(), 3, gamma.double(), beta.double())


# --- fused GroupNorm + SiLU + Winograd conv ---------------------------------------------------------------
def fused_ref64(x, groups, gamma, beta, cw, cb, es=None, et=None):
    d = lambda t: None if t is None else t.double()
    return fk.group_norm_silu_conv3x3_reference(
        x.double(), groups, d(gamma), d(beta), 1e-5, cw.double(), d(cb), d(es), d(et)
    )


@pytest.mark.parametrize(
    "shape,groups,k", [((2, 16, 5, 7), 4, 24), ((1, 32, 8, 8), 8, 16), ((1, 6, 1, 3), 3, 5)]
)
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
@pytest.mark.parametrize("scale_shift", [False, True], ids=["plain", "scale_shift"])
def test_fused_norm_conv_fp32(shape, groups, k, channels_last, scale_shift):
    x, gamma, beta = make(*shape)
    g = torch.Generator().manual_seed(7)
    c = shape[1]
    cw = (torch.randn(k, c, 3, 3, generator=g) / (3 * c**0.5)).to(DEVICE)
    cb = torch.randn(k, generator=g).to(DEVICE)
    es = et = None
    if scale_shift:
        es, et = (torch.randn(shape[0], c, generator=g).to(DEVICE) for _ in range(2))
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    y = fk.group_norm_silu_conv3x3_triton(
        x, groups, gamma, beta, 1e-5, transform_weight(cw), cb, extra_scale=es, extra_shift=et
    )
    assert not y.isnan().any()
    assert rel_err(y, fused_ref64(x, groups, gamma, beta, cw, cb, es, et)) <= 1e-5


def test_fused_padding_is_zero_after_activation():
    """With a large beta, silu(norm(0)) != 0; border outputs are right only if padded taps stay 0."""
    x, gamma, _ = make(1, 4, 4, 4)
    beta = torch.full((4,), 3.0, device=DEVICE)
    cw = torch.ones(2, 4, 3, 3, device=DEVICE)
    y = fk.group_norm_silu_conv3x3_triton(x, 2, gamma, beta, 1e-5, transform_weight(cw))
    ref = fused_ref64(x, 2, gamma, beta, cw, None)
    assert rel_err(y, ref) <= 1e-5
    wrong = F.conv2d(F.pad(F.silu(F.group_norm(x.double(), 2, gamma.double(), beta.double())), (1,) * 4,
                           value=F.silu(torch.tensor(3.0)).item()), cw.double())  # fmt: skip
    assert rel_err(wrong, ref) > 1e-2  # the check above would catch silu(beta) padding


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_fused_norm_conv_half(dtype):
    x, gamma, beta = make(2, 32, 10, 10, dtype=dtype, seed=5)
    g = torch.Generator().manual_seed(8)
    cw = (torch.randn(32, 32, 3, 3, generator=g) / 17).to(DEVICE, dtype)
    cb = torch.randn(32, generator=g).to(DEVICE, dtype)
    ref = fused_ref64(x, 8, gamma, beta, cw, cb)
    native = rel_err(fk.group_norm_silu_conv3x3_reference(x, 8, gamma, beta, 1e-5, cw, cb), ref)
    y = fk.group_norm_silu_conv3x3_triton(x, 8, gamma, beta, 1e-5, transform_weight(cw, dtype), cb)
    assert rel_err(y, ref) <= 3 * native
