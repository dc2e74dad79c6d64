"""Fixtures both engine test modules share: the tiny random-weight SD1.5 pipeline and its calibration records.

Imported by ``test_engines.py`` and ``test_engines_openvino.py`` (pytest registers imported fixtures).
"""

from __future__ import annotations

import pytest
import torch
from diffusers import DDIMScheduler

from fastdiff.engines import calibrate
from fastdiff.testing import tiny_pipeline

STEPS = 3
PROMPTS = ["a red cat", "a blue dog", "a green circle", "a yellow square"]


def eager(unet, inputs):
    """The PyTorch U-Net (float32) on one flat record: the reference every engine is judged against."""
    added = None
    if "text_embeds" in inputs:
        added = {"text_embeds": inputs["text_embeds"], "time_ids": inputs["time_ids"]}
    with torch.no_grad():
        return unet(
            inputs["sample"], inputs["timestep"], inputs["encoder_hidden_states"], added_cond_kwargs=added
        ).sample


@pytest.fixture(scope="module")
def pipe():
    p = tiny_pipeline("sd15", size="tiny", seed=0)
    p.scheduler = DDIMScheduler.from_config(p.scheduler.config)
    return p


@pytest.fixture(scope="module")
def calib(pipe):
    return calibrate(pipe, PROMPTS, num_inference_steps=STEPS, guidance_scale=7.5)
