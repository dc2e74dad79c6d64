"""Where fastdiff keeps what it measures or builds: one rule for plans, engines and anything added later."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir(kind: str, override: str | os.PathLike | None = None) -> Path:
    """``override`` if given, else ``$FASTDIFF_CACHE_DIR/<kind>``, else ``~/.cache/fastdiff/<kind>``."""
    if override is not None:
        return Path(override)
    return Path(os.environ.get("FASTDIFF_CACHE_DIR") or Path.home() / ".cache" / "fastdiff") / kind
