"""Calibrated step table for ``steps="auto"`` (written by ``benchmarks/dynamic_steps.py --calibrate``).

For each prompt tier: [(upper bound of the probe's high-frequency energy, steps), ...]. Each entry is the
smallest step count of DPM-Solver++(2M) whose decoded image reached the PSNR target against the
30-step image for every calibration prompt in that energy bin (and the bins below it).
"""

TABLE = {
    "tiers": {
        "simple": [[0.322134, 12], [0.50962, 12], [1.0, 15]],
        "neutral": [[0.330716, 10], [0.511253, 12], [1.0, 12]],
        "detailed": [[0.34052, 20], [0.445864, 30], [1.0, 30]],
    },
    "meta": {
        "psnr_target_db": 30.0,
        "candidates": [8, 10, 12, 15, 20, 25, 30],
        "probe_steps": 2,
        "min_steps": 8,
        "guidance_scale": 5.0,
        "prompts": 48,
        "measured": "2026-12-02 15:36 UTC",
        "weights": "/tmp/fastdiff_tiny_weights",
    },
}
