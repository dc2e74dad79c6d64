"""OpenVINO "mixed": per-group int8 sensitivity from one NNCF run, and the mixed model it chooses (#14).

NNCF quantises the float model once with its weights left as FakeQuantize over the float constants (its
backend parameter ``compress_weights=False``), so every quantised Convolution/MatMul reads its weight and
its activation through FakeQuantize nodes, and un-quantising a layer is rewiring those inputs past them.

* A group's int8-alone model, what :func:`fastdiff.engines.layer_sensitivity` measures with ONNX Runtime,
  is that model with every other group's layers rewired; its SNR against the float model on held-back
  records is the group's sensitivity.
* The mixed model is that model with the weak groups' layers rewired, its other weights then compressed to
  int8 as NNCF itself does after quantising.

NNCF collects its statistics on the float model, so the layers that stay int8 keep the ranges of the
int8 build. Rewired MatMuls keep SmoothQuant's per-channel rescaling of weight and activation, which is
the identity in float. Before this module, mixed ran ONNX Runtime's calibration and one quantisation per
group on the ONNX export, then NNCF: 291 s of build for the full SD1.5 U-Net at 256^2.
"""

from __future__ import annotations

import torch

from . import runtime_ov
from .quality import sensitivity_row
from .quantization import category_of

WEIGHTED = ("Convolution", "GroupConvolution", "MatMul")
# Ops that may sit between a FakeQuantize and the op reading it (proj_out reads its input through Reshape and
# Transpose, attention its Q and K); rewiring happens at the input that reads the FakeQuantize.
_PASS_THROUGH = frozenset({"Convert", "Reshape", "Transpose", "Squeeze", "Unsqueeze"})
# Groups of the ops besides weighted layers whose inputs NNCF quantises.
_OTHER_GROUPS = {"ScaledDotProductAttention": "attention", "Interpolate": "upsample"}


def quantised_inputs(model) -> dict[str, list]:
    """Friendly name of each op that reads a FakeQuantize (a quantised "layer": weighted, attention, ...)
    -> the ``openvino.Input`` ports that read one on its paths (its own, or a pass-through op's)."""
    out = {}
    for op in model.get_ordered_ops():
        if op.get_type_name() in _PASS_THROUGH or op.get_type_name() == "FakeQuantize":
            continue
        ports = []
        for port in op.inputs():
            node = port.get_source_output().get_node()
            for _ in range(4):
                if node.get_type_name() == "FakeQuantize":
                    ports.append(port)
                    break
                if node.get_type_name() not in _PASS_THROUGH:
                    break
                port = node.input(0)
                node = port.get_source_output().get_node()
        if ports:
            out[op.get_friendly_name()] = ports
    return out


def layer_groups(model) -> dict[str, list[str]]:
    """Category (conv, ffn, qkv, ...: :func:`fastdiff.engines.quantization.category_of`; "attention" for
    attention's own Q and K quantisers, "upsample" for nearest Interpolate's input, else the op type) ->
    the names of the quantised layers in it."""
    quantised = quantised_inputs(model)
    groups: dict[str, list[str]] = {}
    for op in model.get_ordered_ops():
        name = op.get_friendly_name()
        if name in quantised:
            kind = op.get_type_name()
            group = (
                category_of(runtime_ov.module_path_name(name), conv=kind != "MatMul")
                if kind in WEIGHTED
                else _OTHER_GROUPS.get(kind, kind)
            )
            groups.setdefault(group, []).append(name)
    return groups


def unquantise(model, layers) -> int:
    """Rewire ``layers`` (friendly names) of ``model`` in place past the FakeQuantize nodes they read;
    returns how many inputs were rewired. FakeQuantize nodes nothing reads any more leave the graph."""
    wanted = set(layers)
    rewired = 0
    for name, ports in quantised_inputs(model).items():
        if name not in wanted:
            continue
        for port in ports:
            fq = port.get_source_output().get_node()
            port.replace_source_output(fq.input_value(0))
            rewired += 1
    return rewired


def _outputs(model, records, hint: str) -> list[torch.Tensor]:
    runner = runtime_ov.OvRunner(model, hint=hint)  # compiled for the records' shape, as the engine
    return [runner(r) for r in records]


def group_sensitivity(float_model, quantised, evaluation, hint: str) -> list[dict]:
    """SNR of the output when only one group is int8, most sensitive group first (as
    :func:`fastdiff.engines.layer_sensitivity`: ``{"group", "num_nodes", "snr_db", "cosine"}``).

    ``quantised`` is NNCF's result with uncompressed weights; both models run the ``evaluation`` records
    at OpenVINO inference precision ``hint``, the one the engine runs at.
    """
    records = list(evaluation)
    refs = _outputs(float_model, records, hint)
    groups = layer_groups(quantised)
    results = []
    for group, layers in sorted(groups.items()):
        alone = quantised.clone()  # constants are shared, not copied
        unquantise(alone, [n for g, names in groups.items() if g != group for n in names])
        results.append(sensitivity_row(group, len(layers), _outputs(alone, records, hint), refs))
        del alone
    return sorted(results, key=lambda r: r["snr_db"])


def mixed_model(quantised, weak_groups) -> list[str]:
    """Un-quantise the layers of ``weak_groups`` in ``quantised`` (in place) and compress the remaining
    weight FakeQuantize nodes to int8 constants, as NNCF does; returns the layers un-quantised."""
    from openvino._offline_transformations import compress_quantize_weights_transformation

    groups = layer_groups(quantised)
    kept = [n for g in weak_groups for n in groups.get(g, [])]
    unquantise(quantised, kept)
    compress_quantize_weights_transformation(quantised)  # NNCF's own last step (private OpenVINO API)
    return kept
