"""Read the attributes of a shapes image (fastdiff-tiny's domain) back from its pixels.

Used to score generated images against their prompt: does "a red circle on a
striped blue background" give a red shape, a blue background, a circle?

How it reads an image:

1. every pixel gets the colour whose palette tones (base, and the darker tones
   textures use) are nearest in RGB;
2. background colour = the majority colour of a 3-pixel frame along the border
   (shapes never reach it in the data set);
3. shape colour = the majority colour among the other pixels that are not the
   background colour;
4. shape class = the template (square = its bounding box, circle = inscribed disc,
   triangle = apex-up isosceles) with the highest IoU against the largest connected
   blob of shape-colour pixels.

Its accuracy on ground-truth data-set images is measured by
:func:`checker_accuracy` (tests require ~100%); on generated images it is a
proxy for prompt adherence, not a perfect judge.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from fastdiff.metrics._images import to_nchw
from fastdiff.tiny.data import COLOUR_NAMES, COLOURS, DARK_TONE

_TONES = (1.0, (1.0 + DARK_TONE) / 2, DARK_TONE)
_FRAME = 3
_MIN_SHAPE_PIXELS = 20


def _palette() -> tuple[torch.Tensor, torch.Tensor]:
    cols, ids = [], []
    for i, name in enumerate(COLOUR_NAMES):
        for tone in _TONES:
            cols.append([v * tone / 255.0 for v in COLOURS[name]])
            ids.append(i)
    return torch.tensor(cols, dtype=torch.float64), torch.tensor(ids)


def colour_map(images) -> torch.Tensor:
    """Per-pixel colour index (into ``COLOUR_NAMES``), shape (N, H, W)."""
    x = to_nchw(images)
    if x.shape[1] != 3:
        raise ValueError(f"expected RGB images (3 channels), got {x.shape[1]}")
    cols, ids = _palette()
    pix = x.permute(0, 2, 3, 1).reshape(-1, 3)
    nearest = torch.cdist(pix, cols).argmin(1)
    return ids[nearest].reshape(x.shape[0], x.shape[2], x.shape[3])


@dataclass(frozen=True)
class Reading:
    """What the checker sees in one image (None where it cannot tell)."""

    shape_colour: str | None
    bg_colour: str
    shape: str | None


def _templates(h: int, w: int) -> dict[str, np.ndarray]:
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float64) + 0.5
    cy, cx = h / 2, w / 2
    circle = ((xx - cx) / (w / 2)) ** 2 + ((yy - cy) / (h / 2)) ** 2 <= 1
    rel = yy / h  # 0 at apex, 1 at base
    triangle = np.abs(xx - cx) <= rel * w / 2
    return {"circle": circle, "square": np.ones((h, w), bool), "triangle": triangle}


def _largest_blob(mask: np.ndarray) -> np.ndarray:
    from scipy import ndimage

    labels, n = ndimage.label(mask)
    if n <= 1:
        return mask
    sizes = ndimage.sum(mask, labels, index=np.arange(1, n + 1))
    return labels == (1 + int(np.argmax(sizes)))


def classify_shape(mask: np.ndarray) -> str | None:
    """Shape class of a binary mask by best IoU with templates fitted to its bounding box."""
    if mask.sum() < _MIN_SHAPE_PIXELS:
        return None
    blob = _largest_blob(mask)
    rows, cols = np.nonzero(blob)
    y0, y1, x0, x1 = rows.min(), rows.max() + 1, cols.min(), cols.max() + 1
    crop = blob[y0:y1, x0:x1]
    iou = {name: (crop & t).sum() / max(1, (crop | t).sum()) for name, t in _templates(*crop.shape).items()}
    return max(iou, key=iou.get)  # the first template on a tie


def read_attributes(images) -> list[Reading]:
    """Read shape colour, background colour and shape class from each image."""
    cmap = colour_map(images).numpy()
    n_col = len(COLOUR_NAMES)
    out = []
    for m in cmap:
        frame = np.concatenate(
            [m[:_FRAME].ravel(), m[-_FRAME:].ravel(), m[:, :_FRAME].ravel(), m[:, -_FRAME:].ravel()]
        )
        bg = int(np.bincount(frame, minlength=n_col).argmax())
        inner = m[_FRAME:-_FRAME, _FRAME:-_FRAME]
        counts = np.bincount(inner[inner != bg], minlength=n_col)
        if counts.max() < _MIN_SHAPE_PIXELS:
            out.append(Reading(None, COLOUR_NAMES[bg], None))
            continue
        fg = int(counts.argmax())
        out.append(Reading(COLOUR_NAMES[fg], COLOUR_NAMES[bg], classify_shape(m == fg)))
    return out


def score(images, attributes, reduction: str = "mean") -> dict:
    """Fraction of images whose shape colour / background colour / shape / all three match.

    Args:
        images: generated (or real) images, any type :func:`read_attributes` accepts.
        attributes: the :class:`fastdiff.tiny.data.Attributes` each image was prompted with.
        reduction: "mean" (fractions, and ``n``) or "none" (one boolean array per key, an entry per
            image: what paired comparisons of two runs on the same prompts and seeds need).
    """
    if reduction not in ("mean", "none"):
        raise ValueError(f"reduction must be 'mean' or 'none', got {reduction!r}")
    readings = read_attributes(images)
    if len(readings) != len(attributes):
        raise ValueError(f"{len(readings)} images but {len(attributes)} attribute sets")
    if not readings:
        raise ValueError("no images to score")
    sc = np.array([r.shape_colour == a.shape_colour for r, a in zip(readings, attributes)])
    bc = np.array([r.bg_colour == a.bg_colour for r, a in zip(readings, attributes)])
    sh = np.array([r.shape == a.shape for r, a in zip(readings, attributes)])
    right = {"shape_colour": sc, "bg_colour": bc, "shape": sh, "all": sc & bc & sh}
    if reduction == "none":
        return right
    return {**{k: float(v.mean()) for k, v in right.items()}, "n": len(readings)}


def checker_accuracy(n: int = 600, seed: int = 1234) -> dict[str, float]:
    """The checker's own accuracy on ground-truth data-set images (all splits)."""
    from fastdiff.tiny.data import make_dataset

    images, attrs = make_dataset(n, seed=seed, split="all")
    return score(images, attrs)


__all__ = ["Reading", "checker_accuracy", "classify_shape", "colour_map", "read_attributes", "score"]
