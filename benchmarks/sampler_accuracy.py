"""Exact sampler accuracy: fastdiff vs diffusers on a Gaussian mixture with a closed-form denoiser.

The test data is a 64-dimensional mixture of 6 isotropic Gaussians (std 0.15, means ~ N(0, I)),
whose optimal denoiser is known exactly (:mod:`fastdiff.samplers.gmm`), wrapped as an epsilon
model on Stable Diffusion's training schedule (scaled_linear betas 0.00085..0.012, 1000 steps).
Every deterministic sampler approximates the probability-flow ODE from the same initial noise;
the reference is that ODE solved in float64 by scipy's DOP853 (rtol = atol = 1e-10).  We report
the median over test samples of the per-sample RMS error, for each NFE, and the convergence
order fitted on NFE >= 10 (slope of -log error against log NFE).

Two scenarios: unconditional, and class-conditional with classifier-free guidance at scale 5
(conditional = mixture restricted to one of 3 classes of 2 components, unconditional = full
mixture), which makes the ODE harder and exposes unstable high-order solvers.

Fitted schedules (:func:`fastdiff.samplers.fit_schedule`) are fitted on a *different mixture*
(seed 0, 48 dims: the "fitting family") with separate calibration noise (64 samples), and every
row is evaluated on the test mixture (seed 1, 64 dims) with 128 test samples, so the fitted rows
are measured on a model and samples the fitting never saw (issue #12, item 5).  The fit's target is the exact
(DOP853) solution for the calibration noise on the fitting mixture.  Stochastic samplers (DDIM eta > 0,
DPM-Solver++ 2M SDE, LCM) do not follow the ODE and are not in this table.

Held-out check: one test mixture is one draw; the goal rows (best diffusers and best fastdiff at 8 and 10
NFE, re-chosen per mixture among the same configurations and the same fitted schedules) are also measured on
four more test mixtures (64-d, seeds 4-7), and the ratio is reported for each, with its mean and worst.

Run:  python benchmarks/sampler_accuracy.py   (about 3-5 minutes on 2 CPU cores)
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import RESULTS_DIR, env_info, hardware_line, markdown_table  # noqa: E402
from fastdiff.samplers import fit_schedule, make_scheduler, run_scheduler  # noqa: E402
from fastdiff.samplers.gmm import (  # noqa: E402
    GaussianMixture,
    GMMDenoiser,
    GMMFamilyDenoiser,
    probability_flow_reference,
    rms_errors,
)

NFES = (4, 6, 8, 10, 15, 20, 30, 50)
TEST_SEED = 1  # the main test mixture (64-d); the fitting family is 48-d, seed 0
# Stable Diffusion v1.5's scheduler_config.json (PNDM), from which users build other schedulers
SD_CONFIG = {
    "_class_name": "PNDMScheduler",
    "beta_start": 0.00085,
    "beta_end": 0.012,
    "beta_schedule": "scaled_linear",
    "num_train_timesteps": 1000,
    "set_alpha_to_one": False,
    "skip_prk_steps": True,
    "steps_offset": 1,
    "clip_sample": False,
    "trained_betas": None,
}


def diffusers_baselines():
    from diffusers import (
        DDIMScheduler,
        DEISMultistepScheduler,
        DPMSolverMultistepScheduler,
        EulerDiscreteScheduler,
        UniPCMultistepScheduler,
    )

    c = SD_CONFIG
    return [
        ("DDIM (SD config: leading)", lambda: DDIMScheduler.from_config(c)),
        ("DDIM trailing", lambda: DDIMScheduler.from_config(c, timestep_spacing="trailing")),
        ("Euler", lambda: EulerDiscreteScheduler.from_config(c)),
        ("Euler Karras", lambda: EulerDiscreteScheduler.from_config(c, use_karras_sigmas=True)),
        ("DPM++2M", lambda: DPMSolverMultistepScheduler.from_config(c)),
        ("DPM++2M Karras", lambda: DPMSolverMultistepScheduler.from_config(c, use_karras_sigmas=True)),
        ("UniPC", lambda: UniPCMultistepScheduler.from_config(c)),
        ("UniPC Karras", lambda: UniPCMultistepScheduler.from_config(c, use_karras_sigmas=True)),
        # bh1 with the default final sigma 0 returns NaN (B(h) = -h = -inf on the last step); end at sigma_min
        (
            "UniPC bh1 Karras (final sigma_min)",
            lambda: UniPCMultistepScheduler.from_config(
                c, use_karras_sigmas=True, solver_type="bh1", final_sigmas_type="sigma_min"
            ),
        ),
        ("DEIS", lambda: DEISMultistepScheduler.from_config(c)),
    ]


def fastdiff_configs():
    """(label, sampler, options) of the fixed-schedule fastdiff runs."""
    return [
        ("ddim trailing", "ddim", dict(schedule="trailing")),
        ("ddim karras", "ddim", dict(schedule="karras")),
        (
            "dpmpp_2m karras rounded-t (= diffusers)",
            "dpmpp_2m",
            dict(schedule="karras", fractional_timesteps=False),
        ),
        ("dpmpp_2m karras", "dpmpp_2m", dict(schedule="karras")),
        ("dpmpp_2m exponential", "dpmpp_2m", dict(schedule="exponential")),
        ("dpmpp_2m karras +variance", "dpmpp_2m", dict(schedule="karras", final_step="variance")),
        ("dpmpp_3m karras", "dpmpp_3m", dict(schedule="karras")),
        (
            "unipc karras rounded-t (= diffusers)",
            "unipc",
            dict(schedule="karras", fractional_timesteps=False),
        ),
        ("unipc karras", "unipc", dict(schedule="karras")),
        ("unipc exponential", "unipc", dict(schedule="exponential")),
        ("unipc-3 karras", "unipc", dict(schedule="karras", solver_order=3)),
        ("unipc karras +variance", "unipc", dict(schedule="karras", final_step="variance")),
        (
            "unipc bh1 karras +variance",
            "unipc",
            dict(schedule="karras", final_step="variance", solver_type="bh1"),
        ),
        # isolates the effect of fractional timesteps once the final-interval floor is gone
        (
            "dpmpp_2m karras rounded-t +variance",
            "dpmpp_2m",
            dict(schedule="karras", final_step="variance", fractional_timesteps=False),
        ),
        (
            "unipc karras rounded-t +variance",
            "unipc",
            dict(schedule="karras", final_step="variance", fractional_timesteps=False),
        ),
    ]


# (label, sampler, options, {NFE: optimiser budget in sampler runs}).  The 300-run fits of the previous
# version stopped far from the optimum (guided 10 NFE: 1.2e-3 -> 0.8e-3 with 1500 runs, fastdiff/samplers/README.md);
# bh1 wins at 8 NFE, bh2 at 10; 4 NFE (the guided-divergence case) keeps a cheap fit.
# the unguided scenario (secondary to the guided goal) keeps the previous version's budget: the 2-core lock budget
UNGUIDED_BUDGET = 300
FITTED = [
    (
        "unipc fitted free end +variance",
        "unipc",
        dict(final_step="variance", free_end=True),
        {4: 300, 8: 1500, 10: 1500},
    ),
    (
        "unipc bh1 fitted free end +variance",
        "unipc",
        dict(final_step="variance", free_end=True, solver_type="bh1"),
        {8: 1500, 10: 1500},
    ),
]

# Guided only: the 8-NFE bh1 fit above, refitted on a family of six 48-d guided mixtures (seeds
# FAMILY_SEEDS, FAMILY_ROWS calibration samples each; none is a test mixture) with the median as the
# objective (fit_schedule(objective="median")), starting from that single-mixture fit.  A fit on one
# mixture generalises unevenly to the test mixtures (issue #12, G3); exploratory runs on the family with
# the geometric mean alone, or from Karras/exponential starts, stopped in worse basins.
FAMILY_SEEDS = (0, 2, 3, 8, 9, 10)
FAMILY_ROWS = 32
FAMILY_FITTED = [
    (
        "unipc bh1 family-fitted (median) free end +variance",
        "unipc",
        dict(final_step="variance", free_end=True, solver_type="bh1"),
        {8: 2200},
        "unipc bh1 fitted free end +variance",
    ),
]


# Other calibration draws of the same procedure (guided 8 NFE only), to show how much the result depends on the
# draw: (label, family mixture seeds, calibration noise seed).  Reported, never used to pick the main row.
FAMILY_REDRAWS = [
    ("calibration noise seed 2", FAMILY_SEEDS, 2),
    ("family seeds 11-16", (11, 12, 13, 14, 15, 16), 1),
]


def family_model(guidance, seeds=FAMILY_SEEDS):
    """The fitting family as one model: FAMILY_ROWS rows per mixture, 48-d, classes round-robin."""
    members = [
        make_models(
            GaussianMixture.random(dims=48, components=6, std=0.15, num_classes=3, seed=seed),
            guidance,
            FAMILY_ROWS,
        )
        for seed in seeds
    ]
    return GMMFamilyDenoiser(members, [FAMILY_ROWS] * len(members))


def family_fit(guidance, start, n, sampler, opts, budget, seeds=FAMILY_SEEDS, noise_seed=1):
    """fit_schedule on the fitting family (median objective) from the single-mixture schedule ``start``."""
    fam = family_model(guidance, seeds)
    x_fam = torch.randn(len(seeds) * FAMILY_ROWS, 48, generator=torch.Generator().manual_seed(noise_seed))
    fit_opts = dict(opts)
    free_end = fit_opts.pop("free_end", False)
    return fit_schedule(
        fam,
        x_fam,
        n,
        sampler,
        reference=probability_flow_reference(fam, x_fam),
        max_evals=budget,
        free_end=free_end,
        starts=(start,),
        objective="median",
        **fit_opts,
    )


def convergence_order(errors: dict[int, float]) -> float | None:
    pts = [(n, e) for n, e in errors.items() if n >= 10 and e is not None and e > 0]
    if len(pts) < 3:
        return None
    x = np.log([p[0] for p in pts])
    y = -np.log([p[1] for p in pts])
    return float(np.polyfit(x, y, 1)[0])


def make_models(mixture, guidance, n):
    labels = torch.arange(n) % 3 if guidance else None
    return GMMDenoiser(mixture, class_labels=labels, guidance_scale=guidance or 1.0)


@functools.cache
def mixture_problem(seed, guidance, n_test):
    """A 64-d test mixture (``seed``) as a model, its test noise and the exact ODE solution from it; cached,
    because the main scenario, the held-out mixtures and the family-fit redraws evaluate on the same ones."""
    mixture = GaussianMixture.random(dims=64, components=6, std=0.15, num_classes=3, seed=seed)
    model = make_models(mixture, guidance, n_test)
    x = torch.randn(n_test, 64, generator=torch.Generator().manual_seed(0))
    return model, x, probability_flow_reference(model, x)


def evaluate(label, model, x_test, ref, nfes, schedules, n_fit=None):
    """Rows of every diffusers and fastdiff configuration, and the fitted schedules in ``schedules``
    (``"label@nfe" -> sigmas``), on one test model; ``nfes`` for the fixed schedules."""

    def err(sched, n):
        out = run_scheduler(model, x_test.clone(), sched, n)
        return float(rms_errors(out, ref).median())

    rows = []
    for name, factory in diffusers_baselines():
        errs = {n: err(factory(), n) for n in nfes}
        rows.append(dict(scenario=label, library="diffusers", sampler=name, errors=errs))
    for name, sampler, opts in fastdiff_configs():
        errs = {n: err(make_scheduler(sampler, **opts), n) for n in nfes}
        rows.append(dict(scenario=label, library="fastdiff", sampler=name, errors=errs))
    for name, sampler, opts, *_ in FITTED + FAMILY_FITTED:
        if not any(k.startswith(f"{name}@") for k in schedules):
            continue  # a guided-only fit in the unguided scenario
        opts = {k: v for k, v in opts.items() if k != "free_end"}
        errs = {
            n: err(make_scheduler(sampler, schedule=schedules[f"{name}@{n}"], **opts), n)
            if f"{name}@{n}" in schedules
            else None
            for n in nfes
        }
        rows.append(dict(scenario=label, library="fastdiff", sampler=name, errors=errs))
    return rows


def run_scenario(label, fit_mixture, guidance, n_test, n_cal, nfes, log, quick=False):
    cal_model = make_models(fit_mixture, guidance, n_cal)
    x_cal = torch.randn(n_cal, fit_mixture.dims, generator=torch.Generator().manual_seed(1))
    t0 = time.perf_counter()
    model, x_test, ref = mixture_problem(TEST_SEED, guidance, n_test)
    cal_ref = probability_flow_reference(cal_model, x_cal)  # the fit's target: exact, on the fitting mixture
    log(f"[{label}] reference ODEs solved in {time.perf_counter() - t0:.1f}s")
    schedules = {}
    for name, sampler, opts, budgets in FITTED:
        fit_opts = dict(opts)
        free_end = fit_opts.pop("free_end", False)
        for n, budget in budgets.items():
            if n not in nfes:
                continue
            schedules[f"{name}@{n}"] = fit_schedule(
                cal_model,
                x_cal,
                n,
                sampler,
                reference=cal_ref,
                max_evals=10 if quick else budget if guidance else min(budget, UNGUIDED_BUDGET),
                free_end=free_end,
                **fit_opts,
            )
        log(f"[{label}] {name} fitted ({time.perf_counter() - t0:.1f}s)")
    if guidance:
        for name, sampler, opts, budgets, start in FAMILY_FITTED:
            for n, budget in budgets.items():
                if n in nfes and f"{start}@{n}" in schedules:
                    schedules[f"{name}@{n}"] = family_fit(
                        guidance, schedules[f"{start}@{n}"], n, sampler, opts, 10 if quick else budget
                    )
            log(f"[{label}] {name} fitted ({time.perf_counter() - t0:.1f}s)")
    rows = evaluate(label, model, x_test, ref, nfes, schedules)
    for r in rows:
        r["order"] = convergence_order(r["errors"])
    log(f"[{label}] evaluated ({time.perf_counter() - t0:.1f}s)")
    return rows, schedules


def held_out_ratios(guidance, schedules, n_test, goal_nfes, seeds=(4, 5, 6, 7)):
    """Best-diffusers / best-fastdiff ratio at ``goal_nfes`` on more test mixtures (64-d, ``seeds``)."""
    out = []
    for seed in seeds:
        rows = evaluate(f"seed {seed}", *mixture_problem(seed, guidance, n_test), goal_nfes, schedules)
        for n in goal_nfes:
            best, ratio = goal_check(rows, n)
            out.append(dict(seed=seed, nfe=n, best=best, ratio=ratio))
    return out


def family_redraws(guidance, schedules, sc_rows, held, n_test, quick, n=8):
    """The family fit of FAMILY_FITTED[0] at ``n`` NFE, redone with each draw of FAMILY_REDRAWS; every draw (the
    main one first) evaluated on the five test mixtures against the best diffusers error on each."""
    name, sampler, opts, budgets, start = FAMILY_FITTED[0]
    if f"{start}@{n}" not in schedules or f"{name}@{n}" not in schedules:
        return []
    best_diff = {TEST_SEED: goal_check(sc_rows, n)[0]["diffusers"][0]}
    best_diff.update({h["seed"]: h["best"]["diffusers"][0] for h in held if h["nfe"] == n})
    run_opts = {k: v for k, v in opts.items() if k != "free_end"}
    tests = {seed: mixture_problem(seed, guidance, n_test) for seed in best_diff}
    draws = [
        (f"main: family seeds {', '.join(map(str, FAMILY_SEEDS))}, noise seed 1", schedules[f"{name}@{n}"])
    ]
    for label, seeds, noise_seed in FAMILY_REDRAWS:
        budget = 10 if quick else budgets[n]
        sig = family_fit(guidance, schedules[f"{start}@{n}"], n, sampler, opts, budget, seeds, noise_seed)
        draws.append((label, sig))
    out = []
    for label, sig in draws:
        errs = {}
        for seed, (model, x, ref) in tests.items():
            sched = make_scheduler(sampler, schedule=sig, **run_opts)
            errs[seed] = float(rms_errors(run_scheduler(model, x.clone(), sched), ref).median())
        ratios = {seed: best_diff[seed] / e for seed, e in errs.items()}
        out.append(dict(draw=label, sigmas=sig, errors=errs, ratios=ratios))
    return out


def goal_check(rows, nfe):
    best = {}
    for lib in ("diffusers", "fastdiff"):
        cand = [
            (r["errors"][nfe], r["sampler"])
            for r in rows
            if r["library"] == lib and r["errors"].get(nfe) and math.isfinite(r["errors"][nfe])
        ]
        best[lib] = min(cand)
    ratio = best["diffusers"][0] / best["fastdiff"][0]
    return best, ratio


def plot(all_rows, path, nfes):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scenarios = list(dict.fromkeys(r["scenario"] for r in all_rows))
    fig, axes = plt.subplots(1, len(scenarios), figsize=(7 * len(scenarios), 5.5), squeeze=False)
    keep = {"DDIM (SD config: leading)", "DPM++2M Karras", "UniPC Karras", "DEIS", "Euler Karras"}
    keep_fd = {"dpmpp_2m karras", "unipc karras", "unipc karras +variance", "ddim karras"}
    keep_fd |= {name for name, *_ in FITTED + FAMILY_FITTED}
    for ax, sc in zip(axes[0], scenarios):
        for r in all_rows:
            if r["scenario"] != sc or r["sampler"] not in (keep | keep_fd):
                continue
            pts = [(n, r["errors"][n]) for n in nfes if r["errors"].get(n)]
            if not pts:
                continue
            style = "--" if r["library"] == "diffusers" else "-"
            ax.loglog(*zip(*pts), style, marker="o", ms=3, label=f"{r['library']}: {r['sampler']}")
        ax.set_title(sc)
        ax.set_xlabel("NFE (model evaluations)")
        ax.set_ylabel("median per-sample RMS error vs exact PF-ODE")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=128, help="test samples per scenario")
    p.add_argument("--calibration", type=int, default=64, help="calibration samples for fitted schedules")
    p.add_argument("--guidance", type=float, default=5.0, help="CFG scale of the guided scenario")
    p.add_argument("--quick", action="store_true", help="smoke run: few samples and NFEs, no result files")
    args = p.parse_args(argv)
    torch.set_num_threads(1)  # the work items are tiny; thread hand-offs would dominate
    nfes = NFES if not args.quick else (4, 8)
    n_test, n_cal = (args.samples, args.calibration) if not args.quick else (16, 8)
    # fitting family and test mixture differ in seed and size: fitted rows are held-out results
    fit_mixture = GaussianMixture.random(dims=48, components=6, std=0.15, num_classes=3, seed=0)
    log = lambda s: print(s, flush=True)
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    common = (n_test, n_cal, nfes, log, args.quick)
    rows, schedules = run_scenario("unguided", fit_mixture, None, *common)
    grows, gschedules = run_scenario(f"guided w={args.guidance:g}", fit_mixture, args.guidance, *common)
    all_rows = rows + grows
    goal_nfes = [n for n in (8, 10) if n in nfes]  # quick: 8 only
    held_out = {}
    for sc_rows, guidance, sched in ((rows, None, schedules), (grows, args.guidance, gschedules)):
        held_out[sc_rows[0]["scenario"]] = held_out_ratios(
            guidance, sched, n_test, goal_nfes, seeds=(4, 5, 6, 7) if not args.quick else (4,)
        )
    log(f"held-out mixtures done ({time.perf_counter() - t0:.1f}s)")
    redraws = family_redraws(
        args.guidance, gschedules, grows, held_out[grows[0]["scenario"]], n_test, args.quick
    )
    log(f"family-fit redraws done ({time.perf_counter() - t0:.1f}s)")
    elapsed = time.perf_counter() - t0

    summary = []
    for sc_rows in (rows, grows):
        sc = sc_rows[0]["scenario"]
        for n in goal_nfes:
            best, ratio = goal_check(sc_rows, n)
            others = [h["ratio"] for h in held_out[sc] if h["nfe"] == n]
            every = [ratio, *others]
            summary.append(
                f"- {sc}, {n} NFE: best diffusers {best['diffusers'][1]} "
                f"{best['diffusers'][0]:.2e}; best fastdiff {best['fastdiff'][1]} {best['fastdiff'][0]:.2e}; "
                f"ratio {ratio:.2f}x (goal >= 3x: {'met' if ratio >= 3 else 'not met'}); on all "
                f"{len(every)} test mixtures (seed 1 and the held-out ones) mean {np.mean(every):.2f}x, worst {min(every):.2f}x "
                f"({'met' if min(every) >= 3 else 'not met'} on every mixture)"
            )
    if redraws:
        worst = [(min(d["ratios"].values()), d["draw"]) for d in redraws[1:]]
        summary.append(
            f"- guided w={args.guidance:g}, 8 NFE, the family fit redone on other calibration draws: worst ratio over the "
            f"{len(redraws[0]['ratios'])} test mixtures "
            + "; ".join(f"{w:.2f}x ({lab})" for w, lab in worst)
            + f" ({'met' if all(w >= 3 for w, _ in worst) else 'not met'} for every draw)"
        )
    print("\n".join(summary))
    if args.quick:
        return all_rows
    meta = env_info()
    meta.update(
        samples=n_test,
        calibration_samples=n_cal,
        guidance=args.guidance,
        mixture="test: 64 dims, 6 components, std 0.15, means ~ N(0, I), seed 1; "
        "fitting: 48 dims, seed 0 (held out from the test mixture)",
        reference="scipy DOP853 rtol=atol=1e-10, float64",
        metric="median over samples of per-sample RMS error",
        wall_seconds=round(elapsed, 1),
        load_average_before=[round(v, 2) for v in load_before],
        load_average_after=[round(v, 2) for v in os.getloadavg()],
        fit_budgets={
            name: {str(n): b for n, b in budgets.items()}
            for name, _, _, budgets, *_ in FITTED + FAMILY_FITTED
        },
        family_fit=f"guided only: 48-d mixtures seeds {list(FAMILY_SEEDS)}, {FAMILY_ROWS} calibration samples "
        "each, objective median, started from the single-mixture fit named in the row",
        unguided_fit_budget_cap=UNGUIDED_BUDGET,
    )
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    json_rows = [{**r, "errors": {str(k): v for k, v in r["errors"].items()}} for r in all_rows]
    data = {"meta": meta, "rows": json_rows, "summary": summary, "fitted_schedules": {"unguided": schedules}}
    data["held_out_mixtures"] = held_out
    data["family_fit_redraws"] = [
        {
            **d,
            "errors": {str(k): v for k, v in d["errors"].items()},
            "ratios": {str(k): v for k, v in d["ratios"].items()},
        }
        for d in redraws
    ]
    data["fitted_schedules"][f"guided w={args.guidance:g}"] = gschedules
    (RESULTS_DIR / "sampler_accuracy.json").write_text(json.dumps(data, indent=1) + "\n")
    cols = ["scenario", "library", "sampler", *[f"NFE {n}" for n in nfes], "order"]
    table = [
        {
            "scenario": r["scenario"],
            "library": r["library"],
            "sampler": r["sampler"],
            **{f"NFE {n}": r["errors"][n] for n in nfes},
            "order": None if r["order"] is None else round(r["order"], 2),
        }
        for r in all_rows
    ]
    held_table = [
        {
            "scenario": sc,
            "seed": h["seed"],
            "NFE": h["nfe"],
            "best diffusers": f"{h['best']['diffusers'][1]} {h['best']['diffusers'][0]:.2e}",
            "best fastdiff": f"{h['best']['fastdiff'][1]} {h['best']['fastdiff'][0]:.2e}",
            "ratio": f"{h['ratio']:.2f}x",
        }
        for sc, hs in held_out.items()
        for h in hs
    ]
    redraw_table = [
        {
            "draw": d["draw"],
            **{f"seed {k}": f"{d['errors'][k]:.2e} ({d['ratios'][k]:.2f}x)" for k in d["errors"]},
            "worst ratio": f"{min(d['ratios'].values()):.2f}x",
            "mean ratio": f"{np.mean(list(d['ratios'].values())):.2f}x",
        }
        for d in redraws
    ]
    md = [
        "# sampler_accuracy",
        "",
        hardware_line(meta),
        "",
        "Median per-sample RMS error against the exact probability-flow ODE solution (float64 DOP853) on a",
        "64-d, 6-component Gaussian mixture (std 0.15, seed 1) wrapped as an epsilon model on SD's training",
        f"schedule; {n_test} test samples. Fitted schedules were fitted on another mixture (48-d, seed 0) with",
        f"{n_cal} calibration samples against the exact solution there, so they are evaluated on a model they",
        f"never saw; optimiser budgets (sampler runs; unguided at most {UNGUIDED_BUDGET}): "
        + "; ".join(
            f"{name} " + ", ".join(f"{b} at {n} NFE" for n, b in budgets.items())
            for name, _, _, budgets in FITTED
        )
        + ". `order`: slope",
        "of -log(error) vs log(NFE) for NFE >= 10. `+variance`: final step in sigma^2 (see fastdiff.samplers.core).",
        "`rounded-t`: the model sees round(t(sigma)) as in diffusers; all other fastdiff rows pass fractional t.",
        "`bh1`: UniPC with B(h) = -h instead of expm1(-h) (`solver_type`).",
        "`family-fitted (median)` (guided only): the single-mixture bh1 fit refitted on six 48-d guided mixtures",
        f"(seeds {', '.join(map(str, FAMILY_SEEDS))}; {FAMILY_ROWS} calibration samples each; none is a test mixture) "
        'with `fit_schedule(objective="median")`, '
        + "; ".join(
            f"{b} sampler runs at {n} NFE"
            for _, _, _, budgets, _ in FAMILY_FITTED
            for n, b in budgets.items()
        )
        + ".",
        f"Generated by `python benchmarks/sampler_accuracy.py` in {elapsed:.0f} s; load average (1/5/15 min) "
        f"{meta['load_average_before']} before, {meta['load_average_after']} after.",
        "",
        "## Goal check (best fastdiff vs best diffusers)",
        "",
        *summary,
        "",
        "## Held-out test mixtures (64-d, seeds 4-7; best configurations re-chosen per mixture)",
        "",
        markdown_table(held_table, ["scenario", "seed", "NFE", "best diffusers", "best fastdiff", "ratio"]),
        f"## Guided {args.guidance:g}, 8 NFE: the family fit on other calibration draws",
        "",
        "The same procedure (from the same single-mixture start, same budget) with another draw of the calibration",
        "noise or of the family's mixtures: median RMS error on each test mixture and the ratio of the best diffusers",
        "error there to it. Only the main draw is a row of the tables; the others show how much the result depends on the draw.",
        "",
        markdown_table(
            redraw_table, ["draw", *[f"seed {k}" for k in (1, 4, 5, 6, 7)], "worst ratio", "mean ratio"]
        ),
        "## All rows (test mixture seed 1)",
        "",
        markdown_table(table, cols),
    ]
    (RESULTS_DIR / "sampler_accuracy.md").write_text("\n".join(md))
    plot(all_rows, RESULTS_DIR / "sampler_accuracy.png", nfes)
    print(f"wrote {RESULTS_DIR / 'sampler_accuracy.md'} ({elapsed:.0f} s)")
    return all_rows


if __name__ == "__main__":
    main()
