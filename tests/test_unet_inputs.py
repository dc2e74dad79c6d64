"""fastdiff.unet_inputs: one signature for the diffusers U-Net call and the flat engine inputs."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from fastdiff.testing import tiny_pipeline
from fastdiff.unet_inputs import probe_inputs, timestep_batch, unet_signature


@pytest.fixture(scope="module", params=["sd15", "sdxl", "lcm"])
def unet(request):
    if request.param == "lcm":
        from diffusers import UNet2DConditionModel

        base = tiny_pipeline("sd15").unet
        return UNet2DConditionModel.from_config({**base.config, "time_cond_proj_dim": 16}).eval()
    return tiny_pipeline(request.param).unet.eval()


def test_flat_round_trip_calls_the_unet_identically(unet):
    sig = unet_signature(unet)
    kwargs = probe_inputs(unet, batch=2, seed=1)
    with torch.no_grad():
        ref = unet(**kwargs, return_dict=False)[0]
        flat = sig.to_flat(
            kwargs["sample"],
            kwargs["timestep"],
            kwargs["encoder_hidden_states"],
            timestep_cond=kwargs.get("timestep_cond"),
            added_cond_kwargs=kwargs.get("added_cond_kwargs"),
        )
        assert tuple(flat) == sig.input_names
        assert flat["timestep"].shape == (2,) and flat["timestep"].dtype == torch.float32
        out = unet(**sig.from_flat(flat), return_dict=False)[0]
    torch.testing.assert_close(out, ref, rtol=0, atol=0)


def test_example_inputs_have_the_signature_shapes(unet):
    sig = unet_signature(unet)
    ex = sig.example_inputs(3, 8, 16, sequence=5, generator=torch.Generator().manual_seed(0))
    assert tuple(ex) == sig.input_names and ex["sample"].shape == (3, sig.in_channels, 8, 16)
    with torch.no_grad():
        out = unet(**sig.from_flat(ex), return_dict=False)[0]
    assert out.shape == (3, sig.out_channels, 8, 16)


def test_probe_inputs_match_the_previous_probe():
    """The probe optimize verifies on must draw the same numbers as before the move (seeded order)."""
    unet = tiny_pipeline("sdxl").unet
    p = probe_inputs(unet)
    gen = torch.Generator().manual_seed(0)
    size = max(8, 2 ** len(unet.config.block_out_channels))
    sample = torch.randn(2, 4, size, size, generator=gen)
    ehs = torch.randn(2, 8, unet.config.cross_attention_dim, generator=gen)
    assert torch.equal(p["sample"], sample) and torch.equal(p["encoder_hidden_states"], ehs)
    assert p["timestep"].ndim == 0 and int(p["timestep"]) == 537
    assert p["added_cond_kwargs"]["time_ids"].shape == (2, 6)


def test_bad_inputs_name_the_argument(unet):
    sig = unet_signature(unet)
    ok = sig.example_inputs(2, 8, 8)
    with pytest.raises(ValueError, match="sample"):
        sig.to_flat(torch.zeros(2, 3, 8, 8), 1, ok["encoder_hidden_states"])
    with pytest.raises(ValueError, match="encoder_hidden_states"):
        sig.to_flat(ok["sample"], 1, ok["encoder_hidden_states"][:1])
    with pytest.raises(ValueError, match=r"shape \(2,\)"):
        timestep_batch(torch.zeros(3), 2)
    with pytest.raises(TypeError, match="timestep"):
        timestep_batch(True, 2)
    with pytest.raises(ValueError, match="lack"):
        sig.from_flat({"sample": ok["sample"]})


def test_module_loads_no_onnx_or_pipelines():
    """Loaded on its own (fastdiff/__init__ is the lead's and may import more), it pulls in only torch."""
    import fastdiff.unet_inputs as mod

    code = (
        "import importlib.util, sys; "
        f"spec = importlib.util.spec_from_file_location('ui', {mod.__file__!r}); "
        "m = importlib.util.module_from_spec(spec); sys.modules['ui'] = m; spec.loader.exec_module(m); "
        "print([k for k in ('onnx', 'onnxruntime', 'openvino', 'diffusers', 'transformers') if k in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_check_flat_accepts_its_own_inputs_and_names_what_differs(unet):
    sig = unet_signature(unet)
    ex = sig.example_inputs(2, 8, 8, sequence=5)
    sig.check_flat(ex)  # its own inputs pass
    wrong_text = {**ex, "encoder_hidden_states": torch.randn(2, 5, sig.cross_attention_dim + 1)}
    with pytest.raises(
        ValueError, match=rf"encoder_hidden_states.*cross_attention_dim is {sig.cross_attention_dim}"
    ):
        sig.check_flat(wrong_text)
    with pytest.raises(ValueError, match=rf"sample.*in_channels is {sig.in_channels}"):
        sig.check_flat({**ex, "sample": torch.randn(2, sig.in_channels + 3, 8, 8)})
    with pytest.raises(ValueError, match=r"extra \['bogus'\]"):
        sig.check_flat({**ex, "bogus": torch.zeros(2)})
    with pytest.raises(ValueError, match=r"missing \['encoder_hidden_states'\]"):
        sig.check_flat({k: v for k, v in ex.items() if k != "encoder_hidden_states"})
    if sig.text_embeds_dim is not None:
        with pytest.raises(ValueError, match="text_embeds"):
            sig.check_flat({**ex, "text_embeds": torch.randn(2, sig.text_embeds_dim + 2)})
    if sig.time_cond_dim is not None:
        with pytest.raises(ValueError, match="timestep_cond.*time_cond_proj_dim"):
            sig.check_flat({**ex, "timestep_cond": torch.randn(2, sig.time_cond_dim - 1)})
