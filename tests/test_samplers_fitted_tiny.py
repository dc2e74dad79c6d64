"""A schedule fitted on fastdiff-tiny travels with the pipeline: save_pretrained / from_pretrained.

The fit is deliberately tiny (2 prompts, 4 steps, a few optimiser evaluations): the test is
about the schedule reaching a real pipeline and surviving the config round trip bit for bit,
not about the fit's quality (``benchmarks/sampler_defaults.py`` measures that).
"""

from __future__ import annotations

import pytest
import torch

from fastdiff.samplers import FastScheduler, fit_schedule, make_scheduler

PROMPTS = ["a red circle on a blue background", "a green square on a striped yellow background"]
GUIDANCE = 5.0


@pytest.fixture(scope="module")
def tiny():
    from fastdiff.tiny import load_pipeline

    return load_pipeline("base")


def guided_model(pipe):
    with torch.no_grad():
        cond, uncond = pipe.encode_prompt(PROMPTS, "cpu", 1, True, [""] * len(PROMPTS))
    emb = torch.cat([uncond, cond])

    @torch.no_grad()
    def model(x, t):
        out = pipe.unet(torch.cat([x, x]), t, encoder_hidden_states=emb).sample
        u, c = out.chunk(2)
        return u + GUIDANCE * (c - u)

    return model


def test_fitted_schedule_round_trips_through_save_pretrained(tiny, tmp_path):
    from diffusers import StableDiffusionPipeline

    size = tiny.unet.config.sample_size
    cal = torch.randn(2, 4, size, size, generator=torch.Generator().manual_seed(1))
    # fitted with UniPC's bh1 (the better variant at 8 NFE on the guided mixture): the option must travel too
    sig = fit_schedule(
        guided_model(tiny),
        cal,
        4,
        "unipc",
        like=tiny.scheduler,
        reference_steps=12,
        max_evals=6,
        solver_type="bh1",
    )
    assert len(sig) == 5 and sig[-1] == 0.0 and all(a > b for a, b in zip(sig, sig[1:]))

    tiny.scheduler = make_scheduler("unipc", like=tiny.scheduler, schedule=sig, solver_type="bh1")
    run = lambda pipe: (
        pipe(
            PROMPTS[0],
            num_inference_steps=4,
            guidance_scale=GUIDANCE,
            generator=torch.Generator().manual_seed(0),
            output_type="latent",
        ).images
    )
    before = run(tiny)
    assert tiny.scheduler.sigmas.tolist() == pytest.approx(sig, rel=1e-6)

    tiny.scheduler.save_pretrained(tmp_path / "scheduler")
    alone = FastScheduler.from_pretrained(tmp_path / "scheduler")
    assert alone.config.schedule == pytest.approx(sig, rel=0, abs=0)  # exact floats in the JSON
    tiny.save_pretrained(tmp_path / "pipe")
    loaded = StableDiffusionPipeline.from_pretrained(tmp_path / "pipe")
    loaded.set_progress_bar_config(disable=True)
    assert isinstance(loaded.scheduler, FastScheduler) and loaded.scheduler.config.sampler == "unipc"
    assert loaded.scheduler.config.solver_type == "bh1"
    after = run(loaded)
    assert torch.equal(before, after)
    # the loaded scheduler visits exactly the fitted noise levels, and a different step count is refused
    assert loaded.scheduler.sigmas.tolist() == pytest.approx(sig, rel=1e-6)
    with pytest.raises(ValueError, match="fixed 4-step schedule"):
        loaded.scheduler.set_timesteps(8)
