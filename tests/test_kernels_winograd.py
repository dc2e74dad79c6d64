"""Winograd F(2x2,3x3) kernels against float64 references.

Compiled Triton kernels run where CUDA exists; elsewhere ``conftest.py`` turns on the Triton interpreter
(never this file: it must test the compiled kernels on a GPU).

Error metric: ||out - ref|| / ||ref|| with ref = F.conv2d in float64 on the same (rounded) inputs.

Half precision: the kernel feeds fp16/bf16 transformed operands (V = B^T d B and U = G g G^T, each rounded
once) to tensor-core dots with fp32 accumulation. Native conv's error on the same inputs is essentially the
output rounding; each of the two operand roundings adds about as much again, so Winograd measures ~2.6x
the native error (the 5e-4 vs 2e-4 of the literature). The bound below is therefore 3x native error
(native = CPU F.conv2d in that dtype, itself fp32-accumulated), not 2x; see the README's accuracy notes.
"""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from fastdiff._compat import triton_usable
from fastdiff.kernels import winograd as wg

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_triton = pytest.mark.skipif(
    not triton_usable(DEVICE), reason="Triton unusable here (no CUDA and TRITON_INTERPRET!=1)"
)
HALF_BOUND = 3.0  # x native error, see module docstring


def rel_err(out, ref):
    return ((out.double() - ref).norm() / ref.norm()).item()


def make(n, c, k, h, w, dtype=torch.float32, seed=0, bias=True):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, c, h, w, generator=g)
    weight = torch.randn(k, c, 3, 3, generator=g) / (3 * c**0.5)
    b = torch.randn(k, generator=g) if bias else None
    to = dict(device=DEVICE, dtype=dtype)
    return x.to(**to), weight.to(**to), (b.to(**to) if bias else None)


def ref64(x, weight, bias):
    return F.conv2d(x.double(), weight.double(), None if bias is None else bias.double(), padding=1)


def poisoned(n, k, h, w, dtype, channels_last=False):
    out = torch.full((n, k, h, w), float("nan"), device=DEVICE, dtype=dtype)
    return out.to(memory_format=torch.channels_last) if channels_last else out


def test_weight_transform_reproduces_direct_convolution():
    """For every 4x4 tile d: A^T [U * (B^T d B)] A, summed over channels, is the 2x2 direct correlation of d
    with g (float64 F.conv2d), so the transformed weight is right without restating its formula."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(5, 3, 3, 3, dtype=torch.float64, generator=g)
    d = torch.randn(7, 3, 4, 4, dtype=torch.float64, generator=g)
    u = wg.transform_weight(w).view(4, 4, 3, 5)  # (i, j, c, k)
    v = wg.B_T @ d @ wg.B_T.T  # (tiles, c, 4, 4)
    y = wg.A_T @ torch.einsum("ijck,tcij->tkij", u, v) @ wg.A_T.T
    assert torch.allclose(y, F.conv2d(d, w), rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="3, 3"):
        wg.transform_weight(torch.randn(5, 3, 5, 5))


@pytest.mark.parametrize("shape", [(1, 5, 7, 5, 7), (2, 8, 8, 6, 6), (1, 3, 2, 1, 1), (1, 6, 4, 2, 9)])
def test_textbook_and_torch_winograd_fp32(shape):
    x, w, b = make(*shape)
    ref = ref64(x, w, b)
    assert rel_err(wg.winograd_conv2d_reference(x, w, b), ref) < 1e-12
    u = wg.transform_weight(w)
    for xx in (x, x.to(memory_format=torch.channels_last)):
        out = wg.winograd_conv2d_torch(xx, u, b)
        assert rel_err(out, ref) <= 1e-5
        native = F.conv2d(xx, w, b, padding=1)  # same memory format as the native conv
        assert out.is_contiguous() == native.is_contiguous()
        assert out.is_contiguous(memory_format=torch.channels_last) == native.is_contiguous(
            memory_format=torch.channels_last
        )


@needs_triton
@pytest.mark.parametrize(
    "shape",
    [(2, 16, 24, 8, 8), (1, 5, 7, 5, 7), (1, 33, 17, 3, 4), (1, 3, 2, 1, 1), (3, 4, 20, 7, 2)],
    ids=["even", "odd-hw", "c>block", "1x1-image", "batch3-thin"],
)
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
def test_triton_fp32_matches_float64(shape, channels_last):
    n, c, k, h, w_ = shape
    x, w, b = make(*shape, bias=(n != 3))
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    out = poisoned(n, k, h, w_, x.dtype, channels_last)
    y = wg.winograd_conv2d_triton(x, wg.transform_weight(w), b, out=out)
    assert y.data_ptr() == out.data_ptr()
    assert not y.isnan().any(), "kernel left output elements unwritten"
    assert rel_err(y, ref64(x, w, b)) <= 1e-5


@needs_triton
def test_triton_strided_input():
    """A non-dense view (every other channel) is read through its strides."""
    x, w, b = make(1, 12, 8, 6, 5)
    xs = x[:, ::2]
    y = wg.winograd_conv2d_triton(xs, wg.transform_weight(w[:, ::2].contiguous()), b)
    assert rel_err(y, ref64(xs, w[:, ::2], b)) <= 1e-5


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
def test_triton_half_precision_within_bound_of_native(dtype, channels_last):
    n, c, k, h, w_ = 2, 32, 32, 10, 9
    x, w, b = make(n, c, k, h, w_, dtype=dtype, seed=1)
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    ref = ref64(x, w, b)
    native = rel_err(F.conv2d(x, w, b, padding=1), ref)
    out = poisoned(n, k, h, w_, dtype, channels_last)
    y = wg.winograd_conv2d_triton(x, wg.transform_weight(w, dtype), b, out=out)
    assert not y.isnan().any()
    err = rel_err(y, ref)
    assert err <= HALF_BOUND * native, f"winograd {err:.2e} vs native {native:.2e}"


@needs_triton
@settings(max_examples=6, deadline=None)
@given(
    n=st.integers(1, 2),
    c=st.integers(1, 20),
    k=st.integers(1, 20),
    h=st.integers(1, 9),
    w=st.integers(1, 9),
    bias=st.booleans(),
    channels_last=st.booleans(),
)
def test_triton_fuzz_shapes(n, c, k, h, w, bias, channels_last):
    x, wt, b = make(n, c, k, h, w, bias=bias, seed=n * 1000 + c * 10 + k)
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    out = poisoned(n, k, h, w, x.dtype, channels_last)
    y = wg.winograd_conv2d_triton(x, wg.transform_weight(wt), b, out=out)
    assert not y.isnan().any()
    assert rel_err(y, ref64(x, wt, b)) <= 1e-5


@settings(max_examples=8, deadline=None)
@given(c=st.integers(1, 24), k=st.integers(1, 24), h=st.integers(1, 13), w=st.integers(1, 13))
def test_torch_winograd_fuzz_shapes(c, k, h, w):
    x, wt, b = make(2, c, k, h, w, seed=c + 31 * k)
    assert rel_err(wg.winograd_conv2d_torch(x, wg.transform_weight(wt), b), ref64(x, wt, b)) <= 1e-5


def test_bad_inputs_raise_clear_errors():
    x, w, b = make(1, 4, 6, 5, 5)
    u = wg.transform_weight(w)
    with pytest.raises(ValueError, match="4-D"):
        wg.winograd_conv2d_torch(x[0], u, b)
    with pytest.raises(ValueError, match="channels"):
        wg.winograd_conv2d_torch(x[:, :3], u, b)
    with pytest.raises(ValueError, match="bias"):
        wg.winograd_conv2d_torch(x, u, b[:3])
    with pytest.raises(ValueError, match="16, C, K"):
        wg.winograd_conv2d_torch(x, w, b)


def test_triton_refuses_cpu_without_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    x, w, b = make(1, 4, 6, 5, 5)
    x, w = x.cpu(), w.cpu()
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        wg.winograd_conv2d_triton(x, wg.transform_weight(w), None)


@needs_triton
def test_triton_several_blocks_along_every_gemm_axis():
    """C spans 3 reduction blocks (BLOCK_K=16), K 3 output-channel blocks, the tiles 2 row blocks, with the
    last block of each partial; bias and odd sizes on top."""
    x, w, b = make(2, 40, 70, 9, 11, seed=4)
    cfg = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 16, "num_warps": 4, "num_stages": 1}
    out = poisoned(2, 70, 9, 11, x.dtype)
    y = wg.winograd_conv2d_triton(x, wg.transform_weight(w), b, out=out, configs={"gemm": cfg})
    assert not y.isnan().any()
    assert rel_err(y, ref64(x, w, b)) <= 1e-5


@needs_triton
@pytest.mark.parametrize(
    "gemm", wg.GEMM_CONFIGS, ids=lambda c: "x".join(str(c[k]) for k in c if "BLOCK" in k)
)
def test_every_shipped_config(gemm):
    """Every GEMM autotune config, with the shipped (compiled) transform configs, at a small shape."""
    x, w, b = make(1, 36, 20, 6, 7, seed=5)
    configs = {"input": wg.INPUT_CONFIGS[0], "gemm": gemm, "output": wg.OUTPUT_CONFIGS[0]}
    y = wg.winograd_conv2d_triton(x, wg.transform_weight(w), b, configs=configs)
    assert rel_err(y, ref64(x, w, b)) <= 1e-5


def test_shipped_configs_cover_every_transform_config():
    # one config per transform: the test above runs all of them; more would need a loop there
    assert len(wg.INPUT_CONFIGS) == len(wg.OUTPUT_CONFIGS) == 1
