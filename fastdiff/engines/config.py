"""Settings of :func:`compile_engine`, grouped by the stage they steer (defaults are the recommended ones)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from fastdiff._checks import check_choice, check_count, is_number

from .quantization import DEFAULT_EXCLUDE
from .runtime_common import check_threads
from .runtime_ov import BIAS_CORRECTIONS, BLOB_CACHE_MODES, OVERFLOW_FIXES, STATISTICS_BATCH

STATISTICS_HINTS = ("engine", "f32", "bf16")  # QuantConfig.statistics_hint
ATTENTION_MODES = ("auto", "int8", "float")  # QuantConfig.attention


@dataclasses.dataclass(frozen=True)
class QuantConfig:
    """int8 / mixed builds: what is quantised and how activation ranges are calibrated.

    level, method, exclude, percentile: see :func:`fastdiff.engines.quantize` (ONNX Runtime and
    TensorRT; OpenVINO uses ``exclude`` as its ignored scope). max_calibration_records: records
    spread over the timesteps that calibrate. holdout_every: every n-th record is held back to judge
    quality. smooth_quant: OpenVINO, SmoothQuant on MatMuls (NNCF, alpha 0.95). bias_correction:
    OpenVINO, NNCF's bias correction after min-max ("fast", "full" or "none"). min_group_snr_db:
    OpenVINO "mixed", groups whose int8-alone SNR is below it stay in high precision. statistics_hint:
    OpenVINO, the inference precision NNCF's statistics models run at: "engine" (the engine's own hint,
    bf16 where the CPU has it natively, see :func:`fastdiff.engines.openvino_build.statistics_hint`),
    "f32" (NNCF's default) or "bf16". overflow_fix: OpenVINO, which layers' int8 weights use half the
    range, NNCF's OverflowFix ("enable", "first_layer_only", "disable") or "auto": "enable" on CPUs without
    VNNI, NNCF's "first_layer_only" elsewhere (:func:`fastdiff.engines.openvino_build.overflow_fix`).
    statistics_batch: OpenVINO, how many rows of a record NNCF's statistics models run at once (1, the
    default: each image of a guidance pair on its own; None: whole records). NNCF still gets each record's
    own statistics, combined from the rows' (:mod:`fastdiff.engines.nncf_rows`), so the ranges are those of
    whole records; only the activations held at once shrink.
    attention: OpenVINO, whether NNCF quantises the Q and K inputs of attention (ScaledDotProductAttention):
    "int8", "float", or "auto": "float" where the engine runs at the bf16 hint on a CPU with AMX, "int8"
    elsewhere (:func:`fastdiff.engines.openvino_build.attention_mode`).
    calibration_memory_gb: ONNX Runtime percentile/entropy calibration (int8 and
    :func:`fastdiff.engines.layer_sensitivity`), about how many GB of one record's activations are alive at once: the tensors are
    calibrated in groups that fit (:mod:`fastdiff.engines.ort_calibration`; ORT's ranges exactly).

    OpenVINO defaults: SmoothQuant on, no bias correction. Dropping bias correction changed the SNR by
    under 0.1 dB on the random-weight SD1.5 U-Net and raised it by 0.1 dB on fastdiff-tiny's trained one;
    it costs one sub-model compile per layer (~26 s of the full SD1.5 U-Net's build at 256^2). ``smooth_quant=False`` is the fast option: build 103 s instead of 164 s
    at 256^2 (benchmarks/results/engines-cpu-sd15-256-avx512.md runs 8-9, shared CPU), +0.3 dB on the
    random-weight SD1.5 U-Net but -0.8 dB on fastdiff-tiny's trained U-Net (36.5 -> 35.7 dB per step,
    engines-tiny-int8-build-avx512.md), so it is not the default. It is also the option that keeps a whole
    build of the full SD1.5 U-Net at 512^2 with 32 records under 8 GB: 7.30 GB, against 8.63 GB with
    SmoothQuant on (engines-cpu-build-profile-ov-int8-512-32-trim{-nosq,}.md). ``bias_correction="fast"`` gives
    NNCF's own recipe back.
    """

    level: str = "conv+ffn+qkv"
    method: str = "percentile"
    exclude: tuple[str, ...] = DEFAULT_EXCLUDE
    percentile: float = 99.999
    max_calibration_records: int | None = 64
    holdout_every: int = 4
    smooth_quant: bool = True
    bias_correction: str = "none"
    min_group_snr_db: float = 30.0
    calibration_memory_gb: float = 1.0
    statistics_hint: str = "engine"
    overflow_fix: str = "auto"
    statistics_batch: int | None = 1
    attention: str = "auto"

    def __post_init__(self):
        if not (is_number(self.calibration_memory_gb) and self.calibration_memory_gb > 0):
            raise ValueError(
                f"QuantConfig.calibration_memory_gb must be a positive number, got {self.calibration_memory_gb!r}"
            )
        for name, valid in (
            ("bias_correction", BIAS_CORRECTIONS),
            ("statistics_hint", STATISTICS_HINTS),
            ("overflow_fix", ("auto", *OVERFLOW_FIXES)),
            ("attention", ATTENTION_MODES),
        ):
            check_choice(f"QuantConfig.{name}", getattr(self, name), valid)
        check_count("QuantConfig.statistics_batch", self.statistics_batch, STATISTICS_BATCH)
        exclude = (self.exclude,) if isinstance(self.exclude, str) else tuple(self.exclude)
        object.__setattr__(self, "exclude", exclude)


@dataclasses.dataclass(frozen=True)
class GateConfig:
    """Quality gate against the PyTorch U-Net; ``None`` disables a criterion, ``force`` installs anyway."""

    min_snr_db: float | None = 20.0
    min_cosine: float | None = None
    force: bool = False

    def __post_init__(self):
        for name in ("min_snr_db", "min_cosine"):
            v = getattr(self, name)
            if v is not None and (not is_number(v) or v != v):
                raise TypeError(f"GateConfig.{name} must be a number or None (criterion off), got {v!r}")
        if not isinstance(self.force, bool):
            raise TypeError(f"GateConfig.force must be True or False, got {self.force!r}")


OPENVINO_SOURCES = ("pytorch", "onnx")


@dataclasses.dataclass(frozen=True)
class ExportConfig:
    """ONNX export (see :func:`fastdiff.engines.export_onnx`). sequence_length None: from the
    calibration records, else the tokenizer's ``model_max_length``, else 77.

    openvino_source: what OpenVINO converts. "pytorch": ``openvino.convert_model`` on the U-Net
    itself, no ONNX file (weights shared with the U-Net, not copied); "onnx": the ONNX export, as the
    other backends; None (default): "pytorch" for fp32/bf16 (same output to 0.05 dB, faster), int8
    and mixed (an earlier profile with fast bias correction gave the PyTorch frontend's graph about 1 dB
    lower SNR, benchmarks/results/engines-cpu-build-profile*.md; without bias correction, QuantConfig's
    default, both routes agree to 0.1 dB: engines-cpu-int8-build-256-avx512.md,
    engines-tiny-int8-build-avx512.md)."""

    opset: int = 17
    dynamic: tuple[str, ...] = ("batch", "height", "width")
    sample_shape: Sequence[int] | None = None
    sequence_length: int | None = None
    openvino_source: str | None = None

    def __post_init__(self):
        dyn = (self.dynamic,) if isinstance(self.dynamic, str) else tuple(self.dynamic)
        object.__setattr__(self, "dynamic", dyn)
        if self.openvino_source is not None and self.openvino_source not in OPENVINO_SOURCES:
            raise ValueError(
                f"ExportConfig.openvino_source must be one of {list(OPENVINO_SOURCES)} or None (by precision), "
                f"got {self.openvino_source!r}"
            )


@dataclasses.dataclass(frozen=True)
class RuntimeConfig:
    """How the engine runs. threads: CPU intra-op threads (default all). static: OpenVINO compiles
    per input shape instead of once with dynamic axes. hint: OpenVINO's inference precision for the
    layers the engine does not quantise, "f32" or "bf16"; None (default): by precision, bf16 for int8
    and mixed only where the CPU runs it natively (:func:`fastdiff.engines.runtime_ov.hint_for`).
    blob_cache: OpenVINO's own cache of compiled models, one blob per input shape and hint beside the
    engine cache (only with ``use_cache=True``; not part of the engine's cache key): "off" (default),
    "full" (OpenVINO's default mode, the compiled weights in the blob) or "weightless" (its size-optimised
    mode). Off, a cached engine's first call per shape compiles the IR. On the AMX Xeon (full SD1.5 U-Net,
    results/engines-blob-cache.md) "full" brought a cached start's first output no sooner for fp32 and bf16
    and held the weights a second time (+3.2-3.35 GB memory, +3.44 GB disk per shape); for int8 it saved
    1.75-2.1 s at 512^2 (none at 256^2) for +0.88 GB memory and +0.95 GB disk per shape (two runs,
    engines-blob-cache{,-512-reps4}.md). "weightless" saved no time.
    trt_batch, trt_image_px: TensorRT profile (prompts, pixels) as (min, opt, max)."""

    threads: int | None = None
    static: bool = True
    hint: str | None = None
    blob_cache: str = "off"
    trt_batch: tuple[int, int, int] = (1, 1, 8)
    trt_image_px: tuple[int, int, int] = (256, 512, 1024)

    def __post_init__(self):
        check_threads(self.threads)  # before any export or build: a bad count fails in seconds, not minutes
        if self.hint not in (None, "f32", "bf16"):
            raise ValueError(
                f"RuntimeConfig.hint must be 'f32', 'bf16' or None (by precision), got {self.hint!r}"
            )
        check_choice("RuntimeConfig.blob_cache", self.blob_cache, BLOB_CACHE_MODES)
