"""ONNX Runtime execution of an exported (optionally Q/DQ-quantised) U-Net."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from .._compat import require
from .runtime_common import check_threads, numpy_feed


class OrtRunner:
    """Runs the flat-signature ONNX U-Net; takes and returns torch tensors.

    CPU only in this build: inputs are moved to CPU float32 and the output comes back
    on the caller's device.
    """

    backend = "onnxruntime"

    def __init__(
        self,
        onnx_path: str | os.PathLike,
        *,
        providers: Sequence[str] | None = None,
        threads: int | None = None,
    ):
        threads = check_threads(threads)
        ort = require("onnxruntime", "ONNX Runtime engines")
        self.path = Path(onnx_path)
        providers = list(providers or ["CPUExecutionProvider"])
        available = ort.get_available_providers()
        missing = [p for p in providers if p not in available]
        if missing:
            raise ValueError(
                f"ONNX Runtime providers {missing} are not available here; available: {available}"
            )
        options = ort.SessionOptions()
        # ORT_ENABLE_ALL fuses Q/DQ pairs around Conv/MatMul into QLinearConv / MatMulInteger kernels.
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if threads is not None:
            options.intra_op_num_threads = threads
        self.session = ort.InferenceSession(str(self.path), sess_options=options, providers=providers)
        self.input_names = tuple(i.name for i in self.session.get_inputs())
        self.output_name = self.session.get_outputs()[0].name

    def __call__(self, inputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        (out,) = self.session.run([self.output_name], numpy_feed(inputs, self.input_names))
        return torch.from_numpy(out)
