"""The public surface: a light `import fastdiff`, lazy names, and validation before any change (#10, #16)."""

import subprocess
import sys

import pytest
import torch

import fastdiff
from fastdiff import installed
from fastdiff.optimize import OptimizeConfig
from fastdiff.testing import tiny_pipeline, unet_probe_inputs


def _modules_after(code: str) -> set[str]:
    out = subprocess.run(
        [sys.executable, "-c", code + "\nimport sys; print(' '.join(sys.modules))"],
        check=True,
        capture_output=True,
        text=True,
    )
    return set(out.stdout.split())


def test_import_fastdiff_is_light():
    loaded = _modules_after("import fastdiff")
    heavy = {"torch", "diffusers", "transformers", "triton", "onnx", "onnxruntime"} & loaded
    assert not heavy, f"import fastdiff loaded {sorted(heavy)}"


def test_optimize_loads_no_pipeline_or_text_encoder():
    loaded = _modules_after(
        "import fastdiff\n"
        "from diffusers import UNet2DConditionModel\n"
        "u = UNet2DConditionModel(block_out_channels=(8, 16), norm_num_groups=4, cross_attention_dim=8,\n"
        "    down_block_types=('CrossAttnDownBlock2D', 'DownBlock2D'),\n"
        "    up_block_types=('UpBlock2D', 'CrossAttnUpBlock2D'), layers_per_block=1, sample_size=8,\n"
        "    attention_head_dim=2)\n"
        "fastdiff.optimize(u)"
    )
    assert not {m for m in loaded if m.startswith("transformers.models.clip")}
    assert "diffusers.pipelines.stable_diffusion.pipeline_stable_diffusion" not in loaded


@pytest.mark.parametrize("name", sorted(set(fastdiff.__all__) - {"__version__"}))
def test_every_exported_name_resolves(name):
    assert getattr(fastdiff, name) is not None


def test_subpackages_resolve_without_importing_them():
    code = "import fastdiff; print(fastdiff.tiny.load_pipeline.__name__, fastdiff.installed.record.__name__)"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert out.stdout.split() == ["load_pipeline", "record"]
    with pytest.raises(AttributeError, match="no attribute 'nonexistent'"):
        fastdiff.nonexistent  # noqa: B018


def test_completion_lists_the_public_api_only():
    """dir(fastdiff) (tab completion in Jupyter) lists exports and subpackages, not import leftovers."""
    code = "import fastdiff; print(' '.join(n for n in dir(fastdiff) if not n.startswith('_')))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    public = set(out.stdout.split())
    assert public == set(fastdiff.__all__) - {"__version__"} | set(fastdiff._SUBMODULES)


def test_optimize_name_stays_the_function_after_submodule_imports():
    import fastdiff.optimize.passes  # noqa: F401

    assert callable(fastdiff.optimize) and fastdiff.optimize.__name__ == "optimize"


@pytest.mark.parametrize(
    "overrides, match",
    [
        ({"verify": "no"}, "verify must be True or False"),
        ({"verify": 1}, "verify must be True or False"),
        ({"fuse_norm_act": "yes"}, "fuse_norm_act must be True or False"),
        ({"tolerance": "1e-3"}, "tolerance must be a positive finite number"),
        ({"tolerance": float("nan")}, "tolerance must be a positive finite number"),
        ({"tolerance": -1.0}, "tolerance must be a positive finite number"),
        ({"tolerance": True}, "tolerance must be a positive finite number"),
        ({"extra": {"bogus_pass": 1}}, "unknown key 'bogus_pass' in extra; valid keys"),
        ({"extra": {"winograd_backend": "cuda"}}, r"extra\['winograd_backend'\] must be one of"),
        ({"extra": "winograd"}, "extra must be a dict"),
        ({"channels_last": "yes"}, "channels_last must be"),
        ({"plan_cache_dir": 3}, "plan_cache_dir must be a path"),
    ],
)
def test_bad_options_are_refused(overrides, match):
    with pytest.raises(ValueError, match=match):
        OptimizeConfig(**overrides)


@pytest.mark.parametrize("config", ["fast", {"winograd": False}, 3])
def test_config_must_be_an_optimize_config(config):
    unet = tiny_pipeline("sd15").unet
    with pytest.raises(TypeError, match="config must be a fastdiff.OptimizeConfig or None"):
        fastdiff.optimize(unet, config)


def test_pipeline_whose_unet_is_not_a_unet_names_the_unet():
    pipe = tiny_pipeline("sd15")
    pipe.unet = torch.nn.Linear(2, 2)
    with pytest.raises(TypeError, match="unet is a Linear"):
        fastdiff.optimize(pipe)


def test_report_says_when_passes_were_not_verified():
    pipe = tiny_pipeline("sd15")
    fastdiff.optimize(pipe, verify=False, attention="math")
    rep = fastdiff.report(pipe)["attention"]
    assert rep.status == "applied" and rep.verification is None
    assert "not verified" in str(fastdiff.report(pipe))


def _outputs(unet):
    inputs = unet_probe_inputs(unet)
    with torch.no_grad():
        return unet(**inputs).sample


def test_refused_second_optimize_keeps_the_first():
    """A forced backend that cannot run here raises before the earlier optimisation is undone."""
    pipe = tiny_pipeline("sd15")
    fastdiff.optimize(pipe, attention="math")
    processors = {k: type(v).__name__ for k, v in pipe.unet.attn_processors.items()}
    with pytest.raises(Exception, match="xformers|efficient"):
        fastdiff.optimize(pipe, attention="xformers" if not torch.cuda.is_available() else "efficient")
    assert fastdiff.report(pipe)["attention"].status == "applied"
    assert {k: type(v).__name__ for k, v in pipe.unet.attn_processors.items()} == processors


def test_failing_pass_restores_the_earlier_optimisation(monkeypatch):
    import importlib

    from fastdiff.optimize.passes import Pass

    core = importlib.import_module("fastdiff.optimize.core")
    pipe = tiny_pipeline("sd15")
    fastdiff.optimize(pipe, attention="math")
    before = _outputs(pipe.unet)
    processors = {k: type(v).__name__ for k, v in pipe.unet.attn_processors.items()}
    real = core.default_passes

    class Boom(Pass):
        name = "boom"

        def apply(self, unet, config, ctx):
            if config.attention == "sdpa":  # fails for the new config only, as a real pass bug would
                ctx.replace_module("conv_out", torch.nn.Identity(), "broken")
                raise RuntimeError("boom")

    monkeypatch.setattr(core, "default_passes", lambda: [*real(), Boom()])
    with pytest.raises(RuntimeError, match="boom"):
        fastdiff.optimize(pipe, attention="sdpa")
    monkeypatch.setattr(core, "default_passes", real)
    assert {k: type(v).__name__ for k, v in pipe.unet.attn_processors.items()} == processors
    assert fastdiff.report(pipe).config.attention == "math"
    assert torch.equal(_outputs(pipe.unet), before)


def test_restore_undoes_every_installation_newest_first():
    pipe = tiny_pipeline("sd15")
    order = []
    installed.record(pipe, "a", lambda: order.append("a"))
    installed.record(pipe, "b", lambda: order.append("b"))
    installed.record(pipe.unet, "c", lambda: order.append("c"))
    fastdiff.restore(pipe)
    assert order == ["b", "a", "c"]
    assert installed.installations(pipe) == [] and installed.installations(pipe.unet) == []
    fastdiff.restore(pipe)  # nothing left: a no-op
    assert order == ["b", "a", "c"]


@pytest.mark.parametrize("dtype, expect", [("float16", torch.float16), ("torch.bfloat16", torch.bfloat16)])
def test_tiny_load_pipeline_honours_dtype_names(dtype, expect):
    pipe = fastdiff.tiny.load_pipeline("base", dtype=dtype)
    assert pipe.unet.dtype == expect and pipe.vae.dtype == expect and pipe.text_encoder.dtype == expect


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"dtype": "float64x"}, "dtype must be one of float32, float16, bfloat16"),
        ({"dtype": torch.int8}, "dtype must be one of"),
        ({"device": "gpu0"}, "device must be a torch device"),
        ({"variant": "xl"}, "variant must be one of"),
    ],
)
def test_tiny_load_pipeline_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        fastdiff.tiny.load_pipeline(**kwargs)
