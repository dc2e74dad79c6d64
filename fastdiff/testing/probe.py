"""Small, valid inputs for any diffusers `UNet2DConditionModel`."""

from __future__ import annotations

import torch


def unet_probe_inputs(
    unet, batch: int = 2, size: int | None = None, seq_len: int = 8, seed: int = 0, device=None, dtype=None
) -> dict:
    """Keyword arguments for ``unet(**inputs)``, derived from the UNet's config.

    The spatial size defaults to the smallest one that survives every
    downsampling twice over, so the probe is cheap but still exercises each
    block's real code path. SDXL-style ``text_time`` conditioning and LCM's
    ``time_cond_proj_dim`` get matching extra inputs.
    """
    cfg = unet.config
    device = device if device is not None else unet.device
    dtype = dtype if dtype is not None else unet.dtype
    if size is None:
        size = max(8, 2 ** len(cfg.block_out_channels))
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(device=device, dtype=dtype)

    cross = cfg.cross_attention_dim
    cross = cross[0] if isinstance(cross, (list, tuple)) else cross
    inputs = {
        "sample": randn(batch, cfg.in_channels, size, size),
        "timestep": torch.tensor(537, device=device),
        "encoder_hidden_states": randn(batch, seq_len, cross),
    }
    if cfg.addition_embed_type == "text_time":
        time_dim = cfg.addition_time_embed_dim
        pooled = cfg.projection_class_embeddings_input_dim - 6 * time_dim
        inputs["added_cond_kwargs"] = {
            "text_embeds": randn(batch, pooled),
            "time_ids": torch.tensor(
                [[size * 8, size * 8, 0, 0, size * 8, size * 8]] * batch, device=device
            ).to(dtype),
        }
    if cfg.time_cond_proj_dim is not None:
        inputs["timestep_cond"] = randn(batch, cfg.time_cond_proj_dim)
    return inputs
