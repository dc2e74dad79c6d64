"""Collation: every process's rows into one table, a summary per configuration, a Pareto plot, an image grid.

Writes into the sweep folder: ``rows.csv`` and ``rows.json`` (one row per item), ``summary.json`` and
``summary.md`` (one row per configuration and prompt group: mean and worst image), ``pareto.png``
(quality against NFE and against wall time) and ``grid.png`` (configurations x prompts). It reads only
the folder, so it can be re-run at any time (``fastdiff sweep SPEC --collate-only``).
"""

from __future__ import annotations

import csv
import json
import math
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fastdiff.sweep.store import Store

ATTRS = ("attr_shape_colour", "attr_bg_colour", "attr_shape", "attr_all")


@dataclass
class SweepResult:
    """What a finished sweep wrote: rows per item, summary per configuration, and the files."""

    rows: list[dict]
    summary: list[dict]
    stats: dict
    folder: Path

    def summary_for(self, config: str, group: str = "all") -> dict:
        return next(s for s in self.summary if s["config"] == config and s["group"] == group)


def _mean(v):
    return float(np.mean(v)) if v else None


def summarise(rows: list[dict], configs: list[str], by_group: bool) -> list[dict]:
    out = []
    groups = sorted({r["group"] for r in rows}) if by_group else []
    for name in configs:
        mine = [r for r in rows if r["config"] == name]
        if not mine:
            continue
        for group in ["all", *groups] if len(groups) > 1 else ["all"]:
            rs = mine if group == "all" else [r for r in mine if r["group"] == group]
            s = {"config": name, "group": group, "n": len(rs), "reference": rs[0]["is_reference"]}
            if s["reference"] and any("mse" in r for r in rows):  # "ref" in the table
                s.update(psnr_mean=math.inf, psnr_worst=math.inf, psnr_pooled=math.inf)
            if s["reference"] and any("ssim" in r for r in rows):
                s.update(ssim_mean=1.0, ssim_worst=1.0)
            s["nfe"] = _mean([r["nfe"] for r in rs])
            s["wall_s"] = _mean([r["wall_s"] for r in rs])
            s["wall_s_total"] = float(sum(r["wall_s"] for r in rs))
            s["unet_s"] = _mean([r["unet_s"] for r in rs])
            if "cache_skipped" in rs[0]:
                s["cache_skipped"] = _mean([r["cache_skipped"] for r in rs])
            if "mse" in rs[0]:
                psnrs = [r["psnr"] for r in rs]
                mse = _mean([r["mse"] for r in rs])
                s["psnr_mean"] = _mean(psnrs) if all(map(math.isfinite, psnrs)) else math.inf
                s["psnr_worst"] = float(min(psnrs))
                s["psnr_pooled"] = math.inf if mse == 0 else 10 * math.log10(1.0 / mse)
            if "ssim" in rs[0]:
                s["ssim_mean"] = _mean([r["ssim"] for r in rs])
                s["ssim_worst"] = float(min(r["ssim"] for r in rs))
            for k in ATTRS:
                if k in rs[0]:
                    s[k] = _mean([r[k] for r in rs])
            s["peak_mem_mib"] = float(max(r["peak_mem_mib"] for r in rs))
            out.append(s)
    return out


def _fmt(v) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "yes" if v else ""
    if isinstance(v, float):
        if math.isinf(v):
            return "ref"
        return f"{v:.3g}" if abs(v) < 1e4 else f"{v:.0f}"
    return str(v)


def markdown(summary: list[dict], stats: dict) -> str:
    cols = []
    for s in summary:  # the reference's row has no fidelity columns: take the union, in first-seen order
        cols += [c for c in s if c not in cols and c != "reference"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_fmt(s.get(c)) for c in cols) + " |" for s in summary]
    notes = (
        f"\n{stats['items']} items from {stats['processes']} process(es); text-encoder calls "
        f"{stats['text_encoder_calls']} for {stats['prompts_encoded']} encodings "
        f"({stats['cache_hits']} served by the prompt-embedding cache). psnr/ssim: per image against the "
        "reference configuration's image of the same prompt and seed; *_worst is the worst image, psnr_pooled "
        "pools the squared error over images. wall_s: per image (a batch's time shared by its images)"
        + _warmup_note(stats.get("warmup_calls", []))
        + (
            " cache_skipped: the share of U-Net evaluations whose deep features the step cache replayed."
            if any("cache_skipped" in s for s in summary)
            else ""
        )
        + "\n"
    )
    return "\n".join(lines) + "\n" + notes


def _warmup_note(counts: list) -> str:
    if not counts:
        return "."
    if counts == [0]:
        return ", timed from each configuration's first call (no warm-up)."
    if len(counts) == 1 and counts[0] is not None:
        return f", after {counts[0]} untimed warm-up call(s) of each configuration's first batch per process."
    return f"; untimed warm-up calls per configuration differ between rows ({counts}: None is a row from before warm-up existed)."


def _stats(folder: Path, rows: list[dict]) -> dict:
    total = {"text_encoder_calls": 0, "prompts_encoded": 0, "cache_hits": 0, "encode_s": 0.0}
    files = sorted((folder / "log").glob("stats-*.json"))
    for p in files:
        d = json.loads(p.read_text())
        for k in total:
            total[k] += d.get(k, 0)
    total["processes"] = len(files)
    total["items"] = len(rows)
    # rows written before warm-up calls existed have no count: None, so the notes do not claim one
    total["warmup_calls"] = sorted({r.get("warmup_calls") for r in rows}, key=lambda w: (w is None, w or 0))
    return total


def pareto_plot(summary: list[dict], path: Path) -> bool:
    """Quality (mean PSNR, else attribute accuracy) against NFE and against wall time; False if no quality."""
    try:
        import matplotlib
    except ModuleNotFoundError:
        warnings.warn("pareto.png skipped: pip install matplotlib (or 'fastdiff[sweep]')", stacklevel=2)
        return False
    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    pts = [s for s in summary if s["group"] == "all"]
    key = (
        "psnr_mean"
        if any("psnr_mean" in s for s in pts)
        else "attr_all"
        if any("attr_all" in s for s in pts)
        else None
    )
    if key is None:
        return False
    pts = [s for s in pts if s.get(key) is not None and math.isfinite(s[key])]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    fig.subplots_adjust(left=0.07, right=0.98, bottom=0.13, top=0.92, wspace=0.22)  # tight_layout: 1 s
    for ax, x, label in ((axes[0], "nfe", "NFE per image"), (axes[1], "wall_s", "wall time per image (s)")):
        for s in pts:
            ax.plot(s[x], s[key], "o")
            ax.annotate(s["config"], (s[x], s[key]), fontsize=7)
        front = _front([(s[x], s[key]) for s in pts])
        if front:
            ax.step(*zip(*front), where="post", color="k", alpha=0.4, label="Pareto front")
            ax.legend(fontsize=8)
        ax.set(xlabel=label, ylabel=key.replace("_", " "), title=f"{key} vs {x}")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def _front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Points no other point beats on both cost (lower) and quality (higher), by cost."""
    front, best = [], -math.inf
    for x, y in sorted(points):
        if y > best:
            front.append((x, y))
            best = y
    return front


def image_grid(folder: Path, rows: list[dict], configs: list[str], path: Path, max_prompts: int = 8) -> None:
    """Configurations (rows) x the first prompts (columns), first seed."""
    from PIL import Image, ImageDraw

    keys = sorted({(r["group"], r["prompt_index"]) for r in rows})[:max_prompts]
    seed_of = {}
    for r in rows:
        seed_of.setdefault((r["group"], r["prompt_index"]), r["seed"])
    by = {(r["config"], r["group"], r["prompt_index"], r["seed"]): r for r in rows}
    tiles = []
    for c in configs:
        line = [by.get((c, g, i, seed_of[(g, i)])) for g, i in keys]
        tiles.append([Image.open(folder / r["image"]).convert("RGB") if r else None for r in line])
    w, h = next(t for line in tiles for t in line if t is not None).size
    label = 160
    grid = Image.new("RGB", (label + w * len(keys), h * len(configs)), "white")
    draw = ImageDraw.Draw(grid)
    for y, (c, line) in enumerate(zip(configs, tiles)):
        draw.text((4, y * h + 4), c[:26], fill="black")
        for x, t in enumerate(line):
            if t is not None:
                grid.paste(t, (label + x * w, y * h))
    grid.save(path)


def collate(folder, plots: bool = True) -> SweepResult:
    """Collate the rows in ``folder``; ``plots=False`` skips the Pareto plot and the image grid."""
    folder = Path(folder)
    store = Store(folder)
    manifest = store.manifest()
    configs = list(manifest["configs"])
    rows = store.rows()
    order = {c: i for i, c in enumerate(configs)}
    rows.sort(key=lambda r: (order.get(r["config"], len(order)), r["group"], r["prompt_index"], r["seed"]))
    summary = summarise(rows, configs, by_group=True)
    stats = _stats(folder, rows)
    flat = [{k: v for k, v in r.items() if k != "env"} for r in rows]
    Store._atomic(folder / "rows.json", json.dumps(rows, indent=1, default=str).encode())
    cols = sorted(
        {k for r in flat for k in r}, key=lambda k: (list(flat[0]).index(k) if k in flat[0] else 999, k)
    )
    csv_path = folder / "rows.csv"
    with open(csv_path.with_suffix(".csv.tmp"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        w.writerows(flat)
    csv_path.with_suffix(".csv.tmp").replace(csv_path)
    Store._atomic(
        folder / "summary.json", json.dumps({"summary": summary, "stats": stats}, indent=1).encode()
    )
    Store._atomic(folder / "summary.md", ("# sweep summary\n\n" + markdown(summary, stats)).encode())
    if rows and plots:
        pareto_plot(summary, folder / "pareto.png")
        image_grid(folder, rows, configs, folder / "grid.png")
    return SweepResult(rows=rows, summary=summary, stats=stats, folder=folder)


__all__ = ["SweepResult", "collate", "image_grid", "markdown", "pareto_plot", "summarise"]
