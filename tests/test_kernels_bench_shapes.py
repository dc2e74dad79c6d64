"""benchmarks/kernel_speed.py derives the U-Net's conv/GroupNorm shapes from the architecture; check them against
the shapes a real diffusers UNet2DConditionModel (same block structure, narrow channels) actually sees."""

import importlib.util
from collections import Counter
from pathlib import Path

import pytest
import torch
from diffusers import UNet2DConditionModel

_spec = importlib.util.spec_from_file_location(
    "fastdiff_bench_kernels", Path(__file__).resolve().parents[1] / "benchmarks" / "kernel_speed.py"
)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

LAYOUTS = {
    "sd15": dict(
        block_out_channels=(32, 64, 128, 128),
        down_block_types=("CrossAttnDownBlock2D",) * 3 + ("DownBlock2D",),
        up_block_types=("UpBlock2D",) + ("CrossAttnUpBlock2D",) * 3,
    ),
    "sdxl": dict(
        block_out_channels=(32, 64, 128),
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
    ),
}


@pytest.mark.parametrize("arch", list(LAYOUTS))
def test_shape_enumeration_matches_a_real_unet(arch, monkeypatch):
    torch.manual_seed(0)
    cfg = LAYOUTS[arch]
    unet = UNet2DConditionModel(
        layers_per_block=2, cross_attention_dim=16, attention_head_dim=8, norm_num_groups=8, **cfg
    ).eval()
    convs, norms = Counter(), Counter()

    def hook(module, args, _out):
        x = args[0] if args else None
        if x is None or x.dim() != 4:
            return
        if isinstance(module, torch.nn.Conv2d) and module.kernel_size == (3, 3) and module.stride == (1, 1):
            convs[(x.shape[1], module.out_channels, x.shape[2])] += 1
        if type(module) is torch.nn.GroupNorm and not module.fastdiff_in_attention:
            norms[(x.shape[1], x.shape[2])] += 1

    for name, m in unet.named_modules():
        m.fastdiff_in_attention = "attentions" in name
        m.register_forward_hook(hook)
    with torch.no_grad():
        unet(torch.randn(1, 4, 16, 16), 10, torch.randn(1, 3, 16))
    monkeypatch.setitem(bench.ARCHS, "test", (cfg["block_out_channels"], 2, 8, 4))
    want_convs, want_norms = bench.unet_shapes("test", 16)
    assert convs == want_convs
    assert norms == want_norms
    # SD1.5: 49 Winograd-eligible convs and 45 GroupNorm->SiLU pairs (22 resnets x 2 + conv_norm_out)
    assert (sum(convs.values()), sum(norms.values())) == {"sd15": (49, 45), "sdxl": (38, 35)}[arch]
