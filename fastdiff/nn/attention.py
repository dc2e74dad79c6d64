"""fastdiff's attention processor for diffusers ``Attention`` modules.

diffusers' SD and SDXL UNets run ``AttnProcessor2_0``, which its newer
attention dispatcher does not reach, so backend choice is ours to own. This
processor subclasses ``AttnProcessor2_0`` (code that checks ``isinstance``
keeps working) and routes the core product through
:func:`fastdiff.ops.attention` with a fixed backend. Unlike
``AttnProcessor2_0`` it honours ``attn.scale``.
"""

from __future__ import annotations

import torch
from diffusers.models.attention_processor import Attention, AttnProcessor2_0

from fastdiff.ops.attention import attention, check_backend_name


class FastdiffAttnProcessor(AttnProcessor2_0):
    """Attention processor computing softmax(QKᵀ·scale)V with a chosen backend."""

    def __init__(self, backend: str = "auto"):
        check_backend_name(backend)
        super().__init__()
        self.backend = backend

    def __repr__(self) -> str:
        return f"FastdiffAttnProcessor(backend={self.backend!r})"

    def __call__(
        self,
        attn: Attention,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        temb: torch.Tensor | None = None,
        *args,
        **kwargs,
    ) -> torch.Tensor:
        residual = hidden_states
        if attn.spatial_norm is not None:
            hidden_states = attn.spatial_norm(hidden_states, temb)

        image_shape = None
        if hidden_states.ndim == 4:  # (B, C, H, W) feature map -> (B, HW, C) tokens
            image_shape = hidden_states.shape
            b, c, h, w = image_shape
            hidden_states = hidden_states.view(b, c, h * w).transpose(1, 2)

        context = hidden_states if encoder_hidden_states is None else encoder_hidden_states
        batch, kv_len = context.shape[0], context.shape[1]

        if attention_mask is not None:
            attention_mask = attn.prepare_attention_mask(attention_mask, kv_len, batch)
            attention_mask = attention_mask.view(batch, attn.heads, -1, attention_mask.shape[-1])

        if attn.group_norm is not None:
            hidden_states = attn.group_norm(hidden_states.transpose(1, 2)).transpose(1, 2)
        if encoder_hidden_states is None:
            context = hidden_states
        elif attn.norm_cross:
            context = attn.norm_encoder_hidden_states(context)

        query = attn.to_q(hidden_states)
        key = attn.to_k(context)
        value = attn.to_v(context)
        head_dim = key.shape[-1] // attn.heads

        def split_heads(x):  # (B, S, H*D) -> (B, H, S, D)
            return x.view(batch, -1, attn.heads, head_dim).transpose(1, 2)

        query, key, value = split_heads(query), split_heads(key), split_heads(value)
        if attn.norm_q is not None:
            query = attn.norm_q(query)
        if attn.norm_k is not None:
            key = attn.norm_k(key)

        out = attention(query, key, value, attn_mask=attention_mask, scale=attn.scale, backend=self.backend)
        out = out.transpose(1, 2).reshape(batch, -1, attn.heads * head_dim).to(query.dtype)
        out = attn.to_out[1](attn.to_out[0](out))  # projection, dropout

        if image_shape is not None:
            out = out.transpose(-1, -2).reshape(image_shape)
        if attn.residual_connection:
            out = out + residual
        return out / attn.rescale_output_factor
