"""Lazy attributes for packages (PEP 562), so ``import fastdiff`` costs almost nothing.

A package lists which public name lives in which module; the module is
imported on first attribute access and the value cached in the package's
namespace. Submodules listed in ``submodules`` load the same way, so
``import fastdiff; fastdiff.tiny.load_pipeline(...)`` works without importing
``fastdiff.tiny`` first.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping


def attach(package: str, namespace: dict, exports: Mapping[str, str], submodules: Iterable[str] = ()):
    """Return ``(__getattr__, __dir__)`` for ``package`` whose ``namespace`` is its globals()."""
    submodules = frozenset(submodules)

    def __getattr__(name: str):
        if name in exports:
            value = getattr(importlib.import_module(exports[name]), name)
        elif name in submodules:
            value = importlib.import_module(f"{package}.{name}")
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        namespace[name] = value
        return value

    def __dir__():
        return sorted({*namespace, *exports, *submodules})

    return __getattr__, __dir__
