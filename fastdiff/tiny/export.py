"""Write trained fastdiff-tiny checkpoints as two plain diffusers model folders.

``weights/base``: the teacher (PNDM scheduler, as Stable Diffusion 1.x ships);
``weights/lcm``: the same VAE, text encoder and tokenizer with the LCM student
U-Net and an ``LCMScheduler``. U-Net and VAE are stored in float16 (diffusers
loads them back as float32 unless asked otherwise); the text encoder, under a
megabyte, stays float32 because transformers would keep a float16 checkpoint in
float16 and hand the U-Net half-precision prompt embeddings.
"""

from __future__ import annotations

import json
import os
import shutil


def _save_pipeline(folder, vae, text_encoder, tokenizer, unet, scheduler):
    from diffusers import StableDiffusionPipeline

    pipe = StableDiffusionPipeline(
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        unet=unet,
        scheduler=scheduler,
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    if os.path.isdir(folder):
        shutil.rmtree(folder)
    pipe.save_pretrained(folder, safe_serialization=True)


def export_weights(workdir: str, out: str, lcm_kwargs: dict, schedule: dict) -> None:
    """Export `workdir`'s checkpoints (vae/, text_encoder/, tokenizer/, unet/, unet_lcm/) into `out`."""
    import torch
    from diffusers import AutoencoderKL, LCMScheduler, PNDMScheduler, UNet2DConditionModel
    from transformers import CLIPTextModel, CLIPTokenizer

    from fastdiff.tiny.load import VARIANTS, reference_stats

    vae = AutoencoderKL.from_pretrained(os.path.join(workdir, "vae")).half()
    text_encoder = CLIPTextModel.from_pretrained(os.path.join(workdir, "text_encoder"), dtype=torch.float32)
    tokenizer = CLIPTokenizer.from_pretrained(os.path.join(workdir, "tokenizer"))
    teacher = UNet2DConditionModel.from_pretrained(os.path.join(workdir, "unet")).half()
    keep = (
        "num_train_timesteps",
        "beta_start",
        "beta_end",
        "beta_schedule",
        "prediction_type",
        "steps_offset",
    )
    pndm = PNDMScheduler(
        **{k: v for k, v in schedule.items() if k in keep}, skip_prk_steps=True, set_alpha_to_one=False
    )
    _save_pipeline(os.path.join(out, "base"), vae, text_encoder, tokenizer, teacher, pndm)

    lcm_dir = os.path.join(workdir, "unet_lcm")
    if os.path.isdir(lcm_dir):
        student = UNet2DConditionModel.from_pretrained(lcm_dir).half()
        _save_pipeline(
            os.path.join(out, "lcm"), vae, text_encoder, tokenizer, student, LCMScheduler(**lcm_kwargs)
        )

    stats_file = os.path.join(workdir, "vae_stats.json")
    refs = {"training": json.load(open(stats_file)) if os.path.exists(stats_file) else {}}
    for variant in VARIANTS:
        folder = os.path.join(out, variant)
        if not os.path.isdir(folder):
            continue
        # transformers 5 writes only tokenizer.json; the slow CLIPTokenizer of transformers 4.x needs
        # vocab.json + merges.txt, so ship those too (they describe the same tokenizer)
        for name in ("vocab.json", "merges.txt"):
            if not os.path.exists(os.path.join(folder, "tokenizer", name)):
                shutil.copy(os.path.join(workdir, "tokenizer", name), os.path.join(folder, "tokenizer"))
        refs[variant] = reference_stats(variant, weights_root=out)
    with open(os.path.join(out, "reference.json"), "w") as f:
        json.dump(refs, f, indent=1)
