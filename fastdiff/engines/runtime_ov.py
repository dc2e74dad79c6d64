"""OpenVINO: convert the exported U-Net, quantise it with NNCF on recorded inputs, run it on the CPU.

(About 350 lines: the runner and NNCF's quantisation share the ``openvino``/``nncf`` import guard, the
precision tables and the flat-input feed, and the build, tests and benchmarks reach both as ``runtime_ov.*``.)

Precisions (``compile_engine(..., backend="openvino", precision=...)``):

* ``fp32``: the converted graph, f32 inference hint.
* ``bf16``: the same graph with the bf16 inference hint. Native only with AVX512-BF16 or AMX;
  elsewhere OpenVINO emulates it, which is slower than fp32 (``"auto"`` never picks it there).
* ``int8``: NNCF post-training quantisation fed with fastdiff's calibration records (not random
  inputs); the recipe's float islands (time embedding, conv_in, conv_out) stay float.
* ``mixed``: ``int8`` plus every layer group whose int8 SNR, measured alone on held-back records
  on OpenVINO (:func:`fastdiff.engines.ov_sensitivity.group_sensitivity`), is below a threshold, kept
  in high precision.

int8 and mixed run their unquantised layers (attention's activation matmuls, softmax, GroupNorm, the
float islands) at the bf16 hint where the CPU has it natively, fp32 elsewhere (:func:`hint_for`): on
the full SD1.5 U-Net at 512^2 one int8 IR ran 3.69x eager with bf16 against 3.25x with f32, 25.8
against 26.0 dB (benchmarks/results/engines-cpu-int8-hint-sd15-full-512.md).

NNCF collects *reduced* statistics (min/max per channel, per record) instead of keeping
activations, and reads the records through an iterator, so calibration memory does not grow
with the number of records when the records themselves stream from disk
(:meth:`CalibrationData.load` with ``lazy=True``).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np
import torch

from .._checks import check_choice, check_count
from .._compat import MissingDependencyError, is_available
from .nncf_folding import statistics_models
from .quantization import name_filter
from .records import record_bar
from .runtime_common import check_threads, numpy_feed
from .time_features import TimeFeatures

HINTS = {"fp32": "f32", "bf16": "bf16", "int8": None, "mixed": None}  # None: bf16 where native (hint_for)
BIAS_CORRECTIONS = ("fast", "full", "none")  # NNCF's bias correction after min-max (quantize's option)
# NNCF's OverflowFix: weights of which layers use half the int8 range (7 bits), for CPUs without VNNI.
OVERFLOW_FIXES = ("enable", "first_layer_only", "disable")
BLOB_CACHE_MODES = ("off", "full", "weightless")  # OpenVINO's compiled-model cache (CACHE_MODE)
STATISTICS_BATCH = "(rows per statistics inference) or None"  # what statistics_batch counts (check_count)


def require_openvino(feature: str = "OpenVINO engines", nncf: bool = False):
    """Import openvino (and nncf), or raise naming the pip extra that provides them."""
    missing = [m for m in ("openvino", "nncf" if nncf else None) if m and not is_available(m)]
    if missing:
        raise MissingDependencyError(
            f"{feature} need the {' and '.join(repr(m) for m in missing)} package(s), which are not "
            "installed. Install them with: pip install 'fastdiff[openvino]'"
        )
    import openvino

    return openvino


def openvino_has_bf16() -> bool:
    """Whether OpenVINO's CPU plugin runs bf16 natively here (it reports BF16 only with AVX512-BF16/AMX)."""
    ov = require_openvino()
    return "BF16" in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")


def hint_for(precision: str) -> str:
    """OpenVINO's INFERENCE_PRECISION_HINT for an engine of ``precision`` on this CPU (int8 and mixed:
    for their unquantised layers, bf16 where native, else f32)."""
    if precision not in HINTS:
        raise ValueError(f"OpenVINO engines have precisions {list(HINTS)}, got {precision!r}")
    return HINTS[precision] or ("bf16" if openvino_has_bf16() else "f32")


def convert(onnx_path: str | os.PathLike):
    """``openvino.Model`` from an exported ONNX file (its external data is read alongside)."""
    ov = require_openvino()
    return ov.convert_model(str(onnx_path))


def module_path_name(name: str) -> str:
    """An op name from OpenVINO's PyTorch frontend in the ONNX export's module-path form.

    ``__module.unet.down_blocks.0.resnets.0.conv1/aten::_convolution/Convolution`` becomes
    ``/unet/down_blocks.0/resnets.0/conv1/aten::_convolution/Convolution`` (index components stay
    attached, as ``torch.onnx.export`` scopes them), so exclusion patterns written for the ONNX names
    (:data:`fastdiff.engines.quantization.DEFAULT_EXCLUDE`) match either conversion. Other names pass
    through unchanged.
    """
    prefix = "__module."
    if not name.startswith(prefix):
        return name
    path, sep, rest = name[len(prefix) :].partition("/")
    parts: list[str] = []
    for part in path.split("."):
        if part.isdigit() and parts:
            parts[-1] += "." + part
        else:
            parts.append(part)
    return "/" + "/".join(parts) + sep + rest


def save(model, path: Path) -> Path:
    """Write ``engine.xml`` + ``engine.bin`` (weights kept f32: the hint decides compute precision)."""
    ov = require_openvino()
    ov.save_model(model, str(path), compress_to_fp16=False)
    return path


class _Progress:
    """The records, re-iterable (NNCF reads them once per statistics pass), with a tqdm bar per pass."""

    def __init__(self, records, total: int, desc: str):
        self.records, self.total, self.desc = records, total, desc

    def __iter__(self):
        with record_bar(self.total, self.desc) as bar:
            for record in self.records:
                yield record
                bar.update()


def record_shapes(records: Iterable[Mapping[str, torch.Tensor]], input_names: Sequence[str]) -> dict | None:
    """The one shape every record has per input, or None when the records differ."""
    shapes = None
    for record in records:
        these = {n: tuple(record[n].shape) for n in input_names if n in record}
        if shapes is None:
            shapes = these
        elif these != shapes:
            return None
    return shapes


def engine_feed(inputs: Mapping[str, torch.Tensor], features: TimeFeatures | None, input_names) -> dict:
    """Numpy inputs of an OpenVINO model from flat inputs: the timestep turned into its float32
    features first where the model starts at them (``features``, :mod:`.time_features`)."""
    return numpy_feed(inputs if features is None else features.feed(inputs), input_names)


def static_for_calibration(model, shapes: Mapping[str, Sequence[int]]) -> dict:
    """Reshape ``model`` in place to the records' one shape; returns the partial shapes to restore.

    With every axis known the CPU plugin plans one reusable activation arena for the statistics
    model; with dynamic axes it cannot, and NNCF's passes at 512^2 held far more memory (see
    benchmarks/results/engines-cpu-memory.md). The ranges do not depend on it: same graph, same inputs.
    """
    original = {p.get_friendly_name(): p.get_partial_shape() for p in model.get_parameters()}
    model.reshape({name: list(shape) for name, shape in shapes.items()})
    return original


def quantize(
    model,
    calibration: Iterable[Mapping[str, torch.Tensor]],
    *,
    num_records: int,
    exclude: Iterable[str] = (),
    smooth_quant: bool = True,
    bias_correction: str = "none",
    inplace_statistics: bool = True,
    fold_statistics: bool = True,
    progress: bool = False,
    static: bool = True,
    weights: Sequence[str | os.PathLike] = (),
    statistics_hint: str | None = None,
    compress_weights: bool = True,
    overflow_fix: str = "first_layer_only",
    statistics_batch: int | None = None,
    float_attention: bool = False,
):
    """NNCF int8 post-training quantisation of an ``openvino.Model`` on recorded U-Net inputs.

    Args:
        model: the converted float model.
        calibration: records (dicts of flat input tensors); iterated once per statistics pass.
        num_records: how many records NNCF reads (``subset_size``).
        exclude: node-name regexes kept in float (NNCF ``IgnoredScope`` patterns).
        smooth_quant: SmoothQuant (Xiao et al. 2023, eq. 4: per-channel s_j = max|X_j|^α / max|W_j|^(1-α))
            on MatMuls with NNCF's transformer alpha; ``False`` disables it.
        bias_correction: NNCF's bias correction after min-max: "fast" (its FastBiasCorrection: one small
            sub-model compiled and run per biased layer), "full" (BiasCorrection: slower, more accurate
            in general) or "none" (disabled; the default, as in :class:`QuantConfig`).
        inplace_statistics: NNCF reduces activations (and weights) to their statistics inside the
            statistics model (``True``, its default) or returns the raw tensors and reduces them in numpy.
        fold_statistics: compute the statistics of constants (the weights' ranges) with numpy instead
            of OpenVINO's constant folding while compiling NNCF's statistics models
            (:func:`fastdiff.engines.nncf_folding.fold_constant_statistics`); the ranges are the same.
        progress: NNCF's own progress bars (fastdiff shows a bar per statistics pass either way).
        static: when every record has the same input shapes, calibrate a copy reshaped to them
            (:func:`static_for_calibration`) and give the quantised model back its dynamic axes.
        weights: the memory-mapped files ``model`` was read from (an IR's ``.bin``, see
            :func:`fastdiff.engines.mapped.weight_files`): while NNCF runs, their resident pages are
            given back once the CPU plugin holds its own packed copy (:mod:`fastdiff.engines.mapped`).
        statistics_hint: OpenVINO inference precision of NNCF's statistics models ("f32" or "bf16"; None
            keeps NNCF's f32). "bf16" collects the ranges the engine sees when it runs at the bf16 hint,
            with half the weight and activation memory (:func:`fastdiff.engines.nncf_folding.statistics_models`).
        compress_weights: NNCF's last step, int8 weight constants in place of the weights' FakeQuantize
            nodes; ``False`` leaves them over the float weights (:mod:`fastdiff.engines.ov_sensitivity`
            un-quantises layers of that model, then compresses it).
        overflow_fix: NNCF's OverflowFix, which layers' weights use half the int8 range: "enable"
            (every Convolution and MatMul), "first_layer_only" (NNCF's default) or "disable". Without
            VNNI the CPU's u8 x s8 products saturate at int16 (:mod:`fastdiff.engines.cpu`); 7-bit weights
            keep every pair sum in range.
        statistics_batch: how many rows of a record NNCF's statistics models run at once; NNCF gets
            the outputs of the whole record, combined from the pieces' where that is exact, so the ranges
            are the same (:mod:`fastdiff.engines.nncf_rows`). One row at a time holds half the activations
            of a classifier-free-guidance pair. None runs whole records.
        float_attention: keep attention's Q and K inputs (ScaledDotProductAttention) in float; NNCF
            quantises them otherwise.
    """
    check_choice("overflow_fix", overflow_fix, OVERFLOW_FIXES)
    check_choice("bias_correction", bias_correction, BIAS_CORRECTIONS)
    require_openvino("OpenVINO int8 quantisation", nncf=True)
    import nncf
    from nncf.quantization.advanced_parameters import (
        AdvancedQuantizationParameters,
        AdvancedSmoothQuantParameters,
        OverflowFix,
    )

    check_count("statistics_batch", statistics_batch, STATISTICS_BATCH)
    input_names = [p.get_friendly_name() for p in model.get_parameters()]
    features = TimeFeatures.of_model(model)
    restore = None
    if static:
        shapes = record_shapes(calibration, input_names)
        if shapes is not None and set(shapes) == set(input_names):
            if features is not None:  # the records hold timesteps, the model their features
                shapes["timestep"] = (*shapes["timestep"][:1], features.num_channels)
            model = model.clone()  # the caller's model keeps its axes (constants are shared, not copied)
            restore = static_for_calibration(model, shapes)
    records = _Progress(calibration, int(num_records), "fastdiff NNCF statistics")
    dataset = nncf.Dataset(
        records, functools.partial(engine_feed, features=features, input_names=input_names)
    )
    # fastdiff's exclusions are re.search regexes; NNCF anchors its patterns (re.match), so resolve
    # them to exact node names here (matched in the ONNX module-path form too: see module_path_name).
    excluded = name_filter(exclude)
    names = [op.get_friendly_name() for op in model.get_ops()]
    ignored = [n for n in names if excluded(n) or excluded(module_path_name(n))]
    ignored_types = ["ScaledDotProductAttention"] if float_attention else []
    advanced = AdvancedQuantizationParameters(
        smooth_quant_alphas=AdvancedSmoothQuantParameters(matmul=0.95 if smooth_quant else -1),
        disable_bias_correction=bias_correction == "none",
        inplace_statistics=inplace_statistics,
        backend_params={} if compress_weights else {"compress_weights": False},
        overflow_fix=OverflowFix(overflow_fix),
    )
    if not progress:
        nncf.set_log_level(40)  # ERROR: NNCF's INFO lines and bars are noise inside compile_engine
    from .mapped import ReleasingMappedPages

    own_outputs = frozenset().union(*(o.get_names() for o in model.outputs))
    with (
        ReleasingMappedPages(weights),
        statistics_models(fold_statistics, statistics_hint, statistics_batch, own_outputs),
    ):
        quantised = nncf.quantize(
            model,
            dataset,
            subset_size=int(num_records),
            model_type=nncf.ModelType.TRANSFORMER,
            ignored_scope=nncf.IgnoredScope(names=ignored, types=ignored_types, validate=False)
            if ignored or ignored_types
            else None,
            fast_bias_correction=bias_correction != "full",
            advanced_parameters=advanced,
        )
    if restore is not None:
        quantised.reshape(restore)
    if features is not None:  # the quantised model starts at the same features
        features.tag(quantised)
    return quantised


def quantised_layers(model) -> set[str]:
    """Friendly names of Convolution/MatMul ops whose weight input comes through a FakeQuantize (int8)."""
    out = set()
    for op in model.get_ops():
        if op.get_type_name() not in ("Convolution", "MatMul", "GroupConvolution"):
            continue
        src = op.input_value(1).get_node()
        # The weight path is Constant -> (Convert) -> FakeQuantize/ (u)int8 Constant -> Convert -> Subtract -> Multiply.
        seen, frontier = 0, [src]
        while frontier and seen < 6:
            node = frontier.pop()
            seen += 1
            kind = node.get_type_name()
            if kind == "FakeQuantize":
                out.add(op.get_friendly_name())
                break
            if kind == "Constant" and str(node.get_element_type()) in ("i8", "u8", "<Type: 'int8_t'>"):
                out.add(op.get_friendly_name())
                break
            frontier.extend(v.get_node() for v in node.input_values())
    return out


class OvRunner:
    """Runs the flat-signature OpenVINO U-Net (an IR path, or an ``openvino.Model`` in memory) on the
    CPU; takes and returns torch tensors.

    With ``static=True`` the model is reshaped to each new input shape and compiled for it (a
    handful of shapes per pipeline; each compiled model is kept), which lets the CPU plugin pick
    shape-specific kernels; a smaller batch of a shape already compiled (rows that left the batch) runs on
    one model with a dynamic batch axis instead. ``static=False`` compiles once with the exported dynamic axes.

    ``blob_cache``: a folder for OpenVINO's compiled-model cache (a subfolder per hint and mode), used as
    ``blob_cache_mode`` says: "full" (weights in the blob), "weightless" (CACHE_MODE OPTIMIZE_SIZE) or "off".
    """

    backend = "openvino"

    def __init__(
        self,
        model_path,
        *,
        hint: str = "f32",
        static: bool = True,
        threads: int | None = None,
        blob_cache: str | os.PathLike | None = None,
        blob_cache_mode: str = "full",
    ):
        threads = check_threads(threads)
        ov = require_openvino()
        if hint not in ("f32", "bf16"):
            raise ValueError(f"hint must be 'f32' or 'bf16', got {hint!r}")
        check_choice("blob_cache_mode", blob_cache_mode, BLOB_CACHE_MODES)
        in_memory = isinstance(model_path, ov.Model)  # e.g. a model being built (ov_sensitivity)
        self.path = None if in_memory else Path(model_path)
        self.hint = hint
        self.static = bool(static)
        self.core = ov.Core()
        self.config = {"INFERENCE_PRECISION_HINT": hint, "PERFORMANCE_HINT": "LATENCY"}
        self.blob_cache_mode = blob_cache_mode if blob_cache is not None else "off"
        if self.blob_cache_mode != "off":
            # One folder per hint (OpenVINO reused fp32 blobs for bf16: 2.7 dB, #14) and per mode.
            folder = Path(blob_cache) / (hint if blob_cache_mode == "full" else f"{hint}-weightless")
            self.core.set_property({"CACHE_DIR": str(folder)})
            if blob_cache_mode == "weightless":
                self.config["CACHE_MODE"] = "OPTIMIZE_SIZE"
        if threads is not None:
            self.config["INFERENCE_NUM_THREADS"] = threads
        self.model = model_path if in_memory else self.core.read_model(str(self.path))
        self.input_names = tuple(p.get_friendly_name() for p in self.model.get_parameters())
        self.features = TimeFeatures.of_model(self.model)  # None: the model takes the timestep itself
        self._compiled: dict[tuple, object] = {}
        self._largest: dict[tuple, int] = {}  # static runner: largest batch compiled per non-batch shape

    def _request(self, feed: dict[str, np.ndarray]):
        key, reshape = (), None
        if self.static:
            shapes = tuple(tuple(feed[n].shape) for n in self.input_names)
            rest, batch = tuple(s[1:] for s in shapes), shapes[0][0] if shapes[0] else 0
            if shapes in self._compiled or batch > self._largest.get(rest, 0) or not all(shapes):
                key, reshape = shapes, {n: list(s) for n, s in zip(self.input_names, shapes)}
                self._largest[rest] = max(batch, self._largest.get(rest, 0))
            else:
                # A smaller batch of a shape compiled before: rows left the batch (early stop, per-row step
                # counts). One model with a dynamic batch axis serves every such size: a static compile per
                # size cost 5.8 s against a 2.2 s step (SD1.5, 256^2), the dynamic batch axis 1-7 % per step
                # (benchmarks/results/engines-shrinking-batch-sd15-full.md).
                key, reshape = (
                    ("any batch", rest),
                    {n: [-1, *s[1:]] for n, s in zip(self.input_names, shapes)},
                )
        req = self._compiled.get(key)
        if req is None:
            model = self.model
            if reshape is not None:
                model = self.model.clone()
                model.reshape(reshape)
            req = self.core.compile_model(model, "CPU", self.config).create_infer_request()
            self._compiled[key] = req
        return req

    def __call__(self, inputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        feed = engine_feed(inputs, self.features, self.input_names)
        req = self._request(feed)
        req.infer(feed)
        return torch.from_numpy(np.array(req.get_output_tensor(0).data, copy=True))
