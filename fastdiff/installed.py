"""What fastdiff installed on a user's object, and how each piece undoes itself.

Every feature that changes a pipeline or U-Net in place (``optimize`` passes,
a compiled engine swapped in for ``pipe.unet``, a step cache) records an
:class:`Installation` on the object it changed. :func:`fastdiff.restore`
undoes them newest first, so features compose in any order and ``restore``
never needs to know which features exist (no attribute-name sniffing).

Extension point: a new feature calls :func:`record` after it has changed the
object, with an ``undo`` that puts back exactly what it replaced.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

_ATTR = "_fastdiff_installations"


@dataclass
class Installation:
    """One change fastdiff made to an object."""

    kind: str  # "optimize", "engine", "step_cache", ...
    undo: Callable[[], None]
    info: dict[str, Any] = field(default_factory=dict)


def installations(obj) -> list[Installation]:
    """The changes recorded on ``obj``, oldest first (empty if none)."""
    return list(obj.__dict__.get(_ATTR, ()))


def find(obj, kind: str) -> Installation | None:
    """The newest installation of ``kind`` on ``obj``, or None."""
    for inst in reversed(obj.__dict__.get(_ATTR, ())):
        if inst.kind == kind:
            return inst
    return None


def record(obj, kind: str, undo: Callable[[], None], **info) -> Installation:
    """Record that ``kind`` was installed on ``obj``; ``undo`` must reverse it exactly."""
    inst = Installation(kind, undo, dict(info))
    # __dict__ directly: nn.Module.__setattr__ would try to register lists of modules.
    obj.__dict__.setdefault(_ATTR, []).append(inst)
    return inst


def undo_all(obj, kind: str | None = None) -> int:
    """Undo every recorded installation on ``obj`` (only ``kind`` if given), newest first.

    Returns how many were undone. An installation is removed from the record
    before its ``undo`` runs, so a failing undo is not retried forever.
    """
    stack = obj.__dict__.get(_ATTR, [])
    done = 0
    for inst in reversed(list(stack)):
        if kind is not None and inst.kind != kind:
            continue
        stack.remove(inst)
        inst.undo()
        done += 1
    if not stack:
        obj.__dict__.pop(_ATTR, None)
    return done
