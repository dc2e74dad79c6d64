"""fastdiff.sweep on a cheap stand-in pipeline: resume, kill-and-resume cycles, spec changes, the
prompt-embedding cache, collation. (The real model and several processes: test_sweep_distributed.py.)"""

from __future__ import annotations

import json
import math
import multiprocessing as mp
import os
import signal
import time
from collections import Counter

import numpy as np
import pytest
import torch
from sweep_helpers import FakePipeline, fake_spec

from fastdiff.sweep import SpecError, collate, sweep
from fastdiff.sweep.embeddings import EmbeddingCache

TIMING = ("wall_s", "unet_s", "encode_s", "finished", "env", "peak_mem_mib", "peak_mem_kind")


def _rows(folder):
    return {r["id"]: r for r in collate(folder, plots=False).rows}


def _images(folder):
    out = {}
    for root, _, files in os.walk(folder / "items"):
        for f in files:
            if f.endswith(".png"):
                with open(os.path.join(root, f), "rb") as fh:
                    out[os.path.relpath(os.path.join(root, f), folder)] = fh.read()
    return out


def _same_rows(a, b):
    assert a.keys() == b.keys()
    for k in a:
        ra = {x: v for x, v in a[k].items() if x not in TIMING}
        rb = {x: v for x, v in b[k].items() if x not in TIMING}
        assert ra == rb, k


def test_sweep_writes_every_item_once_with_metrics_and_files(tmp_path):
    res = sweep(fake_spec(), tmp_path, progress=False)
    assert len(res.rows) == 3 * 5 * 2
    assert len({r["id"] for r in res.rows}) == 30
    for name in (
        "rows.csv",
        "rows.json",
        "summary.md",
        "summary.json",
        "pareto.png",
        "grid.png",
        "sweep.json",
    ):
        assert (tmp_path / name).stat().st_size > 0, name
    ref = res.summary_for("ref")
    fast, mid = res.summary_for("fast"), res.summary_for("mid")
    assert ref["psnr_mean"] == math.inf and ref["nfe"] == 40  # guidance 2 > 1: two evaluations per step
    assert fast["nfe"] == 8 and mid["nfe"] == 16
    assert mid["psnr_mean"] > fast["psnr_mean"]  # the stand-in's noise shrinks with steps
    assert fast["psnr_worst"] <= fast["psnr_mean"] <= mid["psnr_mean"]
    # PSNR recomputed here from the saved arrays and PNGs
    row = next(r for r in res.rows if r["config"] == "fast" and r["prompt_index"] == 3 and r["seed"] == 1)
    from PIL import Image

    ref_row = next(r for r in res.rows if r["config"] == "ref" and r["prompt_index"] == 3 and r["seed"] == 1)
    ref_arr = np.load((tmp_path / ref_row["image"]).with_suffix(".npy")).astype(np.float64)
    np.testing.assert_array_equal(
        np.asarray(Image.open(tmp_path / ref_row["image"])), (ref_arr * 255).round().astype(np.uint8)
    )
    again = FakePipeline()
    out = again(
        prompt_embeds=again.prompt_encoder().encode(row["prompt"])["prompt_embeds"],
        generator=[torch.Generator().manual_seed(1)],
        num_inference_steps=4,
    )
    mse = float(((out.images[0].astype(np.float64) - ref_arr) ** 2).mean())
    assert row["psnr"] == pytest.approx(10 * math.log10(1 / mse), rel=1e-5)
    assert "fast" in (tmp_path / "summary.md").read_text()


def test_rerun_skips_finished_items_and_spec_change_is_refused(tmp_path):
    sweep(fake_spec(), tmp_path, progress=False, collate=False)
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "items").rglob("*.json")}
    import fastdiff.sweep

    fastdiff.sweep(
        fake_spec(), tmp_path, progress=False, collate=False
    )  # the module is callable; nothing to do
    assert before == {p: p.stat().st_mtime_ns for p in (tmp_path / "items").rglob("*.json")}
    changed = fake_spec(
        configs=[{"name": "ref", "steps": 20}, {"name": "fast", "steps": 5}, {"name": "mid", "steps": 8}]
    )
    with pytest.raises(SpecError, match="configuration 'fast' changed"):
        sweep(changed, tmp_path, progress=False)
    with pytest.raises(SpecError, match="configuration 'fast' changed"):
        sweep(changed, tmp_path, progress=False, extend=True)  # extending never rewrites a configuration
    with pytest.raises(SpecError, match="'guidance' changed"):
        sweep(fake_spec(guidance=3.0), tmp_path, progress=False, extend=True)
    more = fake_spec(seeds=[0, 1, 2])
    with pytest.raises(SpecError, match="extend=True"):
        sweep(more, tmp_path, progress=False)
    sweep(more, tmp_path, progress=False, extend=True, collate=False)
    res = collate(tmp_path, plots=False)
    assert len(res.rows) == 3 * 5 * 3
    assert before == {p: p.stat().st_mtime_ns for p in before}  # old items untouched
    assert len({r["id"] for r in res.rows}) == 45


def _child(spec, folder):
    torch.set_num_threads(1)
    sweep(spec, folder, progress=False, collate=False)


def _finished(folder) -> int:
    return sum(1 for _ in (folder / "items").rglob("*.json")) if (folder / "items").exists() else 0


def test_ten_kill_and_resume_cycles_lose_and_duplicate_nothing(tmp_path):
    """SIGKILL a worker mid-sweep ten times, at different points; the final rows equal an uninterrupted
    sweep's, bit for bit, and no item was ever written twice."""
    spec = fake_spec(prompts=[f"prompt {i}" for i in range(12)], seeds=[0, 1, 2], batch_size=4)
    total = 3 * 12 * 3
    clean = tmp_path / "clean"
    sweep(spec, clean, progress=False, collate=False)
    out = tmp_path / "killed"
    ctx = mp.get_context("fork")
    kills = 0
    rng = np.random.default_rng(0)
    for _ in range(10):
        start = _finished(out)
        target = min(total - 1, start + int(rng.integers(1, 10)))
        proc = ctx.Process(target=_child, args=(spec, out))
        proc.start()
        deadline = time.time() + 20
        while _finished(out) < target and proc.is_alive() and time.time() < deadline:
            time.sleep(0.002)
        if proc.is_alive():
            os.kill(proc.pid, signal.SIGKILL)
            kills += 1
        proc.join()
        assert _finished(out) < total or not proc.exitcode
    assert kills >= 8  # most cycles really were interrupted mid-sweep
    assert _finished(out) < total
    (out / "items" / "ref-x").mkdir(parents=True, exist_ok=True)
    (out / "items" / "ref-x" / ".all-00001-s0.png.abc.tmp").write_bytes(b"half")  # as a kill mid-write leaves
    sweep(spec, out, progress=False, collate=False)
    _same_rows(_rows(out), _rows(clean))
    assert _images(out) == _images(clean)
    events = Counter(
        json.loads(line)["id"]
        for p in (out / "log").glob("events-*.jsonl")
        for line in p.read_text().splitlines()
    )
    assert max(events.values()) == 1  # never written twice
    assert len(events) >= total - kills  # a kill between a row and its log line loses only the log line
    assert not list(out.rglob("*.tmp"))  # atomic writes leave no half-written files behind


def test_prompt_embedding_cache_encodes_each_prompt_once_per_process(tmp_path):
    spec = fake_spec()
    sweep(spec, tmp_path / "on", progress=False, collate=False)
    res = collate(tmp_path / "on", plots=False)
    # 5 prompts + the shared negative prompt, once each, for 3 configurations x 2 seeds
    assert res.stats["text_encoder_calls"] == 5 + 1
    sweep({**spec, "embedding_cache": False}, tmp_path / "off", progress=False, collate=False)
    off = collate(tmp_path / "off", plots=False)
    batches = 3 * 4  # 10 items per configuration in batches of 3
    warm_up = 3 * (3 + 1)  # each configuration's first batch once more, untimed (wall_s is measured)
    assert off.stats["text_encoder_calls"] == 30 + batches + warm_up
    _same_rows(_rows(tmp_path / "on"), _rows(tmp_path / "off"))


class _ColdStart(FakePipeline):
    """The first call pays a one-time cost, as a first CUDA call, a lazy compile or allocator growth do."""

    delay = 0.0

    def __call__(self, *args, **kwargs):
        if self.calls == 0:
            time.sleep(0.6)
        return super().__call__(*args, **kwargs)


@pytest.mark.parametrize("warmup", [None, 0, 2])
def test_timing_starts_after_an_untimed_warm_up_of_each_configuration(tmp_path, warmup):
    """First-call costs must not land in the first batch's wall_s: with a timing metric (by default) each
    configuration's first batch runs untimed before its timed batches; the images are the same bits."""
    pipe = _ColdStart()
    spec = fake_spec(pipeline=lambda: pipe)
    if warmup is not None:
        spec["warmup"] = warmup
    res = sweep(spec, tmp_path / "run", progress=False)
    n_warm = 1 if warmup is None else warmup
    assert pipe.calls == 3 * 4 + 3 * n_warm  # 4 batches of each of 3 configurations, plus the warm-ups
    walls = {r["id"]: r["wall_s"] for r in res.rows}
    cold = [r["id"] for r in res.rows if r["config"] == "ref" and r["batch_first"] == r["id"]]
    if n_warm:
        assert max(walls.values()) < 0.1  # the 0.6 s start was paid by a warm-up call
        assert f"after {n_warm} untimed warm-up call(s)" in (tmp_path / "run" / "summary.md").read_text()
    else:
        assert walls[cold[0]] >= 0.2  # 0.6 s shared by the first batch's 3 images
        assert "no warm-up" in (tmp_path / "run" / "summary.md").read_text()
    assert {r["warmup_calls"] for r in res.rows} == {n_warm}
    plain = tmp_path / "plain"
    sweep(fake_spec(warmup=0), plain, progress=False, collate=False)
    assert _images(tmp_path / "run") == _images(plain)


def test_warm_up_defaults_off_without_a_timing_metric(tmp_path):
    pipe = FakePipeline()
    sweep(fake_spec(pipeline=lambda: pipe, metrics=["psnr", "nfe"]), tmp_path, progress=False, collate=False)
    assert pipe.calls == 3 * 4


def test_embedding_cache_is_keyed_by_the_encoder_weights():
    pipe = FakePipeline()
    enc = pipe.prompt_encoder()
    cache = EmbeddingCache()
    a = cache.call_kwargs(enc, ["x"], None, cfg=False)["prompt_embeds"]
    with torch.no_grad():
        pipe.text_encoder.weight.mul_(2)  # e.g. a LoRA fused into the text encoder
    b = cache.call_kwargs(enc, ["x"], None, cfg=False)["prompt_embeds"]
    torch.testing.assert_close(b, 2 * a)
    assert cache.encoded == 2 and cache.hits == 0
    cache.call_kwargs(enc, ["x"], None, cfg=False)
    assert cache.hits == 1


def test_sd_encoder_fingerprint_sees_lora_and_weight_changes():
    from fastdiff.sweep.embeddings import StableDiffusionEncoder
    from fastdiff.testing import tiny_pipeline

    pipe = tiny_pipeline("sd15")
    enc = StableDiffusionEncoder(pipe)
    fp = enc.fingerprint()
    assert enc.fingerprint() == fp
    with torch.no_grad():
        next(pipe.text_encoder.parameters())[0, 0] += 1e-3
    fp2 = enc.fingerprint()
    assert fp2 != fp
    pipe.text_encoder.register_parameter("lora_extra", torch.nn.Parameter(torch.zeros(1)))
    assert enc.fingerprint() != fp2
    other = StableDiffusionEncoder(tiny_pipeline("sd15", seed=1))
    assert other.fingerprint() not in (fp, fp2)


def _direct_call(base, prompts, sampler, steps, guidance, seed, setup=None, **call):
    """What the sweep should reproduce: the wrapped pipeline called directly with ``sampler`` swapped in (and
    whatever ``setup(pipe)`` installs, removed again with ``fastdiff.restore``)."""
    import fastdiff
    from fastdiff.samplers import make_scheduler
    from fastdiff.sweep.setup import wrap

    pipe = wrap(base)
    own = pipe.scheduler
    pipe.scheduler = make_scheduler(sampler, like=own)
    try:
        if setup is not None:
            setup(pipe)
        return pipe(
            prompts,
            num_inference_steps=steps,
            guidance_scale=guidance,
            output_type="np",
            generator=[torch.Generator().manual_seed(seed) for _ in prompts],
            **call,
        )
    finally:
        if setup is not None:
            fastdiff.restore(pipe)
        pipe.scheduler = own


@pytest.mark.parametrize("arch", ["sd15", "sdxl"])
def test_cached_embeddings_give_the_pipelines_own_images(arch, tmp_path):
    """Images through the cache's prompt_embeds equal the pipeline's own prompt encoding (CFG on)."""
    from fastdiff.testing import tiny_pipeline

    base = tiny_pipeline(arch)
    base.set_progress_bar_config(disable=True)

    def build():
        return base

    prompts = ["a red circle", "a blue square on a green background"]
    res = sweep(
        {
            "pipeline": build,
            "prompts": prompts,
            "seeds": [3],
            "guidance": 4.0,
            "batch_size": 2,
            "configs": [{"name": "ddim", "sampler": "ddim", "steps": 3}],
            "metrics": ["nfe"],
        },
        tmp_path,
        progress=False,
    )
    own = _direct_call(base, prompts, "ddim", 3, 4.0, seed=3).images
    from PIL import Image

    for j, r in enumerate(sorted(res.rows, key=lambda r: r["prompt_index"])):
        got = np.asarray(Image.open(tmp_path / r["image"]))
        want = (own[j] * 255).round().clip(0, 255).astype(np.uint8)
        assert np.abs(got.astype(int) - want.astype(int)).max() <= 1  # batch-1 vs batched CLIP: float noise
    assert res.stats["text_encoder_calls"] == (2 + 1) * (2 if arch == "sdxl" else 1)


def test_optimize_option_is_applied_for_its_configuration_and_undone_after(tmp_path):
    from fastdiff.testing import tiny_pipeline

    base = tiny_pipeline("sd15")
    base.set_progress_bar_config(disable=True)
    before = {k: v.clone() for k, v in base.unet.state_dict().items()}
    modules_before = [type(m) for m in base.unet.modules()]
    spec = {
        "pipeline": lambda: base,
        "reference": "plain",
        "prompts": ["a red circle", "a blue square"],
        "seeds": [0],
        "guidance": 3.0,
        "metrics": ["psnr", "nfe"],
        "configs": [
            {"name": "plain", "sampler": "ddim", "steps": 3},
            {
                "name": "optimized",
                "sampler": "ddim",
                "steps": 3,
                "optimize": {"attention": "math", "winograd": True},
            },
        ],
    }
    sweep(spec, tmp_path, progress=False, collate=False)
    res = collate(tmp_path, plots=False)
    assert res.summary_for("optimized")["psnr_worst"] > 40  # same images up to float rounding
    assert [type(m) for m in base.unet.modules()] == modules_before  # restored after its configuration
    for k, v in base.unet.state_dict().items():
        torch.testing.assert_close(v, before[k], rtol=0, atol=0)
    assert base.scheduler.__class__.__name__ != "FastScheduler"  # the sampler swap is undone too


def test_step_cache_option_runs_as_a_direct_call_and_is_removed_after(tmp_path):
    """step_cache = {...} in a spec: the images and cache counts of a direct call with the same cache;
    mode "off" gives the plain configuration's images bit for bit; nothing stays installed."""
    from PIL import Image

    import fastdiff
    from fastdiff.caching.hooks import installed_cache
    from fastdiff.testing import tiny_pipeline

    base = tiny_pipeline("sd15")
    base.set_progress_bar_config(disable=True)
    modules_before = [type(m) for m in base.unet.modules()]
    prompts = ["a red circle", "a blue square on a green background"]
    spec = {
        "pipeline": lambda: base,
        "reference": "plain",
        "prompts": prompts,
        "seeds": [0],
        "guidance": 3.0,
        "batch_size": 2,
        "metrics": ["psnr", "nfe"],
        "configs": [
            {"name": "plain", "sampler": "dpmpp_2m", "steps": 9},
            {"name": "off", "sampler": "dpmpp_2m", "steps": 9, "step_cache": {"mode": "off"}},
            {"name": "cached", "sampler": "dpmpp_2m", "steps": 9, "step_cache": {"interval": 3}},
        ],
    }
    res = sweep(spec, tmp_path, progress=False)
    rows = {(r["config"], r["prompt_index"]): r for r in res.rows}

    def png(r):
        return np.asarray(Image.open(tmp_path / r["image"])).astype(int)

    for j in range(2):
        assert np.array_equal(png(rows["off", j]), png(rows["plain", j]))
        assert rows["off", j]["cache_cached_evals"] == 0
    assert installed_cache(base.unet) is None and [type(m) for m in base.unet.modules()] == modules_before

    handles = []
    out = _direct_call(
        base,
        prompts,
        "dpmpp_2m",
        9,
        3.0,
        seed=0,
        setup=lambda p: handles.append(fastdiff.step_cache(p, interval=3)),
    )
    run = out.fastdiff.step_cache
    assert run.cached_evals > 0 and handles[0].stats.cached_calls == run.cached_evals
    for j in range(2):
        r = rows["cached", j]
        assert (r["cache_full_evals"], r["cache_cached_evals"]) == (run.full_evals, run.cached_evals)
        want = (out.images[j] * 255).round().clip(0, 255).astype(int)
        assert np.abs(png(r) - want).max() <= 1  # batch-1 vs batched CLIP: float noise
        assert math.isfinite(r["psnr"])  # the cache changed the image: it ran
    assert res.summary_for("cached")["cache_skipped"] == pytest.approx(run.skipped_fraction)
    assert "cache_skipped" not in res.summary_for("plain")


def test_a_configuration_is_set_up_once_for_all_its_batches(tmp_path, monkeypatch):
    """An engine build or optimize's verification per batch would dominate a sweep: one set-up per
    configuration and process, undone after its last batch (and the images are unchanged)."""
    import fastdiff
    from fastdiff.caching.hooks import installed_cache
    from fastdiff.testing import tiny_pipeline

    base = tiny_pipeline("sd15")
    base.set_progress_bar_config(disable=True)
    calls = []
    real = fastdiff.step_cache
    monkeypatch.setattr(fastdiff, "step_cache", lambda *a, **k: calls.append(k) or real(*a, **k))
    spec = {
        "pipeline": lambda: base,
        "reference": "plain",
        "prompts": ["a red circle", "a blue square", "a green bird"],
        "seeds": [0, 1],
        "guidance": 3.0,
        "batch_size": 2,  # 3 batches per configuration
        "metrics": ["psnr", "nfe"],
        "configs": [
            {"name": "plain", "sampler": "dpmpp_2m", "steps": 6},
            {"name": "off", "sampler": "dpmpp_2m", "steps": 6, "step_cache": {"mode": "off"}},
        ],
    }
    res = sweep(spec, tmp_path, progress=False)
    assert calls == [{"mode": "off"}] and installed_cache(base.unet) is None
    assert len(res.rows) == 12 and math.isinf(res.summary_for("off")["psnr_worst"])  # the same images


def _one_config_rows(folder, pipe, prompts, config) -> list[dict]:
    """Sweep one configuration over ``prompts`` (seed 0, guidance 3) and return its rows in prompt order."""
    spec = {
        "pipeline": lambda: pipe,
        "prompts": prompts,
        "seeds": [0],
        "guidance": 3.0,
        "metrics": ["nfe"],
        "configs": [config],
    }
    sweep(spec, folder, progress=False, collate=False)
    return sorted(collate(folder, plots=False).rows, key=lambda r: r["prompt_index"])


def test_fast_forward_in_a_sweep_spec_runs_as_a_direct_call(tmp_path):
    """early_stop = {..., jumps = N} in a spec is FastForward: each image's NFE equals a direct call's."""
    from fastdiff.dynamic import FastForward
    from fastdiff.testing import tiny_pipeline

    base = tiny_pipeline("sd15")
    prompts = ["a red circle", "a blue square on a striped background"]
    options = {"rtol": 0.1, "patience": 1, "jumps": 3}
    config = {"name": "ff", "sampler": "dpmpp_2m", "steps": 20, "early_stop": options}
    rows = _one_config_rows(tmp_path, base, prompts, config)
    out = _direct_call(base, prompts, "dpmpp_2m", 20, 3.0, seed=0, early_stop=FastForward(**options))
    assert [r["nfe"] for r in rows] == out.fastdiff.nfe_per_sample
    assert max(out.fastdiff.nfe_per_sample) < 20, "rows jumped: FastForward ran, not EarlyStop"


def test_auto_steps_get_the_prompt_text_and_choose_as_a_direct_call(tmp_path, monkeypatch):
    """steps="auto" can pick step counts from the prompt's words, so the sweep must not hide them behind
    prompt_embeds: the per-image step counts equal a direct pipeline call's. The shipped table gives every
    tier the same count (no signal predicted need on fastdiff-tiny), so a table whose tiers differ stands in."""
    from fastdiff.dynamic import auto_steps
    from fastdiff.sweep.setup import wrap
    from fastdiff.testing import tiny_pipeline

    tiers = {"simple": [[math.inf, 8]], "neutral": [[math.inf, 8]], "detailed": [[math.inf, 12]]}
    monkeypatch.setattr(
        auto_steps, "_default_table", lambda: {"signal": "tier", "probe_steps": 1, "tiers": tiers}
    )

    base = tiny_pipeline("sd15")
    prompts = [
        "a red circle",
        "a highly detailed intricate ornate red circle with fine texture and many patterns",
    ]
    rows = _one_config_rows(tmp_path, base, prompts, {"name": "auto", "steps": "auto"})
    out = wrap(base)(
        prompts,
        steps="auto",
        guidance_scale=3.0,
        output_type="np",
        generator=[torch.Generator().manual_seed(0) for _ in prompts],
    )
    assert [r["steps"] for r in rows] == out.fastdiff.num_steps
    assert rows[0]["steps"] != rows[1]["steps"]  # the tiers really differ, so the text mattered
