"""fastdiff-tiny: data set, shipped weights (plain diffusers loading, fixed-seed checksum) and the demo."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from fastdiff.tiny import data as D
from fastdiff.tiny.load import VARIANTS, weights_dir

WEIGHTS = os.path.join(os.path.dirname(D.__file__), "weights")


def needs_weights(test):
    """The weights ship in the package: a test that needs them fails, never skips, when they are missing."""
    return test


def test_weights_are_shipped():
    missing = [v for v in VARIANTS if not os.path.isfile(os.path.join(WEIGHTS, v, "model_index.json"))]
    assert not missing, f"fastdiff-tiny weights missing for {missing} under {WEIGHTS}"


# ----------------------------------------------------------------------------- data


def test_dataset_is_deterministic_by_seed():
    a, attrs_a = D.make_dataset(12, seed=3)
    b, attrs_b = D.make_dataset(12, seed=3)
    c, _ = D.make_dataset(12, seed=4)
    assert np.array_equal(a, b) and attrs_a == attrs_b
    assert not np.array_equal(a, c)
    assert a.shape == (12, 64, 64, 3) and a.dtype == np.uint8


def test_splits_partition_the_combinations():
    train, held = D.list_attributes("train"), D.list_attributes("heldout")
    assert len(train) + len(held) == len(D.list_attributes("all"))
    assert not {(a.shape_colour, a.bg_colour) for a in train} & D.HELDOUT_PAIRS
    assert {(a.shape_colour, a.bg_colour) for a in held} == set(D.HELDOUT_PAIRS)
    # every colour is still seen in training as a shape and as a background
    assert {a.shape_colour for a in train} == set(D.COLOUR_NAMES) == {a.bg_colour for a in train}
    assert all(not a.heldout for a in D.sample_attributes(200, seed=0, split="train"))


def test_prompts_have_both_phrasings_and_parse_back():
    attrs = D.sample_attributes(300, seed=1)
    prompts = {a.prompt for a in attrs}
    assert any("plain" in p for p in prompts) and any(len(p.split()) == 7 for p in prompts)
    for a in attrs:
        back = D.parse_prompt(a.prompt)
        assert (back.shape, back.shape_colour, back.bg_colour, back.texture) == (
            a.shape,
            a.shape_colour,
            a.bg_colour,
            a.texture,
        )
    with pytest.raises(ValueError, match="does not follow"):
        D.parse_prompt("a cat")


def test_bad_attributes_are_rejected():
    with pytest.raises(ValueError, match="must differ"):
        D.Attributes("circle", "red", "red")
    with pytest.raises(ValueError, match="shape 'hexagon'"):
        D.Attributes("hexagon", "red", "blue")
    with pytest.raises(ValueError, match="split"):
        D.list_attributes("test")


def test_textures_are_visually_busier_than_plain():
    rng = np.random.default_rng(0)

    def hf_energy(texture):
        img = D.render(D.Attributes("circle", "red", "blue", texture), rng).astype(float)
        return np.abs(np.diff(img, axis=1)).mean() + np.abs(np.diff(img, axis=0)).mean()

    plain = hf_energy("plain")
    for tex in ("striped", "checkered", "noisy"):
        assert hf_energy(tex) > 2.5 * plain  # plain: only the shape outline


def test_tokenizer_makes_every_vocab_word_one_token():
    from fastdiff.tiny.models import build_tokenizer

    tok = build_tokenizer()
    for word in D.VOCAB:
        assert len(tok(word, add_special_tokens=False).input_ids) == 1, word


def test_tokenizers_built_without_a_folder_leave_no_temporary_folder(tmp_path, monkeypatch):
    """Each call used to leave a folder in the system temp dir (hundreds after a test run)."""
    import tempfile

    from fastdiff.testing.tokenizer import build_clip_tokenizer
    from fastdiff.tiny.models import build_tokenizer

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    tiny, plain = build_tokenizer(), build_clip_tokenizer(["purple", "square"])
    assert list(scratch.iterdir()) == []
    # Loaded into memory: they still tokenize and save after their folder is gone.
    assert len(tiny("purple square", add_special_tokens=False).input_ids) == 2
    assert len(plain("purple square", add_special_tokens=False).input_ids) == 2
    plain.save_pretrained(tmp_path / "saved")
    assert (tmp_path / "saved" / "tokenizer_config.json").is_file()


# ----------------------------------------------------------------------------- weights


@needs_weights
def test_weights_load_with_plain_diffusers_and_fit_the_size_budget():
    from diffusers import LCMScheduler, StableDiffusionPipeline

    total = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(WEIGHTS) for f in fs)
    assert total < 25 * 2**20
    base = StableDiffusionPipeline.from_pretrained(weights_dir("base"), local_files_only=True)
    lcm = StableDiffusionPipeline.from_pretrained(weights_dir("lcm"), local_files_only=True)
    assert base.unet.dtype == torch.float32 and base.text_encoder.dtype == torch.float32
    assert isinstance(lcm.scheduler, LCMScheduler) and lcm.unet.config.time_cond_proj_dim is not None
    assert base.vae.config.scaling_factor != 0.18215  # measured, not SD's
    assert base.safety_checker is None


@needs_weights
@pytest.mark.parametrize("variant", VARIANTS)
def test_fixed_seed_generation_matches_the_stored_checksum(variant):
    from fastdiff.tiny import reference_stats

    with open(os.path.join(WEIGHTS, "reference.json")) as f:
        ref = json.load(f)[variant]
    got = reference_stats(variant)
    for key in ("mean", "std", "abs_mean"):
        assert got[key] == pytest.approx(ref[key], rel=2e-3, abs=2e-3), key
    np.testing.assert_allclose(got["pooled"], ref["pooled"], rtol=2e-3, atol=5e-3)


@needs_weights
def test_demo_quick_runs_end_to_end(tmp_path):
    from fastdiff.demo import main

    assert main(["--quick", "--out", str(tmp_path), "--only", "lcm-draft"]) == 0
    report = json.loads((tmp_path / "demo.json").read_text())
    names = [r["config"] for r in report["rows"]]
    assert names == ["baseline", "lcm-draft"]
    assert report["rows"][0]["psnr_vs_baseline_db"] == float("inf")
    assert report["rows"][1]["unet_evals_per_image"] == 4
    assert report["rows"][0]["unet_evals_per_image"] > 4
    assert (tmp_path / "demo.png").stat().st_size > 0 and (tmp_path / "demo.md").exists()
