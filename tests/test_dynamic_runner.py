"""The sampling runner's contracts added in #10/#12: snapshots, the rows-retired hook, planners and
controllers as protocols, draft validation before any run, the scheduler adapter, EarlyStop's sigma guard.

Uses the exact per-row Gaussian denoiser of test_dynamic (closed-form x0, rows converging at different speeds).
"""

from __future__ import annotations

import pytest
import torch
from diffusers import DDIMScheduler, EulerAncestralDiscreteScheduler, EulerDiscreteScheduler, LCMScheduler
from dynamic_helpers import SD_BETAS, GaussianRows, assert_rows_match_alone, dpm, gaussian_case, tiny_unet
from hypothesis import given, settings
from hypothesis import strategies as st

from fastdiff.dynamic import AutoSteps, Controller, EarlyStop, StepChoice, draft_and_refine, resume, sample
from fastdiff.dynamic.adapters import SchedulerAdapter
from fastdiff.pipelines.plan import plan_call


class RowsSeen(GaussianRows):
    """GaussianRows that also records the rows of every call."""

    def __init__(self, *a):
        super().__init__(*a)
        self.rows_seen = []

    def __call__(self, x, t, rows=None):
        self.rows_seen.append(rows.tolist())
        return super().__call__(x, t, rows=rows)


def test_rows_retired_hook_reports_the_rows_of_later_calls():
    sch = dpm()
    mu, s, x = gaussian_case()
    model = RowsSeen(mu, s, sch)
    events = []

    def hook(remaining):
        assert remaining.dtype == torch.long
        events.append((len(model.rows_seen), remaining.tolist()))

    res = sample(model, x, scheduler=sch, num_inference_steps=[4, 9, 6], on_rows_retired=hook)
    assert res.steps_run == [4, 9, 6]
    assert [rows for _, rows in events] == [[1, 2], [1], []]
    assert [calls for calls, _ in events] == [4, 6, 9]
    for calls, rows in events[:-1]:
        assert all(seen == rows for seen in model.rows_seen[calls : calls + 1]), (
            "the next call covers these rows"
        )


@settings(max_examples=10, deadline=None)
@given(counts=st.lists(st.integers(1, 6), min_size=3, max_size=3), rtol=st.sampled_from([1e-9, 0.05, 0.3]))
def test_rows_retired_hook_always_names_the_rows_of_the_next_call(counts, rtol):
    sch = dpm()
    mu, s, x = gaussian_case()
    model = RowsSeen(mu, s, sch)
    events = []
    stop = EarlyStop(rtol=rtol, patience=1, min_steps=1, max_sigma=None)
    res = sample(
        model,
        x,
        scheduler=sch,
        num_inference_steps=counts,
        controller=stop,
        on_rows_retired=lambda r: events.append((len(model.rows_seen), r.tolist())),
    )
    assert events[-1] == (res.nfe, []), "the last event: no row left, after the last call"
    previous = [0, 1, 2]
    for calls, rows in events:
        assert set(rows) < set(previous) and rows == sorted(rows), "the running set only shrinks"
        previous = rows
        if rows:
            assert model.rows_seen[calls] == rows, "the next model call covers exactly these rows"


def test_rows_retired_hook_sees_early_stops_and_survives_resume():
    sch = dpm()
    mu, s, x = gaussian_case()
    events = []
    stop = EarlyStop(rtol=0.05, patience=1, min_steps=2, max_sigma=None)
    part = sample(
        GaussianRows(mu, s, sch),
        x,
        scheduler=sch,
        num_inference_steps=30,
        controller=stop,
        stop_after=3,
        on_rows_retired=lambda r: events.append(r.tolist()),
    )
    assert part.stopped_early[2], "the near-delta row leaves at once"
    assert events == [[r for r in range(3) if not part.stopped_early[r]]] and len(events[0]) < 3
    done = resume(part.state)
    assert events[-1] == [] and all(len(b) < len(a) for a, b in zip(events, events[1:]))
    assert sum(done.stopped_early) + sum(n == 30 for n in done.steps_run) == 3
    with pytest.raises(TypeError, match="on_rows_retired"):
        sample(GaussianRows(mu, s, sch), x, scheduler=sch, num_inference_steps=3, on_rows_retired=5)


def test_state_copy_is_an_independent_snapshot():
    sch = dpm()
    mu, s, x = gaussian_case()
    part = sample(
        GaussianRows(mu, s, sch),
        x,
        scheduler=sch,
        num_inference_steps=10,
        stop_after=4,
        controller=EarlyStop(rtol=1e-9),
    )
    snapshot = part.state.copy()
    a = resume(part.state.copy(), stop_after=2)
    b = resume(part.state.copy(), stop_after=2)
    assert a.steps_run == b.steps_run == [6, 6, 6] and torch.equal(a.latents, b.latents)
    full = resume(snapshot)
    ref = sample(GaussianRows(mu, s, sch), x, scheduler=sch, num_inference_steps=10)
    assert (full.latents - ref.latents).abs().max() <= 1e-5 * ref.latents.abs().max()


@pytest.mark.parametrize("shared", [True, False], ids=["one-generator", "generator-per-row"])
def test_a_copied_stochastic_run_resumes_exactly(shared):
    """regression: copy() cloned a generator that per-row tracks share once per track, so after a pause
    each row drew its noise from its own copy of the stream and a refined preview differed from the
    uninterrupted run (ancestral sampling draws noise at every step)."""
    sch = EulerAncestralDiscreteScheduler(**SD_BETAS)
    mu, s, x = gaussian_case()

    def gen():
        if shared:
            return torch.Generator().manual_seed(3)
        return [torch.Generator().manual_seed(3 + i) for i in range(x.shape[0])]

    kw = dict(scheduler=sch, num_inference_steps=10, controller=EarlyStop(rtol=1e-9))
    full = sample(GaussianRows(mu, s, sch), x, generator=gen(), **kw)
    part = sample(GaussianRows(mu, s, sch), x, generator=gen(), stop_after=4, **kw)
    copied = resume(part.state.copy())
    assert torch.equal(copied.latents, full.latents)
    assert torch.equal(resume(part.state).latents, full.latents)  # the original, after its copy ran


def test_auto_steps_when_every_row_finishes_during_the_probe():
    # regression (#10): max() of an empty sequence once the probe had run every row's whole schedule
    sch = dpm()
    mu, s, x = gaussian_case()
    table = {"tiers": {t: [[1.0, 2]] for t in ("simple", "neutral", "detailed")}}
    auto = AutoSteps(None, min_steps=2, max_steps=4, probe_steps=2, table=table)
    events = []
    res = sample(
        GaussianRows(mu, s, sch),
        x,
        scheduler=sch,
        num_inference_steps=auto,
        on_rows_retired=lambda r: events.append(r.tolist()),
    )
    assert res.finished and res.steps_run == [2, 2, 2] and res.nfe == 2 and events == [[]]
    solo = sample(GaussianRows(mu, s, sch), x, scheduler=sch, num_inference_steps=2)
    assert (res.latents - solo.latents).abs().max() < 1e-5


class Fixed:
    """A minimal StepPlanner written against the protocol, not a subclass."""

    probe_steps = 1
    probe_schedule = 5

    def choose(self, x0_probe):
        return [StepChoice(steps=5 + 2 * r, reason=f"row {r}") for r in range(x0_probe.shape[0])]


def test_any_step_planner_is_a_hook_not_a_special_case():
    sch = dpm()
    mu, s, x = gaussian_case()
    res = sample(GaussianRows(mu, s, sch), x, scheduler=sch, num_inference_steps=Fixed())
    assert res.num_steps == [5, 7, 9] and res.notes == ["row 0", "row 1", "row 2"]
    assert_rows_match_alone(res, mu, s, x, sch, [5, 7, 9])


def test_controllers_follow_the_protocol():
    sch = dpm()
    mu, s, x = gaussian_case()

    class AfterThree(Controller):
        def should_stop(self, row, steps_done, num_steps, x0_change, sigma):
            return steps_done == 3

    res = sample(GaussianRows(mu, s, sch), x, scheduler=sch, num_inference_steps=8, controller=AfterThree())
    assert res.steps_run == [3, 3, 3] and all(res.stopped_early)
    with pytest.raises(TypeError, match="Controller"):
        sample(GaussianRows(mu, s, sch), x, scheduler=sch, num_inference_steps=8, controller=object())


def test_early_stop_sigma_guard_excludes_high_noise_steps():
    # regression (#12): calm steps above max_sigma were counted, so a row stopped at the first step below it
    stop = EarlyStop(rtol=0.01, patience=2, min_steps=1)
    assert stop.max_sigma == 1.0, "one default: sigma <= 1, as the docstring and README say"
    stop.reset(1)
    for sigma in (8.0, 4.0, 2.0):
        assert not stop.should_stop(0, 5, 30, 0.001, sigma=sigma)
    assert not stop.should_stop(0, 6, 30, 0.001, sigma=0.9), "only one calm step below the guard so far"
    assert stop.should_stop(0, 7, 30, 0.001, sigma=0.8)
    unguarded = EarlyStop(rtol=0.01, patience=2, min_steps=1, max_sigma=None)
    unguarded.reset(1)
    assert not unguarded.should_stop(0, 1, 30, 0.001, sigma=8.0)
    assert unguarded.should_stop(0, 2, 30, 0.001, sigma=8.0)


def test_early_stop_guard_in_a_run_needs_patience_below_max_sigma():
    sch = dpm()
    mu, s, x = gaussian_case()
    res = sample(
        GaussianRows(mu, s, sch),
        x,
        scheduler=sch,
        num_inference_steps=30,
        controller=EarlyStop(rtol=0.05, patience=2, min_steps=2, max_sigma=1.0),
    )
    table = res.trace_table()
    assert res.stopped_early[2]
    k = res.steps_run[2]
    assert (table["sigma"][k - 2 : k, 2] <= 1.0).all(), "both calm steps counted were at sigma <= 1"


def test_draft_strength_without_refine_steps_fails_before_the_draft_runs():
    # regression (#10): the draft ran first and the strength was rejected afterwards
    sch = dpm()
    mu, s, x = gaussian_case()
    draft_model = GaussianRows(mu, s, sch)
    with pytest.raises(ValueError, match=r"strength 0.05 leaves no refine step of 10"):
        draft_and_refine(
            draft_model,
            GaussianRows(mu, s, sch),
            x,
            draft_scheduler=LCMScheduler(**SD_BETAS),
            draft_steps=2,
            scheduler=sch,
            num_inference_steps=10,
            strength=0.05,
        )
    assert draft_model.batch_sizes == []


def test_draft_and_refine_counts_one_nfe_and_resumes():
    sch = dpm()
    mu, s, x = gaussian_case()
    kw = dict(
        draft_scheduler=LCMScheduler(**SD_BETAS),
        draft_steps=3,
        scheduler=sch,
        num_inference_steps=20,
        strength=0.5,
        noise=torch.randn(x.shape, generator=torch.Generator().manual_seed(1)),
    )
    g = lambda: torch.Generator().manual_seed(7)  # noqa: E731 - LCM draws noise between its steps
    full = draft_and_refine(GaussianRows(mu, s, sch), GaussianRows(mu, s, sch), x, generator=g(), **kw)
    part = draft_and_refine(
        GaussianRows(mu, s, sch), GaussianRows(mu, s, sch), x, generator=g(), stop_after=4, **kw
    )
    assert part.nfe == 3 + 4 and part.trace[-1].nfe == 7
    done = resume(part.state)
    assert done.nfe == full.nfe == 3 + 10 and done.nfe_per_sample == [13] * 3 and done.draft is not None
    assert torch.equal(done.latents, full.latents)


@pytest.mark.parametrize("make", [dpm, lambda: EulerDiscreteScheduler(**SD_BETAS)], ids=["dpm", "euler"])
def test_adapter_coefficients_match_the_schedulers_own(make):
    sch = make()
    sch.set_timesteps(12)
    adapter = SchedulerAdapter(sch)
    for i, t in enumerate(sch.timesteps):
        alpha, sigma = adapter.vp_coefficients(i, t)
        s = float(sch.sigmas[i])  # VE sigma = sigma_t / alpha_t, with alpha_t^2 + sigma_t^2 = 1
        assert abs(sigma / alpha - s) <= 1e-6 * s and abs(alpha**2 + sigma**2 - 1) < 1e-12


def test_adapter_uses_alpha_bar_for_ddim_and_native_coefficients_when_offered():
    sch = DDIMScheduler(**SD_BETAS)
    sch.set_timesteps(5)
    t = sch.timesteps[2]
    alpha, sigma = SchedulerAdapter(sch).vp_coefficients(2, t)
    assert abs(alpha**2 - float(sch.alphas_cumprod[int(t)])) < 1e-7

    class Native(DDIMScheduler):
        def vp_coefficients(self, index):
            return 0.6, 0.8

    assert SchedulerAdapter(Native(**SD_BETAS)).vp_coefficients(0, t) == (0.6, 0.8)


def test_plan_is_pure_and_names_bad_values():
    assert plan_call(("a cat",), {"num_inference_steps": 4}) is None, "no fastdiff keyword: diffusers' loop"
    plan = plan_call(("a plain cat",), {"output_type": "np", "generator": None}, steps="auto")
    assert (
        plan.planner.prompts == ["a plain cat"]
        and plan.num_inference_steps == 30
        and plan.use_default_sampler
    )
    assert plan.output_type == "np" and "output_type" not in plan.kwargs
    plan = plan_call((), {"num_inference_steps": 12}, early_stop=True)
    assert (
        plan.num_inference_steps == 12
        and isinstance(plan.controller, EarlyStop)
        and not plan.use_default_sampler
    )
    with pytest.raises(ValueError, match=r"steps=4, num_inference_steps=5"):
        plan_call((), {"num_inference_steps": 5}, steps=4)
    with pytest.raises(ValueError, match=r"output_type must be one of .* got 'jpg'"):
        plan_call((), {"output_type": "jpg"}, steps=4)
    with pytest.raises(ValueError, match=r"preview_steps must be an int >= 1 or None, got 0"):
        plan_call((), {}, preview_steps=0)
    with pytest.raises(ValueError, match=r"draft strength 0.3 leaves no refine step of 2"):
        plan_call((), {"num_inference_steps": 2}, draft={"model": tiny_unet(), "strength": 0.3})
    with pytest.raises(ValueError, match="text-to-image"):
        plan_call((), {}, steps="auto", text_to_image=False)


def test_snapshot_keeps_fastschedulers_full_precision_shadow_of_an_fp16_state():
    from fastdiff.samplers import make_scheduler

    sch = make_scheduler("dpmpp_2m")
    x = torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(0)).half()
    model = lambda v, t: (0.5 * v.float()).half()  # noqa: E731 - a smooth fp16 toy eps-model
    full = sample(model, x, scheduler=sch, num_inference_steps=10)
    part = sample(model, x, scheduler=sch, num_inference_steps=10, stop_after=4)
    assert torch.equal(resume(part.state.copy()).latents, full.latents)
