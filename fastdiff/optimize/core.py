"""`optimize`, `report` and `restore`: the one-call entry point for diffusers users.

Every pass edits the UNet through a :class:`PassContext`, which records how
to undo it. With ``verify=True`` the original UNet's output on a small probe
is computed first; after each pass the optimised UNet runs the same probe and
a pass whose output drifts beyond a dtype-aware tolerance is rolled back and
reported. So ``optimize`` never hands back a silently wrong model, and
``restore`` returns the exact original modules.
"""

from __future__ import annotations

import torch
from diffusers import UNet2DConditionModel

from fastdiff import installed
from fastdiff.optimize.config import OptimizeConfig
from fastdiff.optimize.context import PassContext
from fastdiff.optimize.passes import default_passes
from fastdiff.optimize.report import OptimizeReport, PassReport, Verification, with_step_cache
from fastdiff.unet_inputs import probe_inputs

_TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-8, torch.float16: 1e-2, torch.bfloat16: 4e-2}


def _resolve_unet(obj, action: str = "optimize") -> UNet2DConditionModel:
    if isinstance(obj, UNet2DConditionModel):
        return obj
    if not hasattr(obj, "unet"):
        raise TypeError(
            f"fastdiff.{action} supports a diffusers UNet2DConditionModel or a pipeline with a `unet` "
            f"(StableDiffusionPipeline, StableDiffusionXLPipeline, their img2img/ControlNet/LCM variants); "
            f"got {type(obj).__name__}"
        )
    unet = obj.unet
    if isinstance(unet, UNet2DConditionModel):
        return unet
    if installed.find(obj, "engine") is not None:
        raise TypeError(
            f"this pipeline's unet is a compiled fastdiff engine; call fastdiff.restore(pipe) before {action}"
        )
    raise TypeError(
        f"fastdiff.{action} needs pipe.unet to be a diffusers UNet2DConditionModel; "
        f"this {type(obj).__name__}'s unet is a {type(unet).__name__}"
    )


def _run_probe(unet, inputs) -> torch.Tensor:
    with torch.no_grad():
        return unet(**inputs, return_dict=False)[0].float()


def _compare(out: torch.Tensor, ref: torch.Tensor, tolerance: float, probe: str) -> Verification:
    scale = ref.abs().max().clamp_min(1e-12)
    err = ((out - ref).abs().max() / scale).item()
    if not torch.isfinite(out).all():
        err = float("inf")
    return Verification(error=err, tolerance=tolerance, probe=probe)


def optimize(obj, config: OptimizeConfig | None = None, **overrides):
    """Make a diffusers pipeline's or UNet's forward pass cheaper, in place.

    Args:
        obj: a ``UNet2DConditionModel`` or a pipeline with a ``unet``.
        config: an :class:`OptimizeConfig`; defaults are capability-based.
        **overrides: fields of :class:`OptimizeConfig` (unknown names raise TypeError).

    Returns:
        ``obj``, optimised. Calling ``optimize`` again first restores, so it is
        idempotent. See :func:`report` for what changed and :func:`restore` to
        undo. Every argument is checked, and every forced backend is checked
        against this device, before anything changes: a failed call leaves
        ``obj`` as it was, including an earlier optimisation.
    """
    unet = _resolve_unet(obj)
    config = OptimizeConfig.coerce(config).replace(**overrides)
    passes = default_passes()
    for p in passes:  # fail on impossible requests before any module changes
        if p.disabled_reason(config) is None:
            p.check(unet, config)

    previous = installed.find(unet, "optimize")
    if previous is not None:
        installed.undo_all(unet, "optimize")
    try:
        _apply(unet, config, passes)
    except Exception as err:
        if previous is not None:  # put the earlier optimisation back, as promised above
            try:
                _apply(unet, previous.info["report"].config, default_passes())
            except Exception as again:
                # _apply undoes its own partial work, so the U-Net is the original one: say so, loudly
                raise RuntimeError(
                    f"optimize failed ({type(err).__name__}: {err}) and re-applying the earlier optimisation "
                    f"failed too ({type(again).__name__}: {again}); the U-Net is now unoptimised, as after "
                    "fastdiff.restore"
                ) from err
        raise
    return obj


def _apply(unet, config: OptimizeConfig, passes) -> None:
    param = next(unet.parameters())
    tolerance = config.tolerance or _TOLERANCE.get(param.dtype, 1e-2)
    probe = ref = None
    if config.verify:
        probe = probe_inputs(unet)
        probe_desc = f"{tuple(probe['sample'].shape)} {str(param.dtype).removeprefix('torch.')}"
        ref = _run_probe(unet, probe)

    report = OptimizeReport(config=config)
    applied: list[PassContext] = []

    def undo() -> None:
        for ctx in reversed(applied):
            ctx.undo()

    try:
        for p in passes:
            why_not = p.disabled_reason(config)
            if why_not is not None:
                report.passes.append(PassReport(p.name, "disabled", reason=why_not))
                continue
            ctx = PassContext(unet, p.name)
            try:
                p.apply(unet, config, ctx)
            except Exception:
                ctx.undo()
                raise
            rep = PassReport(
                p.name,
                "applied" if ctx.changed else "nothing to do",
                changed=ctx.changed,
                skipped=ctx.skipped,
                details=ctx.details,
            )
            if ctx.changed and not config.verify:
                rep.reason = "not verified (verify=False)"
            if config.verify and ctx.changed:
                rep.verification = _compare(_run_probe(unet, probe), ref, tolerance, probe_desc)
                if not rep.verification.passed:
                    ctx.undo()
                    rep.status = "rolled back"
                    rep.reason = "output did not match the original UNet"
            if rep.status == "applied":
                applied.append(ctx)
                if rep.verification is not None:
                    report.verification = rep.verification
            report.passes.append(rep)
    except Exception:
        undo()
        raise
    installed.record(unet, "optimize", undo, report=report)  # fastdiff.report reads it there


def restore(obj):
    """Undo everything fastdiff installed on ``obj``: optimize passes, an engine, a step cache.

    Installations are undone newest first (see :mod:`fastdiff.installed`).
    Parameters were shared, never copied, so outputs afterwards are
    bit-identical to those before. Returns ``obj``.
    """
    if not isinstance(obj, UNet2DConditionModel) and not hasattr(obj, "unet"):
        raise TypeError(
            f"fastdiff.restore supports a UNet2DConditionModel or a pipeline with a `unet`; got {type(obj).__name__}"
        )
    installed.undo_all(obj)
    unet = getattr(obj, "unet", obj)
    if isinstance(unet, torch.nn.Module):
        installed.undo_all(unet)
    return obj


def report(obj) -> OptimizeReport:
    """What :func:`optimize` did to ``obj``: per pass, changed and skipped modules and verification.

    Layers with measured dispatch plans (Winograd "auto") show their live
    per-shape choices, which fill in as new shapes are seen. An installed
    step cache (``fastdiff.step_cache``) is listed with its last run's stats.
    """
    unet = _resolve_unet(obj, "report")
    inst = installed.find(unet, "optimize")
    if inst is None:
        not_applied = PassReport("optimize", "not applied", reason="call fastdiff.optimize(obj) first")
        return with_step_cache(OptimizeReport(passes=[not_applied]), unet)
    for rep in inst.info["report"].passes:
        for path, _ in rep.changed:
            try:
                module = unet.get_submodule(path)  # "" is the U-Net itself
            except AttributeError:
                continue
            summary = getattr(module, "plan_summary", None)
            if callable(summary):
                plan = summary()
                if plan:
                    rep.details.setdefault(path, {})["plan"] = plan
    return with_step_cache(inst.info["report"], unet)
