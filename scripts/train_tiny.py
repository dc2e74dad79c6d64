#!/usr/bin/env python
"""Train fastdiff-tiny from scratch on the procedural shapes data set (CPU, fixed step counts).

Stages, each reading the previous stage's output from ``--workdir``:

    vae      KL autoencoder 64x64x3 -> 16x16x4 (L1 + small KL), trained on 32x32 crops
             then briefly on full images.
    latents  encode the training set once (posterior mean and std cached), measure the
             scaling factor 1/std(latents).
    unet     CLIP text encoder + U-Net jointly, epsilon prediction on SD's scaled-linear
             schedule, 10% empty-prompt dropout for classifier-free guidance, EMA weights.
    lcm      latent consistency distillation of the EMA teacher into a student U-Net that
             takes the guidance scale as input (`time_cond_proj_dim`), DDIM skipping-step
             solver over a 50-step grid, CFG in the teacher step, EMA target network.
    export   fp16 safetensors into fastdiff/tiny/weights/{base,lcm} + a reference checksum.

Not part of ``all``: ``shipped`` fills the workdir from the shipped weights, so that one stage can be rerun
on top of them (``--stage shipped,lcm,export --lcm-init workdir`` distils the shipped student further).

Usage::

    python scripts/train_tiny.py --stage all --workdir /tmp/fastdiff_tiny_run
    python scripts/train_tiny.py --stage vae --smoke      # seconds-long check of a stage
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from fastdiff.tiny import data as D  # noqa: E402
from fastdiff.tiny import models as M  # noqa: E402

# full-run sizes; --smoke divides them down to a seconds-long run
FULL = dict(
    n_images=30000,
    vae_crop_steps=600,
    vae_full_steps=20,
    vae_batch=32,
    unet_steps=1600,
    unet_batch=32,
    unet_more_steps=1200,
    offset_noise_milli=150,  # offset-noise std x 1000 for the second U-Net phase and LCM
    lcm_steps=800,
    lcm_batch=16,
    decoder_steps=300,
    decoder_batch=16,
)
SMOKE = dict(
    n_images=256,
    vae_crop_steps=3,
    vae_full_steps=2,
    vae_batch=8,
    unet_steps=3,
    unet_batch=8,
    unet_more_steps=2,
    offset_noise_milli=150,
    lcm_steps=3,
    lcm_batch=4,
    decoder_steps=2,
    decoder_batch=4,
)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    """Linear warm-up then cosine decay to 10% of the peak."""
    if step < warmup:
        return peak * (step + 1) / warmup
    p = (step - warmup) / max(1, total - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))


def set_lr(opt, lr):
    for g in opt.param_groups:
        g["lr"] = lr


@torch.no_grad()
def ema_update(ema: torch.nn.Module, model: torch.nn.Module, decay: float) -> None:
    for pe, pm in zip(ema.parameters(), model.parameters()):
        pe.lerp_(pm, 1 - decay)


def dataset(cfg, seed):
    log(f"rendering {cfg['n_images']} training images (seed {seed})")
    images, attrs = D.make_dataset(cfg["n_images"], seed=seed, split="train")
    log("rendered")
    return images, attrs


# ----------------------------------------------------------------------------- vae


def stage_vae(args, cfg):
    torch.manual_seed(args.seed)
    images, _ = dataset(cfg, args.seed)
    x_all = D.to_tensor(images)
    vae = M.build_vae()
    opt = torch.optim.AdamW(vae.parameters(), lr=1e-3, weight_decay=0.0)
    gen = torch.Generator().manual_seed(args.seed + 1)
    total = cfg["vae_crop_steps"] + cfg["vae_full_steps"]
    kl_weight = 1e-5
    t0 = time.time()
    for step in range(total):
        full = step >= cfg["vae_crop_steps"]
        bs = cfg["vae_batch"] // 2 if full else cfg["vae_batch"]
        idx = torch.randint(0, len(x_all), (bs,), generator=gen)
        x = x_all[idx]
        if not full:
            # 32x32 crops on the 4-px latent grid: ~7x cheaper than full images, the
            # autoencoder is convolutional so what it learns carries over
            oy, ox = (torch.randint(0, 9, (2,), generator=gen) * 4).tolist()
            x = x[:, :, oy : oy + 32, ox : ox + 32]
        set_lr(opt, lr_at(step, total, 1e-3, 50))
        post = vae.encode(x).latent_dist
        z = post.mean + post.std * torch.randn(post.mean.shape, generator=gen)
        rec = vae.decode(z).sample
        l1 = (rec - x).abs().mean()
        kl = 0.5 * (post.mean.pow(2) + post.var - 1 - post.logvar).mean()
        loss = l1 + kl_weight * kl
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(vae.parameters(), 1.0)
        opt.step()
        if step % 50 == 0 or step == total - 1:
            log(f"vae step {step}/{total} l1 {l1.item():.4f} kl {kl.item():.3f} ({time.time() - t0:.0f}s)")
    vae.save_pretrained(os.path.join(args.workdir, "vae"))
    log("vae saved")


def stage_decoder(args, cfg):
    """Fine-tune only the VAE decoder on full 64x64 images, the encoder frozen.

    The latents (and so the U-Nets trained on them) do not change; the decoder gets
    more steps at full resolution to render the fine textures from them.
    """
    from diffusers import AutoencoderKL

    torch.manual_seed(args.seed)
    vae = AutoencoderKL.from_pretrained(os.path.join(args.workdir, "vae"))
    for p in [*vae.encoder.parameters(), *vae.quant_conv.parameters()]:
        p.requires_grad_(False)
    params = [*vae.decoder.parameters(), *vae.post_quant_conv.parameters()]
    opt = torch.optim.AdamW(params, lr=3e-4, weight_decay=0.0)
    gen = torch.Generator().manual_seed(args.seed + 5)
    rng = np.random.default_rng([args.seed, 5])
    total, bs = cfg["decoder_steps"], cfg["decoder_batch"]
    t0 = time.time()
    for step in range(total):
        attrs = D.sample_attributes(bs, seed=int(rng.integers(1 << 31)), split="all")
        x = D.to_tensor(np.stack([D.render(a, rng) for a in attrs]))
        with torch.no_grad():
            post = vae.encode(x).latent_dist
            z = post.mean + post.std * torch.randn(post.mean.shape, generator=gen)
        set_lr(opt, lr_at(step, total, 3e-4, 20))
        rec = vae.decode(z).sample
        loss = (rec - x).abs().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if step % 25 == 0 or step == total - 1:
            log(f"decoder step {step}/{total} l1 {loss.item():.4f} ({time.time() - t0:.0f}s)")
    vae.save_pretrained(os.path.join(args.workdir, "vae"))
    log("vae with fine-tuned decoder saved")


# ----------------------------------------------------------------------------- latents


@torch.no_grad()
def stage_latents(args, cfg):
    from diffusers import AutoencoderKL

    images, attrs = dataset(cfg, args.seed)
    vae = AutoencoderKL.from_pretrained(os.path.join(args.workdir, "vae")).eval()
    mean, std = _encode(vae, images)
    gen = torch.Generator().manual_seed(args.seed + 2)
    sample = mean + std * torch.randn(mean.shape, generator=gen)
    scaling = float(1.0 / sample.std())
    # reconstruction quality of the final autoencoder on 256 images (PSNR in dB)
    x = D.to_tensor(images[:256])
    rec = vae.decode(mean[:256]).sample.clamp(-1, 1)
    mse = ((rec - x) / 2).pow(2).mean().item()
    psnr = 10 * math.log10(1 / mse)
    log(
        f"latents {tuple(mean.shape)} std {sample.std():.4f} -> scaling_factor {scaling:.5f}; vae PSNR {psnr:.2f} dB"
    )
    vae.register_to_config(scaling_factor=scaling)
    vae.save_pretrained(os.path.join(args.workdir, "vae"))
    _save_latents(args, mean, std, attrs, scaling)
    with open(os.path.join(args.workdir, "vae_stats.json"), "w") as f:
        json.dump({"scaling_factor": scaling, "recon_psnr_db": psnr, "n": len(images)}, f)


@torch.no_grad()
def _encode(vae, images):
    means, stds = [], []
    for i in range(0, len(images), 256):
        post = vae.encode(D.to_tensor(images[i : i + 256])).latent_dist
        means.append(post.mean)
        stds.append(post.std)
    return torch.cat(means), torch.cat(stds)


def _save_latents(args, mean, std, attrs, scaling):
    torch.save(
        {"mean": mean.half(), "std": std.half(), "prompts": [a.prompt for a in attrs], "scaling": scaling},
        os.path.join(args.workdir, "latents.pt"),
    )


def stage_shipped(args, cfg):
    """Fill the workdir from the shipped weights (``--out``) so a later stage continues from them.

    Copies the teacher's tokenizer, text encoder, U-Net and VAE and the LCM student (as ``unet_lcm``), and
    encodes the training set with the shipped VAE at its shipped scaling factor, so that e.g.
    ``--stage shipped,lcm --lcm-init workdir`` distils the student further without touching the teacher.
    """
    import shutil

    from diffusers import AutoencoderKL

    base, lcm = os.path.join(args.out, "base"), os.path.join(args.out, "lcm")
    for src, name in [(base, "tokenizer"), (base, "text_encoder"), (base, "unet"), (base, "vae")]:
        shutil.copytree(os.path.join(src, name), os.path.join(args.workdir, name), dirs_exist_ok=True)
    shutil.copytree(os.path.join(lcm, "unet"), os.path.join(args.workdir, "unet_lcm"), dirs_exist_ok=True)
    with open(os.path.join(args.out, "reference.json")) as f:
        training = json.load(f)["training"]
    with open(os.path.join(args.workdir, "vae_stats.json"), "w") as f:
        json.dump(training, f)
    images, attrs = dataset(cfg, args.seed)
    vae = AutoencoderKL.from_pretrained(os.path.join(args.workdir, "vae")).eval()
    mean, std = _encode(vae, images)
    _save_latents(args, mean, std, attrs, float(vae.config.scaling_factor))
    log(f"workdir filled from {args.out}; latents {tuple(mean.shape)} at the shipped scaling factor")


# ----------------------------------------------------------------------------- unet


def load_latents(args):
    blob = torch.load(os.path.join(args.workdir, "latents.pt"))
    return blob["mean"].float(), blob["std"].float(), blob["prompts"], blob["scaling"]


def tokenize(tokenizer, prompts):
    return tokenizer(
        prompts, padding="max_length", max_length=M.MAX_TOKENS, truncation=True, return_tensors="pt"
    ).input_ids


def alphas_cumprod():
    from diffusers import DDPMScheduler

    return DDPMScheduler(
        **{
            k: v
            for k, v in M.SCHEDULE.items()
            if k
            in (
                "num_train_timesteps",
                "beta_start",
                "beta_end",
                "beta_schedule",
                "prediction_type",
                "clip_sample",
            )
        }
    ).alphas_cumprod.float()


def offset_noise(shape, gen, offset: float) -> torch.Tensor:
    """Gaussian noise plus a per-image, per-channel constant of std `offset` ("offset noise").

    SD's schedule ends at alpha_bar ~ 0.005, so x_T still carries 7% of the latent; on a
    16x16 latent the mean of pure noise has std only 1/16, so the background colour leaks
    through x_T and a model learns to read it there instead of from the prompt (at
    sampling time it then follows the random mean of the initial noise). Extra
    low-frequency noise hides that leak, so the colour has to come from the text.
    """
    noise = torch.randn(shape, generator=gen)
    if offset:
        noise = noise + offset * torch.randn(shape[0], shape[1], 1, 1, generator=gen)
    return noise


def _train_unet(
    args, cfg, tokenizer, text_encoder, unet, total, peak_lr, warmup, seed_offset, tag, offset=0.0
):
    """Joint text-encoder + U-Net epsilon-prediction training; saves the EMA weights."""
    mean, std, prompts, scaling = load_latents(args)
    ids_all = tokenize(tokenizer, prompts)
    ids_empty = tokenize(tokenizer, [""])[0]
    ema_te, ema_unet = copy.deepcopy(text_encoder).eval(), copy.deepcopy(unet).eval()
    params = list(unet.parameters()) + list(text_encoder.parameters())
    opt = torch.optim.AdamW(params, lr=peak_lr, weight_decay=0.01)
    ac = alphas_cumprod()
    gen = torch.Generator().manual_seed(args.seed + seed_offset)
    bs = cfg["unet_batch"]
    t0 = time.time()
    run = 0.0
    for step in range(total):
        idx = torch.randint(0, len(mean), (bs,), generator=gen)
        z0 = (mean[idx] + std[idx] * torch.randn(mean[idx].shape, generator=gen)) * scaling
        ids = ids_all[idx].clone()
        drop = torch.rand(bs, generator=gen) < 0.1  # classifier-free guidance dropout
        ids[drop] = ids_empty
        t = torch.randint(0, 1000, (bs,), generator=gen)
        noise = offset_noise(z0.shape, gen, offset)
        a = ac[t].view(-1, 1, 1, 1)
        xt = a.sqrt() * z0 + (1 - a).sqrt() * noise
        set_lr(opt, lr_at(step, total, peak_lr, warmup))
        ctx = text_encoder(ids).last_hidden_state
        pred = unet(xt, t, ctx).sample
        loss = F.mse_loss(pred, noise)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        decay = min(0.995, (1 + step) / (10 + step))  # short run: ~200-step EMA window
        ema_update(ema_unet, unet, decay)
        ema_update(ema_te, text_encoder, decay)
        run = loss.item() if step == 0 else 0.98 * run + 0.02 * loss.item()
        if step % 50 == 0 or step == total - 1:
            log(f"{tag} step {step}/{total} loss {loss.item():.4f} avg {run:.4f} ({time.time() - t0:.0f}s)")
        if args.checkpoint_every and step and step % args.checkpoint_every == 0:
            ema_unet.save_pretrained(os.path.join(args.workdir, "unet"))
            ema_te.save_pretrained(os.path.join(args.workdir, "text_encoder"))
    ema_unet.save_pretrained(os.path.join(args.workdir, "unet"))
    ema_te.save_pretrained(os.path.join(args.workdir, "text_encoder"))
    log(f"{tag}: unet + text encoder (EMA) saved")


def stage_unet(args, cfg):
    torch.manual_seed(args.seed)
    tokenizer = M.build_tokenizer(os.path.join(args.workdir, "tokenizer"))
    text_encoder = M.build_text_encoder(tokenizer)
    unet = M.build_unet()
    _train_unet(args, cfg, tokenizer, text_encoder, unet, cfg["unet_steps"], 8e-4, 100, 3, "unet")


def stage_unet_more(args, cfg):
    """Second U-Net phase: continue from the first phase's EMA weights with a fresh, lower schedule."""
    from diffusers import UNet2DConditionModel
    from transformers import CLIPTextModel, CLIPTokenizer

    torch.manual_seed(args.seed + 10)
    tokenizer = CLIPTokenizer.from_pretrained(os.path.join(args.workdir, "tokenizer"))
    text_encoder = CLIPTextModel.from_pretrained(
        os.path.join(args.workdir, "text_encoder"), dtype=torch.float32
    )
    unet = UNet2DConditionModel.from_pretrained(os.path.join(args.workdir, "unet"))
    text_encoder.train()
    unet.train()
    offset = cfg["offset_noise_milli"] / 1000
    _train_unet(
        args,
        cfg,
        tokenizer,
        text_encoder,
        unet,
        cfg["unet_more_steps"],
        4e-4,
        50,
        13,
        "unet_more",
        offset=offset,
    )


# ----------------------------------------------------------------------------- lcm

LCM_GRID = 50  # DDIM solver grid of the distillation (LCMScheduler's original_inference_steps)
LCM_GUIDANCE = (2.0, 8.0)  # classifier-free guidance scales the student learns to imitate


def boundary_scalings(t: torch.Tensor):
    """c_skip, c_out of the consistency parametrisation, taken from diffusers' LCMScheduler itself."""
    from diffusers import LCMScheduler

    sched = LCMScheduler(**_lcm_scheduler_kwargs())
    c_skip, c_out = sched.get_scalings_for_boundary_condition_discrete(t)
    return c_skip.float().view(-1, 1, 1, 1), c_out.float().view(-1, 1, 1, 1)


def _lcm_scheduler_kwargs():
    keep = (
        "num_train_timesteps",
        "beta_start",
        "beta_end",
        "beta_schedule",
        "prediction_type",
        "clip_sample",
    )
    return dict(
        **{k: v for k, v in M.SCHEDULE.items() if k in keep},
        original_inference_steps=LCM_GRID,
        timestep_scaling=10.0,
        set_alpha_to_one=True,
        steps_offset=1,
        timestep_spacing="leading",
    )


def guidance_embedding(g: torch.Tensor) -> torch.Tensor:
    """Embedding of the guidance scale exactly as StableDiffusionPipeline feeds it to the UNet (of g - 1)."""
    from diffusers import StableDiffusionPipeline

    return StableDiffusionPipeline.get_guidance_scale_embedding(
        None, g - 1, embedding_dim=M.LCM_GUIDANCE_EMBED_DIM, dtype=torch.float32
    )


def stage_lcm(args, cfg):
    from diffusers import UNet2DConditionModel
    from transformers import CLIPTextModel, CLIPTokenizer

    torch.manual_seed(args.seed)
    mean, std, prompts, scaling = load_latents(args)
    tokenizer = CLIPTokenizer.from_pretrained(os.path.join(args.workdir, "tokenizer"))
    text_encoder = CLIPTextModel.from_pretrained(os.path.join(args.workdir, "text_encoder")).eval()
    teacher = UNet2DConditionModel.from_pretrained(os.path.join(args.workdir, "unet")).eval()
    for p in [*teacher.parameters(), *text_encoder.parameters()]:
        p.requires_grad_(False)
    if args.lcm_init == "workdir":  # continue distilling the student saved in the workdir (its EMA target)
        student = UNet2DConditionModel.from_pretrained(os.path.join(args.workdir, "unet_lcm")).float().train()
    else:
        student = M.student_from_teacher(teacher)
    target = copy.deepcopy(student).eval()
    for p in target.parameters():
        p.requires_grad_(False)
    ids_all = tokenize(tokenizer, prompts)
    with torch.no_grad():
        ctx_empty = text_encoder(tokenize(tokenizer, [""])).last_hidden_state
    opt = torch.optim.AdamW(student.parameters(), lr=2e-4, weight_decay=0.0)
    ac = alphas_cumprod()
    k = 1000 // LCM_GRID
    grid = torch.arange(1, LCM_GRID + 1) * k - 1  # 19, 39, ..., 999: the DDIM timesteps
    gen = torch.Generator().manual_seed(args.seed + 4)
    total, bs = cfg["lcm_steps"], cfg["lcm_batch"]
    huber_c = 0.001
    t0 = time.time()
    run = 0.0

    def x0_from_eps(x, eps, a):
        return (x - (1 - a).sqrt() * eps) / a.sqrt()

    for step in range(total):
        idx = torch.randint(0, len(mean), (bs,), generator=gen)
        z0 = (mean[idx] + std[idx] * torch.randn(mean[idx].shape, generator=gen)) * scaling
        with torch.no_grad():
            ctx = text_encoder(ids_all[idx]).last_hidden_state
        n = torch.randint(0, LCM_GRID, (bs,), generator=gen)
        t = grid[n]
        s = (t - k).clamp(min=0)
        g = LCM_GUIDANCE[0] + (LCM_GUIDANCE[1] - LCM_GUIDANCE[0]) * torch.rand(bs, generator=gen)
        w_emb = guidance_embedding(g)
        noise = offset_noise(z0.shape, gen, cfg["offset_noise_milli"] / 1000)
        a_t, a_s = ac[t].view(-1, 1, 1, 1), ac[s].view(-1, 1, 1, 1)
        xt = a_t.sqrt() * z0 + (1 - a_t).sqrt() * noise
        cs_t, co_t = boundary_scalings(t)
        cs_s, co_s = boundary_scalings(s)

        set_lr(opt, lr_at(step, total, 2e-4, 30))
        eps_student = student(xt, t, ctx, timestep_cond=w_emb).sample
        f_student = cs_t * xt + co_t * x0_from_eps(xt, eps_student, a_t)

        with torch.no_grad():
            # one DDIM step of the guided teacher from t to s = t - k
            eps_both = teacher(
                torch.cat([xt, xt]), torch.cat([t, t]), torch.cat([ctx, ctx_empty.expand(bs, -1, -1)])
            ).sample
            eps_c, eps_u = eps_both.chunk(2)
            eps_g = eps_u + g.view(-1, 1, 1, 1) * (eps_c - eps_u)
            x0_g = x0_from_eps(xt, eps_g, a_t)
            xs = a_s.sqrt() * x0_g + (1 - a_s).sqrt() * eps_g
            eps_target = target(xs, s, ctx, timestep_cond=w_emb).sample
            f_target = cs_s * xs + co_s * x0_from_eps(xs, eps_target, a_s)

        loss = (torch.sqrt((f_student - f_target).pow(2) + huber_c**2) - huber_c).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(student.parameters(), 1.0)
        opt.step()
        ema_update(target, student, 0.95)
        run = loss.item() if step == 0 else 0.98 * run + 0.02 * loss.item()
        if step % 50 == 0 or step == total - 1:
            log(f"lcm step {step}/{total} loss {loss.item():.5f} avg {run:.5f} ({time.time() - t0:.0f}s)")
        if args.checkpoint_every and step and step % args.checkpoint_every == 0:
            target.save_pretrained(os.path.join(args.workdir, "unet_lcm"))
    # the EMA target is the smoother network and the one LCM ships
    target.save_pretrained(os.path.join(args.workdir, "unet_lcm"))
    log("lcm student (EMA target) saved")


# ----------------------------------------------------------------------------- export


def stage_export(args, cfg):
    from fastdiff.tiny.export import export_weights

    export_weights(args.workdir, args.out, lcm_kwargs=_lcm_scheduler_kwargs(), schedule=M.SCHEDULE)
    log(f"exported to {args.out}")


STAGES = {
    "shipped": stage_shipped,
    "vae": stage_vae,
    "latents": stage_latents,
    "unet": stage_unet,
    "unet_more": stage_unet_more,
    "decoder": stage_decoder,
    "lcm": stage_lcm,
    "export": stage_export,
}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stage", default="all", help=f"one of {list(STAGES)}, a comma list, or 'all'")
    p.add_argument("--workdir", default="/tmp/fastdiff_tiny_run")
    p.add_argument(
        "--out", default=os.path.join(os.path.dirname(__file__), "..", "fastdiff", "tiny", "weights")
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--smoke", action="store_true", help="tiny sizes, to check a stage runs")
    p.add_argument("--checkpoint-every", type=int, default=500)
    p.add_argument(
        "--lcm-init",
        choices=("teacher", "workdir"),
        default="teacher",
        help="start the lcm stage from the teacher (a fresh distillation) or from the workdir's unet_lcm",
    )
    p.add_argument("--set", nargs="*", default=[], help="override sizes, e.g. unet_steps=2000")
    args = p.parse_args(argv)
    cfg = dict(SMOKE if args.smoke else FULL)
    for kv in args.set:
        key, value = kv.split("=")
        if key not in cfg:
            raise SystemExit(f"unknown size {key!r}; known: {sorted(cfg)}")
        cfg[key] = int(value)
    os.makedirs(args.workdir, exist_ok=True)
    stages = [n for n in STAGES if n != "shipped"] if args.stage == "all" else args.stage.split(",")
    for name in stages:
        if name not in STAGES:
            raise SystemExit(f"unknown stage {name!r}; choose from {list(STAGES)}")
        log(f"=== stage {name} {cfg}")
        t0 = time.time()
        STAGES[name](args, cfg)
        log(f"=== stage {name} done in {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
