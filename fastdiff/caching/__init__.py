"""Step caching for diffusers U-Nets: reuse deep features across denoising steps.

``handle = fastdiff.step_cache(pipe, mode="uniform", interval=3, branch=0)`` (or ``"schedule"``,
``"adaptive"``, ``"off"``; ``gate_step=`` adds cross-attention gating; ``forecast="linear"`` extrapolates the
cached feature from the last full steps instead of replaying it, :mod:`.forecast`). ``fastdiff.restore(pipe)``
removes it.
See :mod:`fastdiff.caching.cache` for the design, :mod:`.policy` for the measured refresh schedule and
:mod:`.pipeline` for fastdiff's drop-in pipelines (rows stopping early; ``output.fastdiff.step_cache``).
"""

from fastdiff.caching.cache import MODES, StepCache, StepCacheRun, StepCacheStats, step_cache
from fastdiff.caching.policy import StepProfile, plan_refresh, tail_refresh
from fastdiff.caching.profile import drift_profile, measure_profile

__all__ = [
    "MODES",
    "StepProfile",
    "StepCache",
    "StepCacheRun",
    "StepCacheStats",
    "drift_profile",
    "measure_profile",
    "plan_refresh",
    "step_cache",
    "tail_refresh",
]
