"""Offline building blocks for tests, notebooks and benchmarks.

Nothing here downloads anything: pipelines are random-weight and tokenizers
are built from a word list.
"""

from fastdiff.testing.pipelines import ARCHS, tiny_pipeline
from fastdiff.testing.probe import unet_probe_inputs
from fastdiff.testing.tokenizer import build_clip_tokenizer

__all__ = ["ARCHS", "build_clip_tokenizer", "tiny_pipeline", "unet_probe_inputs"]
