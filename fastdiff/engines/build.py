"""The build stage of :func:`compile_engine`: export to ONNX, quantise, write the backend's artifact.

``compile.py`` decides *whether* to build (cache key, lookup) and what to do with the result (gate,
install); this module only turns a U-Net into files in a cache entry folder.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import torch

from . import export as _export
from . import quantization as _quantize
from .config import ExportConfig, QuantConfig, RuntimeConfig

ARTIFACT = {"onnxruntime": "engine.onnx", "tensorrt": "engine.plan", "openvino": "engine.xml"}
QUANTISED = ("int8", "mixed")  # precisions that need calibration
# Layers that stayed in high precision in a mixed/int8 OpenVINO build (an artifact of its cache entry).
LAYERS_FILE = "layers.json"


@dataclasses.dataclass(frozen=True)
class BuildSpec:
    """Everything a build needs besides the model: the caller's configs plus what compile_engine derived."""

    quant: QuantConfig
    export: ExportConfig
    runtime: RuntimeConfig
    trt_cfg: bool
    timing_cache: Path | None


def build(unet, entry: Path, backend, precision, calib_part, signature, spec: BuildSpec) -> None:
    """Write the engine artifact for ``backend``/``precision`` into ``entry`` (a tqdm bar per stage)."""
    import tempfile

    from tqdm.auto import tqdm

    direct = False
    if backend == "openvino":
        from . import openvino_build  # it imports this module: not at the top

        direct = openvino_build.openvino_source(spec.export) == "pytorch"
    stages = ["convert" if direct else "export", *(["quantise"] if precision in QUANTISED else []), "build"]
    bar = tqdm(total=len(stages), desc=f"fastdiff {backend}/{precision}", unit="stage", leave=False)
    with bar, tempfile.TemporaryDirectory(prefix="fastdiff-build-") as tmp:
        tmp = Path(tmp)
        model = fp_path = None  # OpenVINO builds from one of them
        if direct:
            bar.set_postfix_str("convert")
            # Shares the U-Net's weights: no copy held.
            model = openvino_build.convert_pytorch(unet, signature, spec.export)
        else:
            bar.set_postfix_str("export")
            # Known gap (#14): TensorRT int8 is built from an fp32 export, so under strong typing its
            # unquantised layers run in fp32. An fp16 export's Q/DQ pass selects no node yet.
            fp_path = _export.export_onnx(
                unet,
                tmp / "unet.onnx",
                opset=spec.export.opset,
                dynamic=spec.export.dynamic,
                # TensorRT keeps the config's size: its export was never run on a GPU with another one.
                sample_shape=_export.trace_shape(signature, spec.export)
                if backend in ("openvino", "onnxruntime")
                else spec.export.sample_shape,
                sequence_length=spec.export.sequence_length,
                dtype=torch.float16 if precision == "fp16" else torch.float32,
            )
        bar.update()
        model_path = fp_path
        if precision == "int8" and backend != "openvino":
            bar.set_postfix_str("quantise")
            symmetric = backend == "tensorrt"  # TensorRT takes only zero-point-0 int8
            model_path = _quantize.quantize(
                fp_path,
                calib_part,
                level=spec.quant.level,
                method=spec.quant.method,
                exclude=spec.quant.exclude,
                percentile=spec.quant.percentile,
                max_calibration_records=spec.quant.max_calibration_records,
                calibration_memory_gb=spec.quant.calibration_memory_gb,
                activation_type="int8" if symmetric else "uint8",
                out_path=tmp / "unet.int8.onnx",
                weights=_export.weight_views(unet),  # calibrate on the caller's copy, not a second one
            )
            bar.update()
        bar.set_postfix_str(
            "build" if backend != "openvino" or precision not in QUANTISED else "quantise + build"
        )
        artifact = entry / ARTIFACT[backend]
        if backend == "onnxruntime":
            move_onnx(model_path, artifact)
        elif backend == "openvino":
            openvino_build.build_openvino(fp_path, artifact, precision, calib_part, spec, model=model)
        else:
            from . import runtime_trt

            shapes = runtime_trt.profile_shapes(
                signature,
                batch=spec.runtime.trt_batch,
                image_px=spec.runtime.trt_image_px,
                cfg=spec.trt_cfg,
                sequence_length=spec.export.sequence_length,
            )
            runtime_trt.build_engine(model_path, artifact, shapes, timing_cache=spec.timing_cache)
        bar.update(bar.total - bar.n)


def move_onnx(src: Path, dst: Path) -> None:
    """Move a model and its external data file, rewriting the data location to the new name."""
    if not _export.data_file(src).exists():
        shutil.move(str(src), str(dst))
        return
    _export.consolidate_onnx(src, dst)
