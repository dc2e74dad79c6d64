"""OpenVINO builds for :func:`compile_engine`: conversion, NNCF int8, sensitivity-chosen mixed precision, "auto".

Kept apart from ``compile.py`` (backend-neutral: cache, gate, install) so each backend's build
reads in one place. ``layers.json`` beside the model records which layers stayed unquantised.

fp32 and bf16 convert the PyTorch U-Net directly (``openvino.convert_model``, TorchScript tracing,
weights shared with the module): no ONNX file is written, checked and parsed again. So does int8:
an earlier profile (SmoothQuant on, fast bias correction, AVX2 machine) had NNCF quantise the PyTorch
frontend's graph about 1 dB worse than the ONNX one; with bias correction off both routes agree to
0.1 dB (SmoothQuant off on the full SD1.5 U-Net, on or off on fastdiff-tiny's trained one:
benchmarks/results/engines-cpu-int8-build-256-avx512.md, engines-tiny-int8-build-avx512.md), and
skipping the export saves 50-100 s of the build at 256^2. So does mixed, whose layer sensitivity runs on
OpenVINO itself (:mod:`fastdiff.engines.ov_sensitivity`). ``ExportConfig(openvino_source="onnx")`` takes the
ONNX export instead. Either way the graph is traced at a small latent when every
spatial axis stays dynamic (:func:`fastdiff.engines.export.trace_shape`).
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import statistics
from pathlib import Path
from time import perf_counter

import torch

from . import cpu, ov_sensitivity, runtime_ov
from .build import LAYERS_FILE, QUANTISED
from .cache import _write_json, cache_root, make_key
from .config import QuantConfig
from .export import OUTPUT_NAME, FlatUNet, _dynamic_axes, trace_shape, tracing
from .mapped import weight_files
from .quality import QualityGateError
from .time_features import TimeFeatures


def openvino_source(export) -> str:
    """What the build converts: ``export.openvino_source`` if set, else "pytorch"."""
    return export.openvino_source or "pytorch"


def convert_pytorch(unet: torch.nn.Module, signature, export):
    """``openvino.Model`` of ``unet`` with the flat signature of :mod:`fastdiff.engines.export`.

    The axes in ``export.dynamic`` stay dynamic (the others take :func:`trace_shape`'s sizes). A
    float32 CPU U-Net's weights are shared, not copied: the model is valid while ``unet`` lives (the
    build writes it to disk before returning); another device or dtype is converted from a float32
    CPU copy whose weights the model owns. Where the U-Net's time projection is diffusers'
    ``Timesteps``, the ``timestep`` input takes its float32 features instead (:mod:`.time_features`).
    """
    ov = runtime_ov.require_openvino()
    batch, _, height, width = trace_shape(signature, export)
    if batch < 1 or height < 1 or width < 1:
        raise ValueError(f"ExportConfig.sample_shape must be positive, got {export.sample_shape}")
    names = signature.input_names
    example = signature.example_inputs(
        batch, height, width, export.sequence_length or 77, generator=torch.Generator().manual_seed(0)
    )
    features = TimeFeatures.of(unet)
    if features is not None:  # the graph starts at the timestep's fp32 features (time_features.py)
        example = features.feed(example)
    axes = _dynamic_axes(signature, export.dynamic)
    shapes = [
        ov.PartialShape([-1 if i in axes.get(n, {}) else d for i, d in enumerate(example[n].shape)])
        for n in names
    ]
    with tracing(unet) as (module, copied):
        skip = features.traced_without(module) if features is not None else contextlib.nullcontext()
        with skip:
            model = ov.convert_model(
                _decoder(FlatUNet(module, signature), tuple(example[n] for n in names), shared=not copied),
                input=shapes,
            )
    if features is not None:
        features.tag(model)
    for name, p in zip(names, model.get_parameters()):
        p.set_friendly_name(name)
        p.output(0).get_tensor().set_names({name})
    model.outputs[0].get_tensor().set_names({OUTPUT_NAME})
    return model


def _decoder(module: torch.nn.Module, example: tuple, shared: bool):
    """OpenVINO's TorchScript decoder of ``module``, traced once: ``torch.jit.trace``'s default check
    traces the U-Net a second time and compares the two graphs (a quarter of the conversion time),
    and the frontend runs no check of its own. ``shared``: the model's constants alias the weights."""
    from openvino.frontend.pytorch.ts_decoder import TorchScriptPythonDecoder

    return TorchScriptPythonDecoder(
        module, example_input=example, shared_memory=shared, trace_kwargs={"check_trace": False}
    )


def build_openvino(
    onnx_path: Path | None, artifact: Path, precision: str, calib_part, spec, model=None
) -> None:
    """Write the float model (``model`` from :func:`convert_pytorch`, else converted from ``onnx_path``
    here) to ``artifact``, for int8/mixed quantised with NNCF on the records first (+ layers.json).

    The ONNX conversion happens here, not in the caller, so that this function holds the only
    reference to it and ``del`` frees it before NNCF runs."""
    if model is None:
        model = runtime_ov.convert(onnx_path)
    if precision not in QUANTISED:
        runtime_ov.save(model, artifact)
        return
    weights = ()
    if onnx_path is not None:
        # From ONNX, NNCF gets the model read back from an fp32 IR: its weights are then a read-only
        # memory map, whose pages are given back while the CPU plugin holds its packed copy
        # (mapped.py). From PyTorch the weights already are the U-Net's own memory.
        fp_ir = runtime_ov.save(model, onnx_path.with_name("fp32.xml"))
        del model
        model = runtime_ov.require_openvino().Core().read_model(str(fp_ir))
        weights = weight_files(fp_ir)
    records = calib_part.subset(spec.quant.max_calibration_records)
    hint = statistics_hint(spec.quant, spec.runtime, precision)
    sensitivity, held = None, ()
    if precision == "mixed":  # sensitivity judged on records the ranges were not fitted on
        records, held = records.split(4) if len(records) >= 4 else (records, records)
    quantised = runtime_ov.quantize(
        model,
        records.records,
        num_records=len(records),
        exclude=spec.quant.exclude,
        smooth_quant=spec.quant.smooth_quant,
        bias_correction=spec.quant.bias_correction,
        weights=weights,
        statistics_hint=hint,
        compress_weights=precision != "mixed",
        overflow_fix=overflow_fix(spec.quant),
        statistics_batch=spec.quant.statistics_batch,
        float_attention=attention_mode(spec.quant, spec.runtime, precision) == "float",
    )
    if precision == "mixed":
        sensitivity = ov_sensitivity.group_sensitivity(model, quantised, held.subset(2), hint)
        weak = [r["group"] for r in sensitivity if r["snr_db"] < spec.quant.min_group_snr_db]
        ov_sensitivity.mixed_model(quantised, weak)
    runtime_ov.save(quantised, artifact)
    int8 = runtime_ov.quantised_layers(quantised)
    weighted = [
        op.get_friendly_name()
        for op in quantised.get_ops()
        if op.get_type_name() in ("Convolution", "MatMul")
        and op.input_value(1).get_node().get_type_name() != "Parameter"
    ]
    layers = {
        # Module-path names (as in the ONNX graph) whichever way the model was converted.
        "high_precision_layers": sorted(runtime_ov.module_path_name(n) for n in weighted if n not in int8),
        "int8_layers": len(int8),
        "sensitivity": sensitivity,
    }
    (artifact.with_name(LAYERS_FILE)).write_text(json.dumps(layers, indent=1))


def overflow_fix(quant) -> str:
    """NNCF's OverflowFix for this build (``quant.overflow_fix`` resolved): "auto" is "enable" on a CPU
    without VNNI, whose u8 x s8 products saturate at int16 (7-bit weights keep them in range), and NNCF's
    own "first_layer_only" elsewhere. On the AVX2-only EPYC, "enable" against "first_layer_only": 35.9
    against 27.0 dB on fastdiff-tiny's trained U-Net, 26.5 against 17.9 dB on the full SD1.5 U-Net at
    256^2 (27.0 dB with VNNI), step time unchanged within noise (engines-{tiny,cpu}-int8-overflow-*avx2.md)."""
    if quant.overflow_fix != "auto":
        return quant.overflow_fix
    return "first_layer_only" if cpu.has_vnni() else "enable"


def attention_mode(quant, runtime, precision: str) -> str:
    """Whether attention's Q and K are quantised in this build (``quant.attention`` resolved): "auto" is
    "float" where the engine runs at the bf16 hint on a CPU with AMX, "int8" elsewhere. On an AMX Xeon
    OpenVINO's int8 attention at the bf16 hint broke fastdiff-tiny's trained U-Net: 17.9 dB per step
    (worst record 6.8 dB), 'all' accuracy 49.5 points below fp32 on 576 held-out images; with float
    attention at bf16, 31.0 dB and +0.7 points. On the AVX-512 EPYCs (no AMX) int8 attention at bf16 gives
    31.0 dB (engines-tiny-e2e-amx-576{,-attention}.md, engines-tiny-e2e-avx512-576.md)."""
    if quant.attention != "auto":
        return quant.attention
    return "float" if engine_hint(runtime, precision) == "bf16" and cpu.has_amx() else "int8"


def statistics_hint(quant, runtime, precision: str) -> str:
    """The inference precision NNCF's statistics models run at (``quant.statistics_hint`` resolved).

    "engine" is the hint the engine itself runs at (``runtime.hint``, else :func:`runtime_ov.hint_for`:
    bf16 where native): the ranges are then those of the activations the quantised engine computes."""
    if quant.statistics_hint != "engine":
        return quant.statistics_hint
    return engine_hint(runtime, precision)


def engine_hint(runtime, precision: str) -> str:
    """The hint the engine runs at: ``runtime.hint``, else :func:`runtime_ov.hint_for` (bf16 where native)."""
    return runtime.hint or runtime_ov.hint_for(precision)


def auto_candidates(calibrated: bool, native_bf16: bool) -> list[str]:
    """The precisions "auto" tries, fastest first, as measured on this project's CPUs.

    int8 (needs calibration records) is the fastest on the AVX512-BF16 machine: 3.97x eager against 3.22x
    for bf16 on the full SD1.5 U-Net at 256^2, 2.12x against 1.61x on fastdiff-tiny end to end
    (results/engines-cpu-sd15-256-avx512.md, engines-tiny-e2e-avx512-int8-bf16hint.md). Without VNNI (the
    AVX2-only machine) it is barely ahead of fp32 on the full SD1.5 U-Net (1.55x against 1.43x in one process,
    engines-cpu-sd15-256.md run 7) and behind it on fastdiff-tiny end to end (1.56x against 1.95x,
    engines-tiny-e2e-avx2-overflow.md), so there :func:`compile_auto` times its pick against fp32.
    mixed quantises a subset of int8's layers, so it follows int8; where bf16 is native, bf16 beat mixed
    (3.22x against 2.82x at 256^2; 1.80x against 1.19x on fastdiff-tiny) at a higher SNR, so mixed is
    tried only where bf16 would be emulated."""
    candidates = ["int8"] if calibrated else []
    if native_bf16:
        candidates.append("bf16")
    elif calibrated:
        candidates.append("mixed")
    return candidates + ["fp32"]


def races_fp32() -> bool:
    """Whether "auto" times its quantised pick against fp32: on CPUs without VNNI, where int8's lead
    depends on the U-Net (see :func:`auto_candidates`)."""
    return not cpu.has_vnni()


def step_seconds(engines: list, record: dict, reps: int = 3) -> dict[str, float]:
    """Median seconds of one engine step on ``record`` per precision: a warm-up call each, then ``reps``
    calls timed round-robin, so a change of machine load hits every engine alike."""
    times = {e.precision: [] for e in engines}
    for e in engines:
        e.runner(record)
    for _ in range(reps):
        for e in engines:
            start = perf_counter()
            e.runner(record)
            times[e.precision].append(perf_counter() - start)
    return {p: statistics.median(t) for p, t in times.items()}


def compile_auto(compile_engine, call: dict):
    """OpenVINO "auto": the first of :func:`auto_candidates` that passes the quality gate here; where
    :func:`races_fp32`, that engine or fp32, whichever runs a step faster (the race is stored in the cache)."""
    candidates = auto_candidates(call["calibration"] is not None, runtime_ov.openvino_has_bf16())
    params = set(inspect.signature(compile_engine).parameters) - {"pipe_or_unet", "precision"}
    kwargs = {k: v for k, v in call.items() if k in params}
    race = races_fp32() and candidates[0] != "fp32"
    # A float candidate is judged on the records a quantised one holds back (else on every record).
    calib, held = call["calibration"], {}
    if call["quality_inputs"] is None and calib is not None and len(calib) >= 2:
        held = {"quality_inputs": calib.split((call["quant"] or QuantConfig()).holdout_every)[1]}
    if race:  # install only the winner
        kwargs["install"] = False
    failures = []
    for i, precision in enumerate(candidates):
        last = i == len(candidates) - 1
        try:
            extra = {} if precision in QUANTISED else held
            engine = compile_engine(call["pipe_or_unet"], precision=precision, **{**kwargs, **extra})
        except QualityGateError as e:  # noqa: PERF203
            failures.append(f"{precision}: {e}")
            if last:
                raise
            continue
        if race and not last:
            fp32 = compile_engine(call["pipe_or_unet"], precision="fp32", **{**kwargs, **held})
            engine = _race(engine, fp32, call)
        engine.build_info["auto_rejected"] = failures
        if race and call["install"]:
            from .compile import _install, _resolve

            pipe, _ = _resolve(call["pipe_or_unet"])
            if pipe is not None:
                _install(pipe, engine)
        return engine
    raise AssertionError("unreachable")


def _race(quantised, fp32, call: dict):
    """The faster of two gate-passing engines, timed on one of the call's records (or the stored race)."""
    ident = [quantised.build_info["key"], fp32.build_info["key"], cpu.engine_flags(), os.cpu_count()]
    path = cache_root(call["cache_dir"]) / "auto-races" / f"{make_key({'race': ident})}.json"
    seconds, stored = None, False
    if call["use_cache"]:
        try:  # a missing or unreadable race is run (again), as an invalid cache entry is rebuilt
            seconds = json.loads(path.read_text())["seconds"]
            stored = {quantised.precision, "fp32"} == set(seconds)
        except (OSError, ValueError, KeyError, TypeError):
            pass
    if not stored:
        record = next(iter(call["quality_inputs"] or call["calibration"]))
        seconds = step_seconds([quantised, fp32], record)
        if call["use_cache"]:
            path.parent.mkdir(parents=True, exist_ok=True)
            _write_json(path, {"seconds": seconds, "engines": ident})
    winner = fp32 if seconds["fp32"] < seconds[quantised.precision] else quantised
    winner.build_info["auto_race"] = {"seconds": seconds, "stored": stored}
    return winner
