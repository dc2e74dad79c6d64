"""Random-weight Stable Diffusion pipelines built entirely offline.

`tiny_pipeline` gives real diffusers pipelines (UNet, VAE, text encoder(s),
a locally built tokenizer and the architecture's scheduler) whose weights are
random: enough to prove that code runs and that optimised modules match the
originals, never to judge image quality (use `fastdiff.tiny` for that).

``size="tiny"`` is small enough for unit tests; ``size="full"`` uses the
published SD1.5 / SD2.1 / SDXL UNet configurations (random weights) for speed
measurements, with a small VAE and one-layer text encoders of the right width,
because only the UNet's cost matters there.
"""

from __future__ import annotations

import torch
from diffusers import (
    AutoencoderKL,
    DDIMScheduler,
    EulerDiscreteScheduler,
    PNDMScheduler,
    StableDiffusionPipeline,
    StableDiffusionXLPipeline,
    UNet2DConditionModel,
)
from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

from fastdiff.testing.tokenizer import build_clip_tokenizer

ARCHS = ("sd15", "sd21", "sdxl")
SIZES = ("tiny", "full")

# Published UNet configurations (the `unet/config.json` of each model family).
_SD15_FULL = dict(
    sample_size=64,
    block_out_channels=(320, 640, 1280, 1280),
    down_block_types=("CrossAttnDownBlock2D",) * 3 + ("DownBlock2D",),
    up_block_types=("UpBlock2D",) + ("CrossAttnUpBlock2D",) * 3,
    layers_per_block=2,
    cross_attention_dim=768,
    attention_head_dim=8,
)
_FULL_UNETS = {
    "sd15": _SD15_FULL,
    # SD2.x: same layout, OpenCLIP-H context, per-level head counts, linear projections
    "sd21": dict(
        _SD15_FULL,
        sample_size=96,
        cross_attention_dim=1024,
        attention_head_dim=(5, 10, 20, 20),
        use_linear_projection=True,
    ),
    "sdxl": dict(
        sample_size=128,
        block_out_channels=(320, 640, 1280),
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
        layers_per_block=2,
        transformer_layers_per_block=(1, 2, 10),
        cross_attention_dim=2048,
        attention_head_dim=(5, 10, 20),
        use_linear_projection=True,
        addition_embed_type="text_time",
        addition_time_embed_dim=256,
        projection_class_embeddings_input_dim=2816,
    ),
}

# Small variants that keep every block type of their family.
_SD15_TINY = dict(
    sample_size=16,
    block_out_channels=(32, 64),
    down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
    up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
    layers_per_block=1,
    cross_attention_dim=32,
    attention_head_dim=8,
    norm_num_groups=8,
)
_TINY_UNETS = {
    "sd15": _SD15_TINY,
    "sd21": dict(_SD15_TINY, attention_head_dim=(2, 4), use_linear_projection=True),
    "sdxl": dict(
        sample_size=16,
        block_out_channels=(32, 64),
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
        up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        layers_per_block=1,
        transformer_layers_per_block=(1, 2),
        cross_attention_dim=64,
        attention_head_dim=(2, 4),
        use_linear_projection=True,
        addition_embed_type="text_time",
        addition_time_embed_dim=8,
        projection_class_embeddings_input_dim=80,
        norm_num_groups=8,
    ),
}

_VOCAB = (
    "a an the photo of cat dog red green blue yellow circle square triangle on background "
    "striped checkered noisy plain detailed simple astronaut riding horse"
).split()


def _scheduler(arch: str):
    common = dict(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", num_train_timesteps=1000)
    if arch == "sd15":
        return PNDMScheduler(skip_prk_steps=True, steps_offset=1, set_alpha_to_one=False, **common)
    if arch == "sd21":
        return DDIMScheduler(
            prediction_type="v_prediction",
            clip_sample=False,
            set_alpha_to_one=False,
            steps_offset=1,
            **common,
        )
    return EulerDiscreteScheduler(timestep_spacing="leading", steps_offset=1, **common)


def _text_config(hidden: int, layers: int, heads: int, projection_dim: int | None = None) -> CLIPTextConfig:
    return CLIPTextConfig(
        hidden_size=hidden,
        intermediate_size=hidden * 4,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        max_position_embeddings=77,
        vocab_size=1000,
        projection_dim=projection_dim or hidden,
        bos_token_id=0,
        eos_token_id=2,
        pad_token_id=1,
    )


def _vae(full: bool) -> AutoencoderKL:
    # The VAE only has to produce the right latent geometry: 4 channels and
    # the family's downscale factor (8 for full, 2 for tiny).
    blocks = 4 if full else 2
    return AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * blocks,
        up_block_types=("UpDecoderBlock2D",) * blocks,
        block_out_channels=(32, 32, 64, 64) if full else (16, 32),
        layers_per_block=1,
        latent_channels=4,
        norm_num_groups=16 if full else 8,
        sample_size=256 if full else 64,  # 32 latent pixels
    )


def tiny_pipeline(arch: str = "sd15", size: str = "tiny", seed: int = 0, dtype: torch.dtype = torch.float32):
    """Build a random-initialised, fully local diffusers pipeline.

    Args:
        arch: "sd15", "sd21" (v-prediction) or "sdxl" (two text encoders, text_time conditioning).
        size: "tiny" for tests or "full" for the published UNet configuration.
        seed: seeds every component's initialisation.
        dtype: dtype of the returned pipeline.

    Returns:
        A `StableDiffusionPipeline` (sd15, sd21) or `StableDiffusionXLPipeline` (sdxl).
        Nothing is downloaded.
    """
    if arch not in ARCHS:
        raise ValueError(f"unknown arch {arch!r}; valid: {', '.join(ARCHS)}")
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r}; valid: {', '.join(SIZES)}")

    torch.manual_seed(seed)
    full = size == "full"
    unet_cfg = (_FULL_UNETS if full else _TINY_UNETS)[arch]
    unet = UNet2DConditionModel(in_channels=4, out_channels=4, **unet_cfg)
    components = dict(
        unet=unet, vae=_vae(full), tokenizer=build_clip_tokenizer(_VOCAB), scheduler=_scheduler(arch)
    )
    cross = unet_cfg["cross_attention_dim"]
    n_layers = 1 if full else 2

    if arch != "sdxl":
        heads = 12 if cross == 768 else (16 if cross == 1024 else 4)
        pipe = StableDiffusionPipeline(
            **components,
            text_encoder=CLIPTextModel(_text_config(cross, n_layers, heads)),
            safety_checker=None,
            feature_extractor=None,
            requires_safety_checker=False,
        )
    else:
        # SDXL concatenates the penultimate states of two encoders (768 + 1280
        # in the full model) and feeds the second one's pooled projection,
        # with six size/crop ids, to the text_time embedding.
        width_1 = 768 if full else 32
        width_2 = cross - width_1
        time_dim = unet_cfg["addition_time_embed_dim"]
        pooled_dim = unet_cfg["projection_class_embeddings_input_dim"] - 6 * time_dim
        text_encoder = CLIPTextModel(_text_config(width_1, n_layers, 4))
        text_encoder_2 = CLIPTextModelWithProjection(
            _text_config(width_2, n_layers, 4, projection_dim=pooled_dim)
        )
        pipe = StableDiffusionXLPipeline(
            **components,
            text_encoder=text_encoder,
            text_encoder_2=text_encoder_2,
            tokenizer_2=build_clip_tokenizer(_VOCAB),
        )
    pipe.set_progress_bar_config(disable=True)
    return pipe if dtype == torch.float32 else pipe.to(dtype=dtype)
