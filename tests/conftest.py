"""Test-wide setup.

Triton kernels can run on CPU tensors only through the interpreter, and the
switch must be set before any kernel is defined, hence before fastdiff's
kernel modules are imported. On a CUDA machine the real kernels run.
"""

import os
import sys

# The source tree's top-level kernels/ ships as fastdiff.kernels, but `python -m pytest` puts the repo root
# first on sys.path, where it would shadow Hugging Face's `kernels` package (transformers >= 5.25 imports it).
# Move the root to the end: `fastdiff` and `benchmarks` still resolve, `kernels` resolves to the real package.
_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_at_root = [p for p in sys.path if os.path.abspath(p or os.curdir) == _root]
sys.path[:] = [p for p in sys.path if p not in _at_root] + _at_root
# Subprocesses that tests start from the repo root (python -c / -m) must not put it first either.
os.environ.setdefault("PYTHONSAFEPATH", "1")

# PyTorch's OpenMP threads otherwise spin-wait; where processes share the two
# cores (pytest plus a notebook kernel, say) that made generation ~50x slower.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Plans measured during tests must not leak into (or come from) the user's cache.
os.environ.setdefault(
    "FASTDIFF_CACHE_DIR", os.path.join(os.path.dirname(__file__), "..", ".pytest_cache", "fastdiff")
)
torch.set_num_threads(min(2, os.cpu_count() or 1))
