"""One-call optimisation of diffusers UNets: :func:`optimize`, :func:`report`, :func:`restore`.

Where to add a pass: write a :class:`~fastdiff.optimize.passes.Pass` (module
edits go through the :class:`PassContext` it is given, so they can be undone
and verified) and add it to :func:`~fastdiff.optimize.passes.default_passes`.
Kernel-backed passes live in :mod:`fastdiff.optimize.passes_kernels`.
"""

from fastdiff import _lazy

_EXPORTS = {
    "OptimizeConfig": "fastdiff.optimize.config",
    "PassContext": "fastdiff.optimize.context",
    "Pass": "fastdiff.optimize.passes",
    "optimize": "fastdiff.optimize.core",
    "report": "fastdiff.optimize.core",
    "restore": "fastdiff.optimize.core",
    "OptimizeReport": "fastdiff.optimize.report",
    "PassReport": "fastdiff.optimize.report",
    "Verification": "fastdiff.optimize.report",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = _lazy.attach(__name__, globals(), _EXPORTS)
