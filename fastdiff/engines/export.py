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

import dataclasses
import os
import shutil
import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

# Protobuf refuses messages >= 2 GiB; keep a margin for the graph itself.
_PROTOBUF_LIMIT_BYTES = 2**31 - 64 * 2**20

OUTPUT_NAME = "out_sample"
# Inputs that stay float32 in an fp16 export (diffusers casts their embeddings itself).
FLOAT32_INPUTS = ("timestep", "time_ids")
_VALID_DYNAMIC = ("batch", "height", "width", "sequence")


@dataclasses.dataclass(frozen=True)
class UNetSignature:
    """Shapes of the flat inputs an exported U-Net takes, read from its config."""

    in_channels: int
    out_channels: int
    sample_size: int
    cross_attention_dim: int
    text_embeds_dim: int | None = None  # SDXL pooled text embedding width
    time_ids_dim: int | None = None  # SDXL micro-conditioning (6 numbers)
    time_cond_dim: int | None = None  # LCM guidance embedding width

    @property
    def input_names(self) -> tuple[str, ...]:
        names = ["sample", "timestep", "encoder_hidden_states"]
        if self.time_cond_dim is not None:
            names.append("timestep_cond")
        if self.text_embeds_dim is not None:
            names += ["text_embeds", "time_ids"]
        return tuple(names)

    @property
    def is_sdxl(self) -> bool:
        return self.text_embeds_dim is not None

    def example_inputs(
        self, batch: int, height: int, width: int, sequence: int = 77, generator=None
    ) -> dict[str, torch.Tensor]:
        """Random inputs with realistic scales (unit latents, t in [0, 1000))."""
        g = generator
        inputs = {
            "sample": torch.randn(batch, self.in_channels, height, width, generator=g),
            "timestep": torch.full((batch,), 500.0),
            "encoder_hidden_states": torch.randn(batch, sequence, self.cross_attention_dim, generator=g),
        }
        if self.time_cond_dim is not None:
            inputs["timestep_cond"] = torch.randn(batch, self.time_cond_dim, generator=g)
        if self.text_embeds_dim is not None:
            inputs["text_embeds"] = torch.randn(batch, self.text_embeds_dim, generator=g)
            inputs["time_ids"] = torch.tensor(
                [[height * 8.0, width * 8.0, 0.0, 0.0, height * 8.0, width * 8.0]]
            )
            inputs["time_ids"] = inputs["time_ids"].expand(batch, -1).contiguous()
        return inputs


def unet_signature(unet: nn.Module) -> UNetSignature:
    """Read the flat input signature from a ``UNet2DConditionModel``'s config.

    Raises ``ValueError`` for conditioning the flat signature cannot express
    (class labels, image embeddings, ...).
    """
    config = getattr(unet, "config", None)
    if config is None or not hasattr(config, "in_channels"):
        raise TypeError(
            f"expected a diffusers UNet2DConditionModel (with a .config), got {type(unet).__name__}"
        )
    cross = config.cross_attention_dim
    if isinstance(cross, (list, tuple)):
        if len(set(cross)) != 1:
            raise ValueError(f"per-block cross_attention_dim {cross} is not supported by the engine export")
        cross = cross[0]
    if getattr(config, "class_embed_type", None) is not None or getattr(config, "num_class_embeds", None):
        raise ValueError("U-Nets with class-label conditioning are not supported by the engine export")
    add_type = getattr(config, "addition_embed_type", None)
    text_embeds_dim = time_ids_dim = None
    if add_type == "text_time":
        time_ids_dim = 6
        total = unet.add_embedding.linear_1.in_features
        text_embeds_dim = total - time_ids_dim * config.addition_time_embed_dim
    elif add_type is not None:
        raise ValueError(
            f"addition_embed_type={add_type!r} is not supported by the engine export (supported: None, 'text_time')"
        )
    return UNetSignature(
        in_channels=config.in_channels,
        out_channels=config.out_channels,
        sample_size=config.sample_size if isinstance(config.sample_size, int) else config.sample_size[0],
        cross_attention_dim=int(cross),
        text_embeds_dim=text_embeds_dim,
        time_ids_dim=time_ids_dim,
        time_cond_dim=getattr(config, "time_cond_proj_dim", None),
    )


class FlatUNet(nn.Module):
    """Wraps a U-Net so that every input is a positional tensor and the output is one tensor."""

    def __init__(self, unet: nn.Module, signature: UNetSignature):
        super().__init__()
        self.unet = unet
        self.signature = signature

    def forward(self, sample, timestep, encoder_hidden_states, *extra):
        extra = list(extra)
        timestep_cond = extra.pop(0) if self.signature.time_cond_dim is not None else None
        added = None
        if self.signature.is_sdxl:
            added = {"text_embeds": extra[0], "time_ids": extra[1]}
        return self.unet(
            sample,
            timestep,
            encoder_hidden_states,
            timestep_cond=timestep_cond,
            added_cond_kwargs=added,
            return_dict=False,
        )[0]


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
            if external_data:
                onnx.save_model(
                    model,
                    str(path),
                    save_as_external_data=True,
                    all_tensors_to_one_file=True,
                    location=path.name + ".data",
                    size_threshold=1024,
                )
            else:
                onnx.save_model(model, str(path))
    finally:
        if not moved and was_training:
            unet.train()
    if check:
        # The path form handles external data and models above 2 GB.
        onnx.checker.check_model(str(path))
    return path


def _remove_stale(path: Path) -> None:
    for p in (path, path.with_name(path.name + ".data")):
        if p.exists():
            p.unlink() if p.is_file() else shutil.rmtree(p)


def onnx_files(path: str | os.PathLike) -> list[Path]:
    """The model file plus its external data file, if any."""
    path = Path(path)
    files = [path]
    data = path.with_name(path.name + ".data")
    if data.exists():
        files.append(data)
    return files
