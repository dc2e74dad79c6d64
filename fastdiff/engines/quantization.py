"""Post-training INT8 quantisation of an exported U-Net into an explicit Q/DQ ONNX graph.

The heavy lifting (activation calibration, inserting QuantizeLinear/DequantizeLinear
pairs, per-channel weight scales) is ``onnxruntime.quantization.quantize_static``;
this module decides *what* to quantise. (About 470 lines: the layer taxonomy, the node classifier and the
Q/DQ summary must agree with each other, so they stay in one place.)

Every weighted layer of the exported graph is classified from its node name
(TorchScript export names nodes after module paths, e.g.
``/down_blocks.0/attentions.0/transformer_blocks.0/ff/net.2/MatMul``):

==============  ===========================================================
category        layers
==============  ===========================================================
conv            resnet conv1/conv2, down/upsampler convs
shortcut        resnet 1x1 ``conv_shortcut``
ffn             transformer feed-forward (GEGLU projection and output)
qkv             attention ``to_q``/``to_k``/``to_v``
attn_out        attention ``to_out``
proj            transformer ``proj_in``/``proj_out`` (1x1 conv or linear)
time_embedding  timestep / SDXL added-cond embeddings and per-resnet ``time_emb_proj``
conv_in         first conv (4 latent channels in)
conv_out        last conv (4 channels out)
attention       activation x activation MatMuls (QK^T, PV): never weight-quantised
==============  ===========================================================

``level`` picks categories; ``exclude`` regexes then remove nodes by name. The
defaults follow NVIDIA Model Optimizer's diffusion recipe: time embedding,
conv_in, conv_out, norms (not a quantisable op here) and attention matmuls and
softmax stay in float. Which level is best on a given CPU is a measurement:
see :func:`layer_sensitivity` and ``benchmarks/engines.py``.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np

from fastdiff._checks import check_choice

from .calibration import CalibrationData
from .export import data_file, remove_model
from .ort_calibration import HISTOGRAM_METHODS, histogram_ranges, record_feed
from .records import record_bar

LEVELS: dict[str, frozenset[str]] = {
    "conv": frozenset({"conv"}),
    "conv+ffn": frozenset({"conv", "ffn"}),
    "conv+ffn+qkv": frozenset({"conv", "ffn", "qkv", "attn_out", "proj"}),
    "all": frozenset(
        {"conv", "ffn", "qkv", "attn_out", "proj", "shortcut", "time_embedding", "conv_in", "conv_out"}
    ),
}
# Regexes over node names; the float islands of the Model Optimizer recipe.
DEFAULT_EXCLUDE: tuple[str, ...] = (
    r"time_embedding/",
    r"add_embedding/",
    r"time_emb_proj/",
    r"^/(unet/)?conv_in/",
    r"^/(unet/)?conv_out/",
)
_QUANTISABLE_OPS = ("Conv", "MatMul", "Gemm")

_CATEGORY_PATTERNS = (
    ("time_embedding", re.compile(r"time_embedding/|add_embedding/|time_emb_proj/|add_time_proj/")),
    ("conv_in", re.compile(r"(^|/)conv_in/")),
    ("conv_out", re.compile(r"(^|/)conv_out/")),
    ("shortcut", re.compile(r"conv_shortcut/")),
    ("proj", re.compile(r"/proj_(in|out)/")),
    ("qkv", re.compile(r"/to_(q|k|v)/")),
    ("attn_out", re.compile(r"/to_out")),
    ("ffn", re.compile(r"/ff/")),
)


def classify_node(node, weight_names: set[str]) -> str | None:
    """Category of a Conv/MatMul/Gemm node (see module doc), or None for other ops.

    ``weight_names``: tensors that hold constant weights (see :func:`_weight_names`).
    """
    if node.op_type not in _QUANTISABLE_OPS:
        return None
    has_weight = len(node.input) > 1 and node.input[1] in weight_names
    if not has_weight:
        return "attention"  # activation x activation: QK^T and PV
    return category_of(node.name, conv=node.op_type == "Conv")


def category_of(name: str, conv: bool) -> str:
    """Category of a weighted layer from its module-path name (``/unet/.../to_q/...``)."""
    for category, pattern in _CATEGORY_PATTERNS:
        if pattern.search(name):
            return category
    return "conv" if conv else "linear"


def name_filter(exclude: str | Iterable[str]) -> Callable[[str], bool]:
    """Whether a layer name matches any of the ``exclude`` regexes (``re.search``: anywhere in the name).

    A bare string is one regex, not a sequence of one-character regexes (which excluded nearly every layer).
    """
    patterns = [re.compile(p) for p in ((exclude,) if isinstance(exclude, str) else exclude)]
    return lambda name: any(p.search(name) for p in patterns)


def _load_graph(model_or_path):
    import onnx

    if isinstance(model_or_path, (str, os.PathLike)):
        return onnx.load(str(model_or_path), load_external_data=False)
    return model_or_path


def _weight_names(model) -> set[str]:
    """Initializers, plus outputs of DequantizeLinear nodes applied to initializers (quantised weights)."""
    names = {i.name for i in model.graph.initializer}
    names |= {
        n.output[0] for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in names
    }
    return names


def classify_nodes(model_or_path) -> dict[str, str]:
    """node name -> category for every Conv/MatMul/Gemm in the graph (float or Q/DQ)."""
    model = _load_graph(model_or_path)
    weights = _weight_names(model)
    return {node.name: cat for node in model.graph.node if (cat := classify_node(node, weights)) is not None}


def activation_tensors(model_or_path, nodes: Iterable[str] | None = None) -> set[str]:
    """Non-weight inputs and outputs of ``nodes``, the tensors whose ranges ``quantize_static`` reads
    for them; ``None``: of every node some level can quantise (all but the attention matmuls), so that
    one calibration serves every level."""
    model = _load_graph(model_or_path)
    weights = _weight_names(model)
    names = set(nodes) if nodes is not None else None
    out = set()
    for node in model.graph.node:
        if names is not None and node.name not in names:
            continue
        if names is None and classify_node(node, weights) in (None, "attention"):
            continue
        out.update(t for t in (*node.input, *node.output) if t and t not in weights)
    return out


def select_nodes(
    model_or_path, level: str = "conv+ffn+qkv", exclude: Iterable[str] = DEFAULT_EXCLUDE
) -> list[str]:
    """Names of the nodes to quantise for ``level`` minus those matching any ``exclude`` regex."""
    if level not in LEVELS:
        raise ValueError(f"unknown quantisation level {level!r}; valid: {list(LEVELS)}")
    excluded = name_filter(exclude)
    return [
        name
        for name, cat in classify_nodes(model_or_path).items()
        if cat in LEVELS[level] and not excluded(name)
    ]


class _Reader:
    """onnxruntime ``CalibrationDataReader`` over recorded U-Net inputs (built lazily: ORT is optional).

    Supports ``set_range`` so ``quantize_static`` feeds the calibrator one record at a time
    (``CalibStridedMinMax=1``): each record's activations are folded into the per-tensor ranges or
    histograms before the next one is read, and records on disk are read only when fed. ``dtypes``: the
    graph's inputs, fed in this order, and the numpy dtype each takes (:func:`_graph_input_dtypes`).
    """

    def __new__(cls, calibration: CalibrationData, dtypes: Mapping[str, str]):
        from onnxruntime.quantization import CalibrationDataReader

        records, input_names = calibration.records, list(dtypes)

        class Reader(CalibrationDataReader):
            def __init__(self):
                self._pos = iter(range(len(records)))
                self.bar = None  # records fed, per pass over them (ORT may read them more than once)

            def set_range(self, start_index: int, end_index: int):
                self._pos = iter(range(start_index, min(end_index, len(records))))

            def get_next(self):
                i = next(self._pos, None)
                if i is None:
                    return None
                if self.bar is None:
                    self.bar = record_bar(len(records), "fastdiff ORT calibration")
                elif self.bar.n >= self.bar.total:
                    self.bar.reset()
                self.bar.update()
                return record_feed(records[i], input_names, dtypes)

            def __len__(self):
                return len(records)

        return Reader()


def _graph_input_dtypes(path) -> dict[str, str]:
    """Graph input (not an initializer) -> its numpy dtype name (records are float32; an fp16 export
    takes float16)."""
    import onnx

    model = _load_graph(path)
    inits = {i.name for i in model.graph.initializer}
    return {
        i.name: "float16" if i.type.tensor_type.elem_type == onnx.TensorProto.FLOAT16 else "float32"
        for i in model.graph.input
        if i.name not in inits
    }


def _graph_input_names(path) -> list[str]:
    return list(_graph_input_dtypes(path))


def preprocess(onnx_path: str | os.PathLike, out_path: str | os.PathLike) -> Path:
    """ONNX Runtime's basic graph optimisations (constant folding, redundant nodes, Conv+BN/Add/Mul
    fusion) written back to ONNX: the optimisation step of ORT's ``quant_pre_process``.

    ``quant_pre_process`` also loads the whole model in Python and runs ONNX shape inference, and
    saves it again; ``quantize_static`` and :func:`~fastdiff.engines.ort_calibration.histogram_ranges`
    infer shapes themselves, so the same graph comes out in 4 s instead of 27.5 s for SD1.5 at 256^2
    (results/engines-cpu-build-profile-ort-int8-256-{lean,fast}.md). No weight is pre-packed: the session
    only writes the graph.
    """
    import onnxruntime

    onnx_path, out_path = Path(onnx_path), Path(out_path)
    remove_model(out_path)
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_BASIC
    options.optimized_model_filepath = str(out_path)
    options.enable_cpu_mem_arena = False
    options.add_session_config_entry("session.disable_prepacking", "1")
    if data_file(onnx_path).exists():
        options.add_session_config_entry(
            "session.optimized_model_external_initializers_file_name", data_file(out_path).name
        )
        options.add_session_config_entry(
            "session.optimized_model_external_initializers_min_size_in_bytes", "1024"
        )
    onnxruntime.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
    # The mark quant_pre_process leaves (quantize_static warns without it); the graph is all that is read.
    import onnx
    from onnxruntime.quantization.quant_utils import add_pre_process_metadata

    model = onnx.load(str(out_path), load_external_data=False)
    add_pre_process_metadata(model)
    onnx.save_model(model, str(out_path))
    return out_path


def quantize(
    onnx_path: str | os.PathLike,
    calibration: CalibrationData,
    *,
    level: str = "conv+ffn+qkv",
    method: str = "percentile",
    exclude: Iterable[str] = DEFAULT_EXCLUDE,
    out_path: str | os.PathLike | None = None,
    percentile: float = 99.999,
    per_channel: bool = True,
    activation_type: str = "uint8",
    weight_type: str = "int8",
    reduce_range: bool | None = None,
    max_calibration_records: int | None = 64,
    calibration_cache: str | os.PathLike | None = None,
    nodes: Sequence[str] | None = None,
    quantize_outputs: bool = True,
    calibration_memory_gb: float = 1.0,
    weights: Mapping[str, np.ndarray] | None = None,
) -> Path:
    """Write an INT8 Q/DQ copy of ``onnx_path`` calibrated on recorded U-Net inputs.

    Args:
        onnx_path: a float32 graph from :func:`export_onnx`.
        calibration: recorded inputs (see :func:`calibrate`); subsampled evenly over
            timesteps to ``max_calibration_records``.
        level: which layer categories to quantise: one of ``LEVELS``.
        method: activation range calibrator: "percentile" (Model Optimizer's choice),
            "entropy" (KL) or "minmax".
        exclude: node-name regexes kept in float on top of the level's choice.
        out_path: default ``<stem>.int8-<level>-<method>.onnx`` next to the input.
        per_channel: per-output-channel weight scales (recommended; TensorRT supports them).
        activation_type / weight_type: "uint8" or "int8". U8 activations x S8 weights is the
            VNNI fast path on x86; TensorRT wants S8 for both (symmetric).
        reduce_range: 7-bit weights, for CPUs without VNNI where U8S8 products saturate at int16.
            ``None`` (default): on exactly when the CPU lacks VNNI (see :mod:`fastdiff.engines.cpu`)
            and activations are uint8.
        calibration_cache: JSON file of activation ranges; reused when present (ranges do not
            depend on ``level``/``exclude``, so sweeps calibrate only once).
        nodes: explicit node names to quantise (overrides ``level`` and ``exclude``).
        quantize_outputs: also put Q/DQ on each quantised layer's output. ONNX Runtime's CPU
            kernels need it to fuse Conv into QLinearConv (without it a Conv runs in float on
            dequantised weights); leaving outputs float costs less accuracy.
        calibration_memory_gb: percentile and entropy ranges are ORT's, computed a group of tensors
            at a time so that about this many GB of one record's activations are alive at once
            (:mod:`fastdiff.engines.ort_calibration`); min-max reduces in the graph and needs no groups.
        weights: the exported U-Net's own weights (:func:`~fastdiff.engines.export.weight_views`):
            the histogram calibration runs on those equal to the data file's instead of loading a
            second copy (2.3 GB of full SD1.5's weights, results/ort-session-memory.md).

    Returns the path of the quantised model.
    """
    from onnxruntime.quantization import CalibrationMethod, QuantFormat, QuantType, quantize_static

    methods = {
        "percentile": CalibrationMethod.Percentile,
        "entropy": CalibrationMethod.Entropy,
        "minmax": CalibrationMethod.MinMax,
    }
    if method not in methods:
        raise ValueError(f"unknown calibration method {method!r}; valid: {list(methods)}")
    qtypes = {"uint8": QuantType.QUInt8, "int8": QuantType.QInt8}
    check_choice("activation_type", activation_type, qtypes)
    check_choice("weight_type", weight_type, qtypes)
    if not isinstance(calibration, CalibrationData) or len(calibration) == 0:
        raise ValueError("quantize needs non-empty CalibrationData (see fastdiff.engines.calibrate)")
    if not 0 < percentile <= 100:
        raise ValueError(f"percentile must be in (0, 100], got {percentile}")
    onnx_path = Path(onnx_path)
    if not onnx_path.is_file():
        raise FileNotFoundError(f"no ONNX model at {onnx_path}")
    if out_path is None:
        out_path = onnx_path.with_name(f"{onnx_path.stem}.int8-{level.replace('+', '-')}-{method}.onnx")
    out_path = Path(out_path)
    if out_path.resolve() == onnx_path.resolve():
        raise ValueError(
            f"out_path must differ from onnx_path ({onnx_path}): the float model would be overwritten"
        )
    out_path.parent.mkdir(parents=True, exist_ok=True)
    if reduce_range is None:
        reduce_range = default_reduce_range(activation_type)
    calibration = calibration.subset(max_calibration_records)

    with tempfile.TemporaryDirectory(prefix="fastdiff-quant-") as tmp:
        pre = preprocess(onnx_path, Path(tmp) / "pre.onnx")
        graph = _load_graph(pre)  # the graph alone (no weights), read once for every question below
        chosen = list(nodes) if nodes is not None else select_nodes(graph, level, exclude)
        if not chosen:
            raise ValueError(f"level={level!r} with exclude={list(exclude)} selects no node to quantise")
        extra = {
            # Asymmetric uint8 activations use the full range for post-SiLU / post-GELU inputs.
            "ActivationSymmetric": activation_type == "int8",
            "WeightSymmetric": True,
            "CalibTensorRangeSymmetric": activation_type == "int8",
            "CalibPercentile": percentile,
            # One record per collect_data call: ORT folds its activations into the per-tensor
            # ranges/histograms before the next runs, so memory is one record's activations, not
            # all of them (histogram calibrators keep every record otherwise: 22.8 GB at 6 records
            # of full SD1.5 at 256^2). Not CalibMaxIntermediateOutputs: ORT 1.32's MinMax
            # calibrator discards, rather than merges, each full batch of that size.
            "CalibStridedMinMax": 1,
        }
        if not quantize_outputs:
            extra["OpTypesToExcludeOutputQuantization"] = list(_QUANTISABLE_OPS)
        inputs = _graph_input_dtypes(graph)
        reader = _Reader(calibration, inputs)
        if calibration_cache is not None and Path(calibration_cache).is_file():
            _check_cache_covers(calibration_cache, activation_tensors(graph, chosen))
        elif method in HISTOGRAM_METHODS:
            # ORT's own calibrator would hold every calibrated tensor of a record at once (OOM at 512^2).
            from onnxruntime.quantization.calibrate import save_tensors_data

            ranges = histogram_ranges(
                pre,
                calibration.records,
                list(inputs),
                op_types=list(_QUANTISABLE_OPS),
                method=method,
                symmetric=extra["CalibTensorRangeSymmetric"],
                percentile=percentile,
                memory_gb=calibration_memory_gb,
                dtypes=inputs,
                tensors=activation_tensors(graph) | activation_tensors(graph, chosen),
                weights=weights,
            )
            calibration_cache = (
                Path(calibration_cache) if calibration_cache is not None else Path(tmp) / "ranges.json"
            )
            save_tensors_data(ranges, calibration_cache)
        # The sensitivity sweep rewrote one path per group and, appending to its data file, filled the
        # disk with 3.4 GB per group at 256^2.
        remove_model(out_path)
        try:
            with contextlib.redirect_stdout(io.StringIO()):  # ORT's calibrators print progress
                quantize_static(
                    str(pre),
                    str(out_path),
                    calibration_data_reader=reader,
                    quant_format=QuantFormat.QDQ,
                    op_types_to_quantize=list(_QUANTISABLE_OPS),
                    nodes_to_quantize=chosen,
                    per_channel=per_channel,
                    reduce_range=reduce_range,
                    activation_type=qtypes[activation_type],
                    weight_type=qtypes[weight_type],
                    calibrate_method=methods[method],
                    use_external_data_format=data_file(onnx_path).exists(),
                    extra_options=extra,
                    calibration_cache_path=str(calibration_cache) if calibration_cache is not None else None,
                )
        finally:
            if reader.bar is not None:
                reader.bar.close()
    return out_path


def _check_cache_covers(path, needed: set[str]) -> None:
    """ORT skips, with only a log line, a tensor that its ranges lack: the layer would stay float."""
    from onnxruntime.quantization.calibrate import load_tensors_data

    missing = sorted(needed - set(load_tensors_data(path).keys()))
    if missing:
        raise ValueError(
            f"calibration_cache {str(path)!r} has no ranges for {len(missing)} tensors these nodes need "
            f"(first: {missing[:3]}); it was written for other nodes (attention matmuls are calibrated "
            "only when named in nodes=): delete it or pass another path"
        )


def default_reduce_range(activation_type: str = "uint8") -> bool:
    """7-bit weights where u8 x s8 products would saturate: x86 CPUs without VNNI.

    Only the u8-activation CPU path saturates; s8 x s8 (TensorRT) is unaffected.
    """
    from .cpu import has_vnni

    return activation_type == "uint8" and not has_vnni()


def qdq_summary(model_or_path) -> dict:
    """Counts of Q/DQ nodes and of quantised vs float weighted layers per category."""
    model = _load_graph(model_or_path)
    ops = Counter(n.op_type for n in model.graph.node)
    quantised_names = quantised_node_names(model)
    quantised, floating = Counter(), Counter()
    for name, cat in classify_nodes(model).items():
        (quantised if name in quantised_names else floating)[cat] += 1
    return {
        "QuantizeLinear": ops.get("QuantizeLinear", 0),
        "DequantizeLinear": ops.get("DequantizeLinear", 0),
        "quantised": dict(quantised),
        "float": dict(floating),
    }


def quantised_node_names(model_or_path) -> set[str]:
    """Names of Conv/MatMul/Gemm nodes that compute in int8.

    A weighted layer counts when its weight comes through a DequantizeLinear; an
    activation x activation MatMul when both operands do. (A float layer may still
    read a DequantizeLinear output on its activation input when it shares that
    tensor with a quantised neighbour.)
    """
    model = _load_graph(model_or_path)
    producers = {o: n for n in model.graph.node for o in n.output}
    inits = {i.name for i in model.graph.initializer}

    def from_dq(tensor: str) -> bool:
        src = producers.get(tensor)
        return src is not None and src.op_type == "DequantizeLinear"

    out = set()
    for node in model.graph.node:
        if node.op_type not in _QUANTISABLE_OPS or len(node.input) < 2:
            continue
        weight_src = producers.get(node.input[1])
        is_weighted = node.input[1] in inits or (weight_src is not None and weight_src.input[0] in inits)
        if from_dq(node.input[1]) and (is_weighted or from_dq(node.input[0])):
            out.add(node.name)
    return out
