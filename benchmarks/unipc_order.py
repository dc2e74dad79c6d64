"""Which ``solver_order`` should ``make_scheduler("unipc")`` default to?  Measured on the trained model (issue #12).

``benchmarks/results/unipc_karras.md`` found, at 8 NFE on 24 held-out fastdiff-tiny prompts with guidance 5, that
UniPC's default (order 2 with the UniC corrector, as diffusers) is the worst of its variants there
(23.4 dB mean against 25.4 dB for order 1 with the corrector), and the ``unipc-8`` row of ``fastdiff demo``
shows speckles on the striped background.  With the corrector, order p is a p+1-order method: order 1 is
second order like DPM-Solver++(2M), order 2 is third order, whose extrapolation over the sharply bending
guided trajectory overshoots.  This script measures it at every NFE of ``sampler_defaults.py``:

* **fastdiff-tiny** (shipped ``base`` weights): 72 held-out prompts (``sampler_defaults.heldout_prompts``),
  one fixed noise per prompt, guidance 5 and unguided (scale 1), each against its own 100-step
  DPM-Solver++(2M) Karras reference from the same noise: per-image PSNR (mean, worst image) and attribute
  accuracy; UniPC orders 1, 2 and 3 (corrector on, ``bh2``) and DPM-Solver++(2M) for context, on the trailing
  and Karras schedules (``"auto"`` is trailing up to 10 steps, Karras above), NFE 4-20.
* **exact Gaussian mixture** (the testbed of ``sampler_defaults.py``): median per-sample RMS error
  against the float64 ODE solution, unguided and with guidance 5.

The rule, fixed before the run: order 1 becomes the default if, on fastdiff-tiny with guidance 5 and the
``"auto"`` schedule, it has the higher mean PSNR at at least 4 of the 6 NFEs and a worst image no lower at
at least 4 of them; otherwise the default stays 2.

Run:  flock /tmp/fastdiff-heavy.lock python benchmarks/unipc_order.py   (about 10 minutes on 2 cores)
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import RESULTS_DIR, env_info, hardware_line, markdown_table  # noqa: E402
from benchmarks.sampler_defaults import (  # noqa: E402
    GUIDANCE,
    NFES,
    REF_STEPS,
    gmm_testbed,
    image_row,
    sample_both,
    tiny_setup,
)
from fastdiff.samplers.gmm import rms_errors  # noqa: E402

NAME = "unipc_order"
PROMPTS = 72
ORDERS = (1, 2, 3)
SCHEDULES = ("trailing", "karras")
VARIANTS = [("unipc", {"solver_order": o}) for o in ORDERS] + [("dpmpp_2m", {})]


def label(sampler: str, options: dict) -> str:
    return f"unipc order {options['solver_order']}" if sampler == "unipc" else sampler


def auto_schedule(nfe: int) -> str:
    """``make_scheduler``'s ``schedule="auto"`` for these samplers (see ``fastdiff.samplers.options``)."""
    return "trailing" if nfe <= 10 else "karras"


def run_tiny(log) -> list[dict]:
    model, attrs, latents = tiny_setup(PROMPTS)
    like = model.pipe.scheduler
    rows = []
    for w in (GUIDANCE, 1.0):
        model.guidance = w
        t0 = time.perf_counter()
        ref_latents, _ = sample_both(model, latents, "dpmpp_2m", REF_STEPS, like=like, schedule="karras")
        ref = model.decode(ref_latents)
        log(f"reference w={w:g}: {time.perf_counter() - t0:.0f} s")
        for sampler, options in VARIANTS:
            for sched in SCHEDULES:
                for nfe in NFES:
                    x, _ = sample_both(model, latents, sampler, nfe, like=like, schedule=sched, **options)
                    row = image_row(
                        model.decode(x), ref, attrs, testbed="tiny", guidance=w, variant=label(sampler, options),
                        schedule=sched, nfe=nfe,
                    )  # fmt: skip
                    rows.append(row)
            log(f"w={w:g} {label(sampler, options)}: {time.perf_counter() - t0:.0f} s")
    return rows


def run_gmm(log) -> list[dict]:
    rows = []
    for w in (GUIDANCE, 1.0):
        model, x, ref = gmm_testbed(w)
        for sampler, options in VARIANTS:
            for sched in SCHEDULES:
                for nfe in NFES:
                    out, _ = sample_both(model, x, sampler, nfe, schedule=sched, **options)
                    e = float(rms_errors(out, ref).median())
                    rows.append(dict(testbed="gmm", guidance=w, variant=label(sampler, options), schedule=sched,
                                     nfe=nfe, rms_median=float(f"{e:.3g}")))  # fmt: skip
        log(f"gmm w={w:g} done")
    return rows


def _get(rows, **key):
    return next(r for r in rows if all(r[k] == v for k, v in key.items()))


def auto_table(rows, testbed: str, metrics: tuple[str, ...]) -> list[dict]:
    """Per guidance and NFE, each variant on the ``"auto"`` schedule (one column per variant and metric)."""
    out = []
    for w in (GUIDANCE, 1.0):
        for nfe in NFES:
            row = {"guidance": w, "nfe": nfe, "schedule": auto_schedule(nfe)}
            for sampler, options in VARIANTS:
                r = _get(
                    rows,
                    testbed=testbed,
                    guidance=w,
                    variant=label(sampler, options),
                    schedule=auto_schedule(nfe),
                    nfe=nfe,
                )
                for m in metrics:
                    row[f"{label(sampler, options).replace('unipc ', '')} {m}"] = r[m]
            out.append(row)
    return out


def verdict(rows) -> dict:
    wins_mean = wins_worst = 0
    for nfe in NFES:
        key = dict(testbed="tiny", guidance=GUIDANCE, schedule=auto_schedule(nfe), nfe=nfe)
        o1, o2 = _get(rows, variant="unipc order 1", **key), _get(rows, variant="unipc order 2", **key)
        wins_mean += o1["psnr_mean"] > o2["psnr_mean"]
        wins_worst += o1["psnr_worst"] >= o2["psnr_worst"]
    chosen = 1 if wins_mean >= 4 and wins_worst >= 4 else 2
    return {
        "order1_higher_mean_at": wins_mean,
        "order1_worst_no_lower_at": wins_worst,
        "default_order": chosen,
    }


def main():
    t0 = time.perf_counter()
    log = lambda s: print(s, flush=True)
    load = os.getloadavg()
    rows = run_tiny(log) + run_gmm(log)
    meta = env_info()
    meta.update(wall_seconds=round(time.perf_counter() - t0), load_before=load, load_after=os.getloadavg())
    v = verdict(rows)
    (RESULTS_DIR / f"{NAME}.json").write_text(
        json.dumps({"meta": meta, "verdict": v, "rows": rows}, indent=1) + "\n"
    )
    md = [
        f"# {NAME}",
        "",
        hardware_line(meta),
        "",
        f"Generated by `benchmarks/{NAME}.py` (its docstring has the protocol and the rule). {meta['wall_seconds']} s; "
        f"load average {', '.join(f'{x:.2f}' for x in load)} before, "
        f"{', '.join(f'{x:.2f}' for x in meta['load_after'])} after.",
        "",
        "## Verdict",
        "",
        f'On fastdiff-tiny with guidance {GUIDANCE:g} and the `"auto"` schedule, UniPC order 1 has the higher mean '
        f"PSNR at {v['order1_higher_mean_at']} of {len(NFES)} NFEs and a worst image no lower at "
        f"{v['order1_worst_no_lower_at']}: by the rule, the default `solver_order` is **{v['default_order']}**.",
        "",
        f'## fastdiff-tiny, {PROMPTS} held-out prompts, `"auto"` schedule: PSNR mean / worst (dB) and attributes',
        "",
        markdown_table(auto_table(rows, "tiny", ("psnr_mean", "psnr_worst", "attr_all"))),
        "",
        '## Exact mixture, `"auto"` schedule: median RMS against the exact ODE solution',
        "",
        markdown_table(auto_table(rows, "gmm", ("rms_median",))),
        "",
        "## Every row (both schedules)",
        "",
        markdown_table(rows),
    ]
    (RESULTS_DIR / f"{NAME}.md").write_text("\n".join(md) + "\n")
    log(f"wrote {RESULTS_DIR / f'{NAME}.md'}: {v}")


if __name__ == "__main__":
    main()
