"""Attention backends against the math reference, and the processor inside a UNet."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import fastdiff
from fastdiff.ops.attention import BACKENDS, AttentionBackendError, attention, backend_status
from fastdiff.testing import tiny_pipeline, unet_probe_inputs

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def reference(q, k, v, mask=None, scale=None):
    q, k, v = q.double(), k.double(), v.double()
    s = (q @ k.transpose(-1, -2)) * (scale if scale is not None else q.shape[-1] ** -0.5)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask.double()
    return torch.softmax(s, -1) @ v


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.mark.parametrize("backend", BACKENDS)
def test_backend_matches_reference(backend):
    reason = backend_status(backend, DEVICE, torch.float32)
    if reason is not None:
        pytest.skip(f"{backend} not usable here: {reason}")
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, n, 40, generator=g).to(DEVICE) for n in (77, 19, 19))
    out = attention(q, k, v, backend=backend)
    assert out.shape == q.shape
    assert rel(out, reference(q, k, v)) <= 1e-5
    math = attention(q, k, v, backend="math")
    assert rel(out, math) <= 1e-5


@settings(max_examples=15, deadline=None)
@given(
    b=st.integers(1, 3),
    h=st.integers(1, 4),
    sq=st.integers(1, 33),
    sk=st.integers(1, 33),
    d=st.sampled_from([8, 16, 40, 64]),
    masked=st.booleans(),
)
def test_sdpa_fuzz_with_mask_and_scale(b, h, sq, sk, d, masked):
    g = torch.Generator().manual_seed(b * 1000 + sq * 37 + sk)
    q = torch.randn(b, h, sq, d, generator=g)
    k, v = torch.randn(b, h, sk, d, generator=g), torch.randn(b, h, sk, d, generator=g)
    mask = None
    if masked:
        mask = torch.rand(b, 1, sq, sk, generator=g) > 0.3
        mask[..., 0] = True  # keep one key per row so softmax is defined
    out = attention(q, k, v, attn_mask=mask, scale=0.37, backend="auto")
    assert rel(out, reference(q, k, v, mask, 0.37)) <= 1e-5


def test_errors_name_what_is_valid():
    q = torch.randn(1, 1, 4, 8)
    with pytest.raises(ValueError, match="valid: auto, sdpa"):
        attention(q, q, q, backend="fast")
    with pytest.raises(ValueError, match="4-D"):
        attention(q[0], q[0], q[0])
    if DEVICE == "cpu":
        with pytest.raises(AttentionBackendError, match="needs CUDA"):
            attention(q, q, q, backend="efficient")


@pytest.mark.parametrize("backend", BACKENDS)
def test_processor_in_unet_matches_math(backend):
    reason = backend_status(backend, DEVICE, torch.float32)
    if reason is not None:
        pytest.skip(f"{backend} not usable here: {reason}")
    pipe = tiny_pipeline("sd15").to(DEVICE)
    inputs = unet_probe_inputs(pipe.unet, seed=1)
    fastdiff.optimize(pipe, attention="math", winograd=False, fuse_norm_act=False, verify=False)
    with torch.no_grad():
        ref = pipe.unet(**inputs).sample
    fastdiff.optimize(pipe, attention=backend, winograd=False, fuse_norm_act=False, verify=False)
    with torch.no_grad():
        out = pipe.unet(**inputs).sample
    assert rel(out, ref) <= 1e-5
