"""fastdiff.optimize / report / restore on offline SD1.5, SD2.1 and SDXL pipelines."""

import copy

import pytest
import torch
from diffusers import UNet2DConditionModel

import fastdiff
from fastdiff.optimize import OptimizeConfig
from fastdiff.testing import tiny_pipeline, unet_probe_inputs

ARCHS = ["sd15", "sd21", "sdxl"]
ALL_PASSES = dict(winograd=True, fuse_norm_act=True, attention="auto", channels_last=True)


@pytest.fixture(scope="module", autouse=True)
def runtime_cpu_paths():
    """Run these whole-pipeline tests on the CPU run-time paths (PyTorch Winograd, native fallbacks).

    The Triton interpreter proves kernel correctness in the kernel tests at
    small shapes; through whole pipelines it takes minutes per test. With the
    interpreter off, a CPU process sees exactly what a user's CPU process sees.
    """
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRITON_INTERPRET", "0")
        yield


def rel_max_err(out, ref):
    return ((out - ref).abs().max() / ref.abs().max()).item()


def unet_out(unet, inputs):
    with torch.no_grad():
        return unet(**inputs).sample


def run_latents(pipe, steps=3):
    kwargs = dict(prompt="a red circle on a blue background", num_inference_steps=steps, output_type="latent")
    kwargs["generator"] = torch.Generator().manual_seed(0)
    size = pipe.unet.config.sample_size * pipe.vae_scale_factor
    return pipe(height=size, width=size, **kwargs).images


@pytest.fixture(scope="module", params=ARCHS)
def optimized(request):
    """(original pipeline, optimised deep copy) for one architecture."""
    pipe = tiny_pipeline(request.param)
    opt = copy.deepcopy(pipe)
    fastdiff.optimize(opt, **ALL_PASSES)
    return pipe, opt


def test_unet_output_matches_original(optimized):
    pipe, opt = optimized
    inputs = unet_probe_inputs(pipe.unet, seed=11, size=12)  # not the verification probe
    ref, out = unet_out(pipe.unet, inputs), unet_out(opt.unet, inputs)
    assert rel_max_err(out, ref) <= 1e-4
    rep = fastdiff.report(opt)
    assert rep["attention"].status == "applied"
    assert rep["channels_last"].status == "applied"
    assert rep.verification is not None and rep.verification.passed


def test_three_step_pipeline_matches(optimized):
    pipe, opt = optimized
    ref, out = run_latents(pipe), run_latents(opt)
    assert rel_max_err(out, ref) <= 1e-3


def test_restore_is_bit_identical_and_state_dict_unchanged():
    pipe = tiny_pipeline("sd15")
    inputs = unet_probe_inputs(pipe.unet, seed=5)
    before = unet_out(pipe.unet, inputs)
    sd_before = {k: v.clone() for k, v in pipe.unet.state_dict().items()}
    fastdiff.optimize(pipe, **ALL_PASSES)
    sd_after = pipe.unet.state_dict()
    assert list(sd_after) == list(sd_before)
    for k, v in sd_before.items():
        assert torch.equal(sd_after[k], v), k
    fastdiff.restore(pipe)
    assert torch.equal(unet_out(pipe.unet, inputs), before)
    assert fastdiff.report(pipe).passes[0].status == "not applied"


def test_save_and_load_round_trip(tmp_path):
    pipe = tiny_pipeline("sd15")
    inputs = unet_probe_inputs(pipe.unet, seed=2)
    ref = unet_out(pipe.unet, inputs)
    fastdiff.optimize(pipe, **ALL_PASSES)
    pipe.unet.save_pretrained(tmp_path / "unet")
    loaded = UNet2DConditionModel.from_pretrained(tmp_path / "unet")
    assert torch.equal(unet_out(loaded, inputs), ref)
    # and a state dict saved from the optimised model loads back into it
    pipe.unet.load_state_dict(loaded.state_dict())
    assert rel_max_err(unet_out(pipe.unet, inputs), ref) <= 1e-4


def test_optimize_is_idempotent():
    pipe = tiny_pipeline("sd15")

    def summary():
        # live per-shape plan details (timings, "measured" vs "plan cache") may differ between calls
        return [(p.name, p.status, p.changed, p.skipped) for p in fastdiff.report(pipe).passes]

    fastdiff.optimize(pipe, attention="math")
    first = summary()
    fastdiff.optimize(pipe, attention="math")
    assert summary() == first
    procs = {type(p).__name__ for p in pipe.unet.attn_processors.values()}
    assert procs == {"FastdiffAttnProcessor"}
    fastdiff.restore(pipe)
    procs = {type(p).__name__ for p in pipe.unet.attn_processors.values()}
    assert procs == {"AttnProcessor2_0"}


def test_dtype_move_after_optimize():
    pipe = tiny_pipeline("sd15")
    inputs = unet_probe_inputs(pipe.unet, seed=4, dtype=torch.float64)
    fastdiff.optimize(pipe, **ALL_PASSES)
    pipe.unet.to(torch.float64)
    out = unet_out(pipe.unet, inputs)
    fastdiff.restore(pipe)
    ref = unet_out(pipe.unet, inputs)
    assert out.dtype == torch.float64
    assert rel_max_err(out, ref) <= 1e-6


def test_lora_through_peft_after_optimize():
    peft = pytest.importorskip("peft")
    pipe = tiny_pipeline("sd15")
    plain = copy.deepcopy(pipe.unet)
    fastdiff.optimize(pipe, **ALL_PASSES)
    inputs = unet_probe_inputs(pipe.unet, seed=8)
    base = unet_out(pipe.unet, inputs)
    cfg = peft.LoraConfig(
        r=4, lora_alpha=4, target_modules=["to_q", "to_k", "to_v", "to_out.0", "conv1", "conv2"]
    )
    for unet in (pipe.unet, plain):
        unet.add_adapter(cfg)
    # LoRA B starts at zero: the adapter must not change the output yet
    assert rel_max_err(unet_out(pipe.unet, inputs), base) <= 1e-6
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for (name, p), (name2, p2) in zip(pipe.unet.named_parameters(), plain.named_parameters()):
            assert name == name2
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
            if "lora_" in name:  # lora_A is randomly initialised: share it too
                p2.copy_(p)
    out, ref = unet_out(pipe.unet, inputs), unet_out(plain, inputs)
    assert rel_max_err(out, base) > 1e-3  # the adapter acts
    assert rel_max_err(out, ref) <= 1e-4  # and acts exactly as on the plain UNet


def test_verification_rolls_back_a_wrong_pass(monkeypatch):
    """A pass that corrupts the output must be rolled back and reported, never kept."""
    import importlib

    core = importlib.import_module("fastdiff.optimize.core")  # `fastdiff.optimize` is the function

    from fastdiff.optimize.passes import Pass

    class Corrupting(Pass):
        name = "corrupt"

        def apply(self, unet, config, ctx):
            conv = unet.conv_out
            bad = torch.nn.Conv2d(conv.in_channels, conv.out_channels, 3, padding=1)
            ctx.replace_module("conv_out", bad, "deliberately wrong")

    monkeypatch.setattr(core, "default_passes", lambda: [Corrupting()])
    pipe = tiny_pipeline("sd15")
    conv_out = pipe.unet.conv_out
    fastdiff.optimize(pipe)
    rep = fastdiff.report(pipe)["corrupt"]
    assert rep.status == "rolled back"
    assert not rep.verification.passed
    assert pipe.unet.conv_out is conv_out
    assert "rolled back" in str(fastdiff.report(pipe))


def test_bad_input_errors():
    with pytest.raises(TypeError, match="supports a diffusers UNet2DConditionModel"):
        fastdiff.optimize(torch.nn.Linear(2, 2))
    pipe = tiny_pipeline("sd15")
    with pytest.raises(TypeError, match="unknown optimize option.*valid options: winograd"):
        fastdiff.optimize(pipe, winogard=True)
    with pytest.raises(ValueError, match="attention must be one of"):
        OptimizeConfig(attention="fast")
    with pytest.raises(ValueError, match="winograd must be"):
        OptimizeConfig(winograd="yes")
    with pytest.raises(Exception, match="xformers"):
        fastdiff.optimize(pipe, attention="xformers") if not _has("xformers") else pytest.skip(
            "xformers installed"
        )
    # a refused request leaves the model untouched
    assert fastdiff.report(pipe).passes[0].status == "not applied"


def _has(mod):
    from fastdiff._compat import is_available

    return is_available(mod)
