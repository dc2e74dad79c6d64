"""Calibrated step table for ``steps="auto"`` (written by ``benchmarks/dynamic_steps.py --phase calibrate``).

``signal``: what AutoSteps reads after ``probe_steps`` steps of the 8-step schedule; for each prompt
tier, [(upper bound of the signal, steps), ...]: the most steps any calibration image in that bin (or a
lower one) needed to reach ``psnr_target_db`` against its reference (``meta``). ``meta`` records the
rank correlation of every candidate signal with that need (see ``results/dynamic_steps.md``).
"""

import math

TABLE = {
    "signal": "tier",
    "sign": 1,
    "probe_steps": 1,
    "tiers": {"simple": [[math.inf, 25]], "neutral": [[math.inf, 25]], "detailed": [[math.inf, 25]]},
    "meta": {
        "psnr_target_db": 30.0,
        "reference": "reference dpmpp_2m karras 200 variance, same noise",
        "candidates": [8, 10, 12, 13, 16, 20, 25],
        "chosen_signal": "none",
        "dropped": None,
        "spearman_train": {
            "tier": -0.049,
            "hf_energy@2": 0.052,
            "hf_energy@3": -0.037,
            "x0_contrast@2": 0.302,
            "x0_contrast@3": 0.255,
            "x0_change@1-2": 0.13,
            "x0_change@2-3": 0.111,
        },
        "guidance_scale": 5.0,
        "prompts": "24 train-split images (sample_attributes(24, seed=7, split='train'), seed 3000 + i)",
        "measured": "2026-12-04 18:26 UTC",
        "weights": "shipped fastdiff/tiny/weights",
    },
}
