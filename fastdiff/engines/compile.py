"""``compile_engine``: export, (quantise,) build, verify and install an engine in place of ``pipe.unet``."""

from __future__ import annotations

import logging
import os
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

PRECISIONS = {"onnxruntime": ("fp32", "int8"), "tensorrt": ("fp32", "fp16", "int8")}
_ARTIFACT = {"onnxruntime": "engine.onnx", "tensorrt": "engine.plan"}


def _resolve(pipe_or_unet):
    """(pipe or None, PyTorch unet); an already-compiled pipe is compiled from its original U-Net."""
    unet = getattr(pipe_or_unet, "unet", None)
    pipe = pipe_or_unet if isinstance(unet, torch.nn.Module) else None
    unet = unet if pipe is not None else pipe_or_unet
    unet = getattr(unet, "fastdiff_original_unet", unet)
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
    for record in inputs:
        out = runner(record).float().cpu()
        kwargs = {k: v.to(device) for k, v in record.items()}
        added = None
        if "text_embeds" in kwargs:
            added = {"text_embeds": kwargs.pop("text_embeds").to(dtype), "time_ids": kwargs.pop("time_ids")}
        ref = unet(
            kwargs.pop("sample").to(dtype),
            kwargs.pop("timestep"),
            kwargs.pop("encoder_hidden_states").to(dtype),
            timestep_cond=kwargs.pop("timestep_cond", None),
            added_cond_kwargs=added,
            return_dict=False,
        )[0]
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
    if precision == "int8" and calibration is None:
        raise ValueError(
            "int8 needs calibration data: calibration = fastdiff.engines.calibrate(pipe, prompts, num_inference_steps=20)"
        )
    if backend == "tensorrt":
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
    if precision == "int8":
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
    if precision == "int8":
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
        parts["trt_profile"] = {"batch": list(trt_batch), "image_px": list(trt_image_px)}
        parts["gpu"] = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    key = make_key(parts)
    quality_key = CalibrationData(list(held.records)).fingerprint()

    cache = EngineCache(cache_dir)
    meta = cache.lookup(key, parts) if use_cache else None
    cache_hit = meta is not None
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
                trt_batch=trt_batch,
                trt_image_px=trt_image_px,
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
    if backend == "tensorrt":
        runner = runtime_trt.TrtRunner(artifact, device=unet.device if unet.device.type == "cuda" else "cuda")
    else:
        from .runtime_ort import OrtRunner

        runner = OrtRunner(artifact, threads=threads)

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
        pipe.unet = engine
    return engine


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
        if precision == "int8":
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
        else:
            from . import runtime_trt

            shapes = runtime_trt.profile_shapes(
                signature,
                batch=opts["trt_batch"],
                image_px=opts["trt_image_px"],
                cfg=True,
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
