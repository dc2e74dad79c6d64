"""`optimize`, `report` and `restore`: the one-call entry point for diffusers users.

Every pass edits the UNet through a :class:`PassContext`, which records how
to undo it. With ``verify=True`` the original UNet's output on a small probe
is computed first; after each pass the optimised UNet runs the same probe and
a pass whose output drifts beyond a dtype-aware tolerance is rolled back and
reported. So ``optimize`` never hands back a silently wrong model, and
``restore`` returns the exact original modules.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from diffusers import UNet2DConditionModel

from fastdiff.optimize.config import OptimizeConfig
from fastdiff.optimize.context import PassContext
from fastdiff.optimize.passes import default_passes
from fastdiff.optimize.report import OptimizeReport, PassReport, Verification
from fastdiff.testing.probe import unet_probe_inputs

_TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-8, torch.float16: 1e-2, torch.bfloat16: 4e-2}
_STATE = "_fastdiff_state"


@dataclass
class _State:
    contexts: list[PassContext] = field(default_factory=list)
    report: OptimizeReport = field(default_factory=OptimizeReport)


def _resolve_unet(obj) -> UNet2DConditionModel:
    if isinstance(obj, UNet2DConditionModel):
        return obj
    unet = getattr(obj, "unet", None)
    if isinstance(unet, UNet2DConditionModel):
        return unet
    if unet is not None and hasattr(unet, "fastdiff_original_unet"):
        raise TypeError(
            "this pipeline's unet is a compiled fastdiff engine; call fastdiff.restore(pipe) before optimize"
        )
    raise TypeError(
        f"fastdiff.optimize supports a diffusers UNet2DConditionModel or a pipeline with a `unet` "
        f"(StableDiffusionPipeline, StableDiffusionXLPipeline, their img2img/ControlNet/LCM variants); "
        f"got {type(obj).__name__}"
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
        undo.
    """
    unet = _resolve_unet(obj)
    config = (config or OptimizeConfig()).replace(**overrides)
    if getattr(unet, _STATE, None) is not None:
        _restore_unet(unet)

    passes = default_passes()
    for p in passes:  # fail on impossible requests before any module changes
        if hasattr(p, "check") and p.enabled(config) is True:
            p.check(unet, config)

    param = next(unet.parameters())
    tolerance = config.tolerance or _TOLERANCE.get(param.dtype, 1e-2)
    probe = ref = None
    if config.verify:
        probe = unet_probe_inputs(unet)
        probe_desc = f"{tuple(probe['sample'].shape)} {str(param.dtype).removeprefix('torch.')}"
        ref = _run_probe(unet, probe)

    state = _State(report=OptimizeReport(config=config))
    try:
        for p in passes:
            enabled = p.enabled(config)
            if enabled is not True:
                state.report.passes.append(PassReport(p.name, "disabled", reason=str(enabled or "disabled")))
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
            if config.verify and ctx.changed:
                rep.verification = _compare(_run_probe(unet, probe), ref, tolerance, probe_desc)
                if not rep.verification.passed:
                    ctx.undo()
                    rep.status = "rolled back"
                    rep.reason = "output did not match the original UNet"
            if rep.status == "applied":
                state.contexts.append(ctx)
                if rep.verification is not None:
                    state.report.verification = rep.verification
            state.report.passes.append(rep)
    except Exception:
        for ctx in reversed(state.contexts):
            ctx.undo()
        raise
    setattr(unet, _STATE, state)
    return obj


def _restore_unet(unet) -> None:
    state = getattr(unet, _STATE, None)
    if state is None:
        return
    for ctx in reversed(state.contexts):
        ctx.undo()
    delattr(unet, _STATE)


def restore(obj):
    """Undo :func:`optimize` (and :func:`fastdiff.compile_engine`): the original modules come back.

    Parameters were shared, never copied, so outputs afterwards are
    bit-identical to those before ``optimize``. Returns ``obj``.
    """
    engine = getattr(obj, "unet", None)
    original = getattr(engine, "fastdiff_original_unet", None)
    if original is not None:
        obj.unet = original
    if isinstance(obj, UNet2DConditionModel) or isinstance(getattr(obj, "unet", None), UNet2DConditionModel):
        _restore_unet(_resolve_unet(obj))
        return obj
    raise TypeError(
        f"fastdiff.restore supports a UNet2DConditionModel or a pipeline with a `unet`; got {type(obj).__name__}"
    )


def report(obj) -> OptimizeReport:
    """What :func:`optimize` did to ``obj``: per pass, changed and skipped modules and verification.

    Layers with measured dispatch plans (Winograd "auto") show their live
    per-shape choices, which fill in as new shapes are seen.
    """
    unet = _resolve_unet(obj)
    state = getattr(unet, _STATE, None)
    if state is None:
        return OptimizeReport(
            passes=[PassReport("optimize", "not applied", reason="call fastdiff.optimize(obj) first")]
        )
    for rep in state.report.passes:
        for path, _ in rep.changed:
            try:
                module = unet.get_submodule(path) if path else unet
            except AttributeError:
                continue
            summary = getattr(module, "plan_summary", None)
            if callable(summary):
                plan = summary()
                if plan:
                    rep.details.setdefault(path, {})["plan"] = plan
    return state.report
