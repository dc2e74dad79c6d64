"""Fold the weight statistics of NNCF's statistics models with numpy before OpenVINO compiles them.

NNCF's min-max statistics model reduces every quantised layer's weights inside the model (ReduceMax of Abs
of the weight Constant, per output channel). Compiling it, OpenVINO constant-folds those reductions with
its reference kernels: over the full SD1.5 U-Net's weights that was most of the statistics pass
(``benchmarks/results/engines-cpu-int8-build-256-avx512.md``). :func:`fold_constant_statistics` computes
them with numpy (the same values), and :func:`statistics_models` applies it to every model NNCF compiles
while :func:`fastdiff.engines.runtime_ov.quantize` runs (and, where asked, compiles them at the bf16 hint).
"""

from __future__ import annotations

import contextlib

import numpy as np

from . import nncf_rows
from .mapped import release_free_heap

_REDUCTIONS = {"ReduceMax": np.max, "ReduceMin": np.min, "ReduceMean": np.mean}


def _constant_value(output) -> np.ndarray | None:
    """The value of ``output`` when it is a Constant, possibly through Abs or an f32 Convert; else None."""
    node = output.get_node()
    kind = node.get_type_name()
    if kind == "Constant":
        return node.get_data()
    if kind not in ("Abs", "Convert") or str(node.get_output_element_type(0)) not in (
        "f32",
        "<Type: 'float32'>",
    ):
        return None
    value = _constant_value(node.input_value(0))
    if value is None:
        return None
    return np.abs(value) if kind == "Abs" else value.astype(np.float32)


def fold_constant_statistics(model) -> int:
    """Compute, with numpy, the reductions of constants that feed only the model's outputs; returns how many.

    Min/max are exact; means are taken in float64, then cast. Only reductions whose every consumer is a
    Result are replaced, so the graph's computation is unchanged; the replacement keeps the output's tensor
    names (NNCF reads its statistics by them).
    """
    import openvino as ov  # only called while NNCF runs, so OpenVINO is there

    folded = 0
    for op in model.get_ordered_ops():
        reduce = _REDUCTIONS.get(op.get_type_name())
        if reduce is None or op.get_output_size() != 1:
            continue
        if not all(t.get_node().get_type_name() == "Result" for t in op.output(0).get_target_inputs()):
            continue
        axes_node = op.input_value(1).get_node()
        value = _constant_value(op.input_value(0))
        if value is None or axes_node.get_type_name() != "Constant":
            continue
        axes = tuple(sorted({int(a) % max(value.ndim, 1) for a in np.atleast_1d(axes_node.get_data())}))
        keep = bool(op.get_attributes().get("keep_dims", False))
        if reduce is np.mean:
            result = value.mean(axis=axes, keepdims=keep, dtype=np.float64)
        else:
            result = reduce(value, axis=axes, keepdims=keep)
        result = np.ascontiguousarray(result, dtype=value.dtype)
        if tuple(result.shape) != tuple(op.get_output_partial_shape(0).to_shape()):
            continue  # an axes form this does not reproduce: leave it to OpenVINO
        const = ov.op.Constant(result)
        const.set_friendly_name(op.get_friendly_name())
        const.output(0).get_tensor().set_names(op.output(0).get_names())
        op.output(0).replace(const.output(0))
        folded += 1
    return folded


@contextlib.contextmanager
def statistics_models(
    enabled: bool = True,
    hint: str | None = None,
    rows: int | None = None,
    own_outputs: frozenset = frozenset(),
):
    """While NNCF runs, fold its statistics models' constant reductions (:func:`fold_constant_statistics`)
    before it compiles them, compile them at OpenVINO inference precision ``hint`` ("f32", "bf16"; None
    keeps NNCF's f32), run them ``rows`` rows of a record at a time where their outputs combine exactly
    (:mod:`fastdiff.engines.nncf_rows`; ``own_outputs``: the tensor names of the model's own outputs; None
    runs whole records), and give the C heap's free pages back before each compile and after each record
    (:func:`fastdiff.engines.mapped.release_free_heap`). Wraps ``nncf.openvino.engine.OVNativeEngine`` (not
    thread-safe; a no-op where that class is missing: another NNCF version then runs as before).

    A bf16 statistics model is what an int8 engine run at the bf16 hint computes (its unquantised layers
    are bf16 there), and the CPU plugin packs its weights and holds its activations at half the size."""
    if hint not in (None, "f32", "bf16"):
        raise ValueError(f"statistics hint must be 'f32', 'bf16' or None, got {hint!r}")
    try:
        from nncf.openvino import engine as nncf_engine

        cls = nncf_engine.OVNativeEngine
        real = cls.__init__
        compiled_engine = nncf_engine.OVCompiledModelEngine
        from nncf.openvino.graph.model_utils import model_has_state
    except (ImportError, AttributeError):
        enabled, hint, rows = False, None, None
    if not enabled and hint is None and rows is None:
        yield
        return
    real_infer = cls.infer

    def infer(self, input_data):
        pieces = getattr(self, "_fastdiff_rows", None)
        if pieces is not None and nncf_rows.record_batch(input_data) > rows:
            out = nncf_rows.infer_in_rows(lambda d: real_infer(self, d), input_data, rows, pieces)
        else:
            out = real_infer(self, input_data)
        release_free_heap()
        return out

    def init(self, model, *args, **kwargs):
        release_free_heap()  # what the previous pass (or SmoothQuant) freed, before this compile allocates
        if enabled:
            fold_constant_statistics(model)
        plan = nncf_rows.row_plan(model, own_outputs) if rows is not None else None
        if plan is not None and not nncf_rows.piece_shapes(model, rows):
            plan = None  # static records whose batch the pieces do not divide: whole records
        if hint is None:
            real(self, model, *args, **kwargs)
        else:
            import openvino as ov

            compiled = ov.Core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": hint})
            self.engine = compiled_engine(compiled, model_has_state(model))
        self._fastdiff_rows = plan

    cls.__init__, cls.infer = init, infer
    try:
        yield
    finally:
        cls.__init__, cls.infer = real, real_infer
