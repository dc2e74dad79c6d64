"""The output folder of a sweep: work items, atomic writes, the recorded spec.

Layout::

    OUT/sweep.json                      the spec as run (configurations, prompts, seeds) and fastdiff's version
    OUT/items/<config>/<group>-<prompt index>-s<seed>.png   the image
    OUT/items/<config>/<...>.json       its row: every parameter, metric, timing, versions, hardware
    OUT/items/<config>/<...>.npy        the float image (reference configurations, or save_arrays="all")
    OUT/log/events-<process>-<pid>.jsonl  one line per item written (the no-duplicates audit)
    OUT/log/stats-<process>.json        per-process counters (text-encoder calls, cache hits)

Every file is written to a temporary name in its folder and renamed with ``os.replace``, so a reader (or a
re-run after a kill) sees either the whole file or none of it. The row is written last: an item is finished
exactly when its row exists.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fastdiff.sweep.spec import Config, Prompt, Spec, SpecError


@dataclass(frozen=True)
class Item:
    """One unit of output: a configuration run on one prompt with one seed."""

    config: Config
    prompt: Prompt
    seed: int

    @property
    def id(self) -> str:
        return f"{self.config.name}/{self.prompt.group}/{self.prompt.index}/{self.seed}"

    @property
    def stem(self) -> str:
        return (
            f"{config_dir(self.config.name)}/{_safe(self.prompt.group)}-{self.prompt.index:05d}-s{self.seed}"
        )


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_")[:60] or "x"


def config_dir(name: str) -> str:
    """A file-system-safe folder name that stays unique for distinct configuration names."""
    return f"{_safe(name)}-{hashlib.sha1(name.encode()).hexdigest()[:8]}"


def items_of(spec: Spec, config: Config) -> list[Item]:
    """The configuration's items in a fixed order: prompts in spec order, then seeds."""
    out = []
    for p in spec.prompts:
        for s in spec.seeds:
            out.append(Item(config, p, s + p.index if spec.seed_per_prompt else s))
    return out


def chunks_of(spec: Spec, config: Config) -> list[list[Item]]:
    """Batches of at most ``batch_size`` consecutive items. They depend on the spec only, never on the
    number of processes, so every image comes out of the same batch (bit for bit) however the sweep runs."""
    items = items_of(spec, config)
    return [items[i : i + spec.batch_size] for i in range(0, len(items), spec.batch_size)]


def manifest_of(spec: Spec) -> dict:
    import fastdiff

    return {
        "fastdiff": fastdiff.__version__,
        # other weights under the same pipeline name must not resume into this folder
        "tiny_weights": os.environ.get("FASTDIFF_TINY_WEIGHTS"),
        "spec": spec.raw,
        "configs": {c.name: _jsonable(c.options) for c in spec.configs},
        "prompts": [[p.group, p.index, p.text] for p in spec.prompts],
        "seeds": spec.seeds,
        "globals": {
            k: _jsonable(getattr(spec, k))
            for k in (
                "pipeline",
                "reference",
                "guidance",
                "negative_prompt",
                "height",
                "width",
                "seed_per_prompt",
                "batch_size",
                "dtype",
            )
        },
    }


def _jsonable(v):
    from fastdiff.sweep.spec import canonical

    return json.loads(json.dumps(canonical(v), sort_keys=True, default=str))


def _diff_manifest(old: dict, new: dict, extend: bool) -> str | None:
    """Why ``new`` may not run into a folder made by ``old`` (None if it may)."""
    if old.get("tiny_weights") != new["tiny_weights"]:
        return f"FASTDIFF_TINY_WEIGHTS changed from {old.get('tiny_weights')!r} to {new['tiny_weights']!r}"
    if old.get("fastdiff") != new["fastdiff"] and not extend:
        return f"the folder was made by fastdiff {old.get('fastdiff')}, this is {new['fastdiff']}"
    for k, v in new["globals"].items():
        if old["globals"].get(k) != v:
            return f"'{k}' changed from {old['globals'].get(k)!r} to {v!r}"
    for name, opts in old["configs"].items():
        if name in new["configs"] and new["configs"][name] != opts:
            return f"configuration {name!r} changed from {opts} to {new['configs'][name]}"
    if extend:
        old_p = {(g, i): t for g, i, t in old["prompts"]}
        for g, i, t in new["prompts"]:
            if (g, i) in old_p and old_p[(g, i)] != t:
                return f"prompt {i} of group {g!r} changed from {old_p[(g, i)]!r} to {t!r}"
        return None
    for key in ("configs", "prompts", "seeds"):
        if old[key] != new[key]:
            return f"'{key}' changed"
    return None


class Store:
    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)

    # ---------------------------------------------------------------- manifest
    def check(self, spec: Spec, extend: bool) -> dict | None:
        """Raise SpecError if ``spec`` may not run here; return the manifest to write (None: unchanged)."""
        new = manifest_of(spec)
        path = self.root / "sweep.json"
        if not path.exists():
            return new
        old = json.loads(path.read_text())
        why = _diff_manifest(old, new, extend)
        if why:
            raise SpecError(
                f"{self.root} holds a different sweep: {why}. Use a new output folder, or pass extend=True "
                "(--extend) to add configurations, prompts or seeds to this one"
            )
        return new if old != new else None

    def remove_partial_files(self) -> int:
        """Delete temporary files a killed run left half-written (call before any process writes)."""
        stale = list(self.root.glob("items/*/.*.tmp")) + list(self.root.glob(".*.tmp"))
        for p in stale:
            p.unlink(missing_ok=True)
        return len(stale)

    def write_manifest(self, manifest: dict) -> None:
        self._atomic(self.root / "sweep.json", (json.dumps(manifest, indent=2) + "\n").encode())

    def manifest(self) -> dict:
        return json.loads((self.root / "sweep.json").read_text())

    # ---------------------------------------------------------------- items
    def row_path(self, item: Item) -> Path:
        return self.root / "items" / f"{item.stem}.json"

    def finished(self, item: Item) -> bool:
        return self.row_path(item).exists()

    def write_item(self, item: Item, image: np.ndarray, row: dict, array: np.ndarray | None, log) -> None:
        """Image, optional float array, then the row (which marks the item finished), each atomically."""
        from PIL import Image

        stem = self.root / "items" / item.stem
        stem.parent.mkdir(parents=True, exist_ok=True)
        buf = io.BytesIO()
        Image.fromarray(image).save(buf, format="PNG")
        self._atomic(stem.with_suffix(".png"), buf.getvalue())
        if array is not None:
            buf = io.BytesIO()
            np.save(buf, array)
            self._atomic(stem.with_suffix(".npy"), buf.getvalue())
        self._atomic(stem.with_suffix(".json"), (json.dumps(row, indent=1, default=str) + "\n").encode())
        log.write(json.dumps({"id": item.id}) + "\n")
        log.flush()

    def array(self, item: Item) -> np.ndarray:
        path = (self.root / "items" / item.stem).with_suffix(".npy")
        if not path.exists():
            raise FileNotFoundError(f"reference array {path} is missing: the reference item did not finish")
        return np.load(path)

    def rows(self) -> list[dict]:
        out = []
        for path in sorted((self.root / "items").glob("*/*.json")):
            out.append(json.loads(path.read_text()))
        return out

    def event_log(self, process_index: int):
        (self.root / "log").mkdir(parents=True, exist_ok=True)
        return open(self.root / "log" / f"events-{process_index}-{os.getpid()}.jsonl", "a")

    def write_stats(self, process_index: int, stats: dict) -> None:
        (self.root / "log").mkdir(parents=True, exist_ok=True)
        self._atomic(self.root / "log" / f"stats-{process_index}.json", json.dumps(stats, indent=1).encode())

    def events(self) -> list[str]:
        ids = []
        for path in sorted((self.root / "log").glob("events-*.jsonl")):
            ids += [json.loads(line)["id"] for line in path.read_text().splitlines() if line.strip()]
        return ids

    @staticmethod
    def _atomic(path: Path, data: bytes) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise


__all__ = ["Item", "Store", "chunks_of", "config_dir", "items_of", "manifest_of"]
