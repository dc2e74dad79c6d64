"""Prompt adherence of fastdiff-tiny, measured by the attribute checker.

Teacher with DPM-Solver++ (diffusers' ``DPMSolverMultistepScheduler``, 30 steps,
guidance 5) and the LCM student (``LCMScheduler``, 1/2/4 steps, guidance-scale
input 5) on every HELD-OUT prompt combination (colour pairs never seen in
training) and on as many training combinations; the checker's own accuracy on
ground-truth images is the first row.

    python benchmarks/tiny_quality.py [--weights DIR] [--out-name tiny_quality]

Writes ``benchmarks/results/<out-name>.{json,md}`` and a sample grid PNG.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from benchmarks._common import env_info, write_results  # noqa: E402
from fastdiff.metrics import checker_accuracy, score  # noqa: E402
from fastdiff.tiny import data as D  # noqa: E402
from fastdiff.tiny import load_pipeline  # noqa: E402

GUIDANCE = 5.0


def generate(pipe, prompts, steps, guidance, seed=0, batch=36):
    """Images (uint8 NHWC) for `prompts`, image i seeded with seed + i."""
    out = []
    for i in range(0, len(prompts), batch):
        chunk = prompts[i : i + batch]
        gens = [torch.Generator("cpu").manual_seed(seed + i + j) for j in range(len(chunk))]
        res = pipe(
            chunk, num_inference_steps=steps, guidance_scale=guidance, generator=gens, output_type="np"
        )
        out.append((res.images * 255).round().astype(np.uint8))
    return np.concatenate(out)


def high_frequency_energy(images: np.ndarray) -> np.ndarray:
    """Mean absolute difference of neighbouring pixels (0-255 scale) per image: how busy it looks."""
    x = images.astype(np.float64)
    return np.abs(np.diff(x, axis=1)).mean(axis=(1, 2, 3)) + np.abs(np.diff(x, axis=2)).mean(axis=(1, 2, 3))


def evaluate(weights_root=None, n_train=72, limit=None):
    from diffusers import DPMSolverMultistepScheduler

    acc = checker_accuracy(600)
    real, real_attrs = D.make_dataset(600, seed=1234, split="all")
    plain = np.array([a.texture == "plain" for a in real_attrs])
    hf = high_frequency_energy(real)
    rows = [
        {
            "model": "ground truth (checker self-test)",
            "split": "all",
            "steps": 0,
            **acc,
            "hf_plain": float(hf[plain].mean()),
            "hf_textured": float(hf[~plain].mean()),
            "wall_s": None,
        }
    ]
    held = [a for _, a in D.list_prompts("heldout", phrasing="short")][:limit]
    train = D.sample_attributes(n_train, seed=7, split="train")[:limit]
    sets = {"heldout": held, "train": train}
    samples = {}

    teacher = load_pipeline("base", weights_root=weights_root)
    teacher.scheduler = DPMSolverMultistepScheduler.from_config(teacher.scheduler.config)
    student = load_pipeline("lcm", weights_root=weights_root)
    configs = [("teacher DPM-Solver++", teacher, 30)] + [("LCM student", student, s) for s in (4, 2, 1)]
    for name, pipe, steps in configs:
        for split, attrs in sets.items():
            t0 = time.perf_counter()
            images = generate(pipe, [a.prompt for a in attrs], steps, GUIDANCE)
            wall = time.perf_counter() - t0
            plain = np.array([a.texture == "plain" for a in attrs])
            hf = high_frequency_energy(images)
            rows.append(
                {
                    "model": name,
                    "split": split,
                    "steps": steps,
                    **score(images, attrs),
                    "hf_plain": float(hf[plain].mean()),
                    "hf_textured": float(hf[~plain].mean()),
                    "wall_s": wall,
                }
            )
            samples[(name, steps, split)] = images
            print(rows[-1], flush=True)
    return rows, samples


def save_grid(samples, path, per_row=12):
    from PIL import Image

    strips = [imgs[:per_row] for key, imgs in samples.items() if key[2] == "heldout"]
    grid = np.concatenate([np.concatenate(list(s), axis=1) for s in strips], axis=0)
    Image.fromarray(grid).save(path)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--weights", default=None, help="weights root (default: the shipped fastdiff/tiny/weights)"
    )
    p.add_argument("--out-name", default="tiny_quality")
    p.add_argument("--limit", type=int, default=None, help="prompts per split (smoke runs)")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    rows, samples = evaluate(args.weights, limit=args.limit)
    notes = (
        f"Attribute accuracy (fraction of images) on all {len(D.list_attributes('heldout'))} held-out prompt "
        f"combinations (colour pairs {sorted(D.HELDOUT_PAIRS)} never seen in training) and 72 training combinations; "
        f"seed i for image i. Teacher: DPMSolverMultistepScheduler (DPM-Solver++ 2M), guidance {GUIDANCE}. "
        f"LCM student: LCMScheduler, guidance-scale input {GUIDANCE} (no CFG pass). Targets (held-out): "
        "shape colour >= 0.80, background colour >= 0.90, LCM 4-step within 10 points of the teacher. "
        "hf_plain / hf_textured: mean absolute neighbour-pixel difference (0-255) of images whose prompt "
        "has a plain / textured background (how busy they look). "
        "wall_s: whole-batch generation time on a shared 2-core CPU (indicative only)."
    )
    columns = [
        "model",
        "split",
        "steps",
        "shape_colour",
        "bg_colour",
        "shape",
        "all",
        "n",
        "hf_plain",
        "hf_textured",
    ]
    columns.append("wall_s")
    jpath, _ = write_results(args.out_name, rows, env_info(), columns, notes)
    save_grid(samples, str(jpath).replace(".json", "_samples.png"))
    print(open(str(jpath).replace(".json", ".md")).read())


if __name__ == "__main__":
    main()
