"""Cost of `import fastdiff` (and of reaching `fastdiff.optimize`), this tree against an older revision.

Each measurement is a fresh interpreter (`python -c ...`), timed from outside,
interleaved between the two trees so machine load hits both alike; the median
of ``--reps`` runs is reported, with which heavy libraries the import loaded.

    python benchmarks/import_time.py --base 0bc6ae6
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import env_info, write_results  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "diffusers", "transformers", "triton", "onnx", "onnxruntime")
SNIPPETS = {
    "import fastdiff": "import fastdiff",
    "import fastdiff; fastdiff.optimize": "import fastdiff; fastdiff.optimize",
}


def _run(tree: Path, code: str) -> tuple[float, list[str]]:
    probe = f"{code}\nimport sys; print(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    env = dict(os.environ, PYTHONPATH=str(tree), OMP_WAIT_POLICY="PASSIVE")
    start = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", probe],
        env=env,
        cwd=tempfile.gettempdir(),
        capture_output=True,
        text=True,
        check=True,
    )
    return time.perf_counter() - start, out.stdout.split()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="0bc6ae6", help="git revision to compare against")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(base), args.base], check=True
        )
        try:
            rows = []
            for label, code in SNIPPETS.items():
                times = {"base": [], "head": []}
                loaded = {}
                for _ in range(args.reps):
                    for name, tree in (("base", base), ("head", ROOT)):
                        seconds, mods = _run(tree, code)
                        times[name].append(seconds)
                        loaded[name] = mods
                b, h = statistics.median(times["base"]), statistics.median(times["head"])
                rows.append(
                    {
                        "what": label,
                        f"{args.base} (s)": round(b, 2),
                        "this tree (s)": round(h, 2),
                        "speed-up": f"{b / h:.1f}x",
                        f"{args.base} loads": " ".join(loaded["base"]) or "-",
                        "this tree loads": " ".join(loaded["head"]) or "-",
                    }
                )
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)], check=True)
    meta = env_info()
    meta["load_average"] = {"before": load_before, "after": os.getloadavg()}
    meta["reps"] = args.reps
    notes = "Median wall time of a fresh interpreter running the snippet (interpreter start-up included)."
    write_results("import_time", rows, meta, notes=notes)


if __name__ == "__main__":
    main()
