"""fastdiff-tiny: a small Stable-Diffusion-family text-to-image model trained from scratch.

It ships inside the package (``fastdiff/tiny/weights``) so every fastdiff feature
runs offline on a real trained model: 64x64 images of coloured shapes on plain or
textured backgrounds (:mod:`fastdiff.tiny.data`), a teacher model and an
LCM-distilled student, both plain diffusers ``StableDiffusionPipeline`` folders.

>>> from fastdiff.tiny import load_pipeline
>>> pipe = load_pipeline("base")          # doctest: +SKIP
>>> image = pipe("a red circle on a striped blue background").images[0]  # doctest: +SKIP
"""

from fastdiff.tiny.data import (
    COLOUR_NAMES,
    HELDOUT_PAIRS,
    SHAPES,
    TEXTURES,
    VOCAB,
    Attributes,
    list_prompts,
    make_dataset,
    parse_prompt,
    sample_attributes,
)
from fastdiff.tiny.load import VARIANTS, load_pipeline, reference_stats, weights_dir

__all__ = [
    "COLOUR_NAMES",
    "HELDOUT_PAIRS",
    "SHAPES",
    "TEXTURES",
    "VOCAB",
    "VARIANTS",
    "Attributes",
    "list_prompts",
    "load_pipeline",
    "make_dataset",
    "parse_prompt",
    "reference_stats",
    "sample_attributes",
    "weights_dir",
]
