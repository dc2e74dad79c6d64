"""Evidence for ``make_scheduler``'s defaults: every sampler x schedule x NFE on the trained model.

Two testbeds, side by side (issue #12, item 4):

* **fastdiff-tiny** (the shipped ``base`` weights), classifier-free guidance 5, held-out prompts
  (colour pairs never seen in training, ``fastdiff.tiny.data`` split "heldout"), one fixed
  initial noise per prompt.  Each configuration's decoded images are compared per image with a
  100-step DPM-Solver++(2M) reference from the same noise: PSNR (``fastdiff.metrics.psnr``,
  images in [0, 1], data range 1 per image), mean and worst image, plus attribute accuracy
  (``fastdiff.metrics.score``: shape colour, background colour and shape all right).  The LCM
  student is run with its own ``lcm`` sampler only.
* **exact Gaussian mixture** (``fastdiff.samplers.gmm``, as ``benchmarks/sampler_accuracy.py``):
  median per-sample RMS error against the float64 probability-flow ODE solution, unguided and
  with guidance 5.

Every run records both final steps: the scheduler with ``final_step="denoised"`` drives the
loop and a second one with ``final_step="variance"`` is stepped in lockstep on the same model
outputs (identical until the last step), so the two differ only in the last update.

The sweep runs in chunks that merge into one results file (each chunk well under 15 minutes
on 2 CPU cores)::

    python benchmarks/sampler_defaults.py --chunk reference
    python benchmarks/sampler_defaults.py --chunk ddim,dpmpp_2m      # any samplers
    python benchmarks/sampler_defaults.py --chunk lcm
    python benchmarks/sampler_defaults.py --chunk fitted:unipc@8     # fit_schedule on train prompts
    python benchmarks/sampler_defaults.py --chunk gmm
    python benchmarks/sampler_defaults.py --report                   # rewrite the markdown only
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import RESULTS_DIR, env_info, hardware_line, markdown_table  # noqa: E402
from fastdiff import metrics  # noqa: E402
from fastdiff.samplers import fit_schedule, make_scheduler  # noqa: E402
from fastdiff.samplers.gmm import GaussianMixture, GMMDenoiser, probability_flow_reference, rms_errors  # noqa: E402

NAME = "sampler_defaults"
SAMPLERS = ("ddim", "euler", "dpmpp_2m", "dpmpp_3m", "dpmpp_2m_sde", "unipc")
SCHEDULES = ("karras", "exponential", "trailing")
NFES = (4, 6, 8, 10, 15, 20)
LCM_NFES = (2, 4, 6, 8)
FITS = ("unipc@8", "dpmpp_2m@8", "unipc@10", "dpmpp_2m@10")  # sampler@NFE of the fitted rows
FIT_EVALS = 80
GUIDANCE = 5.0
REF_STEPS = 100
CACHE = Path(os.environ.get("FASTDIFF_BENCH_CACHE", "/tmp/fastdiff-sampler-defaults"))


# ----------------------------------------------------------------------------- fastdiff-tiny
class TinyModel:
    """Guided epsilon model of fastdiff-tiny for a fixed batch of prompts: ``model(x_vp, t)``."""

    def __init__(self, pipe, prompts: list[str], guidance: float):
        self.pipe, self.unet, self.guidance = pipe, pipe.unet, guidance
        with torch.no_grad():
            cond, uncond = pipe.encode_prompt(prompts, "cpu", 1, True, [""] * len(prompts))
        self.emb = torch.cat([uncond, cond])
        self.calls = 0

    @torch.no_grad()
    def __call__(self, x: torch.Tensor, t) -> torch.Tensor:
        self.calls += 1
        out = self.unet(torch.cat([x, x]), t, encoder_hidden_states=self.emb).sample
        uncond, cond = out.chunk(2)
        return uncond + self.guidance * (cond - uncond)

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        vae = self.pipe.vae
        img = vae.decode(latents / vae.config.scaling_factor).sample
        return (img / 2 + 0.5).clamp(0, 1)


class LCMModel(TinyModel):
    """The LCM student: guidance is a U-Net input (w embedding), no classifier-free pairs."""

    def __init__(self, pipe, prompts: list[str], guidance: float):
        self.pipe, self.unet, self.guidance = pipe, pipe.unet, guidance
        with torch.no_grad():
            self.emb, _ = pipe.encode_prompt(prompts, "cpu", 1, False)
        w = torch.full((len(prompts),), guidance - 1.0)  # as diffusers' pipeline: embed (w - 1)
        self.w_emb = pipe.get_guidance_scale_embedding(w, embedding_dim=self.unet.config.time_cond_proj_dim)
        self.calls = 0

    @torch.no_grad()
    def __call__(self, x: torch.Tensor, t) -> torch.Tensor:
        self.calls += 1
        return self.unet(x, t, encoder_hidden_states=self.emb, timestep_cond=self.w_emb).sample


def sample_both(model, latents, sampler: str, nfe: int, seed: int = 0, **options):
    """Run ``sampler`` for ``nfe`` steps; return the final samples with the ``denoised`` and the
    ``variance`` final step (lockstep schedulers, see module docstring)."""
    a = make_scheduler(sampler, final_step="denoised", **options)
    # LCM always returns its consistency output: both "final steps" are the same run
    b = make_scheduler(sampler, final_step="variance" if sampler != "lcm" else "denoised", **options)
    a.set_timesteps(nfe)
    b.set_timesteps(nfe)
    ga, gb = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
    x = latents * a.init_noise_sigma
    for t in a.timesteps:
        out = model(x, t)
        xb = b.step(out, t, x, generator=gb).prev_sample
        x = a.step(out, t, x, generator=ga).prev_sample
    return x, xb


def heldout_prompts(n: int):
    from fastdiff.tiny.data import sample_attributes

    return sample_attributes(n, seed=2026, split="heldout")


def tiny_setup(n_prompts: int, variant: str = "base"):
    from fastdiff.tiny import load_pipeline

    pipe = load_pipeline(variant)
    attrs = heldout_prompts(n_prompts)
    prompts = [a.prompt for a in attrs]
    size = pipe.unet.config.sample_size
    latents = torch.randn(n_prompts, 4, size, size, generator=torch.Generator().manual_seed(0))
    cls = LCMModel if variant == "lcm" else TinyModel
    return cls(pipe, prompts, GUIDANCE), attrs, latents


def reference_images(model, latents, n_prompts):
    """100-step DPM-Solver++(2M) references (cached; karras and trailing, to show convergence)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    path = CACHE / f"reference-{n_prompts}.pt"
    if path.exists():
        return torch.load(path)
    refs = {}
    for sched in ("karras", "trailing"):
        x, _ = sample_both(model, latents, "dpmpp_2m", REF_STEPS, like=model.pipe.scheduler, schedule=sched)
        refs[sched] = model.decode(x)
    torch.save(refs, path)
    return refs


def image_row(images, ref, attrs, **fields) -> dict:
    p = metrics.psnr(images, ref, data_range=1.0, reduction="none")
    acc = metrics.score(images, attrs)
    return {
        **fields,
        "psnr_mean": round(float(p.mean()), 2),
        "psnr_worst": round(float(p.min()), 2),
        "attr_all": round(acc["all"], 3),
    }


def run_tiny_chunk(samplers, n_prompts, log):
    model, attrs, latents = tiny_setup(n_prompts)
    ref = reference_images(model, latents, n_prompts)["karras"]
    rows = []
    for sampler in samplers:
        for sched in SCHEDULES:
            for nfe in NFES:
                t0 = time.perf_counter()
                x, xv = sample_both(model, latents, sampler, nfe, like=model.pipe.scheduler, schedule=sched)
                for final, lat in (("denoised", x), ("variance", xv)):
                    rows.append(
                        image_row(
                            model.decode(lat), ref, attrs, testbed="tiny", sampler=sampler,
                            schedule=sched, final_step=final, nfe=nfe,
                        )
                    )  # fmt: skip
                log(f"{sampler} {sched} {nfe}: {rows[-2]['psnr_mean']} dB ({time.perf_counter() - t0:.1f}s)")
    return rows


def run_reference_chunk(n_prompts, log):
    model, attrs, latents = tiny_setup(n_prompts)
    refs = reference_images(model, latents, n_prompts)
    rows = [
        image_row(
            refs["trailing"], refs["karras"], attrs, testbed="tiny", sampler="dpmpp_2m",
            schedule="trailing (reference check)", final_step="denoised", nfe=REF_STEPS,
        ),
        {"testbed": "tiny", "sampler": "dpmpp_2m", "schedule": "karras (reference)", "nfe": REF_STEPS,
         "final_step": "denoised", "attr_all": round(metrics.score(refs["karras"], attrs)["all"], 3)},
    ]  # fmt: skip
    log(f"reference: trailing vs karras 100 steps {rows[0]['psnr_mean']} dB (worst {rows[0]['psnr_worst']})")
    return rows


def run_lcm_chunk(n_prompts, log):
    base, attrs, latents = tiny_setup(n_prompts)
    ref = reference_images(base, latents, n_prompts)["karras"]
    model, _, _ = tiny_setup(n_prompts, "lcm")
    rows = []
    for nfe in LCM_NFES:
        x, _ = sample_both(model, latents, "lcm", nfe, like=model.pipe.scheduler)
        rows.append(
            image_row(model.decode(x), ref, attrs, testbed="tiny (LCM student)", sampler="lcm",
                      schedule="lcm", final_step="denoised", nfe=nfe)
        )  # fmt: skip
        log(f"lcm {nfe}: {rows[-1]}")
    return rows


@functools.lru_cache(maxsize=1)
def calibration_set(n_cal: int):
    """Training-split prompts (never the held-out ones), their noise and 100-step references."""
    from fastdiff.tiny import load_pipeline
    from fastdiff.tiny.data import sample_attributes

    pipe = load_pipeline("base")
    prompts = [a.prompt for a in sample_attributes(n_cal, seed=11, split="train")]
    model = TinyModel(pipe, prompts, GUIDANCE)
    size = pipe.unet.config.sample_size
    lat = torch.randn(n_cal, 4, size, size, generator=torch.Generator().manual_seed(1))
    ref, _ = sample_both(model, lat, "dpmpp_2m", REF_STEPS, like=pipe.scheduler, schedule="karras")
    return model, lat, ref


def fit_tiny(sampler: str, nfe: int, n_cal: int, log, **options) -> list[float]:
    """``fit_schedule`` on the calibration set against its 100-step DPM-Solver++ references."""
    model, lat, ref = calibration_set(n_cal)
    pipe = model.pipe
    t0 = time.perf_counter()
    # start from the best fixed schedules of the sweep; free end: trailing stops above sigma_min
    sig = fit_schedule(
        model, lat, nfe, sampler, like=pipe.scheduler, reference=ref, max_evals=FIT_EVALS,
        starts=("trailing", "karras"), free_end=True, **options,
    )  # fmt: skip
    log(f"fitted {sampler}@{nfe} in {time.perf_counter() - t0:.0f}s: {[round(s, 3) for s in sig]}")
    return sig


def run_fitted_chunk(fits, n_prompts, n_cal, log):
    model, attrs, latents = tiny_setup(n_prompts)
    ref = reference_images(model, latents, n_prompts)["karras"]
    rows, schedules = [], {}
    for fit in fits:
        sampler, nfe = fit.split("@")[0], int(fit.split("@")[1])
        sig = fit_tiny(sampler, nfe, n_cal, log)
        schedules[f"{sampler}@{nfe}"] = sig
        x, xv = sample_both(model, latents, sampler, nfe, like=model.pipe.scheduler, schedule=sig)
        for final, lat in (("denoised", x), ("variance", xv)):
            rows.append(
                image_row(model.decode(lat), ref, attrs, testbed="tiny", sampler=sampler,
                          schedule="fitted", final_step=final, nfe=nfe)
            )  # fmt: skip
        log(f"{sampler} fitted {nfe}: {rows[-2]['psnr_mean']} dB")
    return rows, schedules


# ----------------------------------------------------------------------------- exact mixture
def gmm_testbed(guidance: float | None, n_test: int = 128):
    """The exact testbed: (denoiser, initial noise, float64 ODE solution); guidance None or 1 is unguided."""
    mixture = GaussianMixture.random(dims=48, components=6, std=0.15, num_classes=3, seed=0)
    x = torch.randn(n_test, mixture.dims, generator=torch.Generator().manual_seed(0))
    labels = torch.arange(n_test) % 3 if guidance not in (None, 1.0) else None
    model = GMMDenoiser(mixture, class_labels=labels, guidance_scale=guidance or 1.0)
    return model, x, probability_flow_reference(model, x)


def run_gmm_chunk(log, n_test=128):
    rows = []
    for label, guidance in (("gmm unguided", None), (f"gmm guided w={GUIDANCE:g}", GUIDANCE)):
        model, x, ref = gmm_testbed(guidance, n_test)
        for sampler in SAMPLERS:
            if sampler == "dpmpp_2m_sde":
                continue  # stochastic: does not follow the ODE, no exact reference
            for sched in SCHEDULES:
                for nfe in NFES:
                    out, outv = sample_both(model, x, sampler, nfe, schedule=sched)
                    for final, o in (("denoised", out), ("variance", outv)):
                        e = float(rms_errors(o, ref).median())
                        rows.append(dict(testbed=label, sampler=sampler, schedule=sched, final_step=final,
                                         nfe=nfe, rms_median=float(f"{e:.3g}")))  # fmt: skip
        log(f"{label} done")
    return rows


# ----------------------------------------------------------------------------- results
def load_results() -> dict:
    path = RESULTS_DIR / f"{NAME}.json"
    if path.exists():
        return json.loads(path.read_text())
    return {"meta": {}, "rows": [], "fitted_schedules": {}, "chunks": {}}


def merge(data: dict, rows: list[dict]) -> None:
    key = lambda r: (r["testbed"], r["sampler"], r["schedule"], r["final_step"], r["nfe"])
    new = {key(r) for r in rows}
    data["rows"] = [r for r in data["rows"] if key(r) not in new] + rows


def _best(rows, metric, better):
    return max(rows, key=lambda r: better * r[metric]) if rows else None


def summarise(data: dict) -> list[str]:
    """Per sampler: which schedule wins most NFEs on mean PSNR (tiny) and on RMS (guided GMM)."""
    rows = data["rows"]
    lines = []
    for sampler in SAMPLERS:
        tiny = [r for r in rows if r["testbed"] == "tiny" and r["sampler"] == sampler]
        tiny = [r for r in tiny if r["final_step"] == "denoised" and r["schedule"] in SCHEDULES]
        if not tiny:
            continue
        wins = {s: 0 for s in SCHEDULES}
        mean_db = {}
        for nfe in NFES:
            cand = [r for r in tiny if r["nfe"] == nfe]
            if cand:
                wins[_best(cand, "psnr_mean", 1)["schedule"]] += 1
        for s in SCHEDULES:
            vals = [r["psnr_mean"] for r in tiny if r["schedule"] == s]
            mean_db[s] = round(float(np.mean(vals)), 2) if vals else None
        lines.append(
            f"- tiny {sampler}: wins per schedule over NFE {list(NFES)} (mean PSNR) {wins}; "
            f"mean PSNR over NFEs {mean_db}"
        )
    for tb in sorted({r["testbed"] for r in rows if r["testbed"].startswith("gmm")}):
        for sampler in SAMPLERS:
            g = [r for r in rows if r["testbed"] == tb and r["sampler"] == sampler]
            g = [r for r in g if r["final_step"] == "denoised"]
            if not g:
                continue
            wins = {s: 0 for s in SCHEDULES}
            for nfe in NFES:
                cand = [r for r in g if r["nfe"] == nfe]
                wins[_best(cand, "rms_median", -1)["schedule"]] += 1
            lines.append(f"- {tb} {sampler}: wins per schedule (median RMS) {wins}")
    # variance vs denoised final step
    for tb in sorted({r["testbed"] for r in rows}):
        pairs = {}
        for r in rows:
            if r["testbed"] == tb and r["schedule"] in SCHEDULES + ("fitted",):
                pairs.setdefault((r["sampler"], r["schedule"], r["nfe"]), {})[r["final_step"]] = r
        metric, sign = ("psnr_mean", 1) if tb == "tiny" else ("rms_median", -1)
        both = [p for p in pairs.values() if "denoised" in p and "variance" in p and metric in p["denoised"]]
        if both:
            better = sum(sign * (p["variance"][metric] - p["denoised"][metric]) > 0 for p in both)
            diffs = [p["variance"][metric] - p["denoised"][metric] for p in both]
            lines.append(
                f"- {tb}: final_step='variance' better than 'denoised' in {better}/{len(both)} configurations"
                f" (median change of {metric} {float(np.median(diffs)):+.3g})"
            )
    return lines


def pivot(rows, testbed, metric, final_step="denoised"):
    out = []
    sel = [r for r in rows if r["testbed"] == testbed and r.get("final_step") == final_step and metric in r]
    for sampler in dict.fromkeys(r["sampler"] for r in sel):
        for sched in dict.fromkeys(r["schedule"] for r in sel if r["sampler"] == sampler):
            row = {"sampler": sampler, "schedule": sched}
            for r in sel:
                if r["sampler"] == sampler and r["schedule"] == sched:
                    row[f"NFE {r['nfe']}"] = r[metric]
            out.append(row)
    return out


def write_report(data: dict) -> None:
    rows = data["rows"]
    nfe_cols = sorted({r["nfe"] for r in rows if r["nfe"] != REF_STEPS})
    cols = ["sampler", "schedule", *[f"NFE {n}" for n in nfe_cols]]
    meta = data["meta"]
    md = [
        f"# {NAME}",
        "",
        hardware_line(meta) if meta else "",
        "",
        "Generated by `benchmarks/sampler_defaults.py` (see its docstring). fastdiff-tiny: shipped `base`",
        f"weights, guidance {GUIDANCE:g}, {meta.get('prompts')} held-out prompts (split 'heldout', seed 2026),",
        f"one noise per prompt; PSNR per image (data range 1) against a {REF_STEPS}-step DPM-Solver++(2M) Karras",
        "reference from the same noise; attribute accuracy = shape colour, background colour and shape all",
        "right (`fastdiff.metrics.score`). Mixture: median per-sample RMS error against the exact",
        "probability-flow ODE (128 samples). `trailing` = `uniform`. `fitted`: `fit_schedule` on",
        f"{meta.get('calibration_prompts')} training-split prompts against their own 100-step reference.",
        "",
        "Load average at each chunk: " + "; ".join(f"{k}: {v}" for k, v in data.get("chunks", {}).items()),
        "",
        "## Summary",
        "",
        *summarise(data),
        "",
    ]
    best = []
    for nfe in NFES:
        cand = [
            r for r in rows if r["testbed"] == "tiny" and r["nfe"] == nfe and r["final_step"] == "denoised"
        ]
        if cand:
            m, w = _best(cand, "psnr_mean", 1), _best(cand, "psnr_worst", 1)
            best.append(
                {"NFE": nfe, "best mean": f"{m['sampler']} {m['schedule']}: {m['psnr_mean']} dB (worst "
                 f"{m['psnr_worst']}, attributes {m['attr_all']})", "best worst image": f"{w['sampler']} "
                 f"{w['schedule']}: {w['psnr_worst']} dB (mean {w['psnr_mean']})"}
            )  # fmt: skip
    if best:
        md += [
            "## Best fastdiff-tiny configuration per NFE (evidence for the presets)",
            "",
            markdown_table(best),
            "",
        ]
    refs = [r for r in rows if r["nfe"] == REF_STEPS]
    if refs:
        md += ["## Reference", "", markdown_table(refs), ""]
    for title, tb, metric, final in (
        ("fastdiff-tiny: mean PSNR (dB) vs reference", "tiny", "psnr_mean", "denoised"),
        ("fastdiff-tiny: worst-image PSNR (dB)", "tiny", "psnr_worst", "denoised"),
        ("fastdiff-tiny: attribute accuracy (all three right)", "tiny", "attr_all", "denoised"),
        ("fastdiff-tiny: mean PSNR with final_step='variance'", "tiny", "psnr_mean", "variance"),
        ("LCM student (lcm sampler): mean PSNR vs the teacher's reference", "tiny (LCM student)", "psnr_mean",
         "denoised"),
        ("LCM student: attribute accuracy", "tiny (LCM student)", "attr_all", "denoised"),
        ("Mixture, unguided: median RMS vs exact ODE", "gmm unguided", "rms_median", "denoised"),
        ("Mixture, unguided, final_step='variance'", "gmm unguided", "rms_median", "variance"),
        (f"Mixture, guided w={GUIDANCE:g}: median RMS vs exact ODE", f"gmm guided w={GUIDANCE:g}", "rms_median",
         "denoised"),
        (f"Mixture, guided w={GUIDANCE:g}, final_step='variance'", f"gmm guided w={GUIDANCE:g}", "rms_median",
         "variance"),
    ):  # fmt: skip
        table = [r for r in pivot(rows, tb, metric, final) if not r["schedule"].endswith(")")]
        if table:
            md += [f"## {title}", "", markdown_table(table, cols), ""]
    if data.get("fitted_schedules"):
        md += ["## Fitted schedules (sigmas)", ""]
        md += [f"- {k}: {[round(s, 4) for s in v]}" for k, v in data["fitted_schedules"].items()]
    (RESULTS_DIR / f"{NAME}.md").write_text("\n".join(md) + "\n")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--chunk", help="reference | lcm | fitted | gmm | comma-separated sampler names")
    p.add_argument("--prompts", type=int, default=24, help="held-out prompts (one batch)")
    p.add_argument("--calibration", type=int, default=6, help="training prompts for fit_schedule")
    p.add_argument("--report", action="store_true", help="only rewrite the markdown from the json")
    args = p.parse_args(argv)
    log = lambda s: print(s, flush=True)
    data = load_results()
    if args.chunk:
        t0 = time.perf_counter()
        load = os.getloadavg()
        if args.chunk == "reference":
            rows = run_reference_chunk(args.prompts, log)
        elif args.chunk == "lcm":
            rows = run_lcm_chunk(args.prompts, log)
        elif args.chunk.startswith("fitted"):
            fits = args.chunk.split(":", 1)[1].split(",") if ":" in args.chunk else FITS
            rows, sched = run_fitted_chunk(fits, args.prompts, args.calibration, log)
            data["fitted_schedules"].update(sched)
        elif args.chunk == "gmm":
            torch.set_num_threads(1)
            rows = run_gmm_chunk(log)
        else:
            samplers = args.chunk.split(",")
            bad = [s for s in samplers if s not in SAMPLERS]
            if bad:
                raise SystemExit(f"unknown sampler(s) {bad}; valid: {SAMPLERS} or reference/lcm/fitted/gmm")
            rows = run_tiny_chunk(samplers, args.prompts, log)
        merge(data, rows)
        meta = env_info()
        meta.update(prompts=args.prompts, calibration_prompts=args.calibration, guidance=GUIDANCE)
        data["meta"] = meta
        elapsed = time.perf_counter() - t0
        data["chunks"][args.chunk] = (
            f"load {load[0]:.2f} before, {os.getloadavg()[0]:.2f} after, {elapsed:.0f} s, {meta['date']}"
        )
        RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        (RESULTS_DIR / f"{NAME}.json").write_text(json.dumps(data, indent=1) + "\n")
        log(f"chunk {args.chunk}: {elapsed:.0f} s")
    write_report(data)


if __name__ == "__main__":
    main()
