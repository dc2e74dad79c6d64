"""FastScheduler inside real diffusers pipelines (tiny random weights), and its config round trip."""

from __future__ import annotations

import pytest
import torch
from diffusers import DDIMScheduler, StableDiffusionImg2ImgPipeline

from fastdiff.samplers import SAMPLERS, FastScheduler, make_scheduler
from fastdiff.testing import tiny_pipeline

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def sd15():
    pipe = tiny_pipeline("sd15")
    pipe.set_progress_bar_config(disable=True)
    return pipe


NAMES = list(SAMPLERS)


@pytest.mark.parametrize("name", NAMES)
def test_text2img_pipeline_round_trip(sd15, name):
    sd15.scheduler = make_scheduler(name, like=sd15.scheduler)
    g = torch.Generator().manual_seed(0)
    out = sd15("a red circle", num_inference_steps=3, generator=g, output_type="latent", guidance_scale=3.0)
    lat = out.images
    assert lat.shape[1] == 4 and torch.isfinite(lat).all()
    assert sd15.scheduler.step_index == 3


@pytest.mark.parametrize("name", NAMES)
def test_img2img_pipeline_round_trip(sd15, name):
    img2img = StableDiffusionImg2ImgPipeline(**sd15.components)
    img2img.set_progress_bar_config(disable=True)
    img2img.scheduler = make_scheduler(name, like=sd15.scheduler)
    size = sd15.unet.config.sample_size * sd15.vae_scale_factor
    image = torch.rand(1, 3, size, size, generator=torch.Generator().manual_seed(1))
    out = img2img(
        "a blue square",
        image=image,
        strength=0.5,
        num_inference_steps=4,
        generator=torch.Generator().manual_seed(0),
        output_type="latent",
    )
    assert torch.isfinite(out.images).all()
    # strength 0.5 of 4 steps: begins at index 2 and runs the last two steps
    assert img2img.scheduler.begin_index == 2 and img2img.scheduler.step_index == 4


def test_pipeline_custom_sigmas_and_timesteps(sd15):
    sd15.scheduler = make_scheduler("unipc", like=sd15.scheduler)
    g = torch.Generator().manual_seed(0)
    out = sd15("x", sigmas=[14.6, 3.0, 0.5, 0.05], generator=g, output_type="latent", guidance_scale=1.0)
    assert torch.isfinite(out.images).all() and len(sd15.scheduler.timesteps) == 4
    out = sd15("x", timesteps=[999, 500, 100], generator=g, output_type="latent", guidance_scale=1.0)
    assert torch.isfinite(out.images).all() and sd15.scheduler.timesteps.tolist() == [999, 500, 100]


def test_inherits_training_schedule_and_prediction_type():
    like = DDIMScheduler(
        beta_start=0.001, beta_end=0.02, beta_schedule="linear", prediction_type="v_prediction"
    )
    s = make_scheduler("dpmpp_2m", like=like)
    assert s.config.prediction_type == "v_prediction" and s.config.beta_schedule == "linear"
    torch.testing.assert_close(s.alphas_cumprod, like.alphas_cumprod, rtol=1e-6, atol=0)
    s2 = make_scheduler("dpmpp_2m", like=like.config)  # a config (FrozenDict) works too
    assert s2.config.beta_end == 0.02
    sd = make_scheduler("unipc")  # no `like`: Stable Diffusion's schedule
    assert sd.config.beta_schedule == "scaled_linear" and sd.config.beta_end == 0.012


@pytest.mark.parametrize("name", NAMES)
def test_save_and_load_round_trip(tmp_path, name):
    s = make_scheduler(
        name, schedule="exponential" if name != "lcm" else "lcm", eta=0.3 if name == "ddim" else 0.0
    )
    s.save_pretrained(tmp_path)
    t = FastScheduler.from_pretrained(tmp_path)
    drop = lambda c: {k: v for k, v in c.items() if not k.startswith("_")}
    assert drop(t.config) == drop(s.config)
    s.set_timesteps(5)
    t.set_timesteps(5)
    assert torch.equal(s.timesteps, t.timesteps) and torch.equal(s.sigmas, t.sigmas)


def test_save_and_load_explicit_schedule(tmp_path):
    s = make_scheduler("unipc", schedule=torch.tensor([14.0, 2.0, 0.3, 0.05]))
    s.save_pretrained(tmp_path)
    t = FastScheduler.from_pretrained(tmp_path)
    t.set_timesteps(4)
    assert t.sigmas.tolist() == pytest.approx([14.0, 2.0, 0.3, 0.05, 0.0], rel=1e-6)
    with pytest.raises(ValueError, match="fixed 4-step"):
        t.set_timesteps(10)


def test_swap_scheduler_mid_run():
    """VP state means a run can continue with a different sampler on the same noise levels."""
    from fastdiff.samplers.gmm import GaussianMixture, GMMDenoiser

    model = GMMDenoiser(GaussianMixture.random(dims=8, components=3))
    x = torch.randn(16, 8, generator=torch.Generator().manual_seed(0))
    a, b = make_scheduler("lcm", schedule="trailing"), make_scheduler("dpmpp_2m", schedule="trailing")
    a.set_timesteps(6)
    b.set_timesteps(6)
    t0 = a.timesteps[0]
    x0 = a.step(model(x, t0), t0, x, generator=torch.Generator().manual_seed(1)).pred_original_sample
    # LCM draft -> re-noise the x0 to the 3rd timestep -> finish with DPM-Solver++
    t3 = b.timesteps[3]
    noise = torch.randn(x0.shape, generator=torch.Generator().manual_seed(2))
    x = b.add_noise(x0, noise, t3.reshape(1))
    b.set_begin_index(3)
    for t in b.timesteps[3:]:
        x = b.step(model(x, t), t, x).prev_sample
    assert torch.isfinite(x).all() and b.step_index == 6


@pytest.mark.parametrize("name", ["unipc", "dpmpp_2m_sde", "lcm"])
def test_sdxl_pipeline_round_trip(name):
    pipe = tiny_pipeline("sdxl")
    pipe.set_progress_bar_config(disable=True)
    pipe.scheduler = make_scheduler(name, like=pipe.scheduler)
    g = torch.Generator().manual_seed(0)
    out = pipe("a cat", num_inference_steps=4, generator=g, output_type="latent", denoising_end=0.6)
    assert torch.isfinite(out.images).all()
    # denoising_end compares (fractional) timesteps with the training-step cut-off
    assert 0 < pipe.scheduler.step_index < 4


def test_pipeline_save_and_load_keeps_the_fast_scheduler(sd15, tmp_path):
    from diffusers import StableDiffusionPipeline

    sd15.scheduler = make_scheduler("unipc", like=sd15.scheduler, final_step="variance")
    sd15.save_pretrained(tmp_path)
    loaded = StableDiffusionPipeline.from_pretrained(tmp_path)
    assert isinstance(loaded.scheduler, FastScheduler)
    assert loaded.scheduler.config.sampler == "unipc" and loaded.scheduler.config.final_step == "variance"
