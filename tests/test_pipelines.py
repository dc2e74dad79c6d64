"""fastdiff's drop-in pipelines: loading, passthrough, the fastdiff keywords, refine, errors.

Random-weight tiny pipelines (fastdiff.testing) prove the mechanics; image quality is the benchmark's job.
"""

from __future__ import annotations

import diffusers
import numpy as np
import pytest
import torch

import fastdiff
from fastdiff.testing import tiny_pipeline


@pytest.fixture(scope="module")
def sd():
    pipe = fastdiff.StableDiffusionPipeline.from_pipe(tiny_pipeline("sd15"))
    # DDIM: one evaluation per step (PNDM repeats its first timestep, so N steps cost N+1 there)
    pipe.scheduler = diffusers.DDIMScheduler.from_config(pipe.scheduler.config)
    return pipe


@pytest.fixture(scope="module")
def sdxl():
    return fastdiff.StableDiffusionXLPipeline.from_pipe(tiny_pipeline("sdxl"))


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


PROMPTS = ["a red circle", "a blue square on a striped background"]


def test_from_pretrained_loads_as_fastdiff_class_and_passes_through(tmp_path):
    base = tiny_pipeline("sd15")
    base.save_pretrained(tmp_path)
    pipe = fastdiff.StableDiffusionPipeline.from_pretrained(tmp_path, local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    assert isinstance(pipe, fastdiff.StableDiffusionPipeline)
    assert isinstance(pipe, diffusers.StableDiffusionPipeline)
    kw = dict(num_inference_steps=3, guidance_scale=4.0, output_type="np")
    ours = pipe("a red circle", generator=gen(), **kw)
    ref = base("a red circle", generator=gen(), **kw)
    np.testing.assert_array_equal(ours.images, ref.images)
    rec = ours.fastdiff
    # PNDM (this pipeline's scheduler) evaluates its first timestep twice: NFE = len(timesteps) = 4
    assert rec.mode == "diffusers" and rec.nfe == len(pipe.scheduler.timesteps) == 4
    assert rec.timings["total"] > 0


def test_from_pipe_and_back(sdxl):
    assert isinstance(sdxl, diffusers.StableDiffusionXLPipeline)
    img2img = fastdiff.StableDiffusionXLImg2ImgPipeline.from_pipe(sdxl)
    assert img2img.unet is sdxl.unet
    plain = diffusers.StableDiffusionXLPipeline.from_pipe(sdxl)
    assert not hasattr(plain, "refine")


@pytest.mark.parametrize("arch", ["sd", "sdxl"])
def test_fastdiff_loop_equals_diffusers_loop(arch, sd, sdxl):
    pipe = sd if arch == "sd" else sdxl
    kw = dict(guidance_scale=5.0, output_type="np")
    ref = pipe(PROMPTS, num_inference_steps=4, generator=gen(), **kw)
    ours = pipe(PROMPTS, steps=4, generator=gen(), **kw)
    assert ours.fastdiff.mode == "fastdiff" and ours.fastdiff.nfe == 4
    np.testing.assert_allclose(ours.images, ref.images, atol=1e-5)


def test_preview_then_refine_equals_full_run(sdxl):
    pipe = sdxl
    kw = dict(guidance_scale=5.0, output_type="np", num_inference_steps=5)
    full = pipe(PROMPTS, generator=gen(), **kw)
    preview = pipe(PROMPTS, preview_steps=2, generator=gen(), **kw)
    assert preview.fastdiff.steps == [2, 2] and preview.fastdiff.state is not None
    assert preview.images.shape == full.images.shape and np.isfinite(preview.images).all()
    final = pipe.refine(preview.fastdiff.state)
    np.testing.assert_allclose(final.images, full.images, atol=1e-5)
    assert final.fastdiff.nfe == 5 and final.fastdiff.state is None
    # the preview is a snapshot (#10): refining it again starts from the same point, not from the end
    again = pipe.refine(preview.fastdiff.state)
    np.testing.assert_array_equal(again.images, final.images)
    assert again.fastdiff.nfe == 5 and again.fastdiff.steps == [5, 5]


def test_img2img_matches_diffusers_and_refines():
    i2i = fastdiff.StableDiffusionImg2ImgPipeline.from_pipe(tiny_pipeline("sd21"))
    image = torch.rand(1, 3, 32, 32, generator=gen(5))
    kw = dict(image=image, strength=0.6, guidance_scale=4.0, output_type="np")
    ref = i2i("a cat", num_inference_steps=5, generator=gen(), **kw)
    ours = i2i("a cat", steps=5, generator=gen(), **kw)
    assert ours.fastdiff.nfe == ref.fastdiff.nfe == 3  # int(5 * 0.6) steps
    np.testing.assert_allclose(ours.images, ref.images, atol=1e-5)
    part = i2i("a cat", num_inference_steps=5, preview_steps=1, generator=gen(), **kw)
    np.testing.assert_allclose(i2i.refine(part.fastdiff.state).images, ref.images, atol=1e-5)


def test_early_stop_record_and_per_image_steps(sd):
    out = sd(
        PROMPTS,
        num_inference_steps=12,
        early_stop={"rtol": 0.5, "patience": 1, "min_steps": 3, "max_sigma": None},
        guidance_scale=5.0,
        output_type="np",
        generator=gen(),
    )
    rec = out.fastdiff
    assert len(rec.steps) == 2 and all(3 <= s < 12 for s in rec.steps) and all(rec.stopped_early)
    assert rec.nfe == max(rec.steps) and rec.nfe_per_sample == rec.steps
    assert "early stop" in rec.reason and out.images.shape[0] == 2


def test_presets_use_default_sampler(sd):
    out = sd("a red circle", steps="fast", guidance_scale=3.0, output_type="np", generator=gen())
    assert out.fastdiff.nfe == 10 and "preset 'fast'" in out.fastdiff.reason
    assert type(sd.scheduler).__name__ == "DDIMScheduler", "the pipeline's own scheduler is restored"


def test_auto_steps_reports_choice_per_image(sd):
    out = sd(
        ["a plain red circle", "a detailed checkered square"],
        steps="auto",
        guidance_scale=3.0,
        output_type="np",
        generator=gen(),
    )
    rec = out.fastdiff
    assert "tier 'simple'" in rec.notes[0] and "tier 'detailed'" in rec.notes[1]
    for n, note in zip(rec.num_steps, rec.notes):
        assert 8 <= n <= 30 and note.endswith(f"-> {n}")
    assert rec.steps == rec.num_steps and out.images.shape[0] == 2


def test_lcm_draft_then_refine_counts_both_models(sd):
    lcm_unet = tiny_pipeline("sd15", seed=1).unet  # stands in for a distilled student
    out = sd(
        "a red circle",
        num_inference_steps=10,
        draft={"model": lcm_unet, "strength": 0.3, "steps": 2},
        guidance_scale=3.0,
        output_type="np",
        generator=gen(),
    )
    rec = out.fastdiff
    assert rec.steps == [3] and rec.nfe == 2 + 3
    assert "draft: 2 LCM step(s)" in rec.reason and rec.timings["draft"] > 0


def test_return_dict_false_keeps_tuple_and_record(sd):
    out = sd("a red circle", steps=2, output_type="np", return_dict=False, generator=gen())
    assert isinstance(out, tuple) and out[0].shape[0] == 1
    assert sd.fastdiff_record.nfe == 2


def test_bad_keywords_raise(sd):
    with pytest.raises(ValueError, match="unknown steps preset"):
        sd("a red circle", steps="turbo")
    with pytest.raises(ValueError, match="not both"):
        sd("a red circle", steps=4, num_inference_steps=4)
    with pytest.raises(TypeError, match="early_stop"):
        sd("a red circle", early_stop="yes")
    with pytest.raises(ValueError, match="preview_steps"):
        sd("a red circle", preview_steps=0)
    with pytest.raises(ValueError, match="strength"):
        sd("a red circle", draft={"model": sd.unet, "strength": 2.0})
    with pytest.raises(TypeError, match="draft model"):
        sd("a red circle", draft="lcm")
    with pytest.raises(ValueError, match="callback"):
        sd("a red circle", steps=2, callback_on_step_end=lambda *a: {})
    with pytest.raises(TypeError, match="preview call"):
        sd.refine(None)
    i2i = fastdiff.StableDiffusionImg2ImgPipeline.from_pipe(sd)
    with pytest.raises(ValueError, match="text-to-image"):
        i2i("a red circle", image=torch.rand(1, 3, 32, 32), steps="auto")


def test_refining_the_same_preview_twice_starts_from_the_preview(sd):
    # regression (#10): refine() advanced the shared state, so the second refine continued from the first's end
    kw = dict(guidance_scale=4.0, output_type="np", num_inference_steps=6)
    preview = sd(PROMPTS, preview_steps=2, generator=gen(), **kw)
    a = sd.refine(preview.fastdiff.state, preview_steps=1)
    b = sd.refine(preview.fastdiff.state, preview_steps=1)
    assert a.fastdiff.steps == b.fastdiff.steps == [3, 3]
    np.testing.assert_array_equal(a.images, b.images)
    final = sd.refine(a.fastdiff.state)
    np.testing.assert_allclose(final.images, sd(PROMPTS, generator=gen(), **kw).images, atol=1e-5)


def test_fast_forward_with_a_scheduler_that_cannot_jump_fails_before_the_unet_runs(sd):
    from fastdiff.pipelines.unet_calls import UNetCalls

    with UNetCalls(sd.unet) as calls:
        with pytest.raises(TypeError, match=r"DDIMScheduler cannot do"):
            sd("a red circle", num_inference_steps=8, early_stop={"rtol": 0.1, "jumps": 3}, generator=gen())
    assert calls.calls == 0 and sd.fastdiff_record is None
    out = sd(
        "a red circle", steps="fast", early_stop={"rtol": 0.1, "jumps": 3}, output_type="np", generator=gen()
    )
    assert out.fastdiff.nfe <= 10, "a preset runs fastdiff's default sampler, which can jump"


def test_draft_strength_leaving_no_refine_step_fails_before_the_draft_runs(sd):
    # regression (#10): the error came only after the draft model had run
    from fastdiff.pipelines.unet_calls import UNetCalls

    lcm_unet = tiny_pipeline("sd15", seed=1).unet
    with UNetCalls(lcm_unet) as draft_calls, UNetCalls(sd.unet) as main_calls:
        with pytest.raises(ValueError, match=r"draft strength 0.3 leaves no refine step of 3"):
            sd(
                "a red circle",
                num_inference_steps=3,
                draft={"model": lcm_unet, "strength": 0.3},
                generator=gen(),
            )
    assert draft_calls.calls == 0 and main_calls.calls == 0


def test_capture_hides_its_aborted_unet_call_from_other_hooks(sd):
    from fastdiff.pipelines.unet_calls import UNetCalls

    with UNetCalls(sd.unet) as counter:
        out = sd("a red circle", steps=3, guidance_scale=4.0, output_type="np", generator=gen())
    assert counter.calls == out.fastdiff.nfe == 3 and counter.rows == 2 * 3


def test_rows_retired_hook_reaches_the_pipeline_run(sd):
    events = []
    sd.fastdiff_on_rows_retired = lambda rows: events.append(rows.tolist())
    try:
        out = sd(
            PROMPTS,
            num_inference_steps=8,
            early_stop={"rtol": 0.5, "patience": 1, "min_steps": 2, "max_sigma": None},
            guidance_scale=4.0,
            output_type="latent",
            generator=gen(),
        )
    finally:
        del sd.fastdiff_on_rows_retired
    assert events and events[-1] == [] and len(events) == len(set(out.fastdiff.steps))
