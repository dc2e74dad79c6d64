"""Give back the pages of memory-mapped weight files that a compiled model no longer reads.

OpenVINO reads an IR's ``.bin`` (and an ONNX model's external data) through a read-only memory map.
Compiling for the CPU and running once copies every weight into the plugin's own blocked layouts,
yet the mapped pages stay resident, counted in the process's RSS: during NNCF calibration of the
full SD1.5 U-Net that is a second 3.4 GB copy of the weights. ``madvise(MADV_DONTNEED)`` on those
mappings unmaps the pages from this process; a later read faults them back in from the page cache
(or disk), so nothing changes but resident memory. Only read-only mappings are touched: a private
writable mapping could hold modified pages that this would discard.

Linux only (``/proc/self/maps`` and ``madvise``); elsewhere these are no-ops returning 0.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import sys
from collections.abc import Iterable
from pathlib import Path

_MADV_DONTNEED = 4


@functools.cache
def _libc() -> ctypes.CDLL:
    """The C library, looked up once (``find_library`` runs ``ldconfig``; the heap is trimmed per record)."""
    return ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def mapped_ranges(paths: Iterable[str | os.PathLike]) -> list[tuple[int, int]]:
    """(start, end) of this process's read-only mappings of any of ``paths``."""
    if not sys.platform.startswith("linux"):
        return []
    wanted = {os.path.realpath(p) for p in paths}
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            if len(fields) < 6 or fields[5].strip() not in wanted or fields[1][1] != "-":
                continue
            start, end = (int(x, 16) for x in fields[0].split("-"))
            out.append((start, end))
    return out


def release_mapped_pages(paths: Iterable[str | os.PathLike]) -> int:
    """``madvise(MADV_DONTNEED)`` on the read-only mappings of ``paths``; returns the bytes advised."""
    ranges = mapped_ranges(paths)
    if not ranges:
        return 0
    libc = _libc()
    libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    done = 0
    for start, end in ranges:
        if libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), _MADV_DONTNEED) == 0:
            done += end - start
    return done


def release_free_heap() -> bool:
    """Give the C heap's free pages back to the system (glibc ``malloc_trim(0)``); False where unavailable.

    Freed blocks under glibc's mmap threshold, which grows to 32 MB as large blocks are freed, stay in
    the heap and count in RSS until something trims it. Trimmed before each NNCF statistics model compiles
    and after each record, a whole OpenVINO int8 build of SD1.5 at 512^2 peaked at 8.63 GB instead of
    9.66 GB (benchmarks/results/engines-cpu-build-profile-ov-int8-512-32-{bf16stats,trim}.md)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        trim = _libc().malloc_trim
    except (OSError, AttributeError):  # not glibc (musl has no malloc_trim)
        return False
    trim.argtypes = (ctypes.c_size_t,)
    trim(0)
    return True


def weight_files(model_path: str | os.PathLike) -> list[Path]:
    """The files holding a model's weights: an IR's ``.bin``, an ONNX model's ``.data`` (those that exist)."""
    p = Path(model_path)
    return [f for f in (p.with_suffix(".bin"), p.with_name(p.name + ".data")) if f.is_file()]


class ReleasingMappedPages:
    """Context manager: a daemon thread calls :func:`release_mapped_pages` every ``every`` seconds.

    Periodic rather than once because the CPU plugin reads the mapped weights again while it packs
    them on the first inference (and NNCF reads them for the weight ranges); each read faults pages
    back in, and the next call drops them again.
    """

    def __init__(self, paths: Iterable[str | os.PathLike], every: float = 0.5):
        import threading

        self.paths = [Path(p) for p in paths]
        self.every = float(every)
        self.released = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="fastdiff-release-mapped")

    def _run(self):
        while not self._stop.wait(self.every):
            self.released += release_mapped_pages(self.paths)

    def __enter__(self):
        if self.paths:
            self._thread.start()
        return self

    def __exit__(self, *exc):
        if self.paths:
            self._stop.set()
            self._thread.join()
            self.released += release_mapped_pages(self.paths)
        return False
