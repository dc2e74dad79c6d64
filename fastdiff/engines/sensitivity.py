"""Per-layer-group INT8 sensitivity: which parts of the U-Net tolerate quantisation.

For each group of weighted layers (by category, or by U-Net block and category)
we quantise *only that group*, run the engine on held-back inputs and measure the
SNR of its output against the float ONNX graph. Activation ranges are calibrated
once and shared through ONNX Runtime's calibration cache, so a sweep costs one
calibration plus one quantise-and-run per group.

Groups with low SNR are the ones to exclude (``quantize(..., exclude=...)``).
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterable
from pathlib import Path

from .calibration import CalibrationData
from .quality import sensitivity_row
from .quantization import DEFAULT_EXCLUDE, classify_nodes, name_filter, preprocess, quantize
from .runtime_ort import OrtRunner

_BLOCK = re.compile(r"/(down_blocks\.\d+|mid_block|up_blocks\.\d+)/")


def _group_of(name: str, category: str, by: str) -> str:
    if by == "category":
        return category
    m = _BLOCK.search(name)
    return f"{m.group(1) if m else 'top'}:{category}"


def layer_sensitivity(
    onnx_path: str | os.PathLike,
    calibration: CalibrationData,
    evaluation: CalibrationData,
    *,
    by: str = "category",
    method: str = "percentile",
    exclude: Iterable[str] = DEFAULT_EXCLUDE,
    max_calibration_records: int | None = 64,
    threads: int | None = None,
    **quantize_kwargs,
) -> list[dict]:
    """SNR of the engine output when only one layer group is INT8, most sensitive group first.

    Args:
        onnx_path: float graph from :func:`export_onnx`.
        calibration: inputs to calibrate activation ranges on.
        evaluation: held-back inputs to measure on (keep it small: one engine run per record per group).
        by: "category" (conv, ffn, qkv, ...) or "block" (e.g. ``up_blocks.1:conv``).
        exclude: node-name regexes never quantised (default: the recipe's float islands).

    Returns a list of ``{"group", "num_nodes", "snr_db", "cosine"}`` sorted by ascending SNR.
    """
    if by not in ("category", "block"):
        raise ValueError(f"by must be 'category' or 'block', got {by!r}")
    excluded = name_filter(exclude)
    onnx_path = Path(onnx_path)
    reference = OrtRunner(onnx_path, threads=threads)
    refs = [reference(r) for r in evaluation]
    del reference  # its weights and arena (several GB at 512^2) are not needed while the groups calibrate
    with tempfile.TemporaryDirectory(prefix="fastdiff-sens-") as tmp:
        tmp = Path(tmp)
        # Group on the pre-processed graph: that is the graph whose node names quantize() uses.
        categories = classify_nodes(preprocess(onnx_path, tmp / "pre.onnx"))
        groups: dict[str, list[str]] = {}
        for name, cat in categories.items():
            if cat == "attention" or excluded(name):
                continue
            groups.setdefault(_group_of(name, cat, by), []).append(name)
        cache = tmp / "ranges.json"
        results = []
        for group, nodes in sorted(groups.items()):
            out_path = quantize(
                onnx_path,
                calibration,
                nodes=nodes,
                method=method,
                out_path=tmp / "q.onnx",
                calibration_cache=cache,
                max_calibration_records=max_calibration_records,
                **quantize_kwargs,
            )
            runner = OrtRunner(out_path, threads=threads)
            results.append(sensitivity_row(group, len(nodes), [runner(r) for r in evaluation], refs))
            del runner
    return sorted(results, key=lambda r: r["snr_db"])
