"""Why UniPC with Karras sigmas fails under guidance on fastdiff-tiny: measurements (issue #12).

Three measurements on the held-out prompts, noise and reference of ``sampler_defaults.py``:

1. **Where the guided ODE bends.**  Along a 100-step DPM-Solver++(2M) trajectory, the rate at
   which the model's x0 prediction ``D`` changes per unit log-SNR, ``|D_i - D_{i-1}| / |dlambda|``
   (RMS over latents), per noise band, with guidance 5 and without guidance (scale 1); plus how
   far the guided x0 prediction leaves the latent range (its RMS against the reference's).
2. **Which part of the solver breaks.**  UniPC at 8 NFE, Karras vs trailing, with and without
   the UniC corrector, order 1 and 2, guided and unguided, each against its own 100-step
   reference: mean / worst PSNR.
3. **The step sizes** (in log-SNR) each schedule takes per noise band.

Run:  flock /tmp/fastdiff-heavy.lock python benchmarks/unipc_karras.py   (~5 min on 2 cores)
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import RESULTS_DIR, env_info, hardware_line, markdown_table  # noqa: E402
from benchmarks.sampler_defaults import GUIDANCE, REF_STEPS, image_row, tiny_setup  # noqa: E402
from fastdiff.samplers import make_scheduler  # noqa: E402

BANDS = ((14.7, 4.0), (4.0, 1.0), (1.0, 0.3), (0.3, 0.0))


def trajectory(model, latents, sampler, nfe, like, **options):
    """Final latents and the per-step (sigma, x0 prediction) of one run."""
    s = make_scheduler(sampler, like=like, **options)
    s.set_timesteps(nfe)
    x, steps = latents.clone(), []
    for i, t in enumerate(s.timesteps):
        res = s.step(model(x, t), t, x)
        steps.append((float(s.sigmas[i]), res.pred_original_sample))
        x = res.prev_sample
    return x, steps


def bend_profile(steps):
    """Per band: mean of |D_i - D_{i-1}| / |dlambda| (RMS over latent entries)."""
    out = {}
    for hi, lo in BANDS:
        rates = []
        for (s0, d0), (s1, d1) in zip(steps[:-1], steps[1:]):
            if hi >= s1 > lo:
                dlam = abs(np.log(s0) - np.log(s1))
                rates.append(float((d1 - d0).pow(2).mean().sqrt()) / dlam)
        out[f"sigma {hi:g}-{lo:g}"] = round(float(np.mean(rates)), 3) if rates else None
    return out


def step_sizes(name, nfe=8):
    s = make_scheduler("unipc", schedule=name)
    s.set_timesteps(nfe)
    sig = s.sigmas[:-1].double().numpy()
    h = np.diff(-np.log(sig))
    row = {"schedule": name, "sigmas": [round(float(v), 3) for v in sig]}
    for hi, lo in BANDS:
        row[f"steps in sigma {hi:g}-{lo:g}"] = int(((sig[1:] <= hi) & (sig[1:] > lo)).sum())
        sel = h[(sig[1:] <= hi) & (sig[1:] > lo)]
        row[f"mean h in {hi:g}-{lo:g}"] = round(float(sel.mean()), 2) if len(sel) else None
    return row


def main():
    t0 = time.perf_counter()
    log = lambda s: print(s, flush=True)
    model, attrs, latents = tiny_setup(24)
    like = model.pipe.scheduler
    refs, profiles = {}, []
    for w in (GUIDANCE, 1.0):
        model.guidance = w
        x, steps = trajectory(model, latents, "dpmpp_2m", REF_STEPS, like, schedule="karras")
        refs[w] = (model.decode(x), steps)
        profiles.append({"guidance": w, **bend_profile(steps)})
        log(f"reference w={w}: {profiles[-1]}")
    # size of the guided x0 prediction relative to the final sample, per band (guided / unguided)
    x0_scale = []
    for w in (GUIDANCE, 1.0):
        final = refs[w][1][-1][1]
        row = {"guidance": w}
        for hi, lo in BANDS:
            r = [
                float(d.pow(2).mean().sqrt() / final.pow(2).mean().sqrt())
                for s, d in refs[w][1]
                if hi >= s > lo
            ]
            row[f"RMS(D)/RMS(x0) sigma {hi:g}-{lo:g}"] = round(float(np.max(r)), 2)
        x0_scale.append(row)
    runs = []
    for w in (GUIDANCE, 1.0):
        model.guidance = w
        for sched in ("karras", "trailing"):
            for order in (1, 2):
                for corr in (True, False):
                    x, steps = trajectory(
                        model,
                        latents,
                        "unipc",
                        8,
                        like,
                        schedule=sched,
                        solver_order=order,
                        use_corrector=corr,
                    )
                    row = image_row(
                        model.decode(x), refs[w][0], attrs, guidance=w, schedule=sched, solver_order=order,
                        use_corrector=corr,
                    )  # fmt: skip
                    row["max |D| at sigma>1"] = round(max(float(d.abs().max()) for s, d in steps if s > 1), 2)
                    runs.append(row)
                    log(str(row))
        for sched in ("karras", "trailing"):
            x, _ = trajectory(model, latents, "dpmpp_2m", 8, like, schedule=sched)
            runs.append(
                {
                    **image_row(model.decode(x), refs[w][0], attrs, guidance=w, schedule=sched),
                    "sampler": "dpmpp_2m",
                }
            )
    sizes = [step_sizes(s) for s in ("karras", "exponential", "trailing")]
    meta = env_info()
    meta["wall_seconds"] = round(time.perf_counter() - t0)
    data = {"meta": meta, "bend": profiles, "x0_scale": x0_scale, "runs": runs, "step_sizes": sizes}
    (RESULTS_DIR / "unipc_karras.json").write_text(json.dumps(data, indent=1) + "\n")
    md = [
        "# unipc_karras",
        "",
        hardware_line(meta),
        "",
        "Generated by `benchmarks/unipc_karras.py` (24 held-out prompts, shipped `base` weights, same noise",
        "and 100-step DPM-Solver++(2M) Karras references as `sampler_defaults.md`; the unguided rows use their",
        f"own unguided reference). {meta['wall_seconds']} s.",
        "",
        "## 1. Rate of change of the x0 prediction per unit log-SNR along the reference trajectory",
        "",
        markdown_table(profiles),
        "",
        "Largest RMS of the x0 prediction relative to the final sample's, per band:",
        "",
        markdown_table(x0_scale),
        "",
        "## 2. UniPC at 8 NFE: schedule x order x corrector, guided and unguided (plus DPM-Solver++(2M))",
        "",
        markdown_table(runs),
        "",
        "## 3. Schedules at 8 NFE: noise levels, evaluations per band and mean log-SNR step h",
        "",
        markdown_table(sizes),
    ]
    (RESULTS_DIR / "unipc_karras.md").write_text("\n".join(md) + "\n")
    log(f"wrote {RESULTS_DIR / 'unipc_karras.md'}")


if __name__ == "__main__":
    main()
