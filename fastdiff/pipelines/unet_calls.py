"""Count U-Net evaluations through a forward pre-hook (the one counter fastdiff uses)."""

from __future__ import annotations

__all__ = ["UNetCalls"]


class UNetCalls:
    """Counts forward calls of ``unet`` (``calls``) and the rows they carried (``rows``; a guided call on a
    doubled batch of B images carries 2B rows). A context manager; :meth:`remove` detaches it."""

    def __init__(self, unet):
        self.calls = 0
        self.rows = 0
        self._handle = unet.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs):
        sample = args[0] if args else kwargs["sample"]
        self.calls += 1
        self.rows += sample.shape[0]

    def reset(self) -> None:
        self.calls = self.rows = 0

    def remove(self) -> None:
        self._handle.remove()

    def __enter__(self) -> UNetCalls:
        return self

    def __exit__(self, *exc) -> None:
        self.remove()
