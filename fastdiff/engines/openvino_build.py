"""OpenVINO builds for :func:`compile_engine`: conversion, NNCF int8, sensitivity-chosen mixed precision, "auto".

Kept apart from ``compile.py`` (backend-neutral: cache, gate, install) so each backend's build
reads in one place. ``layers.json`` beside the model records which layers stayed unquantised.
"""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path

from . import runtime_ov
from .mapped import weight_files
from .quality import QualityGateError
from .quantization import classify_nodes
from .sensitivity import layer_sensitivity

QUANTISED = ("int8", "mixed")
LAYERS_FILE = "layers.json"


def build_openvino(fp_path: Path, artifact: Path, precision: str, calib_part, spec) -> None:
    """Convert (and for int8/mixed, quantise with NNCF on the records) into ``artifact`` (+ layers.json)."""

    model = runtime_ov.convert(fp_path)
    if precision not in QUANTISED:
        runtime_ov.save(model, artifact)
        return
    # NNCF gets the model read back from an fp32 IR: its weights are then a read-only memory map,
    # whose pages are given back while the CPU plugin holds its packed copy (see mapped.py).
    fp_ir = runtime_ov.save(model, fp_path.with_name("fp32.xml"))
    del model
    model = runtime_ov.require_openvino().Core().read_model(str(fp_ir))
    keep = list(spec.quant.exclude)
    sensitivity = None
    records = calib_part
    if spec.quant.max_calibration_records is not None:
        records = calib_part.subset(spec.quant.max_calibration_records)
    if precision == "mixed":
        fit, held = records.split(4) if len(records) >= 4 else (records, records)
        sensitivity = layer_sensitivity(
            fp_path, fit, held.subset(2), method="percentile", threads=spec.runtime.threads
        )
        weak = [r["group"] for r in sensitivity if r["snr_db"] < spec.quant.min_group_snr_db]
        categories = classify_nodes(fp_path)
        keep += [f"^{re.escape(name)}(/|$)" for name, cat in categories.items() if cat in weak]
    quantised = runtime_ov.quantize(
        model,
        records.records,
        num_records=len(records),
        exclude=keep,
        smooth_quant=spec.quant.smooth_quant,
        weights=weight_files(fp_ir),
    )
    runtime_ov.save(quantised, artifact)
    int8 = runtime_ov.quantised_layers(quantised)
    weighted = [
        op.get_friendly_name()
        for op in quantised.get_ops()
        if op.get_type_name() in ("Convolution", "MatMul")
        and op.input_value(1).get_node().get_type_name() != "Parameter"
    ]
    layers = {
        "high_precision_layers": sorted(n for n in weighted if n not in int8),
        "int8_layers": len(int8),
        "sensitivity": sensitivity,
    }
    (artifact.with_name(LAYERS_FILE)).write_text(json.dumps(layers, indent=1))


def compile_auto(compile_engine, call: dict):
    """OpenVINO "auto": the first precision, fastest first, that passes the quality gate here."""
    candidates = (["mixed"] if call["calibration"] is not None else []) + (
        ["bf16"] if runtime_ov.openvino_has_bf16() else []
    )
    candidates.append("fp32")
    params = set(inspect.signature(compile_engine).parameters) - {"pipe_or_unet", "precision"}
    kwargs = {k: v for k, v in call.items() if k in params}
    failures = []
    for i, precision in enumerate(candidates):
        last = i == len(candidates) - 1
        try:
            engine = compile_engine(call["pipe_or_unet"], precision=precision, **kwargs)
        except QualityGateError as e:  # noqa: PERF203
            failures.append(f"{precision}: {e}")
            if last:
                raise
            continue
        engine.build_info["auto_rejected"] = failures
        return engine
    raise AssertionError("unreachable")
