#!/usr/bin/env python
"""Is the 100-step DPM-Solver++(2M) Karras reference a converged solution of the probability-flow ODE? (#12, #13)

Every fastdiff-tiny quality goal is judged by per-image PSNR against "100 steps of DPM-Solver++(2M) Karras from
the same noise". This script solves the same initial-value problems (same prompts, noise, guidance 5, shipped
``base`` weights) with several high-accuracy solvers and step counts and compares the decoded images per image:

* setups (the held-out images each benchmark scores; prompts and noise built by the benchmarks' own code):
  ``control``: ``step_control.py --part tiny``, 24 prompts (every 3rd held-out combination), noise seed 1000 + i;
  ``cache``: ``step_cache.py`` part ``dynamic``, 12 prompts (every 6th), noise seed 100 + i. The cache setup
  also runs what that benchmark really runs: diffusers' ``DPMSolverMultistepScheduler`` built from the tiny
  pipeline's config (``timestep_spacing="leading"``), whose first timestep depends on the step count
  (100 steps start at t=901, 50 at t=951, 30 at t=961: ``1000 // (N + 1) * N + 1``), i.e. a different
  initial-value problem per step count;
  ``dynamic``: ``dynamic_steps.py``'s ``need`` images (all 72 held-out combinations, seed 1000 + i), only the
  two settings that decide the question (run last, if lock time allows).
* solvers (fastdiff's ``make_scheduler``, fractional timesteps; every schedule starts at t=999, sigma 14.6,
  and ends at sigma_min = 0.029 before the final step to sigma = 0): DPM-Solver++(2M) Karras 100 / 200 and
  DPM-Solver++(3M) Karras 200 (third order) on the control setup, 2M Karras 100 / 200 on the cache setup;
  with ``--extra`` also 2M Karras 400 and 2M with the exponential schedule (uniform in log-sigma, i.e.
  uniform log-SNR) at 400 (control), 3M 200 (cache). Each run gives two images from one trajectory: the
  final step ``"denoised"`` (x0 read-out at sigma_min, the default and what the benchmarks use) and
  ``"variance"`` (``(x + D) / 2``, an Euler step in sigma^2, see ``fastdiff/samplers/core.py``); the
  denoised one is the x0 of the last tick (checked against a separate run at start-up).
* cache setup only: diffusers' scheduler as step_cache.py builds it (leading) at 30 / 50 / 100 steps, and
  with ``timestep_spacing="trailing"`` at 30 / 50 (every step count starts at t=999).
* sensitivity: the noise perturbed by 1e-3 of its norm (a fresh Gaussian direction per image, seed 77 + i),
  solved with the 100-step setting: if images change by far more than the solver gap, the ODE itself is
  ill-conditioned there and no sampler can be expected to match any reference on that image.

Convergence criterion: a setting is converged when it agrees with a *different* solver (order or schedule) of
at least its accuracy at >= 40 dB PSNR on every image: an error 10 dB under the 30 dB goal bar moves a 30 dB
measurement by < 0.5 dB.

    flock /tmp/fastdiff-heavy.lock python benchmarks/reference_convergence.py --setup control
    flock /tmp/fastdiff-heavy.lock python benchmarks/reference_convergence.py --setup cache
    python benchmarks/reference_convergence.py --report      # rewrite results from the cached latents

Final latents are cached under ``--cache`` (default /tmp/fastdiff-refconv), one file per (setup, run), so a
rerun computes only what is missing; the results file records each run's time and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import RESULTS_DIR, env_info, hardware_line, markdown_table  # noqa: E402

NAME = "reference_convergence"
BAR_DB = 30.0  # the goals' quality bar
CONVERGED_DB = 40.0  # agreement that makes a reference's own error negligible against BAR_DB
PERTURB = 1e-3  # relative size of the noise perturbation
# (sampler, schedule, steps): each yields "<sampler> <schedule> <steps>" and the same + " +variance"
SOLVER_RUNS = {  # in priority order; EXTRA_RUNS only with --extra (lock time on a shared 2-core machine)
    "control": [("dpmpp_2m", "karras", 100), ("dpmpp_2m", "karras", 200), ("dpmpp_3m", "karras", 200)],
    "cache": [("dpmpp_2m", "karras", 100), ("dpmpp_2m", "karras", 200)],
    "dynamic": [("dpmpp_2m", "karras", 100), ("dpmpp_2m", "karras", 200)],
}
EXTRA_RUNS = {
    "control": [("dpmpp_2m", "karras", 400), ("dpmpp_2m", "exponential", 400)],
    "cache": [("dpmpp_3m", "karras", 200)],
}
# what step_cache.py runs (leading spacing: the start depends on N) and the same with trailing spacing (t=999)
DIFFUSERS_RUNS = {
    "cache": [("leading", 30), ("leading", 50), ("leading", 100), ("trailing", 30), ("trailing", 50)]
}
# the decision, written from the data of the run recorded below it (see the evidence under each setup)
DECISION = [
    "**The 100-step DPM-Solver++(2M) Karras reference is not converged. The converged reference is 200 steps of "
    'DPM-Solver++(2M) Karras with the final step "variance", from t=999: `benchmarks/_reference.py`, now used by '
    "step_control.py, dynamic_steps.py and step_cache.py's dynamic part.**",
    "",
    "- `control` (step_control's 24 held-out images): 2M Karras 100 against 2M Karras 200 +variance: 54.4 dB "
    "mean, **33.5 dB worst** (image 4, 'a green circle on a blue background'; every other image >= 44.9 dB). "
    "2M Karras 200 and the third-order 3M Karras 200 agree at >= 54.6 dB on every image (65.9 dB with the "
    "variance final step on both): converged by the criterion; 200 steps is the cheapest setting run that is. "
    'Both final steps of the 200-step run pass at the same cost; the reference takes "variance", the one that '
    "agrees better with the third-order solver (65.9 dB worst against 54.6 dB).",
    "- Not ill-conditioned: the noise perturbed by 1e-3 of its norm moves the 100-step images by 75.5 dB mean, "
    "48.0 dB worst (control) and 64.4 dB worst (cache), far less than the 100-step run's own error on image 4. "
    "The gap is discretisation error of the 100-step run; no image of either set is one where every method must "
    "fail.",
    "- `cache` (step_cache's 12 images): the 100-step count is not the problem there (2M Karras 100 is 46.0 dB "
    "worst from 200 steps); the scheduler is. step_cache.py runs diffusers' DPMSolverMultistepScheduler from the "
    "tiny pipeline's config, `timestep_spacing='leading'`, so its 100-step reference starts at t=901, its 50-step "
    "run at t=951, its 30-step run at t=961: three different initial-value problems. Against the ODE solution "
    "from t=999 (fastdiff 2M Karras 100) diffusers' leading 100 is 26.9 dB mean / **11.9 dB worst** (8 of 12 "
    "images below 30 dB), leading 50 14.7 dB worst, leading 30 16.5 dB; the same scheduler with "
    "`timestep_spacing='trailing'` (every count starts at t=999) gives 37.3 dB worst at 50 steps and 35.7 dB at "
    "30. The 16.6 dB worst of step_cache's uncached 50-step run against its 100-step reference (#13 goal 3) is "
    "reproduced here (leading 50 vs leading 100: 16.6 dB worst) and is this start-time mismatch, not a caching "
    "or step-count effect: no method run on the leading schedule can reach 30 dB on every image against any "
    "single converged reference. Switching step_cache's methods to trailing spacing is the fix (not done here: "
    "step_cache.py is owned by the `gap` helper; only its reference call was changed).",
    "- Reruns against the converged reference (2026-12-03 16:50-16:57): `results/step_control.md` tiny part: "
    "fixed 30 steps 37.5 dB worst (32.8 against 100 steps), fixed 20 24.5 dB (26.5), FastForward 32.7 dB at "
    "25.1 NFE, AdaptiveScheduler 20.3 dB at 20.6 NFE: #12 G2 (<= 18 mean NFE at >= 30 dB worst) stays **not "
    "met**; fixed schedules' worst image is not monotone in the step count (25: 24.1, 28: 38.6, 29: 26.7, 30: "
    "37.5 dB), a discretisation sensitivity, not noise sensitivity. `results/step_cache-dynamic.json`: the "
    "uncached leading 50-step run is 14.7 dB worst against it; #13 goal 3 stays **not met**.",
    "- `dynamic` (dynamic_steps' 72 images): not run (lock time). Its non-monotone worst image (20 steps 23.9 dB, "
    "25 steps 20.6 dB against 100 steps) fits a 100-step reference that is itself off on some images, as on "
    "image 4 here; dynamic_steps.py now builds the converged reference but its results file was not rerun.",
]
PERTURBED_RUNS = {"control": [("dpmpp_2m", "karras", 100)], "cache": [("dpmpp_2m", "karras", 100)]}


def run_name(sampler: str, schedule: str, steps: int) -> str:
    return f"{sampler} {schedule} {steps}"


# ------------------------------------------------------------------------------------------------ setups
def setup_images(setup: str, smoke: bool = False):
    """(Tiny model wrapper, attributes, description) for a setup, built with the benchmarks' own code."""
    from benchmarks.step_control import Tiny
    from fastdiff.tiny.data import list_prompts

    if setup == "control":  # step_control.part_tiny: attrs = heldout[::3], Tiny(attrs, seed0=1000)
        attrs, seed0 = [a for _, a in list_prompts("heldout")][::3], 1000
        desc = "step_control.py --part tiny: 24 held-out prompts (every 3rd of 72), noise seed 1000 + i"
    elif setup == "cache":  # step_cache._heldout(12) and its x_T seeds 100 + i
        from benchmarks.step_cache import _heldout

        prompts, attrs = _heldout(12)
        if [a.prompt for a in attrs] != prompts:
            raise RuntimeError("step_cache's prompts no longer equal their attributes' prompts")
        seed0 = 100
        desc = "step_cache.py part dynamic: 12 held-out prompts (every 6th of 72), noise seed 100 + i"
    elif setup == "dynamic":  # dynamic_steps' `need` sweep: every held-out combination, seed 1000 + index
        attrs, seed0 = [a for _, a in list_prompts("heldout")], 1000
        desc = "dynamic_steps.py --phase need: all 72 held-out prompts, noise seed 1000 + i"
    else:
        raise ValueError(f"unknown setup {setup!r}; valid: control, cache, dynamic")
    if smoke:
        attrs = attrs[:3]
    return Tiny(attrs, seed0=seed0), attrs, desc


def solve(tiny, sampler: str, schedule: str, steps: int, latents=None) -> dict[str, torch.Tensor]:
    """One fastdiff run with ``final_step="variance"``; the "denoised" final is the last tick's x0 (the
    variance step reuses that same model evaluation, so both images come from one trajectory)."""
    from fastdiff.dynamic import sample
    from fastdiff.samplers import make_scheduler

    last = {}
    sch = make_scheduler(sampler, like=tiny.pipe.scheduler, schedule=schedule, final_step="variance")
    with torch.no_grad():
        res = sample(
            tiny.model,
            tiny.latents if latents is None else latents,
            scheduler=sch,
            num_inference_steps=steps,
            callback=lambda rec, x0: last.__setitem__("x0", x0.clone()),
        )
    name = run_name(sampler, schedule, steps)
    return {name: last["x0"], f"{name} +variance": res.latents}


def solve_diffusers(tiny, spacing: str, steps: int) -> torch.Tensor:
    """What step_cache.py's dynamic part runs: diffusers' DPM-Solver++(2M) from the pipeline's config
    (``timestep_spacing="leading"``); ``spacing="trailing"`` starts every step count at t=999."""
    from diffusers import DPMSolverMultistepScheduler

    from fastdiff.dynamic import sample

    sch = DPMSolverMultistepScheduler.from_config(tiny.pipe.scheduler.config, timestep_spacing=spacing)
    with torch.no_grad():
        return sample(tiny.model, tiny.latents, scheduler=sch, num_inference_steps=steps).latents


def perturbed_noise(latents: torch.Tensor) -> torch.Tensor:
    """The noise plus PERTURB of its norm in a fresh Gaussian direction per image (seed 77 + i)."""
    z = torch.cat(
        [
            torch.randn(x.shape, generator=torch.Generator().manual_seed(77 + i))[None]
            for i, x in enumerate(latents)
        ]
    )
    scale = PERTURB * latents.flatten(1).norm(dim=1) / z.flatten(1).norm(dim=1)
    return latents + scale.view(-1, 1, 1, 1) * z


def self_check(tiny) -> float:
    """The denoised image read from the variance run equals a separate ``final_step="denoised"`` run."""
    from fastdiff.dynamic import sample
    from fastdiff.samplers import make_scheduler

    both = solve(tiny, "dpmpp_2m", "karras", 6)
    with torch.no_grad():
        plain = sample(tiny.model, tiny.latents, scheduler=make_scheduler("dpmpp_2m", like=tiny.pipe.scheduler, schedule="karras"), num_inference_steps=6).latents  # fmt: skip
    err = float((both["dpmpp_2m karras 6"] - plain).abs().max())
    if err > 1e-5:
        raise RuntimeError(f"denoised final read from the variance run differs from a plain run by {err}")
    return err


def compute(setup: str, cache: Path, smoke: bool, log, extra: bool = False) -> dict:
    """Run every missing (setup, run) and store its final latents under ``cache``."""
    folder = cache / (setup + ("-smoke" if smoke else ""))
    folder.mkdir(parents=True, exist_ok=True)
    tiny, attrs, desc = setup_images(setup, smoke)
    timing = json.loads((folder / "timing.json").read_text()) if (folder / "timing.json").exists() else {}
    log(f"{setup}: {desc}; self-check max |diff| {self_check(tiny):.2e}")

    def have(name):
        return (folder / f"{name}.pt").exists()

    def store(outs: dict, t0: float):
        for name, lat in outs.items():
            torch.save(lat, folder / f"{name}.pt")
            timing[name] = {"s": round(time.perf_counter() - t0, 1), "load_after": round(os.getloadavg()[0], 2),
                            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}  # fmt: skip
        (folder / "timing.json").write_text(json.dumps(timing, indent=1))
        log(f"{setup}: {list(outs)} {timing[name]}")

    div = 4 if smoke else 1  # smoke: 3 prompts, a quarter of the steps
    jobs = [("solve", r, None) for r in SOLVER_RUNS[setup]]  # priority order, cheapest question first
    jobs += [("diffusers", n, None) for n in DIFFUSERS_RUNS.get(setup, [])]
    jobs += [("solve", r, "perturbed ") for r in PERTURBED_RUNS.get(setup, [])]
    jobs += [("solve", r, None) for r in (EXTRA_RUNS.get(setup, []) if extra else [])]
    for kind, what, prefix in jobs:
        t0 = time.perf_counter()
        if kind == "diffusers":
            name = f"diffusers {what[0]} {what[1] // div}"
            if not have(name):
                store({name: solve_diffusers(tiny, what[0], what[1] // div)}, t0)
            continue
        sampler, schedule, steps = what[0], what[1], what[2] // div
        if prefix and not have(prefix + run_name(sampler, schedule, steps)):
            outs = solve(tiny, sampler, schedule, steps, latents=perturbed_noise(tiny.latents))
            store({prefix + k: v for k, v in outs.items()}, t0)
        elif not prefix and not have(run_name(sampler, schedule, steps)):
            store(solve(tiny, sampler, schedule, steps), t0)
    return {"description": desc, "prompts": [a.prompt for a in attrs], "timing": timing}


# ------------------------------------------------------------------------------------------------ analysis
def analyse(setup: str, cache: Path, smoke: bool) -> dict | None:
    """Per-image PSNR between every pair of runs (decoded images), attribute reads, and summaries."""
    from fastdiff import metrics

    folder = cache / (setup + ("-smoke" if smoke else ""))
    if not folder.exists():
        return None
    tiny, attrs, desc = setup_images(setup, smoke)
    names = sorted(p.stem for p in folder.glob("*.pt"))
    images = {n: tiny.decode(torch.load(folder / f"{n}.pt")) for n in names}
    psnr = {}
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            p = metrics.psnr(images[a], images[b], data_range=1.0, reduction="none")
            psnr[f"{a} | {b}"] = [round(float(v), 2) for v in p]
    attr_ok = {}
    for n in names:  # per image: all three attributes right
        readings = metrics.read_attributes(images[n])
        attr_ok[n] = [
            bool(r.shape_colour == a.shape_colour and r.bg_colour == a.bg_colour and r.shape == a.shape)
            for r, a in zip(readings, attrs)
        ]
    timing = json.loads((folder / "timing.json").read_text()) if (folder / "timing.json").exists() else {}
    return {"description": desc, "prompts": [a.prompt for a in attrs], "runs": names, "psnr": psnr,
            "attr_ok": attr_ok, "timing": timing}  # fmt: skip


def pair(data: dict, a: str, b: str) -> list[float] | None:
    return data["psnr"].get(f"{a} | {b}") or data["psnr"].get(f"{b} | {a}")


def summary_row(data: dict, a: str, b: str) -> dict | None:
    p = pair(data, a, b)
    if p is None:
        return None
    worst = min(range(len(p)), key=p.__getitem__)
    return {"run": a, "against": b, "psnr_mean": round(sum(p) / len(p), 2), "psnr_worst": p[worst],
            "images_below_40": sum(v < CONVERGED_DB for v in p), "images_below_30": sum(v < BAR_DB for v in p),
            "worst_prompt": f"{worst}: {data['prompts'][worst]}"}  # fmt: skip


# ------------------------------------------------------------------------------------------------ decision
def _family(name: str) -> tuple[str, str]:
    parts = name.split()
    return parts[0], parts[1]


def _steps(name: str) -> int:
    return int(name.split()[2])


def solver_runs(data: dict) -> list[str]:
    """fastdiff solver runs of the unperturbed noise (what a reference can be), cheapest first."""
    runs = [n for n in data["runs"] if not n.startswith(("perturbed", "diffusers"))]
    return sorted(runs, key=lambda n: (_steps(n), n.endswith("variance"), n))


def converged(data: dict, name: str) -> tuple[bool, list[dict]]:
    """``name`` agrees at >= CONVERGED_DB on every image with every run at least as fine (as many steps or
    more), and at least one of them is a different solver (sampler or schedule)."""
    others = [o for o in solver_runs(data) if o != name and _steps(o) >= _steps(name)]
    rows = [summary_row(data, name, o) for o in others]
    different = any(_family(o) != _family(name) for o in others)
    ok = bool(rows) and different and all(r["psnr_worst"] >= CONVERGED_DB for r in rows)
    return ok, rows


def decide(data: dict) -> dict:
    """The cheapest converged run of a setup, and the verdict on the 100-step reference."""
    verdict = {}
    for name in solver_runs(data):
        ok, rows = converged(data, name)
        verdict[name] = {"converged": ok, "checks": rows}
    cheapest = next((n for n in solver_runs(data) if verdict[n]["converged"]), None)
    return {"per_run": verdict, "cheapest_converged": cheapest}


def perturbation_rows(data: dict) -> list[dict]:
    rows = []
    for n in data["runs"]:
        if n.startswith("perturbed "):
            base = n[len("perturbed ") :]
            r = summary_row(data, n, base)
            if r:
                rows.append(r)
    return rows


def diffusers_rows(data: dict, ref: str | None) -> list[dict]:
    runs = [n for n in data["runs"] if n.startswith("diffusers")]
    rows = [summary_row(data, n, ref) for n in runs if ref]
    rows += [summary_row(data, a, b) for i, a in enumerate(runs) for b in runs[i + 1 :]]
    return [r for r in rows if r]


def per_image_table(data: dict, columns: list[tuple[str, str, str]], worst: int = 6) -> list[dict]:
    """The ``worst`` images by the first column's PSNR, with every column (label, run a, run b)."""
    first = pair(data, columns[0][1], columns[0][2])
    order = sorted(range(len(first)), key=first.__getitem__)[:worst]
    out = []
    for i in order:
        row = {"image": i, "prompt": data["prompts"][i]}
        for label, a, b in columns:
            p = pair(data, a, b)
            row[label] = p[i] if p else None
        row["attributes right (ref 100 / finest)"] = " / ".join(
            "yes" if data["attr_ok"][n][i] else "no" for n in (columns[0][1], columns[0][2])
        )
        out.append(row)
    return out


def _rows(rows: list[dict]) -> str:
    cols = ["run", "against", "psnr_mean", "psnr_worst", "images_below_40", "images_below_30", "worst_prompt"]
    return markdown_table(rows, cols) if rows else "(not run)\n"


def write_report(data: dict, meta: dict, decision_text: list[str]) -> None:
    """results/reference_convergence.{json,md}: the decision first, then the evidence per setup."""
    out = {
        "meta": meta,
        "bar_db": BAR_DB,
        "converged_db": CONVERGED_DB,
        "perturbation": PERTURB,
        "setups": {},
    }
    md = [f"# {NAME}", "", hardware_line(meta), "",
          "Generated by `benchmarks/reference_convergence.py` (protocol in its docstring). PSNR of decoded images, "
          "per image, between two solutions of the same probability-flow ODE (same prompt, noise, guidance 5, "
          f"shipped fastdiff-tiny weights). Converged = >= {CONVERGED_DB:g} dB on every image against every "
          "finer run, one of them a different solver.", "", "## Decision", "", *decision_text, ""]  # fmt: skip
    for setup, d in data.items():
        if not d:
            continue
        dec = decide(d)
        out["setups"][setup] = {**d, "decision": dec}
        runs = solver_runs(d)
        finest = max(runs, key=lambda n: (_steps(n), n.endswith("variance")))
        md += [f"## Setup `{setup}`: {d['description']}", "",
               "Run times (s) and load average after each: " + "; ".join(f"{k}: {v['s']} s, load {v['load_after']}, {v['date']}"
                                                                   for k, v in d["timing"].items()) + ".", ""]  # fmt: skip
        compact = []  # each run against the finest run and the finest run of another family (all pairs: json)
        for n in runs:
            other = [o for o in runs if _family(o) != _family(n) and _steps(o) >= _steps(n)]
            for o in dict.fromkeys([finest] + other[-1:]):
                if o != n:
                    compact.append(summary_row(d, n, o))
        md += [
            "### Each run against the finest run and the finest of another solver family",
            "",
            _rows(compact),
            "",
        ]
        md += [f"Converged by the criterion: {', '.join(n for n in runs if dec['per_run'][n]['converged']) or 'none'}; "
               f"cheapest: {dec['cheapest_converged'] or 'none'}.", ""]  # fmt: skip
        pert = perturbation_rows(d)
        if pert:
            md += [
                f"### Sensitivity: noise perturbed by {PERTURB:g} of its norm, same solver",
                "",
                _rows(pert),
                "",
            ]
        diff = diffusers_rows(d, "dpmpp_2m karras 100")
        if diff:
            md += ["### What step_cache.py runs: diffusers DPMSolverMultistep, leading spacing (first timestep "
                   "depends on the step count), and the same scheduler with trailing spacing", "", _rows(diff), ""]  # fmt: skip
        cols = [("100 vs finest", "dpmpp_2m karras 100", finest)]
        cols += [
            (f"{o.replace('dpmpp_', '')} vs finest", o, finest)
            for o in runs
            if o not in (finest, "dpmpp_2m karras 100")
        ][:4]
        cols += [
            ("perturbed vs same", n, n[len("perturbed ") :])
            for n in d["runs"]
            if n.startswith("perturbed ") and not n.endswith("variance")
        ]
        cols += [(n + " vs 100", n, "dpmpp_2m karras 100") for n in d["runs"] if n.startswith("diffusers")]
        md += [f"### Worst images of the 100-step reference against `{finest}`", "",
               markdown_table(per_image_table(d, cols)), ""]  # fmt: skip
    (RESULTS_DIR / f"{NAME}.json").write_text(json.dumps(out, indent=1) + "\n")
    (RESULTS_DIR / f"{NAME}.md").write_text("\n".join(md) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--setup", choices=["control", "cache", "dynamic"], nargs="*", default=[])
    ap.add_argument("--cache", type=Path, default=Path("/tmp/fastdiff-refconv"))
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="3 prompts, a quarter of the steps, results under <setup>-smoke, no results file",
    )
    ap.add_argument(
        "--extra", action="store_true", help="also the EXTRA_RUNS (400-step and other-schedule runs)"
    )
    ap.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--report", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    log = lambda m: print(m, flush=True)  # noqa: E731
    for s in args.setup:
        log(f"uptime before {s}: {os.getloadavg()}")
        compute(s, args.cache, args.smoke, log, args.extra)
    if args.smoke:
        for s in args.setup:
            d = analyse(s, args.cache, True)
            for k, v in d["psnr"].items():
                log(f"{k}: {v}")
        return
    data = {s: analyse(s, args.cache, False) for s in ("control", "cache", "dynamic")}
    meta = env_info()
    meta["commit"] = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    write_report(data, meta, DECISION)


if __name__ == "__main__":
    main()
