"""Run NNCF's statistics models a few rows of a record at a time, giving NNCF the outputs of the whole record.

NNCF collects activation ranges by running a statistics model (the float model plus reductions of the
tensors it quantises) on each calibration record. A record of a classifier-free-guidance pipeline holds
two rows, and at 512^2 their activations are what takes the OpenVINO int8 build of the full SD1.5 U-Net
over 8 GB (``benchmarks/results/engines-cpu-build-profile-ov-int8-512-32-*.md``). Feeding the rows to NNCF
as separate samples halves that, but changes the ranges: NNCF averages per-sample minima, and per-row
minima average to a narrower range than per-record ones (fastdiff-tiny end to end lost 0.5-1.9 points,
``engines-tiny-e2e-avx512-576-rows.md``). Here NNCF still sees one sample per record: the model runs on
pieces of the record and the pieces' outputs are combined into what the whole record gives. That is exact
for the outputs NNCF's range statistics produce, each checked in the graph (:func:`row_plan`):

* a ReduceMin / ReduceMax over axes that include the batch axis: the min (max) of the pieces';
* an output that depends on no model input (a weight's statistics): any piece's;
* a ShapeOf of a batch-first tensor: the pieces' shape with their batch sizes summed;
* the model's own outputs (batch-first): the pieces concatenated.

A statistics model with any other output (a mean, a raw activation, a reduction that keeps the batch axis)
runs on whole records, as NNCF would.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

# A Result's producer -> its plan entry, and a plan entry -> how pieces combine (elementwise over
# identically shaped piece outputs).
_REDUCE = {"ReduceMin": "min", "ReduceMax": "max"}
_ELEMENTWISE = {"min": np.minimum, "max": np.maximum}


def _data_dependent(model) -> set[str]:
    """Friendly names of the ops whose value depends on a model input (in topological order, one pass)."""
    dependent: set[str] = set()
    for op in model.get_ordered_ops():
        if op.get_type_name() == "Parameter" or any(
            v.get_node().get_friendly_name() in dependent for v in op.input_values()
        ):
            dependent.add(op.get_friendly_name())
    return dependent


def row_plan(model, own_outputs: set[str]) -> dict[str, str] | None:
    """How each output of NNCF's statistics ``model`` combines over row pieces, by tensor name: "min",
    "max", "first", "shape" or "concat"; None when some output cannot be combined exactly.

    ``own_outputs``: tensor names of the outputs the model had before NNCF added its statistics."""
    dependent = _data_dependent(model)
    plan: dict[str, str] = {}
    for result in model.get_results():
        value = result.input_value(0)
        producer = value.get_node()
        kind = producer.get_type_name()
        names = value.get_names()
        if producer.get_friendly_name() not in dependent:
            how = "first"
        elif names & own_outputs:
            how = "concat"
        elif kind == "ShapeOf":
            how = "shape"
        elif kind in _REDUCE:
            axes_node = producer.input_value(1).get_node()
            rank = producer.input_value(0).get_partial_shape().rank
            if axes_node.get_type_name() != "Constant" or rank.is_dynamic:
                return None
            axes = {int(a) % rank.get_length() for a in np.atleast_1d(axes_node.get_data())}
            if 0 not in axes:
                return None  # the batch axis survives: per-row values, not a record's
            how = _REDUCE[kind]
        else:
            return None
        plan.update(dict.fromkeys(names, how))
    return plan


def record_batch(data) -> int:
    """The batch every input of ``data`` (a dict of arrays) shares along axis 0; 0 when there is none."""
    if not isinstance(data, Mapping) or not data:
        return 0
    leading = {np.shape(v)[0] if np.ndim(v) else None for v in data.values()}
    return leading.pop() if len(leading) == 1 and None not in leading else 0


def infer_in_rows(
    infer: Callable[[dict], Mapping[str, np.ndarray]], data: Mapping[str, np.ndarray], rows: int, plan: dict
) -> dict[str, np.ndarray]:
    """``infer`` on pieces of ``data`` (batch-first arrays) of at most ``rows`` rows, combined by ``plan``
    into the outputs of the whole batch."""
    batch = record_batch(data)
    outs = [
        {k: np.array(v, copy=True) for k, v in infer({n: a[s : s + rows] for n, a in data.items()}).items()}
        for s in range(0, batch, rows)
    ]
    combined = {}
    for name, first in outs[0].items():
        how = plan.get(name)
        parts = [o[name] for o in outs]
        if how in _ELEMENTWISE:
            combined[name] = _ELEMENTWISE[how].reduce(parts)
        elif how == "concat":
            combined[name] = np.concatenate(parts)
        elif how == "shape":
            combined[name] = first.copy()
            combined[name][0] = sum(int(p[0]) for p in parts)
        else:  # "first", or a name the plan does not know (NNCF only reads the names it added)
            combined[name] = first
    return combined


def piece_shapes(model, rows: int) -> bool:
    """Reshape ``model``'s static inputs to ``rows`` rows for the pieces; False (model untouched) when a
    static batch is not a multiple of ``rows``. Dynamic batch axes take the pieces as they are."""
    shapes = {}
    for param in model.get_parameters():
        shape = param.get_partial_shape()
        if shape.rank.is_dynamic or shape[0].is_dynamic:
            continue
        batch = shape[0].get_length()
        if batch % rows:
            return False
        if batch > rows:
            shapes[param.get_friendly_name()] = [
                rows,
                *(d.get_length() if d.is_static else -1 for d in list(shape)[1:]),
            ]
    if shapes:
        model.reshape(shapes)
    return True
