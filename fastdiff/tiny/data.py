"""Procedural "shapes" data set that fastdiff-tiny is trained on.

Every image is 64x64 RGB: one flat-coloured shape (circle, square or upright
triangle) of random size and position on a background of another colour. The
background is plain or carries a fine texture (thin stripes, small checks,
blocky noise) drawn in light and dark tones of its own colour, so its colour
stays identifiable while some prompts are visually simple and others busy.

Prompts follow two grammars, both used in training::

    "a {colour} {shape} on a {colour} background"             (plain only)
    "a {colour} {shape} on a {texture} {colour} background"   (any texture, "plain" included)

Some (shape colour, background colour) pairs never occur in training
(:data:`HELDOUT_PAIRS`); prompts using them measure whether the model composes
colour and object rather than memorising pairs.

Everything is deterministic given a seed.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

import numpy as np

IMAGE_SIZE = 64

#: colour name -> base RGB (0-255). Hues are far apart so a checker can tell them
#: apart by nearest colour even in the dark tone textures use.
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "green": (40, 170, 60),
    "blue": (40, 70, 220),
    "yellow": (235, 210, 40),
    "purple": (150, 50, 190),
    "white": (235, 235, 235),
}
COLOUR_NAMES: tuple[str, ...] = tuple(COLOURS)
SHAPES: tuple[str, ...] = ("circle", "square", "triangle")
TEXTURES: tuple[str, ...] = ("plain", "striped", "checkered", "noisy")

#: multiplier of the base colour for the dark tone of a textured background.
DARK_TONE = 0.6

#: (shape colour, background colour) pairs kept out of training: each colour
#: on the next one in COLOUR_NAMES. Every colour still appears in training as a
#: shape and as a background, just never in these pairings.
HELDOUT_PAIRS: frozenset[tuple[str, str]] = frozenset(
    (COLOUR_NAMES[i], COLOUR_NAMES[(i + 1) % len(COLOUR_NAMES)]) for i in range(len(COLOUR_NAMES))
)

#: every word a prompt can contain; the tokenizer makes each a single token.
VOCAB: tuple[str, ...] = ("a", "on", "background", *COLOUR_NAMES, *SHAPES, *TEXTURES)


@dataclass(frozen=True)
class Attributes:
    """What an image shows and how its prompt is phrased."""

    shape: str
    shape_colour: str
    bg_colour: str
    texture: str = "plain"
    #: only for plain backgrounds: say "plain" in the prompt (True) or omit it (False)
    say_plain: bool = False

    def __post_init__(self):
        if self.shape not in SHAPES:
            raise ValueError(f"shape {self.shape!r} is not one of {SHAPES}")
        for field, value in (("shape_colour", self.shape_colour), ("bg_colour", self.bg_colour)):
            if value not in COLOURS:
                raise ValueError(f"{field} {value!r} is not one of {COLOUR_NAMES}")
        if self.texture not in TEXTURES:
            raise ValueError(f"texture {self.texture!r} is not one of {TEXTURES}")
        if self.shape_colour == self.bg_colour:
            raise ValueError(f"shape colour and background colour must differ, both are {self.bg_colour!r}")

    @property
    def prompt(self) -> str:
        if self.texture == "plain" and not self.say_plain:
            return f"a {self.shape_colour} {self.shape} on a {self.bg_colour} background"
        return f"a {self.shape_colour} {self.shape} on a {self.texture} {self.bg_colour} background"

    @property
    def heldout(self) -> bool:
        return (self.shape_colour, self.bg_colour) in HELDOUT_PAIRS


def parse_prompt(prompt: str) -> Attributes:
    """Inverse of :attr:`Attributes.prompt`; raises ValueError for prompts outside the grammar."""
    words = prompt.lower().split()
    say_plain = len(words) != 7
    if not say_plain:
        words.insert(5, "plain")
    if len(words) != 8 or words[0] != "a" or words[3:5] != ["on", "a"] or words[7] != "background":
        raise ValueError(
            f"prompt {prompt!r} does not follow 'a <colour> <shape> on a [<texture>] <colour> background'"
        )
    return Attributes(
        shape=words[2], shape_colour=words[1], bg_colour=words[6], texture=words[5], say_plain=say_plain
    )


def list_attributes(split: str = "train") -> list[Attributes]:
    """All attribute combinations of a split, one per (shape, colours, texture).

    Args:
        split: "train" (pairs not held out), "heldout" (only :data:`HELDOUT_PAIRS`) or "all".
    """
    if split not in ("train", "heldout", "all"):
        raise ValueError(f"split must be 'train', 'heldout' or 'all', got {split!r}")
    return [
        Attributes(shape, sc, bc, tex)
        for sc, bc, shape, tex in itertools.product(COLOUR_NAMES, COLOUR_NAMES, SHAPES, TEXTURES)
        if sc != bc and split in ("all", "heldout" if (sc, bc) in HELDOUT_PAIRS else "train")
    ]


def sample_attributes(n: int, seed: int = 0, split: str = "train") -> list[Attributes]:
    """`n` attribute sets drawn uniformly from a split, prompt phrasing drawn too (deterministic)."""
    pool = list_attributes(split)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(pool), size=n)
    say = rng.random(n) < 0.5
    return [replace(pool[i], say_plain=bool(s)) for i, s in zip(idx, say)]


def list_prompts(split: str = "heldout", phrasing: str = "short") -> list[tuple[str, Attributes]]:
    """(prompt, attributes) for every combination of a split.

    Args:
        phrasing: "short" omits "plain" for plain backgrounds, "long" always names the texture.
    """
    if phrasing not in ("short", "long"):
        raise ValueError(f"phrasing must be 'short' or 'long', got {phrasing!r}")
    attrs = [replace(a, say_plain=phrasing == "long") for a in list_attributes(split)]
    return [(a.prompt, a) for a in attrs]


# ----------------------------------------------------------------------------- rendering

_SUPERSAMPLE = 4  # shape edges are anti-aliased by 4x4 supersampling


def _shape_coverage(shape: str, cx: float, cy: float, side: float, size: int) -> np.ndarray:
    """Fraction of each pixel covered by the shape (size x size, float32 in [0, 1])."""
    n = size * _SUPERSAMPLE
    coords = (np.arange(n, dtype=np.float32) + 0.5) / _SUPERSAMPLE
    y, x = np.meshgrid(coords, coords, indexing="ij")
    half = side / 2
    if shape == "circle":
        inside = (x - cx) ** 2 + (y - cy) ** 2 <= half**2
    elif shape == "square":
        inside = (np.abs(x - cx) <= half) & (np.abs(y - cy) <= half)
    else:  # upright isosceles triangle, apex at the top of its bounding box
        top, bottom = cy - half, cy + half
        rel = (y - top) / side  # 0 at apex, 1 at base
        inside = (y >= top) & (y <= bottom) & (np.abs(x - cx) <= rel * half)
    cov = inside.reshape(size, _SUPERSAMPLE, size, _SUPERSAMPLE).mean(axis=(1, 3))
    return cov.astype(np.float32)


def _background(texture: str, base: np.ndarray, rng: np.random.Generator, size: int) -> np.ndarray:
    """size x size x 3 float background: tones of `base` between DARK_TONE*base and base."""
    dark = base * DARK_TONE
    yy, xx = np.mgrid[0:size, 0:size]
    if texture == "plain":
        t = np.ones((size, size), np.float32)
    elif texture == "striped":
        period = int(rng.integers(3, 5))  # 3-4 px: thin stripes
        direction = int(rng.integers(0, 3))  # horizontal, vertical, diagonal
        coord = (yy, xx, xx + yy)[direction] + int(rng.integers(0, period))
        t = ((coord % period) < period / 2).astype(np.float32)
    elif texture == "checkered":
        cell = int(rng.integers(3, 5))  # 3-4 px checks
        off = rng.integers(0, cell, size=2)
        t = (((yy + off[0]) // cell + (xx + off[1]) // cell) % 2).astype(np.float32)
    else:  # "noisy" (Attributes admits no other texture)
        block = 2  # 2x2 px noise grains
        grains = rng.random((size // block + 1, size // block + 1)).astype(np.float32)
        t = np.repeat(np.repeat(grains, block, 0), block, 1)[:size, :size]
    return dark[None, None, :] + t[..., None] * (base - dark)[None, None, :]


def render(attrs: Attributes, rng: np.random.Generator, size: int = IMAGE_SIZE) -> np.ndarray:
    """Draw one image for `attrs` (geometry, texture phase and colour jitter from `rng`).

    Returns:
        uint8 array (size, size, 3).
    """
    jitter = lambda: rng.uniform(-12, 12, size=3)  # small colour variation keeps the model robust
    fg = np.clip(np.array(COLOURS[attrs.shape_colour], np.float32) + jitter(), 0, 255)
    bg = np.clip(np.array(COLOURS[attrs.bg_colour], np.float32) + jitter(), 0, 255)
    margin = 4 * size / IMAGE_SIZE
    side = rng.uniform(0.28, 0.56) * size
    cx = rng.uniform(margin + side / 2, size - margin - side / 2)
    cy = rng.uniform(margin + side / 2, size - margin - side / 2)
    image = _background(attrs.texture, bg.astype(np.float32), rng, size)
    cov = _shape_coverage(attrs.shape, cx, cy, side, size)[..., None]
    image = image * (1 - cov) + fg[None, None, :] * cov
    return np.clip(np.round(image), 0, 255).astype(np.uint8)


def make_dataset(n: int, seed: int = 0, split: str = "train") -> tuple[np.ndarray, list[Attributes]]:
    """`n` images with their attributes, deterministic by `seed`.

    Returns:
        (uint8 array (n, 64, 64, 3), list of :class:`Attributes`).
    """
    attrs = sample_attributes(n, seed=seed, split=split)
    rng = np.random.default_rng([seed, 1])
    images = (
        np.stack([render(a, rng) for a in attrs]) if n else np.zeros((0, IMAGE_SIZE, IMAGE_SIZE, 3), np.uint8)
    )
    return images, attrs


def to_tensor(images: np.ndarray):
    """uint8 NHWC -> float32 NCHW torch tensor in [-1, 1] (the VAE's input range)."""
    import torch

    return torch.from_numpy(images).permute(0, 3, 1, 2).float().div(127.5).sub(1.0)
