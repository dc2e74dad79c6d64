"""Architectures of fastdiff-tiny: standard diffusers / transformers components, only small.

The layout mirrors Stable Diffusion 1.x one for one (KL autoencoder with 4
latent channels, here 4x instead of 8x downsampling; CLIP text encoder, U-Net with
CrossAttnDownBlock2D / DownBlock2D / UNetMidBlock2DCrossAttn / UpBlock2D /
CrossAttnUpBlock2D, scaled-linear DDPM schedule, epsilon prediction), so every
code path that handles SD handles this model too.
"""

from __future__ import annotations

import torch

from fastdiff.tiny.data import IMAGE_SIZE, VOCAB

#: prompts are at most 10 tokens long; 16 keeps the text encoder and cross-attention cheap
MAX_TOKENS = 16
LATENT_CHANNELS = 4
VAE_DOWNSAMPLE = 4
LATENT_SIZE = IMAGE_SIZE // VAE_DOWNSAMPLE
TEXT_HIDDEN = 64
#: width of the guidance-scale embedding of the LCM student (UNet `time_cond_proj_dim`)
LCM_GUIDANCE_EMBED_DIM = 64

#: SD's training noise schedule
SCHEDULE = dict(
    num_train_timesteps=1000,
    beta_start=0.00085,
    beta_end=0.012,
    beta_schedule="scaled_linear",
    prediction_type="epsilon",
    clip_sample=False,
    set_alpha_to_one=False,
    steps_offset=1,
    timestep_spacing="leading",
)

VAE_CONFIG = dict(
    in_channels=3,
    out_channels=3,
    down_block_types=("DownEncoderBlock2D",) * 3,
    up_block_types=("UpDecoderBlock2D",) * 3,
    block_out_channels=(32, 64, 64),
    layers_per_block=1,
    latent_channels=LATENT_CHANNELS,
    norm_num_groups=16,
    sample_size=IMAGE_SIZE,
)

UNET_CONFIG = dict(
    sample_size=LATENT_SIZE,
    in_channels=LATENT_CHANNELS,
    out_channels=LATENT_CHANNELS,
    down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
    up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
    # narrow at 16x16, wide at 4x4: equal cost per level, capacity where the layout is decided
    block_out_channels=(32, 64, 128),
    layers_per_block=1,
    cross_attention_dim=TEXT_HIDDEN,
    attention_head_dim=4,  # diffusers' legacy name: 4 heads per attention layer
    norm_num_groups=16,
)


def build_tokenizer(save_dir: str | None = None):
    """The local CLIP tokenizer: every data-set word is one token.

    BPE applies the lowest-ranked merge present anywhere in a word, so one word's
    merge can hijack another's chain ("p l" from "plain" splits "purple" into
    pur|pl|e). The builder's merges are therefore re-ranked (same merges, same
    vocabulary, ``whole_words=True``) in a word order where no word is split; the
    result is checked before returning.
    ``save_dir=None``: a temporary folder, removed once the tokenizer is loaded.
    """
    from fastdiff.testing.tokenizer import build_clip_tokenizer

    tok = build_clip_tokenizer(VOCAB, save_dir, model_max_length=MAX_TOKENS, whole_words=True)
    split = [w for w in VOCAB if len(tok(w, add_special_tokens=False).input_ids) != 1]
    if split:
        raise RuntimeError(f"words not single tokens: {split}")
    return tok


def build_vae():
    from diffusers import AutoencoderKL

    return AutoencoderKL(**VAE_CONFIG)


def build_text_encoder(tokenizer):
    from transformers import CLIPTextConfig, CLIPTextModel

    config = CLIPTextConfig(
        vocab_size=len(tokenizer),
        hidden_size=TEXT_HIDDEN,
        intermediate_size=4 * TEXT_HIDDEN,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=MAX_TOKENS,
        projection_dim=TEXT_HIDDEN,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return CLIPTextModel(config)


def build_unet(time_cond_proj_dim: int | None = None):
    from diffusers import UNet2DConditionModel

    return UNet2DConditionModel(**UNET_CONFIG, time_cond_proj_dim=time_cond_proj_dim)


def student_from_teacher(teacher) -> torch.nn.Module:
    """LCM student: the teacher's weights plus a guidance-scale input (`time_cond_proj_dim`).

    The new projection starts at zero, so the student begins as exactly the teacher.
    """
    student = build_unet(time_cond_proj_dim=LCM_GUIDANCE_EMBED_DIM)
    missing, unexpected = student.load_state_dict(teacher.state_dict(), strict=False)
    if unexpected or any(not k.startswith("time_embedding.cond_proj") for k in missing):
        raise RuntimeError(f"teacher/student mismatch: missing={missing} unexpected={unexpected}")
    torch.nn.init.zeros_(student.time_embedding.cond_proj.weight)
    return student
