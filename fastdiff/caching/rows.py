"""Rows of the cached features: keep the rows that stay in the batch, follow a guidance pair's halving.

The cache holds, per call slot, tensors whose leading dimension is the U-Net batch. When rows leave the batch
(early stop, per-row step counts) :meth:`RowSelection.keep_rows` keeps the remaining rows' features, so the
next cached step replays each row's own features; T-GATE's halving (``gate_uncond``) keeps the conditional
half (:meth:`RowSelection._halve`).
"""

from __future__ import annotations

import torch


def mean_halves(tree):
    if isinstance(tree, torch.Tensor):
        half = tree.shape[0] // 2
        return (tree[:half] + tree[half:]) / 2
    if isinstance(tree, (tuple, list)):
        return type(tree)(mean_halves(x) for x in tree)
    raise TypeError(f"step_cache: cannot average a cached {type(tree).__name__}")


def take_rows(tree, index: torch.Tensor):
    if isinstance(tree, torch.Tensor):
        return tree.index_select(0, index.to(tree.device))
    if isinstance(tree, (tuple, list)):
        return type(tree)(take_rows(x, index) for x in tree)
    raise TypeError(f"step_cache: cannot select rows of a cached {type(tree).__name__}")


class RowSelection:
    """Row bookkeeping of :class:`~fastdiff.caching.cache.StepCache` (mixed in; the state lives there)."""

    def keep_rows(self, index: torch.Tensor, num_rows: int | None = None) -> None:
        """Keep only rows ``index`` of the cached features (rows that left the batch are dropped).

        ``index`` indexes the rows of the previous step. The U-Net batch may hold each row several times
        in consecutive blocks (classifier-free guidance batches ``[uncond; cond]``): pass ``num_rows``,
        the number of rows before this call, and the blocks are inferred as ``batch // num_rows``.
        """
        if not isinstance(index, torch.Tensor) or index.dim() != 1 or index.dtype in (torch.bool,):
            raise ValueError(f"index must be a 1-D integer tensor, got {index!r}")
        if index.is_floating_point() or index.is_complex():
            raise ValueError(f"index must hold integers, got dtype {index.dtype}")
        index = index.long().cpu()
        if index.numel() != index.unique().numel():
            raise ValueError(f"index has repeated rows: {index.tolist()}")
        for slot, store in enumerate(self._slots):
            batch = self._slot_batch[slot]
            if batch is None:
                continue
            rows = batch if num_rows is None else num_rows
            if not isinstance(rows, int) or rows < 1 or batch % rows:
                raise ValueError(f"num_rows must divide the cached batch {batch}, got {num_rows!r}")
            if index.numel() and (int(index.min()) < 0 or int(index.max()) >= rows):
                raise ValueError(f"index {index.tolist()} is out of range for {rows} rows")
            full = torch.cat([index + g * rows for g in range(batch // rows)])
            for k in list(store):
                store[k] = take_rows(store[k], full)
            gate = self._gate[slot]
            for k in list(gate):
                gate[k] = take_rows(gate[k], full)
            if self._probe_prev[slot] is not None:
                self._probe_prev[slot] = take_rows(self._probe_prev[slot], full)
            self._slot_batch[slot] = full.numel()

    @staticmethod
    def _is_guidance_pair(sample: torch.Tensor, t) -> bool:
        """A classifier-free guidance batch: the latents are the same rows twice, ``[x; x]``."""
        b = sample.shape[0]
        if b % 2:
            return False
        t = torch.as_tensor(t)
        same_t = t.dim() == 0 or t.numel() == 1 or torch.equal(t[: b // 2], t[b // 2 :])
        return bool(same_t) and torch.equal(sample[: b // 2], sample[b // 2 :])

    def _holds_rows(self, num_rows: int, blocks: int) -> bool:
        """Whether every cached slot holds ``num_rows`` rows in ``blocks`` blocks (one after a halved pair)."""
        expected = num_rows if self._halved else blocks * num_rows
        return all(b is None or b == expected for b in self._slot_batch)

    def _halve(self, args, kwargs, batch: int):
        """Run only the conditional half (T-GATE, Zhang et al. 2024, Sec. 4: after the gate the two halves differ
        only through cross-attention, which is now the halves' mean), and keep the cache's rows in step."""
        half = batch // 2
        cond = torch.arange(half, batch)

        def take(x):
            if isinstance(x, torch.Tensor) and x.dim() and x.shape[0] == batch:
                return x[half:]
            if isinstance(x, dict):
                return {k: take(v) for k, v in x.items()}
            return x

        slot = self._slot
        if self._slot_batch[slot] == batch:  # first halved call: cached rows follow the conditional half
            store = self._slots[slot]
            for k in list(store):
                store[k] = take_rows(store[k], cond)
            gate = self._gate[slot]
            for k in list(gate):
                gate[k] = mean_halves(gate[k])
            if self._probe_prev[slot] is not None:
                self._probe_prev[slot] = take_rows(self._probe_prev[slot], cond)
            self._slot_batch[slot] = half
        self._halved = True
        return tuple(take(a) for a in args), {k: take(v) for k, v in kwargs.items()}
