"""TensorRT 10 build and runtime for the exported U-Net.

The network is created *strongly typed* (``NetworkDefinitionCreationFlag.STRONGLY_TYPED``):
layer precisions come from the ONNX tensor types, not from builder flags. So

* ``fp16`` engines are built from an fp16 ONNX export (:func:`export_onnx` with ``dtype=torch.float16``);
* ``int8`` engines are built from an explicit Q/DQ graph (:func:`quantize` with symmetric int8
  activations and weights, as TensorRT requires) of an fp32 export: layers left unquantised
  run in fp32 (building from an fp16 export is an open item of #14).

Tested here without TensorRT: profile shapes, the cfg choice, the out-of-profile error (with a
stand-in execution context). ``build_engine`` and ``TrtRunner.__call__``
have never executed in fastdiff's CI or on a machine of this project (no GPU, no tensorrt); the
code follows the documented TensorRT 10 Python API.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import torch

from .._compat import require
from .export import UNetSignature


def profile_shapes(
    signature: UNetSignature,
    *,
    batch: tuple[int, int, int] = (1, 1, 8),
    image_px: tuple[int, int, int] = (256, 512, 1024),
    cfg: bool = True,
    vae_scale_factor: int = 8,
    sequence_length: int = 77,
) -> dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]:
    """(min, opt, max) shape of every engine input for one optimisation profile.

    ``batch`` counts prompts; with ``cfg`` the U-Net sees twice as many rows.
    ``image_px`` is the square image side in pixels; latents are ``image_px / vae_scale_factor``.
    Height and width share one range, so non-square images inside it are covered too.
    """
    if not (1 <= batch[0] <= batch[1] <= batch[2]):
        raise ValueError(f"batch must be (min, opt, max) with 1 <= min <= opt <= max, got {batch}")
    if not (image_px[0] <= image_px[1] <= image_px[2]) or any(p % vae_scale_factor for p in image_px):
        raise ValueError(
            f"image_px must be (min, opt, max) ascending multiples of {vae_scale_factor}, got {image_px}"
        )
    mult = 2 if cfg else 1
    b = [n * mult for n in batch]
    lat = [p // vae_scale_factor for p in image_px]
    shapes = {
        "sample": tuple((bi, signature.in_channels, li, li) for bi, li in zip(b, lat)),
        "timestep": tuple((bi,) for bi in b),
        "encoder_hidden_states": tuple((bi, sequence_length, signature.cross_attention_dim) for bi in b),
    }
    if signature.time_cond_dim is not None:
        shapes["timestep_cond"] = tuple((bi, signature.time_cond_dim) for bi in b)
    if signature.is_sdxl:
        shapes["text_embeds"] = tuple((bi, signature.text_embeds_dim) for bi in b)
        shapes["time_ids"] = tuple((bi, signature.time_ids_dim) for bi in b)
    return shapes


def build_engine(
    onnx_path: str | os.PathLike,
    plan_path: str | os.PathLike,
    shapes: Mapping[str, tuple],
    *,
    timing_cache: str | os.PathLike | None = None,
    workspace_bytes: int | None = None,
) -> Path:
    """Parse ``onnx_path`` into a strongly typed network, build it for ``shapes`` and write the plan."""
    trt = require("tensorrt", "TensorRT engines")
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):  # resolves external data next to the file
        errors = "\n".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise RuntimeError(f"TensorRT could not parse {onnx_path}:\n{errors}")

    config = builder.create_builder_config()
    if workspace_bytes is not None:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(workspace_bytes))
    profile = builder.create_optimization_profile()
    names = {network.get_input(i).name for i in range(network.num_inputs)}
    if set(shapes) != names:
        raise ValueError(f"profile covers inputs {sorted(shapes)}, the network has {sorted(names)}")
    for name, (lo, opt, hi) in shapes.items():
        profile.set_shape(name, lo, opt, hi)
    config.add_optimization_profile(profile)

    cache_bytes = b""
    if timing_cache is not None and Path(timing_cache).is_file():
        cache_bytes = Path(timing_cache).read_bytes()
    cache = config.create_timing_cache(cache_bytes)
    config.set_timing_cache(cache, ignore_mismatch=False)

    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise RuntimeError(
            f"TensorRT failed to build an engine from {onnx_path} (see the TensorRT log above)"
        )
    plan_path = Path(plan_path)
    plan_path.write_bytes(bytes(plan))
    if timing_cache is not None:
        Path(timing_cache).write_bytes(bytes(config.get_timing_cache().serialize()))
    return plan_path


class TrtRunner:
    """Runs a serialised TensorRT plan on CUDA tensors (TensorRT 10 name-based I/O)."""

    backend = "tensorrt"

    def __init__(self, plan_path: str | os.PathLike, device: str | torch.device = "cuda"):
        trt = require("tensorrt", "TensorRT engines")
        if not torch.cuda.is_available():
            raise RuntimeError("TensorRT engines need a CUDA GPU, and torch.cuda.is_available() is False")
        self.trt = trt
        self.device = torch.device(device)
        self.runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
        self.engine = self.runtime.deserialize_cuda_engine(Path(plan_path).read_bytes())
        if self.engine is None:
            raise RuntimeError(
                f"TensorRT could not deserialise {plan_path} (built with another TensorRT or GPU?)"
            )
        self.context = self.engine.create_execution_context()
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        mode = trt.TensorIOMode.INPUT
        self.input_names = tuple(n for n in names if self.engine.get_tensor_mode(n) == mode)
        self.output_name = next(n for n in names if self.engine.get_tensor_mode(n) != mode)

    def _set_shape(self, name: str, shape: tuple[int, ...]) -> None:
        """Bind ``shape`` to input ``name``; a shape outside the build profile is a clear error.

        TensorRT's ``set_input_shape`` returns False (and logs) instead of raising; ignoring it
        ran the engine on stale shapes.
        """
        if not self.context.set_input_shape(name, shape):
            lo, _, hi = self.engine.get_tensor_profile_shape(name, 0)
            raise ValueError(
                f"input {name!r} has shape {shape}, outside the engine's optimisation profile "
                f"(min {tuple(lo)}, max {tuple(hi)}); rebuild with compile_engine(..., trt_batch=..., "
                "trt_image_px=...) covering it"
            )

    def _torch_dtype(self, name: str) -> torch.dtype:
        dt = self.engine.get_tensor_dtype(name)
        table = {self.trt.float32: torch.float32, self.trt.float16: torch.float16}
        if hasattr(self.trt, "bfloat16"):
            table[self.trt.bfloat16] = torch.bfloat16
        return table[dt]

    def __call__(self, inputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        stream = torch.cuda.current_stream(self.device)
        keep = []
        for name in self.input_names:
            t = inputs[name].to(self.device, self._torch_dtype(name)).contiguous()
            keep.append(t)
            self._set_shape(name, tuple(t.shape))
            self.context.set_tensor_address(name, t.data_ptr())
        out_shape = tuple(self.context.get_tensor_shape(self.output_name))
        out = torch.empty(out_shape, dtype=self._torch_dtype(self.output_name), device=self.device)
        self.context.set_tensor_address(self.output_name, out.data_ptr())
        if not self.context.execute_async_v3(stream.cuda_stream):
            raise RuntimeError("TensorRT execute_async_v3 failed")
        return out


def uses_cfg(records, signature, pipe=None) -> bool:
    """Whether the U-Net sees classifier-free-guidance pairs (twice the prompt batch).

    From the recorded runs when there are any (their guidance scale), else: not for U-Nets with
    guidance embedded (LCM's ``time_cond_proj_dim``) or pipelines whose default guidance is <= 1,
    else yes (Stable Diffusion's default guidance is 7.5). A wrong True made batch-1 inputs fall
    outside the TensorRT profile.
    """
    if records is not None and "guidance_scale" in records.meta:
        return float(records.meta["guidance_scale"]) > 1.0 and signature.time_cond_dim is None
    if signature.time_cond_dim is not None:
        return False
    guidance = getattr(pipe, "_guidance_scale", None)
    return guidance is None or float(guidance) > 1.0
