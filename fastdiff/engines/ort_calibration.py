"""ONNX Runtime activation ranges in bounded memory: ORT's own histogram calibration, a group of tensors at a time.

ONNX Runtime's calibrator adds every tensor it calibrates to the graph's outputs and runs the records
through that one session, so one record's activations at every quantised layer are alive at once: the
full SD1.5 U-Net at 512^2 passed 22.7 GB on its first record on a 24 GB machine and was killed
(benchmarks/results/engines-cpu-goals.md). A tensor's histogram depends only on that tensor's values,
record after record, so calibrating the tensors in groups whose outputs fit ``memory_gb``, feeding the
records in the same order to every group, gives ORT's ranges (tests/test_engines.py compares them)
while one group's outputs are alive. Each group runs a pruned copy of the graph (the nodes its
tensors need, in topological order, so early groups run a prefix) that references the model's weight
file instead of copying it, or the caller's copy of the weights where they are equal. A record runs
one sample at a time (the two halves of classifier-free guidance separately), which halves the
attention intermediates; its samples' values still reach the histogram in one call, so only float
rounding of batch-1 kernels separates the ranges from ORT's (at most 1e-6 of a range in the test).
ORT's ``HistogramCollector`` does the statistics; min-max calibration reduces inside the graph
already and stays with ORT.

What decides memory and time at 512^2, measured (benchmarks/results/engines-cpu-build-profile-ort-int8-512*):
groups are sized from shapes that ONNX Runtime's symbolic inference resolves (ONNX's own left most
activations unsized, and groups came out 2.4x over budget); ``quantize`` calibrates only tensors that
quantised layers read (the attention matmuls' score and softmax tensors, 1 GB each, are never
quantised); sessions run without ORT's memory arena, which kept each group's largest intermediates.
"""

from __future__ import annotations

import contextlib
import io
import math
import tempfile
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from .records import record_bar

HISTOGRAM_METHODS = ("percentile", "entropy")


def record_feed(record: Mapping, names: Sequence[str], dtypes: Mapping[str, str]) -> dict[str, np.ndarray]:
    """The inputs ``names`` of a calibration record as numpy arrays of ``dtypes`` (default float32; a
    copy only where the dtype differs), or a ValueError naming those the record lacks."""
    missing = [n for n in names if n not in record]
    if missing:
        raise ValueError(f"calibration record lacks inputs {missing}; it has {sorted(record)}")
    return {n: np.asarray(record[n].numpy(), dtype=dtypes.get(n, "float32")) for n in names}


def tensors_to_calibrate(model, op_types: Sequence[str]) -> list[str]:
    """The tensors ORT's calibrator would calibrate in ``model`` (shape-inferred), in node order."""
    from onnxruntime.quantization.calibrate import CalibraterBase

    chosen, _ = CalibraterBase.select_tensors_to_calibrate(
        SimpleNamespace(op_types_to_calibrate=op_types), model
    )
    ordered = dict.fromkeys(
        n for node in model.graph.node for n in (*node.input, *node.output) if n in chosen
    )
    ordered.update(dict.fromkeys(sorted(chosen - set(ordered))))
    return list(ordered)


def tensor_bytes(
    model, input_shapes: Mapping[str, Sequence[int]], base_dir: str | Path | None = None
) -> dict[str, int]:
    """Bytes of every tensor whose shape is known once the graph inputs take ``input_shapes``.

    ONNX's own shape inference left 570 of the 670 calibrated tensors of the exported SD1.5 U-Net
    unsized (their shapes run through Shape/Reshape arithmetic), so groups came out 2.4x over budget.
    ONNX Runtime's symbolic inference evaluates that arithmetic; it reads the small constants it needs
    (shape vectors, scalars) from the external-data file in ``base_dir``. Should it fail on a graph,
    ONNX's inference is used with a warning (unsized tensors then count as the largest sized one).
    """
    import warnings

    import onnx
    from onnx.external_data_helper import load_external_data_for_tensor, uses_external_data
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    fixed = onnx.ModelProto()
    fixed.CopyFrom(model)
    del fixed.graph.value_info[:]
    for inp in fixed.graph.input:
        if inp.name in input_shapes:
            dims = inp.type.tensor_type.shape.dim
            for d, size in zip(dims, input_shapes[inp.name]):
                d.Clear()
                d.dim_value = int(size)
    for init in fixed.graph.initializer:
        if base_dir is not None and uses_external_data(init) and math.prod(init.dims) <= 2**16:
            load_external_data_for_tensor(init, str(base_dir))
            init.data_location = onnx.TensorProto.DEFAULT
            del init.external_data[:]
    try:
        inferred = SymbolicShapeInference.infer_shapes(fixed, auto_merge=True)
    except Exception as e:  # noqa: BLE001 - any failure: fall back to the weaker inference
        warnings.warn(
            f"ONNX Runtime's symbolic shape inference failed ({type(e).__name__}: {e}); calibration "
            "groups are sized from ONNX's shape inference, which may leave tensors unsized",
            stacklevel=2,
        )
        inferred = onnx.shape_inference.infer_shapes(fixed)
    out = {}
    for vi in (*inferred.graph.value_info, *inferred.graph.input, *inferred.graph.output):
        t = vi.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else 0 for d in t.shape.dim]
        if dims and all(dims):
            out[vi.name] = math.prod(dims) * (2 if t.elem_type == onnx.TensorProto.FLOAT16 else 4)
    return out


def group_by_bytes(names: Sequence[str], sizes: Mapping[str, int], budget: int) -> list[list[str]]:
    """Consecutive groups of ``names`` whose summed sizes stay within ``budget`` (a tensor larger than
    the budget gets a group of its own; an unknown size counts as the largest known one)."""
    largest = max(sizes.values(), default=1)
    groups, current, used = [], [], 0
    for name in names:
        size = sizes.get(name, largest)
        if current and used + size > budget:
            groups.append(current)
            current, used = [], 0
        current.append(name)
        used += size
    return groups + ([current] if current else [])


def batch_inputs(model) -> set[str]:
    """Graph inputs whose first axis is the first input's symbolic batch axis (none if it is static)."""
    initializers = {t.name for t in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in initializers]
    dims = [i.type.tensor_type.shape.dim for i in inputs]
    if not inputs or not dims[0] or not dims[0][0].dim_param:
        return set()
    return {i.name for i, d in zip(inputs, dims) if d and d[0].dim_param == dims[0][0].dim_param}


def per_sample(feed: Mapping[str, np.ndarray], batched: Collection[str]) -> list[dict[str, np.ndarray]]:
    """``feed`` cut into one feed per sample along the batch axis of the ``batched`` inputs (views,
    no copies); the other inputs go to every part. A feed whose batched inputs disagree on the batch
    size is returned whole."""
    sizes = {feed[n].shape[0] for n in batched if n in feed and feed[n].ndim}
    if len(sizes) != 1 or (size := sizes.pop()) < 2:
        return [dict(feed)]
    return [{n: v[i : i + 1] if n in batched and v.ndim else v for n, v in feed.items()} for i in range(size)]


def external_matches(
    model, weights: Mapping[str, np.ndarray], base_dir: str | Path, chunk_bytes: int = 1 << 24
) -> dict[str, np.ndarray]:
    """The arrays of ``weights`` equal, byte for byte, to the external-data initializer of the same
    name in ``model`` (read from files in ``base_dir`` a chunk at a time, so the check maps nothing)."""
    import onnx
    from onnx.external_data_helper import ExternalDataInfo, uses_external_data

    matches, buffer = {}, bytearray(chunk_bytes)
    for init in model.graph.initializer:
        array = weights.get(init.name)
        if (
            array is None
            or not uses_external_data(init)
            or init.data_type != onnx.TensorProto.FLOAT
            or array.dtype != np.float32
            or not array.flags.c_contiguous  # ORT would get a copy, not the caller's memory
            or tuple(array.shape) != tuple(init.dims)
        ):
            continue
        info = ExternalDataInfo(init)
        flat = array.reshape(-1).view(np.uint8)
        if info.length not in (None, flat.size):
            continue
        with open(Path(base_dir) / info.location, "rb") as f:
            f.seek(info.offset or 0)
            pos = 0
            while pos < flat.size:
                got = f.readinto(memoryview(buffer)[: min(chunk_bytes, flat.size - pos)])
                if not got or not np.array_equal(np.frombuffer(buffer, np.uint8, got), flat[pos : pos + got]):
                    break
                pos += got
        if pos == flat.size:
            matches[init.name] = array
    return matches


def pruned_graph(model, outputs: Sequence[str]):
    """Copy of ``model`` whose outputs are ``outputs``, keeping only the nodes and initializers they need."""
    import onnx

    graph = model.graph
    needed = set(outputs)
    if any(
        a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
        for n in graph.node
        for a in n.attribute
    ):
        keep = list(graph.node)  # subgraphs read outer tensors implicitly: no pruning
    else:
        keep = []
        for node in reversed(graph.node):
            if needed.intersection(node.output):
                keep.append(node)
                needed.update(i for i in node.input if i)
        keep.reverse()
    value_infos = {vi.name: vi for vi in (*graph.value_info, *graph.input, *graph.output)}
    used = {i for n in keep for i in n.input} | set(outputs)
    new = onnx.helper.make_graph(
        keep,
        graph.name,
        [i for i in graph.input if i.name in used],
        [value_infos[n] for n in outputs],
        initializer=[t for t in graph.initializer if t.name in used],
    )
    return onnx.helper.make_model(new, opset_imports=model.opset_import, ir_version=model.ir_version)


def histogram_ranges(
    model_path: str | Path,
    records: Sequence[Mapping],
    input_names: Sequence[str],
    *,
    op_types: Sequence[str],
    method: str = "percentile",
    symmetric: bool = False,
    percentile: float = 99.999,
    memory_gb: float = 1.0,
    dtypes: Mapping[str, str] | None = None,
    tensors: Collection[str] | None = None,
    weights: Mapping[str, np.ndarray] | None = None,
):
    """ORT's ``TensorsData`` for ``method`` ("percentile" or "entropy") over ``records``, as
    ``quantize_static`` would compute it with ``CalibStridedMinMax=1``, holding at most about
    ``memory_gb`` of calibrated activations per record at a time.

    ``model_path`` must keep its weights in an external-data file beside it or inline (the pruned
    graphs are written next to it and reference that file). ``tensors`` limits the calibration to
    those of ORT's tensors (``None``: all of them, as ORT): ``quantize`` leaves out the attention
    matmuls' activations, which no level quantises and which are the largest (1 GB each at 512^2).
    ``weights`` (name -> array, e.g. :func:`~fastdiff.engines.export.weight_views` of the U-Net the
    graph was exported from): those equal to an initializer's bytes in the data file are given to the
    sessions in place of that initializer, so a caller that holds the U-Net holds one copy of them, not
    two (2.3 GB of full SD1.5's weights are convolution weights the export keeps as they are:
    benchmarks/results/ort-session-memory.md, held_gb).
    """
    import onnx
    import onnxruntime as ort
    from onnxruntime.quantization.calibrate import CalibrationMethod, HistogramCollector, TensorsData

    if method not in HISTOGRAM_METHODS:
        raise ValueError(f"histogram_ranges computes {list(HISTOGRAM_METHODS)}, got {method!r}")
    if not memory_gb > 0:
        raise ValueError(f"memory_gb must be positive, got {memory_gb!r}")
    if not records:
        raise ValueError("histogram_ranges needs at least one record")
    model_path = Path(model_path)
    dtypes = dict(dtypes or {})
    with tempfile.TemporaryDirectory(prefix="fastdiff-ort-calib-", dir=model_path.parent) as tmp:
        inferred_path = Path(tmp) / "inferred.onnx"
        onnx.shape_inference.infer_shapes_path(str(model_path), str(inferred_path))  # as ORT's calibrator
        model = onnx.load(str(inferred_path), load_external_data=False)
    names = tensors_to_calibrate(model, op_types)
    if tensors is not None:
        wanted = set(tensors)
        names = [n for n in names if n in wanted]
        if not names:
            raise ValueError("none of the given tensors is one that ONNX Runtime would calibrate")
    first = records[0]
    sizes = tensor_bytes(
        model, {n: tuple(first[n].shape) for n in input_names if n in first}, model_path.parent
    )
    groups = group_by_bytes(names, sizes, int(memory_gb * 2**30))
    batched = batch_inputs(model)
    shared = external_matches(model, weights, model_path.parent) if weights else {}
    # ORT's defaults for these calibrators (create_calibrator): percentile 2048 bins; entropy 128 / 128.
    bins = {"percentile": (2048, 2048), "entropy": (128, 128)}[method]
    collector = HistogramCollector(
        method=method,
        symmetric=symmetric,
        num_bins=bins[0],
        num_quantized_bins=bins[1],
        percentile=percentile,
        scenario="same",
    )
    with record_bar(len(groups) * len(records), "fastdiff ORT calibration") as bar:
        for k, group in enumerate(groups):
            bar.set_postfix_str(f"tensor group {k + 1}/{len(groups)}")
            options = ort.SessionOptions()
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # as ORT's
            # Without the arena each intermediate is freed when consumed: with it, the unoptimised
            # graph's peak (attention maps at 512^2) stayed reserved and a late group reached 20 GB.
            options.enable_cpu_mem_arena = False
            # Pre-packing makes a packed copy of every MatMul weight (1 GB for SD1.5 at session
            # creation) for a session that runs a few records (benchmarks/results/ort-session-memory.md).
            options.add_session_config_entry("session.disable_prepacking", "1")
            pruned = pruned_graph(model, group)
            # ORT runs on these arrays instead of the data file; add_initializer does not copy them
            # (add_external_initializers does: no saving). Peak of a 512^2 run with the caller's
            # weights held: 8.6 GB from the file, 6.8 GB from the arrays. They must outlive the session.
            held = []
            for init in pruned.graph.initializer:
                if init.name in shared:
                    held.append(ort.OrtValue.ortvalue_from_numpy(shared[init.name]))
                    options.add_initializer(init.name, held[-1])
            part = model_path.parent / f".fastdiff-calib-{k}-{model_path.name}"
            onnx.save(pruned, str(part))
            del pruned
            try:
                session = ort.InferenceSession(str(part), options, providers=["CPUExecutionProvider"])
            finally:
                part.unlink()
            feeds = [i.name for i in session.get_inputs()]
            for record in records:
                feed = record_feed(record, feeds, dtypes)
                # One sample at a time: the transient intermediates (attention scores, 1 GB per sample
                # at 512^2) shrink with the batch, while the outputs of all samples are collected
                # together, so each tensor's histogram sees the record's values in one call, as ORT's.
                outputs = [session.run(group, piece) for piece in per_sample(feed, batched)]
                with contextlib.redirect_stdout(io.StringIO()):  # the collector prints a line per call
                    for j, name in enumerate(group):  # a tensor at a time: its copies are the only ones
                        collector.collect({name: [out[j] for out in outputs]})
                        for out in outputs:
                            out[j] = None
                del outputs  # else this group's outputs stay alive while the next record or group runs
                bar.update()
            del session, held
    kind = {"percentile": CalibrationMethod.Percentile, "entropy": CalibrationMethod.Entropy}[method]
    with contextlib.redirect_stdout(io.StringIO()):
        return TensorsData(kind, collector.compute_collection_result())
