"""A cheap stand-in pipeline for sweep tests (imported by subprocesses via ``sweep_helpers:fake_pipeline``).

Its image is a deterministic function of the prompt embedding, the seed's noise and the step count, so a
wrong embedding, seed or configuration shows in the pixels; it sleeps a little per image so a test can
kill a sweep between items.
"""

from __future__ import annotations

import hashlib
import time
from types import SimpleNamespace

import numpy as np
import torch

from fastdiff.sweep import PromptEncoder, SweepPipeline

SIZE = 16


class _TextEncoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(4))

    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        return codes[:, None] * self.weight[None]


class _Encoder(PromptEncoder):
    def __init__(self, te: _TextEncoder):
        self.te = te

    def modules(self):
        return [self.te]

    def fingerprint(self) -> str:
        return hashlib.sha256(self.te.weight.detach().numpy().tobytes()).hexdigest()

    def encode(self, text):
        code = int(hashlib.sha256(text.encode()).hexdigest()[:6], 16) / 2**24
        return {"prompt_embeds": self.te(torch.tensor([code], dtype=torch.float64))}

    def encode_negative(self, text):
        return {"negative_prompt_embeds": self.encode(text or "")["prompt_embeds"]}


class FakePipeline(SweepPipeline):
    delay = 0.02

    def __init__(self):
        self.text_encoder = _TextEncoder()
        self.calls = 0

    def prompt_encoder(self):
        return _Encoder(self.text_encoder)

    def __call__(
        self,
        prompt=None,
        *,
        prompt_embeds=None,
        negative_prompt_embeds=None,
        generator=None,
        num_inference_steps=10,
        guidance_scale=1.0,
        output_type="np",
        **kwargs,
    ):
        if prompt_embeds is None:
            raise ValueError("FakePipeline needs prompt_embeds")
        self.calls += 1
        n = prompt_embeds.shape[0]
        images = []
        for j in range(n):
            noise = torch.rand(SIZE, SIZE, 3, generator=generator[j], dtype=torch.float64).numpy()
            level = float(prompt_embeds[j].detach().sum()) / 4
            img = 0.5 * level + 0.5 * noise / (1 + num_inference_steps / 10)
            images.append(np.clip(img, 0, 1))
            time.sleep(self.delay)
        nfe = num_inference_steps * (2 if guidance_scale > 1 else 1)
        return SimpleNamespace(
            images=np.stack(images).astype(np.float32),
            fastdiff=SimpleNamespace(nfe_per_sample=[nfe] * n, num_steps=[num_inference_steps] * n),
        )


def fake_pipeline():
    return FakePipeline()


def fake_spec(**over) -> dict:
    spec = {
        "pipeline": "sweep_helpers:fake_pipeline",
        "reference": "ref",
        "prompts": [f"prompt number {i}" for i in range(5)],
        "seeds": [0, 1],
        "guidance": 2.0,
        "metrics": ["psnr", "ssim", "nfe", "wall_s"],
        "batch_size": 3,
        "configs": [{"name": "ref", "steps": 20}, {"name": "fast", "steps": 4}, {"name": "mid", "steps": 8}],
    }
    spec.update(over)
    return spec
