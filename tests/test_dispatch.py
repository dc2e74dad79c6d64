"""fastdiff.ops.dispatch: the winner/confirm/verify logic driven by a fake clock, plans keyed per device,
global flags restored. No kernel is timed for real here."""

import pytest
import torch

from fastdiff.ops import dispatch
from fastdiff.optimize.report import PassReport


class FakeClock:
    """measure() stand-in: each call returns the next round's seconds per candidate."""

    def __init__(self, *rounds):
        self.rounds = list(rounds)
        self.calls = 0

    def __call__(self, fns, device):
        self.calls += 1
        times = self.rounds.pop(0)
        return {name: times[name] for name in fns}


def candidates(outputs=None):
    outputs = outputs or {}
    return {
        name: (lambda name=name: outputs.get(name, torch.ones(4)))
        for name in (dispatch.NATIVE, "winograd_torch")
    }


CPU = torch.device("cpu")


@pytest.mark.parametrize(
    "rounds,expected",
    [
        ([{"native": 1.0, "winograd_torch": 1.0}], "native"),  # tie: native
        ([{"native": 1.0, "winograd_torch": 0.98}], "native"),  # within the 3% noise margin: native
        ([{"native": 1.0, "winograd_torch": 1.5}], "native"),  # slower candidate loses
        (
            [{"native": 1.0, "winograd_torch": 0.5}, {"native": 1.0, "winograd_torch": 1.2}],
            "native",
        ),  # not confirmed
        ([{"native": 1.0, "winograd_torch": 0.5}, {"native": 1.0, "winograd_torch": 0.8}], "winograd_torch"),
    ],
    ids=["tie", "noise", "slower", "unconfirmed", "confirmed"],
)
def test_winner_and_confirm(rounds, expected, tmp_path):
    clock = FakeClock(*rounds)
    choice, rec = dispatch.choose("k", candidates(), CPU, tmp_path, timer=clock)
    assert choice == expected == rec["choice"]
    assert clock.calls == len(rounds) and not clock.rounds  # a confirm round only after a first-round win
    if expected != "native":
        assert rec["speedup_vs_native"] == 1.25  # the conservative (confirm) round
    else:
        assert "speedup_vs_native" not in rec


def test_first_win_is_checked_against_native_and_a_mismatch_keeps_native(tmp_path):
    fast = [{"native": 1.0, "winograd_torch": 0.5}] * 2
    wrong = candidates({"winograd_torch": torch.full((4,), 1.1)})
    with pytest.warns(UserWarning, match="keeping native"):
        choice, rec = dispatch.choose("k", wrong, CPU, tmp_path, tolerance=1e-3, timer=FakeClock(*fast))
    assert choice == "native"
    assert rec["verify"] == {"candidate": "winograd_torch", "rel_err": pytest.approx(0.1), "tolerance": 1e-3,
                             "passed": False}  # fmt: skip
    # the report says so
    rep = PassReport(
        "winograd", "applied", changed=[("conv", "WinogradConv2d")], details={"conv": {"plan": {"k": rec}}}
    )
    assert any("winograd_torch" in line and "kept native" in line for line in rep.lines())
    # a matching alternative passes and is kept
    dispatch.clear_memory_caches()
    ok = candidates({"winograd_torch": torch.ones(4) * (1 + 1e-5)})
    choice, rec = dispatch.choose("k2", ok, CPU, tmp_path, tolerance=1e-3, timer=FakeClock(*fast))
    assert choice == "winograd_torch" and rec["verify"]["passed"]


def test_failing_candidate_is_never_chosen(tmp_path):
    def broken():
        raise RuntimeError("no kernel for this GPU")

    with pytest.warns(UserWarning, match="broken"):
        choice, rec = dispatch.choose(
            "test|broken", {"native": lambda: None, "broken": broken}, CPU, tmp_path
        )
    assert choice == "native" and "RuntimeError" in rec["failed"]["broken"]


def test_plans_are_keyed_by_device(monkeypatch, tmp_path):
    """A plan made on one device is never used on another: keys and plan files both name the device."""
    x = torch.randn(1, 4, 6, 6)
    key_here = dispatch.plan_key("conv3x3", x, k=4)
    assert key_here.startswith("cpu:cpu-")
    dispatch.choose(
        key_here, candidates(), CPU, tmp_path, timer=FakeClock({"native": 1.0, "winograd_torch": 2.0})
    )
    # same shape on a second (fake) device: new key, new file, timed again
    monkeypatch.setattr(dispatch, "device_name", lambda device: "Fake GPU 2")
    key_there = dispatch.plan_key("conv3x3", x, k=4)
    assert key_there != key_here and key_there.startswith("cpu:Fake GPU 2|")
    clock = FakeClock({"native": 1.0, "winograd_torch": 2.0})
    _, rec = dispatch.choose(key_here, candidates(), CPU, tmp_path, timer=clock)
    assert clock.calls == 1 and rec["source"] == "measured"  # the other device's file was not consulted
    assert len(list(tmp_path.glob("*.json"))) == 2


def test_measure_restores_cudnn_benchmark(monkeypatch):
    triton_testing = pytest.importorskip("triton.testing")
    seen = []
    monkeypatch.setattr(
        triton_testing, "do_bench", lambda fn, **kw: seen.append(torch.backends.cudnn.benchmark) or 1.0
    )
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    times = dispatch.measure({"native": lambda: None, "alt": lambda: None}, torch.device("cuda"))
    assert seen == [True, True]  # native conv timed with cuDNN's autotuning
    assert torch.backends.cudnn.benchmark is False and times == {"native": 1e-3, "alt": 1e-3}


def test_inference_only_checks_every_input():
    x, w = torch.randn(2), torch.randn(2, requires_grad=True)
    assert dispatch.inference_only(x, None)
    assert not dispatch.inference_only(x, None, w)  # a trainable parameter anywhere
    with torch.no_grad():
        assert dispatch.inference_only(x, w)
