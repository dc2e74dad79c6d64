"""``compile_engine``: export, (quantise,) build, verify and install an engine in place of ``pipe.unet``."""

from __future__ import annotations

import logging
import os
import re
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch

from . import export as _export
from . import quantization as _quantize
from .cache import EngineCache, library_versions, make_key, weights_fingerprint
from .calibration import CalibrationData, synthetic_inputs
from .module import EngineUNet
from .quality import QualityGateError, check_gate, compare_outputs

logger = logging.getLogger("fastdiff.engines")

PRECISIONS = {
    "onnxruntime": ("fp32", "int8"),
    "tensorrt": ("fp32", "fp16", "int8"),
    "openvino": ("fp32", "bf16", "int8", "mixed", "auto"),
}
_ARTIFACT = {"onnxruntime": "engine.onnx", "tensorrt": "engine.plan", "openvino": "engine.xml"}
_QUANTISED = ("int8", "mixed")
# Layers that stayed in high precision in a mixed/int8 OpenVINO build (an artifact of its cache entry).
_LAYERS_FILE = "layers.json"


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


@torch.no_grad()
def measure_quality(unet: torch.nn.Module, runner, inputs: CalibrationData) -> dict:
    """Compare ``runner`` with the PyTorch ``unet`` (float32) on every record of ``inputs``."""
    device = next(unet.parameters()).device
    dtype = next(unet.parameters()).dtype
    outs, refs = [], []
    signature = _export.unet_signature(unet)
    for record in inputs:
        out = runner(record).float().cpu()
        kwargs = signature.from_flat({k: v.to(device) for k, v in record.items()})
        kwargs = {
            k: v.to(dtype) if k in ("sample", "encoder_hidden_states") else v for k, v in kwargs.items()
        }
        if kwargs["added_cond_kwargs"] is not None:
            kwargs["added_cond_kwargs"]["text_embeds"] = kwargs["added_cond_kwargs"]["text_embeds"].to(dtype)
        ref = unet(**kwargs, return_dict=False)[0]
        outs.append(out)
        refs.append(ref.float().cpu())
    return compare_outputs(outs, refs)


def compile_engine(
    pipe_or_unet,
    backend: str = "onnxruntime",
    precision: str = "fp32",
    calibration: CalibrationData | None = None,
    cache_dir: str | os.PathLike | None = None,
    *,
    level: str = "conv+ffn+qkv",
    method: str = "percentile",
    exclude: Iterable[str] = _quantize.DEFAULT_EXCLUDE,
    percentile: float = 99.999,
    max_calibration_records: int | None = 64,
    holdout_every: int = 4,
    quality_inputs: CalibrationData | None = None,
    min_snr_db: float | None = 20.0,
    min_cosine: float | None = None,
    force: bool = False,
    opset: int = 17,
    dynamic: Sequence[str] = ("batch", "height", "width"),
    sample_shape: Sequence[int] | None = None,
    sequence_length: int | None = None,
    threads: int | None = None,
    use_cache: bool = True,
    trt_batch: tuple[int, int, int] = (1, 1, 8),
    trt_image_px: tuple[int, int, int] = (256, 512, 1024),
    install: bool = True,
    static: bool = True,
    smooth_quant: bool = True,
    min_group_snr_db: float = 30.0,
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
        level, method, exclude, percentile, max_calibration_records: see :func:`quantize`.
        quality_inputs: explicit inputs for the quality check (else held-back calibration records,
            else random inputs over the timestep range).
        min_snr_db, min_cosine: quality gate on the engine's output against the PyTorch U-Net.
            ``None`` disables a criterion.
        force: install even if the gate fails (the measured numbers are still logged).
        opset, dynamic, sample_shape: see :func:`export_onnx`.
        sequence_length: text tokens per prompt the engine is built for; default: from the
            calibration records, else the pipeline tokenizer's ``model_max_length``, else 77.
        threads: ONNX Runtime intra-op threads (default: all cores).
        use_cache: reuse/store engines in the cache; ``False`` builds in a temporary directory.
        trt_batch, trt_image_px: TensorRT optimisation profile (prompts, pixels) as (min, opt, max).
        install: replace ``pipe.unet`` with the engine.
        static: OpenVINO: compile per input shape (reshaped static model) instead of once with
            dynamic axes.
        smooth_quant: OpenVINO int8/mixed: SmoothQuant on MatMuls (NNCF, alpha 0.95).
        min_group_snr_db: OpenVINO "mixed": layer groups whose int8-alone SNR
            (:func:`layer_sensitivity`) is below this stay in high precision.

    OpenVINO precisions: "fp32", "bf16" (native only with AVX512-BF16/AMX), "int8" (NNCF on the
    calibration records), "mixed" (int8 minus the sensitive groups, which run at bf16 where the
    CPU has it, else fp32) and "auto": the first of mixed (if calibration is given), bf16 (if
    native here) and fp32 that passes the quality gate. ``engine.build_info["high_precision_layers"]``
    lists the weighted layers left unquantised.

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
    if calibration is not None and not isinstance(calibration, CalibrationData):
        raise TypeError(
            f"calibration must be CalibrationData (from calibrate()), got {type(calibration).__name__}"
        )
    if precision in _QUANTISED and calibration is None:
        raise ValueError(
            f"{precision} needs calibration data: "
            "calibration = fastdiff.engines.calibrate(pipe, prompts, num_inference_steps=20)"
        )
    if backend == "openvino":
        from . import runtime_ov

        runtime_ov.require_openvino("OpenVINO engines", nncf=precision in _QUANTISED)
        if precision == "auto":
            return _compile_auto(locals())
    elif backend == "tensorrt":
        from .._compat import require

        require("tensorrt", "TensorRT engines")
        from . import runtime_trt
    else:
        from .._compat import require

        require("onnxruntime", "ONNX Runtime engines")
    pipe, unet = _resolve(pipe_or_unet)
    signature = _export.unet_signature(unet)
    exclude = tuple([exclude] if isinstance(exclude, str) else exclude)

    calib_part = None
    if precision in _QUANTISED:
        calib_part, held = (
            calibration.split(holdout_every) if len(calibration) >= 2 else (calibration, calibration)
        )
    else:
        held = calibration
    if quality_inputs is not None:
        held = quality_inputs
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
        "config": dict(unet.config),
        "backend": backend,
        "precision": precision,
        "opset": opset,
        "dynamic": list(dynamic),
        "sample_shape": list(sample_shape) if sample_shape else None,
        "sequence_length": sequence_length,
        "versions": library_versions(backend),
    }
    if precision in _QUANTISED and backend == "openvino":
        parts["quant"] = {
            "exclude": list(exclude),
            "max_calibration_records": max_calibration_records,
            "calibration": calib_part.fingerprint(),
            "smooth_quant": smooth_quant,
            "min_group_snr_db": min_group_snr_db if precision == "mixed" else None,
            "nncf": library_versions("nncf").get("nncf"),
        }
    elif precision == "int8":
        parts["quant"] = {
            "level": level,
            "method": method,
            "exclude": list(exclude),
            "percentile": percentile,
            "max_calibration_records": max_calibration_records,
            "calibration": calib_part.fingerprint(),
            "symmetric": backend == "tensorrt",
            # u8 x s8 saturation without VNNI: the graph itself differs (7-bit weights).
            "reduce_range": backend == "onnxruntime" and _quantize.default_reduce_range("uint8"),
        }
    if backend == "tensorrt":
        trt_cfg = uses_cfg(calibration or quality_inputs, signature, pipe)
        parts["trt_profile"] = {"batch": list(trt_batch), "image_px": list(trt_image_px), "cfg": trt_cfg}
        parts["gpu"] = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    key = make_key(parts)
    quality_key = held.fingerprint()

    cache = EngineCache(cache_dir)
    meta = cache.lookup(key, parts) if use_cache else None
    cache_hit = meta is not None
    trt_cfg = parts.get("trt_profile", {}).get("cfg", True)
    tmp_root = None
    if cache_hit:
        entry = cache.entry_dir(key)
    else:
        if use_cache:
            entry = cache.staging_dir()
        else:
            import tempfile

            tmp_root = Path(tempfile.mkdtemp(prefix="fastdiff-engine-"))
            entry = tmp_root
        try:
            opts = dict(
                opset=opset,
                dynamic=dynamic,
                sample_shape=sample_shape,
                sequence_length=sequence_length,
                level=level,
                method=method,
                exclude=exclude,
                percentile=percentile,
                max_calibration_records=max_calibration_records,
                smooth_quant=smooth_quant,
                min_group_snr_db=min_group_snr_db,
                threads=threads,
                trt_batch=trt_batch,
                trt_image_px=trt_image_px,
                trt_cfg=trt_cfg,
                # Timing caches are per GPU model and TensorRT version.
                timing_cache=cache.root
                / f"tensorrt-timing-{make_key(parts.get('versions', {}) | {'gpu': parts.get('gpu')})[:12]}.cache"
                if use_cache and backend == "tensorrt"
                else None,
            )
            _build(unet, entry, backend, precision, calib_part, signature, opts)
        except BaseException:
            shutil.rmtree(entry, ignore_errors=True)
            raise
        if use_cache:
            meta = cache.commit(key, parts, entry)
            entry = cache.entry_dir(key)

    artifact = entry / _ARTIFACT[backend]
    try:
        if backend == "tensorrt":
            runner = runtime_trt.TrtRunner(
                artifact, device=unet.device if unet.device.type == "cuda" else "cuda"
            )
        elif backend == "openvino":
            hint = "bf16" if precision == "bf16" else "f32"
            if precision == "mixed":
                hint = runtime_ov.default_hint()
            runner = runtime_ov.OvRunner(
                artifact,
                hint=hint,
                static=static,
                threads=threads,
                blob_cache=cache.root / "openvino-blobs" if use_cache else None,
            )
        else:
            from .runtime_ort import OrtRunner

            runner = OrtRunner(artifact, threads=threads)
        layers_info = _read_layers(entry)
    finally:
        # Without the cache the build folder holds the whole model: the runner has loaded it, so go.
        if tmp_root is not None:
            shutil.rmtree(tmp_root, ignore_errors=True)
    if tmp_root is not None:
        artifact = None
    stored = (meta or {}).get("quality", {})
    if cache_hit and stored.get("inputs") == quality_key:
        quality = dict(stored["result"])
    else:
        quality = measure_quality(unet, runner, held)
        if use_cache:
            _store_quality(cache, key, parts, quality_key, quality)
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
    build_info = {"key": key, "entry": str(entry), "level": level if precision == "int8" else None}
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
    failure = check_gate(quality, min_snr_db, min_cosine)
    if failure and not force:
        raise QualityGateError(
            f"{backend}/{precision} engine rejected: {failure} (measured on {quality['inputs']}; "
            f"SNR {quality['snr_db']:.2f} dB, cosine {quality['cosine']:.6f}). Try a lower quantisation level, "
            "more exclusions, or pass force=True to install it anyway.",
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


def _read_layers(entry: Path) -> dict:
    import json

    path = entry / _LAYERS_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def uses_cfg(records: CalibrationData | None, signature, pipe=None) -> bool:
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


def _store_quality(cache: EngineCache, key: str, parts: dict, quality_key: str, quality: dict) -> None:
    import json

    meta_path = cache.entry_dir(key) / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["quality"] = {"inputs": quality_key, "result": quality}
    tmp = meta_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(meta, indent=2, sort_keys=True))
    os.replace(tmp, meta_path)


def _build(unet, entry: Path, backend, precision, calib_part, signature, opts) -> None:
    """Write the engine artifact for ``backend``/``precision`` into ``entry``."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="fastdiff-build-") as tmp:
        tmp = Path(tmp)
        # Known gap (#14): TensorRT int8 is built from an fp32 export, so under strong typing its
        # unquantised layers run in fp32. An fp16 export's Q/DQ pass selects no node yet.
        onnx_dtype = torch.float16 if precision == "fp16" else torch.float32
        fp_path = _export.export_onnx(
            unet,
            tmp / "unet.onnx",
            opset=opts["opset"],
            dynamic=opts["dynamic"],
            sample_shape=opts["sample_shape"],
            sequence_length=opts["sequence_length"],
            dtype=onnx_dtype,
        )
        model_path = fp_path
        if precision == "int8" and backend != "openvino":
            symmetric = backend == "tensorrt"  # TensorRT takes only zero-point-0 int8
            model_path = _quantize.quantize(
                fp_path,
                calib_part,
                level=opts["level"],
                method=opts["method"],
                exclude=opts["exclude"],
                percentile=opts["percentile"],
                max_calibration_records=opts["max_calibration_records"],
                activation_type="int8" if symmetric else "uint8",
                out_path=tmp / "unet.int8.onnx",
            )
        if backend == "onnxruntime":
            _move_onnx(model_path, entry / _ARTIFACT[backend])
        elif backend == "openvino":
            _build_openvino(fp_path, entry, precision, calib_part, opts)
        else:
            from . import runtime_trt

            shapes = runtime_trt.profile_shapes(
                signature,
                batch=opts["trt_batch"],
                image_px=opts["trt_image_px"],
                cfg=opts["trt_cfg"],
                sequence_length=opts["sequence_length"],
            )
            runtime_trt.build_engine(
                model_path,
                entry / _ARTIFACT[backend],
                shapes,
                timing_cache=opts["timing_cache"],
            )


def _move_onnx(src: Path, dst: Path) -> None:
    """Move a model and its external data file, rewriting the data location to the new name."""
    import onnx

    data = src.with_name(src.name + ".data")
    if not data.exists():
        shutil.move(str(src), str(dst))
        return
    model = onnx.load(str(src), load_external_data=True)
    onnx.save_model(
        model,
        str(dst),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=dst.name + ".data",
        size_threshold=1024,
    )


def _build_openvino(fp_path: Path, entry: Path, precision: str, calib_part, opts) -> None:
    """Convert (and for int8/mixed, quantise with NNCF on the records) into ``entry/engine.xml``."""
    import json

    from . import runtime_ov
    from .quantization import classify_nodes

    model = runtime_ov.convert(fp_path)
    if precision not in _QUANTISED:
        runtime_ov.save(model, entry / _ARTIFACT["openvino"])
        return
    keep = list(opts["exclude"])
    sensitivity = None
    records = calib_part
    if opts["max_calibration_records"] is not None:
        records = calib_part.subset(opts["max_calibration_records"])
    if precision == "mixed":
        from .sensitivity import layer_sensitivity

        fit, held = records.split(4) if len(records) >= 4 else (records, records)
        sensitivity = layer_sensitivity(
            fp_path, fit, held.subset(2), method="percentile", threads=opts["threads"]
        )
        weak = [r["group"] for r in sensitivity if r["snr_db"] < opts["min_group_snr_db"]]
        categories = classify_nodes(fp_path)
        keep += [f"^{re.escape(name)}(/|$)" for name, cat in categories.items() if cat in weak]
    quantised = runtime_ov.quantize(
        model,
        records.records,
        num_records=len(records),
        exclude=keep,
        smooth_quant=opts["smooth_quant"],
    )
    runtime_ov.save(quantised, entry / _ARTIFACT["openvino"])
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
    (entry / _LAYERS_FILE).write_text(json.dumps(layers, indent=1))


def _compile_auto(call: dict) -> EngineUNet:
    """OpenVINO "auto": the first precision, fastest first, that passes the quality gate here."""
    from . import runtime_ov

    candidates = (["mixed"] if call["calibration"] is not None else []) + (
        ["bf16"] if runtime_ov.openvino_has_bf16() else []
    )
    candidates.append("fp32")
    kwargs = {k: v for k, v in call.items() if k not in ("pipe_or_unet", "precision", "runtime_ov")}
    failures = []
    for i, precision in enumerate(candidates):
        last = i == len(candidates) - 1
        try:
            engine = compile_engine(call["pipe_or_unet"], precision=precision, **kwargs)
        except QualityGateError as e:
            failures.append(f"{precision}: {e}")
            if last:
                raise
            continue
        engine.build_info["auto_rejected"] = failures
        return engine
    raise AssertionError("unreachable")
