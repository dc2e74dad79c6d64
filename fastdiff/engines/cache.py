"""On-disk engine cache with integrity checks.

An entry is a directory ``<root>/<key>/`` holding the engine artifacts and a
``meta.json`` that records what the key was computed from and the sha256 and
size of every artifact. The key hashes the U-Net weights, the shape profile,
the precision/quantisation options and the versions of every library that
touches the artifact, so a change in any of them is a different entry.

Loading checks each artifact's size and modification time against those recorded
at build time (``verify="stat"``, the default: a 3.4 GB SD1.5 engine is not
re-read on every start); an artifact whose mtime changed is then re-hashed, so
an in-place edit is caught by its sha256 and an entry merely copied without
its timestamps is re-validated once and kept. ``verify="full"`` re-hashes every
artifact on every load (it also catches an edit that restored the old mtime).
A missing, truncated or modified file, or a meta.json that does not match,
makes the entry invalid: it is deleted and the caller rebuilds. Entries are
written to a temporary directory and renamed into place, so a crash mid-build
never leaves a half-written entry behind.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from .._cache_dir import cache_dir as _cache_dir

logger = logging.getLogger("fastdiff.engines")

CACHE_FORMAT = 2  # 2: weights hashed per tensor, artifacts carry mtime_ns
_META = "meta.json"
VERIFY = ("stat", "full")


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """``cache_dir`` if given, else ``$FASTDIFF_CACHE_DIR/engines``, else ``~/.cache/fastdiff/engines``."""
    return _cache_dir("engines", cache_dir)


def _tensor_digest(t: torch.Tensor) -> bytes:
    t = t.detach().to("cpu").contiguous()
    # A uint8 view of the tensor's own memory: no copy (hashlib reads any C-contiguous buffer and
    # releases the GIL while it hashes, so threads hash tensors in parallel).
    return hashlib.sha256(t.reshape(-1).view(torch.uint8).numpy()).digest()


def weights_fingerprint(module: torch.nn.Module, threads: int | None = None) -> str:
    """sha256 over every parameter and buffer: name, dtype, shape and the sha256 of its raw bytes.

    A two-level hash tree: each tensor is hashed on its own (``threads`` at a time, default up to
    8), then one sha256 covers the sorted (name, dtype, shape, digest) lines. Changing any byte of any
    tensor changes its digest and so the fingerprint; it is as collision-resistant as sha256.
    """
    items = sorted(module.state_dict().items())
    workers = threads or min(8, os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        digests = list(pool.map(_tensor_digest, (t for _, t in items)))
    h = hashlib.sha256()
    for (name, t), digest in zip(items, digests):
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(digest)
    return h.hexdigest()


def config_for_key(config) -> dict:
    """A model config without diffusers' private ``_*`` entries.

    ``_use_default_values`` is built from a set, so its order changes with Python's hash seed: keyed on
    it, a cache entry was never found again by another process.
    """
    return {k: v for k, v in dict(config).items() if not str(k).startswith("_")}


def file_sha256(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def check_verify(verify: str) -> None:
    if verify not in VERIFY:
        raise ValueError(
            f"verify must be one of {list(VERIFY)} ('stat': size and mtime, re-hashing an artifact only "
            f"when its mtime changed; 'full': sha256 of every artifact), got {verify!r}"
        )


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
    os.replace(tmp, path)


def library_versions(backend: str) -> dict[str, str | None]:
    from .. import __version__
    from .._compat import version_of

    return {
        "fastdiff": __version__,
        "torch": torch.__version__,
        "onnx": version_of("onnx"),
        "diffusers": version_of("diffusers"),
        backend: version_of(backend),
    }


def make_key(parts: dict) -> str:
    """Stable hash of a JSON-serialisable description of an engine."""
    blob = json.dumps({"format": CACHE_FORMAT, **parts}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:40]


class EngineCache:
    """A directory of validated engine entries."""

    def __init__(self, root: str | os.PathLike | None = None):
        self.root = cache_root(root)

    def entry_dir(self, key: str) -> Path:
        return self.root / key

    def validate(self, key: str, parts: dict, verify: str = "stat") -> str | None:
        """Why the entry for ``key`` is unusable, or None if it is intact and matches ``parts``.

        ``verify``: "stat" compares each artifact's size and mtime with meta.json and re-hashes only
        those whose mtime changed; "full" re-hashes every artifact (see the module docstring).
        """
        check_verify(verify)
        entry = self.entry_dir(key)
        meta_path = entry / _META
        if not meta_path.is_file():
            return "no meta.json"
        try:
            meta = json.loads(meta_path.read_text())
        except (OSError, ValueError) as e:
            return f"unreadable meta.json ({e})"
        if meta.get("format") != CACHE_FORMAT or meta.get("key") != key:
            return "meta.json belongs to another key or cache format"
        if json.loads(json.dumps(parts, sort_keys=True, default=str)) != meta.get("parts"):
            return "stale: recorded build parameters differ"
        files = meta.get("files")
        if not isinstance(files, dict) or not files:
            return "meta.json lists no artifacts"
        rehashed = {}
        for name, info in files.items():
            path = entry / name
            if not path.is_file():
                return f"artifact {name} is missing"
            st = path.stat()
            if st.st_size != info.get("size"):
                return f"artifact {name} has the wrong size"
            if verify == "stat" and st.st_mtime_ns == info.get("mtime_ns"):
                continue
            if file_sha256(path) != info.get("sha256"):
                return f"artifact {name} fails its sha256 check"
            rehashed[name] = st.st_mtime_ns
        if any(files[n].get("mtime_ns") != m for n, m in rehashed.items()):
            # Intact but re-timestamped (a copy without its times): remember the new mtimes.
            for name, mtime in rehashed.items():
                files[name]["mtime_ns"] = mtime
            _write_json(meta_path, meta)
        return None

    def lookup(self, key: str, parts: dict, verify: str = "stat") -> dict | None:
        """Meta of a valid entry, or None; an invalid entry is removed (and logged) so it gets rebuilt."""
        entry = self.entry_dir(key)
        if not entry.exists():
            return None
        reason = self.validate(key, parts, verify)
        if reason is None:
            return json.loads((entry / _META).read_text())
        logger.warning("fastdiff engine cache entry %s is invalid (%s); rebuilding", entry, reason)
        shutil.rmtree(entry, ignore_errors=True)
        return None

    def update_meta(self, key: str, **fields) -> None:
        """Add or replace top-level fields of a committed entry's meta.json (e.g. its quality result);
        the artifacts and their checksums are untouched."""
        meta_path = self.entry_dir(key) / _META
        _write_json(meta_path, {**json.loads(meta_path.read_text()), **fields})

    def staging_dir(self) -> Path:
        """A fresh directory to build an entry in before :meth:`commit`."""
        path = self.root / f".staging-{uuid.uuid4().hex}"
        path.mkdir(parents=True)
        return path

    def commit(self, key: str, parts: dict, staging: Path) -> dict:
        """Hash the artifacts in ``staging``, write meta.json and move the entry into place."""
        paths = [p for p in sorted(staging.iterdir()) if p.is_file() and p.name != _META]
        with ThreadPoolExecutor(max_workers=max(1, min(len(paths), os.cpu_count() or 1))) as pool:
            digests = list(pool.map(file_sha256, paths))
        stats = [p.stat() for p in paths]
        files = {
            p.name: {"sha256": digest, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
            for p, digest, st in zip(paths, digests, stats)
        }
        meta = {
            "format": CACHE_FORMAT,
            "key": key,
            "parts": json.loads(json.dumps(parts, sort_keys=True, default=str)),
            "files": files,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        (staging / _META).write_text(json.dumps(meta, indent=2, sort_keys=True))
        entry = self.entry_dir(key)
        if entry.exists():
            shutil.rmtree(entry, ignore_errors=True)
        os.replace(staging, entry)
        return meta
