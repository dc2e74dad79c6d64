"""Bad-input sweep (#16): try what a new user gets wrong at every public entry point and classify the outcome.

Run from the repository root: ``python benchmarks/bad_inputs.py`` (about 2-3 minutes on 2 CPU cores, light:
random-weight ``fastdiff.testing.tiny_pipeline("sd15")`` pipelines, the shipped fastdiff-tiny weights for
``fastdiff.tiny`` and a few CLI subprocesses). ``--area optimize`` (repeatable) runs one area.
Writes ``benchmarks/results/bad_inputs.{json,md}``.

Each case says what should happen: an exception of some type whose message names the argument, or a
correct result (a documented convention). Outcomes, classified automatically:

* ``clear``: the expected exception type, and the message names the argument;
* ``handled``: a documented convention or a correct result;
* ``silent``: returned without error where an error was expected (or returned a wrong result);
* ``obscure``: an exception whose type is unexpected or whose message does not name the argument;
* ``changed``: an error left the watched pipeline/U-Net different (``fastdiff.testing.snapshot``), or a
  failed pipeline call left ``pipe.fastdiff_record`` set;
* ``crash/hang``: past the per-case timeout (or a CLI subprocess killed by a signal).

Goals (issue #16): 0 crash/hang, <= 3 silent (all documented conventions), <= 5 obscure, 0 changed.
Cases whose fix belongs to another helper's branch carry ``owner``; the lead reruns after merging.
The case table is long by nature; the file is one list plus a small runner.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from benchmarks._common import env_info, write_results  # noqa: E402

OUTCOMES = ("clear", "handled", "silent", "obscure", "changed", "crash/hang")
GOALS = {"crash/hang": 0, "silent": 3, "obscure": 5, "changed": 0}
TIMEOUT_S = 60


class _Timeout(BaseException):  # BaseException: library code catching Exception must not swallow it
    pass


class CLIFailed(Exception):
    """A CLI subprocess exited non-zero with a message and no traceback (the message is the stderr tail)."""


@dataclass
class Case:
    area: str
    name: str
    call: object  # () -> result
    expect: type | tuple | None = ValueError  # None: the call should succeed (a convention / correct result)
    names: tuple = ()  # the message must contain one of these (the argument), case-insensitive
    check: object = None  # result -> bool, for expect=None: is the result right?
    watch: object = None  # () -> the object an error must leave unchanged
    owner: str | None = None  # helper whose branch fixes it, where not this one
    note: str = ""


def _cli(*args, timeout=120):
    proc = subprocess.run(
        [sys.executable, "-m", "fastdiff.cli", *args], capture_output=True, text=True, timeout=timeout
    )
    if proc.returncode < 0:
        raise _Timeout(f"killed by signal {-proc.returncode}")
    if proc.returncode != 0:
        if "Traceback" in proc.stderr:
            raise RuntimeError("traceback: " + proc.stderr.strip().splitlines()[-1])
        raise CLIFailed(proc.stderr.strip()[-400:])
    return proc


class _Injected(Exception):
    """A failure injected half-way through a call (the object must come out of it unchanged)."""


def _raise_at_call(module, n: int):
    count = [0]

    def hook(*_):
        count[0] += 1
        if count[0] == n:
            raise _Injected(f"injected failure at U-Net call {n}")

    return module.register_forward_pre_hook(hook)


def _classify(case: Case) -> dict:
    from fastdiff.testing.snapshot import differences, snapshot

    watched = case.watch() if case.watch is not None else None
    before = snapshot(watched) if watched is not None else None
    exc, result, outcome = None, None, None

    def alarm(*_):
        raise _Timeout(f"no answer after {TIMEOUT_S} s")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(TIMEOUT_S)
    t0 = time.perf_counter()
    try:
        result = case.call()
    except _Timeout as err:
        outcome, exc = "crash/hang", err
    except Exception as err:  # noqa: BLE001 - classifying every failure is the point
        exc = err
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    seconds = time.perf_counter() - t0
    message = "" if exc is None else f"{type(exc).__name__}: {exc}"
    if outcome is None:
        if exc is None:
            ok = case.expect is None and (case.check is None or bool(case.check(result)))
            outcome = "handled" if ok else "silent"
        elif case.expect is not None and isinstance(exc, case.expect):
            text = str(exc).lower()
            outcome = "clear" if any(n.lower() in text for n in case.names) else "obscure"
        else:
            outcome = "obscure"
        if exc is not None and watched is not None:
            diff = differences(before, snapshot(watched))
            if getattr(watched, "fastdiff_record", None) is not None:
                diff.append("fastdiff_record still set after a failed call")
            if diff:
                outcome, message = "changed", message + " | changed: " + "; ".join(diff[:3])
    return {
        "area": case.area,
        "case": case.name,
        "outcome": outcome,
        "owner": case.owner or "",
        "seconds": round(seconds, 2),
        "message": " ".join(message.split())[:240].replace("|", "/"),  # "/": the markdown table's cells
        "note": case.note,
    }


def _pipeline_cases(P, fresh) -> list[Case]:
    """The drop-in pipeline's __call__, from_pipe and refine; ``P`` is shared, ``fresh()`` a new one."""
    import fastdiff
    from fastdiff.testing import tiny_pipeline

    def call(**kw):
        kw = {"prompt": "a red circle", "num_inference_steps": 2, "output_type": "latent", **kw}
        return lambda: P(**kw)

    watch = lambda: P  # noqa: E731
    lcm = tiny_pipeline("sd15", seed=1)
    from diffusers import LCMScheduler

    lcm.scheduler = LCMScheduler.from_config(lcm.scheduler.config)
    non_lcm = tiny_pipeline("sd15", seed=2)
    i2i = fastdiff.StableDiffusionImg2ImgPipeline.from_pipe(P)
    image = torch.rand(1, 3, 32, 32)

    def preview(p=P):
        return p("a red circle", num_inference_steps=4, preview_steps=2, output_type="np").fastdiff.state

    def refine_other():
        state = preview()
        return fresh().refine(state)

    def refine_swapped():
        p = fresh()
        state = preview(p)
        p.vae = tiny_pipeline("sd15", seed=3).vae
        return p.refine(state)

    def refine_twice():
        state = preview()
        return (P.refine(state).images, P.refine(state).images)

    def latents_nan():
        return P(
            "a red circle", num_inference_steps=2, steps=None, latents=torch.full((1, 4, 8, 8), float("nan"))
        )

    def failing(**kw):
        def run():
            handle = _raise_at_call(P.unet, 3)
            try:
                return call(**kw)()
            finally:
                handle.remove()

        return run

    def raising_callback(pipe, step, t, kwargs):
        if step == 2:
            raise _Injected("injected failure in the callback at step 2")
        return kwargs

    def failing_refine():
        state = preview()
        reference = P.refine(state).images

        def fail():
            handle = _raise_at_call(P.unet, 1)
            try:
                P.refine(state)
            finally:
                handle.remove()

        try:
            fail()
        except _Injected:
            if not (P.refine(state).images == reference).all():
                return "the preview changed"  # returned, not raised: classified silent
        fail()  # the last call is the failing one, so its cleared record is what the classifier sees
        return "refine did not fail"

    XL = fastdiff.StableDiffusionXLPipeline.from_pipe(tiny_pipeline("sdxl"))
    XL.set_progress_bar_config(disable=True)
    E = (ValueError, TypeError)
    cases = [
        Case("pipeline", "height=0", call(height=0), ValueError, ("height",)),
        Case("pipeline", "width=60 (not a multiple of 8)", call(width=60), ValueError, ("width",)),
        Case(
            "pipeline",
            "height=-8, fastdiff path",
            call(height=-8, steps=2, num_inference_steps=None),
            ValueError,
            ("height",),
        ),
        Case(
            "pipeline",
            "guidance_scale=nan",
            call(guidance_scale=float("nan")),
            ValueError,
            ("guidance_scale",),
        ),
        Case(
            "pipeline",
            "guidance_scale=nan, fastdiff path",
            call(guidance_scale=float("nan"), early_stop=True),
            ValueError,
            ("guidance_scale",),
        ),
        Case(
            "pipeline",
            "guidance_scale=inf",
            call(guidance_scale=float("inf")),
            ValueError,
            ("guidance_scale",),
        ),
        Case("pipeline", "guidance_scale='7'", call(guidance_scale="7"), ValueError, ("guidance_scale",)),
        Case(
            "pipeline",
            "guidance_rescale=nan",
            call(guidance_rescale=float("nan")),
            ValueError,
            ("guidance_rescale",),
        ),
        Case(
            "pipeline",
            "num_inference_steps=5000 (own scheduler)",
            call(num_inference_steps=5000, early_stop=True),
            ValueError,
            ("num_inference_steps",),
        ),
        Case(
            "pipeline",
            "num_inference_steps=0",
            call(num_inference_steps=0),
            ValueError,
            ("num_inference_steps",),
        ),
        Case(
            "pipeline",
            "num_inference_steps=2.5",
            call(num_inference_steps=2.5),
            ValueError,
            ("num_inference_steps",),
        ),
        Case("pipeline", "prompt=[]", call(prompt=[]), ValueError, ("prompt",)),
        Case("pipeline", "prompt=['a', 5]", call(prompt=["a", 5]), ValueError, ("prompt",)),
        Case("pipeline", "prompt=5", call(prompt=5), E, ("prompt",)),
        Case(
            "pipeline",
            "num_images_per_prompt=0",
            call(num_images_per_prompt=0),
            ValueError,
            ("num_images_per_prompt",),
        ),
        Case(
            "pipeline",
            "num_images_per_prompt=True",
            call(num_images_per_prompt=True),
            ValueError,
            ("num_images_per_prompt",),
        ),
        Case("pipeline", "output_type='jpeg'", call(output_type="jpeg"), ValueError, ("output_type",)),
        Case(
            "pipeline",
            "output_type='jpeg', fastdiff path",
            call(output_type="jpeg", steps=2, num_inference_steps=None),
            ValueError,
            ("output_type",),
        ),
        Case("pipeline", "return_dict='no'", call(return_dict="no"), TypeError, ("return_dict",)),
        Case("pipeline", "eta=0.5 with PNDM (drops eta)", call(eta=0.5), ValueError, ("eta",)),
        Case(
            "pipeline",
            "eta=0.5 with steps='fast'",
            call(eta=0.5, steps="fast", num_inference_steps=None),
            ValueError,
            ("eta",),
        ),
        Case("pipeline", "eta=nan", call(eta=float("nan")), ValueError, ("eta",)),
        Case("pipeline", "latents with NaN", latents_nan, ValueError, ("latents",)),
        Case(
            "pipeline",
            "latents of the wrong shape",
            call(latents=torch.randn(1, 4, 3, 3)),
            ValueError,
            ("latents",),
        ),
        Case("pipeline", "generator='seed'", call(generator="seed"), E, ("generator",)),
        Case(
            "pipeline", "steps='turbo'", call(steps="turbo", num_inference_steps=None), ValueError, ("steps",)
        ),
        Case("pipeline", "steps=0", call(steps=0, num_inference_steps=None), ValueError, ("steps",)),
        Case("pipeline", "steps=True", call(steps=True, num_inference_steps=None), TypeError, ("steps",)),
        Case(
            "pipeline",
            "steps=4 and num_inference_steps=4",
            call(steps=4, num_inference_steps=4),
            ValueError,
            ("steps",),
        ),
        Case("pipeline", "early_stop='yes'", call(early_stop="yes"), TypeError, ("early_stop",)),
        Case(
            "pipeline", "early_stop={'bogus': 1}", call(early_stop={"bogus": 1}), E, ("early_stop", "bogus")
        ),
        Case("pipeline", "early_stop={'jumps': 0}", call(early_stop={"jumps": 0}), ValueError, ("jumps",)),
        Case(
            "pipeline",
            "early_stop with jumps on a scheduler that cannot jump",
            call(early_stop={"rtol": 0.1, "jumps": 3}),
            TypeError,
            ("FastForward", "make_scheduler"),
        ),
        Case("pipeline", "preview_steps=0", call(preview_steps=0), ValueError, ("preview_steps",)),
        Case("pipeline", "preview_steps=1.5", call(preview_steps=1.5), ValueError, ("preview_steps",)),
        Case(
            "pipeline",
            "callback_on_step_end with steps=",
            call(steps=2, num_inference_steps=None, callback_on_step_end=lambda *a: {}),
            ValueError,
            ("callback",),
        ),
        Case("pipeline", "callback_on_step_end=5", call(callback_on_step_end=5), E, ("callback",)),
        Case(
            "pipeline",
            "draft={'model': non-LCM pipeline}",
            call(num_inference_steps=4, draft={"model": non_lcm}),
            ValueError,
            ("draft", "LCMScheduler"),
        ),
        Case("pipeline", "draft='lcm'", call(draft="lcm"), TypeError, ("draft",)),
        Case(
            "pipeline",
            "draft strength=2",
            call(num_inference_steps=4, draft={"model": lcm, "strength": 2.0}),
            ValueError,
            ("strength",),
        ),
        Case(
            "pipeline",
            "draft steps=0",
            call(num_inference_steps=4, draft={"model": lcm, "steps": 0}),
            ValueError,
            ("steps",),
        ),
        Case(
            "pipeline",
            "draft dict without model",
            call(draft={"strength": 0.5}),
            ValueError,
            ("draft", "model"),
        ),
        Case(
            "pipeline",
            "draft dict with unknown key",
            call(draft={"model": lcm, "strenght": 0.5}),
            ValueError,
            ("draft", "strenght"),
        ),
        Case("pipeline", "draft tuple of 3", call(draft=(lcm, 0.5, 4)), ValueError, ("draft",)),
        Case(
            "pipeline",
            "draft strength leaving no refine step",
            call(num_inference_steps=3, draft={"model": lcm, "strength": 0.3}),
            ValueError,
            ("strength",),
        ),
        Case(
            "pipeline",
            "draft with an LCM pipeline (works)",
            call(num_inference_steps=4, draft={"model": lcm, "steps": 2}),
            None,
            check=lambda r: "LCM" in r.fastdiff.reason,
        ),
        Case(
            "pipeline",
            "steps='auto' on img2img",
            lambda: i2i("a red circle", image=image, steps="auto"),
            ValueError,
            ("auto",),
            watch=lambda: i2i,
        ),
        Case(
            "pipeline",
            "draft= on img2img",
            lambda: i2i("a red circle", image=image, draft=lcm),
            ValueError,
            ("draft",),
            watch=lambda: i2i,
        ),
        Case(
            "pipeline",
            "img2img strength=1.5",
            lambda: i2i("a red circle", image=image, strength=1.5, num_inference_steps=2),
            ValueError,
            ("strength",),
            watch=lambda: i2i,
        ),
        Case(
            "pipeline",
            "img2img strength too small for steps=",
            lambda: i2i("a red circle", image=image, strength=0.01, steps="fast"),
            E + (RuntimeError,),
            ("strength",),
            watch=lambda: i2i,
        ),
        Case(
            "pipeline",
            "from_pipe('model-id')",
            lambda: fastdiff.StableDiffusionPipeline.from_pipe("model-id"),
            TypeError,
            ("from_pipe", "pipeline"),
            watch=lambda: None,
        ),
        Case(
            "pipeline",
            "early_stop={'rtol': -1}",
            call(early_stop={"rtol": -1.0}),
            ValueError,
            ("rtol",),
            owner="control",
        ),
        Case(
            "pipeline",
            "early_stop={'patience': 0}",
            call(early_stop={"patience": 0}),
            ValueError,
            ("patience",),
            owner="control",
        ),
        Case(
            "pipeline",
            "early_stop={'rtol': nan}",
            call(early_stop={"rtol": float("nan")}),
            ValueError,
            ("rtol",),
            owner="control",
        ),
        # errors half-way: the pipeline must be as before (snapshot) with its record cleared
        Case(
            "pipeline",
            "U-Net raises at call 3, diffusers loop",
            failing(num_inference_steps=5),
            _Injected,
            ("injected",),
        ),
        Case(
            "pipeline",
            "U-Net raises at call 3, steps preset",
            failing(steps="fast", num_inference_steps=None),
            _Injected,
            ("injected",),
        ),
        Case(
            "pipeline",
            "U-Net raises at call 3, early_stop",
            failing(num_inference_steps=5, early_stop=True),
            _Injected,
            ("injected",),
        ),
        Case(
            "pipeline",
            "U-Net raises at call 3, draft",
            failing(num_inference_steps=6, draft={"model": lcm, "steps": 2}),
            _Injected,
            ("injected",),
        ),
        Case(
            "pipeline",
            "callback_on_step_end raises",
            call(num_inference_steps=4, callback_on_step_end=raising_callback),
            _Injected,
            ("injected",),
        ),
        Case("refine", "U-Net raises during refine", failing_refine, _Injected, ("injected",)),
        Case(
            "pipeline",
            "SDXL height=0",
            lambda: XL("a", height=0, num_inference_steps=2),
            ValueError,
            ("height",),
            watch=lambda: XL,
        ),
        Case(
            "pipeline",
            "SDXL denoising_end with steps=",
            lambda: XL("a", steps=2, denoising_end=0.8),
            ValueError,
            ("denoising_end",),
            watch=lambda: XL,
        ),
        Case(
            "pipeline",
            "SDXL guidance_scale=nan",
            lambda: XL("a", guidance_scale=float("nan"), steps=2),
            ValueError,
            ("guidance_scale",),
            watch=lambda: XL,
        ),
        # conventions kept from diffusers on purpose (documented in __call__'s docstring)
        Case(
            "pipeline",
            "guidance_scale=1 disables CFG (convention)",
            call(guidance_scale=1.0, steps=2, num_inference_steps=None),
            None,
            check=lambda r: not P.do_classifier_free_guidance and r.fastdiff.nfe == r.fastdiff.steps[0],
            note="documented",
        ),
        Case(
            "pipeline",
            "negative_prompt with guidance_scale=1 unused (convention)",
            call(guidance_scale=1.0, negative_prompt="blue"),
            None,
            note="documented",
        ),
        Case(
            "pipeline",
            "height=None uses the U-Net's size (convention)",
            call(height=None),
            None,
            check=lambda r: r.images.shape[-1] == P.unet.config.sample_size,
            note="documented",
        ),
        # refine
        Case("refine", "refine(None)", lambda: P.refine(None), TypeError, ("refine", "state")),
        Case(
            "refine",
            "refine(output_type='jpeg')",
            lambda: P.refine(preview(), output_type="jpeg"),
            ValueError,
            ("output_type",),
        ),
        Case(
            "refine",
            "refine(preview_steps=0)",
            lambda: P.refine(preview(), preview_steps=0),
            ValueError,
            ("preview_steps",),
        ),
        Case(
            "refine",
            "refine(return_dict=0)",
            lambda: P.refine(preview(), return_dict=0),
            TypeError,
            ("return_dict",),
        ),
        Case(
            "refine",
            "refine by another pipeline",
            refine_other,
            ValueError,
            ("refine", "pipeline"),
            watch=lambda: None,
        ),
        Case(
            "refine",
            "refine after pipe.vae was swapped",
            refine_swapped,
            ValueError,
            ("vae",),
            watch=lambda: None,
        ),
        Case(
            "refine",
            "refine the same preview twice (same image)",
            refine_twice,
            None,
            check=lambda r: (r[0] == r[1]).all(),
        ),
    ]
    for c in cases:
        c.watch = c.watch or watch

    return cases


def _optimize_cases() -> list[Case]:
    import fastdiff
    from fastdiff.testing import tiny_pipeline

    optimized = tiny_pipeline("sd15")
    fastdiff.optimize(optimized)  # the earlier optimisation every failing call must keep
    watch = lambda: optimized  # noqa: E731

    def opt(*args, **kw):
        return lambda: fastdiff.optimize(optimized, *args, **kw)

    def not_verified():
        p = tiny_pipeline("sd15")
        fastdiff.optimize(p, verify=False)
        return fastdiff.report(p)

    def not_a_unet():
        p = tiny_pipeline("sd15")
        p.unet = torch.nn.Linear(2, 2)
        return fastdiff.optimize(p)

    def pass_fails_half_way():
        from fastdiff.optimize.passes import AttentionPass

        original, failed = AttentionPass.apply, []

        def apply_then_fail(self, unet, config, ctx):
            original(self, unet, config, ctx)
            if not failed:  # once: re-applying the earlier optimisation must work
                failed.append(1)
                raise _Injected("injected failure in the attention pass")

        AttentionPass.apply = apply_then_fail
        try:
            return fastdiff.optimize(optimized, winograd=True)
        finally:
            AttentionPass.apply = original

    def twice():
        p = tiny_pipeline("sd15")
        fastdiff.optimize(p)
        fastdiff.optimize(p)
        return fastdiff.report(p)

    E = (ValueError, TypeError)
    return [
        Case("optimize", "a pass fails half-way", pass_fails_half_way, _Injected, ("injected",), watch=watch),
        Case(
            "optimize",
            "optimize('a string')",
            lambda: fastdiff.optimize("model"),
            TypeError,
            ("optimize", "str"),
        ),
        Case("optimize", "verify='no'", opt(verify="no"), ValueError, ("verify",), watch=watch),
        Case("optimize", "verify=1", opt(verify=1), ValueError, ("verify",), watch=watch),
        Case(
            "optimize",
            "extra={'bogus_pass': 1}",
            opt(extra={"bogus_pass": 1}),
            ValueError,
            ("bogus_pass",),
            watch=watch,
        ),
        Case(
            "optimize",
            "extra={'winograd_backend': 'cuda'}",
            opt(extra={"winograd_backend": "cuda"}),
            ValueError,
            ("winograd_backend",),
            watch=watch,
        ),
        Case("optimize", "extra='x'", opt(extra="x"), ValueError, ("extra",), watch=watch),
        Case("optimize", "tolerance='1e-3'", opt(tolerance="1e-3"), ValueError, ("tolerance",), watch=watch),
        Case("optimize", "tolerance=-1", opt(tolerance=-1.0), ValueError, ("tolerance",), watch=watch),
        Case(
            "optimize", "tolerance=nan", opt(tolerance=float("nan")), ValueError, ("tolerance",), watch=watch
        ),
        Case("optimize", "config='fast'", opt("fast"), TypeError, ("config",), watch=watch),
        Case(
            "optimize",
            "config={'winograd': True}",
            opt({"winograd": True}),
            TypeError,
            ("config",),
            watch=watch,
        ),
        Case(
            "optimize",
            "attention='xformers' (not usable here)",
            opt(attention="xformers"),
            Exception,
            ("xformers",),
            watch=watch,
        ),
        Case(
            "optimize", "attention='bogus'", opt(attention="bogus"), ValueError, ("attention",), watch=watch
        ),
        Case("optimize", "winograd='yes'", opt(winograd="yes"), ValueError, ("winograd",), watch=watch),
        Case(
            "optimize", "channels_last=1", opt(channels_last=1), ValueError, ("channels_last",), watch=watch
        ),
        Case(
            "optimize",
            "fuse_norm_act='auto'",
            opt(fuse_norm_act="auto"),
            ValueError,
            ("fuse_norm_act",),
            watch=watch,
        ),
        Case(
            "optimize",
            "plan_cache_dir=5",
            opt(plan_cache_dir=5),
            ValueError,
            ("plan_cache_dir",),
            watch=watch,
        ),
        Case("optimize", "unknown option bogus=1", opt(bogus=1), TypeError, ("bogus",), watch=watch),
        Case("optimize", "pipe.unet is a Linear", not_a_unet, TypeError, ("unet",)),
        Case("optimize", "report('x')", lambda: fastdiff.report("x"), TypeError, ("report", "str")),
        Case("optimize", "restore('x')", lambda: fastdiff.restore("x"), TypeError, ("restore", "str")),
        Case(
            "optimize",
            "verify=False: report says not verified",
            not_verified,
            None,
            check=lambda r: all(
                "not verified" in (p.reason or "") for p in r.passes if p.status == "applied"
            ),
        ),
        Case("optimize", "optimize twice (idempotent)", twice, None),
        Case(
            "optimize",
            "OptimizeConfig(attention=5)",
            lambda: fastdiff.OptimizeConfig(attention=5),
            E,
            ("attention",),
        ),
    ]


def _scheduler_cases() -> list[Case]:
    import fastdiff

    ms = fastdiff.make_scheduler

    def steps(n):
        return lambda: ms("dpmpp_2m").set_timesteps(n)

    owner = "samplers (unassigned)"
    return [
        Case("make_scheduler", "name='bogus'", lambda: ms("bogus"), ValueError, ("bogus",)),
        Case("make_scheduler", "name=5", lambda: ms(5), (ValueError, TypeError), ("name", "sampler")),
        Case(
            "make_scheduler",
            "dpmpp_2m eta=0.5",
            lambda: ms("dpmpp_2m", eta=0.5),
            ValueError,
            ("eta",),
            owner=owner,
        ),
        Case(
            "make_scheduler",
            "dpmpp_2m use_corrector=False",
            lambda: ms("dpmpp_2m", use_corrector=False),
            ValueError,
            ("use_corrector",),
            owner=owner,
        ),
        Case(
            "make_scheduler",
            "rho with schedule='trailing'",
            lambda: ms("dpmpp_2m", schedule="trailing", rho=3.0),
            ValueError,
            ("rho",),
            owner=owner,
        ),
        Case(
            "make_scheduler",
            "ddim eta=nan",
            lambda: ms("ddim", eta=float("nan")),
            ValueError,
            ("eta",),
            owner=owner,
        ),
        Case(
            "make_scheduler", "ddim eta=-1", lambda: ms("ddim", eta=-1.0), ValueError, ("eta",), owner=owner
        ),
        Case(
            "make_scheduler",
            "rho=nan",
            lambda: ms("dpmpp_2m", schedule="karras", rho=float("nan")),
            ValueError,
            ("rho",),
            owner=owner,
        ),
        Case(
            "make_scheduler",
            "solver_order='2'",
            lambda: ms("dpmpp_2m", solver_order="2"),
            (ValueError, TypeError),
            ("solver_order",),
            owner=owner,
        ),
        Case(
            "make_scheduler",
            "euler solver_order=3",
            lambda: ms("euler", solver_order=3),
            ValueError,
            ("solver_order",),
            owner=owner,
        ),
        Case(
            "make_scheduler",
            "schedule='bogus'",
            lambda: ms("dpmpp_2m", schedule="bogus"),
            ValueError,
            ("schedule",),
            owner=owner,
        ),
        Case(
            "make_scheduler",
            "schedule=[]",
            lambda: ms("dpmpp_2m", schedule=[]),
            ValueError,
            ("schedule",),
            owner=owner,
        ),
        Case(
            "make_scheduler",
            "prediction_type='bogus'",
            lambda: ms("dpmpp_2m", prediction_type="bogus"),
            ValueError,
            ("prediction_type",),
            owner=owner,
        ),
        Case(
            "make_scheduler",
            "final_step='bogus'",
            lambda: ms("dpmpp_2m", final_step="bogus"),
            ValueError,
            ("final_step",),
            owner=owner,
        ),
        Case(
            "make_scheduler",
            "fractional_timesteps='yes'",
            lambda: ms("dpmpp_2m", fractional_timesteps="yes"),
            (ValueError, TypeError),
            ("fractional_timesteps",),
            owner=owner,
        ),
        Case(
            "make_scheduler",
            "like='x'",
            lambda: ms("dpmpp_2m", like="x"),
            (ValueError, TypeError),
            ("like",),
            owner=owner,
        ),
        Case(
            "make_scheduler",
            "unknown option",
            lambda: ms("dpmpp_2m", bogus=1),
            (ValueError, TypeError),
            ("bogus",),
            owner=owner,
        ),
        Case(
            "make_scheduler", "set_timesteps(0)", steps(0), ValueError, ("num_inference_steps",), owner=owner
        ),
        Case(
            "make_scheduler",
            "set_timesteps(5000)",
            steps(5000),
            ValueError,
            ("num_inference_steps", "1000"),
            owner=owner,
        ),
        Case(
            "make_scheduler",
            "lcm timestep_scaling=nan",
            lambda: ms("lcm", timestep_scaling=float("nan")),
            ValueError,
            ("timestep_scaling",),
            owner=owner,
        ),
    ]


def _sample_cases() -> list[Case]:
    import fastdiff

    lat = torch.randn(1, 4, 8, 8)

    def sample(model=lambda x, t: x, latents=lat, **kw):
        kw.setdefault("scheduler", fastdiff.make_scheduler("dpmpp_2m"))
        kw.setdefault("num_inference_steps", 3)
        return lambda: fastdiff.sample(model, latents, **kw)

    control = "control"
    return [
        Case(
            "sample",
            "model returns NaN",
            sample(lambda x, t: x * float("nan")),
            FloatingPointError,
            ("step",),
            owner=control,
        ),
        Case(
            "sample",
            "model returns inf",
            sample(lambda x, t: x * float("inf")),
            FloatingPointError,
            ("step",),
            owner=control,
        ),
        Case("sample", "latents with NaN", sample(latents=lat * float("nan")), ValueError, ("latents",)),
        Case(
            "sample",
            "step_kwargs={'etaa': 0.5}",
            sample(step_kwargs={"etaa": 0.5}),
            (ValueError, TypeError),
            ("etaa",),
            owner=control,
        ),
        Case(
            "sample", "model returns a tuple", sample(lambda x, t: (x,)), TypeError, ("model",), owner=control
        ),
        Case("sample", "controller='yes'", sample(controller="yes"), TypeError, ("controller",)),
        Case("sample", "callback=5", sample(callback=5), TypeError, ("callback",)),
        Case(
            "sample",
            "num_inference_steps=0",
            sample(num_inference_steps=0),
            ValueError,
            ("num_inference_steps",),
            owner=control,
        ),
        Case(
            "sample",
            "scheduler='dpmpp_2m' (a name)",
            sample(scheduler="dpmpp_2m"),
            (TypeError, ValueError),
            ("scheduler",),
        ),
        Case("sample", "latents a list", sample(latents=[[0.0]]), (TypeError, ValueError), ("latents",)),
        Case(
            "sample",
            "stop_after=0",
            sample(stop_after=0),
            None,
            check=lambda r: r.state is not None and r.steps_run == [0] * len(r.steps_run),
            note="documented: pauses before the first step (a resumable state); stop_after=-1 raises",
        ),
        Case("sample", "stop_after=-1", sample(stop_after=-1), ValueError, ("stop_after",)),
        Case("sample", "start_step=-1", sample(start_step=-1), ValueError, ("start_step",)),
        Case(
            "sample",
            "generator='seed'",
            sample(generator="seed"),
            (TypeError, ValueError),
            ("generator",),
            owner=control,
        ),
    ]


def _engine_cases(tmp: Path) -> list[Case]:
    import fastdiff
    from fastdiff.engines import CalibrationData, ExportConfig, GateConfig, QuantConfig, RuntimeConfig
    from fastdiff.testing import tiny_pipeline

    C = tiny_pipeline("sd15")
    watch = lambda: C  # noqa: E731
    ce = fastdiff.compile_engine

    def compile_(**kw):
        return lambda: ce(C, cache_dir=tmp / "engines", **kw)

    truncated, not_st = tmp / "calib-truncated.safetensors", tmp / "calib.json"
    calib = None

    def sd15_calibration():
        nonlocal calib
        if calib is None:
            calib = fastdiff.calibrate(
                C, ["a red circle", "a blue square"], num_inference_steps=2, progress=False
            )
        return calib

    def truncated_file():
        sd15_calibration().save(truncated)
        data = truncated.read_bytes()
        truncated.write_bytes(data[: len(data) // 2])
        return CalibrationData.load(truncated)

    def not_safetensors():
        not_st.write_text('{"records": []}')
        return CalibrationData.load(not_st)

    def sdxl_records_for_sd15():
        x = tiny_pipeline("sdxl")
        records = fastdiff.calibrate(
            x, ["a red circle", "a blue square"], num_inference_steps=2, progress=False
        )
        return ce(C, precision="int8", calibration=records, cache_dir=tmp / "engines")

    engines = "engines"
    return [
        Case(
            "engines",
            "compile_engine('x')",
            lambda: ce("x", cache_dir=tmp),
            TypeError,
            ("unet", "pipeline", "str"),
        ),
        Case("engines", "backend='bogus'", compile_(backend="bogus"), ValueError, ("backend",), watch=watch),
        Case(
            "engines", "precision='int4'", compile_(precision="int4"), ValueError, ("precision",), watch=watch
        ),
        Case(
            "engines",
            "int8 without calibration",
            compile_(precision="int8"),
            ValueError,
            ("calibration",),
            watch=watch,
        ),
        Case(
            "engines",
            "calibration='file.safetensors' (a path)",
            compile_(calibration="x.safetensors"),
            TypeError,
            ("calibration",),
            watch=watch,
        ),
        Case(
            "engines",
            "RuntimeConfig(threads=-1)",
            lambda: compile_(runtime=RuntimeConfig(threads=-1))(),
            ValueError,
            ("threads",),
            watch=watch,
            owner=engines,
        ),
        Case(
            "engines",
            "GateConfig(min_snr_db='x')",
            lambda: compile_(gate=GateConfig(min_snr_db="x"))(),
            (ValueError, TypeError),
            ("min_snr_db",),
            watch=watch,
            owner=engines,
        ),
        Case(
            "engines",
            "QuantConfig(method='bogus') for an int8 engine",
            lambda: compile_(
                precision="int8", calibration=sd15_calibration(), quant=QuantConfig(method="bogus")
            )(),
            ValueError,
            ("method",),
            watch=watch,
            owner=engines,
        ),
        Case(
            "engines",
            "ExportConfig(opset=5)",
            lambda: compile_(export=ExportConfig(opset=5))(),
            ValueError,
            ("opset",),
            watch=watch,
            owner=engines,
        ),
        Case(
            "engines",
            "quality gate refuses (min_snr_db=1e9)",
            compile_(gate=GateConfig(min_snr_db=1e9)),
            Exception,
            ("snr",),
            watch=watch,
        ),
        Case(
            "engines",
            "truncated calibration file",
            truncated_file,
            (ValueError, OSError),
            (str(truncated),),
            owner=engines,
        ),
        Case(
            "engines",
            "calibration file not safetensors",
            not_safetensors,
            (ValueError, OSError),
            (str(not_st),),
            owner=engines,
        ),
        Case(
            "engines",
            "SDXL calibration records for an SD1.5 engine",
            sdxl_records_for_sd15,
            ValueError,
            ("calibration",),
            watch=watch,
            owner=engines,
        ),
        Case(
            "engines",
            "calibrate(prompts=[])",
            lambda: fastdiff.calibrate(C, [], progress=False),
            ValueError,
            ("prompt",),
            watch=watch,
        ),
        Case(
            "engines",
            "calibrate(num_inference_steps=0)",
            lambda: fastdiff.calibrate(C, ["a"], num_inference_steps=0, progress=False),
            ValueError,
            ("num_inference_steps",),
            watch=watch,
        ),
    ]


def _cache_cases() -> list[Case]:
    import fastdiff
    from fastdiff.testing import tiny_pipeline

    S = tiny_pipeline("sd15")
    watch = lambda: S  # noqa: E731

    def twice():
        p = tiny_pipeline("sd15")
        fastdiff.step_cache(p)
        return fastdiff.step_cache(p)

    return [
        Case(
            "step_cache",
            "mode='bogus'",
            lambda: fastdiff.step_cache(S, "bogus"),
            ValueError,
            ("mode",),
            watch=watch,
        ),
        Case(
            "step_cache",
            "interval=0",
            lambda: fastdiff.step_cache(S, interval=0),
            ValueError,
            ("interval",),
            watch=watch,
        ),
        Case(
            "step_cache",
            "branch=99",
            lambda: fastdiff.step_cache(S, branch=99),
            ValueError,
            ("branch",),
            watch=watch,
        ),
        Case(
            "step_cache",
            "mode='schedule' without refresh",
            lambda: fastdiff.step_cache(S, "schedule"),
            ValueError,
            ("refresh",),
            watch=watch,
        ),
        Case(
            "step_cache",
            "unknown option",
            lambda: fastdiff.step_cache(S, intervall=2),
            (ValueError, TypeError),
            ("intervall",),
            watch=watch,
            owner="cache",
        ),
        Case("step_cache", "step_cache('x')", lambda: fastdiff.step_cache("x"), TypeError, ("step_cache",)),
        Case("step_cache", "installed twice", twice, RuntimeError, ("already installed",)),
    ]


def _cli_cases(tmp: Path) -> list[Case]:
    blocker = tmp / "a-file"
    blocker.write_text("")
    bad_spec = tmp / "bad.json"
    bad_spec.write_text(json.dumps({"pipeline": "fastdiff-tiny", "prompts": [], "configs": [{}]}))
    good_spec = tmp / "good.json"
    good_spec.write_text(
        json.dumps({"pipeline": "fastdiff-tiny", "prompts": ["a red circle"], "configs": [{"name": "r"}]})
    )
    return [
        Case(
            "cli",
            "demo --only nonexistent",
            lambda: _cli("demo", "--only", "nonexistent"),
            CLIFailed,
            ("--only",),
        ),
        Case("cli", "demo --only (no names)", lambda: _cli("demo", "--only"), CLIFailed, ("--only",)),
        Case(
            "cli",
            "demo --out /proc/forbidden",
            lambda: _cli("demo", "--quick", "--out", "/proc/forbidden"),
            CLIFailed,
            ("--out",),
        ),
        Case(
            "cli",
            "demo --out under a file",
            lambda: _cli("demo", "--quick", "--out", str(blocker / "o")),
            CLIFailed,
            ("--out",),
        ),
        Case("cli", "demo --seed x", lambda: _cli("demo", "--seed", "x"), CLIFailed, ("--seed",)),
        Case(
            "cli",
            "sweep missing.toml",
            lambda: _cli("sweep", str(tmp / "missing.toml"), "--check"),
            CLIFailed,
            ("missing.toml",),
        ),
        Case(
            "cli", "sweep bad spec", lambda: _cli("sweep", str(bad_spec), "--check"), CLIFailed, ("prompts",)
        ),
        Case(
            "cli",
            "sweep --out under a file",
            lambda: _cli("sweep", str(good_spec), "--out", str(blocker / "o")),
            CLIFailed,
            ("--out",),
        ),
        Case("cli", "info --bogus", lambda: _cli("info", "--bogus"), CLIFailed, ("--bogus",)),
        Case("cli", "no command", lambda: _cli(), CLIFailed, ("command",)),
    ]


def _tiny_cases() -> list[Case]:
    from fastdiff.testing import tiny_pipeline
    from fastdiff.tiny import load_pipeline

    return [
        Case(
            "tiny",
            "load_pipeline(dtype='float16') gives float16",
            lambda: load_pipeline("base", dtype="float16"),
            None,
            check=lambda p: p.unet.dtype == torch.float16,
        ),
        Case("tiny", "load_pipeline('huge')", lambda: load_pipeline("huge"), ValueError, ("variant",)),
        Case(
            "tiny",
            "load_pipeline(dtype='int8')",
            lambda: load_pipeline("base", dtype="int8"),
            ValueError,
            ("dtype",),
        ),
        Case(
            "tiny",
            "load_pipeline(device='gpu0')",
            lambda: load_pipeline("base", device="gpu0"),
            ValueError,
            ("device",),
        ),
        Case(
            "tiny",
            "load_pipeline(weights_root='/nonexistent')",
            lambda: load_pipeline("base", weights_root="/nonexistent"),
            FileNotFoundError,
            ("/nonexistent",),
        ),
        Case(
            "tiny", "testing.tiny_pipeline('sd3')", lambda: tiny_pipeline("sd3"), ValueError, ("arch", "sd3")
        ),
        Case(
            "tiny",
            "testing.tiny_pipeline(size='huge')",
            lambda: tiny_pipeline("sd15", size="huge"),
            ValueError,
            ("size",),
        ),
    ]


AREAS = ("pipeline", "optimize", "make_scheduler", "sample", "engines", "step_cache", "cli", "tiny")


def build_cases(tmp: Path, areas=AREAS) -> list[Case]:
    import fastdiff
    from fastdiff.testing import tiny_pipeline

    def fresh():
        p = fastdiff.StableDiffusionPipeline.from_pipe(tiny_pipeline("sd15"))
        p.set_progress_bar_config(disable=True)
        return p

    builders = {
        "pipeline": lambda: _pipeline_cases(fresh(), fresh),
        "optimize": _optimize_cases,
        "make_scheduler": _scheduler_cases,
        "sample": _sample_cases,
        "engines": lambda: _engine_cases(tmp),
        "step_cache": _cache_cases,
        "cli": lambda: _cli_cases(tmp),
        "tiny": _tiny_cases,
    }
    return [c for area in areas for c in builders[area]()]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--area", action="append", choices=AREAS, help="run only this area (repeatable)")
    ap.add_argument("--no-write", action="store_true", help="print only; leave the results files alone")
    args = ap.parse_args(argv)
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    from diffusers.utils import logging as dlog

    dlog.set_verbosity_error()
    dlog.disable_progress_bar()
    t0 = time.perf_counter()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="fastdiff-bad-inputs-") as tmp:
        cases = build_cases(Path(tmp), args.area or AREAS)
        rows = []
        for case in cases:
            row = _classify(case)
            rows.append(row)
            print(
                f"{row['outcome']:<10} {row['area']:<14} {row['case']:<48} {row['message'][:110]}", flush=True
            )
    totals = Counter(r["outcome"] for r in rows)
    goal_rows = []
    for outcome in OUTCOMES:
        n = totals.get(outcome, 0)
        goal = GOALS.get(outcome)
        by_owner = Counter(r["owner"] or "validate" for r in rows if r["outcome"] == outcome)
        goal_rows.append(
            {
                "outcome": outcome,
                "count": n,
                "goal (#16)": "" if goal is None else f"<= {goal}",
                "met": "" if goal is None else ("met" if n <= goal else "not met"),
                "by owner": ", ".join(f"{k} {v}" for k, v in sorted(by_owner.items())),
            }
        )
    wall = time.perf_counter() - t0
    print(f"\n{len(rows)} cases in {wall:.0f} s: " + ", ".join(f"{k} {totals.get(k, 0)}" for k in OUTCOMES))
    if args.no_write:
        return 0
    meta = {
        **env_info(),
        "load_avg_before": load_before,
        "load_avg_after": os.getloadavg(),
        "wall_s": round(wall, 1),
    }
    meta["git"] = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    from benchmarks._common import markdown_table

    notes = (
        f"Bad-input sweep of issue #16 (`python benchmarks/bad_inputs.py`), {len(rows)} cases, git {meta['git']}, "
        f"{wall:.0f} s, load average {load_before[0]:.2f} before / {meta['load_avg_after'][0]:.2f} after.\n\n"
        "Outcome definitions are in the script's docstring. `owner` names the helper branch that fixes a case "
        "(empty: this branch). Goals against issue #16:\n\n" + markdown_table(goal_rows)
    )
    own = Counter(r["outcome"] for r in rows if not r["owner"])
    notes += (
        f"\nCases this branch owns ({sum(own.values())}): "
        + ", ".join(f"{k} {own.get(k, 0)}" for k in OUTCOMES)
        + '. A goal above reads "not met" while any owner\'s cases remain; rerun after merging every branch.'
        + " Not clear or handled, by owner:\n\n"
        + "".join(
            f"- {r['owner'] or 'validate'}: {r['area']} `{r['case']}` -> {r['outcome']}\n"
            for r in sorted(rows, key=lambda r: r["owner"])
            if r["outcome"] not in ("clear", "handled")
        )
    )
    if args.area:
        notes += f"\nOnly areas: {', '.join(args.area)}.\n"
    write_results(
        "bad_inputs", rows, meta=meta, notes=notes, columns=["area", "case", "outcome", "owner", "message"]
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
