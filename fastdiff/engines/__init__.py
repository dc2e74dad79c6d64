"""Compiled U-Net engines: ONNX export, timestep-aware INT8 calibration, ONNX Runtime and TensorRT.

Typical use::

    import fastdiff
    from fastdiff.engines import calibrate

    calib = calibrate(pipe, prompts, num_inference_steps=20, guidance_scale=7.5)
    engine = fastdiff.compile_engine(pipe, backend="onnxruntime", precision="int8", calibration=calib)
    print(engine.quality)           # SNR / cosine vs the PyTorch U-Net on held-back steps
    image = pipe(prompt).images[0]  # pipe.unet is now the engine
    fastdiff.restore(pipe)          # back to the PyTorch U-Net

Map: ``compile.py`` (cache key, build, quality gate, install/restore record) drives every backend;
``config.py`` its settings. A backend adds a runner (``runtime_<name>.py``: flat inputs in, torch
tensor out), its build (``openvino_build.py`` / ``runtime_trt.build_engine`` / ``_move_onnx``), an
entry in ``compile.PRECISIONS`` and ``_ARTIFACT``. Inputs are described once in
:mod:`fastdiff.unet_inputs`; records stream from disk via ``records.py``; CPU capabilities
(VNNI, bf16) are in ``cpu.py``.
"""

from .cache import EngineCache, cache_root
from .calibration import CalibrationData, UNetInputRecorder, calibrate, synthetic_inputs
from .compile import PRECISIONS, compile_engine, measure_quality
from .config import ExportConfig, GateConfig, QuantConfig, RuntimeConfig
from .export import FlatUNet, UNetSignature, export_onnx, unet_signature
from .module import EngineUNet
from .quality import QualityGateError, cosine_similarity, snr_db
from .quantization import DEFAULT_EXCLUDE, LEVELS, classify_nodes, qdq_summary, quantize, select_nodes
from .runtime_ort import OrtRunner
from .runtime_trt import build_engine as build_tensorrt_engine
from .runtime_trt import profile_shapes as tensorrt_profile_shapes
from .sensitivity import layer_sensitivity

__all__ = [
    "DEFAULT_EXCLUDE",
    "LEVELS",
    "PRECISIONS",
    "CalibrationData",
    "EngineCache",
    "EngineUNet",
    "ExportConfig",
    "GateConfig",
    "FlatUNet",
    "OrtRunner",
    "QualityGateError",
    "QuantConfig",
    "RuntimeConfig",
    "UNetInputRecorder",
    "UNetSignature",
    "build_tensorrt_engine",
    "cache_root",
    "calibrate",
    "classify_nodes",
    "compile_engine",
    "cosine_similarity",
    "export_onnx",
    "layer_sensitivity",
    "measure_quality",
    "qdq_summary",
    "quantize",
    "select_nodes",
    "snr_db",
    "synthetic_inputs",
    "tensorrt_profile_shapes",
    "unet_signature",
]
