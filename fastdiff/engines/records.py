"""Calibration records that stay on disk: read one at a time, so memory does not grow with their number.

A record is a dict of flat U-Net inputs (see :mod:`fastdiff.unet_inputs`). :class:`DiskRecords`
is a read-only sequence of records stored either one ``.safetensors`` file per record (what
``calibrate(..., save_to=dir)`` writes while the pipeline runs) or inside one ``.safetensors``
file written by :meth:`CalibrationData.save` (keys ``<index>.<name>``; read lazily through
safetensors' memory map).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from pathlib import Path

import torch

RECORD_SUFFIX = ".safetensors"


@contextlib.contextmanager
def open_records_file(path: str | os.PathLike):
    """``safetensors.safe_open`` whose failures (not safetensors, truncated) raise ValueError naming the file."""
    from safetensors import SafetensorError, safe_open

    try:
        handle = safe_open(str(path), framework="pt")
    except (SafetensorError, OSError) as e:
        if isinstance(e, FileNotFoundError):
            raise FileNotFoundError(f"calibration file {str(path)!r} does not exist") from e
        raise ValueError(
            f"calibration file {str(path)!r} is not a readable safetensors file (truncated or another "
            f"format?): {e}"
        ) from e
    with handle as f:
        try:
            yield f
        except SafetensorError as e:
            raise ValueError(f"calibration file {str(path)!r} is damaged: {e}") from e


def record_bar(total: int, desc: str):
    """A tqdm bar counting calibration records, gone from the terminal once closed (NNCF's and ONNX
    Runtime's passes over the records)."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="record", leave=False)


class DiskRecords(Sequence):
    """Records read from disk on access; slicing and index lists give views, never copies."""

    def __init__(self, entries: Sequence[tuple[str, str | None]]):
        # (file, key prefix): prefix None means the file holds exactly one record.
        self._entries = list(entries)

    @classmethod
    def from_dir(cls, directory: str | os.PathLike) -> DiskRecords:
        files = sorted(Path(directory).glob(f"*{RECORD_SUFFIX}"))
        return cls([(str(f), None) for f in files])

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> DiskRecords:
        with open_records_file(path) as f:
            indices = sorted({int(k.split(".", 1)[0]) for k in f.keys()})
        return cls([(str(path), f"{i:06d}.") for i in indices])

    def __len__(self) -> int:
        return len(self._entries)

    def take(self, indices: Sequence[int]) -> DiskRecords:
        return DiskRecords([self._entries[i] for i in indices])

    def __getitem__(self, index):
        if isinstance(index, slice):
            return DiskRecords(self._entries[index])
        path, prefix = self._entries[index]
        with open_records_file(path) as f:
            if prefix is None:
                return {k: f.get_tensor(k) for k in f.keys()}
            return {k[len(prefix) :]: f.get_tensor(k) for k in f.keys() if k.startswith(prefix)}


class RecordSpill:
    """Writes each record to ``directory`` as it arrives (the recorder keeps none in memory)."""

    def __init__(self, directory: str | os.PathLike):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        stale = list(self.directory.glob(f"*{RECORD_SUFFIX}"))
        if stale:
            raise FileExistsError(
                f"save_to={str(self.directory)!r} already holds {len(stale)} records; pass an empty or new folder"
            )
        self.count = 0

    def append(self, record: dict[str, torch.Tensor]) -> None:
        from safetensors.torch import save_file

        tmp = self.directory / f".{self.count:06d}.tmp"
        save_file({k: v.contiguous() for k, v in record.items()}, str(tmp))
        os.replace(tmp, self.directory / f"{self.count:06d}{RECORD_SUFFIX}")  # never a half-written record
        self.count += 1

    def records(self) -> DiskRecords:
        return DiskRecords.from_dir(self.directory)
