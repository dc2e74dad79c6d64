"""Agreement metrics between an engine's U-Net output and the PyTorch reference."""

from __future__ import annotations

import math

import torch

from ..unet_inputs import unet_signature


class QualityGateError(RuntimeError):
    """An engine's output differs from the PyTorch U-Net more than the configured threshold allows."""

    def __init__(self, message: str, quality: dict):
        super().__init__(message)
        self.quality = quality


def snr_db(out: torch.Tensor, ref: torch.Tensor) -> float:
    """Signal-to-noise ratio 10·log10(||ref||² / ||out - ref||²) in dB (inf when identical)."""
    ref = ref.double()
    err = (out.double() - ref).pow(2).sum().item()
    sig = ref.pow(2).sum().item()
    if err == 0.0:
        return math.inf
    if sig == 0.0:
        return -math.inf
    return 10.0 * math.log10(sig / err)


def cosine_similarity(out: torch.Tensor, ref: torch.Tensor) -> float:
    a, b = out.double().flatten(), ref.double().flatten()
    denom = a.norm() * b.norm()
    return float((a @ b) / denom) if denom > 0 else float("nan")


def compare_outputs(outs: list[torch.Tensor], refs: list[torch.Tensor]) -> dict:
    """Aggregate and per-input agreement of ``outs`` with ``refs`` (same length lists)."""
    if len(outs) != len(refs) or not outs:
        raise ValueError("need the same, non-zero number of outputs and references")
    per_snr = [snr_db(o, r) for o, r in zip(outs, refs)]
    per_cos = [cosine_similarity(o, r) for o, r in zip(outs, refs)]
    all_out = torch.cat([o.flatten() for o in outs])
    all_ref = torch.cat([r.flatten() for r in refs])
    return {
        "snr_db": snr_db(all_out, all_ref),
        "snr_db_min": min(per_snr),
        "cosine": cosine_similarity(all_out, all_ref),
        "cosine_min": min(per_cos),
        "max_abs_err": float((all_out.double() - all_ref.double()).abs().max()),
        "num_inputs": len(outs),
    }


def sensitivity_row(group: str, num_nodes: int, outs: list[torch.Tensor], refs: list[torch.Tensor]) -> dict:
    """One row of a per-group sensitivity sweep (ONNX Runtime's and OpenVINO's): the group, its number
    of layers and the agreement of ``outs`` (only that group int8) with the float ``refs``."""
    q = compare_outputs(outs, refs)
    return {"group": group, "num_nodes": num_nodes, "snr_db": q["snr_db"], "cosine": q["cosine"]}


def check_gate(quality: dict, min_snr_db: float | None, min_cosine: float | None) -> str | None:
    """Return why ``quality`` fails the thresholds, or None if it passes."""
    reasons = []
    if min_snr_db is not None and not quality["snr_db"] >= min_snr_db:
        reasons.append(f"SNR {quality['snr_db']:.2f} dB < min_snr_db={min_snr_db}")
    if min_cosine is not None and not quality["cosine"] >= min_cosine:
        reasons.append(f"cosine {quality['cosine']:.5f} < min_cosine={min_cosine}")
    return "; ".join(reasons) or None


@torch.no_grad()
def measure_quality(unet: torch.nn.Module, runner, inputs) -> dict:
    """Compare ``runner`` with the PyTorch ``unet`` (float32) on every record of ``inputs``."""
    param = next(unet.parameters())
    cast = ("sample", "encoder_hidden_states", "text_embeds")  # to the U-Net's dtype; the rest as recorded
    outs, refs = [], []
    signature = unet_signature(unet)
    for record in inputs:
        out = runner(record).float().cpu()
        flat = {k: v.to(param.device, param.dtype if k in cast else v.dtype) for k, v in record.items()}
        ref = unet(**signature.from_flat(flat), return_dict=False)[0]
        outs.append(out)
        refs.append(ref.float().cpu())
    return compare_outputs(outs, refs)
