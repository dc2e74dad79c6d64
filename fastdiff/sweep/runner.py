"""Running a sweep on one process or many (accelerate / torchrun), resumably.

Order of work, the same on every process:

1. validate the spec (no model loaded yet) and check it against the folder's recorded spec;
2. the reference configuration's items (its images are computed once, saved, and read back by every
   process for the fidelity metrics of the other configurations);
3. all other configurations, one at a time, so a process holds one pipeline state at a time; each is set up
   once per process (sampler, ``optimize``, engine, step cache: :func:`~fastdiff.sweep.setup.configured`) for all
   its batches there, and undone after them.

Each configuration's batches (:func:`fastdiff.sweep.store.chunks_of`) are split between processes with
``accelerate.PartialState().split_between_processes``. Every process scans which items are finished, then
all wait at a barrier before anyone writes, so they all see the same list. A batch with any unfinished item
is recomputed whole (the same batch, so the same bits) and only its unfinished items are written.
"""

from __future__ import annotations

import platform
import resource
import time
from contextlib import contextmanager

import numpy as np
import torch

from fastdiff.sweep.embeddings import EmbeddingCache
from fastdiff.sweep.setup import Pipelines, configured, timed_module, uses_cfg
from fastdiff.sweep.spec import Spec, parse_spec
from fastdiff.sweep.store import Item, Store, chunks_of


def process_state(spec: Spec):
    """accelerate's process state; gloo on CPU-only machines, NCCL under ``--multi_gpu``."""
    from accelerate import PartialState

    cpu = spec.device == "cpu" or (spec.device == "auto" and not torch.cuda.is_available())
    return PartialState(cpu=cpu)


def environment() -> dict:
    from fastdiff._compat import cpu_model, version_of

    env = {
        "fastdiff": version_of("fastdiff"),
        "torch": torch.__version__,
        "diffusers": version_of("diffusers"),
        "python": platform.python_version(),
        "cpu": cpu_model(),
        "torch_threads": torch.get_num_threads(),
        "host": platform.node(),
    }
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name()
    return env


class _UNetTimer:
    """Seconds spent inside the denoiser's forward (hooks; CUDA is synchronised at both ends)."""

    def __init__(self):
        self.seconds = 0.0
        self._t0 = 0.0

    @contextmanager
    def around(self, module):
        if module is None:
            yield
            return
        sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)

        def pre(*_):
            sync()
            self._t0 = time.perf_counter()

        def post(*_):
            sync()
            self.seconds += time.perf_counter() - self._t0

        handles = [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]
        try:
            yield
        finally:
            for h in handles:
                h.remove()


def _peak_memory() -> tuple[float, str]:
    if torch.cuda.is_available():
        return torch.cuda.max_memory_allocated() / 2**20, "cuda max_memory_allocated (MiB)"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "process max RSS so far (MiB)"


def _generate(spec, setup, cache, chunk: list[Item]):
    """One batch's pipeline call: (output, encode seconds, wall seconds, U-Net seconds)."""
    pipe, encoder, kwargs = setup
    prompts = [it.prompt.text for it in chunk]
    generators = [torch.Generator("cpu").manual_seed(it.seed) for it in chunk]
    t_enc = time.perf_counter()
    # steps="auto" reads the prompt text (its keywords pick the step table), so those calls get text
    if encoder is not None and kwargs.get("steps") != "auto":
        call = cache.call_kwargs(
            encoder, prompts, spec.negative_prompt, uses_cfg(pipe, kwargs["guidance_scale"])
        )
    else:
        call = {"prompt": prompts, "negative_prompt": spec.negative_prompt}
    encode_s = time.perf_counter() - t_enc
    timer = _UNetTimer()
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    with timer.around(timed_module(pipe)):
        out = pipe(**call, **kwargs, generator=generators, output_type="np")
    return out, encode_s, time.perf_counter() - t0, timer.seconds


def run_chunk(spec, store, setup, cache, chunk: list[Item], todo: set, refs: dict, env: dict, log) -> int:
    """Generate one batch and write its unfinished items; returns how many were written. ``setup``: what
    :func:`~fastdiff.sweep.setup.configured` gives for the chunk's configuration (pipe, encoder, kwargs)."""
    from fastdiff.metrics import psnr, score, ssim

    config = chunk[0].config
    kwargs = setup[2]
    out, encode_s, wall, unet_s = _generate(spec, setup, cache, chunk)
    images = np.asarray(out.images, dtype=np.float32)
    if images.shape[0] != len(chunk):
        raise RuntimeError(
            f"configuration {config.name!r}: {len(chunk)} prompts gave {images.shape[0]} images"
        )
    uint8 = (images * 255).round().clip(0, 255).astype(np.uint8)
    record = out.fastdiff
    peak, peak_kind = _peak_memory()
    n = len(chunk)
    metrics = {}
    if any(m in spec.metrics for m in ("psnr", "ssim")) and config.name != spec.reference:
        ref = torch.from_numpy(np.stack([refs[it.id] for it in chunk])).permute(0, 3, 1, 2)
        cur = torch.from_numpy(images).permute(0, 3, 1, 2)
        if "psnr" in spec.metrics:
            metrics["psnr"] = psnr(cur, ref, reduction="none").tolist()
            metrics["mse"] = (cur.double() - ref.double()).pow(2).flatten(1).mean(1).tolist()
        if "ssim" in spec.metrics:
            metrics["ssim"] = ssim(cur, ref, reduction="none").tolist()
    if "attributes" in spec.metrics:
        from fastdiff.tiny.data import parse_prompt

        for k in ("shape_colour", "bg_colour", "shape", "all"):
            metrics[f"attr_{k}"] = []
        for j, it in enumerate(chunk):
            s = score(uint8[j : j + 1], [parse_prompt(it.prompt.text)])
            for k in ("shape_colour", "bg_colour", "shape", "all"):
                metrics[f"attr_{k}"].append(s[k])
    cache_run = getattr(record, "step_cache", None)
    if cache_run is not None:  # the batch's run: a guidance pair batched in one U-Net call counts once
        metrics_batch = {
            "cache_full_evals": cache_run.full_evals,
            "cache_cached_evals": cache_run.cached_evals,
            "cache_skipped": cache_run.skipped_fraction,
        }
    else:
        metrics_batch = {}
    written = 0
    for j, it in enumerate(chunk):
        if it.id not in todo:
            continue
        row = {
            "id": it.id,
            "config": config.name,
            **{f"cfg_{k}": v for k, v in config.options.items()},
            "group": it.prompt.group,
            "prompt_index": it.prompt.index,
            "prompt": it.prompt.text,
            "seed": it.seed,
            "guidance": kwargs["guidance_scale"],
            "is_reference": config.name == spec.reference,
            "nfe": record.nfe_per_sample[j],
            "steps": record.num_steps[j] if j < len(record.num_steps) else None,
            "wall_s": wall / n,  # the batch's time, shared equally by its images
            "unet_s": unet_s / n,
            "warmup_calls": spec.warmup,  # untimed calls of this configuration before its timed batches
            "encode_s": encode_s / n,
            "peak_mem_mib": peak,
            "peak_mem_kind": peak_kind,
            "batch": n,
            "batch_first": chunk[0].id,
            **{k: v[j] for k, v in metrics.items()},
            **metrics_batch,
            "image": f"items/{it.stem}.png",
            "env": env,
            "finished": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        }
        keep = spec.save_arrays == "all" or (
            spec.save_arrays == "reference" and config.name == spec.reference
        )
        store.write_item(it, uint8[j], row, images[j] if keep or config.name == spec.reference else None, log)
        written += 1
    return written


def run(spec, out_dir, *, extend: bool = False, progress: bool = True, collate: bool = True):
    """Run (or resume) a sweep into ``out_dir``; see :func:`fastdiff.sweep.sweep`."""
    spec = parse_spec(spec)  # everything checked before any model loads
    state = process_state(spec)
    store = Store(out_dir)
    manifest = store.check(spec, extend)  # every process checks, so every process raises alike
    state.wait_for_everyone()
    if state.is_main_process:
        store.remove_partial_files()
        if manifest is not None:
            store.write_manifest(manifest)
    state.wait_for_everyone()

    pipes = Pipelines(spec, str(state.device) if spec.device == "auto" else spec.device)
    cache = EmbeddingCache(enabled=spec.embedding_cache)
    env = {**environment(), "process_index": state.process_index, "num_processes": state.num_processes}
    ordered = sorted(spec.configs, key=lambda c: c.name != spec.reference)  # the reference first
    written, work_start = 0, time.time()
    with store.event_log(state.process_index) as log:
        for config in ordered:
            chunks = chunks_of(spec, config)
            todo = {it.id for ch in chunks for it in ch if not store.finished(it)}
            state.wait_for_everyone()  # everyone has scanned before anyone writes
            with state.split_between_processes(chunks) as mine:
                mine = [ch for ch in mine if any(it.id in todo for it in ch)]
                bar = _bar(progress, config.name, sum(len(ch) for ch in mine), state)
                # set up once per configuration (an engine compiles, optimize verifies), undone after it
                if mine:
                    with configured(pipes, config) as setup:
                        # untimed: first-call costs (allocator growth, kernel choice, lazy compiles, CUDA
                        # context) would otherwise land in the first batch's wall_s and unet_s
                        for _ in range(spec.warmup):
                            _generate(spec, setup, cache, mine[0])
                        for ch in mine:
                            refs = _references(spec, store, ch)
                            written += run_chunk(spec, store, setup, cache, ch, todo, refs, env, log)
                            bar.update(len(ch))
                bar.close()
            if config.name == spec.reference:
                state.wait_for_everyone()  # reference images exist before anyone compares with them
    work = {"work_start_unix": work_start, "work_end_unix": time.time(), "load_s": round(pipes.load_s, 3)}
    store.write_stats(state.process_index, {**cache.stats(), "items_written": written, **work, **env})
    state.wait_for_everyone()
    result = None
    if collate and state.is_main_process:
        from fastdiff.sweep.collate import collate as _collate

        result = _collate(out_dir)
    state.wait_for_everyone()
    return result


def _references(spec: Spec, store: Store, chunk: list[Item]) -> dict:
    if (
        spec.reference is None
        or chunk[0].config.name == spec.reference
        or not any(m in spec.metrics for m in ("psnr", "ssim"))
    ):
        return {}
    ref = spec.config(spec.reference)
    return {it.id: store.array(Item(ref, it.prompt, it.seed)) for it in chunk}


def _bar(progress: bool, name: str, total: int, state):
    from tqdm.auto import tqdm

    return tqdm(
        total=total,
        desc=f"[{state.process_index + 1}/{state.num_processes}] {name}",
        position=state.process_index,
        disable=not progress or total == 0,
        leave=False,
        unit="img",
    )


__all__ = ["environment", "process_state", "run", "run_chunk"]
