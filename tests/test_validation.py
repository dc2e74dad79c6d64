"""Bad input to the drop-in pipelines and to `sample` fails early with the argument named (#16)."""

import numpy as np
import pytest
import torch

import fastdiff
from fastdiff.testing import tiny_pipeline


@pytest.fixture(scope="module")
def pipe():
    return fastdiff.StableDiffusionPipeline.from_pipe(tiny_pipeline("sd15"))


@pytest.mark.parametrize("fastdiff_path", [False, True], ids=["diffusers-loop", "fastdiff-loop"])
@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"prompt": []}, "prompt must be a string or a non-empty list"),
        ({"num_images_per_prompt": 0}, "num_images_per_prompt must be an int >= 1, got 0"),
        ({"height": 0}, "height must be an int >= 1, a multiple of 8, got 0"),
        ({"width": 60}, "width must be .* multiple of 8, got 60"),
        ({"guidance_scale": float("nan")}, "guidance_scale must be a finite number"),
        ({"guidance_scale": "7"}, "guidance_scale must be a finite number"),
        ({"output_type": "jpeg"}, "output_type must be one of"),
    ],
)
def test_pipeline_call_rejects_bad_keywords_before_running(pipe, monkeypatch, kwargs, match, fastdiff_path):
    calls = []
    monkeypatch.setattr(pipe.unet, "forward", lambda *a, **k: calls.append(1))
    kwargs = {"prompt": "a red circle", "num_inference_steps": 2, **kwargs}
    extra = {"early_stop": True} if fastdiff_path else {}
    with pytest.raises(ValueError, match=match):
        pipe(**kwargs, **extra)
    assert calls == []  # nothing ran


def test_pipeline_rejects_more_steps_than_the_training_schedule(pipe):
    with pytest.raises(ValueError, match="num_inference_steps must be an int >= 1 and <= 1000, got 5000"):
        pipe("a red circle", num_inference_steps=5000)


def test_failed_call_clears_the_previous_record(pipe):
    pipe("a red circle", num_inference_steps=2, output_type="latent")
    assert pipe.fastdiff_record is not None
    with pytest.raises(ValueError):
        pipe("a red circle", num_inference_steps=2, height=0)
    assert pipe.fastdiff_record is None


def test_refine_checks_output_type(pipe):
    out = pipe("a red circle", num_inference_steps=4, preview_steps=2, output_type="latent")
    with pytest.raises(ValueError, match="output_type must be one of .* got 'jpeg'"):
        pipe.refine(out.fastdiff.state, output_type="jpeg")


def test_from_pipe_needs_a_pipeline():
    with pytest.raises(TypeError, match="from_pipe needs a loaded diffusers pipeline, got str"):
        fastdiff.StableDiffusionPipeline.from_pipe("model-id")


def _sample(**kwargs):
    kwargs.setdefault("scheduler", fastdiff.make_scheduler("dpmpp_2m"))
    kwargs.setdefault("num_inference_steps", 3)
    model = kwargs.pop("model", lambda x, t: x)
    latents = kwargs.pop("latents", torch.randn(2, 4, 8, 8))
    return fastdiff.sample(model, latents, **kwargs)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"latents": torch.full((1, 4, 8, 8), float("nan"))}, ValueError, "latents contain NaN or inf"),
        ({"model": lambda x, t: (x,)}, TypeError, "model_fn must return a tensor .* got tuple"),
        ({"callback": 5}, TypeError, "callback must be callable"),
        ({"controller": "yes"}, TypeError, "controller must implement"),
    ],
)
def test_sample_rejects_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        _sample(**kwargs)


def test_draft_pipeline_without_an_lcm_scheduler_fails_before_running(pipe, monkeypatch):
    other = tiny_pipeline("sd15", seed=1)  # a PNDM/DDIM-scheduled pipeline, not an LCM
    calls = []
    monkeypatch.setattr(pipe.unet, "forward", lambda *a, **k: calls.append(1))
    monkeypatch.setattr(other.unet, "forward", lambda *a, **k: calls.append(1))
    with pytest.raises(
        ValueError, match=f"draft model .* {type(other.scheduler).__name__} scheduler.*LCMScheduler"
    ):
        pipe("a red circle", num_inference_steps=4, draft={"model": other})
    other.scheduler = fastdiff.make_scheduler("dpmpp_2m", like=other.scheduler)
    with pytest.raises(ValueError, match=r"draft model .* FastScheduler\(sampler='dpmpp_2m'\)"):
        pipe("a red circle", num_inference_steps=4, draft=(other, 0.5))
    assert calls == []


@pytest.mark.parametrize("scheduler", ["diffusers", "fastdiff"])
def test_draft_pipeline_with_an_lcm_scheduler_runs(pipe, scheduler):
    from diffusers import LCMScheduler

    draft = tiny_pipeline("sd15", seed=1)
    draft.scheduler = (
        LCMScheduler.from_config(draft.scheduler.config)
        if scheduler == "diffusers"
        else fastdiff.make_scheduler("lcm", like=draft.scheduler)
    )
    out = pipe(
        "a red circle", num_inference_steps=4, draft={"model": draft, "steps": 2}, output_type="latent"
    )
    rec = out.fastdiff
    assert rec.nfe == 2 + rec.steps[0] and "2 LCM step(s)" in rec.reason


def _preview(p, **kwargs):
    gen = torch.Generator().manual_seed(0)
    return p(
        "a red circle", num_inference_steps=4, preview_steps=2, output_type="np", generator=gen, **kwargs
    )


@pytest.mark.parametrize("other", ["another pipeline", "from_pipe sharing components"])
def test_refine_by_another_pipeline_raises(pipe, other):
    state = _preview(pipe).fastdiff.state
    if other == "another pipeline":
        refiner = fastdiff.StableDiffusionPipeline.from_pipe(tiny_pipeline("sd15", seed=1))
    else:
        refiner = fastdiff.StableDiffusionPipeline.from_pipe(pipe)
    with pytest.raises(
        ValueError, match=r"refine\(state\): the state was made by StableDiffusionPipeline at"
    ):
        refiner.refine(state)


@pytest.mark.parametrize("component", ["unet", "vae"])
def test_refine_after_swapping_a_component_raises(component):
    p = fastdiff.StableDiffusionPipeline.from_pipe(tiny_pipeline("sd15"))
    state = _preview(p).fastdiff.state
    setattr(p, component, getattr(tiny_pipeline("sd15", seed=1), component))
    with pytest.raises(ValueError, match=f"refine\\(state\\): this pipeline's {component} was replaced"):
        p.refine(state)


def test_refine_by_its_own_pipeline_twice_is_unchanged(pipe):
    kw = dict(guidance_scale=4.0)
    state = _preview(pipe, **kw).fastdiff.state
    a, b = pipe.refine(state), pipe.refine(state)
    np.testing.assert_array_equal(a.images, b.images)
    full = pipe(
        "a red circle",
        num_inference_steps=4,
        output_type="np",
        generator=torch.Generator().manual_seed(0),
        **kw,
    )
    np.testing.assert_allclose(a.images, full.images, atol=1e-5)
    chained = pipe.refine(pipe.refine(state, preview_steps=1).fastdiff.state)  # a refine's own preview
    np.testing.assert_array_equal(chained.images, a.images)


@pytest.mark.parametrize("command", ["demo", "demo --quick", "sweep"])
@pytest.mark.parametrize("where", ["under a file", "/proc"])
def test_cli_unwritable_out_fails_before_any_work(tmp_path, monkeypatch, capsys, command, where):
    import json

    import fastdiff.sweep
    from fastdiff import cli, demo

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    out = str(blocker / "out") if where == "under a file" else "/proc/fastdiff-forbidden"
    monkeypatch.setattr(demo, "run_demo", lambda *a, **k: pytest.fail("generation started"))
    monkeypatch.setattr(fastdiff.sweep, "sweep", lambda *a, **k: pytest.fail("sweep started"))
    argv = command.split()
    if command == "sweep":
        spec = {"pipeline": "fastdiff-tiny", "prompts": ["a red circle"], "configs": [{"name": "ref"}]}
        (tmp_path / "spec.json").write_text(json.dumps(spec))
        argv.append(str(tmp_path / "spec.json"))
    with pytest.raises(SystemExit) as exit_info:
        cli.main([*argv, "--out", out])
    assert exit_info.value.code == 2
    assert f"--out {out!r} is not a writable folder" in capsys.readouterr().err
