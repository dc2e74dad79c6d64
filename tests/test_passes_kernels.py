"""Drop-in modules (WinogradConv2d, GroupNormSiLU, FusedResnetBlock2D), plan cache and the optimize passes.

CPU tensors throughout; the Triton paths run under the interpreter that conftest.py enables when CUDA is
absent (a CUDA machine skips the CPU-interpreter cases and runs the compiled kernels in the kernel tests).
"""

import copy
import json

import pytest
import torch
import torch.nn.functional as F
from diffusers import UNet2DConditionModel
from diffusers.models.resnet import ResnetBlock2D
from torch import nn

import fastdiff
from fastdiff._compat import triton_usable
from fastdiff.nn.norm_act import FusedResnetBlock2D, GroupNormSiLU
from fastdiff.nn.winograd import WinogradConv2d
from fastdiff.ops import dispatch
from fastdiff.testing.probe import unet_probe_inputs

needs_triton = pytest.mark.skipif(not triton_usable("cpu"), reason="needs TRITON_INTERPRET=1 on CPU")


def rel_err(out, ref):
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def make_conv(c=6, k=10, **kw):
    torch.manual_seed(0)
    return nn.Conv2d(c, k, 3, padding=1, **kw)


# --- WinogradConv2d ------------------------------------------------------------------------------------
def test_from_module_shares_parameters_and_state_dict():
    conv = make_conv()
    before = {k: v.clone() for k, v in conv.state_dict().items()}
    wconv = WinogradConv2d.from_module(conv, mode=True)
    assert isinstance(wconv, nn.Conv2d)
    assert wconv.weight is conv.weight and wconv.bias is conv.bias
    sd = wconv.state_dict()
    assert list(sd) == list(before) and all(torch.equal(sd[k], before[k]) for k in sd)
    wconv.load_state_dict({k: v * 2 for k, v in before.items()})  # loading through one updates both
    assert torch.equal(conv.weight, before["weight"] * 2)


@pytest.mark.parametrize(
    "kwargs,reason",
    [
        (dict(stride=2), "stride"),
        (dict(dilation=2), "dilation"),
        (dict(groups=2), "groups"),
        (dict(padding_mode="reflect"), "padding_mode"),
    ],
)
def test_ineligible_convs_are_refused_with_reason(kwargs, reason):
    conv = make_conv(**kwargs)
    with pytest.raises(ValueError, match=reason):
        WinogradConv2d.from_module(conv)
    with pytest.raises(ValueError, match="3x3"):
        WinogradConv2d.from_module(nn.Conv2d(4, 4, 1))
    with pytest.raises(ValueError, match="padding"):
        WinogradConv2d.from_module(nn.Conv2d(4, 4, 3, padding=0))


@pytest.mark.parametrize("backend", ["auto", pytest.param("winograd_triton", marks=needs_triton)])
def test_forced_winograd_matches_and_weight_cache_invalidates(backend):
    conv = make_conv()
    wconv = WinogradConv2d.from_module(conv, mode=True, winograd_backend=backend)
    x = torch.randn(2, 6, 5, 7)
    with torch.no_grad():
        assert rel_err(wconv(x), conv(x)) <= 1e-5
        wconv(x)
        assert wconv.weight_cache.rebuilds == 1  # transformed once, reused
        conv.weight.add_(1)  # in-place update (e.g. a LoRA merge) bumps weight._version
        assert rel_err(wconv(x), F.conv2d(x, conv.weight, conv.bias, padding=1)) <= 1e-5
        assert wconv.weight_cache.rebuilds == 2
        conv.weight.data = conv.weight.data * 0.5  # new storage
        assert rel_err(wconv(x), F.conv2d(x, conv.weight, conv.bias, padding=1)) <= 1e-5
        assert wconv.weight_cache.rebuilds == 3
    choice = next(iter(wconv.plan_summary().values()))["choice"]
    assert choice == ("winograd_triton" if backend == "winograd_triton" else "winograd_torch")  # no CUDA here


def test_gradients_use_native_path():
    conv = make_conv()
    wconv = WinogradConv2d.from_module(copy.deepcopy(conv), mode=True)
    x = torch.randn(1, 6, 4, 4, requires_grad=True)
    wconv(x).square().sum().backward()
    g_ref = torch.autograd.grad(conv(x).square().sum(), x)[0]
    assert torch.allclose(x.grad, g_ref, atol=1e-5)
    assert wconv.plan_summary() == {}  # no fast path was used


def test_plans_persist_across_instances_and_processes(tmp_path):
    conv = make_conv(16, 16)
    x = torch.randn(2, 16, 12, 12)
    with torch.no_grad():
        first = WinogradConv2d.from_module(conv, plan_cache_dir=tmp_path)
        t0 = dispatch.stats["timed"]
        first(x)
        assert dispatch.stats["timed"] > t0
        rec = next(iter(first.plan_summary().values()))
        assert rec["source"] == "measured" and rec["choice"] in ("native", "winograd_torch")
        files = list(tmp_path.glob("*.json"))
        assert len(files) == 1 and "torch" in files[0].name and "triton" in files[0].name

        dispatch.clear_memory_caches()  # what a fresh process sees: only the file
        t1 = dispatch.stats["timed"]
        second = WinogradConv2d.from_module(conv, plan_cache_dir=tmp_path)
        assert rel_err(second(x), conv(x)) <= 1e-5
        assert dispatch.stats["timed"] == t1, "a cached plan was timed again"
        assert next(iter(second.plan_summary().values()))["source"] == "plan cache"

        files[0].write_text("{not json")  # corrupt file: ignored, re-timed, rewritten
        dispatch.clear_memory_caches()
        third = WinogradConv2d.from_module(conv, plan_cache_dir=tmp_path)
        with pytest.warns(UserWarning, match="plan cache"):
            third(x)
        assert dispatch.stats["timed"] > t1
        assert json.loads(files[0].read_text())["entries"]


def test_module_moved_to_another_device_measures_again(tmp_path, monkeypatch):
    """A plan measured on one device is never reused on another (a fake second device stands in for a GPU)."""
    conv = make_conv(16, 16)
    x = torch.randn(2, 16, 12, 12)
    wconv = WinogradConv2d.from_module(conv, plan_cache_dir=tmp_path)
    with torch.no_grad():
        wconv(x)
        t0 = dispatch.stats["timed"]
        wconv(x)
        assert dispatch.stats["timed"] == t0  # same device: the plan is reused
        monkeypatch.setattr(dispatch, "device_name", lambda device: "Fake Accelerator 2")
        dispatch.clear_memory_caches()
        assert rel_err(wconv(x), conv(x)) <= 1e-5
    assert dispatch.stats["timed"] > t0, "the other device's plan was reused"
    devices = sorted({key.split("|")[0] for key in wconv.plan_summary()})
    assert len(devices) == 2 and devices[0].startswith("cpu:Fake Accelerator 2")
    assert len(list(tmp_path.glob("*.json"))) == 2


# --- GroupNormSiLU and FusedResnetBlock2D ---------------------------------------------------------------
@pytest.mark.parametrize("backend", ["auto", "native", pytest.param("gn_triton", marks=needs_triton)])
def test_group_norm_silu_module(backend):
    torch.manual_seed(0)
    gn = nn.GroupNorm(4, 8)
    nn.init.normal_(gn.weight)
    nn.init.normal_(gn.bias)
    fused = GroupNormSiLU.from_module(gn, backend=backend)
    assert fused.weight is gn.weight and list(fused.state_dict()) == list(gn.state_dict())
    x = torch.randn(2, 8, 5, 5)
    with torch.no_grad():
        assert rel_err(fused(x), F.silu(gn(x))) <= 1e-5


@needs_triton
def test_trainable_group_norm_weight_keeps_its_gradient():
    """Regression: the fast path used to check only x.requires_grad, dropping a trainable weight's gradient."""
    torch.manual_seed(0)
    gn = nn.GroupNorm(4, 8)
    fused = GroupNormSiLU.from_module(copy.deepcopy(gn), backend="gn_triton")
    x = torch.randn(2, 8, 5, 5)  # the input needs no gradient, the weight does
    fused(x).square().sum().backward()
    F.silu(gn(x)).square().sum().backward()
    assert fused.weight.grad is not None and torch.allclose(fused.weight.grad, gn.weight.grad, atol=1e-5)
    assert torch.allclose(fused.bias.grad, gn.bias.grad, atol=1e-5)


def _block(**kw):
    torch.manual_seed(0)
    args = dict(in_channels=8, out_channels=8, temb_channels=12, groups=4, eps=1e-5)
    args.update(kw)
    block = ResnetBlock2D(**args).eval()
    for m in block.modules():  # non-trivial affine parameters
        if isinstance(m, nn.GroupNorm):
            nn.init.normal_(m.weight)
            nn.init.normal_(m.bias)
    return block


BLOCKS = {
    "default": {},
    "shortcut+scale": dict(out_channels=16, output_scale_factor=2.0),
    "scale_shift": dict(time_embedding_norm="scale_shift"),
    "down": dict(down=True),
    "up": dict(up=True),
    "no-temb": dict(temb_channels=None),
}


@needs_triton
@pytest.mark.parametrize("name", list(BLOCKS))
def test_fused_resnet_block_matches_original(name):
    block = _block(**BLOCKS[name])
    fused = FusedResnetBlock2D.from_module(block, backend="fused_triton")
    assert list(fused.state_dict()) == list(block.state_dict())
    assert all(a is b for a, b in zip(fused.parameters(), block.parameters()))
    x = torch.randn(2, 8, 6, 6)
    temb = None if BLOCKS[name].get("temb_channels", 12) is None else torch.randn(2, 12)
    with torch.no_grad():
        assert rel_err(fused(x, temb), block(x, temb)) <= 1e-5


def test_fused_resnet_block_training_dropout_and_grads_follow_original():
    block = _block(dropout=0.5).train()
    fused = FusedResnetBlock2D.from_module(block, backend="fused_triton")
    x, temb = torch.randn(2, 8, 6, 6), torch.randn(2, 12)
    torch.manual_seed(1)
    ref = block(x, temb)
    torch.manual_seed(1)
    out = fused(x, temb)
    assert torch.allclose(out, ref, atol=1e-6)
    out.sum().backward()  # autograd works (reference path)


def test_fused_resnet_refuses_other_activations():
    with pytest.raises(ValueError, match="SiLU"):
        FusedResnetBlock2D.from_module(_block(non_linearity="gelu"))


# --- the passes inside fastdiff.optimize ------------------------------------------------------------------
def small_unet():
    torch.manual_seed(0)
    return UNet2DConditionModel(
        block_out_channels=(16, 32),
        layers_per_block=1,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=16,
        attention_head_dim=8,
        norm_num_groups=8,
        sample_size=8,
        in_channels=4,
        out_channels=4,
    ).eval()


def _passes(rep):
    return {p.name: p for p in rep.passes}


@needs_triton
def test_optimize_with_forced_kernels_matches_and_restores(tmp_path):
    unet = small_unet()
    original = copy.deepcopy(unet)
    inputs = unet_probe_inputs(unet, size=8)
    with torch.no_grad():
        ref = original(**inputs).sample
    sd = {k: v.clone() for k, v in unet.state_dict().items()}
    fastdiff.optimize(  # verify=False: the probe would cost several interpreted forwards; compared below
        unet,
        winograd=True,
        verify=False,
        plan_cache_dir=str(tmp_path),
        extra={"fuse_norm_act_backend": "triton", "winograd_backend": "triton"},
    )
    passes = _passes(fastdiff.report(unet))
    assert passes["fuse_norm_act"].status == "applied"
    assert passes["winograd"].status == "applied"
    fused = [m for m in unet.modules() if isinstance(m, FusedResnetBlock2D)]
    assert len(fused) == sum(isinstance(m, ResnetBlock2D) for m in original.modules()) == 8
    assert isinstance(unet.conv_norm_out, GroupNormSiLU) and isinstance(unet.conv_act, nn.Identity)
    skipped = dict(passes["winograd"].skipped)
    assert "stride" in skipped["down_blocks.0.downsamplers.0.conv"]
    assert "1x1" in skipped["down_blocks.1.resnets.0.conv_shortcut"]
    new_sd = unet.state_dict()
    assert list(new_sd) == list(sd) and all(torch.equal(new_sd[k], sd[k]) for k in sd)
    with torch.no_grad():
        assert rel_err(unet(**inputs).sample, ref) <= 1e-5
    fastdiff.restore(unet)
    assert not any(isinstance(m, (WinogradConv2d, FusedResnetBlock2D)) for m in unet.modules())
    with torch.no_grad():
        assert torch.equal(unet(**inputs).sample, ref)


def test_optimize_auto_on_cpu_keeps_only_measured_winners(tmp_path):
    unet = small_unet()
    fastdiff.optimize(unet, plan_cache_dir=str(tmp_path))  # defaults: winograd="auto", fuse_norm_act=True
    passes = _passes(fastdiff.report(unet))
    assert passes["fuse_norm_act"].status == "nothing to do"
    assert "cpu" in passes["fuse_norm_act"].skipped[0][1]
    assert passes["winograd"].status == "applied"
    plans = [
        rec
        for detail in passes["winograd"].details.values()
        for rec in detail.get("plan", {}).values()
        if rec["source"] == "measured"
    ]
    assert plans, "the verification probe should have measured at least one shape"
    for rec in plans:  # a kept alternative won both timing rounds and matched native at that shape
        assert rec["choice"] in ("native", "winograd_torch")
        if rec["choice"] != "native":
            assert rec["verify"]["passed"]
            for times in (rec["times_ms"], rec["confirm_ms"]):
                assert times["winograd_torch"] < (1 - dispatch.DEFAULT_MARGIN) * times["native"]


def test_winograd_pass_under_peft_lora(tmp_path):
    peft = pytest.importorskip("peft")
    unet, twin = small_unet(), small_unet()
    fastdiff.optimize(unet, winograd=True, fuse_norm_act=False, plan_cache_dir=str(tmp_path), verify=False)
    cfg = dict(r=4, lora_alpha=4, target_modules=["conv1", "conv2"], init_lora_weights=False)
    torch.manual_seed(3)
    unet.add_adapter(peft.LoraConfig(**cfg))
    torch.manual_seed(3)
    twin.add_adapter(peft.LoraConfig(**cfg))
    inputs = unet_probe_inputs(unet, size=8)
    with torch.no_grad():
        assert rel_err(unet(**inputs).sample, twin(**inputs).sample) <= 1e-5
