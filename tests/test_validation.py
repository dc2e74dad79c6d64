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
        ({"guidance_rescale": float("nan")}, r"guidance_rescale must be a number in \[0, 1\]"),
        ({"guidance_rescale": 1.5}, r"guidance_rescale must be a number in \[0, 1\]"),
        ({"eta": float("nan")}, "eta must be a finite number"),
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


@pytest.mark.parametrize("fastdiff_path", [False, True], ids=["diffusers-loop", "fastdiff-loop"])
@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"step": "fast"}, r"unknown keyword argument\(s\) 'step'; did you mean 'steps'"),
        ({"num_inference_step": 3}, "'num_inference_step'; did you mean 'num_inference_steps'"),
        ({"zz": 1, "guidanse_scale": 2.0}, "'guidanse_scale', 'zz'; did you mean 'guidance_scale'"),
    ],
)
def test_pipeline_call_rejects_unknown_keywords_before_running(
    pipe, monkeypatch, kwargs, match, fastdiff_path
):
    """diffusers' __call__ takes **kwargs and ignores unknown names: a misspelt keyword ran the defaults."""
    calls = []
    monkeypatch.setattr(pipe.unet, "forward", lambda *a, **k: calls.append(1))
    extra = {"early_stop": True} if fastdiff_path else {}
    with pytest.raises(TypeError, match=match):
        pipe("a red circle", num_inference_steps=2, **kwargs, **extra)
    assert calls == []


def test_deprecated_diffusers_keywords_still_reach_diffusers(pipe):
    seen = []
    with pytest.warns(FutureWarning):
        pipe("a red circle", num_inference_steps=2, callback=lambda i, t, x: seen.append(i), callback_steps=1)
    assert len(seen) >= 2  # diffusers called it: the keywords reached its loop


@pytest.mark.parametrize("fastdiff_path", [False, True], ids=["diffusers-loop", "fastdiff-loop"])
def test_return_dict_must_be_a_bool(pipe, fastdiff_path):
    extra = {"early_stop": True} if fastdiff_path else {}
    with pytest.raises(TypeError, match="return_dict must be True or False, got 'no'"):
        pipe("a red circle", num_inference_steps=2, return_dict="no", **extra)
    state = _preview(pipe).fastdiff.state
    with pytest.raises(TypeError, match="return_dict must be True, False or None, got 0"):
        pipe.refine(state, return_dict=0)


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


@pytest.mark.parametrize("steps", ["fast", "auto"])
@pytest.mark.parametrize("student", ["diffusers-lcm", "fastdiff-lcm", "distilled-unet"])
def test_presets_on_an_lcm_student_fail_before_running(steps, student, monkeypatch):
    """Presets and "auto" swap in DPM-Solver++(2M) with teacher-measured counts: not for an LCM student."""
    from diffusers import LCMScheduler

    p = fastdiff.StableDiffusionPipeline.from_pipe(tiny_pipeline("sd15", seed=2))
    if student == "diffusers-lcm":
        p.scheduler = LCMScheduler.from_config(p.scheduler.config)
    elif student == "fastdiff-lcm":
        p.scheduler = fastdiff.make_scheduler("lcm", like=p.scheduler)
    else:
        p.unet.register_to_config(time_cond_proj_dim=32)
    calls = []
    monkeypatch.setattr(p.unet, "forward", lambda *a, **k: calls.append(1))
    with pytest.raises(
        ValueError, match=f"steps={steps!r} runs DPM-Solver.*LCM.*pass the number of LCM steps"
    ):
        p("a red circle", steps=steps, guidance_scale=1.0)
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


def test_refine_reason_names_each_note_once(pipe):
    """regression: refine() appended the run's notes to a reason that already held them."""
    out = pipe("a red circle", steps="auto", preview_steps=2, output_type="latent")
    note = out.fastdiff.notes[0]
    assert note and out.fastdiff.reason.count(note) == 1
    chained = pipe.refine(pipe.refine(out.fastdiff.state, preview_steps=1).fastdiff.state)
    assert pipe.refine(out.fastdiff.state).fastdiff.reason == out.fastdiff.reason == chained.fastdiff.reason


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


# ---------------------------------------------------------------- objects stay as they were after an error
class _Boom(Exception):
    pass


def _raise_at_call(module, n: int, exc=_Boom):
    """A forward pre-hook on ``module`` that raises ``exc`` at its ``n``-th call (1-based); returns the handle."""
    count = [0]

    def hook(*_):
        count[0] += 1
        if count[0] == n:
            raise exc(f"injected failure at U-Net call {n}")

    return module.register_forward_pre_hook(hook)


@pytest.mark.parametrize(
    "bad, error",
    [
        ({"attention": "xformers"}, Exception),  # not usable on CPU: AttentionBackendError
        ({"tolerance": "1e-3"}, ValueError),
        ({"extra": {"bogus_pass": 1}}, ValueError),
        ({"verify": "no"}, ValueError),
        ({"config": "fast"}, TypeError),
        ({"bogus": 1}, TypeError),
        ({"fail_in": "attention"}, _Boom),  # a pass failing half-way, after the earlier one was undone
        ({"fail_in": "winograd"}, _Boom),
    ],
    ids=lambda v: str(v) if not isinstance(v, type) else "",
)
def test_failed_optimize_leaves_the_earlier_optimisation_in_place(monkeypatch, bad, error):
    from fastdiff.optimize import passes_kernels
    from fastdiff.optimize.passes import AttentionPass
    from fastdiff.testing.snapshot import differences, snapshot, unet_output

    p = tiny_pipeline("sd15")
    fastdiff.optimize(p)
    before, out, statuses = snapshot(p), unet_output(p.unet), _statuses(fastdiff.report(p))
    bad = dict(bad)
    fail_in = bad.pop("fail_in", None)
    if fail_in is not None:
        cls = AttentionPass if fail_in == "attention" else passes_kernels.WinogradPass
        original = cls.apply

        failed = []

        def half_then_fail(self, unet, config, ctx):
            original(self, unet, config, ctx)  # every module edited, then the pass fails (once)
            if not failed:
                failed.append(1)
                raise _Boom(f"{fail_in} failed")

        monkeypatch.setattr(cls, "apply", half_then_fail)
        bad = {"winograd": True}  # a different configuration, so the earlier one is undone first
    with pytest.raises(error):
        fastdiff.optimize(p, **bad)
    assert differences(before, snapshot(p)) == []
    assert torch.equal(unet_output(p.unet), out)
    assert _statuses(fastdiff.report(p)) == statuses


def test_optimize_says_so_when_the_earlier_optimisation_cannot_be_put_back(monkeypatch):
    from fastdiff.optimize.passes import AttentionPass
    from fastdiff.testing.snapshot import unet_output

    p = tiny_pipeline("sd15")
    plain = unet_output(p.unet)
    fastdiff.optimize(p)

    def always_fail(self, unet, config, ctx):
        raise _Boom("attention failed")

    monkeypatch.setattr(AttentionPass, "apply", always_fail)
    with pytest.raises(
        RuntimeError, match="re-applying the earlier optimisation failed too.*now unoptimised"
    ):
        fastdiff.optimize(p, winograd=True)
    assert fastdiff.report(p).passes[0].status == "not applied"
    assert torch.equal(unet_output(p.unet), plain)


def _statuses(report):
    return [(r.name, r.status, list(r.changed)) for r in report.passes]


def _guarded_pipe(optimized: bool):
    p = fastdiff.StableDiffusionPipeline.from_pipe(tiny_pipeline("sd15"))
    if optimized:
        fastdiff.optimize(p)  # so that fastdiff.installed holds a record to compare
    return p


_CALL = dict(prompt="a red circle", guidance_scale=4.0, output_type="np")


@pytest.mark.parametrize(
    "path",
    ["diffusers loop", "steps preset", "early_stop", "preview", "KeyboardInterrupt"],
)
@pytest.mark.parametrize("optimized", [False, True], ids=["plain", "optimized"])
def test_a_call_failing_mid_sampling_leaves_the_pipeline_as_it_was(path, optimized):
    from fastdiff.testing.snapshot import differences, snapshot

    p = _guarded_pipe(optimized)
    p(**_CALL, num_inference_steps=2)  # a successful call first: its record must be cleared by the failure
    before = snapshot(p)
    kwargs = {
        "diffusers loop": dict(num_inference_steps=5),
        "steps preset": dict(steps="fast"),
        "early_stop": dict(num_inference_steps=5, early_stop=True),
        "preview": dict(num_inference_steps=5, preview_steps=4),
        "KeyboardInterrupt": dict(steps=5),
    }[path]
    exc = KeyboardInterrupt if path == "KeyboardInterrupt" else _Boom
    handle = _raise_at_call(p.unet, 3, exc)
    try:
        with pytest.raises(exc, match="injected failure at U-Net call 3"):
            p(**_CALL, generator=torch.Generator().manual_seed(0), **kwargs)
    finally:
        handle.remove()
    assert differences(before, snapshot(p)) == []
    assert p.fastdiff_record is None
    # and the next call is bit-for-bit what a fresh pipeline gives
    fresh = _guarded_pipe(optimized)
    kw = dict(**_CALL, num_inference_steps=3, generator=torch.Generator().manual_seed(0))
    again = p(**kw).images
    kw["generator"] = torch.Generator().manual_seed(0)
    np.testing.assert_array_equal(again, fresh(**kw).images)


def test_a_raising_callback_leaves_the_pipeline_as_it_was():
    from fastdiff.testing.snapshot import differences, snapshot

    p = _guarded_pipe(True)
    p(**_CALL, num_inference_steps=2)
    before = snapshot(p)

    def callback(pipe, step, t, kwargs):
        if step == 2:
            raise _Boom("callback failed at step 2")
        return kwargs

    with pytest.raises(_Boom):
        p(**_CALL, num_inference_steps=5, callback_on_step_end=callback)
    assert differences(before, snapshot(p)) == []
    assert p.fastdiff_record is None


@pytest.mark.parametrize("fail_at", [1, 2])
def test_a_failing_refine_leaves_the_preview_usable_and_unchanged(pipe, fail_at):
    from fastdiff.testing.snapshot import differences, snapshot

    kw = dict(guidance_scale=4.0)
    state = _preview(pipe, **kw).fastdiff.state
    reference = pipe.refine(state).images  # refining a snapshot never changes it (tested elsewhere)
    before = snapshot(pipe)
    handle = _raise_at_call(pipe.unet, fail_at)
    try:
        with pytest.raises(_Boom):
            pipe.refine(state)
    finally:
        handle.remove()
    assert pipe.fastdiff_record is None
    assert differences(before, snapshot(pipe)) == []
    np.testing.assert_array_equal(pipe.refine(state).images, reference)
    fresh = _preview(pipe, **kw).fastdiff.state  # a fresh copy of the same preview
    np.testing.assert_array_equal(pipe.refine(fresh).images, reference)


@pytest.mark.parametrize(
    "bad, error",
    [
        ({"backend": "bogus"}, ValueError),
        ({"precision": "int4"}, ValueError),
        ({"precision": "int8"}, ValueError),  # no calibration
        ({"calibration": "records.safetensors"}, TypeError),
        ({"gate": {"min_snr_db": 1e9}}, Exception),  # a real fp32 build refused by the quality gate
    ],
    ids=lambda v: str(v) if not isinstance(v, type) else "",
)
def test_a_failed_compile_engine_leaves_the_unet_as_it_was(tmp_path, bad, error):
    pytest.importorskip("onnxruntime")
    from fastdiff.engines import GateConfig, compile_engine
    from fastdiff.testing.snapshot import differences, snapshot, unet_output

    p = tiny_pipeline("sd15")
    fastdiff.optimize(p)  # an earlier change that must survive too
    unet, before, out = p.unet, snapshot(p), unet_output(p.unet)
    bad = dict(bad)
    if "gate" in bad:
        bad["gate"] = GateConfig(**bad["gate"])
    with pytest.raises(error):
        compile_engine(p, cache_dir=tmp_path, **bad)
    assert p.unet is unet
    assert differences(before, snapshot(p)) == []
    assert torch.equal(unet_output(p.unet), out)


@pytest.mark.parametrize(
    "scheduler, kwargs, match",
    [
        ("own", {"num_inference_steps": 2}, "eta=0.5 would be ignored: .* PNDMScheduler, takes no eta"),
        ("own", {"steps": "fast"}, r"eta=0.5 would be ignored: .* FastScheduler\(sampler='dpmpp_2m'\)"),
        ("dpmpp_2m", {"num_inference_steps": 2}, r"FastScheduler\(sampler='dpmpp_2m'\).*make_scheduler"),
        ("ddim", {"num_inference_steps": 2, "early_stop": True}, r"FastScheduler\(sampler='ddim'\)"),
    ],
)
def test_eta_that_the_running_scheduler_would_drop_raises(scheduler, kwargs, match):
    p = fastdiff.StableDiffusionPipeline.from_pipe(tiny_pipeline("sd15"))
    assert type(p.scheduler).__name__ == "PNDMScheduler"
    if scheduler != "own":
        p.scheduler = fastdiff.make_scheduler(scheduler, like=p.scheduler)
    with pytest.raises(ValueError, match=match):
        p("a red circle", eta=0.5, **kwargs)


@pytest.mark.parametrize("eta", [float("nan"), -0.1, "0.5", True])
def test_eta_must_be_a_finite_non_negative_number(pipe, eta):
    with pytest.raises(ValueError, match=f"eta must be a finite number >= 0 .*got {eta!r}"):
        pipe("a red circle", num_inference_steps=2, eta=eta)


def test_eta_reaches_a_ddim_scheduler(pipe):
    from diffusers import DDIMScheduler

    p = fastdiff.StableDiffusionPipeline.from_pipe(pipe)
    p.scheduler = DDIMScheduler.from_config(p.scheduler.config)
    kw = dict(prompt="a red circle", num_inference_steps=3, output_type="latent")
    runs = [p(**kw, eta=eta, generator=torch.Generator().manual_seed(0)).images for eta in (0.0, 1.0)]
    assert not torch.equal(*runs)  # eta was used, not dropped


def test_conventions_kept_from_diffusers_are_documented():
    doc = fastdiff.StableDiffusionPipeline.__call__.__doc__
    for phrase in (
        "guidance_scale <= 1",
        "disables classifier-free guidance",
        "height",
        "strength",
        "prompt-major",
        'output_type="latent"',
        "eta",
    ):
        assert phrase in doc, phrase


@pytest.mark.parametrize("fastdiff_path", [False, True], ids=["diffusers-loop", "fastdiff-loop"])
@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (
            {"generator": "seed"},
            TypeError,
            "generator must be a torch.Generator, a list of them .* got 'seed'",
        ),
        ({"generator": [1]}, TypeError, "generator must be a torch.Generator"),
        ({"callback_on_step_end": 5}, TypeError, "callback_on_step_end must be callable or None, got 5"),
        (
            {"latents": torch.randn(1, 4, 3, 3)},
            ValueError,
            r"latents must have shape \(1, 4, 16, 16\) .* got \(1, 4, 3, 3\)",
        ),
        ({"latents": torch.randn(2, 4, 16, 16)}, ValueError, r"latents must have shape \(1, 4, 16, 16\)"),
        ({"latents": torch.full((1, 4, 16, 16), float("nan"))}, ValueError, "latents contain NaN or inf"),
        ({"latents": [[0.0]]}, TypeError, "latents must be a torch.Tensor or None, got list"),
    ],
)
def test_pipeline_call_rejects_bad_objects_before_running(
    pipe, monkeypatch, kwargs, error, match, fastdiff_path
):
    calls = []
    monkeypatch.setattr(pipe.unet, "forward", lambda *a, **k: calls.append(1))
    extra = {"steps": 2} if fastdiff_path else {"num_inference_steps": 2}
    if fastdiff_path and "callback_on_step_end" in kwargs:
        pytest.skip("callbacks are refused with fastdiff keywords (tested elsewhere)")
    with pytest.raises(error, match=match):
        pipe("a red circle", **kwargs, **extra)
    assert calls == []


def test_latents_of_the_right_shape_are_used(pipe):
    assert pipe.vae_scale_factor == 2 and pipe.unet.config.sample_size == 16  # the tiny test pipeline
    lat = torch.randn(2, 4, 16, 8, generator=torch.Generator().manual_seed(0))
    out = pipe(["a", "b"], height=32, width=16, latents=lat, num_inference_steps=2, output_type="latent")
    assert out.images.shape == (2, 4, 16, 8)


def test_bad_inputs_sweep_classifies_each_outcome():
    from benchmarks.bad_inputs import Case, _classify

    def boom(exc):
        def f():
            raise exc

        return f

    module = torch.nn.Linear(2, 2)

    def change_then_fail():
        module.weight.data.add_(1.0)
        raise ValueError("tolerance is bad")

    cases = {
        "clear": Case(
            "t", "a", boom(ValueError("tolerance must be > 0, got -1")), ValueError, ("tolerance",)
        ),
        "obscure": Case("t", "b", boom(ValueError("'>' not supported")), ValueError, ("tolerance",)),
        "silent": Case("t", "c", lambda: 1, ValueError, ("tolerance",)),
        "handled": Case("t", "d", lambda: 2, None, check=lambda r: r == 2),
        "changed": Case("t", "e", change_then_fail, ValueError, ("tolerance",), watch=lambda: module),
    }
    cases["wrong type"] = Case("t", "f", boom(KeyError("tolerance")), ValueError, ("tolerance",))
    got = {k: _classify(c)["outcome"] for k, c in cases.items()}
    assert got == {**{k: k for k in cases if k != "wrong type"}, "wrong type": "obscure"}


def test_a_pipeline_without_a_vae_can_preview_and_refine_latents():
    p = fastdiff.StableDiffusionPipeline.from_pipe(tiny_pipeline("sd15"))
    full = p(
        "a red circle",
        num_inference_steps=4,
        output_type="latent",
        generator=torch.Generator().manual_seed(0),
    )
    p.vae = None  # diffusers allows absent components; latent output needs no VAE
    kw = dict(num_inference_steps=4, output_type="latent", generator=torch.Generator().manual_seed(0))
    state = p("a red circle", preview_steps=2, **kw).fastdiff.state
    assert torch.equal(p.refine(state).images, full.images)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"min_snr_db": "x"}, "min_snr_db"),
        ({"min_cosine": float("nan")}, "min_cosine"),
        ({"force": 1}, "force"),
    ],
)
def test_gate_config_refuses_non_numbers_naming_the_field(kwargs, name):
    from fastdiff.engines import GateConfig

    with pytest.raises(TypeError, match=rf"GateConfig\.{name} must be"):
        GateConfig(**kwargs)
    assert GateConfig(min_snr_db=25, min_cosine=None).min_snr_db == 25  # numbers and None stay valid
