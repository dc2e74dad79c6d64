"""Export a diffusers U-Net to ONNX with a flat, engine-friendly signature.

The exported graph takes plain tensors only::

    sample                 (2B, C, H, W)  float32
    timestep               (2B,)          float32   (fractional timesteps allowed)
    encoder_hidden_states  (2B, S, D)     float32
    timestep_cond          (2B, Dc)       float32   only if config.time_cond_proj_dim (LCM)
    text_embeds            (2B, Dt)       float32   only for SDXL ("text_time" added cond)
    time_ids               (2B, 6)        float32   only for SDXL

and returns ``out_sample`` (2B, C, H, W), the noise (or v) prediction. "2B" is the
batch the U-Net sees, i.e. twice the prompt batch under classifier-free guidance.

This follows NVIDIA's diffusion demo: TorchScript-based ``torch.onnx.export``
(``dynamo=False``), opset 17-19, dynamic batch/height/width axes. Models whose
weights exceed the 2 GB protobuf limit are written with one external data file.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from ..unet_inputs import UNetSignature, unet_signature

# Protobuf refuses messages >= 2 GiB; keep a margin for the graph itself.
_PROTOBUF_LIMIT_BYTES = 2**31 - 64 * 2**20

OUTPUT_NAME = "out_sample"
# Inputs that stay float32 in an fp16 export (diffusers casts their embeddings itself).
FLOAT32_INPUTS = ("timestep", "time_ids")
_VALID_DYNAMIC = ("batch", "height", "width", "sequence")


class FlatUNet(nn.Module):
    """Wraps a U-Net so that every input is a positional tensor and the output is one tensor."""

    def __init__(self, unet: nn.Module, signature: UNetSignature):
        super().__init__()
        self.unet = unet
        self.signature = signature

    def forward(self, *flat):
        kwargs = self.signature.from_flat(dict(zip(self.signature.input_names, flat)))
        return self.unet(**kwargs, return_dict=False)[0]


def _dynamic_axes(signature: UNetSignature, dynamic: Sequence[str]) -> dict[str, dict[int, str]]:
    unknown = set(dynamic) - set(_VALID_DYNAMIC)
    if unknown:
        raise ValueError(f"unknown dynamic axes {sorted(unknown)}; valid: {list(_VALID_DYNAMIC)}")
    axes: dict[str, dict[int, str]] = {name: {} for name in (*signature.input_names, OUTPUT_NAME)}
    for name in axes:
        if "batch" in dynamic:
            axes[name][0] = "batch"
        if name in ("sample", OUTPUT_NAME):
            if "height" in dynamic:
                axes[name][2] = "height"
            if "width" in dynamic:
                axes[name][3] = "width"
        if name == "encoder_hidden_states" and "sequence" in dynamic:
            axes[name][1] = "sequence"
    return {k: v for k, v in axes.items() if v}


def parameter_bytes(module: nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in (*module.parameters(), *module.buffers()))


def trace_shape(signature, export) -> tuple[int, int, int, int]:
    """(batch, C, H, W) to trace at for an OpenVINO or ONNX Runtime build: ``export.sample_shape``,
    else, when batch, height and width all stay dynamic, the smallest latent every level divides
    (2^(levels-1)): the traced graph is the same and the tracing forward pass sees 1/64 of the pixels
    of SD1.5's 64x64 (3.5 s instead of 12.9 s, though the whole ONNX export took about 50 s either way:
    benchmarks/results/engines-cpu-build-profile-ort-int8*.md); else the config's size (the frozen axes
    take it, as in the ONNX export)."""
    if export.sample_shape is not None:
        return tuple(int(s) for s in export.sample_shape)
    if {"batch", "height", "width"} <= set(export.dynamic):
        side = 2 ** max(signature.num_levels - 1, 0)
    else:
        side = signature.sample_size
    return (2, signature.in_channels, side, side)


def export_onnx(
    unet: nn.Module,
    path: str | os.PathLike,
    *,
    opset: int = 17,
    dynamic: Sequence[str] = ("batch", "height", "width"),
    sample_shape: Sequence[int] | None = None,
    sequence_length: int = 77,
    external_data: bool | None = None,
    check: bool = True,
    dtype: torch.dtype = torch.float32,
) -> Path:
    """Export ``unet`` to ``path`` as a float32 ONNX graph with the flat signature above.

    Args:
        unet: a diffusers ``UNet2DConditionModel`` (any device/dtype; exported in float32 on CPU).
        path: output ``.onnx`` file; external weights go next to it as ``<name>.data``.
        opset: ONNX opset, 17-19 (TensorRT 10 and ONNX Runtime both run these).
        dynamic: which axes stay symbolic: any of "batch", "height", "width", "sequence".
        sample_shape: (batch, channels, height, width) of the tracing input; defaults to
            (2, in_channels, sample_size, sample_size). Non-dynamic axes are frozen to it.
        sequence_length: text tokens of the tracing ``encoder_hidden_states``.
        external_data: store weights in a side file; ``None`` decides by size (> 2 GB).
        check: run ``onnx.checker`` on the result.
        dtype: ``torch.float32`` (default) or ``torch.float16`` (for TensorRT's strongly typed fp16
            networks). ``timestep`` and ``time_ids`` stay float32 either way.

    Returns the path of the written model.
    """
    import onnx

    if dtype not in (torch.float32, torch.float16):
        raise ValueError(f"dtype must be torch.float32 or torch.float16, got {dtype}")
    if not 17 <= int(opset) <= 21:
        raise ValueError(f"opset must be between 17 and 21, got {opset}")
    if isinstance(dynamic, str):
        dynamic = (dynamic,)
    signature = unet_signature(unet)
    if sample_shape is None:
        sample_shape = (2, signature.in_channels, signature.sample_size, signature.sample_size)
    if len(sample_shape) != 4 or sample_shape[1] != signature.in_channels:
        raise ValueError(
            f"sample_shape must be (batch, {signature.in_channels}, height, width), got {tuple(sample_shape)}"
        )
    batch, _, height, width = (int(s) for s in sample_shape)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)

    # Export a float32 CPU copy only if needed: the caller's module stays untouched.
    original_param = next(unet.parameters())
    moved = original_param.device.type != "cpu" or original_param.dtype != dtype
    if moved:
        import copy

        unet = copy.deepcopy(unet).to("cpu", dtype)
    was_training = unet.training
    unet.eval()
    wrapper = FlatUNet(unet, signature)
    gen = torch.Generator().manual_seed(0)
    inputs = signature.example_inputs(batch, height, width, sequence_length, generator=gen)
    inputs = {k: v if k in FLOAT32_INPUTS else v.to(dtype) for k, v in inputs.items()}
    if external_data is None:
        external_data = parameter_bytes(unet) > _PROTOBUF_LIMIT_BYTES

    try:
        with tempfile.TemporaryDirectory(prefix="fastdiff-export-") as tmp:
            # Export into a scratch directory: the TorchScript exporter writes one file per tensor
            # for big models; we consolidate them into a single side file below.
            raw = Path(tmp) / "raw.onnx"
            with torch.no_grad(), warnings.catch_warnings():
                warnings.simplefilter("ignore", category=torch.jit.TracerWarning)
                warnings.simplefilter("ignore", category=DeprecationWarning)
                warnings.simplefilter("ignore", category=FutureWarning)
                torch.onnx.export(
                    wrapper,
                    tuple(inputs[n] for n in signature.input_names),
                    str(raw),
                    dynamo=False,
                    opset_version=int(opset),
                    input_names=list(signature.input_names),
                    output_names=[OUTPUT_NAME],
                    dynamic_axes=_dynamic_axes(signature, dynamic),
                    do_constant_folding=True,
                )
            model = onnx.load(str(raw), load_external_data=True)
            _remove_stale(path)
            save_onnx(model, path, external_data)
    finally:
        if not moved and was_training:
            unet.train()
    if check:
        # The path form handles external data and models above 2 GB.
        onnx.checker.check_model(str(path))
    return path


def save_onnx(model, path: Path, external_data: bool) -> Path:
    """Write ``model`` to ``path``; with ``external_data`` every tensor above 1 KB goes to one
    ``<name>.data`` file beside it (the only external-data layout fastdiff writes or reads)."""
    import onnx

    if not external_data:
        onnx.save_model(model, str(path))
        return path
    onnx.save_model(
        model,
        str(path),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=path.name + ".data",
        size_threshold=1024,
    )
    return path


def _remove_stale(path: Path) -> None:
    for p in (path, path.with_name(path.name + ".data")):
        if p.exists():
            p.unlink() if p.is_file() else shutil.rmtree(p)
