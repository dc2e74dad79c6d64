"""``fastdiff demo``: the baseline and fastdiff's faster ways to sample, side by side.

Runs fastdiff-tiny (the small trained model shipped in the package) on a few
prompts, simple and textured, through a list of named *configurations*:

* ``baseline``: the pipeline's default scheduler (PNDM, as Stable Diffusion ships) at 50 steps;
* fastdiff samplers at few steps (:func:`fastdiff.make_scheduler`);
* ``lcm-draft``: the LCM-distilled student at 4 steps.

and writes a labelled PNG grid (one row per configuration), ``demo.json`` and
``demo.md`` (wall time, U-Net evaluations per image, PSNR/SSIM against the
baseline, prompt-attribute accuracy) into ``--out`` (default ``./fastdiff-out``).

A configuration (:data:`CONFIGS`) is a function ``fn(ctx) -> images`` where ``ctx`` is a
:class:`DemoContext` (pipelines, prompts, seeds); U-Net evaluations are counted by the
context, not declared.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

DEFAULT_PROMPTS = (
    "a red circle on a blue background",
    "a yellow triangle on a striped purple background",
    "a white square on a checkered green background",
    "a blue circle on a noisy yellow background",
)
GUIDANCE = 5.0


@dataclass
class DemoContext:
    """What a configuration gets: the prompts, seeds and (lazily loaded) pipelines."""

    prompts: list[str]
    seed: int = 0
    guidance_scale: float = GUIDANCE
    quick: bool = False
    _pipes: dict = field(default_factory=dict)
    _counters: list = field(default_factory=list)

    def pipe(self, variant: str = "base"):
        """The fastdiff-tiny pipeline `variant` ("base" or "lcm"), its U-Net instrumented to count calls."""
        if variant not in self._pipes:
            from fastdiff.pipelines.unet_calls import UNetCalls
            from fastdiff.tiny import load_pipeline

            pipe = load_pipeline(variant)
            pipe(self.prompts[:1], num_inference_steps=1, output_type="latent")  # warm-up, untimed
            self._counters.append(UNetCalls(pipe.unet))
            self._pipes[variant] = (pipe, pipe.scheduler)
        pipe, default_scheduler = self._pipes[variant]
        pipe.scheduler = default_scheduler  # each configuration starts from the shipped scheduler
        return pipe

    def unet_evals_per_image(self) -> float:
        """U-Net evaluations per image since :meth:`reset_counts` (a guided call counts two)."""
        return sum(c.rows for c in self._counters) / len(self.prompts)

    def reset_counts(self) -> None:
        for c in self._counters:
            c.reset()

    def generators(self) -> list[torch.Generator]:
        return [torch.Generator("cpu").manual_seed(self.seed + i) for i in range(len(self.prompts))]

    def run(self, pipe, /, **keywords) -> np.ndarray:
        """Generate one image per prompt with these pipeline keywords (CFG scale: the context's by
        default); uint8 NHWC."""
        keywords.setdefault("guidance_scale", self.guidance_scale)
        out = pipe(self.prompts, generator=self.generators(), output_type="np", **keywords)
        return (out.images * 255).round().astype(np.uint8)


@dataclass(frozen=True)
class Config:
    name: str
    description: str
    fn: Callable[[DemoContext], np.ndarray]


# ----------------------------------------------------------------------------- built-in rows


def _baseline(ctx: DemoContext) -> np.ndarray:
    return ctx.run(ctx.pipe("base"), num_inference_steps=10 if ctx.quick else 50)


def _fast_sampler(name: str, steps: int, schedule: str, **options):
    def fn(ctx: DemoContext) -> np.ndarray:
        from fastdiff.samplers import make_scheduler

        pipe = ctx.pipe("base")
        pipe.scheduler = make_scheduler(name, like=pipe.scheduler, schedule=schedule, **options)
        return ctx.run(pipe, num_inference_steps=steps)

    return fn


def _dynamic(**options):
    """A row run through fastdiff's drop-in pipeline with dynamic-step keywords."""

    def fn(ctx: DemoContext) -> np.ndarray:
        from fastdiff.pipelines import StableDiffusionPipeline

        pipe = StableDiffusionPipeline.from_pipe(ctx.pipe("base"))  # shares the counted U-Net
        opts = dict(options)
        if ctx.quick and opts.get("steps") == "quality":
            opts["steps"] = "fast"
        if "draft" in opts:
            opts["draft"] = {**opts["draft"], "model": ctx.pipe("lcm")}
        return ctx.run(pipe, **opts)

    return fn


def _lcm_draft(ctx: DemoContext) -> np.ndarray:
    return ctx.run(ctx.pipe("lcm"), num_inference_steps=4)


# the first row (``baseline``) is the reference of the PSNR/SSIM columns
CONFIGS = (
    Config("baseline", "diffusers default scheduler (PNDM), 50 steps, CFG 5", _baseline),
    Config(
        "dpmpp_2m-10",
        "fastdiff DPM-Solver++(2M), 10 steps, default schedule ('auto': trailing at <= 10 steps)",
        _fast_sampler("dpmpp_2m", 10, "auto"),
    ),
    Config(  # order 1: the better UniPC under guidance at <= 15 steps (fastdiff/samplers/README.md)
        "unipc-8",
        "fastdiff UniPC-1 with the UniC corrector, 8 steps, default schedule ('auto')",
        _fast_sampler("unipc", 8, "auto", solver_order=1),
    ),
    Config("lcm-draft", "LCM-distilled student, 4 steps (guidance is a U-Net input)", _lcm_draft),
    Config(
        "early-stop",
        "DPM-Solver++(2M) 20 steps ('quality'), per-image early stop (x0 change < 1% twice, sigma <= 1)",
        _dynamic(steps="quality", early_stop=True),
    ),
    Config(
        "auto-steps",
        "steps='auto': the calibrated table's step count (no per-image signal predicted need)",
        _dynamic(steps="auto"),
    ),
    Config(
        "lcm-draft+refine",
        "LCM 4 steps, x0 re-noised to 75%, last 15 of 20 DPM-Solver++(2M) steps",
        _dynamic(steps="quality", draft={"strength": 0.75, "steps": 4}),
    ),
)


# ----------------------------------------------------------------------------- report


def _grid(rows: list[tuple[str, np.ndarray]], prompts: list[str], scale: int = 2) -> Image.Image:  # noqa: F821
    from PIL import Image, ImageDraw

    size = rows[0][1].shape[1] * scale
    label_w, head_h = 170, 48
    grid = Image.new("RGB", (label_w + size * len(prompts), head_h + size * len(rows)), "white")
    draw = ImageDraw.Draw(grid)
    for j, p in enumerate(prompts):
        words = p.split()
        third = max(1, -(-len(words) // 3))
        for k in range(3):  # the prompt over three lines so it fits its column
            draw.text(
                (label_w + j * size + 2, 2 + 14 * k),
                " ".join(words[k * third : (k + 1) * third]),
                fill="black",
            )
    for i, (label, imgs) in enumerate(rows):
        y = head_h + i * size
        for k, line in enumerate(label.split("\n")):
            draw.text((4, y + 4 + 14 * k), line, fill="black")
        for j, im in enumerate(imgs):
            grid.paste(Image.fromarray(im).resize((size, size), Image.NEAREST), (label_w + j * size, y))
    return grid


def run_demo(prompts=DEFAULT_PROMPTS, out_dir="fastdiff-out", quick=False, seed=0, only=None) -> list[dict]:
    """Run every registered configuration; write grid/json/md into `out_dir`; return the table rows."""
    from fastdiff.metrics import psnr, score, ssim
    from fastdiff.tiny.data import parse_prompt

    prompts = list(prompts)
    try:
        attrs = [parse_prompt(p) for p in prompts]
    except ValueError:
        attrs = None  # free-form prompts: no attribute accuracy
    ctx = DemoContext(prompts=prompts, seed=seed, quick=quick)
    selected = [c for c in CONFIGS if only is None or c.name in only or c.name == "baseline"]
    rows, images = [], []
    reference = None
    for cfg in selected:
        ctx.pipe("base")  # load outside the timed region
        if cfg.name.startswith("lcm"):
            ctx.pipe("lcm")
        ctx.reset_counts()
        t0 = time.perf_counter()
        imgs = cfg.fn(ctx)
        wall = time.perf_counter() - t0
        if reference is None:
            reference = imgs
        row = {
            "config": cfg.name,
            "description": cfg.description,
            "unet_evals_per_image": round(ctx.unet_evals_per_image(), 2),
            "wall_s": round(wall, 3),
            "psnr_vs_baseline_db": psnr(imgs, reference),
            "ssim_vs_baseline": ssim(imgs, reference),
        }
        if attrs is not None:
            s = score(imgs, attrs)
            row.update({f"attr_{k}": s[k] for k in ("shape_colour", "bg_colour", "shape")})
        rows.append(row)
        images.append((f"{cfg.name}\n{row['unet_evals_per_image']:g} UNet evals\n{wall:.2f} s", imgs))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _grid(images, prompts).save(out / "demo.png")
    summary = {"prompts": prompts, "seed": seed, "guidance_scale": ctx.guidance_scale, "rows": rows}
    (out / "demo.json").write_text(json.dumps(summary, indent=2))
    (out / "demo.md").write_text(_markdown(rows, prompts))
    return rows


def _markdown(rows: list[dict], prompts: list[str]) -> str:
    cols = [c for c in rows[0] if c != "description"]
    fmt = lambda v: f"{v:.3g}" if isinstance(v, float) else str(v)
    lines = [
        "# fastdiff demo (fastdiff-tiny, CPU)",
        "",
        "Prompts: " + "; ".join(prompts),
        "",
        "PSNR/SSIM compare each row's images with the baseline's (same seeds); unet_evals_per_image counts",
        "classifier-free guidance as two evaluations.",
        "",
        "| " + " | ".join(cols) + " |",
        "|" + "---|" * len(cols),
    ]
    lines += ["| " + " | ".join(fmt(r.get(c)) for c in cols) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="fastdiff demo",
        description=__doc__.split("\n\n")[0].replace("``", ""),  # no RST in --help
    )
    p.add_argument("--out", default="fastdiff-out", help="output folder (default ./fastdiff-out)")
    p.add_argument(
        "--prompt", action="append", dest="prompts", help="prompt (repeatable); default: 4 built-in prompts"
    )
    p.add_argument("--quick", action="store_true", help="1 prompt, 10-step baseline: a smoke run")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--only", nargs="*", help="configuration names to run (baseline always runs)")
    args = p.parse_args(argv)
    if args.only is not None:  # no names, or a name no configuration has, fails before any generation
        names = [c.name for c in CONFIGS]
        if not args.only:
            p.error(f"--only needs at least one configuration name; valid: {', '.join(names)}")
        unknown = [n for n in args.only if n not in names]
        if unknown:
            p.error(f"--only: unknown configuration(s) {unknown}; valid: {', '.join(names)}")
    from fastdiff.cli import writable_dir

    problem = writable_dir(args.out, "--out")
    if problem is not None:
        p.error(problem)  # before any generation
    prompts = args.prompts or (list(DEFAULT_PROMPTS[:1]) if args.quick else list(DEFAULT_PROMPTS))
    rows = run_demo(prompts, args.out, quick=args.quick, seed=args.seed, only=args.only)
    print(Path(args.out, "demo.md").read_text())
    print(f"grid: {os.path.join(args.out, 'demo.png')}")
    return 0 if rows else 1


if __name__ == "__main__":
    raise SystemExit(main())
