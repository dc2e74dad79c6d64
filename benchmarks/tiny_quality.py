"""Prompt adherence of fastdiff-tiny, measured by the attribute checker, run as a ``fastdiff.sweep``.

Teacher with DPM-Solver++ (diffusers' ``DPMSolverMultistepScheduler``, 30 steps,
guidance 5) and the LCM student (``LCMScheduler``, 1/2/4 steps, guidance-scale
input 5) on every HELD-OUT prompt combination (colour pairs never seen in
training) and on as many training combinations; the checker's own accuracy on
ground-truth images is the first row. Image i of each split is seeded with i.

    python benchmarks/tiny_quality.py [--weights DIR] [--out-name tiny_quality] [--sweep-dir DIR]

The generation is a sweep (resumable: re-running with the same ``--sweep-dir`` skips finished images; also
runs under ``torchrun --nproc_per_node N``). Writes ``benchmarks/results/<out-name>.{json,md}`` and a
sample grid PNG.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np
from PIL import Image

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from benchmarks._common import env_info, write_results  # noqa: E402
from fastdiff.metrics import checker_accuracy, neighbour_difference  # noqa: E402
from fastdiff.sweep import sweep  # noqa: E402
from fastdiff.tiny import data as D  # noqa: E402

GUIDANCE = 5.0
TEACHER = "teacher DPM-Solver++"
STUDENT_STEPS = (4, 2, 1)


def quality_spec(n_train: int = 72, limit: int | None = None) -> dict:
    """The benchmark as a sweep spec: two prompt groups, image i of a group seeded with i."""
    return {
        "pipeline": "fastdiff-tiny",
        "prompts": {
            "groups": {
                "heldout": {"tiny": "heldout", "phrasing": "short", "limit": limit},
                "train": {"tiny": "train", "n": n_train, "seed": 7, "limit": limit},
            }
        },
        "seeds": [0],
        "seed_per_prompt": True,
        "guidance": GUIDANCE,
        "batch_size": 36,
        "metrics": ["attributes", "nfe", "wall_s"],
        "configs": [{"name": TEACHER, "sampler": "diffusers:DPMSolverMultistepScheduler", "steps": 30}]
        + [{"name": f"LCM student {s}", "pipeline": "fastdiff-tiny:lcm", "steps": s} for s in STUDENT_STEPS],
    }


def _row(model, split, steps, rows, folder) -> dict:
    images = np.stack([np.asarray(Image.open(os.path.join(folder, r["image"]))) for r in rows])
    plain = np.array([D.parse_prompt(r["prompt"]).texture == "plain" for r in rows])
    hf = neighbour_difference(images).numpy()
    return {
        "model": model,
        "split": split,
        "steps": steps,
        **{
            k: float(np.mean([r[f"attr_{k}"] for r in rows]))
            for k in ("shape_colour", "bg_colour", "shape", "all")
        },
        "n": len(rows),
        "hf_plain": float(hf[plain].mean()),
        "hf_textured": float(hf[~plain].mean()),
        "wall_s": float(sum(r["wall_s"] for r in rows)),
    }


def evaluate(sweep_dir: str, n_train: int = 72, limit: int | None = None):
    acc = checker_accuracy(600)
    real, real_attrs = D.make_dataset(600, seed=1234, split="all")
    plain = np.array([a.texture == "plain" for a in real_attrs])
    hf = neighbour_difference(real).numpy()
    table = [
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
    result = sweep(quality_spec(n_train, limit), sweep_dir)
    if result is None:  # not the main process of a multi-process run
        return None, None
    for cfg in [TEACHER] + [f"LCM student {s}" for s in STUDENT_STEPS]:
        model, steps = (TEACHER, 30) if cfg == TEACHER else ("LCM student", int(cfg.split()[-1]))
        for split in ("heldout", "train"):
            rows = [r for r in result.rows if r["config"] == cfg and r["group"] == split]
            table.append(_row(model, split, steps, rows, sweep_dir))
            print(table[-1], flush=True)
    return table, result


def save_grid(result, folder, path, per_row=12):
    strips = []
    for cfg in dict.fromkeys(r["config"] for r in result.rows):
        rows = [r for r in result.rows if r["config"] == cfg and r["group"] == "heldout"][:per_row]
        strips.append(
            np.concatenate([np.asarray(Image.open(os.path.join(folder, r["image"]))) for r in rows], axis=1)
        )
    Image.fromarray(np.concatenate(strips, axis=0)).save(path)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--weights", default=None, help="weights root (default: the shipped fastdiff/tiny/weights)"
    )
    p.add_argument("--out-name", default="tiny_quality")
    p.add_argument("--limit", type=int, default=None, help="prompts per split (smoke runs)")
    p.add_argument("--sweep-dir", default=None, help="sweep folder (resumable; default: a temporary folder)")
    args = p.parse_args(argv)
    if args.weights:
        os.environ["FASTDIFF_TINY_WEIGHTS"] = args.weights
    sweep_dir = args.sweep_dir or os.path.join(tempfile.gettempdir(), "fastdiff-bench", args.out_name)
    rows, result = evaluate(sweep_dir, limit=args.limit)
    if rows is None:
        return
    notes = (
        f"Attribute accuracy (fraction of images) on all {len(D.list_attributes('heldout'))} held-out prompt "
        f"combinations (colour pairs {sorted(D.HELDOUT_PAIRS)} never seen in training) and 72 training combinations; "
        f"seed i for image i. Teacher: DPMSolverMultistepScheduler (DPM-Solver++ 2M), guidance {GUIDANCE}. "
        f"LCM student: LCMScheduler, guidance-scale input {GUIDANCE} (no CFG pass). Targets (held-out): "
        "shape colour >= 0.80, background colour >= 0.90, LCM 4-step within 10 points of the teacher. "
        "hf_plain / hf_textured: mean absolute neighbour-pixel difference (0-255) of images whose prompt "
        "has a plain / textured background (how busy they look; fastdiff.metrics.neighbour_difference). "
        "wall_s: generation time of the split on a shared 2-core CPU (indicative only). Generated by "
        "fastdiff.sweep (batches of 36, prompt embeddings computed once per prompt)."
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
    save_grid(result, sweep_dir, str(jpath).replace(".json", "_samples.png"))
    print(open(str(jpath).replace(".json", ".md")).read())


if __name__ == "__main__":
    main()
