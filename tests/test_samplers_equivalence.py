"""fastdiff samplers reproduce diffusers' schedulers where the algorithm and config are the same."""

from __future__ import annotations

import math

import pytest
import torch
from diffusers import (
    DDIMScheduler,
    DPMSolverMultistepScheduler,
    EulerDiscreteScheduler,
    LCMScheduler,
    UniPCMultistepScheduler,
)

from fastdiff.samplers import SolverState, make_scheduler, run_scheduler
from fastdiff.samplers.ddim import ddim_update, euler_update

SD = dict(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear")


pytestmark = pytest.mark.usefixtures("one_thread")


class ToyEps:
    """Deterministic nonlinear eps-model: a fixed random map of x plus a t-dependent term."""

    def __init__(self, dims=36, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.w = torch.randn(dims, dims, generator=g, dtype=torch.float64) / math.sqrt(dims)

    def __call__(self, x, t):
        xf = x.double().reshape(x.shape[0], x.shape[1], -1)
        out = torch.tanh(xf @ self.w) * 0.8 + 0.2 * math.sin(float(t) / 150.0)
        return out.reshape(x.shape).to(x.dtype)


MODEL = ToyEps()
X_T = torch.randn(2, 4, 6, 6, generator=torch.Generator().manual_seed(0))


def run_diffusers(sched, n, generator=None, ve_state=False, **step_kw):
    sched.set_timesteps(n)
    x = X_T.clone()
    if ve_state:  # EulerDiscrete keeps x / alpha; start from the same VP noise
        x = X_T * math.sqrt(float(sched.sigmas[0]) ** 2 + 1)
    for t in sched.timesteps:
        out = MODEL(sched.scale_model_input(x, t), t)
        kw = dict(step_kw)
        if generator is not None:
            kw["generator"] = generator
        x = sched.step(out, t, x, **kw).prev_sample
    return x


def rel(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


CASES = {
    "ddim_leading": (
        lambda: DDIMScheduler(**SD, clip_sample=False, set_alpha_to_one=True, steps_offset=1),
        ("ddim", dict(schedule="leading", steps_offset=1)),
        dict(),
    ),
    "ddim_eta": (
        lambda: DDIMScheduler(**SD, clip_sample=False, set_alpha_to_one=True, steps_offset=1),
        ("ddim", dict(schedule="leading", steps_offset=1, eta=0.7)),
        dict(stochastic=True, step_kw=dict(eta=0.7)),
    ),
    "euler_trailing": (
        lambda: EulerDiscreteScheduler(**SD, timestep_spacing="trailing"),
        ("euler", dict(schedule="trailing")),
        dict(ve_state=True),
    ),
    "dpmpp_2m_linspace": (
        lambda: DPMSolverMultistepScheduler(**SD),
        ("dpmpp_2m", dict(schedule="linspace")),
        {},
    ),
    "dpmpp_2m_karras": (
        lambda: DPMSolverMultistepScheduler(**SD, use_karras_sigmas=True),
        ("dpmpp_2m", dict(schedule="karras", fractional_timesteps=False)),
        {},
    ),
    "dpmpp_2m_v": (
        lambda: DPMSolverMultistepScheduler(
            **SD, prediction_type="v_prediction", timestep_spacing="trailing"
        ),
        ("dpmpp_2m", dict(schedule="trailing", prediction_type="v_prediction")),
        {},
    ),
    "dpmpp_3m_linspace": (
        lambda: DPMSolverMultistepScheduler(**SD, solver_order=3),
        ("dpmpp_3m", dict(schedule="linspace")),
        {},
    ),
    "dpmpp_2m_sde": (
        lambda: DPMSolverMultistepScheduler(**SD, algorithm_type="sde-dpmsolver++"),
        ("dpmpp_2m_sde", dict(schedule="linspace")),
        dict(stochastic=True),
    ),
    "unipc_linspace": (lambda: UniPCMultistepScheduler(**SD), ("unipc", dict(schedule="linspace")), {}),
    "unipc3_karras": (
        lambda: UniPCMultistepScheduler(**SD, solver_order=3, use_karras_sigmas=True),
        ("unipc", dict(schedule="karras", solver_order=3, fractional_timesteps=False)),
        {},
    ),
    "unipc_sample_pred": (
        lambda: UniPCMultistepScheduler(**SD, prediction_type="sample", timestep_spacing="trailing"),
        ("unipc", dict(schedule="trailing", prediction_type="sample")),
        {},
    ),
    "lcm": (lambda: LCMScheduler(**SD), ("lcm", dict()), dict(stochastic=True)),
}


@pytest.mark.parametrize("n", [1, 3, 7, 16])
@pytest.mark.parametrize("case", list(CASES))
def test_matches_diffusers(case, n):
    make_ref, (name, opts), extra = CASES[case]
    if name == "lcm":
        n = min(n, 8)
    ref_sched, ours = make_ref(), make_scheduler(name, **opts)
    g1 = torch.Generator().manual_seed(1) if extra.get("stochastic") else None
    g2 = torch.Generator().manual_seed(1) if extra.get("stochastic") else None
    a = run_diffusers(ref_sched, n, g1, extra.get("ve_state", False), **extra.get("step_kw", {}))
    b = run_scheduler(MODEL, X_T.clone(), ours, n, generator=g2)
    assert torch.equal(ref_sched.timesteps.double(), ours.timesteps.double())
    assert torch.isfinite(b).all()
    assert rel(b, a) < 1e-5, f"{case} n={n}: rel err {rel(b, a):.2e}"


def test_ddim_linspace_fix_differs_from_diffusers_by_design():
    """diffusers DDIM steps to prev_t = t - T//N, which is not the next linspace timestep;
    fastdiff steps to the next entry of its schedule (documented in ddim.py)."""
    d = DDIMScheduler(**SD, clip_sample=False, set_alpha_to_one=True, timestep_spacing="linspace")
    d.set_timesteps(4)
    ts = d.timesteps.tolist()  # [999, 666, 333, 0]
    assert [t - 1000 // 4 for t in ts[:-1]] != ts[1:]  # diffusers' next noise level is off-grid
    ours = make_scheduler("ddim", schedule="linspace")
    ours.set_timesteps(4)
    # fastdiff: every step goes to the next scheduled sigma, the last one to 0
    sig = ours.sigma_of_timestep(ours.timesteps).tolist()
    assert ours.sigmas[:-1].tolist() == pytest.approx(sig, rel=1e-6)
    assert float(ours.sigmas[-1]) == 0.0


def test_ddim_eta0_is_euler_in_sigma():
    g = torch.Generator().manual_seed(3)
    x, d = (
        torch.randn(5, 7, generator=g, dtype=torch.float64),
        torch.randn(5, 7, generator=g, dtype=torch.float64),
    )
    for s, sn in [(14.6, 3.0), (0.7, 0.05), (2.0, 1.99)]:
        torch.testing.assert_close(
            ddim_update(x, d, s, sn), euler_update(x, d, s, sn), rtol=1e-12, atol=1e-12
        )


def test_lower_order_rules():
    sig = [float(s) for s in torch.linspace(10, 0.1, 10)] + [0.0]
    dpm = SolverState("dpmpp_3m", sig, order=3)
    assert [dpm.step_order(i) for i in range(10)] == [1, 2, 3, 3, 3, 3, 3, 3, 2, 1]
    uni = SolverState("unipc", sig, order=3)
    assert [uni.step_order(i) for i in range(10)] == [1, 2, 3, 3, 3, 3, 3, 3, 2, 1]
    no_lof = SolverState("dpmpp_2m", sig, order=2, lower_order_final=False)
    assert no_lof.step_order(8) == 2


def test_fp16_model_output_gets_float32_update_maths():
    """An fp16 model: the scheduler keeps a float32 state, so the result matches an fp32 run on
    the same (fp16-rounded) model outputs much better than fp16 arithmetic would."""

    def model16(x, t):
        return MODEL(x.float(), t).half()

    s32, s16 = make_scheduler("unipc"), make_scheduler("unipc")
    ref = run_scheduler(lambda x, t: model16(x, t).float(), X_T.clone(), s32, 10)
    out = run_scheduler(model16, X_T.clone().half(), s16, 10)
    assert out.dtype == torch.float16
    # only the final cast to fp16 (and fp16 model inputs) separate the two runs
    assert rel(out, ref) < 1e-3
    # handing the scheduler a copy defeats its float32 state: rounding every step costs accuracy
    s = make_scheduler("unipc")
    s.set_timesteps(10)
    x = X_T.clone().half()
    for t in s.timesteps:
        x = s.step(model16(x, t), t, x.clone()).prev_sample
    assert rel(out, ref) < 0.8 * rel(x, ref)
