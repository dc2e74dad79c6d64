"""Test-wide setup.

Triton kernels can run on CPU tensors only through the interpreter, and the
switch must be set before any kernel is defined, hence before fastdiff's
kernel modules are imported. On a CUDA machine the real kernels run.
"""

import os

# PyTorch's OpenMP threads otherwise spin-wait; where processes share the two
# cores (pytest plus a notebook kernel, say) that made generation ~50x slower.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402
import torch  # noqa: E402

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Plans measured during tests must not leak into (or come from) the user's cache.
os.environ.setdefault(
    "FASTDIFF_CACHE_DIR", os.path.join(os.path.dirname(__file__), "..", ".pytest_cache", "fastdiff")
)
torch.set_num_threads(min(2, os.cpu_count() or 1))


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for a module of tiny-tensor tests: on a busy 2-core machine, intra-op thread
    hand-offs cost more than the maths. Use with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
