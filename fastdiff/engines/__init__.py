"""Compiled U-Net engines: ONNX export, timestep-aware INT8 calibration, ONNX Runtime, OpenVINO and TensorRT.

Typical use::

    import fastdiff
    from fastdiff.engines import calibrate

    calib = calibrate(pipe, prompts, num_inference_steps=20, guidance_scale=7.5)
    engine = fastdiff.compile_engine(pipe, backend="onnxruntime", precision="int8", calibration=calib)
    print(engine.quality)           # SNR / cosine vs the PyTorch U-Net on held-back steps
    image = pipe(prompt).images[0]  # pipe.unet is now the engine
    fastdiff.restore(pipe)          # back to the PyTorch U-Net

Map: ``compile.py`` (validation, cache key, load, quality gate, install/restore record) drives every
backend and ``build.py`` writes its artifact; ``config.py`` holds the settings. A backend adds a runner
(``runtime_<name>.py``: flat inputs in, torch tensor out, sharing ``runtime_common.py``), its build
(``openvino_build.py`` / ``runtime_trt.build_engine`` / ``build.move_onnx``) and an entry in
``compile.PRECISIONS`` and ``build.ARTIFACT``. Inputs are described once in :mod:`fastdiff.unet_inputs`;
records stream from disk via ``records.py``; ONNX Runtime's activation ranges are computed a group of
tensors at a time in ``ort_calibration.py`` (bounded memory); NNCF's statistics models are steered by
``nncf_folding.py`` (weight statistics folded, precision hint) and ``nncf_rows.py`` (a record's rows run apart,
their statistics combined); CPU capabilities (VNNI, bf16) are in ``cpu.py``.

Exported here is what a user calls; the building blocks (runners, cache, quantisation nodes,
TensorRT profiles) stay importable from their modules.
"""

from .calibration import CalibrationData, calibrate
from .compile import PRECISIONS, compile_engine
from .config import ExportConfig, GateConfig, QuantConfig, RuntimeConfig
from .export import export_onnx
from .module import EngineUNet
from .quality import QualityGateError
from .quantization import quantize
from .sensitivity import layer_sensitivity

__all__ = [
    "PRECISIONS",
    "CalibrationData",
    "EngineUNet",
    "ExportConfig",
    "GateConfig",
    "QualityGateError",
    "QuantConfig",
    "RuntimeConfig",
    "calibrate",
    "compile_engine",
    "export_onnx",
    "layer_sensitivity",
    "quantize",
]
