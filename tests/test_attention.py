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


# ---------------------------------------------------------------- xFormers bias and FA3 selection (no GPU here)


def test_xformers_bias_dtype_alignment_and_values():
    """What is exercised: the bias handed to xFormers (dtype, 8-element aligned storage, values).
    What is not: xFormers' kernel itself (needs CUDA and the package)."""
    from fastdiff.ops.attention import xformers_bias

    q = torch.randn(2, 3, 5, 16, dtype=torch.float16)
    k = torch.randn(2, 3, 77, 16, dtype=torch.float16)
    add = torch.randn(2, 1, 1, 77)  # float32 additive text mask, broadcast over heads and queries
    bias = xformers_bias(add, q, k)
    assert bias.dtype == torch.float16 and bias.shape == (2, 3, 5, 77)
    assert bias.stride(2) % 8 == 0 and bias.stride(3) == 1
    torch.testing.assert_close(bias.float(), add.half().float().expand(2, 3, 5, 77))
    keep = torch.rand(2, 3, 5, 77) > 0.3
    b2 = xformers_bias(keep, q, k)
    assert torch.isneginf(b2[~keep]).all() and (b2[keep] == 0).all()
    assert xformers_bias(None, q, k) is None


def test_flash_attn_probes_the_models_head_dim(monkeypatch):
    """FA3 is chosen only for head dims a real call accepts; SD1.5's 40/80/160 fall back to FA2 here.

    What is exercised: the selection and its probe, with stand-in FA2/FA3 modules on CPU tensors.
    What is not: the real kernels (need a Hopper GPU and the packages)."""
    import types

    att = __import__("importlib").import_module("fastdiff.ops.attention")

    def fa3(q, k, v, softmax_scale=None):
        if q.shape[-1] not in (64, 128, 256):
            raise RuntimeError("FlashAttention-3 forward only supports head dimension 64, 128, 256")
        return q, None

    fake3 = types.SimpleNamespace(flash_attn_func=fa3)
    fake2 = types.SimpleNamespace(flash_attn_func=lambda q, k, v, softmax_scale=None: q)
    monkeypatch.setitem(__import__("sys").modules, "flash_attn_interface", fake3)
    monkeypatch.setattr(att, "is_available", lambda m: True)
    monkeypatch.setattr(att, "require", lambda m, feature: fake2)
    att._flash_attn_fn.cache_clear()
    try:
        assert att._flash_attn_fn(64, torch.float16, "cpu") == (fa3, "fa3")
        for d in (40, 80, 160):
            assert att._flash_attn_fn(d, torch.float16, "cpu")[1] == "fa2"
    finally:
        att._flash_attn_fn.cache_clear()
