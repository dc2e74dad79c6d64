"""``compile_engine``: validate, key, (build,) load, verify and install an engine in place of ``pipe.unet``.

The build itself is in ``build.py`` (export, quantise, backend artifact); OpenVINO specifics in
``openvino_build.py``, TensorRT's in ``runtime_trt.py``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

import torch

from .._compat import require
from . import export as _export
from . import quantization as _quantize
from .build import ARTIFACT, LAYERS_FILE, QUANTISED, BuildSpec, build
from .cache import EngineCache, check_verify, config_for_key, library_versions, make_key, weights_fingerprint
from .calibration import CalibrationData, synthetic_inputs
from .config import ExportConfig, GateConfig, QuantConfig, RuntimeConfig
from .module import EngineUNet
from .quality import QualityGateError, check_gate, measure_quality

logger = logging.getLogger("fastdiff.engines")

PRECISIONS = {
    "onnxruntime": ("fp32", "int8"),
    "tensorrt": ("fp32", "fp16", "int8"),
    "openvino": ("fp32", "bf16", "int8", "mixed", "auto"),
}


def _resolve(pipe_or_unet):
    """(pipe or None, PyTorch unet); an already-compiled pipe is compiled from its original U-Net."""
    unet = getattr(pipe_or_unet, "unet", None)
    pipe = pipe_or_unet if isinstance(unet, torch.nn.Module) else None
    unet = unet if pipe is not None else pipe_or_unet
    if isinstance(unet, EngineUNet):
        unet = unet.restore_target()
    if not isinstance(unet, torch.nn.Module) or not hasattr(unet, "config"):
        raise TypeError(
            f"compile_engine needs a diffusers pipeline with a .unet or a UNet2DConditionModel, "
            f"got {type(pipe_or_unet).__name__}"
        )
    return pipe, unet


def compile_engine(
    pipe_or_unet,
    backend: str = "onnxruntime",
    precision: str = "fp32",
    calibration: CalibrationData | None = None,
    cache_dir: str | os.PathLike | None = None,
    *,
    quant: QuantConfig | None = None,
    gate: GateConfig | None = None,
    export: ExportConfig | None = None,
    runtime: RuntimeConfig | None = None,
    quality_inputs: CalibrationData | None = None,
    use_cache: bool = True,
    verify: str = "stat",
    install: bool = True,
) -> EngineUNet:
    """Compile the pipeline's U-Net into an ONNX Runtime or TensorRT engine and (by default) install it.

    Args:
        pipe_or_unet: a diffusers pipeline (its ``unet`` is replaced) or a ``UNet2DConditionModel``.
        backend: "onnxruntime" (CPU) or "tensorrt" (CUDA; ``pip install 'fastdiff[tensorrt]'``).
        precision: "fp32" or "int8" for onnxruntime; "fp32", "fp16" or "int8" for tensorrt.
        calibration: recorded U-Net inputs from :func:`calibrate`. Required for int8: every
            ``holdout_every``-th record is held back to measure quality, the rest calibrate.
            For fp32/fp16 all records serve as quality inputs.
        cache_dir: engine cache root (default ``$FASTDIFF_CACHE_DIR/engines`` or ``~/.cache/fastdiff/engines``).
        quant: :class:`QuantConfig` (int8/mixed: level, calibration method, exclusions, hold-out).
        gate: :class:`GateConfig` (min_snr_db=20 dB, min_cosine, force).
        export: :class:`ExportConfig` (opset, dynamic axes, tracing shape, text length).
        runtime: :class:`RuntimeConfig` (threads, OpenVINO static shapes and inference hint, TensorRT profile).
        quality_inputs: explicit inputs for the quality check (else held-back calibration records,
            else random inputs over the timestep range).
        use_cache: reuse/store engines in the cache; ``False`` builds in a temporary directory.
        verify: how a cached engine's files are checked before use: "stat" (default) compares their
            size and mtime with those recorded at build time and re-hashes a file only when its mtime
            changed; "full" re-hashes every file (sha256; seconds for a multi-GB SD1.5 engine).
        install: replace ``pipe.unet`` with the engine.

    OpenVINO precisions: "fp32", "bf16" (native only with AVX512-BF16/AMX), "int8" (NNCF on the
    calibration records), "mixed" (int8 minus the sensitive groups, which run at bf16 where the
    CPU has it, else fp32) and "auto": the first of int8 (with calibration), bf16 (if native, else mixed
    with calibration) and fp32 that passes the gate (fastest first: :func:`.openvino_build.auto_candidates`;
    without VNNI timed against fp32, ``build_info["auto_race"]``). int8 and mixed run their
    unquantised layers at the bf16 hint where native (``engine.build_info["hint"]``).
    ``engine.build_info["high_precision_layers"]`` lists the weighted layers left unquantised.

    Returns the ``EngineUNet``; its ``quality`` dict holds the measured agreement.

    Raises:
        QualityGateError: the engine's SNR/cosine is below the thresholds and ``force`` is False.
    """
    if backend not in PRECISIONS:
        raise ValueError(f"unknown backend {backend!r}; valid: {list(PRECISIONS)}")
    if precision not in PRECISIONS[backend]:
        raise ValueError(
            f"backend {backend!r} supports precision {list(PRECISIONS[backend])}, got {precision!r}"
        )
    for name, value, kind in (
        ("quant", quant, QuantConfig),
        ("gate", gate, GateConfig),
        ("export", export, ExportConfig),
        ("runtime", runtime, RuntimeConfig),
    ):
        if value is not None and not isinstance(value, kind):
            raise TypeError(f"{name} must be a fastdiff.engines.{kind.__name__} or None, got {value!r}")
    check_verify(verify)
    for arg, data in (("calibration", calibration), ("quality_inputs", quality_inputs)):
        if data is not None and not isinstance(data, CalibrationData):
            raise TypeError(f"{arg} must be CalibrationData (from calibrate()), got {type(data).__name__}")
    if precision in QUANTISED and calibration is None:
        raise ValueError(
            f"{precision} needs calibration data: "
            "calibration = fastdiff.engines.calibrate(pipe, prompts, num_inference_steps=20)"
        )
    if backend == "openvino":
        from . import openvino_build, runtime_ov

        runtime_ov.require_openvino("OpenVINO engines", nncf=precision in QUANTISED)
        if precision == "auto":
            return openvino_build.compile_auto(compile_engine, locals())
    elif backend == "tensorrt":
        require("tensorrt", "TensorRT engines")
        from . import runtime_trt
    else:
        require("onnxruntime", "ONNX Runtime engines")
    pipe, unet = _resolve(pipe_or_unet)
    signature = _export.unet_signature(unet)
    for arg, data in (("calibration", calibration), ("quality_inputs", quality_inputs)):
        if data is not None and len(data):  # one calibrate() call records one U-Net's inputs: check one
            try:
                signature.check_flat(data.records[0])
            except ValueError as e:
                raise ValueError(
                    f"{arg} records were not recorded from this U-Net: {e}. Record them on this pipeline: "
                    "calibration = fastdiff.engines.calibrate(pipe, prompts)"
                ) from None
    quant, gate = quant or QuantConfig(), gate or GateConfig()
    export, runtime = export or ExportConfig(), runtime or RuntimeConfig()
    sequence_length = export.sequence_length

    held = calibration if quality_inputs is None else quality_inputs
    calib_part = calibration if precision in QUANTISED else None
    if calib_part is not None and quality_inputs is None and len(calibration) >= 2:  # hold back to judge
        calib_part, held = calibration.split(quant.holdout_every)
    if sequence_length is None:
        records = (calibration or quality_inputs or CalibrationData([])).records
        if records:
            sequence_length = int(records[0]["encoder_hidden_states"].shape[1])
        else:
            sequence_length = int(getattr(getattr(pipe, "tokenizer", None), "model_max_length", 77) or 77)
            sequence_length = sequence_length if sequence_length <= 4096 else 77  # "unlimited" sentinel
    if held is None:
        held = synthetic_inputs(unet, num=2, batch=2, sequence_length=sequence_length)

    parts = {
        "weights": weights_fingerprint(unet),
        "config": config_for_key(unet.config),
        "backend": backend,
        "precision": precision,
        "opset": export.opset,
        "dynamic": list(export.dynamic),
        "sample_shape": list(export.sample_shape) if export.sample_shape else None,
        "sequence_length": sequence_length,
        "versions": library_versions(backend),
    }
    if backend == "openvino":
        parts["openvino_source"] = openvino_build.openvino_source(export)  # graph details differ by route
        # the PyTorch route's graph starts at the timestep's float32 features (time_features.py)
        parts["time_features"] = parts["openvino_source"] == "pytorch"
    if precision in QUANTISED:  # int8 everywhere, mixed on OpenVINO
        parts["quant"] = {
            "exclude": list(quant.exclude),
            "max_calibration_records": quant.max_calibration_records,
            "calibration": calib_part.fingerprint(),
        }
        if backend == "openvino":
            parts["quant"] |= {
                "smooth_quant": quant.smooth_quant,
                "bias_correction": quant.bias_correction,
                "min_group_snr_db": quant.min_group_snr_db if precision == "mixed" else None,
                "statistics_hint": openvino_build.statistics_hint(quant, runtime, precision),
                # overflow_fix follows the CPU: the graph differs (7-bit weights)
                "overflow_fix": openvino_build.overflow_fix(quant),
                "statistics_batch": quant.statistics_batch,
                # attention follows the CPU (AMX) and the hint
                "attention": openvino_build.attention_mode(quant, runtime, precision),
                "nncf": library_versions("nncf").get("nncf"),
            }
        else:
            parts["quant"] |= {
                "level": quant.level,
                "method": quant.method,
                "percentile": quant.percentile,
                "symmetric": backend == "tensorrt",
                # u8 x s8 saturation without VNNI: the graph itself differs (7-bit weights).
                "reduce_range": backend == "onnxruntime" and _quantize.default_reduce_range("uint8"),
            }
    if backend == "tensorrt":
        parts["trt_profile"] = {
            "batch": list(runtime.trt_batch),
            "image_px": list(runtime.trt_image_px),
            "cfg": runtime_trt.uses_cfg(calibration or quality_inputs, signature, pipe),
        }
        parts["gpu"] = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    key = make_key(parts)

    cache = EngineCache(cache_dir)
    meta = cache.lookup(key, parts, verify) if use_cache else None
    cache_hit = meta is not None
    tmp_root = None
    if cache_hit:
        entry = cache.entry_dir(key)
    else:
        entry = cache.staging_dir() if use_cache else Path(tempfile.mkdtemp(prefix="fastdiff-engine-"))
        tmp_root = None if use_cache else entry
        try:
            spec = BuildSpec(
                quant=quant,
                export=dataclasses.replace(export, sequence_length=sequence_length),
                runtime=runtime,
                trt_cfg=parts["trt_profile"]["cfg"] if backend == "tensorrt" else True,
                # Timing caches are per GPU model and TensorRT version.
                timing_cache=cache.root
                / f"tensorrt-timing-{make_key(parts.get('versions', {}) | {'gpu': parts.get('gpu')})[:12]}.cache"
                if use_cache and backend == "tensorrt"
                else None,
            )
            build(unet, entry, backend, precision, calib_part, signature, spec)
        except BaseException:
            shutil.rmtree(entry, ignore_errors=True)
            raise
        if use_cache:
            meta = cache.commit(key, parts, entry)
            entry = cache.entry_dir(key)

    artifact = entry / ARTIFACT[backend]
    try:
        if backend == "tensorrt":
            runner = runtime_trt.TrtRunner(
                artifact, device=unet.device if unet.device.type == "cuda" else "cuda"
            )
        elif backend == "openvino":
            runner = runtime_ov.OvRunner(
                artifact,
                hint=openvino_build.engine_hint(runtime, precision),
                static=runtime.static,
                threads=runtime.threads,
                blob_cache=cache.root / "openvino-blobs",
                blob_cache_mode=runtime.blob_cache if use_cache else "off",
            )
        else:
            from .runtime_ort import OrtRunner

            runner = OrtRunner(artifact, threads=runtime.threads)
        layers_file = entry / LAYERS_FILE
        layers_info = json.loads(layers_file.read_text()) if layers_file.is_file() else {}
    finally:
        # Without the cache the build folder holds the whole model: the runner has loaded it, so go.
        if tmp_root is not None:
            shutil.rmtree(tmp_root, ignore_errors=True)
    if tmp_root is not None:
        artifact = None
    # The stored result holds for these inputs run at this inference hint (an OpenVINO int8/mixed
    # engine's hint follows the CPU: a cache folder may move to a machine without native bf16).
    quality_key = held.fingerprint() + (f"|hint={runner.hint}" if backend == "openvino" else "")
    stored = (meta or {}).get("quality", {})
    if cache_hit and stored.get("inputs") == quality_key:
        quality = dict(stored["result"])
    else:
        quality = measure_quality(unet, runner, held)
        if use_cache:
            cache.update_meta(key, quality={"inputs": quality_key, "result": quality})
    quality["inputs"] = "synthetic" if held.meta.get("synthetic") else f"{len(held)} held-back records"
    logger.info(
        "fastdiff engine %s/%s: SNR %.2f dB, cosine %.6f vs PyTorch U-Net (%s)%s",
        backend,
        precision,
        quality["snr_db"],
        quality["cosine"],
        quality["inputs"],
        " [cache hit]" if cache_hit else "",
    )
    build_info = {"key": key, "entry": str(entry), "level": quant.level if precision == "int8" else None}
    if backend == "openvino":
        resolved = {
            k: parts.get("quant", {}).get(k) for k in ("statistics_hint", "overflow_fix", "attention")
        }
        build_info.update(hint=runner.hint, blob_cache=runner.blob_cache_mode, **resolved)
    build_info.update(layers_info)
    engine = EngineUNet(
        runner,
        unet,
        signature,
        backend=backend,
        precision=precision,
        quality=quality,
        cache_hit=cache_hit,
        artifact=artifact,
        build_info=build_info,
    )
    failure = check_gate(quality, gate.min_snr_db, gate.min_cosine)
    if failure and not gate.force:
        raise QualityGateError(
            f"{backend}/{precision} engine rejected: {failure} (measured on {quality['inputs']}; "
            f"SNR {quality['snr_db']:.2f} dB, cosine {quality['cosine']:.6f}). Try a lower quantisation level, "
            "more exclusions, or pass gate=GateConfig(force=True) to install it anyway.",
            quality,
        )
    if failure:
        logger.warning(
            "installing %s/%s engine despite failing the quality gate: %s", backend, precision, failure
        )
    if pipe is not None and install:
        _install(pipe, engine)
    return engine


def _install(pipe, engine: EngineUNet) -> None:
    """Swap the engine in for ``pipe.unet`` and record how to undo it (``fastdiff.restore``)."""
    from .. import installed

    original = engine.restore_target()

    def undo():
        if pipe.unet is engine:
            pipe.unet = original

    pipe.unet = engine
    installed.record(pipe, "engine", undo, backend=engine.backend, precision=engine.precision)
