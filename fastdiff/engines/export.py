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

import contextlib
import copy
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


def weight_views(unet: nn.Module) -> dict:
    """The U-Net's float32 CPU parameters and buffers as numpy arrays sharing their memory, under the
    initializer names :func:`export_onnx` gives them (``FlatUNet`` holds the U-Net as ``unet``).

    ONNX Runtime calibration runs on these instead of mapping a second copy of the weights from the
    export's data file (:func:`~fastdiff.engines.ort_calibration.histogram_ranges` uses only those
    equal to the file's bytes: transposed or folded weights keep their own).
    """
    tensors = {**dict(unet.named_parameters()), **dict(unet.named_buffers())}
    return {
        f"unet.{name}": t.detach().numpy()
        for name, t in tensors.items()
        if t.dtype == torch.float32 and t.device.type == "cpu" and t.is_contiguous()
    }


def _dynamic_axes(signature: UNetSignature, dynamic: Sequence[str]) -> dict[str, dict[int, str]]:
    unknown = set(dynamic) - set(_VALID_DYNAMIC)
    if unknown:
        raise ValueError(f"unknown dynamic axes {sorted(unknown)}; valid: {list(_VALID_DYNAMIC)}")
    # The dimension each axis name stands for, per tensor (besides "batch", every tensor's first).
    spatial = {2: "height", 3: "width"}
    named = {"sample": spatial, OUTPUT_NAME: spatial, "encoder_hidden_states": {1: "sequence"}}
    axes = {
        name: {dim: axis for dim, axis in {0: "batch", **named.get(name, {})}.items() if axis in dynamic}
        for name in (*signature.input_names, OUTPUT_NAME)
    }
    return {k: v for k, v in axes.items() if v}


@contextlib.contextmanager
def tracing(unet: nn.Module, dtype: torch.dtype = torch.float32):
    """Yields ``(module, copied)`` to trace: ``unet`` itself when it is a ``dtype`` CPU module (in eval
    mode until the block ends, then its training flag is restored), else a ``dtype`` CPU copy (the
    caller's module stays untouched). Gradients are off and the tracer's warnings silenced inside."""
    param = next(unet.parameters())
    copied = param.device.type != "cpu" or param.dtype != dtype
    module = copy.deepcopy(unet).to("cpu", dtype) if copied else unet
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad(), warnings.catch_warnings():
            # the tracer's own warnings and torch.jit.trace's deprecation notice
            for category in (torch.jit.TracerWarning, DeprecationWarning, FutureWarning):
                warnings.simplefilter("ignore", category=category)
            yield module, copied
    finally:
        module.train(was_training)


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
    gen = torch.Generator().manual_seed(0)
    inputs = signature.example_inputs(batch, height, width, sequence_length, generator=gen)
    inputs = {k: v if k in FLOAT32_INPUTS else v.to(dtype) for k, v in inputs.items()}

    with tracing(unet, dtype) as (module, _), tempfile.TemporaryDirectory(prefix="fastdiff-export-") as tmp:
        weight_bytes = sum(t.numel() * t.element_size() for t in (*module.parameters(), *module.buffers()))
        if external_data is None:
            external_data = weight_bytes > _PROTOBUF_LIMIT_BYTES
        elif not external_data and weight_bytes > _PROTOBUF_LIMIT_BYTES:
            raise ValueError(
                f"external_data=False, but the weights take {weight_bytes / 2**30:.1f} GiB and one ONNX "
                "file holds at most 2 GiB: pass external_data=True or None"
            )
        # Export into a scratch directory: the TorchScript exporter writes one file per tensor
        # for big models; we consolidate them into a single side file below.
        raw = Path(tmp) / "raw.onnx"
        torch.onnx.export(
            FlatUNet(module, signature),
            tuple(inputs[n] for n in signature.input_names),
            str(raw),
            dynamo=False,
            opset_version=int(opset),
            input_names=list(signature.input_names),
            output_names=[OUTPUT_NAME],
            dynamic_axes=_dynamic_axes(signature, dynamic),
            do_constant_folding=True,
        )
        remove_model(path)
        if external_data:
            consolidate_onnx(raw, path)
        else:
            shutil.move(str(raw), str(path))
    if check:
        # The path form handles external data and models above 2 GB.
        onnx.checker.check_model(str(path))
    return path


def consolidate_onnx(src: Path, dst: Path, size_threshold: int = 1024) -> Path:
    """Write the model at ``src`` to ``dst`` with every initializer of at least ``size_threshold`` bytes
    in one ``<dst name>.data`` file beside it (the only external-data layout fastdiff writes or reads).

    ``src`` may keep its tensors inline, in one file per tensor (the TorchScript exporter's layout for
    models above 2 GB) or in one file. The bytes are copied file to file, tensor by tensor: only the
    graph is parsed. ``onnx.load`` + ``onnx.save`` held all of SD1.5's 3.4 GB of weights and took 20 s
    (8.6 s streamed: results/engines-cpu-build-profile-ort-int8-256-{lean,fast}.md).
    """
    import onnx
    from onnx.external_data_helper import ExternalDataInfo, uses_external_data

    src, dst = Path(src), Path(dst)
    location = data_file(dst).name
    if src.resolve() == dst.resolve():
        raise ValueError(
            f"consolidate_onnx writes a new model beside the old one: dst must not be src ({src})"
        )
    model = onnx.load(str(src), load_external_data=False)
    with open(data_file(dst), "wb") as out:
        for tensor, initializer in _all_tensors(model.graph):
            if uses_external_data(tensor):
                info = ExternalDataInfo(tensor)
                with open(src.parent / info.location, "rb") as f:
                    f.seek(info.offset or 0)
                    data = f.read() if info.length is None else f.read(info.length)
            elif initializer and tensor.HasField("raw_data") and len(tensor.raw_data) >= size_threshold:
                data = tensor.raw_data  # as onnx.save_model: inline attribute tensors stay inline
                tensor.ClearField("raw_data")
            else:
                continue
            offset = out.tell()
            out.write(data)
            del tensor.external_data[:]
            tensor.data_location = onnx.TensorProto.EXTERNAL
            for key, value in (("location", location), ("offset", offset), ("length", len(data))):
                entry = tensor.external_data.add()
                entry.key, entry.value = key, str(value)
    onnx.save_model(model, str(dst))
    return dst


def _all_tensors(graph):
    """(tensor, is an initializer) for every tensor of ``graph`` and its subgraphs."""
    for tensor in graph.initializer:
        yield tensor, True
    for node in graph.node:
        for attr in node.attribute:
            for tensor in (*([attr.t] if attr.HasField("t") else []), *attr.tensors):
                yield tensor, False
            if attr.HasField("g"):
                yield from _all_tensors(attr.g)
            for g in attr.graphs:
                yield from _all_tensors(g)


def data_file(model_path: Path) -> Path:
    """Where an ONNX model's external data lives: ``<name>.data`` beside it (see :func:`consolidate_onnx`)."""
    return model_path.with_name(model_path.name + ".data")


def remove_model(path: Path) -> None:
    """Delete the model at ``path`` and its data file, where they exist. Writing over them is not enough:
    onnx appends to an existing data file (offsets stay right, the file grows)."""
    for p in (path, data_file(path)):
        if p.exists():
            p.unlink() if p.is_file() else shutil.rmtree(p)
