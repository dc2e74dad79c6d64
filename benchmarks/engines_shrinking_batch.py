"""OpenVINO engines when rows leave the batch: one static compile per batch size, or one dynamic-batch model.

fastdiff's OpenVINO runner compiles a static model per input shape (faster kernels than a dynamic one). With
``early_stop=`` or per-row step counts, rows leave the batch as they finish, so every new batch size used to
cost a compile inside the sampling loop. The runner now compiles one model with a dynamic batch axis the first
time a shape comes back with a smaller batch than compiled, and uses it for every such batch.

Two measurements, in one process each:

1. **Per U-Net step** (``--model sd15-full`` at 256^2, random weights, fp32 engine; and ``tiny``): the fully
   static model against the dynamic-batch one at the same batch and at a smaller one, round-robin; plus the
   seconds each compile took (what a new static batch size costs).
2. **End to end** (``tiny``, shipped weights, 8 held-out prompts, ``steps="quality"``, guidance 5): fixed 20
   steps, and ``early_stop={"rtol": 0.2, "patience": 1}`` with a static compile per batch size (the previous
   behaviour, emulated by making the runner forget the shapes it saw) and with the dynamic-batch model.

Run:  flock /tmp/fastdiff-heavy.lock python benchmarks/engines_shrinking_batch.py --model sd15-full
      flock /tmp/fastdiff-heavy.lock python benchmarks/engines_shrinking_batch.py --model tiny
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import env_info, load_average, time_pair, write_results  # noqa: E402
from benchmarks.engines import make_pipeline  # noqa: E402
from fastdiff import compile_engine  # noqa: E402
from fastdiff.unet_inputs import unet_signature  # noqa: E402


def per_step(pipe, side: int, batch: int, smaller: int, reps: int, cache_dir: str) -> list[dict]:
    from fastdiff.engines.runtime_ov import numpy_feed

    engine = compile_engine(pipe.unet, backend="openvino", precision="fp32", cache_dir=cache_dir)
    runner, sig = engine.runner, unet_signature(pipe.unet)
    latent = side // pipe.vae_scale_factor

    def compiled(shapes):
        model = runner.model.clone()
        model.reshape(shapes)
        t0 = time.perf_counter()
        req = runner.core.compile_model(model, "CPU", runner.config).create_infer_request()
        return req, time.perf_counter() - t0

    rows = []
    for b in (batch, smaller):
        record = sig.example_inputs(b, latent, latent, generator=torch.Generator().manual_seed(b))
        feed = numpy_feed(record, runner.input_names)
        static, static_compile = compiled({n: list(feed[n].shape) for n in runner.input_names})
        dynamic, dynamic_compile = compiled({n: [-1, *feed[n].shape[1:]] for n in runner.input_names})
        t_static, t_dynamic = time_pair(
            lambda s=static, f=feed: s.infer(f), lambda d=dynamic, f=feed: d.infer(f), reps=reps
        )
        rows.append(
            {
                "batch": b,
                "static_step_s": round(t_static, 4),
                "dynamic_batch_step_s": round(t_dynamic, 4),
                "dynamic_over_static": round(t_dynamic / t_static, 3),
                "static_compile_s": round(static_compile, 2),
                "dynamic_compile_s": round(dynamic_compile, 2),
            }
        )
        print(rows[-1], flush=True)
    return rows


def end_to_end(reps: int, cache_dir: str) -> list[dict]:
    import fastdiff
    from fastdiff.sweep.prompts import prompts_of

    prompts = [p.text for p in prompts_of({"prompts": {"tiny": "heldout", "limit": 8}})]
    pipe = fastdiff.StableDiffusionPipeline.from_pipe(fastdiff.tiny.load_pipeline("base"))
    pipe.set_progress_bar_config(disable=True)
    engine = fastdiff.compile_engine(pipe, backend="openvino", precision="fp32", cache_dir=cache_dir)
    runner = engine.runner
    rows = []
    for label, kw, forget in (
        ("fixed 20 steps", {}, False),
        (
            "early stop, static compile per batch size (before)",
            {"early_stop": {"rtol": 0.2, "patience": 1}},
            True,
        ),
        ("early stop, dynamic-batch model (now)", {"early_stop": {"rtol": 0.2, "patience": 1}}, False),
    ):
        times = []
        for _ in range(reps):
            full = {
                k: v for k, v in runner._compiled.items() if k != () and k[0] != "any batch" and k[0][0] == 16
            }
            runner._compiled, runner._largest = dict(full), {}  # keep only the full batch's static model
            real = runner._request
            if forget:  # the previous behaviour: every shape compiles statically

                def request(feed, _real=real):
                    runner._largest.clear()  # every batch size is "new": a static compile each
                    return _real(feed)

                runner._request = request
            t0 = time.perf_counter()
            out = pipe(
                prompts, steps="quality", generator=[torch.Generator().manual_seed(i) for i in range(8)], **kw
            )
            times.append(time.perf_counter() - t0)
            runner._request = real
        rows.append(
            {
                "run": label,
                "mean_nfe": sum(out.fastdiff.nfe_per_sample) / len(prompts),
                "wall_s_median": round(sorted(times)[len(times) // 2], 3),
                "wall_s_all": [round(t, 3) for t in times],
            }
        )
        print(rows[-1], flush=True)
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny", choices=["tiny", "sd15-full"])
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args()
    load = load_average()
    t0 = time.time()
    pipe, side = make_pipeline(args.model, 256 if args.model != "tiny" else None)
    with tempfile.TemporaryDirectory(prefix="fastdiff-shrinking-batch-") as cache_dir:  # SD1.5: several GB
        rows = per_step(
            pipe,
            side,
            batch=4 if args.model != "tiny" else 16,
            smaller=2 if args.model != "tiny" else 6,
            reps=args.reps,
            cache_dir=cache_dir,
        )
        e2e = end_to_end(args.reps, cache_dir) if args.model == "tiny" else []
    meta = env_info()
    meta.update(
        model=args.model,
        side=side,
        load_before=load,
        load_after=load_average(),
        wall_s=round(time.time() - t0),
    )
    notes = (
        f"`benchmarks/engines_shrinking_batch.py --model {args.model}`: OpenVINO fp32 engine, {side}^2 images, "
        f"{args.reps} round-robin repetitions, threads {torch.get_num_threads()}; load {load} before, "
        f"{meta['load_after']} after; {meta['wall_s']} s. Per step: the fully static model against the one with a "
        "dynamic batch axis (static elsewhere), each compiled once; compile seconds are what a new batch size "
        "cost before (static) and costs once now (dynamic)."
    )
    if e2e:
        from benchmarks._common import markdown_table

        notes += "\n\nEnd to end (8 held-out prompts, steps='quality', guidance 5):\n\n" + markdown_table(e2e)
        notes += "\nPer step:"
    write_results(f"engines-shrinking-batch-{args.model}", rows, meta, notes=notes)
    print(f"wrote engines-shrinking-batch-{args.model}")


if __name__ == "__main__":
    main()
