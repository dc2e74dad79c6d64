"""Step cache: bit-identity when off, hand-computed reuse, first/last steps, undo, rows, gating, errors.

References never go through the cache: they call the original U-Net, or its submodules by hand with
features captured by plain forward hooks on an uncached forward.
"""

from __future__ import annotations

import pytest
import torch

from fastdiff import installed
from fastdiff.caching import StepProfile, measure_profile, plan_refresh, step_cache
from fastdiff.testing import tiny_pipeline, unet_probe_inputs

TS = [901.0, 701.0, 501.0, 301.0, 101.0]


@pytest.fixture(scope="module")
def pipe():
    p = tiny_pipeline("sd15", seed=3)
    p.set_progress_bar_config(disable=True)
    return p


@pytest.fixture
def unet(pipe):
    yield pipe.unet
    installed.undo_all(pipe.unet)
    installed.undo_all(pipe)


def _inputs(unet, batch=2, seed=0):
    inp = unet_probe_inputs(unet, batch=batch, seed=seed)
    inp.pop("timestep")
    return inp


def _call(unet, inp, t, x=None):
    kw = dict(inp)
    if x is not None:
        kw["sample"] = x
    return unet(timestep=torch.tensor(t), **kw).sample


def _capture(module):
    """Record what `module` returns on the next forward (a plain hook, independent of the cache)."""
    box = {}
    h = module.register_forward_hook(lambda m, a, out: box.__setitem__("out", out))
    return box, h


def _rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


def _temb(unet, t, batch):
    return unet.time_embedding(unet.time_proj(torch.full((batch,), t)).to(unet.dtype))


def _tail(unet, h):
    return unet.conv_out(unet.conv_act(unet.conv_norm_out(h)))


def _run_pipe(p, steps=6, **kw):
    g = torch.Generator().manual_seed(0)
    return p(
        "a red cat", num_inference_steps=steps, generator=g, output_type="pt", height=32, width=32, **kw
    ).images


def test_reset_stats_counts_the_next_run_afresh(pipe):
    h = step_cache(pipe, mode="uniform", interval=3)
    try:
        _run_pipe(pipe)
        once = (
            h.stats.unet_calls,
            h.stats.full_calls,
            h.stats.cached_calls,
            [dict(r) for r in h.stats.trace],
        )
        _run_pipe(pipe)
        assert h.stats.runs == 2 and h.stats.unet_calls == 2 * once[0]
        h.reset_stats()
        assert h.stats.runs == 0 and h.stats.unet_calls == 0 and h.last_run() is None
        _run_pipe(pipe)
        again = (h.stats.unet_calls, h.stats.full_calls, h.stats.cached_calls, h.stats.trace)
        assert h.stats.runs == 1 and again == once and once[2] > 0
    finally:
        installed.undo_all(pipe)


# --------------------------------------------------------------------------- identity
def test_off_and_disabled_are_bit_identical_to_the_original(pipe):
    ref = _run_pipe(pipe)
    h = step_cache(pipe, mode="off")
    try:
        assert torch.equal(_run_pipe(pipe), ref)
        h.set("uniform", interval=3)
        h.enabled = False
        assert torch.equal(_run_pipe(pipe), ref)
        assert h.stats.cached_calls == 0
        h.enabled = True
        cached = _run_pipe(pipe)
        assert not torch.equal(cached, ref)  # the cache really acts when enabled
    finally:
        installed.undo_all(pipe)


def test_consecutive_pipeline_calls_do_not_share_state(pipe):
    h = step_cache(pipe, mode="uniform", interval=3)
    try:
        first = _run_pipe(pipe)
        trace = [dict(r) for r in h.stats.trace]
        second = _run_pipe(pipe)
        assert torch.equal(first, second) and h.stats.trace == trace and h.stats.runs == 2
        assert [r["full"] for r in trace] == [True, False, False, True, False, False, True]  # PNDM: 7 steps
    finally:
        installed.undo_all(pipe)


def test_undo_removes_every_wrapper_and_hook(pipe):
    ref = _run_pipe(pipe)
    step_cache(pipe, mode="uniform", interval=2, gate_step=1)
    _run_pipe(pipe)
    assert installed.undo_all(pipe) == 1
    assert not [n for n, m in pipe.unet.named_modules() if "forward" in m.__dict__]
    assert not pipe.unet._forward_pre_hooks and not pipe.unet._forward_hooks
    assert not installed.installations(pipe)
    assert torch.equal(_run_pipe(pipe), ref)
    step_cache(pipe.unet, mode="uniform")  # can be installed again after undo
    installed.undo_all(pipe.unet)


def test_first_and_last_steps_run_the_full_unet(pipe):
    seen = []  # (sample, timestep, context, output) of every U-Net call, by a plain hook
    hook = pipe.unet.register_forward_hook(
        lambda m, a, kw, out: seen.append((a[0].clone(), a[1], kw["encoder_hidden_states"], out[0].clone())),
        with_kwargs=True,
    )
    try:
        h = step_cache(pipe, mode="uniform", interval=100)
        _run_pipe(pipe, steps=6)
        installed.undo_all(pipe)
        full = [r["full"] for r in h.stats.trace]
        assert full[0] and full[-1] and not any(full[1:-1])
        for x, t, ctx, out in (seen[0], seen[-1]):  # the original U-Net on the inputs the cached run used
            with torch.no_grad():
                assert torch.equal(pipe.unet(x, t, encoder_hidden_states=ctx).sample, out)
    finally:
        hook.remove()
        installed.undo_all(pipe)


# --------------------------------------------------------------------------- hand-computed reuse
def _deep_feature(unet, inp, t, module):
    box, h = _capture(module)
    _call(unet, inp, t)
    h.remove()
    return box["out"]


@pytest.mark.parametrize("branch", [0, 1])
def test_cached_step_equals_hand_computed_reuse(unet, branch):
    inp = _inputs(unet)
    x1 = torch.randn(inp["sample"].shape, generator=torch.Generator().manual_seed(5))
    ctx, b = inp["encoder_hidden_states"], x1.shape[0]
    up0, up1 = unet.up_blocks
    # the feature a cached step reads: up1.attentions[0] (branch 0) / up0's upsampler (branch 1),
    # captured on an uncached forward at the full step
    entry = up1.attentions[0] if branch == 0 else up0.upsamplers[0]
    stored = _deep_feature(unet, inp, TS[0], entry)
    stored = stored[0] if isinstance(stored, tuple) else stored

    with torch.no_grad():
        temb = _temb(unet, TS[1], b)
        s0 = unet.conv_in(x1)
        if branch == 0:
            h = up1.resnets[1](torch.cat([stored, s0], 1), temb)
            h = up1.attentions[1](h, encoder_hidden_states=ctx, return_dict=False)[0]
        else:
            d0 = unet.down_blocks[0]
            s1 = d0.attentions[0](d0.resnets[0](s0, temb), encoder_hidden_states=ctx, return_dict=False)[0]
            h = up1.resnets[0](torch.cat([stored, s1], 1), temb)
            h = up1.attentions[0](h, encoder_hidden_states=ctx, return_dict=False)[0]
            h = up1.resnets[1](torch.cat([h, s0], 1), temb)
            h = up1.attentions[1](h, encoder_hidden_states=ctx, return_dict=False)[0]
        ref = _tail(unet, h)

    handle = step_cache(unet, mode="uniform", interval=3, branch=branch)
    handle.set_schedule(TS)
    with torch.no_grad():
        full = _call(unet, inp, TS[0])
        cached = _call(unet, inp, TS[1], x1)
        cached2 = _call(unet, inp, TS[2], x1)  # the second cached step reuses the same feature
    assert [r["full"] for r in handle.stats.trace] == [True, False, False]
    assert torch.equal(full, _call_uncached(unet, inp, TS[0]))
    assert _rel(cached, ref) < 1e-6
    assert _rel(cached, cached2) > 1e-4  # the fresh part still sees the new timestep


def _call_uncached(unet, inp, t):
    return _plain(unet, inp, t, None)


# --------------------------------------------------------------------------- rows
@pytest.mark.parametrize("groups", [1, 2])
def test_keep_rows_matches_running_the_remaining_rows_alone(unet, groups):
    gen = torch.Generator().manual_seed(9)
    rows, keep = 3, torch.tensor([0, 2])
    x = torch.randn(rows, 4, 8, 8, generator=gen)
    ctx = torch.randn(rows * groups, 8, unet.config.cross_attention_dim, generator=gen)

    def batch(xr):
        return torch.cat([xr] * groups)

    def ctx_rows(idx):
        return torch.cat([ctx[idx + g * rows] for g in range(groups)])

    handle = step_cache(unet, mode="uniform", interval=4)
    handle.set_schedule(TS)
    with torch.no_grad():
        unet(batch(x), TS[0], encoder_hidden_states=ctx)
        handle.keep_rows(keep, num_rows=rows)
        x1 = x[keep] * 0.9
        got = unet(batch(x1), TS[1], encoder_hidden_states=ctx_rows(keep)).sample
        assert handle.stats.cached_calls == 1 and handle.stats.forced_refreshes == 0
        installed.undo_all(unet)

        alone = step_cache(unet, mode="uniform", interval=4)
        alone.set_schedule(TS)
        unet(batch(x[keep]), TS[0], encoder_hidden_states=ctx_rows(keep))
        want = unet(batch(x1), TS[1], encoder_hidden_states=ctx_rows(keep)).sample
    assert _rel(got, want) < 1e-5


def test_a_shrunk_batch_without_keep_rows_runs_in_full(unet):
    inp = _inputs(unet, batch=3)
    handle = step_cache(unet, mode="uniform", interval=4)
    handle.set_schedule(TS)
    with torch.no_grad():
        _call(unet, inp, TS[0])
        small = {k: v[:2] for k, v in inp.items()}
        got = _call(unet, small, TS[1])
    assert handle.stats.forced_refreshes == 1 and handle.stats.cached_calls == 0
    assert torch.equal(got, _call_uncached(unet, small, TS[1]))


def test_split_guidance_calls_and_repeated_timesteps_are_found(unet):
    """Two calls per step get separate slots; PNDM's repeated first timestep is a new step."""
    inp = _inputs(unet, batch=1)
    handle = step_cache(unet, mode="uniform", interval=2)
    ts = [901.0, 801.0, 801.0, 701.0]
    handle.set_schedule(ts)
    with torch.no_grad():
        for t in ts:
            _call(unet, inp, t)
            _call(unet, inp, t)
    assert [r["t"] for r in handle.stats.trace] == ts
    assert [r["full"] for r in handle.stats.trace] == [True, False, True, True]
    assert handle.stats.unet_calls == 8 and handle.stats.cached_calls == 2


def test_begin_step_announces_steps_instead_of_reading_the_timestep(unet):
    inp = _inputs(unet, batch=1)
    handle = step_cache(unet, mode="uniform", interval=2)
    ts = [901.0, 801.0, 801.0, 701.0]
    handle.set_schedule(ts)
    with torch.no_grad():
        for t in ts:
            handle.begin_step(t)
            a = _call(unet, inp, t)
            b = _call(unet, inp, t)  # a second call in the same step: its own slot
            assert torch.equal(a, b)
    assert [r["full"] for r in handle.stats.trace] == [True, False, True, True]
    assert handle.stats.unet_calls == 8 and handle.stats.cached_calls == 2


# --------------------------------------------------------------------------- adaptive, schedule, gate
def test_adaptive_signal_is_the_probe_change_and_thresholds_decide(unet):
    inp = _inputs(unet)
    probe = unet.down_blocks[0].attentions[0]  # branch 0 probes the first real layer
    outs = []
    for t in TS[:3]:
        o = _deep_feature(unet, inp, t, probe)
        outs.append(o[0] if isinstance(o, tuple) else o)
    change = float((outs[1] - outs[0]).abs().mean().detach() / outs[0].abs().mean().detach())

    handle = step_cache(unet, mode="adaptive", threshold=1e6, max_skip=1)
    handle.set_schedule(TS)
    with torch.no_grad():
        for t in TS:
            _call(unet, inp, t)
    trace = handle.stats.trace
    assert trace[1]["signal"] == pytest.approx(change, rel=1e-4)
    assert [r["full"] for r in trace] == [True, False, True, False, True]  # max_skip=1 caps the skips
    handle.set("adaptive", threshold=1e-9)
    with torch.no_grad():
        for t in TS:
            _call(unet, inp, t)
    assert all(r["full"] for r in handle.stats.trace)


def test_planned_schedule_minimises_staleness_cost():
    weight = [0.0, 0.5, 0.4, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.0]
    prof = StepProfile(tuple(i / 9 for i in range(10)), tuple(weight))
    full = plan_refresh(prof, 10, 4, max_gap=9)  # the cost alone (the bound: test_step_cache_plan.py)
    assert full[0] == 0 and full[-1] == 9 and len(full) == 4
    assert {1, 2} & set(full)  # refreshes go where replaying hurts
    w = prof.at(10)

    def cost(plan):  # independent brute force over every plan with the same budget
        total = 0.0
        for r, nxt in zip(plan, plan[1:]):
            total += sum(w[k] * (k - r) for k in range(r + 1, nxt))
        return total

    import itertools

    best = min(cost([0, *mid, 9]) for mid in itertools.combinations(range(1, 9), 2))
    assert cost(full) == pytest.approx(best)
    assert plan_refresh(prof, 2, 1) == [0, 1]


def test_measure_profile_prices_every_gap_on_the_images(pipe):
    ref = _run_pipe(pipe, steps=4, guidance_scale=3.0)
    prof = measure_profile(
        pipe, ["a red cat"], num_inference_steps=4, seed=0, gaps=True, guidance_scale=3.0, height=32, width=32
    )
    assert not installed.installations(pipe)
    assert torch.equal(_run_pipe(pipe, steps=4, guidance_scale=3.0), ref)
    assert prof.source == "sensitivity" and len(prof.weight) == 4 and prof.weight[0] == prof.weight[-1] == 0
    # each gap by hand: an explicit schedule, the image MSE against the uncached run
    for a, b in ((0, 2), (1, 3), (0, 3)):
        step_cache(pipe, mode="schedule", refresh=[s for s in range(4) if not a < s < b])
        img = _run_pipe(pipe, steps=4, guidance_scale=3.0)
        installed.undo_all(pipe)
        mse = float((img.double() - ref.double()).square().mean())
        assert mse > 0
        assert prof.gap_cost[a][b - a - 1] == pytest.approx(mse, rel=1e-6)
        if b == a + 2:
            assert prof.weight[a + 1] == pytest.approx(mse, rel=1e-6)
    assert all(prof.gap_cost[a][0] == 0 for a in range(4))


def test_measure_profile_default_replays_each_step_alone(pipe):
    def latents():
        g = torch.Generator().manual_seed(0)
        out = pipe(
            "a red cat",
            num_inference_steps=4,
            generator=g,
            output_type="latent",
            guidance_scale=3.0,
            height=32,
            width=32,
        )
        return out.images.double()

    ref = latents()
    prof = measure_profile(
        pipe, ["a red cat"], num_inference_steps=4, seed=0, guidance_scale=3.0, height=32, width=32
    )
    assert prof.gap_cost is None and prof.weight[0] == prof.weight[-1] == 0
    for k in (1, 2):
        step_cache(pipe, mode="schedule", refresh=[s for s in range(4) if s != k])
        lat = latents()
        installed.undo_all(pipe)
        assert prof.weight[k] == pytest.approx(float((lat - ref).norm() / ref.norm()), rel=1e-5)
    assert not installed.installations(pipe)


@pytest.mark.parametrize("on", ["pipe", "unet"])
@pytest.mark.parametrize("gaps", [False, True])
def test_measure_profile_refuses_a_pipeline_with_a_cache_and_leaves_the_cache_alone(pipe, on, gaps):
    handle = step_cache(pipe if on == "pipe" else pipe.unet, mode="uniform", interval=2)
    try:
        with pytest.raises(RuntimeError, match="before fastdiff.step_cache"):
            measure_profile(pipe, ["a red cat"], num_inference_steps=4, gaps=gaps, height=32, width=32)
        assert handle.mode == "uniform" and handle.interval == 2 and handle.installed
    finally:
        installed.undo_all(pipe)
        installed.undo_all(pipe.unet)


def test_gated_cross_attention_replays_the_gate_step(unet):
    inp = _inputs(unet)
    attn2 = [m.attn2 for m in unet.modules() if type(m).__name__ == "BasicTransformerBlock"]
    x1 = inp["sample"] * 0.5
    # reference: the original U-Net whose cross-attentions return what they returned at the gate step
    kept = {}
    hooks = [a.register_forward_hook(lambda m, a_, out: kept.__setitem__(m, out)) for a in attn2]
    with torch.no_grad():
        _call(unet, inp, TS[0])
    for h in hooks:
        h.remove()
    hooks = [a.register_forward_hook(lambda m, a_, out: kept[m]) for a in attn2]
    with torch.no_grad():
        ref = _call(unet, inp, TS[1], x1)
    for h in hooks:
        h.remove()

    handle = step_cache(unet, mode="off", gate_step=0)
    handle.set_schedule(TS)
    with torch.no_grad():
        _call(unet, inp, TS[0])
        got = _call(unet, inp, TS[1], x1)
    assert handle.stats.gated_calls == 1
    assert torch.equal(got, ref)
    assert not torch.equal(got, _plain(unet, inp, TS[1], x1))  # gating really changed the output


def test_gate_uncond_runs_the_conditional_half_with_mean_cross_attention(unet):
    inp = _inputs(unet, batch=1)
    ctx = torch.cat([inp["encoder_hidden_states"] * 0.3, inp["encoder_hidden_states"]])  # [uncond; cond]
    x0 = torch.cat([inp["sample"]] * 2)
    x1 = x0 * 0.5
    attn2 = [m.attn2 for m in unet.modules() if type(m).__name__ == "BasicTransformerBlock"]
    kept = {}
    hooks = [
        a.register_forward_hook(lambda m, a_, out: kept.__setitem__(m, (out[:1] + out[1:]) / 2))
        for a in attn2
    ]
    with torch.no_grad():
        unet(x0, TS[0], encoder_hidden_states=ctx)
    for h in hooks:
        h.remove()
    hooks = [a.register_forward_hook(lambda m, a_, out: kept[m]) for a in attn2]
    with torch.no_grad():
        ref = unet(x1[1:], TS[1], encoder_hidden_states=ctx[1:]).sample
    for h in hooks:
        h.remove()

    handle = step_cache(unet, mode="off", gate_step=0, gate_uncond=True)
    handle.set_schedule(TS)
    with torch.no_grad():
        unet(x0, TS[0], encoder_hidden_states=ctx)
        got = unet(x1, TS[1], encoder_hidden_states=ctx).sample
        unequal = unet(torch.cat([x1[:1], x1[:1] * 2]), TS[2], encoder_hidden_states=ctx).sample
    assert handle.stats.halved_calls == 1 and got.shape[0] == 2
    assert torch.equal(got[0], got[1]) and torch.equal(got[1:], ref)
    assert unequal.shape[0] == 2 and handle.stats.forced_refreshes == 0  # not a pair: not halved
    assert torch.equal(
        unequal, _plain(unet, {"encoder_hidden_states": ctx}, TS[2], torch.cat([x1[:1], x1[:1] * 2]))
    )


def _plain(unet, inp, t, x):
    handle = unet.__dict__["_fastdiff_step_cache"]
    handle.enabled = False
    try:
        with torch.no_grad():
            return _call(unet, inp, t, x)
    finally:
        handle.enabled = True


# --------------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(mode="deep"), "mode must be one of"),
        (dict(interval=0), "interval must be an int >= 1, got 0"),
        (dict(branch=9), r"branch must be an int in \[0, 2\].*got 9"),
        (dict(mode="schedule"), "needs refresh="),
        (dict(mode="schedule", refresh=[0, -1]), "non-negative ints"),
        (dict(refresh=[0, 2]), "only used with mode='schedule'"),
        (dict(mode="adaptive", threshold=-1.0), "threshold must be a finite number > 0"),
        (dict(gate_step=1.5), "gate_step must be None or an int"),
        (dict(gate_uncond=True), "gate_uncond must be a bool and needs gate_step"),
    ],
)
def test_bad_arguments_name_the_argument(unet, kwargs, match):
    with pytest.raises(ValueError, match=match):
        step_cache(unet, **kwargs)
    assert not installed.installations(unet) and "forward" not in unet.conv_in.__dict__


def test_a_unit_replaced_after_install_is_refused_and_an_unused_one_is_not(pipe, unet):
    """A module swapped in after step_cache (e.g. by a later optimize pass) has no wrapper: a run that would
    replay, read or gate it raises; a swap of a module the policy never replays (conv_in, as CPU Winograd
    does) keeps the cache working, as installing it after the swap does (to float rounding: optimize's
    verification probe then runs through the cache)."""
    import copy

    import fastdiff

    inp = _inputs(unet)
    step_cache(unet, interval=2)
    original_mid = unet.mid_block
    unet.mid_block = copy.deepcopy(original_mid)  # replayed at branch 0
    try:
        with (
            torch.no_grad(),
            pytest.raises(RuntimeError, match="mid_block was replaced after the step cache"),
        ):
            _call(unet, inp, TS[0])
    finally:
        unet.mid_block = original_mid
    installed.undo_all(unet)

    def run():
        handle = unet.__dict__["_fastdiff_step_cache"]
        with torch.no_grad():
            for t in TS:
                out = _call(unet, inp, t)
        assert handle.last_run().cached_evals > 0
        return out

    fastdiff.optimize(unet, winograd=True, attention="math")  # conv_in becomes WinogradConv2d
    step_cache(unet, interval=2)
    after = run()
    installed.undo_all(unet)
    step_cache(unet, interval=2)
    fastdiff.optimize(unet, winograd=True, attention="math")
    assert type(unet.conv_in).__name__ == "WinogradConv2d"
    before = run()
    installed.undo_all(unet)
    torch.testing.assert_close(before, after, rtol=1e-4, atol=1e-5)


def test_refresh_steps_beyond_the_run_are_reported(unet):
    """An explicit refresh list made for a longer run: the steps past this run's end are named in the notes."""
    inp = _inputs(unet)
    handle = step_cache(unet, mode="schedule", refresh=[0, 2, 7, 9])
    handle.set_schedule(TS)
    with torch.no_grad():
        for t in TS:
            _call(unet, inp, t)
    run = handle.last_run()
    assert run.refresh_steps == (0, 2, 4)  # 4: the last step, always full
    assert any("refresh steps [7, 9] lie beyond this 5-step run" in n for n in run.notes)


def test_misuse_is_refused(unet):
    with pytest.raises(TypeError, match="UNet2DConditionModel"):
        step_cache(torch.nn.Linear(2, 2))
    with pytest.raises(TypeError, match=r"unknown step cache option 'intervall'; valid: interval, branch"):
        step_cache(unet, intervall=3)
    assert not installed.installations(unet)
    handle = step_cache(unet)
    with pytest.raises(RuntimeError, match="already installed"):
        step_cache(unet)
    with pytest.raises(ValueError, match="1-D integer tensor"):
        handle.keep_rows(torch.tensor([[0]]))
    inp = _inputs(unet)
    handle.set_schedule(TS)
    with torch.no_grad():
        _call(unet, inp, TS[0])
    with pytest.raises(ValueError, match="out of range"):
        handle.keep_rows(torch.tensor([0, 5]))
    with pytest.raises(ValueError, match="num_rows must divide"):
        handle.keep_rows(torch.tensor([0]), num_rows=3)
    res = tuple(torch.zeros(1) for _ in range(3))
    with pytest.raises(NotImplementedError, match="ControlNet"):
        unet(
            timestep=torch.tensor(1.0),
            down_block_additional_residuals=res,
            mid_block_additional_residual=torch.zeros(1),
            **inp,
        )


# --------------------------------------------------------------------------- architectures and img2img
@pytest.mark.parametrize("arch", ["sd21", "sdxl"])
def test_other_architectures_cache_and_restore(arch):
    p = tiny_pipeline(arch, seed=1)
    p.set_progress_bar_config(disable=True)
    ref = _run_pipe(p, steps=5)
    h = step_cache(p, mode="uniform", interval=3, gate_step=2, gate_uncond=True)
    cached = _run_pipe(p, steps=5)
    full = [r["full"] for r in h.stats.trace]
    assert full[0] and full[-1] and not all(full) and not h.stats.notes
    assert h.stats.halved_calls > 0 and not torch.equal(cached, ref)
    installed.undo_all(p)
    assert torch.equal(_run_pipe(p, steps=5), ref)


def test_img2img_runs_start_mid_schedule(pipe):
    from diffusers import StableDiffusionImg2ImgPipeline

    i2i = StableDiffusionImg2ImgPipeline.from_pipe(pipe)
    i2i.set_progress_bar_config(disable=True)
    image = torch.rand(1, 3, 32, 32)

    def run():
        g = torch.Generator().manual_seed(0)
        return i2i(
            "a red cat", image=image, strength=0.5, num_inference_steps=10, generator=g, output_type="pt"
        ).images

    ref = run()
    h = step_cache(i2i, mode="uniform", interval=2)
    try:
        run()
        trace = h.stats.trace
        assert h.run_length == len(trace) and not h.stats.notes  # the shortened run was located
        assert trace[0]["full"] and trace[-1]["full"] and not trace[1]["full"]
    finally:
        installed.undo_all(i2i)
    assert torch.equal(run(), ref)


# --------------------------------------------------------------------------- fastdiff's drop-in pipelines
@pytest.fixture
def fpipe(pipe):
    import diffusers

    import fastdiff

    p = fastdiff.StableDiffusionPipeline.from_pipe(pipe)
    p.scheduler = diffusers.DDIMScheduler.from_config(p.scheduler.config)  # one evaluation per step
    p.set_progress_bar_config(disable=True)
    yield p
    fastdiff.restore(p)


ROWS_PROMPTS = ["a red cat", "a blue square on a striped background", "a green circle"]
EARLY = {"rtol": 0.2, "patience": 1, "min_steps": 2, "max_sigma": None}


def _rows_latents():
    lat = torch.randn(len(ROWS_PROMPTS), 4, 4, 4, generator=torch.Generator().manual_seed(7))
    return lat * torch.tensor([1.0, 0.3, 3.0]).view(-1, 1, 1, 1)  # rows that settle at different steps


def _early_call(p, prompts, latents, rtol=0.2):
    return p(
        prompts,
        latents=latents,
        num_inference_steps=9,
        early_stop={**EARLY, "rtol": rtol},
        guidance_scale=4.0,
        output_type="latent",
        height=8,
        width=8,
    )


# (cache settings, EarlyStop rtol) where rows stop at different steps right before a cached step
@pytest.mark.parametrize(
    "opts, rtol",
    [
        (dict(mode="uniform", interval=3), 0.1),
        (dict(mode="schedule", refresh=[0, 2, 6], gate_step=2, gate_uncond=True), 0.2),
        (dict(mode="uniform", interval=3, forecast="linear"), 0.1),
    ],
    ids=["uniform", "schedule+gate_uncond", "uniform+forecast"],
)
def test_pipeline_rows_stopping_at_different_steps_match_each_row_run_alone(fpipe, opts, rtol):
    import fastdiff

    latents = _rows_latents()
    fastdiff.step_cache(fpipe, **opts)
    batched = _early_call(fpipe, ROWS_PROMPTS, latents, rtol)
    steps = batched.fastdiff.steps
    assert len(set(steps)) > 1, steps  # rows really left the batch at different steps
    run = batched.fastdiff.step_cache
    assert run.forced_refreshes == 0 and run.cached_evals > 0  # rows followed, not refreshed in full
    alone = [_early_call(fpipe, [p], latents[i : i + 1], rtol) for i, p in enumerate(ROWS_PROMPTS)]
    for i, out in enumerate(alone):
        assert out.fastdiff.steps == [steps[i]]
        # fp32 batch-size rounding alone differs by ~1e-5 here (uncached as well)
        assert _rel(batched.images[i : i + 1], out.images) < 1e-4, i
    # Without the hook the cache cannot tell which rows left: it refreshes in full (never replays another
    # row's features), and the rows that ran on then differ from their runs alone.
    fpipe.fastdiff_on_rows_retired = None
    unfollowed = _early_call(fpipe, ROWS_PROMPTS, latents, rtol)
    assert unfollowed.fastdiff.step_cache.forced_refreshes > 0
    assert max(_rel(unfollowed.images[i : i + 1], out.images) for i, out in enumerate(alone)) > 1e-2


def test_pipeline_rows_hook_composes_with_the_users_and_restore_removes_it(fpipe):
    import fastdiff
    from fastdiff.caching.pipeline import RowsRetiredHook

    events = []
    mine = events.append
    fpipe.fastdiff_on_rows_retired = mine
    fastdiff.step_cache(fpipe, mode="uniform", interval=2)
    assert isinstance(fpipe.fastdiff_on_rows_retired, RowsRetiredHook)
    latents = _rows_latents()
    out = _early_call(fpipe, ROWS_PROMPTS, latents, 0.1)
    assert events and events[-1].tolist() == [] and out.fastdiff.step_cache.forced_refreshes == 0
    fastdiff.restore(fpipe)
    assert fpipe.fastdiff_on_rows_retired is mine
    del fpipe.fastdiff_on_rows_retired
    fastdiff.step_cache(fpipe, mode="uniform", interval=2)
    fastdiff.restore(fpipe)
    assert "fastdiff_on_rows_retired" not in vars(fpipe) and fpipe.fastdiff_on_rows_retired is None
    assert not fpipe.unet._forward_pre_hooks and not installed.installations(fpipe)


def test_pipeline_record_reports_the_calls_cache_run(fpipe):
    import fastdiff

    kw = dict(guidance_scale=4.0, output_type="latent", height=32, width=32)
    plain = fpipe("a red cat", num_inference_steps=4, generator=torch.Generator().manual_seed(0), **kw)
    assert plain.fastdiff.step_cache is None
    h = fastdiff.step_cache(fpipe, mode="uniform", interval=3)
    for extra in ({"steps": 6}, {"num_inference_steps": 6}):  # fastdiff's loop first, then diffusers' own
        out = fpipe("a red cat", generator=torch.Generator().manual_seed(0), **kw, **extra)
        run = out.fastdiff.step_cache
        assert run.full_evals + run.cached_evals == out.fastdiff.nfe == 6
        assert run.mode == "uniform" and run.steps == 6
        # diffusers' loop sets pipe.scheduler.timesteps; fastdiff's loop samples on a copy of the scheduler
        # and tells the cache the run's timesteps (begin_call): either way the last step is known and full
        assert run.refresh_steps == (0, 3, 5) and run.full_evals == 3 and run.skipped_fraction == 0.5
        assert not run.notes, run.notes
        assert h._schedule_override is None  # the call's schedule is forgotten when the call ends
        assert [r["step"] for r in h.stats.trace if r["full"]] == list(run.refresh_steps)
    fastdiff.restore(fpipe)
    out = fpipe("a red cat", num_inference_steps=6, generator=torch.Generator().manual_seed(0), **kw)
    assert out.fastdiff.step_cache is None


def test_report_lists_the_installed_cache_and_its_last_run(fpipe):
    import fastdiff

    assert fastdiff.report(fpipe).step_cache is None and "[step_cache]" not in str(fastdiff.report(fpipe))
    fastdiff.step_cache(fpipe, mode="uniform", interval=3)
    text = str(fastdiff.report(fpipe))
    assert "[step_cache] installed: StepCache(mode='uniform', interval=3" in text and "last run: none" in text
    out = fpipe(
        "a red cat", num_inference_steps=6, guidance_scale=4.0, output_type="latent", height=32, width=32
    )
    rep = fastdiff.report(fpipe)
    assert rep.step_cache.last_run == out.fastdiff.step_cache
    assert "last run: 3 full / 3 cached U-Net evaluations (50% skipped) over 6 steps" in str(rep)
    assert "refresh steps [0, 3, 5]" in str(rep) and "1 runs, 6 U-Net calls, 3 full" in str(rep)
    assert rep.to_dict()["step_cache"]["last_run"]["full_evals"] == 3
    fastdiff.restore(fpipe)
    assert fastdiff.report(fpipe).step_cache is None


def test_pipeline_refine_never_replays_features_of_a_call_in_between(fpipe):
    import fastdiff

    latents = _rows_latents()
    fastdiff.step_cache(fpipe, mode="uniform", interval=3)
    kw = dict(num_inference_steps=9, guidance_scale=4.0, output_type="latent", height=8, width=8)
    preview = fpipe(ROWS_PROMPTS, latents=latents, early_stop={**EARLY, "rtol": 0.1}, preview_steps=5, **kw)
    stopped = preview.fastdiff.stopped_early
    assert any(stopped) and not all(stopped), stopped  # the refine runs a subset of the rows
    first = fpipe.refine(preview.fastdiff.state)
    fpipe(["a yellow star"] * 3, latents=latents.flip(0), preview_steps=5, **kw)  # another paused call
    second = fpipe.refine(preview.fastdiff.state)
    assert _rel(second.images, first.images) < 1e-6
    for out in (first, second):
        run = out.fastdiff.step_cache
        assert run.forced_refreshes == 0 and run.refresh_steps[0] == 0 and run.cached_evals > 0


def test_steps_after_leaving_the_schedule_run_in_full(unet):
    """A controller that jumps (FastForward) moves the run off the known timesteps: the few large steps left
    must not reuse features cached at another noise level (#13)."""
    inp = _inputs(unet)
    handle = step_cache(unet, mode="uniform", interval=3)
    handle.set_schedule(TS)
    with torch.no_grad():
        for t in (TS[0], TS[1], 250.0, 40.0):  # 250 and 40 are not in TS: the run jumped after TS[1]
            out = _call(unet, inp, t)
    assert [r["full"] for r in handle.stats.trace] == [True, False, True, True]
    assert torch.equal(out, _call_uncached(unet, inp, 40.0))
    assert any("jumped off the known schedule" in n for n in handle.stats.notes)
