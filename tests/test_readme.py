"""The README's Python examples run as written (on fastdiff-tiny or a random-weight pipeline, on CPU).

Each test takes the first ```python block under a README heading and executes it with the names the block
leaves free (``pipe``, ``prompt``, ...) bound to small local objects. A renamed keyword, a removed function or
calls in an order that fails turn these red. The quick start's first block needs CUDA and a downloaded
model, so it is not run here; the tiny-model block is (``fastdiff.tiny.load_pipeline``).
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest

from fastdiff import installed
from fastdiff.caching.hooks import installed_cache
from fastdiff.testing import tiny_pipeline

README = Path(__file__).resolve().parent.parent / "README.md"
PROMPT = "a red circle on a plain blue background"


def block(heading: str) -> str:
    """The first ```python block after the line ``heading``."""
    text = README.read_text()
    if heading not in text:
        raise AssertionError(f"README has no heading {heading!r}")
    return re.search(r"```python\n(.*?)```", text.split(heading, 1)[1], re.S).group(1)


def run(code: str, heading: str, **free) -> dict:
    names = {"print": lambda *a, **k: None, **free}
    exec(compile(code, f"README.md ({heading})", "exec"), names)
    return names


def test_tiny_model_block():
    heading = "Quick start for diffusers users"
    text = README.read_text().split(heading, 1)[1]
    code = re.findall(r"```python\n(.*?)```", text, re.S)[1]  # the second block: fastdiff-tiny
    names = run(code, heading)
    assert type(names["pipe"]).__name__ == "StableDiffusionPipeline"
    assert names["lcm"].unet.config.time_cond_proj_dim is not None  # the LCM student


def test_drop_in_pipeline_block():
    import fastdiff
    import fastdiff.tiny
    from fastdiff.tiny.load import weights_dir

    heading = "### Dynamic steps and drop-in pipelines"
    lcm = fastdiff.tiny.load_pipeline("lcm")
    names = run(
        block(heading), heading, fastdiff=fastdiff, path=weights_dir("base"), prompt=PROMPT, lcm_pipe=lcm
    )
    final, preview = names["final"], names["preview"]
    # the preview paused after 8 evaluations; refining ran the rest of the 30-step schedule (31 with PNDM)
    assert preview.fastdiff.nfe == 8 and final.fastdiff.nfe == final.fastdiff.num_steps[0] >= 30
    assert final.images[0].size == (64, 64)


def test_step_cache_block():
    heading = "### Step caching"
    pipe = tiny_pipeline("sd15", seed=3)
    pipe.set_progress_bar_config(disable=True)
    call = type(pipe).__call__
    free = {"pipe": pipe, "prompt": "a red cat", "prompts": ["a red cat", "a blue dog"]}
    free["calibration_prompts"] = ["a green bird"]
    names = {}
    try:  # the random-weight pipeline at its smallest size
        type(pipe).__call__ = functools.wraps(call)(
            lambda self, *a, **k: call(self, *a, **{"height": 32, "width": 32, **k})
        )
        names = run(block(heading), heading, **free)
    finally:
        type(pipe).__call__ = call
        if "fpipe" in names:  # the block leaves its drop-in pipeline's cache installed (on pipe's U-Net)
            installed.undo_all(names["fpipe"])
        installed.undo_all(pipe)
    last = names["cache"].last_run()
    # 50 steps (51 U-Net calls with this pipeline's PNDM scheduler, whose PLMS warm-up adds one)
    assert last.steps >= 50 and last.full_evals + last.cached_evals == last.steps and last.cached_evals > 0
    assert names["out"].fastdiff.step_cache is not None
    assert not installed.installations(pipe) and installed_cache(pipe) is None


def test_engines_block(tmp_path, monkeypatch):
    pytest.importorskip("openvino")
    pytest.importorskip("nncf")
    import fastdiff.tiny

    heading = "### Engines: ONNX Runtime and OpenVINO (CPU), TensorRT (GPU), with timestep-aware INT8"
    monkeypatch.chdir(tmp_path)  # the block writes calib/ where it runs
    monkeypatch.setenv("FASTDIFF_CACHE_DIR", str(tmp_path / "cache"))
    pipe = fastdiff.tiny.load_pipeline("base")
    pipe.set_progress_bar_config(disable=True)
    original = pipe.unet
    call = type(pipe).__call__
    try:  # 4 steps for every call: the block's calibration runs 20, its image the default 50
        type(pipe).__call__ = functools.wraps(call)(
            lambda self, *a, **k: call(self, *a, **{**k, "num_inference_steps": 4})
        )
        names = run(block(heading), heading, pipe=pipe, prompts=[PROMPT], prompt=PROMPT)
    finally:
        type(pipe).__call__ = call
        installed.undo_all(pipe)
    engine = names["engine"]
    assert engine.precision in ("fp32", "bf16", "int8", "mixed") and engine.quality["snr_db"] > 20
    assert (tmp_path / "calib").is_dir() and pipe.unet is original
