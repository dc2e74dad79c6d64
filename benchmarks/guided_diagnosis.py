"""Why guidance hurts few-step samplers on the exact Gaussian mixture (issue #12, item 5).

Same test problem as ``benchmarks/sampler_accuracy.py`` (64-d mixture, seed 1, SD training schedule, 128
test samples, classifier-free guidance w = 5 or none).  Three measurements, all against float64 DOP853
solutions of the probability-flow ODE:

1. *Where the error is made.*  For an ``N``-step UniPC run (``final_step="variance"``) we stop the solver
   at its ``i``-th noise level and finish with the exact ODE: the final error of that hybrid is the error
   the first ``i`` steps leave behind (the "head error").  Comparing it with the error of the whole run
   shows which noise levels make the error and whether later steps cancel it.
2. *How stiff the guided model is.*  Along the exact trajectory, the RMS rate of change of the x0
   prediction per unit log-SNR, ``|dD/dlambda|``, in bands of sigma (finite differences on a fine grid).
3. *Fit vs held-out.*  The fitted schedules of ``sampler_accuracy.json`` on the fitting mixture and calibration
   noise they were fitted on (in-sample) and on the test mixture (held out), run through the scheduler.

The head-error runs are :class:`fastdiff.samplers.core.SolverState` driven directly in the VE state in
float64 (the scheduler path of ``sampler_accuracy.py`` does the same arithmetic in float32).

Run:  python benchmarks/guided_diagnosis.py   (about 1 minute on 2 CPU cores)
"""

from __future__ import annotations

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
from fastdiff.samplers import make_scheduler, run_scheduler  # noqa: E402
from fastdiff.samplers.core import SolverState  # noqa: E402
from fastdiff.samplers.gmm import GaussianMixture, GMMDenoiser, probability_flow_reference, rms_errors  # noqa: E402
from fastdiff.samplers.schedules import karras_sigmas  # noqa: E402

BANDS = ((14.7, 4.0), (4.0, 1.0), (1.0, 0.3), (0.3, 0.03))


def exact(model: GMMDenoiser, x: torch.Tensor, s0: float, s1: float) -> torch.Tensor:
    """VE state at ``s1`` (0 = the clean sample) from VE state ``x`` at ``s0``: DOP853, rtol = atol = 1e-10."""
    from scipy.integrate import solve_ivp

    end = 1e-5 * model.noise.sigma_min if s1 == 0 else s1
    n = x.shape[0]

    def rhs(s, y):
        v = torch.from_numpy(y).reshape(n, -1)
        return (v - model.denoise_ve(v, math.exp(s))).reshape(-1).numpy()

    sol = solve_ivp(
        rhs, (math.log(s0), math.log(end)), x.reshape(-1).numpy(), method="DOP853", rtol=1e-10, atol=1e-10
    )
    y = torch.from_numpy(sol.y[:, -1]).reshape(n, -1)
    return 0.5 * (y + model.denoise_ve(y, end)) if s1 == 0 else y


def solver_states(model: GMMDenoiser, x: torch.Tensor, sigmas: list[float]) -> list[torch.Tensor]:
    """States of a UniPC (+variance) run at every noise level of ``sigmas`` (the UniC-corrected state where
    the corrector runs, i.e. the state the next step starts from)."""
    st = SolverState("unipc", sigmas, final_step="variance")
    states = []
    for i in range(len(sigmas) - 1):
        d = model.denoise_ve(x, sigmas[i])
        x_next, _ = st.step(i, x, d, None)
        # step() applies UniC to x and records the corrected state in last_x before predicting; the last
        # step (to sigma = 0) returns before that, so there the state is the uncorrected one the model saw
        states.append(st.last_x if i < len(sigmas) - 2 else x)
        x = x_next
    states.append(x)
    return states


def head_errors(model, x_ve, sigmas, ref):
    states = solver_states(model, x_ve.clone(), sigmas)
    total = float(rms_errors(states[-1], ref).median())
    heads = [
        float(rms_errors(exact(model, states[i], sigmas[i], 0.0), ref).median())
        for i in range(1, len(sigmas) - 1)
    ]
    return total, heads


def stiffness(model, x_ve, sigma_max, sigma_min, points=80):
    lam = np.linspace(-math.log(sigma_max), -math.log(sigma_min), points)
    x, s_prev = x_ve.clone(), sigma_max
    rates = []
    d_prev = model.denoise_ve(x, sigma_max)
    for a, b in zip(lam[:-1], lam[1:]):
        s = math.exp(-b)
        x = exact(model, x, s_prev, s)
        d = model.denoise_ve(x, s)
        rates.append((math.exp(-0.5 * (a + b)), float((d - d_prev).pow(2).mean().sqrt()) / (b - a)))
        d_prev, s_prev = d, s
    return [max((r for s, r in rates if lo < s <= hi), default=float("nan")) for hi, lo in BANDS], [
        float(np.mean([r for s, r in rates if lo < s <= hi])) for hi, lo in BANDS
    ]


def main():
    torch.set_num_threads(1)
    load_before = [round(v, 2) for v in os.getloadavg()]
    t0 = time.perf_counter()
    mix = GaussianMixture.random(dims=64, components=6, std=0.15, num_classes=3, seed=1)
    n = 128
    x = torch.randn(n, 64, generator=torch.Generator().manual_seed(0))
    rows_err, rows_stiff = [], []
    sched_of = {}
    for label, w in (("unguided", None), ("guided w=5", 5.0)):
        model = GMMDenoiser(mix, class_labels=torch.arange(n) % 3 if w else None, guidance_scale=w or 1.0)
        smax, smin = model.noise.sigma_max, model.noise.sigma_min
        x_ve = x.double() * math.sqrt(1.0 + smax**2)
        ref = exact(model, x_ve, smax, 0.0)
        sched_of = {"karras": [*karras_sigmas(8, smin, smax).tolist(), 0.0]}
        fitted = _fitted_schedule(label)
        if fitted is not None:
            sched_of["fitted (sampler_accuracy.json)"] = fitted
        for name, sig in sched_of.items():
            total, heads = head_errors(model, x_ve, sig, ref)
            row = {"scenario": label, "schedule": f"{name}, {len(sig) - 1} NFE", "final error": total}
            for s, e in zip(sig[1:-1], heads):
                row[f"sigma {s:.3g}"] = e
            rows_err.append(row)
        peak, mean = stiffness(model, x_ve, smax, smin)
        rows_stiff.append(
            {
                "scenario": label,
                **{
                    f"sigma {hi:g}-{lo:g}": f"{m:.3g} (max {p:.3g})"
                    for (hi, lo), m, p in zip(BANDS, mean, peak)
                },
            }
        )
    rows_fit = in_sample_vs_held_out(mix, x)
    elapsed = time.perf_counter() - t0
    meta = env_info()
    meta.update(
        wall_seconds=round(elapsed, 1),
        load_average_before=load_before,
        load_average_after=[round(v, 2) for v in os.getloadavg()],
    )
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    (RESULTS_DIR / "guided_diagnosis.json").write_text(
        json.dumps(
            {"meta": meta, "head_errors": rows_err, "stiffness": rows_stiff, "fit": rows_fit}, indent=1
        )
        + "\n"
    )
    md = [
        "# guided_diagnosis",
        "",
        hardware_line(meta),
        "",
        'Test mixture of `sampler_accuracy.py` (64-d, seed 1), 128 samples, UniPC order 2 + UniC, `final_step="variance"`,',
        "8 NFE. Medians over samples of the per-sample RMS error against the exact float64 PF-ODE solution.",
        f"Generated by `python benchmarks/guided_diagnosis.py` in {elapsed:.0f} s; load average (1/5/15 min) "
        f"{meta['load_average_before']} before, {meta['load_average_after']} after.",
        "",
        "## Head errors: run the solver down to sigma_i, finish with the exact ODE",
        "",
        "Each `sigma` column is the final error left by the solver's steps above that noise level (columns are",
        "per schedule, so they differ between rows; read each row left to right).",
        "",
    ]
    for r in rows_err:
        cols = list(r)
        md += [markdown_table([r], cols)]
    md += [
        "## Stiffness: RMS |dD/dlambda| of the x0 prediction along the exact trajectory, per sigma band",
        "",
        markdown_table(rows_stiff),
        "## Fitted schedules (sampler_accuracy.json): in-sample (fitting mixture, its calibration noise) vs held out",
        "",
        markdown_table(rows_fit) if rows_fit else "(run benchmarks/sampler_accuracy.py first)\n",
    ]
    (RESULTS_DIR / "guided_diagnosis.md").write_text("\n".join(md))
    print("\n".join(md))


def in_sample_vs_held_out(mix, x_test):
    """Median error of each fitted schedule on its own calibration problem and on the test problem."""
    path = RESULTS_DIR / "sampler_accuracy.json"
    if not path.exists():
        return []
    fitted = json.loads(path.read_text()).get("fitted_schedules", {})
    fit_mix = GaussianMixture.random(dims=48, components=6, std=0.15, num_classes=3, seed=0)
    x_cal = torch.randn(64, 48, generator=torch.Generator().manual_seed(1))  # as sampler_accuracy.py
    rows = []
    for scenario, scheds in fitted.items():
        w = None if scenario == "unguided" else float(scenario.split("=")[1])
        problems = {}
        for what, m, xx in (("in-sample", fit_mix, x_cal), ("held out", mix, x_test)):
            model = GMMDenoiser(
                m, class_labels=torch.arange(len(xx)) % 3 if w else None, guidance_scale=w or 1.0
            )
            problems[what] = (model, xx, probability_flow_reference(model, xx))
        for key, sig in scheds.items():
            label, nfe = key.rsplit("@", 1)
            opts = dict(final_step="variance", solver_type="bh1" if "bh1" in label else "bh2")
            row = {"scenario": scenario, "fitted row": label, "NFE": int(nfe)}
            for what, (model, xx, ref) in problems.items():
                out = run_scheduler(model, xx.clone(), make_scheduler("unipc", schedule=sig, **opts))
                row[what] = float(rms_errors(out, ref).median())
            rows.append(row)
    return rows


def _fitted_schedule(scenario: str):
    """The 8-NFE fitted UniPC (bh2) schedule in sampler_accuracy.json (None if absent)."""
    path = RESULTS_DIR / "sampler_accuracy.json"
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    fitted = data.get("fitted_schedules", {}).get(scenario, {})
    return fitted.get("unipc fitted free end +variance@8")  # the bh2 row: the solver run here


if __name__ == "__main__":
    main()
