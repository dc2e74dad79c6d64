"""Load ``fastdiff/kernels/`` as a standalone package: no fastdiff top level, hence no diffusers or transformers.

What the bare GPU image can import (``gpu_check.py``) and what compiles with any Triton on the path
(``ptx_report.py``); shared so that both load the kernels the same way.
"""

from __future__ import annotations

import importlib
import sys
import types
from pathlib import Path

KERNELS_DIR = Path(__file__).resolve().parents[1] / "fastdiff" / "kernels"


def load_kernels(name: str = "_fastdiff_kernels_standalone") -> types.SimpleNamespace:
    """The kernel modules as ``wg`` (winograd), ``gn`` (group_norm_silu) and ``fused`` (fused_norm_conv)."""
    if name not in sys.modules:
        pkg = types.ModuleType(name)
        pkg.__path__ = [str(KERNELS_DIR)]
        sys.modules[name] = pkg
    return types.SimpleNamespace(
        wg=importlib.import_module(f"{name}.winograd"),
        gn=importlib.import_module(f"{name}.group_norm_silu"),
        fused=importlib.import_module(f"{name}.fused_norm_conv"),
    )
