"""Bit-for-bit snapshots of a pipeline or U-Net, to check that a failed call left it as it was (#16).

:func:`snapshot` records everything fastdiff could change in place: which component objects the pipeline
holds, the scheduler's config, every model's parameters and buffers (cloned), the type of every submodule,
every module's forward hooks, the attention processors, the train/eval flag, ``fastdiff.installed``
records and any instance-level ``forward`` override. :func:`differences` lists what differs between two
snapshots, in words; an empty list means "unchanged".
"""

from __future__ import annotations

import torch

from fastdiff import installed

__all__ = ["differences", "snapshot", "unet_output"]

_COMPONENTS = ("unet", "vae", "text_encoder", "text_encoder_2", "scheduler")
_HOOK_DICTS = (
    "_forward_pre_hooks",
    "_forward_hooks",
    "_forward_pre_hooks_with_kwargs",
    "_forward_hooks_with_kwargs",
    "_backward_hooks",
    "_backward_pre_hooks",
)


def _module_snapshot(module: torch.nn.Module) -> dict:
    snap = {
        "state_dict": {k: v.detach().clone() for k, v in module.state_dict().items()},
        "types": [(name, type(m)) for name, m in module.named_modules()],
        "hooks": [
            (name, attr, tuple(getattr(m, attr, {}).keys()))
            for name, m in module.named_modules()
            for attr in _HOOK_DICTS
        ],
        "forward_overrides": [name for name, m in module.named_modules() if "forward" in m.__dict__],
        "training": [(name, m.training) for name, m in module.named_modules()],
        "requires_grad": [(name, p.requires_grad) for name, p in module.named_parameters()],
        "installed": [(i.kind, sorted(i.info)) for i in installed.installations(module)],
    }
    processors = getattr(module, "attn_processors", None)
    if isinstance(processors, dict):
        snap["processors"] = {name: type(p) for name, p in processors.items()}
    return snap


def snapshot(obj) -> dict:
    """What ``obj`` (a pipeline or a ``torch.nn.Module``) is now; compare two with :func:`differences`."""
    if isinstance(obj, torch.nn.Module):
        return {"module": _module_snapshot(obj)}
    snap = {
        "installed": [(i.kind, sorted(i.info)) for i in installed.installations(obj)],
        "components": {name: id(getattr(obj, name, None)) for name in _COMPONENTS},
    }
    scheduler = getattr(obj, "scheduler", None)
    if scheduler is not None:
        snap["scheduler_type"] = type(scheduler)
        snap["scheduler_config"] = dict(scheduler.config)
    for name in _COMPONENTS:
        component = getattr(obj, name, None)
        if isinstance(component, torch.nn.Module):
            snap[name] = _module_snapshot(component)
    return snap


def _equal(a, b) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and torch.equal(a, b)
        )
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return a == b


def differences(before: dict, after: dict, prefix: str = "") -> list[str]:
    """What differs between two :func:`snapshot` results (empty: bit-for-bit the same)."""
    out = []
    for key in sorted(set(before) | set(after)):
        a, b = before.get(key), after.get(key)
        path = f"{prefix}{key}"
        if isinstance(a, dict) and isinstance(b, dict) and key not in ("scheduler_config", "processors"):
            if key == "state_dict":
                changed = [k for k in sorted(set(a) | set(b)) if not _equal(a.get(k), b.get(k))]
                if changed:
                    out.append(f"{path}: {len(changed)} tensor(s) differ, e.g. {changed[0]}")
            else:
                out += differences(a, b, prefix=path + ".")
        elif not _equal(a, b):
            out.append(f"{path} differs")
    return out


@torch.no_grad()
def unet_output(unet, seed: int = 0) -> torch.Tensor:
    """The U-Net's output on a fixed probe input (see :func:`fastdiff.testing.unet_probe_inputs`)."""
    from fastdiff.testing.probe import unet_probe_inputs

    return unet(**unet_probe_inputs(unet, seed=seed), return_dict=False)[0].clone()
