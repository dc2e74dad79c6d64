"""Model functions for :func:`fastdiff.dynamic.sample` built from a diffusers U-Net, with classifier-free guidance.

Conditioning tensors follow the diffusers layout: with guidance, the batch is ``[uncond rows; cond rows]``.
When :func:`~fastdiff.dynamic.sample` calls the model on a subset of rows (``rows=``), every tensor whose
leading dimension is the batch (or twice the batch, with guidance) is sliced to match.
"""

from __future__ import annotations

import torch

__all__ = ["GuidedUNet", "cfg_model_fn", "slice_rows", "rescale_guidance"]


def slice_rows(value, rows: torch.Tensor, batch: int, doubled: bool):
    """Select `rows` of a conditioning value (tensor, list/tuple/dict of them). Others pass unchanged."""
    if isinstance(value, torch.Tensor):
        if value.ndim == 0:
            return value
        if doubled and value.shape[0] == 2 * batch:
            idx = torch.cat([rows, rows + batch]).to(value.device)
            return value.index_select(0, idx)
        if value.shape[0] == batch:
            return value.index_select(0, rows.to(value.device))
        return value
    if isinstance(value, dict):
        return {k: slice_rows(v, rows, batch, doubled) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(slice_rows(v, rows, batch, doubled) for v in value)
    return value


def rescale_guidance(guided: torch.Tensor, cond: torch.Tensor, phi: float) -> torch.Tensor:
    """Guidance rescale (Lin et al. 2024, "Common Diffusion Noise Schedules...", eq. 15-16).

    Scales the guided prediction to the per-sample standard deviation of the conditional one, then blends
    with weight ``phi`` to avoid over-exposure at high guidance.
    """
    dims = list(range(1, guided.ndim))
    ratio = cond.std(dim=dims, keepdim=True) / guided.std(dim=dims, keepdim=True)
    return phi * (guided * ratio) + (1.0 - phi) * guided


class GuidedUNet:
    """``model_fn(x, t, rows=None)`` for a diffusers ``UNet2DConditionModel`` with optional CFG.

    Args:
        unet: the denoiser.
        batch_size: number of samples B (rows of x).
        encoder_hidden_states: (B, L, D), or (2B, L, D) = [uncond; cond] when ``guidance_scale > 1``.
        guidance_scale: w in eps_uncond + w (eps_cond - eps_uncond) (Ho & Salimans 2022); 1 disables CFG.
        guidance_rescale: phi of :func:`rescale_guidance`; 0 disables it.
        unet_kwargs: other ``unet(...)`` keywords (``added_cond_kwargs``, ``timestep_cond``,
            ``cross_attention_kwargs``); batched tensors inside are sliced like the embeddings.
    """

    def __init__(
        self,
        unet,
        batch_size: int,
        encoder_hidden_states: torch.Tensor,
        *,
        guidance_scale: float = 1.0,
        do_cfg: bool | None = None,
        guidance_rescale: float = 0.0,
        unet_kwargs: dict | None = None,
    ):
        self.unet = unet
        self.batch_size = batch_size
        self.do_cfg = guidance_scale > 1.0 if do_cfg is None else do_cfg
        expected = 2 * batch_size if self.do_cfg else batch_size
        if encoder_hidden_states.shape[0] != expected:
            raise ValueError(
                f"encoder_hidden_states has {encoder_hidden_states.shape[0]} rows; expected {expected} "
                f"for a batch of {batch_size} {'with' if self.do_cfg else 'without'} guidance"
            )
        self.encoder_hidden_states = encoder_hidden_states
        self.guidance_scale = float(guidance_scale)
        self.guidance_rescale = float(guidance_rescale)
        self.unet_kwargs = dict(unet_kwargs or {})

    def __call__(self, x: torch.Tensor, t, rows: torch.Tensor | None = None) -> torch.Tensor:
        if rows is None:
            rows = torch.arange(x.shape[0])
        ehs, kwargs = self.encoder_hidden_states, self.unet_kwargs
        if len(rows) != self.batch_size or not bool((rows == torch.arange(self.batch_size)).all()):
            ehs, kwargs = slice_rows((ehs, kwargs), rows, self.batch_size, self.do_cfg)  # rows still running
        t = torch.as_tensor(t, device=x.device)
        if self.do_cfg:
            x = torch.cat([x, x])
            if t.ndim == 1:
                t = torch.cat([t, t])
        out = self.unet(x, t, encoder_hidden_states=ehs, return_dict=False, **kwargs)[0]
        if not self.do_cfg:
            return out
        uncond, cond = out.chunk(2)
        guided = uncond + self.guidance_scale * (cond - uncond)
        if self.guidance_rescale > 0:
            guided = rescale_guidance(guided, cond, self.guidance_rescale)
        return guided


def cfg_model_fn(
    unet, cond: torch.Tensor, uncond: torch.Tensor | None = None, guidance_scale: float = 7.5, **unet_kwargs
):
    """Model function with classifier-free guidance from conditional/unconditional text embeddings.

    ``cond`` and ``uncond`` are (B, L, D). Without ``uncond`` (or with ``guidance_scale <= 1``) no
    guidance is applied. Extra keywords go to the U-Net (see :class:`GuidedUNet`).
    """
    do_cfg = uncond is not None and guidance_scale > 1.0
    if do_cfg and uncond.shape != cond.shape:
        raise ValueError(f"uncond shape {tuple(uncond.shape)} differs from cond shape {tuple(cond.shape)}")
    ehs = torch.cat([uncond, cond]) if do_cfg else cond
    return GuidedUNet(
        unet,
        cond.shape[0],
        ehs,
        guidance_scale=guidance_scale if do_cfg else 1.0,
        do_cfg=do_cfg,
        unet_kwargs=unet_kwargs,
    )
