"""The undo log that makes every optimisation pass reversible."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn


class PassContext:
    """What a pass may do to a UNet, recorded so it can be undone.

    A pass never mutates the model directly: it calls :meth:`replace_module`
    or :meth:`record` with an undo function, and :meth:`skip` for modules it
    looked at and left alone. The core rolls a pass back if its verification
    fails and undoes everything on :func:`fastdiff.restore`.
    """

    def __init__(self, unet: nn.Module, pass_name: str):
        self.unet = unet
        self.pass_name = pass_name
        self.changed: list[tuple[str, str]] = []
        self.skipped: list[tuple[str, str]] = []
        self.details: dict[str, dict] = {}
        self._undo: list[Callable[[], None]] = []

    @property
    def device(self) -> torch.device:
        return next(self.unet.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.unet.parameters()).dtype

    def replace_module(self, path: str, new_module: nn.Module, note: str = "") -> None:
        """Put ``new_module`` at dotted ``path``; the original is kept for undo."""
        parent_path, _, name = path.rpartition(".")
        parent = self.unet.get_submodule(parent_path)  # "" is the U-Net itself
        old = getattr(parent, name)
        setattr(parent, name, new_module)
        self.record(path, lambda: setattr(parent, name, old), note or type(new_module).__name__)

    def record(self, path: str, undo: Callable[[], None], note: str = "") -> None:
        """Register a change made by the pass and the function that reverts it."""
        self.changed.append((path, note))
        self._undo.append(undo)

    def skip(self, path: str, reason: str) -> None:
        self.skipped.append((path, reason))

    def detail(self, path: str, **info) -> None:
        self.details.setdefault(path, {}).update(info)

    def undo(self) -> None:
        """Revert this pass's changes, newest first."""
        while self._undo:
            self._undo.pop()()
