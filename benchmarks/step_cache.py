#!/usr/bin/env python
"""Step caching side by side with DeepCache and T-GATE: U-Net evaluations, U-Net time, fidelity.

Parts (each one process, each under ~15 minutes; run them under the shared lock):

* ``--part tiny --steps 50`` / ``--steps 20,10``: fastdiff-tiny, held-out prompts, guidance 5, diffusers'
  ``DPMSolverMultistepScheduler`` (DPM-Solver++(2M)) for every method. Per image: PSNR against the uncached
  run at the same step count and against a 100-step uncached reference; attribute accuracy
  (:func:`fastdiff.metrics.score`). Full / cached U-Net evaluations are counted the same way for every
  method: a call in which the mid block's first resnet ran is full, any other call is cached.
* ``--part dynamic``: caching composed with fastdiff's step control (:func:`fastdiff.sample`, EarlyStop),
  full U-Net evaluations per image against 50 fixed steps, worst-image PSNR against the 100-step reference.
  ``--cachefit train|confirm|heldout`` (in that order, 32 / 64 / 24 prompts): goal 3 with the sampler, its
  schedule and the refresh plan chosen together on train prompts, then run once on held-out prompts.
* ``--part sd15``: a full-size SD1.5-architecture U-Net with random weights (:mod:`fastdiff.testing`):
  full and cached forward costs at 256² and 512² (guidance batch 2), interleaved in one process; the
  per-image U-Net time at 50/20/10 steps is *derived* from them and the evaluation counts.
* ``--part sd15e2e --steps 50 --sizes 256 --interval 5``: the derived figure checked once, MEASURED: the
  full-size U-Net's whole denoising loop for one image, uncached, fastdiff's equal-cost schedule row (its
  refresh steps from the tiny part's JSON) and DeepCache at the same number of full evaluations.
* ``--part compile``: ``torch._dynamo.explain`` graph-break counts on a tiny U-Net, full and cached path.
* ``--merge``: combine the parts into ``results/step_cache.{json,md}``.

    flock /tmp/fastdiff-heavy.lock nice python benchmarks/step_cache.py --part tiny --steps 50
    python benchmarks/step_cache.py --merge
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import subprocess
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from _common import RESULTS_DIR, env_info, hardware_line, markdown_table  # noqa: E402

from fastdiff import installed  # noqa: E402
from fastdiff.caching import StepProfile, measure_profile, plan_refresh, step_cache, tail_refresh  # noqa: E402

GUIDANCE = 5.0
REF_STEPS = 100


def _uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return "n/a"


def _psnr(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    mse = (a.double() - b.double()).square().flatten(1).mean(1)
    return 10 * torch.log10(1.0 / mse.clamp_min(1e-20))


class UNetMeter:
    """U-Net calls, full/cached evaluations (did the mid block's first resnet run?) and U-Net wall time."""

    def __init__(self, unet):
        self.unet = unet
        self.reset()
        self._hooks = [
            unet.register_forward_pre_hook(self._start),
            unet.register_forward_hook(self._stop),
            unet.mid_block.resnets[0].register_forward_hook(self._deep),
        ]

    def reset(self):
        self.calls = self.full = self.rows = 0
        self.seconds = 0.0

    def _start(self, m, args):
        self._t0 = time.perf_counter()
        self._ran_deep = False

    def _deep(self, m, a, out):
        self._ran_deep = True

    def _stop(self, m, args, out):
        self.seconds += time.perf_counter() - self._t0
        self.calls += 1
        self.full += self._ran_deep
        self.rows += args[0].shape[0] if args else 0

    def remove(self):
        for h in self._hooks:
            h.remove()


# ------------------------------------------------------------------------------------------------- tiny
def _tiny_pipe():
    from diffusers import DPMSolverMultistepScheduler

    from fastdiff.tiny import load_pipeline

    pipe = load_pipeline("base")
    pipe.scheduler = DPMSolverMultistepScheduler.from_config(pipe.scheduler.config)
    return pipe


def _heldout(n: int):
    from fastdiff.tiny import list_prompts

    ps = list_prompts("heldout")
    stride = max(1, len(ps) // n)
    ps = ps[::stride][:n]
    return [p for p, _ in ps], [a for _, a in ps]


def _train_prompts(n: int):
    from fastdiff.tiny.data import sample_attributes

    return [a.prompt for a in sample_attributes(n, seed=11, split="train")]


def _deepcache_generate(pipe, prompts, steps, interval: int):
    """``_generate`` with DeepCache (the peer, from its package) at ``interval``, branch 0, then disabled."""
    from DeepCache import DeepCacheSDHelper

    helper = DeepCacheSDHelper(pipe=pipe)
    helper.set_params(cache_interval=interval, cache_branch_id=0)
    helper.enable()
    try:
        return _generate(pipe, prompts, steps)
    finally:
        helper.disable()


def _generate(pipe, prompts, steps, call=None, **kw):
    gens = [torch.Generator().manual_seed(100 + i) for i in range(len(prompts))]
    call = call or pipe
    t0 = time.perf_counter()
    out = call(
        prompts, num_inference_steps=steps, guidance_scale=GUIDANCE, generator=gens, output_type="pt", **kw
    )
    return out.images.float(), time.perf_counter() - t0


def _measure_profile(pipe, smoke: bool, signal: bool = True) -> tuple[object, float | None]:
    """Gap-cost profile (10-step runs) and the adaptive signal summed over a 50-step run, on train prompts."""
    prompts = _train_prompts(6)
    prof = measure_profile(pipe, prompts, 5 if smoke else 10, guidance_scale=GUIDANCE, seed=500)
    if not signal:
        return prof, None
    steps = 10 if smoke else 50
    h = step_cache(pipe, mode="adaptive", threshold=1e9, max_skip=1)  # every other step full: records signals
    _generate(pipe, prompts, steps)
    signals = [r["signal"] for r in h.stats.trace if "signal" in r]
    installed.undo_all(pipe)
    signal_sum = sum(signals) * (steps - 1) / max(1, len(signals))
    return prof, signal_sum


def _gains(rows: list[dict]) -> None:
    """Per-image PSNR gain of each equal-cost row over the DeepCache row with the same full evaluations."""
    for r in rows:
        tag = r.get("method", "")
        if "(= DeepCache i=" not in tag or "per_image_psnr_vs_uncached" not in r:
            continue
        i = tag.split("(= DeepCache i=")[1].rstrip(")")
        dc = next(
            (d for d in rows if d.get("steps") == r["steps"] and d.get("method") == f"DeepCache i={i} b=0"),
            None,
        )
        if dc is None or "per_image_psnr_vs_uncached" not in dc:
            continue
        a, b = r["per_image_psnr_vs_uncached"], dc["per_image_psnr_vs_uncached"]
        g = sorted(x - y for x, y in zip(a, b))
        r["gain_vs_deepcache"] = {
            "full_evals_equal": r["full_evals"] == dc["full_evals"],
            "mean_gain_db": round(sum(g) / len(g), 2),
            "worst_image_gain_db": round(min(a) - min(b), 2),
            "paired_min_db": round(g[0], 2),
            "paired_median_db": round(
                g[len(g) // 2] if len(g) % 2 else (g[len(g) // 2 - 1] + g[len(g) // 2]) / 2, 2
            ),
            "paired_max_db": round(g[-1], 2),
            "images_gaining_2db": f"{sum(x >= 2 for x in g)}/{len(g)}",
            "images_losing": f"{sum(x < 0 for x in g)}/{len(g)}",
        }


def tiny_part(step_counts: list[int], n_prompts: int, smoke: bool, goal1: bool = False) -> dict:
    """All rows, or (``goal1``) only goal 1's equal-cost rows: DeepCache, the planner, the previous planner."""

    from fastdiff.metrics import score

    pipe = _tiny_pipe()
    prompts, attrs = _heldout(n_prompts)
    meter = UNetMeter(pipe.unet)
    profile, signal_sum = _measure_profile(pipe, smoke, signal=not goal1)
    previous = _previous_profile(pipe, _train_prompts(6), 5 if smoke else 10, 500) if goal1 else None
    ref, _ = _generate(pipe, prompts, 10 if smoke else REF_STEPS)
    rows = []

    def record(name, steps, images, e2e, base, extra=None):
        p_unc, p_ref = _psnr(images, base), _psnr(images, ref)
        acc = score(images.permute(0, 2, 3, 1).numpy(), attrs)
        row = {
            "testbed": "fastdiff-tiny",
            "steps": steps,
            "method": name,
            "unet_calls": meter.calls,
            "full_evals": meter.full,
            "cached_evals": meter.calls - meter.full,
            "unet_rows": meter.rows,
            "unet_s": round(meter.seconds, 3),
            "e2e_s": round(e2e, 3),
            "psnr_vs_uncached_mean": None if base is images else round(float(p_unc.mean()), 2),
            "psnr_vs_uncached_min": None if base is images else round(float(p_unc.min()), 2),
            "psnr_vs_100_mean": round(float(p_ref.mean()), 2),
            "psnr_vs_100_min": round(float(p_ref.min()), 2),
            "attr_all": round(acc["all"], 3),
            "per_image_psnr_vs_uncached": None if base is images else [round(float(x), 2) for x in p_unc],
            "load": os.getloadavg()[0],
        }
        row.update(extra or {})
        rows.append(row)
        print(json.dumps(row), flush=True)

    for steps in step_counts:
        meter.reset()
        base, e2e = _generate(pipe, prompts, steps)
        record("uncached", steps, base, e2e, base)
        intervals = [2, 3, 5] if steps >= 20 else [2, 3]
        if goal1 and steps >= 50:
            intervals = [2, 3, 4, 5]  # interval 4 (13 full of 50) also meets goal 1's 2.5x
        gate = max(1, round(0.4 * steps))
        configs = []
        if goal1:
            for i in intervals:  # the previous planner only where its plan differs (no gap bound)
                n_dc = len(range(0, steps, i))
                plan, old = (
                    plan_refresh(profile, steps, n_dc),
                    plan_refresh(previous, steps, n_dc, max_gap=steps - 1),
                )
                configs.append(
                    (
                        f"fastdiff schedule {n_dc} full (= DeepCache i={i})",
                        dict(mode="schedule", refresh=plan),
                    )
                )
                if old != plan:
                    configs.append(
                        (
                            f"previous planner {n_dc} full (= DeepCache i={i})",
                            dict(mode="schedule", refresh=old),
                        )
                    )
        else:
            for i in intervals:
                configs.append((f"fastdiff uniform i={i} b=0", dict(mode="uniform", interval=i, branch=0)))
            for i in intervals:
                configs.append(
                    (f"fastdiff schedule i={i} b=0", dict(mode="schedule", refresh=profile, interval=i))
                )
            for i in intervals[1:]:
                m = math.ceil(steps / i)
                configs.append(
                    (f"fastdiff adaptive ~i={i} b=0", dict(mode="adaptive", threshold=signal_sum / m))
                )
            for (
                i
            ) in intervals:  # goal 1 "at the same speed-up": exactly DeepCache's number of full evaluations
                n_dc = len(range(0, steps, i))
                configs.append(
                    (
                        f"fastdiff schedule {n_dc} full (= DeepCache i={i})",
                        dict(mode="schedule", refresh=plan_refresh(profile, steps, n_dc)),
                    )
                )
            configs.append(
                (f"fastdiff gate {gate} +uncond", dict(mode="off", gate_step=gate - 1, gate_uncond=True))
            )
            configs.append(
                (
                    f"fastdiff schedule i=3 + gate {gate} +uncond",
                    dict(mode="schedule", refresh=profile, interval=3, gate_step=gate - 1, gate_uncond=True),
                )
            )
        for name, opts in configs:
            h = step_cache(pipe, **opts)
            meter.reset()
            images, e2e = _generate(pipe, prompts, steps)
            refresh = [r["step"] for r in h.stats.trace if r["full"]]
            record(
                name, steps, images, e2e, base, {"refresh_steps": refresh, "notes": "; ".join(h.stats.notes)}
            )
            installed.undo_all(pipe)

        for i in intervals:
            meter.reset()
            try:
                images, e2e = _deepcache_generate(pipe, prompts, steps, i)
                record(f"DeepCache i={i} b=0", steps, images, e2e, base)
            except Exception as e:  # a peer failing on this diffusers version is a result
                rows.append(
                    {
                        "testbed": "fastdiff-tiny",
                        "steps": steps,
                        "method": f"DeepCache i={i}",
                        "error": repr(e),
                    }
                )
                traceback.print_exc()

        if goal1:
            continue
        meter.reset()
        try:
            from tgate import TgateSDLoader

            tpipe = _tiny_pipe()  # T-GATE replaces attention forwards for good: its own pipeline copy
            TgateSDLoader(tpipe)
            tmeter = UNetMeter(tpipe.unet)
            global_meter = meter
            meter = tmeter
            try:
                images, e2e = _generate(
                    tpipe,
                    prompts,
                    steps,
                    call=tpipe.tgate,
                    gate_step=gate,
                    sp_interval=5,
                    fi_interval=1,
                    warm_up=2,
                )
                record(f"T-GATE gate {gate}", steps, images, e2e, base)
            finally:
                tmeter.remove()
                meter = global_meter
        except Exception as e:
            rows.append({"testbed": "fastdiff-tiny", "steps": steps, "method": "T-GATE", "error": repr(e)})
            traceback.print_exc()
    meter.remove()
    _gains(rows)
    if goal1:
        return {
            "rows": rows,
            "planner": "gap-cost",
            "setup": (
                f"Goal 1 rows only. fastdiff-tiny (shipped weights), {len(prompts)} held-out prompts (every "
                f"{max(1, 72 // n_prompts)}th), one seed per prompt, guidance {GUIDANCE}, diffusers "
                "DPMSolverMultistepScheduler (DPM-Solver++(2M)), one batch of all prompts, "
                f"{torch.get_num_threads()} torch thread(s). 'fastdiff schedule N full': plan_refresh with the "
                "single-step sensitivity profile (measure_profile, 6 train-split prompts, 10-step runs) and its "
                "default gap bound (no gap over max(uniform gap, a third of the run)); 'previous planner N full' "
                "(only where its plan differs): the same profile without the bound, as before #13's fix. Both spend exactly DeepCache's number of full evaluations (full_evals). "
                "gain_vs_deepcache: per-image PSNR differences against the DeepCache row of the same cost "
                "(mean, worst image minus worst image, paired min / median / max, count of images gaining >= 2 "
                "dB and losing)."
            ),
            "profile": {"progress": profile.progress, "weight": profile.weight, "gap_cost": profile.gap_cost},
        }
    return {
        "rows": rows,
        "setup": (
            f"fastdiff-tiny (shipped weights), {len(prompts)} held-out prompts (every "
            f"{max(1, 72 // n_prompts)}th), one seed per prompt, guidance {GUIDANCE}, diffusers "
            "DPMSolverMultistepScheduler (DPM-Solver++(2M)) from the model's scheduler config, one batch of "
            "all prompts. Schedule rows: refresh steps planned from a sensitivity profile (measure_profile) on 6 "
            "train-split prompts at 10 steps, with as many full steps as the uniform row of the same interval. "
            "Adaptive threshold = the per-step signal summed over a 50-step run on the same train prompts / "
            f"target full steps (signal sum {signal_sum:.3f}). Gate rows: fastdiff gate_step = T-GATE's gate - 1 "
            "(both stop guidance from the same step)."
        ),
        "profile": {"progress": profile.progress, "weight": profile.weight, "source": profile.source},
    }


# ------------------------------------------------------------------------------------------------- plan
def _eval_prompts(n: int) -> list[str]:
    """Train-split prompts for choosing the planner, none of them a calibration prompt (never held-out ones)."""
    from fastdiff.tiny.data import sample_attributes

    calib = set(_train_prompts(6))
    out = []
    for a in sample_attributes(4 * n, seed=12, split="train"):
        if a.prompt not in calib and a.prompt not in out:
            out.append(a.prompt)
    return out[:n]


def _previous_profile(pipe, prompts, n: int, seed: int) -> StepProfile:
    """The planner input before #13's gap fix: each inner step replayed alone, pooled relative LATENT change."""
    from fastdiff.caching.profile import _images  # noqa: F401  (same generator seeding as measure_gaps)

    def latents():
        gens = [torch.Generator().manual_seed(seed + i) for i in range(len(prompts))]
        out = pipe(
            prompts, num_inference_steps=n, generator=gens, output_type="latent", guidance_scale=GUIDANCE
        )
        return out.images.double()

    h = step_cache(pipe, mode="off")
    try:
        ref, weight = latents(), [0.0]
        for k in range(1, n - 1):
            h.set("schedule", refresh=[s for s in range(n) if s != k])
            weight.append(float((latents() - ref).norm() / ref.norm()))
    finally:
        installed.undo_all(pipe, "step_cache")
    return StepProfile(tuple(torch.linspace(0, 1, n).tolist()), tuple(weight + [0.0]))


def plan_part(n_prompts: int, smoke: bool) -> dict:
    """Choose the refresh planner on TRAIN prompts: gap costs measured at 10 steps, plans compared at 10/20/50.

    Calibration on the 6 calibration prompts: :func:`measure_gaps` (every gap of a 10-step run, decoded
    images) and the previous planner's input (single steps, latents; what measure_profile still measures).
    Candidates: the previous planner (single-step latent weights, cost linear in the distance, no gap
    bound), the measured image gap cost without a bound and with a bound of twice the uniform gap. Each runs on other train-split prompts at DeepCache's number of
    full evaluations, next to DeepCache itself.
    """
    import numpy as np

    from fastdiff.caching.profile import measure_gaps, profile_from_gaps

    pipe = _tiny_pipe()
    n_cal = 5 if smoke else 10
    calib = _train_prompts(2 if smoke else 6)
    mse = measure_gaps(pipe, calib, n_cal, seed=500, guidance_scale=GUIDANCE)
    measured = profile_from_gaps(mse)
    previous = _previous_profile(pipe, calib, n_cal, 500)
    planners = {
        "previous (latent single steps, linear, no bound)": (previous, "none"),
        "measured image gap cost, no bound": (measured, "none"),
        "measured image gap cost, bound 2x uniform gap": (measured, "2x"),
    }
    prompts = _eval_prompts(n_prompts)
    rows = []
    grid = ((6, (3,)),) if smoke else ((10, (3, 2)), (20, (5, 3, 2)), (50, (5, 3, 2)))
    for steps, intervals in grid:
        base, _ = _generate(pipe, prompts, steps)
        seen = {}
        for i in intervals:
            n_full = len(range(0, steps, i))
            images, _ = _deepcache_generate(pipe, prompts, steps, i)
            dc = _psnr(images, base)
            for name, (prof, bound) in planners.items():
                cap = steps - 1 if bound == "none" else 2 * math.ceil((steps - 1) / (n_full - 1))
                plan = plan_refresh(prof, steps, n_full, max_gap=cap)
                if tuple(plan) not in seen:
                    h = step_cache(pipe, mode="schedule", refresh=plan)
                    images, _ = _generate(pipe, prompts, steps)
                    assert sum(r["full"] for r in h.stats.trace) == n_full, h.stats.trace
                    installed.undo_all(pipe)
                    seen[tuple(plan)] = _psnr(images, base)
                p = seen[tuple(plan)]
                gain = p - dc
                row = {
                    "steps": steps,
                    "full_evals": n_full,
                    "planner": name,
                    "refresh_steps": plan,
                    "psnr_mean": round(float(p.mean()), 2),
                    "psnr_worst": round(float(p.min()), 2),
                    "deepcache_mean": round(float(dc.mean()), 2),
                    "deepcache_worst": round(float(dc.min()), 2),
                    "gain_mean": round(float(gain.mean()), 2),
                    "gain_worst_image": round(float(p.min() - dc.min()), 2),
                    "paired_gain_min": round(float(gain.min()), 2),
                    "per_image_psnr": [round(float(x), 2) for x in p],
                    "deepcache_per_image_psnr": [round(float(x), 2) for x in dc],
                    "load": os.getloadavg()[0],
                }
                rows.append(row)
                print(json.dumps({k: v for k, v in row.items() if "per_image" not in k}), flush=True)
    e = mse.mean(-1)
    return {
        "rows": rows,
        "calibration": {
            "steps": n_cal,
            "image_mse_mean_over_prompts": np.round(e, 6).tolist(),
            "image_mse_worst_prompt": np.round(mse.max(-1), 6).tolist(),
            "previous_latent_weights": [round(w, 4) for w in previous.weight],
        },
        "setup": (
            f"Planner choice on TRAIN prompts only (no held-out prompt is used here). Calibration: the 6 "
            f"calibration train prompts (seed 500), {n_cal} DPM-Solver++(2M) steps, guidance {GUIDANCE}: "
            "measure_gaps (every gap: steps a+1..b-1 replay step a; image MSE against the uncached run) and "
            "the previous planner's single-step latent sensitivities. Evaluation: "
            f"{len(prompts)} other train-split prompts, PSNR of each decoded image against the uncached run at "
            "the same step count; every planner at DeepCache's number of full evaluations, and DeepCache itself "
            "(gain = planner - DeepCache; gain_worst_image = worst image minus worst image; paired_gain_min = "
            "the smallest per-image difference)."
        ),
    }


# --------------------------------------------------------------------------------------------- forecast
# (forecast, axis, strength)
FORECAST_VARIANTS = (
    ("none", "step", 1.0),
    ("linear", "step", 1.0),
    ("linear", "step", 0.5),
    ("linear", "timestep", 1.0),
    ("linear", "timestep", 0.5),
    ("quadratic", "step", 1.0),
)


def _fc_name(fc: str, axis: str, lam: float) -> str:
    return "forecast=none" if fc == "none" else f"forecast={fc}/{axis}" + (f" x{lam:g}" if lam != 1 else "")


def _eval_attrs(n: int):
    """Train-split (prompt, attributes), none a calibration prompt: for choosing forecast settings."""
    from fastdiff.tiny.data import sample_attributes

    calib, out, seen = set(_train_prompts(6)), [], set()
    for a in sample_attributes(4 * n, seed=12, split="train"):
        if a.prompt not in calib and a.prompt not in seen:
            seen.add(a.prompt)
            out.append(a)
    out = out[:n]
    return [a.prompt for a in out], out


def forecast_part(n_prompts: int, smoke: bool, split: str) -> dict:
    """Replay (forecast='none') against feature forecasting, beside DeepCache at exactly its full evaluations.

    50 and 20 DPM-Solver++(2M) steps (the pipe's diffusers scheduler, leading spacing: evenly spaced
    timesteps, so axis 'step' and 'timestep' give the same forecast there and only 'step' is run), and
    (train split, for choosing the axis) 30 steps on fastdiff.make_scheduler('dpmpp_2m'), whose timesteps
    are not evenly spaced.
    """

    from fastdiff.metrics import score
    from fastdiff.samplers import make_scheduler

    pipe = _tiny_pipe()
    prompts, attrs = _heldout(n_prompts) if split == "heldout" else _eval_attrs(n_prompts)
    meter = UNetMeter(pipe.unet)
    profile, _ = _measure_profile(pipe, smoke, signal=False)
    rows = []

    def record(name, sched, steps, images, e2e, base, extra=None):
        p_unc = _psnr(images, base)
        acc = score(images.permute(0, 2, 3, 1).numpy(), attrs)
        row = {
            "testbed": "fastdiff-tiny",
            "scheduler": sched,
            "steps": steps,
            "method": name,
            "full_evals": meter.full,
            "cached_evals": meter.calls - meter.full,
            "unet_s_per_image": round(meter.seconds / len(prompts), 3),
            "e2e_s": round(e2e, 2),
            "psnr_vs_uncached_mean": None if base is images else round(float(p_unc.mean()), 2),
            "psnr_vs_uncached_min": None if base is images else round(float(p_unc.min()), 2),
            "attr_all": round(acc["all"], 3),
            "per_image_psnr_vs_uncached": None if base is images else [round(float(x), 2) for x in p_unc],
            "load": os.getloadavg()[0],
        }
        row.update(extra or {})
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if "per_image" not in k}), flush=True)

    own = pipe.scheduler
    grid = [("diffusers", 50, (5, 3)), ("diffusers", 20, (3,))]
    if split == "train":
        grid.append(("fastdiff dpmpp_2m", 30, (2,)))
    if smoke:
        grid = [("diffusers", 10, (3,))]
    for sched, steps, intervals in grid:
        pipe.scheduler = own if sched == "diffusers" else make_scheduler("dpmpp_2m", like=own)
        meter.reset()
        base, e2e = _generate(pipe, prompts, steps)
        record("uncached", sched, steps, base, e2e, base)
        for i in intervals:
            meter.reset()
            images, e2e = _deepcache_generate(pipe, prompts, steps, i)
            record(f"DeepCache i={i} b=0", sched, steps, images, e2e, base)
            n_dc = len(range(0, steps, i))
            plans = [(f"(= DeepCache i={i})", plan_refresh(profile, steps, n_dc))]
            if steps == 20 and i == 3:  # goal 2's row: the planner at uniform interval 3's budget (8 full)
                plans.append(("(goal 2: schedule i=3)", sorted(plan_refresh(profile, steps, n_dc + 1))))
            for tag, plan in plans:
                for fc, axis, lam in FORECAST_VARIANTS:
                    if axis == "timestep" and sched == "diffusers":
                        continue  # evenly spaced timesteps: the same forecast as axis 'step'
                    if fc == "quadratic" and split != "train":
                        continue  # lost everywhere on the train prompts (part forecast-train)
                    h = step_cache(
                        pipe,
                        mode="schedule",
                        refresh=plan,
                        forecast=fc,
                        forecast_axis=axis,
                        forecast_strength=lam,
                    )
                    meter.reset()
                    images, e2e = _generate(pipe, prompts, steps)
                    refresh = [r["step"] for r in h.stats.trace if r["full"]]
                    installed.undo_all(pipe)
                    name = f"fastdiff schedule {len(plan)} full {_fc_name(fc, axis, lam)}"
                    record(f"{name} {tag}", sched, steps, images, e2e, base, {"refresh_steps": refresh})
    pipe.scheduler = own
    meter.remove()
    _gains(rows)
    return {
        "rows": rows,
        "planner": "gap-cost",
        "split": split,
        "setup": (
            f"fastdiff-tiny (shipped weights), {len(prompts)} "
            + (
                f"held-out prompts (every {max(1, 72 // n_prompts)}th)"
                if split == "heldout"
                else "TRAIN-split prompts (not the planner's calibration prompts): used to choose the default"
            )
            + f", one seed per prompt, guidance {GUIDANCE}, one batch of all prompts, {torch.get_num_threads()} "
            "torch thread(s). scheduler 'diffusers': the pipe's DPMSolverMultistepScheduler (DPM-Solver++(2M), "
            "leading spacing: evenly spaced timesteps, so forecast axis 'timestep' equals 'step' and is not run); "
            "'fastdiff dpmpp_2m': fastdiff.make_scheduler (from t=999, unevenly spaced). fastdiff rows: "
            "plan_refresh (single-step sensitivity profile on 6 calibration train prompts, gap bound) at exactly "
            "DeepCache's number of full evaluations; forecast=none replays the cached feature (as before), "
            "linear / quadratic extrapolate it from the last 2 / 3 full evaluations (fastdiff.caching.forecast), "
            "'x0.5': forecast_strength 0.5 (half the extrapolated change). "
            "PSNR of each decoded image against the uncached run of the same scheduler and step count; "
            "unet_s_per_image: time inside U-Net calls / prompts (2-core machine shared with other work: see "
            "load). gain_vs_deepcache: per-image differences against the DeepCache row of the same cost."
        ),
    }


CACHEFIT_SCHEDULES = (
    ("karras rho 7", dict(schedule="karras")),
    ("karras rho 5", dict(schedule="karras", rho=5.0)),
    ("trailing", dict(schedule="trailing")),
)
CACHEFIT_SAMPLERS = ("dpmpp_2m", "dpmpp_3m", "unipc")
CACHEFIT_BUDGET = 16  # full evaluations per image: 3.12x fewer than 50 steps


def _cachefit_configs(split: str, profile) -> list[tuple]:
    """Goal 3's configurations at 16 full evaluations per image: ``(name, steps, cache, controller, sched)``.

    ``train``: every sampler x schedule uncached at 16 steps and cached to 16 full by :func:`plan_refresh`
    at 18, 20 and 24 steps; then DPM-Solver++(2M) Karras (rho 7 and 5) with :func:`tail_refresh` (the
    low-noise tail cached, as a block or every other step) at 17-26 steps. ``confirm``: the six best train
    rows again on a larger draw of train prompts. ``heldout``: confirm's best beside the alternatives of the
    same cost.
    """
    m = CACHEFIT_BUDGET
    if split == "train":
        configs = []
        for sampler, (label, sched) in itertools.product(CACHEFIT_SAMPLERS, CACHEFIT_SCHEDULES):
            o, tag = dict(sched, sampler=sampler), f"{sampler} {label}"
            configs.append((f"{tag}: fixed {m}", m, None, None, o))
            for n in (18, 20, 24):
                cache = dict(mode="schedule", refresh=plan_refresh(profile, n, m))
                configs.append((f"{tag}: fixed {n} + planned {m} full", n, cache, None, o))
        for (label, sched), n, spacing in itertools.product(
            CACHEFIT_SCHEDULES[:2], (17, 18, 19, 20, 21, 22, 24, 26), ("block", "alternate")
        ):
            if spacing == "alternate" and not 1 < n - m <= (n - 1) // 2:  # 1 cached step: = block
                continue
            cache = dict(mode="schedule", refresh=tail_refresh(n, m, spacing))
            name = f"dpmpp_2m {label}: fixed {n} + tail {spacing} {m} full"
            configs.append((name, n, cache, None, dict(sched, sampler="dpmpp_2m")))
        return configs
    if split == "confirm":
        rows = _cachefit_ranked("train")[:6]
        configs = [_cachefit_config(r) for r in rows]
        default = ("dpmpp_2m karras rho 7: fixed 16", m, None, None, dict(sampler="dpmpp_2m"))
        return configs + ([default] if default[0] not in [c[0] for c in configs] else [])
    best = _cachefit_config(_cachefit_ranked("confirm")[0])
    name, steps, cache, _, sched = best
    planned = dict(mode="schedule", refresh=plan_refresh(profile, 20, m))
    configs = [
        (f"chosen: {name}", steps, cache, None, sched),
        (f"chosen schedule uncached: fixed {steps}", steps, None, None, sched),
        (f"chosen schedule uncached: fixed {m}", m, None, None, sched),
        (f"default schedule: fixed {m}", m, None, None, {}),
        (f"default schedule: fixed 20 + planned {m} full", 20, planned, None, {}),
        ("default schedule: fixed 50", 50, None, None, {}),
    ]
    unique = {}
    for c in configs:  # an uncached choice makes some alternatives the same run
        unique.setdefault(json.dumps([c[1], c[2], c[4] or {"sampler": "dpmpp_2m"}], sort_keys=True), c)
    return list(unique.values())


def _cachefit_ranked(split: str) -> list[dict]:
    """Rows of a cachefit part within the budget, best first: the highest worst-image PSNR against the
    reference, ties broken by the mean (the rule was fixed before any held-out run)."""
    part = json.loads(_part_path(f"dynamic-cachefit-{split}").read_text())
    ok = [r for r in part["rows"] if r["full_evals_per_image_max"] <= CACHEFIT_BUDGET]
    return sorted(ok, key=lambda r: (r["psnr_vs_ref_min"], r["psnr_vs_ref_mean"]), reverse=True)


def _cachefit_config(row: dict) -> tuple:
    """A recorded cachefit row back as a configuration (its steps, refresh plan and scheduler options)."""
    cache = None if row["refresh"] is None else dict(mode="schedule", refresh=row["refresh"])
    return row["method"], row["steps"], cache, None, row["scheduler_options"]


# ---------------------------------------------------------------------------------------------- dynamic
def dynamic_part(
    n_prompts: int,
    smoke: bool,
    fastdiff_scheduler: bool = False,
    forecast: bool = False,
    sixteen_full: bool = False,
    cachefit: str | None = None,
) -> dict:
    """Goal 3's rows. ``fastdiff_scheduler``: every run uses ``make_scheduler("dpmpp_2m", like=...)``
    (fastdiff's step control: every step count starts at t=999) instead of the pipe's leading-spaced diffusers
    scheduler, whose 30/50/100-step runs start at t=961/951/901 and so solve different problems
    (results/reference_convergence.md); it adds the uncached fixed runs of equal full-evaluation cost and
    FastForward, which met #12's G1 at 25 NFE (step_control.md at 47f793b). ``sixteen_full``: goal 3 at
    exactly its bound (16 full evaluations, 3.12x fewer than 50): runs of 18, 20 and 24 steps that cache only
    the steps beyond 16, beside uncached 16, 18 and 20, so the row says whether caching adds anything over
    fewer steps. ``cachefit``: goal 3 with the sampler, its schedule and the cache plan chosen together
    (:func:`_cachefit_configs`): ``"train"`` and ``"confirm"`` on train-split prompts that are not
    calibration prompts, ``"heldout"`` only confirm's best (:func:`_cachefit_ranked`, a rule fixed before
    any held-out run) beside the uncached and default-schedule alternatives of the same cost."""
    from diffusers import DPMSolverMultistepScheduler  # noqa: F401  (scheduler class of the pipe)

    from fastdiff.dynamic import EarlyStop, FastForward, sample
    from fastdiff.metrics import score
    from fastdiff.samplers import make_scheduler

    pipe = _tiny_pipe()
    fastdiff_scheduler = fastdiff_scheduler or cachefit is not None
    if fastdiff_scheduler:
        pipe.scheduler = make_scheduler("dpmpp_2m", like=pipe.scheduler)
    if cachefit in ("train", "confirm"):
        prompts, attrs = _eval_prompts(n_prompts), None
    else:
        prompts, attrs = _heldout(n_prompts)
    profile, _ = _measure_profile(pipe, smoke)
    cond, uncond = pipe.encode_prompt(prompts, "cpu", 1, True, [""] * len(prompts))
    shape = (len(prompts), 4, pipe.unet.config.sample_size, pipe.unet.config.sample_size)
    x_T = torch.cat(
        [
            torch.randn(shape[1:], generator=torch.Generator().manual_seed(100 + i))[None]
            for i in range(len(prompts))
        ]
    )
    meter = UNetMeter(pipe.unet)

    def decode(lat):
        with torch.no_grad():
            img = pipe.vae.decode(lat / pipe.vae.config.scaling_factor).sample
        return (img / 2 + 0.5).clamp(0, 1).float()

    full_per_row = torch.zeros(len(prompts))

    def run(steps, handle=None, controller=None):
        prev = {"rows": None}
        full_per_row.zero_()

        def model_fn(x, t, rows):
            if handle is not None and prev["rows"] is not None and len(rows) < len(prev["rows"]):
                pos = torch.tensor([prev["rows"].tolist().index(r) for r in rows.tolist()])
                handle.keep_rows(pos, num_rows=len(prev["rows"]))  # the wiring the loop hook will do
            prev["rows"] = rows
            ctx = torch.cat([uncond[rows], cond[rows]])
            with torch.no_grad():
                tt = torch.cat([t, t]) if torch.is_tensor(t) and t.ndim else t  # per-row t after a jump
                eps = pipe.unet(torch.cat([x, x]), tt, encoder_hidden_states=ctx).sample
            if meter._ran_deep:
                full_per_row[rows] += 1
            u, c = eps.chunk(2)
            return u + GUIDANCE * (c - u)

        if handle is not None:
            sch = pipe.scheduler.__class__.from_config(pipe.scheduler.config)
            sch.set_timesteps(steps)
            handle.set_schedule(sch.timesteps)
        meter.reset()
        t0 = time.perf_counter()
        res = sample(
            model_fn, x_T.clone(), scheduler=pipe.scheduler, num_inference_steps=steps, controller=controller
        )
        return decode(res.latents), time.perf_counter() - t0, res

    # reference: the converged run of benchmarks/_reference.py from t=999 (refconv, #12 #13), not this pipe's
    # leading-spaced scheduler, whose 100-step run starts at t=901 (results/reference_convergence.md)
    from benchmarks._reference import reference_scheduler

    own, (pipe.scheduler, ref_steps) = pipe.scheduler, reference_scheduler(pipe.scheduler)
    ref, _, _ = run(10 if smoke else ref_steps)
    pipe.scheduler = own
    fixed50, _, _ = run(10 if smoke else 50)
    rows = []
    configs = [
        ("fixed 50", 50, None, None),
        ("fixed 30", 30, None, None),
        ("fixed 20 + schedule i=2", 20, dict(mode="schedule", refresh=profile, interval=2), None),
        ("fixed 30 + schedule i=2", 30, dict(mode="schedule", refresh=profile, interval=2), None),
        ("fixed 50 + schedule i=4", 50, dict(mode="schedule", refresh=profile, interval=4), None),
        ("early stop (30) + schedule i=2", 30, dict(mode="schedule", refresh=profile, interval=2), "es"),
    ]
    if fastdiff_scheduler:  # the equal-cost uncached alternatives, and FastForward (met #12's G1 at 25 NFE)
        configs[2:2] = [("fixed 14", 14, None, None), ("fixed 16", 16, None, None)]
        configs += [
            (
                "fast-forward (30) + schedule i=2",
                30,
                dict(mode="schedule", refresh=profile, interval=2),
                "ff",
            ),
            (
                "fast-forward (50) + schedule i=4",
                50,
                dict(mode="schedule", refresh=profile, interval=4),
                "ff",
            ),
        ]
    if forecast:  # goal 3's cached rows again, replay against forecasting (FORECAST_VARIANTS but quadratic)
        cached = [
            ("fixed 30 + schedule i=2", 30, dict(mode="schedule", refresh=profile, interval=2)),
            ("fixed 50 + schedule 16 full", 50, dict(mode="schedule", refresh=plan_refresh(profile, 50, 16))),
            ("fixed 50 + schedule i=4", 50, dict(mode="schedule", refresh=profile, interval=4)),
            ("fixed 20 + schedule i=2", 20, dict(mode="schedule", refresh=profile, interval=2)),
        ]
        configs = [c for c in configs if c[2] is None]
        for name, steps, opts in cached:
            for fc, axis, lam in FORECAST_VARIANTS:
                if fc != "quadratic":
                    o = dict(opts, forecast=fc, forecast_axis=axis, forecast_strength=lam)
                    configs.append((f"{name} {_fc_name(fc, axis, lam)}", steps, o, None))
    if sixteen_full:
        configs = [(f"fixed {n}", n, None, None) for n in (16, 18, 20)]
        for n in (18, 20, 24):
            plan = plan_refresh(profile, n, 16)
            for fc, lam in (("none", 1.0), ("linear", 0.5)):
                o = dict(mode="schedule", refresh=plan, forecast=fc, forecast_strength=lam)
                configs.append((f"fixed {n} + schedule 16 full {_fc_name(fc, 'step', lam)}", n, o, None))
    if cachefit is not None:
        configs = _cachefit_configs(cachefit, profile)
    if smoke:
        configs = [(n, min(s, 10), o, c, *r) for n, s, o, c, *r in configs[2:3] + configs[-1:]]
    default_scheduler = pipe.scheduler
    for name, steps, opts, ctl, *sched in configs:
        # cachefit rows carry their own make_scheduler options; the cache plan stays the profile's
        if sched:
            o = dict(sched[0])
            pipe.scheduler = make_scheduler(o.pop("sampler", "dpmpp_2m"), like=default_scheduler, **o)
        else:
            pipe.scheduler = default_scheduler
        h = step_cache(pipe.unet, **opts) if opts else None
        controller = {
            None: None,
            "es": EarlyStop(rtol=0.05, patience=2, min_steps=5, max_sigma=1.0),
            "ff": FastForward(rtol=0.05, jumps=3),  # step_control.md's chosen setting on train prompts
        }[ctl]
        images, secs, res = run(steps, h, controller)
        p_ref, p_50 = _psnr(images, ref), _psnr(images, fixed50)
        acc = score(images.permute(0, 2, 3, 1).numpy(), attrs) if attrs is not None else {"all": float("nan")}
        full_per_image = float(full_per_row.mean())
        row = {
            "testbed": "fastdiff-tiny + fastdiff.sample",
            "method": name,
            "unet_calls": meter.calls,
            "full_evals": meter.full,
            "cached_evals": meter.calls - meter.full,
            "mean_steps_per_image": round(sum(res.steps_run) / len(prompts), 2),
            "full_evals_per_image_mean": round(full_per_image, 2),
            "full_evals_per_image_max": int(full_per_row.max()),
            "fewer_full_evals_than_50": round(50 / full_per_image, 2),
            "scheduler_options": sched[0] if sched else {},
            "psnr_vs_ref_mean": round(float(p_ref.mean()), 2),
            "psnr_vs_ref_min": round(float(p_ref.min()), 2),
            "psnr_vs_50_mean": round(float(p_50.mean()), 2),
            # psnr_vs_50: extra information only (goal 3 is against the reference)
            "psnr_vs_50_min": round(float(p_50.min()), 2),
            "attr_all": round(acc["all"], 3),
            "e2e_s": round(secs, 2),
            "notes": "; ".join(h.stats.notes) if h else "",
        }
        if cachefit is not None:
            row.update(steps=steps, refresh=opts["refresh"] if opts else None)
            row["per_image_psnr"] = [round(float(v), 2) for v in p_ref]
        rows.append(row)
        print(json.dumps(row), flush=True)
        if h is not None:
            installed.undo_all(pipe.unet)
    meter.remove()
    pipe.scheduler = default_scheduler
    return {
        "rows": rows,
        "split": "heldout"
        if cachefit in (None, "heldout")
        else f"{cachefit} (non-calibration train prompts)",
        "planner": "gap-cost",  # the current planner: plan_refresh with the gap bound
        "setup": (
            f"{len(prompts)} {'held-out' if cachefit in (None, 'heldout') else 'train (non-calibration)'} prompts, fastdiff.sample with "
            + (
                "fastdiff.make_scheduler('dpmpp_2m') (from t=999 at every step count)"
                if fastdiff_scheduler
                else "diffusers DPMSolverMultistepScheduler (the pipe's leading spacing)"
            )
            + f", guidance "
            f"{GUIDANCE}; batched guidance in one U-Net call; rows that stop early leave the batch and the cache "
            "keeps its features for the remaining rows through keep_rows. full_evals counts batched calls in "
            "which the deep part ran (every active row is evaluated in such a call)."
        ),
    }


# ------------------------------------------------------------------------------------------------- sd15
def sd15_part(sizes: list[int], reps: int) -> dict:
    from _common import time_fn
    from DeepCache import DeepCacheSDHelper

    from fastdiff.testing import tiny_pipeline

    pipe = tiny_pipeline("sd15", size="full")
    unet = pipe.unet
    rows = []
    for px in sizes:
        lat = px // 8
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(2, 4, lat, lat, generator=gen)
        ctx = torch.randn(2, 77, 768, generator=gen)
        ts = [900.0 - k for k in range(reps + 2)]

        @torch.no_grad()
        def full(x=x, t=ts[0], ctx=ctx):
            unet(x, t, encoder_hidden_states=ctx)

        t_full = time_fn(full, warmup=1, reps=reps)
        # fastdiff: one refresh, then `reps` cached calls (the interval never comes round again)
        h = step_cache(unet, mode="uniform", interval=10**6, branch=0)
        h.set_schedule(ts)
        with torch.no_grad():
            unet(x, ts[0], encoder_hidden_states=ctx)
            t0 = time.perf_counter()
            for k in range(1, reps + 1):
                unet(x, ts[k], encoder_hidden_states=ctx)
            t_cached = (time.perf_counter() - t0) / reps
        assert h.stats.cached_calls == reps, h.stats.as_dict()
        installed.undo_all(unet)

        # DeepCache: its helper keyed on pipe.scheduler.timesteps
        dc_cached, dc_err = None, ""
        try:
            pipe.scheduler.timesteps = torch.tensor(ts[: reps + 1])
            helper = DeepCacheSDHelper(pipe=pipe)
            helper.set_params(cache_interval=10**6, cache_branch_id=0)
            helper.enable()
            with torch.no_grad():
                unet(x, torch.tensor(ts[0]), encoder_hidden_states=ctx)
                t0 = time.perf_counter()
                for k in range(1, reps + 1):
                    unet(x, torch.tensor(ts[k]), encoder_hidden_states=ctx)
                dc_cached = (time.perf_counter() - t0) / reps
            helper.disable()
        except Exception as e:
            dc_err = repr(e)
            traceback.print_exc()
        row = {
            "testbed": "SD1.5 U-Net, random weights",
            "px": px,
            "batch": 2,
            "full_forward_s": round(t_full, 3),
            "fastdiff_cached_forward_s": round(t_cached, 3),
            "deepcache_cached_forward_s": None if dc_cached is None else round(dc_cached, 3),
            "cached_over_full": round(t_cached / t_full, 3),
            "deepcache_error": dc_err,
            "load": os.getloadavg()[0],
        }
        for steps in (50, 20, 10):
            for i in (2, 3, 5):
                n_full = math.ceil(steps / i) + (1 if (steps - 1) % i else 0)
                row[f"derived_unet_s_{steps}_i{i}"] = round(n_full * t_full + (steps - n_full) * t_cached, 1)
            row[f"derived_unet_s_{steps}_uncached"] = round(steps * t_full, 1)
        rows.append(row)
        print(json.dumps(row), flush=True)
    return {
        "rows": rows,
        "setup": (
            "tiny_pipeline('sd15', size='full'): the published SD1.5 U-Net configuration with random weights, "
            "fp32, eager, batch 2 (one guidance pair), 77-token context. Full and cached forward costs measured "
            "in one process; the per-image U-Net seconds at 50/20/10 steps are DERIVED from them: n_full * full "
            "+ n_cached * cached, with fastdiff's uniform rule (first and last step full)."
        ),
    }


# ---------------------------------------------------------------------------------------------- sd15 e2e
def _equal_cost_refresh(steps: int, n_full: int) -> tuple[list[int], str]:
    """The refresh steps of the tiny part's equal-cost schedule row (its profile), else a fresh profile."""
    path = _part_path(f"tiny{steps}")
    if path.exists():
        for r in json.loads(path.read_text())["rows"]:
            if r.get("method", "").startswith(f"fastdiff schedule {n_full} full") and r.get("refresh_steps"):
                return r["refresh_steps"], f"{path.name}, row {r['method']!r}"
    profile, _ = _measure_profile(_tiny_pipe(), smoke=False)
    return plan_refresh(profile, steps, n_full), "fresh fastdiff-tiny sensitivity profile"


def sd15_e2e_part(px: int, steps: int, interval: int, smoke: bool = False) -> dict:
    """Measured (not derived) U-Net denoising time per image on the full-size SD1.5 U-Net, one process."""
    from DeepCache import DeepCacheSDHelper
    from diffusers import DPMSolverMultistepScheduler

    from fastdiff.testing import tiny_pipeline

    pipe = tiny_pipeline("sd15", size="tiny" if smoke else "full")
    pipe.scheduler = DPMSolverMultistepScheduler.from_config(pipe.scheduler.config)
    unet = pipe.unet
    meter = UNetMeter(unet)
    lat = px // 8
    gen = torch.Generator().manual_seed(0)
    x_T = torch.randn(1, unet.config.in_channels, lat, lat, generator=gen)
    ctx = torch.randn(2, 77, unet.config.cross_attention_dim, generator=gen)  # [uncond; cond], one image
    n_full = len(range(0, steps, interval))
    refresh, source = (
        (plan_refresh(StepProfile((0.0, 1.0), (1.0, 1.0)), steps, n_full), "a flat profile (smoke)")
        if smoke
        else _equal_cost_refresh(steps, n_full)
    )

    @torch.no_grad()
    def denoise():
        sch = pipe.scheduler
        sch.set_timesteps(steps)
        x = x_T * sch.init_noise_sigma
        for t in sch.timesteps:
            eps = unet(sch.scale_model_input(torch.cat([x, x]), t), t, encoder_hidden_states=ctx).sample
            u, c = eps.chunk(2)
            x = sch.step(u + GUIDANCE * (c - u), t, x).prev_sample
        return x

    with torch.no_grad():  # warm-up: one full forward (allocator, oneDNN primitive cache)
        unet(torch.cat([x_T, x_T]), 999, encoder_hidden_states=ctx)
    rows, base = [], None

    def run(name, setup=None, teardown=None):
        nonlocal base
        if setup is not None:
            setup()
        meter.reset()
        t0 = time.perf_counter()
        try:
            out = denoise()
        finally:
            secs = time.perf_counter() - t0
            if teardown is not None:
                teardown()
        base = out if base is None else base
        rel = float((out - base).norm() / base.norm())
        row = {
            "testbed": f"SD1.5 U-Net, random weights, {px} px",
            "steps": steps,
            "method": name,
            "unet_calls": meter.calls,
            "full_evals": meter.full,
            "cached_evals": meter.calls - meter.full,
            "unet_s_per_image": round(meter.seconds, 2),
            "denoise_s_per_image": round(secs, 2),
            "latent_rel_diff_vs_uncached": round(rel, 4),
            "load": os.getloadavg()[0],
        }
        rows.append(row)
        print(json.dumps(row), flush=True)

    run("uncached")
    handle = {}
    run(
        f"fastdiff schedule {n_full} full",
        setup=lambda: handle.update(h=step_cache(pipe, mode="schedule", refresh=refresh)),
        teardown=lambda: installed.undo_all(pipe),
    )
    helper = DeepCacheSDHelper(pipe=pipe)
    helper.set_params(cache_interval=interval, cache_branch_id=0)
    run(f"DeepCache i={interval} b=0", setup=helper.enable, teardown=helper.disable)
    meter.remove()
    unc = rows[0]["unet_s_per_image"]
    for r in rows:
        r["speedup_vs_uncached"] = round(unc / r["unet_s_per_image"], 2)
    return {
        "rows": rows,
        "refresh_steps": refresh,
        "setup": (
            f"tiny_pipeline('sd15', size='full') U-Net (published SD1.5 configuration, random weights), fp32, "
            f"eager, {px} px, one image with its guidance pair (batch 2), {steps} DPM-Solver++(2M) steps, "
            f"guidance {GUIDANCE}; the three runs back to back in one process after one warm-up forward. "
            f"MEASURED wall time of the whole denoising loop (unet_s = time inside U-Net calls). fastdiff's "
            f"refresh steps {refresh} come from {source}; DeepCache interval {interval} spends the same "
            f"{n_full} full evaluations. Random weights: the latent difference only shows the paths differ."
        ),
    }


# ---------------------------------------------------------------------------------------------- compile
def compile_part() -> dict:
    from fastdiff.testing import tiny_pipeline, unet_probe_inputs

    unet = tiny_pipeline("sd15").unet
    inp = unet_probe_inputs(unet)
    h = step_cache(unet, mode="uniform", interval=3)
    ts = [900.0, 800.0, 700.0, 600.0]
    h.set_schedule(ts)
    out = {}

    def explain(label, t):
        torch._dynamo.reset()
        inp["timestep"] = torch.tensor(t)
        with torch.no_grad():
            ex = torch._dynamo.explain(unet)(**inp)
        out[label] = {
            "graphs": ex.graph_count,
            "graph_breaks": ex.graph_break_count,
            "reasons": sorted({str(b.reason)[:160] for b in ex.break_reasons}),
        }

    explain("whole forward, full step (hooks inside)", ts[0])
    explain("whole forward, cached step (hooks inside)", ts[1])
    h.reset()
    h.set_schedule(ts)
    h.begin_step(ts[0])
    explain("whole forward, full step, loop calls begin_step(t)", ts[0])
    h.begin_step(ts[1])
    explain("whole forward, cached step, loop calls begin_step(t)", ts[1])
    assert [r["full"] for r in h.stats.trace][-2:] == [True, False], h.stats.trace

    # A cached step that forecasts (two full steps before it): the weighted sum is in the graph.
    h.set("schedule", refresh=[0, 1, 3], forecast="linear")
    h.set_schedule(ts)
    for t in ts[:2]:
        h.begin_step(t)
        inp["timestep"] = torch.tensor(t)
        with torch.no_grad():
            unet(**inp)
    h.begin_step(ts[2])
    explain("whole forward, cached step with forecast='linear', loop calls begin_step(t)", ts[2])
    assert h.stats.trace[-1]["full"] is False and h._fc_weights is not None, h.stats.trace
    h.set("uniform", interval=3)  # back to replay, with a full step's features for the paths below
    h.set_schedule(ts)
    h.begin_step(ts[0])
    inp["timestep"] = torch.tensor(ts[0])
    with torch.no_grad():
        unet(**inp)

    # The paths themselves, with the step decision taken outside the traced region.
    pre, post = h._hook
    pre.remove()
    post.remove()
    h._hook = None
    for label, mode in (("full path, decision outside", "full"), ("cached path, decision outside", "cached")):
        h._call = mode
        h._slot = 0
        torch._dynamo.reset()
        inp["timestep"] = torch.tensor(ts[1])
        with torch.no_grad():
            ex = torch._dynamo.explain(unet)(**inp)
        out[label] = {
            "graphs": ex.graph_count,
            "graph_breaks": ex.graph_break_count,
            "reasons": sorted({str(b.reason)[:160] for b in ex.break_reasons}),
        }
    h.remove()
    return {
        "rows": [
            {"testbed": "torch._dynamo.explain, tiny SD1.5 U-Net", "case": k, **v} for k, v in out.items()
        ]
    }


# ------------------------------------------------------------------------------------------------ merge
def _part_path(name: str):
    return RESULTS_DIR / f"step_cache-{name}.json"


def merge() -> None:
    parts = {}
    for p in sorted(RESULTS_DIR.glob("step_cache-*.json")):
        parts[p.stem.removeprefix("step_cache-")] = json.loads(p.read_text())
    meta = env_info()
    md = [f"# step_cache\n\n{hardware_line(meta)}\n"]
    md.append(
        "Every part ran in its own process under the shared lock on a 2-core machine shared with other work; "
        "times are wall clock with the load average recorded per part (and per row in the JSON). Ratios are "
        "from one process. Per-image PSNR: mean and worst image.\n"
    )
    for name, part in parts.items():
        if name == "goals":
            continue
        md.append(f"## {name}\n")
        md.append(
            f"Run {part.get('date', '?')}, load before/after: {part.get('uptime_before')} / {part.get('uptime_after')}\n"
        )
        if part.get("setup"):
            md.append(part["setup"] + "\n")
        if (
            name != "plan"
            and part.get("planner") != "gap-cost"
            and any("schedule" in str(r) for r in part["rows"])
        ):
            md.append(
                "Schedule rows of this part were planned by the previous planner (single-step latent "
                "sensitivities, cost linear in the distance, no gap bound), before #13's gap bound.\n"
            )
        skip = (
            "reasons",
            "refresh_steps",
            "per_image_psnr_vs_uncached",
            "per_image_psnr",
            "deepcache_per_image_psnr",
            "gain_vs_deepcache",
        )
        rows = []
        for r in part["rows"]:
            row = {k: v for k, v in r.items() if k not in skip}
            g = r.get("gain_vs_deepcache")
            if g:
                row["gain vs DeepCache: mean / worst / paired min / median (dB), >= 2 dB"] = (
                    f"{g['mean_gain_db']} / {g['worst_image_gain_db']} / {g['paired_min_db']} / "
                    f"{g['paired_median_db']}, {g['images_gaining_2db']}"
                )
            rows.append(row)
        md.append(markdown_table(rows) + "\n")
        for r in part["rows"]:
            if r.get("reasons"):
                md.append(f"* {r['case']}: " + " | ".join(r["reasons"]) + "\n")
    goals = parts.get("goals", {}).get("text")
    if goals:
        md.append("## Goals\n\n" + goals + "\n")
    (RESULTS_DIR / "step_cache.md").write_text("\n".join(md))
    (RESULTS_DIR / "step_cache.json").write_text(
        json.dumps({"meta": meta, "parts": parts}, indent=2, default=str) + "\n"
    )
    print("wrote", RESULTS_DIR / "step_cache.md")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=["tiny", "plan", "forecast", "dynamic", "sd15", "sd15e2e", "compile"])
    ap.add_argument("--split", choices=["heldout", "train"], default="heldout", help="forecast part: prompts")
    ap.add_argument("--interval", type=int, default=5, help="sd15e2e: DeepCache interval to match")
    ap.add_argument("--steps", default="50", help="tiny part: comma-separated step counts")
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--sizes", default="256,512")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--small", action="store_true", help="smoke run: 2 prompts, 10 steps")
    ap.add_argument("--merge", action="store_true")
    ap.add_argument(
        "--fastdiff-scheduler",
        action="store_true",
        help="dynamic part: fastdiff's make_scheduler for every run",
    )
    ap.add_argument("--goal1", action="store_true", help="tiny part: goal 1's equal-cost rows only")
    ap.add_argument("--forecast", action="store_true", help="dynamic part: cached rows with forecasting")
    ap.add_argument(
        "--sixteen-full", action="store_true", help="dynamic part: goal 3 at exactly 16 full evaluations"
    )
    ap.add_argument(
        "--cachefit",
        choices=["train", "confirm", "heldout"],
        help="dynamic part: goal 3 with the schedule chosen on train prompts, then run on held-out ones",
    )
    ap.add_argument(
        "--threads", type=int, default=2, help="torch threads (1 on a machine oversubscribed by others)"
    )
    args = ap.parse_args()
    torch.set_num_threads(max(1, min(args.threads, os.cpu_count() or 1)))
    if args.merge:
        merge()
        return
    before = _uptime()
    t0 = time.time()
    if args.part == "tiny":
        steps = [10] if args.small else [int(s) for s in args.steps.split(",")]
        res, name = (
            tiny_part(steps, 2 if args.small else args.prompts, args.small, goal1=args.goal1),
            ("goal1-tiny" if args.goal1 else "tiny") + "_".join(map(str, steps)),
        )
    elif args.part == "forecast":
        res = forecast_part(2 if args.small else args.prompts, args.small, args.split)
        name = "forecast" if args.split == "heldout" else "forecast-train"
    elif args.part == "plan":
        res, name = plan_part(2 if args.small else args.prompts, args.small), "plan"
    elif args.part == "dynamic":
        res = dynamic_part(
            2 if args.small else args.prompts,
            args.small,
            args.fastdiff_scheduler,
            args.forecast,
            args.sixteen_full,
            args.cachefit,
        )
        name = ("dynamic-fastdiff" if args.fastdiff_scheduler else "dynamic") + (
            "-forecast" if args.forecast else "-16full" if args.sixteen_full else ""
        )
        if args.cachefit:
            name = f"dynamic-cachefit-{args.cachefit}"
    elif args.part == "sd15e2e":
        px = int(args.sizes.split(",")[0])
        steps = 10 if args.small else int(args.steps)
        res, name = sd15_e2e_part(64 if args.small else px, steps, args.interval, args.small), "sd15e2e"
    elif args.part == "sd15":
        res, name = sd15_part([int(s) for s in args.sizes.split(",")], args.reps), "sd15"
    else:
        res, name = compile_part(), "compile"
    res.update(
        torch_threads=torch.get_num_threads(),
        uptime_before=before,
        uptime_after=_uptime(),
        seconds=round(time.time() - t0, 1),
        date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    )
    if args.small:
        name = "smoke-" + name
        print(json.dumps(res, indent=1, default=str))
        return
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    _part_path(name).write_text(json.dumps(res, indent=2, default=str) + "\n")
    print("wrote", _part_path(name))


if __name__ == "__main__":
    main()
