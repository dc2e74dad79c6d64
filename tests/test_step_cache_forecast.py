"""Feature forecasting in the step cache (#13): cached steps extrapolate the entry feature.

References never go through the cache: the entry feature of full steps is captured in float64 by a plain
forward hook on an uncached forward, the extrapolation is computed here by hand (Newton form, not the
Lagrange weights the cache uses), and the expected output of a cached step is the uncached U-Net whose
entry unit's output is replaced by that extrapolation.
"""

from __future__ import annotations

import pytest
import torch

from fastdiff import installed
from fastdiff.caching import step_cache
from fastdiff.caching.units import layout
from fastdiff.testing import tiny_pipeline, unet_probe_inputs

TS = [901.0, 851.0, 701.0, 641.0, 401.0, 101.0]  # uneven: axis "timestep" differs from "step"
REFRESH = [0, 2, 3, 5]  # step 1: one full evaluation so far (replay); step 4: after three


@pytest.fixture(scope="module")
def unet():
    u = tiny_pipeline("sd15", seed=3).unet
    yield u
    installed.undo_all(u)


@pytest.fixture(autouse=True)
def _clean(unet):
    yield
    installed.undo_all(unet)


def _first(out):
    return out[0] if isinstance(out, tuple) else out


def _with_entry(unet, x, t, ctx, feature=None):
    """The uncached U-Net on (x, t); returns (output, the entry unit's output in float64).

    ``feature`` given: the entry unit's output is replaced by it (what a cached step should compute)."""
    box = {}

    def hook(m, a, out):
        box["f"] = _first(out).double()
        if feature is None:
            return None
        new = feature.to(_first(out).dtype)
        return (new, *out[1:]) if isinstance(out, tuple) else new

    entry = layout(unet).entry(0).module
    h = entry.register_forward_hook(hook)
    try:
        with torch.no_grad():
            y = unet(x, torch.tensor(t), encoder_hidden_states=ctx).sample
    finally:
        h.remove()
    return y, box["f"]


def _inputs(unet, batch=2):
    inp = unet_probe_inputs(unet, batch=batch, seed=0)
    gen = torch.Generator().manual_seed(21)
    xs = [torch.randn(inp["sample"].shape, generator=gen) for _ in TS]  # fresh latents at every step
    return xs, inp["encoder_hidden_states"]


def _cached_run(unet, xs, ctx, **opts):
    h = step_cache(unet, mode="schedule", refresh=REFRESH, **opts)
    h.set_schedule(TS)
    with torch.no_grad():
        outs = [unet(x, torch.tensor(t), encoder_hidden_states=ctx).sample for x, t in zip(xs, TS)]
    assert [r["full"] for r in h.stats.trace] == [s in REFRESH for s in range(len(TS))]
    return h, outs


def _rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.mark.parametrize(
    "forecast, axis, strength",
    [
        ("linear", "step", 1.0),
        ("linear", "timestep", 1.0),
        ("linear", "step", 0.5),
        ("quadratic", "step", 1.0),
    ],
)
def test_cached_steps_equal_the_hand_computed_extrapolation(unet, forecast, axis, strength):
    xs, ctx = _inputs(unet)
    full, feats = {}, {}
    for k in REFRESH:
        full[k], feats[k] = _with_entry(unet, xs[k], TS[k], ctx)
    pos = list(range(len(TS))) if axis == "step" else TS

    def expected(k):
        done = [r for r in REFRESH if r < k]
        if len(done) == 1:  # one full evaluation: nothing to extrapolate from, plain reuse
            return feats[done[0]]
        if forecast == "linear":
            a, b = done[-2], done[-1]
            c = (pos[k] - pos[b]) / (pos[b] - pos[a])
            return feats[b] + strength * c * (feats[b] - feats[a])
        a, b, c = done[-3:]  # Newton's divided differences through three nodes
        d1 = (feats[c] - feats[b]) / (pos[c] - pos[b])
        d0 = (feats[b] - feats[a]) / (pos[b] - pos[a])
        d2 = (d1 - d0) / (pos[c] - pos[a])
        s = pos[k]
        return feats[c] + (s - pos[c]) * d1 + (s - pos[c]) * (s - pos[b]) * d2

    want = {
        k: _with_entry(unet, xs[k], TS[k], ctx, expected(k))[0] for k in range(len(TS)) if k not in REFRESH
    }
    h, outs = _cached_run(unet, xs, ctx, forecast=forecast, forecast_axis=axis, forecast_strength=strength)
    for k in REFRESH:  # full steps (the first and the last among them) are the original U-Net, bit for bit
        assert torch.equal(outs[k], full[k]), k
    for k, w in want.items():
        assert _rel(outs[k], w) < 1e-5, k
    # the forecast really moved the cached step away from plain reuse
    replay = _with_entry(unet, xs[4], TS[4], ctx, feats[3])[0]
    assert _rel(outs[4], replay) > 1e-3
    assert h.last_run().forecast == forecast


def test_forecast_none_is_plain_reuse_bit_for_bit(unet):
    xs, ctx = _inputs(unet)
    feats = {k: _with_entry(unet, xs[k], TS[k], ctx)[1] for k in REFRESH}
    last = {k: max(r for r in REFRESH if r < k) for k in range(len(TS)) if k not in REFRESH}
    want = {k: _with_entry(unet, xs[k], TS[k], ctx, feats[a].float())[0] for k, a in last.items()}
    _, outs = _cached_run(unet, xs, ctx)  # the default
    installed.undo_all(unet)
    _, outs_none = _cached_run(unet, xs, ctx, forecast="none")
    for k, w in want.items():
        assert torch.equal(outs[k], w) and torch.equal(outs_none[k], w), k


def test_rows_leaving_the_batch_keep_their_own_history(unet):
    gen = torch.Generator().manual_seed(9)
    rows, keep = 3, torch.tensor([0, 2])
    xs = [torch.randn(rows, 4, 8, 8, generator=gen) for _ in range(4)]
    ctx = torch.randn(rows, 8, unet.config.cross_attention_dim, generator=gen)
    ts = TS[:2] + [TS[2], TS[-1]]

    def run(x_rows, ctx_rows, shrink):
        h = step_cache(unet, mode="schedule", refresh=[0, 1], forecast="linear")
        h.set_schedule(ts)
        with torch.no_grad():
            unet(x_rows(0), ts[0], encoder_hidden_states=ctx_rows(0))
            unet(x_rows(1), ts[1], encoder_hidden_states=ctx_rows(1))
            if shrink:
                h.keep_rows(keep, num_rows=rows)
            got = unet(x_rows(2), ts[2], encoder_hidden_states=ctx_rows(2)).sample
        assert h.stats.cached_calls == 1 and h.stats.forced_refreshes == 0
        installed.undo_all(unet)
        return got

    batched = run(lambda k: xs[k] if k < 2 else xs[k][keep], lambda k: ctx if k < 2 else ctx[keep], True)
    alone = run(lambda k: xs[k][keep], lambda k: ctx[keep], False)
    assert _rel(batched, alone) < 1e-5
    # and by hand: the remaining rows' own features extrapolated
    f = [_with_entry(unet, xs[k][keep], ts[k], ctx[keep])[1] for k in (0, 1)]
    # default strength 0.5: half the extrapolated change (step 2 from steps 0 and 1)
    want = _with_entry(unet, xs[2][keep], ts[2], ctx[keep], f[1] + 0.5 * (f[1] - f[0]))[0]
    assert _rel(batched, want) < 1e-5


def test_restore_removes_the_forecast_state_and_every_wrapper(unet):
    xs, ctx = _inputs(unet)
    with torch.no_grad():
        before = unet(xs[1], torch.tensor(TS[1]), encoder_hidden_states=ctx).sample
    h, _ = _cached_run(unet, xs, ctx, forecast="quadratic")
    assert any(isinstance(k, tuple) for s in h._slots for k in s)  # the history was kept
    installed.undo_all(unet)
    assert h._slots == [] and h._fc_nodes == [] and not h.installed
    assert "forward" not in vars(layout(unet).entry(0).module)
    with torch.no_grad():
        assert torch.equal(unet(xs[1], torch.tensor(TS[1]), encoder_hidden_states=ctx).sample, before)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(forecast="cubic"), "forecast must be one of 'none', 'linear', 'quadratic', got 'cubic'"),
        (dict(forecast="linear", forecast_axis="sigma"), "forecast_axis must be one of 'step', 'timestep'"),
        (dict(forecast="linear", forecast_strength=0), r"forecast_strength must be a number in \(0, 1\]"),
        (dict(forecast="linear", forecast_strength=1.5), r"forecast_strength must be a number in \(0, 1\]"),
    ],
)
def test_bad_forecast_arguments_name_the_argument(unet, kwargs, match):
    with pytest.raises(ValueError, match=match):
        step_cache(unet, mode="uniform", **kwargs)


def test_repr_and_run_record_the_forecast(unet):
    h = step_cache(unet, mode="uniform", interval=2, forecast="linear", forecast_axis="timestep")
    assert "forecast='linear', forecast_axis='timestep', forecast_strength=0.5" in repr(h)
    h.set("uniform", interval=2)
    assert "forecast='none'" in repr(h) and "forecast_axis" not in repr(h)
