"""Giving back the resident pages of read-only memory-mapped weight files (fastdiff.engines.mapped)."""

from __future__ import annotations

import mmap
import sys
import time

import numpy as np
import pytest

from fastdiff.engines.mapped import (
    ReleasingMappedPages,
    mapped_ranges,
    release_free_heap,
    release_mapped_pages,
    weight_files,
)

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/maps and madvise")


def _rss_file_kb(start: int, end: int) -> int:
    """Resident kB of this process's mapping [start, end) (from /proc/self/smaps)."""
    with open("/proc/self/smaps") as f:
        inside = False
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = (lo, hi) == (start, end)
            elif inside and head == "Rss:":
                return int(line.split()[1])
    raise AssertionError("mapping not found")


def test_release_drops_resident_pages_and_keeps_the_data(tmp_path):
    data = np.random.default_rng().standard_normal(8 << 20 >> 3)  # 8 MB of fresh random float64
    path = tmp_path / "weights.bin"
    data.tofile(path)
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
    try:
        view = np.frombuffer(mm, dtype=np.float64)
        assert float(view.sum()) == float(data.sum())  # touches every page
        (rng,) = mapped_ranges([path])
        assert _rss_file_kb(*rng) >= 7 << 10
        assert release_mapped_pages([path]) == rng[1] - rng[0]
        assert _rss_file_kb(*rng) < 1 << 10
        np.testing.assert_array_equal(view, data)  # faulted back in from the file, unchanged
        assert release_mapped_pages([tmp_path / "other.bin"]) == 0
        with ReleasingMappedPages([path], every=0.01) as rel:
            view.sum()
            time.sleep(0.1)
        assert rel.released > 0 and _rss_file_kb(*rng) < 1 << 10
        del view
    finally:
        mm.close()


def test_writable_mappings_are_left_alone(tmp_path):
    path = tmp_path / "w.bin"
    path.write_bytes(b"\0" * (1 << 20))
    with open(path, "r+b") as f:
        mm = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE)  # copy-on-write: its changes live only here
    try:
        mm[:5] = b"hello"
        assert mapped_ranges([path]) == [] and release_mapped_pages([path]) == 0
        assert mm[:5] == b"hello"
    finally:
        mm.close()


def test_weight_files(tmp_path):
    (tmp_path / "engine.xml").write_text("<net/>")
    assert weight_files(tmp_path / "engine.xml") == []
    (tmp_path / "engine.bin").write_bytes(b"1")
    (tmp_path / "unet.onnx.data").write_bytes(b"1")
    assert weight_files(tmp_path / "engine.xml") == [tmp_path / "engine.bin"]
    assert weight_files(tmp_path / "unet.onnx") == [tmp_path / "unet.onnx.data"]


def _rss_anon_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    raise AssertionError("no RssAnon in /proc/self/status")


def test_release_free_heap_gives_back_freed_blocks_inside_the_heap():
    """Blocks freed in the middle of glibc's heap (here 64 x 2 MB, each pinned by a 1 MB block after it,
    below the mmap threshold that freeing a 16 MB block raised) stay resident until the heap is trimmed:
    what NNCF's previous statistics model left between passes. Skipped where libc is not glibc."""
    import ctypes
    import ctypes.util

    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    if not hasattr(libc, "malloc_trim"):
        pytest.skip("not glibc: no malloc_trim")
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = (ctypes.c_size_t,)
    libc.free.argtypes = (ctypes.c_void_p,)
    libc.free(libc.malloc(16 << 20))  # an mmapped block freed: the mmap threshold rises to 16 MB
    blocks, pins = [], []
    for _ in range(64):
        blocks.append(libc.malloc(2 << 20))
        ctypes.memset(blocks[-1], 1, 2 << 20)  # resident
        pins.append(
            libc.malloc(1 << 20)
        )  # too large for a free chunk below: the 2 MB holes stay in the middle
        ctypes.memset(pins[-1], 1, 1 << 20)
    for b in blocks:
        libc.free(b)
    held = _rss_anon_kb()
    assert release_free_heap() is True
    released = held - _rss_anon_kb()
    for p in pins:
        libc.free(p)
    assert released > 64 * 2048 * 0.75, (held, released)
