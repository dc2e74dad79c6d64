"""fastdiff.metrics: PSNR/SSIM against closed-form values, the attribute checker against ground truth."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from PIL import Image

from fastdiff.metrics import checker_accuracy, colour_map, psnr, read_attributes, score, ssim
from fastdiff.metrics.attributes import classify_shape
from fastdiff.tiny.data import COLOUR_NAMES, COLOURS, Attributes, make_dataset


def _rand(seed, shape=(2, 3, 32, 32)):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(shape, generator=g)


def test_identical_images_give_inf_psnr_and_unit_ssim():
    a = _rand(0)
    assert psnr(a, a) == math.inf
    assert ssim(a, a) == pytest.approx(1.0, abs=1e-12)


def test_psnr_matches_known_noise_level():
    torch.manual_seed(0)
    a = torch.full((1, 3, 64, 64), 0.5, dtype=torch.float64)
    noise = 0.05 * torch.randn_like(a)  # |noise| < 0.25 everywhere, so nothing clips
    b = a + noise
    expected = 10 * math.log10(1.0 / noise.pow(2).mean().item())
    assert psnr(a, b) == pytest.approx(expected, rel=1e-9)
    assert psnr(a, b) == pytest.approx(20 * math.log10(1 / 0.05), abs=0.2)  # ~26.0 dB for sigma 0.05
    assert psnr(a * 255, b * 255, data_range=255.0) == pytest.approx(expected, rel=1e-9)


def test_ssim_of_constant_images_is_the_luminance_term():
    # constant images have zero variance, so SSIM reduces to (2 mu_a mu_b + C1) / (mu_a^2 + mu_b^2 + C1)
    a = torch.full((1, 1, 16, 16), 0.3, dtype=torch.float64)
    b = torch.full((1, 1, 16, 16), 0.5, dtype=torch.float64)
    c1 = 0.01**2
    assert ssim(a, b) == pytest.approx((2 * 0.3 * 0.5 + c1) / (0.3**2 + 0.5**2 + c1), rel=1e-9)


def test_ssim_and_psnr_fall_as_noise_grows():
    a = _rand(1, (1, 3, 48, 48))
    g = torch.Generator().manual_seed(2)
    noise = torch.randn(a.shape, generator=g)
    ps = [psnr(a, a + s * noise) for s in (0.01, 0.05, 0.2)]
    ss = [ssim(a, a + s * noise) for s in (0.01, 0.05, 0.2)]
    assert ps[0] > ps[1] > ps[2]
    assert 1.0 > ss[0] > ss[1] > ss[2]


def test_input_types_agree():
    a8 = (np.random.default_rng(0).random((40, 40, 3)) * 255).astype(np.uint8)
    b8 = np.clip(a8.astype(int) + 9, 0, 255).astype(np.uint8)
    t = lambda x: torch.from_numpy(x).permute(2, 0, 1).double() / 255
    for fn in (psnr, ssim):
        ref = fn(t(a8), t(b8))
        assert fn(a8, b8) == pytest.approx(ref, rel=1e-12)
        assert fn(Image.fromarray(a8), Image.fromarray(b8)) == pytest.approx(ref, rel=1e-12)
        assert fn(a8.astype(np.float32) / 255, b8.astype(np.float32) / 255) == pytest.approx(ref, rel=1e-6)
    per_image = psnr(np.stack([a8, a8]), np.stack([b8, a8]), reduction="none")
    assert per_image.shape == (2,) and per_image[1] == math.inf


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match="same shape"):
        psnr(_rand(0, (1, 3, 16, 16)), _rand(0, (1, 3, 16, 17)))
    with pytest.raises(TypeError, match="PIL image"):
        psnr("a.png", "b.png")
    with pytest.raises(ValueError, match="smaller than"):
        ssim(_rand(0, (1, 3, 8, 8)), _rand(1, (1, 3, 8, 8)))
    with pytest.raises(ValueError, match="reduction"):
        psnr(_rand(0), _rand(1), reduction="sum")


def test_checker_is_exact_on_ground_truth_images():
    acc = checker_accuracy(n=240, seed=11)
    assert acc["shape_colour"] == 1.0 and acc["bg_colour"] == 1.0 and acc["shape"] >= 0.99


def test_checker_rejects_wrong_attributes():
    images, attrs = make_dataset(60, seed=5, split="all")
    swapped = [Attributes(a.shape, a.bg_colour, a.shape_colour, a.texture) for a in attrs]
    s = score(images, swapped)
    assert s["shape_colour"] == 0.0 and s["bg_colour"] == 0.0
    others = {"circle": "square", "square": "triangle", "triangle": "circle"}
    wrong_shape = [Attributes(others[a.shape], a.shape_colour, a.bg_colour, a.texture) for a in attrs]
    assert score(images, wrong_shape)["shape"] <= 0.02
    with pytest.raises(ValueError, match="attribute sets"):
        score(images, attrs[:-1])


def test_score_per_image_marks_exactly_the_images_given_wrong_attributes():
    images, attrs = make_dataset(12, seed=7, split="all")
    others = {"circle": "square", "square": "triangle", "triangle": "circle"}
    wrong = {1, 4, 9}  # these images are scored against another shape
    given = [
        Attributes(others[a.shape], a.shape_colour, a.bg_colour, a.texture) if i in wrong else a
        for i, a in enumerate(attrs)
    ]
    right = score(images, given, reduction="none")
    assert [i for i, ok in enumerate(right["shape"]) if not ok] == sorted(wrong)
    assert right["all"].tolist() == right["shape"].tolist() and right["bg_colour"].all()
    assert score(images, given)["all"] == right["all"].mean() == 9 / 12
    with pytest.raises(ValueError, match="reduction must be"):
        score(images, given, reduction="sum")


def test_colour_map_on_palette_tones_and_blank_image():
    for i, name in enumerate(COLOUR_NAMES):
        img = np.tile(np.array(COLOURS[name], np.uint8), (8, 8, 1))
        assert (colour_map(img) == i).all()
        dark = (img * 0.6).astype(np.uint8)
        assert (colour_map(dark) == i).all()
    blank = np.tile(np.array(COLOURS["blue"], np.uint8), (64, 64, 1))
    reading = read_attributes(blank)[0]
    assert reading.bg_colour == "blue" and reading.shape_colour is None and reading.shape is None


def test_shape_classifier_on_drawn_masks():
    yy, xx = np.mgrid[0:64, 0:64] + 0.5
    circle = (xx - 30) ** 2 + (yy - 33) ** 2 <= 13**2
    square = (abs(xx - 20) <= 9) & (abs(yy - 40) <= 9)
    tri = (yy >= 10) & (yy <= 40) & (abs(xx - 32) <= (yy - 10) / 2)
    assert classify_shape(circle) == "circle"
    assert classify_shape(square) == "square"
    assert classify_shape(tri) == "triangle"
    assert classify_shape(np.zeros((64, 64), bool)) is None


def test_psnr_per_image_data_range_worst_and_pooled_against_a_loop():
    """Per-image PSNR with a per-image peak (e.g. latents of different ranges), the worst image, and the
    pooled form, against an explicit per-image loop in float64."""
    g = torch.Generator().manual_seed(5)
    a = (
        torch.randn(4, 4, 8, 8, generator=g, dtype=torch.float64)
        * torch.tensor([1.0, 2.0, 0.5, 3.0])[:, None, None, None]
    )
    b = a + 0.1 * torch.randn(a.shape, generator=g, dtype=torch.float64)
    ranges = (a.flatten(1).max(1).values - a.flatten(1).min(1).values).tolist()
    want = []
    for i in range(4):
        mse = sum(float(v) ** 2 for v in (a[i] - b[i]).flatten()) / a[i].numel()
        want.append(10 * math.log10(ranges[i] ** 2 / mse))
    got = psnr(a, b, data_range=ranges, reduction="none")
    assert got.tolist() == pytest.approx(want, rel=1e-12)
    assert psnr(a, b, data_range=ranges) == pytest.approx(sum(want) / 4, rel=1e-12)
    assert psnr(a, b, data_range=ranges, reduction="min") == pytest.approx(min(want), rel=1e-12)
    pooled_mse = float(((a - b) ** 2).mean())
    assert psnr(a, b, data_range=2.0, reduction="pooled") == pytest.approx(
        10 * math.log10(4 / pooled_mse), rel=1e-12
    )
    assert psnr(a, a, data_range=2.0, reduction="pooled") == math.inf
    latents = a.reshape(4, -1)  # any (N, ...) tensor, e.g. flattened latents
    assert psnr(latents, b.reshape(4, -1), data_range=ranges, reduction="none").tolist() == pytest.approx(
        want, rel=1e-12
    )


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(data_range=[1.0, 2.0, 3.0]), "one per image"),
        (dict(data_range=0.0), "> 0"),
        (dict(data_range=float("nan")), "finite"),
        (dict(data_range=[1.0, 2.0], reduction="pooled"), "one data_range"),
        (dict(reduction="median"), "reduction"),
    ],
)
def test_psnr_rejects_bad_range_and_reduction(kwargs, match):
    a = _rand(3)
    with pytest.raises(ValueError, match=match):
        psnr(a, a * 0.5, **kwargs)


def test_neighbour_difference_against_a_pixel_loop():
    from fastdiff.metrics import neighbour_difference

    rng = np.random.default_rng(0)
    imgs = rng.integers(0, 256, size=(2, 5, 7, 3), dtype=np.uint8)  # NHWC uint8, odd sizes
    want = []
    for im in imgs.astype(np.float64):
        v = sum(abs(im[i + 1, j, c] - im[i, j, c]) for i in range(4) for j in range(7) for c in range(3)) / (
            4 * 7 * 3
        )
        h = sum(abs(im[i, j + 1, c] - im[i, j, c]) for i in range(5) for j in range(6) for c in range(3)) / (
            5 * 6 * 3
        )
        want.append(v + h)
    assert neighbour_difference(imgs).tolist() == pytest.approx(want, rel=1e-12)
    flat = np.full((1, 8, 8, 3), 0.4)
    assert neighbour_difference(flat).tolist() == [0.0]


def _ssim_window_loop(a: np.ndarray, b: np.ndarray, data_range: float, size=11, sigma=1.5) -> float:
    """SSIM of one (C, H, W) pair from Wang et al. (2004) eq. 13, one window at a time in float64:
    Gaussian-weighted means, variances and covariance over every valid size x size window."""
    x = np.arange(size) - (size - 1) / 2
    w = np.exp(-(x[:, None] ** 2 + x[None, :] ** 2) / (2 * sigma**2))
    w /= w.sum()
    c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
    values = []
    for ch in range(a.shape[0]):
        for i in range(a.shape[1] - size + 1):
            for j in range(a.shape[2] - size + 1):
                pa, pb = a[ch, i : i + size, j : j + size], b[ch, i : i + size, j : j + size]
                ma, mb = (w * pa).sum(), (w * pb).sum()
                va, vb = (w * (pa - ma) ** 2).sum(), (w * (pb - mb) ** 2).sum()
                cov = (w * (pa - ma) * (pb - mb)).sum()
                values.append(((2 * ma * mb + c1) * (2 * cov + c2)) / ((ma**2 + mb**2 + c1) * (va + vb + c2)))
    return float(np.mean(values))


@pytest.mark.parametrize("shape, data_range", [((2, 3, 16, 19), 1.0), ((1, 1, 13, 11), 255.0)])
def test_ssim_against_a_window_loop(shape, data_range):
    a = _rand(7, shape).double() * data_range
    b = (a + 0.2 * data_range * torch.randn(shape, generator=torch.Generator().manual_seed(8))).clamp(
        0, data_range
    )
    per_image = ssim(a, b, data_range=data_range, reduction="none")
    ref = [_ssim_window_loop(a[i].numpy(), b[i].numpy(), data_range) for i in range(shape[0])]
    ref_t = torch.tensor(ref, dtype=torch.float64)
    rel = float((per_image - ref_t).norm() / ref_t.norm())
    assert rel < 1e-10, (per_image, ref)
    assert ssim(a, b, data_range=data_range, reduction="min") == pytest.approx(min(ref), rel=1e-10)


def test_psnr_reduction_error_lists_pooled():
    a = _rand(3)
    with pytest.raises(ValueError, match="'pooled'"):
        psnr(a, a * 0.5, reduction="median")
