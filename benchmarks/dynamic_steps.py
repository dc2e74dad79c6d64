#!/usr/bin/env python
"""Auto steps and LCM draft + refine on fastdiff-tiny, each against the best fixed schedule of equal NFE.

Everything on fastdiff-tiny uses the shipped weights, guidance 5 and per-image seeds; fidelity is the PSNR of
each decoded image against the **converged reference from the same noise** (``benchmarks/_reference.py``: 200
steps of DPM-Solver++(2M) Karras, ``final_step="variance"``; the 100-step run used before is not converged on
every image, ``results/reference_convergence.md``) (mean and
worst image, never pooled), beside attribute accuracy (``fastdiff.metrics``). Runs go through
``fastdiff.sweep`` (resumable folders under ``--cache``; the reference is computed once per folder).

* ``--phase calibrate [--signal best|none]``: 24 train-split images. Every image's *need* (fewest steps of
  DPM-Solver++(2M), the presets' sampler, reaching ``THRESHOLD_DB`` against its reference) and the candidate
  complexity signals of a probe (prompt tier, high-frequency energy and contrast of the x0 prediction, x0
  change between probe steps). The signal used by ``steps="auto"`` is the one with the largest Spearman
  correlation with the need, if it reaches ``MIN_RHO``; ``--signal none`` drops it. The table is written to
  ``fastdiff/dynamic/auto_steps_table.py``.
* ``--phase heldout [--only WORDS]``: 72 held-out colour pairs x 2 seeds = 144 images: the reference, the
  teacher at 8/10/13 steps (both schedules at 10 and 13), the 4-step LCM draft alone and draft + refine at
  10 and 13 total NFE with refine strengths 0.3 / 0.5 / 0.75.
* ``--phase need [--only WORDS]``: the first seed's 72 images: the step grid that measures each image's need,
  ``steps="auto"`` (named with a hash of the table, so a new table is a new row), FastForward with the setting
  ``benchmarks/step_control.py`` chose on fastdiff-tiny (there judged on 24 held-out images, here on 72) and
  the fixed schedules of its cost (17 and 18 steps, Karras rho 7 and its own rho 5 "variance" schedule), and
  EarlyStop with its defaults on 30 steps beside fixed 26-30. Rows the held-out folder already has for these
  seeds are copied, not recomputed.
* ``--phase report``: the results file ``results/dynamic_steps.{json,md}`` (goals met / not met) from the
  folders, with the load average logged by every run.
* ``--phase exact``: fixed DPM-Solver++(2M) step counts on the exact Gaussian mixture, error against the
  exact probability-flow solution (the equal-cost baseline; no mode of this file applies to the mixture).

Controllers are tuned in ``benchmarks/step_control.py`` and ``fast_forward_tune.py``; this file runs the
pipeline-level modes on the same 72 held-out images. (One file of ~750 lines: the phases share the
configuration names, seeds and folders, which must not drift apart.)

    flock /tmp/fastdiff-heavy.lock python benchmarks/dynamic_steps.py --phase calibrate
    flock /tmp/fastdiff-heavy.lock python benchmarks/dynamic_steps.py --phase heldout --only "fixed 13" LCM
    flock /tmp/fastdiff-heavy.lock python benchmarks/dynamic_steps.py --phase need
    python benchmarks/dynamic_steps.py --phase exact
    python benchmarks/dynamic_steps.py --phase report
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import pprint
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import RESULTS_DIR, env_info, hardware_line, load_average, log_run, markdown_table  # noqa: E402
from benchmarks._reference import reference_config as _converged_reference  # noqa: E402
from fastdiff.dynamic import step_calibration as cal  # noqa: E402
from fastdiff.dynamic.auto_steps import high_frequency_energy, prompt_tier, x0_contrast  # noqa: E402

NAME = "dynamic_steps"
GUIDANCE = 5.0
THRESHOLD_DB = 30.0
NEED_GRID = [8, 10, 12, 13, 16, 20, 25]
REFERENCE = _converged_reference()["name"]
LCM = "fastdiff-tiny:lcm"
DRAFT_STEPS = 4
# (main schedule length, strength) pairs whose refinement is 9 (6) steps: 4 + 9 = 13 (4 + 6 = 10) NFE
DRAFTS = {13: [(30, 0.3), (18, 0.5), (12, 0.75)], 10: [(20, 0.3), (12, 0.5), (8, 0.75)]}
EXTRA_FIXED = [(10, "karras"), (13, "trailing")]  # the other schedule at the draft comparison points
TABLE_PATH = Path(__file__).resolve().parent.parent / "fastdiff" / "dynamic" / "auto_steps_table.py"
SIGNALS = (
    "tier",
    "hf_energy@2",
    "hf_energy@3",
    "x0_contrast@2",
    "x0_contrast@3",
    "x0_change@1-2",
    "x0_change@2-3",
)
PROBE_SCHEDULE = 8  # AutoSteps' min_steps: the probe runs the first steps of this schedule
TIER_CODE = {"simple": -1, "neutral": 0, "detailed": 1}


def fixed_name(n: int, schedule: str | None = None) -> str:
    return f"fixed {n}" + (f" {schedule}" if schedule else "")


def draft_name(n: int, strength: float) -> str:
    return f"draft {DRAFT_STEPS} + refine {int(n * strength)} of {n} (strength {strength})"


def table_hash() -> str:
    return hashlib.sha1(TABLE_PATH.read_bytes()).hexdigest()[:8]


def auto_name() -> str:
    return f"auto (table {table_hash()})"


# FastForward as step_control.py chose it on fastdiff-tiny's training prompts (results/step_control.md)
RHO5 = {"schedule": "karras", "sampler_options": {"rho": 5.0, "final_step": "variance"}}
FAST_FORWARD = {
    "name": "fast-forward (rtol 0.1, 3 jumps, 20 steps karras rho 5 variance)",
    "sampler": "dpmpp_2m",
    "steps": 20,
    **RHO5,
    "early_stop": {"rtol": 0.1, "patience": 1, "max_sigma": 1.0, "jumps": 3},
}
# EarlyStop with its defaults on the 30-step default schedule
EARLY_STOP = {
    "name": "early stop (defaults, 30 steps)",
    "sampler": "dpmpp_2m",
    "steps": 30,
    "early_stop": True,
}
# fixed schedules at those modes' costs: for FastForward the grid's Karras rho 7 and its own base schedule,
# shortened; for EarlyStop the counts it can cost
AT_COST = [
    *((n, None, {}) for n in (17, 18)),
    *((n, "karras rho 5 variance", RHO5) for n in (17, 18)),
    *((n, None, {}) for n in range(26, 31)),
]


# ------------------------------------------------------------------------------------------------ sweeps
def _spec(prompts: dict, seeds: list[int], configs: list[dict]) -> dict:
    return {
        "pipeline": "fastdiff-tiny",
        "reference": REFERENCE,
        "prompts": prompts,
        "seeds": seeds,
        "seed_per_prompt": True,
        "guidance": GUIDANCE,
        "batch_size": 24,
        "metrics": ["psnr", "attributes", "nfe", "wall_s"],
        "configs": configs,
    }


def reference_config() -> dict:
    return _converged_reference()


def fixed_configs() -> list[dict]:
    out = [{"name": fixed_name(n), "sampler": "dpmpp_2m", "steps": n} for n in NEED_GRID]
    out += [
        {"name": fixed_name(n, s), "sampler": "dpmpp_2m", "schedule": s, "steps": n} for n, s in EXTRA_FIXED
    ]
    return out


def heldout_configs() -> list[dict]:
    """The draft comparison on 144 images: drafts, the LCM alone and the teacher at the same NFE."""
    fixed = [c for c in fixed_configs() if c["steps"] in DRAFTS or c["steps"] in (8,)]
    configs = [reference_config(), *fixed]
    configs.append({"name": f"LCM {DRAFT_STEPS} (draft alone)", "pipeline": LCM, "steps": DRAFT_STEPS})
    for pairs in DRAFTS.values():
        for n, s in pairs:
            draft = {"model": LCM, "strength": s, "steps": DRAFT_STEPS}
            configs.append({"name": draft_name(n, s), "sampler": "dpmpp_2m", "steps": n, "draft": draft})
    return configs


def need_configs() -> list[dict]:
    """Auto steps and the step grid that measures each image's need (first seed only: 72 images)."""
    at_cost = [{"name": fixed_name(n, s), "sampler": "dpmpp_2m", "steps": n, **o} for n, s, o in AT_COST]
    return [
        reference_config(),
        *fixed_configs()[: len(NEED_GRID)],
        *at_cost,
        {"name": auto_name(), "steps": "auto"},
        FAST_FORWARD,
        EARLY_STOP,
    ]


HELDOUT = ({"tiny": "heldout"}, [1000, 5000])  # 72 combinations x 2 seeds (seed + prompt index) = 144
NEED = ({"tiny": "heldout"}, [1000])  # the first of those seeds: 72 images
TRAIN = ({"tiny": "train", "n": 24, "seed": 7}, [3000])
KINDS = {"heldout": (HELDOUT, heldout_configs), "need": (NEED, need_configs), "train": (TRAIN, None)}


def seed_from(src: Path, dst: Path, configs: list[str], seeds: set[int]) -> None:
    """Copy finished items (image, array, row) of ``configs`` with these seeds from one sweep folder into
    another of the same pipeline, prompts and settings, so the sweep there skips them (same item paths)."""
    import shutil

    from fastdiff.sweep.store import config_dir

    for name in configs:
        folder = src / "items" / config_dir(name)
        for f in folder.glob("*") if folder.exists() else ():
            seed = int(f.stem.rsplit("-s", 1)[1])
            target = dst / "items" / config_dir(name) / f.name
            if seed in seeds and not target.exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(f, target)


def run_sweep(kind: str, cache: Path, only=()) -> object:
    from fastdiff.sweep import sweep

    (prompts, seeds), make = KINDS[kind]
    configs = make() if make else [reference_config(), *fixed_configs()[: len(NEED_GRID)]]
    if only:
        configs = [c for c in configs if c["name"] == REFERENCE or any(o in c["name"] for o in only)]
    if kind == "need":  # the reference and the step counts the draft comparison already ran on these seeds
        shared = [c["name"] for c in heldout_configs() if c["name"] in {x["name"] for x in need_configs()}]
        seed_from(cache / "heldout", cache / "need", shared, {seeds[0] + i for i in range(72)})
    return sweep(_spec(prompts, seeds, configs), cache / kind, extend=True, progress=False)


# ------------------------------------------------------------------------------------------------ probes
def probe_signals(items: list[tuple[str, int]], batch: int = 24) -> list[dict]:
    """The candidate complexity signals of each (prompt, seed), from the probe AutoSteps runs: the first
    steps of the 8-step default-sampler schedule on the image's own noise."""
    from fastdiff.dynamic.presets import default_scheduler
    from fastdiff.pipelines import StableDiffusionPipeline
    from fastdiff.tiny import load_pipeline

    pipe = StableDiffusionPipeline.from_pipe(load_pipeline("base"))
    pipe.set_progress_bar_config(disable=True)
    pipe.scheduler = default_scheduler(like=pipe.scheduler)
    out = []
    for i in range(0, len(items), batch):
        chunk = items[i : i + batch]
        x0 = {}
        for k in (1, 2, 3):
            res = pipe(
                [p for p, _ in chunk],
                num_inference_steps=PROBE_SCHEDULE,
                preview_steps=k,
                guidance_scale=GUIDANCE,
                output_type="latent",
                generator=[torch.Generator().manual_seed(s) for _, s in chunk],
            )
            x0[k] = res.images.double()
        hf2, hf3 = high_frequency_energy(x0[2]), high_frequency_energy(x0[3])
        lc2, lc3 = x0_contrast(x0[2]), x0_contrast(x0[3])
        d12 = (x0[2] - x0[1]).flatten(1).norm(dim=1) / x0[2].flatten(1).norm(dim=1)
        d23 = (x0[3] - x0[2]).flatten(1).norm(dim=1) / x0[3].flatten(1).norm(dim=1)
        for j, (p, s) in enumerate(chunk):
            out.append(
                {
                    "prompt": p,
                    "seed": s,
                    "tier": TIER_CODE[prompt_tier(p)[0]],
                    "hf_energy@2": float(hf2[j]),
                    "hf_energy@3": float(hf3[j]),
                    "x0_contrast@2": float(lc2[j]),
                    "x0_contrast@3": float(lc3[j]),
                    "x0_change@1-2": float(d12[j]),
                    "x0_change@2-3": float(d23[j]),
                }
            )
    return out


def need_records(result, kind: str, cache: Path) -> list[dict]:
    """Per image: PSNR of every grid step count, the need, and the probe signals (cached in ``cache``)."""
    by_item = {}
    for r in result.rows:
        by_item.setdefault((r["prompt"], r["seed"]), {})[r["config"]] = r
    items = sorted(by_item)
    sig_path = cache / f"signals-{kind}.json"
    signals = json.loads(sig_path.read_text()) if sig_path.exists() else []
    have = {(s["prompt"], s["seed"]) for s in signals}
    missing = [it for it in items if it not in have]
    if missing:
        signals += probe_signals(missing)
        sig_path.write_text(json.dumps(signals))
    sig = {(s["prompt"], s["seed"]): s for s in signals}
    records = []
    for it in items:
        rows = by_item[it]
        psnr = {n: rows[fixed_name(n)]["psnr"] for n in NEED_GRID if fixed_name(n) in rows}
        if len(psnr) < len(NEED_GRID):
            continue
        records.append({**sig[it], "psnr": psnr, "need": cal.steps_needed(psnr, THRESHOLD_DB)})
    return records


def correlations(records: list[dict]) -> dict:
    need = [r["need"] for r in records]
    return {s: cal.spearman([r[s] for r in records], need) for s in SIGNALS}


# ------------------------------------------------------------------------------------------------ calibrate
# signals AutoSteps can compute from the one x0 prediction the StepPlanner protocol hands it
PLANNER_SIGNALS = {"tier": None, "hf_energy@2": 2, "hf_energy@3": 3, "x0_contrast@2": 2, "x0_contrast@3": 3}
MIN_RHO = 0.3  # a signal weaker than this is dropped
TABLE_NOTES = {  # tables measured on held-out images and then replaced (the sweep keeps their rows)
    "af674a31": "The x0-contrast table (commit 29de082: x0 contrast after 2 probe steps, 3 bins, 20 or 25 "
    "steps), fitted on train images where its signal had rho 0.37; dropped after this held-out run.\n\n",
}
FF_NOTE = (
    "The setting step_control.py chose on 16 training prompts, where on 24 held-out images (every third "
    "combination, seeds 1000 + i) it met G1 and G2 (17.38 NFE, worst 32.87 dB). On these 72 images (seed 1000 + "
    'prompt index) it is the weaker run at its cost. It is not a default anywhere: `steps="auto"` keeps the '
    "table.\n\n"
)
DROPPED = (
    "x0_contrast@2 (train rho 0.37, 24 images) predicted nothing on 72 held-out images (rho 0.06; every candidate "
    "|rho| < 0.25 there): no signal is used"
)


def calibrate(cache: Path, signal: str = "best") -> dict:
    """Fit the table. ``signal="best"``: the candidate with the largest |rho| on the train images, if it
    reaches MIN_RHO; ``"none"``: one step count for every image (used once held-out images showed that no
    candidate predicts the need, see the results file)."""
    result = run_sweep("train", cache)
    records = need_records(result, "train", cache)
    rho = correlations(records)
    # either sign predicts: a tier table gives each tier its own count, and a probe signal is oriented by the
    # sign of its correlation (the table's bins then give more steps to more of the oriented signal)
    usable = {s: abs(v) for s, v in rho.items() if s in PLANNER_SIGNALS and not math.isnan(v)}
    best = max(usable, key=lambda s: usable[s])
    sign = -1 if best != "tier" and rho[best] < 0 else 1
    if usable[best] < MIN_RHO or signal == "none":  # no signal predicts the need: one count for every image
        best = "none"
    # split by tier only when the tier itself predicts the need; otherwise every tier gets the pooled bins
    split = best == "tier" or (best != "none" and usable.get("tier", 0.0) >= MIN_RHO)
    tiers = {}
    for tier in ("simple", "neutral", "detailed"):
        recs = [r for r in records if not split or r["tier"] == TIER_CODE[tier]]
        if not recs:
            continue
        if best in ("tier", "none"):
            signal, bins = [0.0] * len(recs), 1
        else:
            signal, bins = [sign * r[best] for r in recs], 3
        tiers[tier] = cal.fit_bins(signal, [r["need"] for r in recs], bins=bins, min_steps=8, max_steps=30)
    for tier in ("simple", "neutral", "detailed"):  # an unseen tier gets the neutral rows (or the max)
        tiers.setdefault(tier, tiers.get("neutral", [[math.inf, 30]]))
    table = {
        "signal": best.split("@")[0] if "@" in best else "tier",
        "sign": sign,
        "probe_steps": PLANNER_SIGNALS.get(best) or 1,
        "tiers": tiers,
        "meta": {
            "psnr_target_db": THRESHOLD_DB,
            "reference": f"{REFERENCE}, same noise",
            "candidates": NEED_GRID,
            "chosen_signal": best,
            "dropped": DROPPED if signal == "none" else None,
            "spearman_train": {k: None if math.isnan(v) else round(v, 3) for k, v in rho.items()},
            "guidance_scale": GUIDANCE,
            "prompts": f"{len(records)} train-split images (sample_attributes({TRAIN[0]['n']}, seed=7, split='train'), "
            "seed 3000 + i)",
            "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "weights": os.environ.get("FASTDIFF_TINY_WEIGHTS") or "shipped fastdiff/tiny/weights",
        },
    }
    write_table(table)
    (cache / "calibration.json").write_text(
        json.dumps({"records": records, "rho": rho, "table": table}, default=str)
    )
    print("spearman (train):", rho, "\ntable:", table)
    return table


def write_table(table: dict) -> None:
    body = re.sub(r"\binf\b", "math.inf", pprint.pformat(table, width=100, sort_dicts=False))
    TABLE_PATH.write_text(
        '"""Calibrated step table for ``steps="auto"`` (written by ``benchmarks/dynamic_steps.py --phase '
        "calibrate``).\n\n"
        "``signal``: what AutoSteps reads after ``probe_steps`` steps of the 8-step schedule; for each prompt\n"
        "tier, [(upper bound of the signal, steps), ...]: the most steps any calibration image in that bin (or a\n"
        "lower one) needed to reach ``psnr_target_db`` against its reference (``meta``). ``meta`` records the\n"
        "rank correlation of every candidate signal with that need (see ``results/dynamic_steps.md``).\n"
        '"""\n\nimport math\n\n'
        f"TABLE = {body}\n"
    )
    subprocess.run([sys.executable, "-m", "ruff", "format", "-q", str(TABLE_PATH)], check=False)


# ------------------------------------------------------------------------------------------------ report
def summarise(rows: list[dict]) -> dict:
    psnr = [r["psnr"] for r in rows if not r["is_reference"]]
    return {
        "images": len(rows),
        "mean NFE": round(float(np.mean([r["nfe"] for r in rows])), 2),
        "PSNR mean": round(float(np.mean(psnr)), 2) if psnr else "ref",
        "PSNR worst": round(float(np.min(psnr)), 2) if psnr else "ref",
        "images >= 30 dB": f"{sum(p >= THRESHOLD_DB for p in psnr)}/{len(psnr)}" if psnr else "ref",
        "attr all": round(float(np.mean([r["attr_all"] for r in rows])), 3),
        "shape colour": round(float(np.mean([r["attr_shape_colour"] for r in rows])), 3),
        "bg colour": round(float(np.mean([r["attr_bg_colour"] for r in rows])), 3),
        "shape": round(float(np.mean([r["attr_shape"] for r in rows])), 3),
        "wall s/image": round(float(np.mean([r["wall_s"] for r in rows])), 3),
    }


def preview_agreement(folder: Path, draft_rows: list[dict], lcm_rows: list[dict]) -> dict:
    """How often the 4-step draft's attributes (read from its pixels) equal the refined image's."""
    from PIL import Image

    from fastdiff.metrics.attributes import read_attributes

    lcm = {(r["prompt"], r["seed"]): r for r in lcm_rows}
    pairs = [(lcm[(r["prompt"], r["seed"])], r) for r in draft_rows]

    def read(rows):
        return read_attributes(
            np.stack([np.asarray(Image.open(folder / r["image"]).convert("RGB")) for r in rows])
        )

    a, b = read([p for p, _ in pairs]), read([q for _, q in pairs])
    out = {}
    for key in ("shape_colour", "bg_colour", "shape"):
        out[key] = float(np.mean([getattr(x, key) == getattr(y, key) for x, y in zip(a, b)]))
    out["all"] = float(np.mean([x == y for x, y in zip(a, b)]))
    return {k: round(v, 3) for k, v in out.items()}


def paired(rows_a: list[dict], rows_b: list[dict]) -> str:
    """Images where only A / only B has all attributes right (the discordant pairs of McNemar's test)."""
    b = {(r["prompt"], r["seed"]): r["attr_all"] for r in rows_b}
    only_a = sum(1 for r in rows_a if r["attr_all"] and not b[(r["prompt"], r["seed"])])
    only_b = sum(1 for r in rows_a if not r["attr_all"] and b[(r["prompt"], r["seed"])])
    n, k = only_a + only_b, min(only_a, only_b)
    p = min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2**n) if n else 1.0  # exact McNemar
    return f"{only_a} / {only_b} (p = {p:.2g})"


def preset_steps(summary: dict, share: float):
    """The fewest grid steps with at least ``share`` of the images at >= THRESHOLD_DB (None if none)."""
    for n in NEED_GRID:
        s = summary.get(fixed_name(n))
        if s:
            hit, total = map(int, s["images >= 30 dB"].split("/"))
            if hit >= share * total:
                return n
    return None


def at_cost(summary: dict, nfe: float, names=None) -> tuple[list[str], list[str]]:
    """The fixed rows at the cheapest step count that costs at least a mean NFE, and at the next cheaper one:
    (below, at or above). ``names``: (steps, row name) pairs to choose from; default the grid and AT_COST."""
    if names is None:
        names = [(n, fixed_name(n)) for n in NEED_GRID] + [(n, fixed_name(n, s)) for n, s, _ in AT_COST]
    names = list(dict.fromkeys((n, k) for n, k in names if k in summary))
    hi = min((n for n, _ in names if n >= nfe), default=None)  # the cheapest fixed count that costs as much
    lo = max((n for n, _ in names if n < nfe), default=None)
    return [k for n, k in names if n == lo], [k for n, k in names if n == hi]


def beats_every(summary: dict, mode: str, fixed) -> bool:
    """Issue #12's G1 test: worst-image PSNR higher and attribute accuracy no lower than each of ``fixed``
    (False when there is no fixed row to compare with)."""
    a = summary[mode]
    return bool(fixed) and all(
        a["PSNR worst"] > summary[f]["PSNR worst"] and a["attr all"] >= summary[f]["attr all"] for f in fixed
    )


def report(cache: Path, load: str) -> None:
    from fastdiff.sweep.collate import collate

    def folder(kind):
        if not (cache / kind / "sweep.json").exists():
            return None, {}, {}
        result = collate(cache / kind, plots=False)
        by_config = {}
        for r in result.rows:
            by_config.setdefault(r["config"], []).append(r)
        return result, by_config, {name: summarise(rows) for name, rows in by_config.items()}

    held, by_held, sum_held = folder("heldout")
    result, by_config, summary = folder("need")
    sections, data = [], {"summary_need_72": summary, "summary_heldout_144": sum_held}

    # fixed schedules
    fixed = [REFERENCE] + [fixed_name(n) for n in NEED_GRID] + [fixed_name(n, s) for n, s in EXTRA_FIXED]
    table = [{"method": k, **summary[k]} for k in fixed if k in summary]
    sections.append(
        '## Fixed DPM-Solver++(2M) schedules (schedule "auto": trailing <= 10 steps, Karras above)\n\n'
        "First seed only (72 held-out images).\n\n"
        + markdown_table(table)
        + "\nFewest steps with at least 50% / 75% / 95% of the images at >= 30 dB (the presets' rule, "
        + "fastdiff/dynamic/presets.py): "
        + " / ".join(str(preset_steps(summary, q)) for q in (0.5, 0.75, 0.95))
        + "\n"
    )

    # auto steps
    calib = (
        json.loads((cache / "calibration.json").read_text())
        if (cache / "calibration.json").exists()
        else None
    )
    records = need_records(result, "need", cache) if result else []
    autos = sorted((k for k in by_config if k.startswith("auto (")), key=lambda k: k == auto_name())
    autos += [k for k in by_config if k in (FAST_FORWARD["name"], EARLY_STOP["name"])]  # judged the same way
    if records:
        rho = correlations(records)
        needs = [r["need"] for r in records]
        finite = [n for n in needs if math.isfinite(n)]
        data["heldout_need"] = {"spearman": rho, "needs": needs}
        lines = [
            f"Need = fewest of {NEED_GRID} steps reaching {THRESHOLD_DB:g} dB against the image's reference ({REFERENCE}) "
            f"({len(records)} held-out images; {len(needs) - len(finite)} reached it at no candidate). Oracle mean "
            f"need (every image at >= {THRESHOLD_DB:g} dB, unreached counted as 30): "
            f"{np.mean([min(n, 30) for n in needs]):.2f} steps. Distribution: "
            + ", ".join(f"{n}: {needs.count(n)}" for n in sorted(set(needs))),
            "",
            "| signal | Spearman rho with need, train (calibration) | held-out |",
            "|---|---|---|",
        ]
        for s in SIGNALS:
            tr = calib["rho"][s] if calib else float("nan")
            lines.append(f"| {s} | {tr:.3f} | {rho[s]:.3f} |")
        for auto in autos:
            chosen = {(r["prompt"], r["seed"]): int(r["nfe"]) for r in by_config[auto]}
            rho_auto = cal.spearman([chosen[(r["prompt"], r["seed"])] for r in records], needs)
            data["heldout_need"].setdefault("spearman_auto_choice", {})[auto] = rho_auto
            lines.append(f"| NFE per image of {auto} | | {rho_auto:.3f} |")
        sections.append(
            "## Does the complexity signal predict the steps an image needs?\n\n" + "\n".join(lines) + "\n"
        )
    for auto in autos:
        nfe = summary[auto]["mean NFE"]
        below, above = at_cost(summary, nfe)
        best = max(above, key=lambda k: (summary[k]["PSNR worst"], summary[k]["attr all"]))
        rows = [{"method": auto, **summary[auto]}]
        rows += [
            {"method": k + (" (>= its mean NFE)" if k in above else ""), **summary[k]} for k in above + below
        ]
        steps = [int(r["nfe"]) for r in by_config[auto]]
        data.setdefault("auto", {})[auto] = {
            "comparator": best,
            "fixed_at_cost": above + below,
            "steps": steps,
        }
        sections.append(
            f"## {auto} against the fixed schedules of equal mean NFE\n\n"
            + (
                FF_NOTE
                if auto == FAST_FORWARD["name"]
                else TABLE_NOTES.get(auto.split("table ")[-1].rstrip(")"), "")
            )
            + markdown_table(rows)
            + "\nNFE per image (images at each count): "
            + ", ".join(f"{n}: {steps.count(n)}" for n in sorted(set(steps)))
            + f"; paired attribute counts (only {auto} right / only {best} right): "
            + paired(by_config[auto], by_config[best])
            + "\n"
        )

    # draft then refine (both seeds: 144 images)
    lcm_name = f"LCM {DRAFT_STEPS} (draft alone)"
    drafts = []
    for total, pairs_ in DRAFTS.items():
        teachers = [
            k
            for k in (fixed_name(total), *(fixed_name(n, s) for n, s in EXTRA_FIXED if n == total))
            if k in sum_held
        ]
        best = max(teachers, key=lambda k: sum_held[k]["attr all"]) if teachers else None
        for k in teachers:
            drafts.append({"total NFE": total, "method": k, **sum_held[k]})
        for n, s in pairs_:
            k = draft_name(n, s)
            if k not in sum_held:
                continue
            agree = (
                preview_agreement(cache / "heldout", by_held[k], by_held[lcm_name])
                if lcm_name in by_held
                else {}
            )
            data.setdefault("preview_agreement", {})[k] = agree
            drafts.append(
                {
                    "total NFE": total,
                    "method": k,
                    **sum_held[k],
                    "draft agrees (all)": agree.get("all"),
                    "only draft / only best teacher right": paired(by_held[k], by_held[best]) if best else "",
                }
            )
    if lcm_name in sum_held:
        drafts.append({"total NFE": DRAFT_STEPS, "method": lcm_name, **sum_held[lcm_name]})
    if drafts:
        agree_lines = [
            f"| {k} | " + " | ".join(str(v[a]) for a in ("shape_colour", "bg_colour", "shape", "all")) + " |"
            for k, v in data.get("preview_agreement", {}).items()
        ]
        sections.append(
            "## LCM draft + teacher refine against the teacher alone at equal NFE\n\n"
            + markdown_table(drafts, list(dict.fromkeys(k for r in drafts for k in r)))
            + "\nDraft as a preview: share of images whose 4-step draft shows the same attributes as the refined image\n\n"
            + "| method | shape colour | background colour | shape | all |\n|---|---|---|---|---|\n"
            + "\n".join(agree_lines)
            + "\n"
        )

    if (cache / "exact.md").exists():
        sections.append((cache / "exact.md").read_text())
    meta = env_info()
    runs = (cache / "log.txt").read_text().splitlines() if (cache / "log.txt").exists() else []
    meta["load"] = {"report": load, "runs": runs}
    notes = (
        "fastdiff-tiny, shipped weights, guidance 5, 72 held-out prompt combinations (colour pairs never trained on); "
        "the draft comparison uses 2 seeds each (1000 + i, 5000 + i: 144 images), the step grid and auto steps the "
        "first seed (72 images, for the time budget); batches of 24, fp32 CPU, run by fastdiff.sweep. PSNR per image "
        f"(data range 1) against the {REFERENCE} image from the same noise (benchmarks/_reference.py); worst = worst image. "
        "attr all = shape colour, background colour and shape all read right by fastdiff.metrics. NFE counts U-Net "
        "calls per image (a classifier-free-guidance pair counts once; the LCM student embeds guidance, so its calls "
        "are single rows). Wall times on a shared 2-core machine are indicative only."
    )
    path_md = RESULTS_DIR / f"{NAME}.md"
    data["goals"] = goal_lines(summary, sum_held, data)
    goals = "\n".join(f"- {g}" for g in data["goals"]) + "\n"
    path_md.write_text(
        f"# {NAME}\n\n{hardware_line(meta)}\n\n{notes}\n\nLoad average (1, 5, 15 min) before -> after each run:\n\n"
        + "".join(f"    {line}\n" for line in runs)
        + f"\n## Goals\n\n{goals}\n"
        + "\n".join(sections)
    )
    (RESULTS_DIR / f"{NAME}.json").write_text(
        json.dumps({"meta": meta, "notes": notes, "calibration": calib, **data}, indent=1, default=str) + "\n"
    )
    print(path_md.read_text())


def _met(ok: bool) -> str:
    return "**met**" if ok else "**not met**"


def goal_lines(summary: dict, sum_held: dict, data: dict) -> list[str]:
    """Each goal of issue #12 this file measures, met or not met, with the figures that decide it."""
    out = []
    need = data.get("heldout_need") or {}
    for auto, rho in need.get("spearman_auto_choice", {}).items():
        if math.isnan(rho):
            out.append(f"{auto} uses no signal (one count for every image): nothing to correlate")
            continue
        out.append(
            f"The NFE per image of {auto} predicts the steps a held-out image needs (Spearman rho >= {MIN_RHO}): "
            f"{_met(rho >= MIN_RHO)} (rho = {rho:.3f})"
        )
    for auto in data.get("auto", {}):
        a = summary[auto]
        fixed = at_cost(summary, a["mean NFE"])[1]  # the cheapest fixed rows that cost at least as much
        ok = beats_every(summary, auto, fixed)
        out.append(
            f"{auto} beats every fixed schedule of its mean NFE, rounded up (worst-image PSNR higher, attribute "
            f"accuracy no lower): {_met(ok)} ({a['mean NFE']} NFE: worst {a['PSNR worst']} dB, attributes "
            f"{a['attr all']}; "
            + "; ".join(
                f"{k}: worst {summary[k]['PSNR worst']} dB, attributes {summary[k]['attr all']}"
                for k in fixed
            )
            + ")"
        )
    for total, pairs_ in DRAFTS.items():
        teachers = [k for k in sum_held if k == fixed_name(total) or k.startswith(fixed_name(total) + " ")]
        drafts = [draft_name(n, s) for n, s in pairs_ if draft_name(n, s) in sum_held]
        if not teachers or not drafts:
            continue
        t_best = max(teachers, key=lambda k: sum_held[k]["attr all"])
        d_best = max(drafts, key=lambda k: sum_held[k]["attr all"])
        ok = sum_held[d_best]["attr all"] >= sum_held[t_best]["attr all"]
        out.append(
            f"Draft + refine at {total} NFE: attribute accuracy >= the teacher's best fixed schedule of {total} "
            f"steps: {_met(ok)} (best draft: {d_best}, {sum_held[d_best]['attr all']}; teacher {t_best}, "
            f"{sum_held[t_best]['attr all']}; every strength: "
            + ", ".join(f"{sum_held[d]['attr all']}" for d in drafts)
            + ")"
        )
    agree = data.get("preview_agreement")
    if agree:
        lo = min(agree, key=lambda k: agree[k]["all"])
        hi = max(agree, key=lambda k: agree[k]["all"])
        out.append(
            f"The 4-step draft's attributes agree with the refined image's >= 90% of the time: "
            f"{_met(agree[lo]['all'] >= 0.9)} for every strength, {_met(agree[hi]['all'] >= 0.9)} for the best "
            f"(all three attributes: {agree[lo]['all']} for {lo}, {agree[hi]['all']} for {hi})"
        )
        lcm = sum_held.get(f"LCM {DRAFT_STEPS} (draft alone)")
        teacher = max((sum_held[k]["attr all"] for k in sum_held if k.startswith("fixed ")), default=None)
        if lcm and teacher is not None:
            # an image the final gets right and the draft wrong disagrees: agreement <= 1 - (acc_final - acc_draft)
            out.append(
                f"Bound: a final image at the teacher's best accuracy ({teacher}) with the draft at "
                f"{lcm['attr all']} agrees at most {1 - (teacher - lcm['attr all']):.3f} of the time; 90% agreement "
                f"needs a final accuracy <= {lcm['attr all'] + 0.1:.3f}, so with this student the two draft goals "
                "cannot both be met"
                if 1 - (teacher - lcm["attr all"]) < 0.9
                else f"Bound: agreement <= {1 - (teacher - lcm['attr all']):.3f} allows 90%"
            )
    return out


# ------------------------------------------------------------------------------------------------ exact
def exact(n: int = 512) -> str:
    from fastdiff.dynamic import sample
    from fastdiff.samplers import make_scheduler
    from fastdiff.samplers.gmm import GaussianMixture, GMMDenoiser, probability_flow_reference

    mixture = GaussianMixture.random(dims=64, components=6, std=0.15, num_classes=3, seed=0)
    scheduler = make_scheduler("dpmpp_2m")
    labels = torch.arange(n) % 3
    denoiser = GMMDenoiser(mixture, scheduler.config, class_labels=labels)
    x_T = torch.randn(n, 4, 4, 4, generator=torch.Generator().manual_seed(0), dtype=torch.float64).float()
    exact_x0 = probability_flow_reference(denoiser, x_T.reshape(n, -1).double()).reshape(x_T.shape)
    rows = []
    for steps in (8, 10, 15, 20, 30):
        res = sample(
            lambda x, t, rows: denoiser(x.reshape(len(rows), -1), t).reshape(x.shape),
            x_T,
            scheduler=scheduler,
            num_inference_steps=steps,
        )
        err = (res.latents.double() - exact_x0).flatten(1).norm(dim=1) / math.sqrt(exact_x0[0].numel())
        rows.append(
            {
                "steps": steps,
                "median RMS vs exact ODE": f"{float(err.median()):.2e}",
                "worst sample": f"{float(err.max()):.2e}",
            }
        )
    return (
        '## Exact Gaussian mixture: the fixed-schedule baseline\n\nFixed DPM-Solver++(2M) (schedule "auto") on the '
        f"exact Gaussian mixture ({n} samples, 64 dims, 6 components, std 0.15, 3 classes, unguided): per-sample RMS "
        "error against the float64 probability-flow ODE solution. It is the equal-cost baseline for controllers "
        "measured on the mixture (benchmarks/step_control.py); auto steps and drafts need prompts and an LCM, so "
        "they are not run here.\n\n" + markdown_table(rows)
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--phase", choices=["calibrate", "heldout", "need", "report", "exact"], required=True)
    ap.add_argument(
        "--only", nargs="*", default=(), help="held-out configurations whose name contains any of these"
    )
    ap.add_argument("--signal", choices=["best", "none"], default="best", help="calibrate: drop the signal")
    ap.add_argument("--cache", default="/tmp/fastdiff-dynamic-steps", help="sweep folders and probe signals")
    args = ap.parse_args()
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    load, t0 = load_average(), time.time()
    if args.phase == "calibrate":
        calibrate(cache, args.signal)
    elif args.phase in ("heldout", "need"):
        run_sweep(args.phase, cache, args.only)
    elif args.phase == "exact":
        (cache / "exact.md").write_text(exact())
    else:
        report(cache, load)
    log_run(cache / "log.txt", f"{args.phase} {args.only}", load, t0)


if __name__ == "__main__":
    main()
