"""fastdiff.sweep specs: every bad spec is rejected with the key named, before any model loads."""

from __future__ import annotations

import json

import pytest

from fastdiff.sweep import SpecError, parse_spec, sweep


class _Loads:
    """A pipeline factory that records whether anything tried to build the model."""

    called = False

    def __call__(self):
        type(self).called = True
        raise AssertionError("the model was loaded before the spec was validated")


def _spec(**over):
    spec = {
        "pipeline": _Loads(),
        "reference": "ref",
        "prompts": ["a red circle on a blue background"],
        "seeds": [0],
        "metrics": ["psnr", "nfe"],
        "configs": [{"name": "ref", "steps": 10}, {"name": "fast", "sampler": "unipc", "steps": 5}],
    }
    spec.update(over)
    return spec


BAD = {
    "unknown sampler": (
        dict(configs=[{"name": "ref", "sampler": "dpmpp_9m", "steps": 5}]),
        "configs[0].sampler",
    ),
    "unknown diffusers scheduler": (
        dict(configs=[{"name": "ref", "sampler": "diffusers:NoSuch"}]),
        "sampler",
    ),
    "unknown metric": (dict(metrics=["psnr", "fid"]), "metrics"),
    "empty prompts": (dict(prompts=[]), "prompts"),
    "empty prompt group": (dict(prompts={"groups": {"a": ["x"], "b": []}}), "prompts.groups.b"),
    "missing reference": (dict(reference=None), "reference"),
    "reference not a config": (dict(reference="nope"), "reference"),
    "unknown top key": (dict(guidence=5.0), "guidence"),
    "unknown config key": (dict(configs=[{"name": "ref", "stpes": 5}]), "configs[0].stpes"),
    "preset with sampler": (dict(configs=[{"name": "ref", "sampler": "ddim", "steps": "fast"}]), "steps"),
    "bad preset": (dict(configs=[{"name": "ref", "steps": "fastest"}]), "steps"),
    "zero steps": (dict(configs=[{"name": "ref", "steps": 0}]), "steps"),
    "schedule without fastdiff sampler": (dict(configs=[{"name": "ref", "schedule": "karras"}]), "schedule"),
    "step cache unknown option": (
        dict(configs=[{"name": "ref", "step_cache": {"intervall": 3}}]),
        "configs[0].step_cache.intervall",
    ),
    "step cache bad mode": (dict(configs=[{"name": "ref", "step_cache": {"mode": "deep"}}]), "step_cache"),
    "step cache interval 0": (dict(configs=[{"name": "ref", "step_cache": {"interval": 0}}]), "step_cache"),
    "step cache schedule without refresh": (
        dict(configs=[{"name": "ref", "step_cache": {"mode": "schedule"}}]),
        "step_cache",
    ),
    "step cache not a table": (dict(configs=[{"name": "ref", "step_cache": 3}]), "step_cache"),
    "step cache with an engine": (
        dict(configs=[{"name": "ref", "step_cache": {}, "engine": {"backend": "onnxruntime"}}]),
        "step_cache",
    ),
    "step cache in the grid": (dict(grid={"step_cache": [{"interval": -1}]}), "grid.step_cache"),
    "duplicate names": (dict(configs=[{"name": "ref"}, {"name": "ref", "steps": 3}]), "configs"),
    "seeds not ints": (dict(seeds=[0, "1"]), "seeds"),
    "duplicate seeds": (dict(seeds=[1, 1]), "seeds"),
    "nan guidance": (dict(guidance=float("nan")), "guidance"),
    "height not multiple of 8": (dict(height=30), "height"),
    "attributes on free-form prompts": (
        dict(metrics=["attributes"], prompts=["a photo of a cat"]),
        "metrics",
    ),
    "bad tiny variant": (dict(pipeline="fastdiff-tiny:large"), "pipeline"),
    "draft without model": (dict(configs=[{"name": "ref", "draft": {"strength": 0.5}}]), "draft"),
    "no configs": (dict(configs=[], reference=None, metrics=["nfe"]), "configs"),
    "bad save_arrays": (dict(save_arrays="some"), "save_arrays"),
    "negative warmup": (dict(warmup=-1), "warmup"),
    "warmup not an int": (dict(warmup=True), "warmup"),
}


@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
def test_bad_spec_is_rejected_naming_the_key_before_any_model_loads(case, tmp_path):
    over, key = BAD[case]
    _Loads.called = False
    with pytest.raises(SpecError) as e:
        sweep(_spec(**over), tmp_path / "out", progress=False)
    assert key in str(e.value)
    assert not _Loads.called
    assert not (tmp_path / "out").exists()  # nothing written either


def test_step_cache_errors_say_what_is_valid():
    with pytest.raises(SpecError, match=r"valid: mode, interval, branch, refresh"):
        parse_spec(_spec(configs=[{"name": "ref", "step_cache": {"intervall": 3}}]))
    with pytest.raises(SpecError, match=r"interval must be an int >= 1, got 0"):
        parse_spec(_spec(configs=[{"name": "ref", "step_cache": {"interval": 0}}]))
    with pytest.raises(SpecError, match=r"refresh steps must be non-negative ints"):
        parse_spec(_spec(configs=[{"name": "ref", "step_cache": {"mode": "schedule", "refresh": [0, -2]}}]))
    spec = parse_spec(  # a valid policy parses, as given
        _spec(
            configs=[{"name": "ref", "steps": 10, "step_cache": {"mode": "schedule", "refresh": [0, 4, 9]}}]
        )
    )
    assert spec.configs[0].get("step_cache") == {"mode": "schedule", "refresh": [0, 4, 9]}


def test_missing_spec_file_and_unknown_format(tmp_path):
    with pytest.raises(SpecError, match="does not exist"):
        parse_spec(tmp_path / "nope.toml")
    p = tmp_path / "spec.ini"
    p.write_text("x")
    with pytest.raises(SpecError, match=r"\.toml"):
        parse_spec(p)


def test_toml_yaml_and_json_files_give_the_same_spec(tmp_path):
    (tmp_path / "prompts.txt").write_text(
        "a red circle on a blue background\n\na blue square on a red background\n"
    )
    toml = """
pipeline = "fastdiff-tiny"
reference = "ref"
prompts = {file = "prompts.txt"}
seeds = [0, 1]
metrics = ["psnr", "attributes"]
configs = [{name = "ref", steps = 10}, {name = "es", steps = "quality", early_stop = {rtol = 0.05}}]
grid = {sampler = ["ddim", "unipc"], steps = [4, 8]}
"""
    yaml = """
pipeline: fastdiff-tiny
reference: ref
prompts: {file: prompts.txt}
seeds: [0, 1]
metrics: [psnr, attributes]
configs:
  - {name: ref, steps: 10}
  - {name: es, steps: quality, early_stop: {rtol: 0.05}}
grid: {sampler: [ddim, unipc], steps: [4, 8]}
"""
    (tmp_path / "s.toml").write_text(toml)
    (tmp_path / "s.yaml").write_text(yaml)
    a, b = parse_spec(tmp_path / "s.toml"), parse_spec(tmp_path / "s.yaml")
    data = json.loads(json.dumps(a.raw))
    (tmp_path / "s.json").write_text(json.dumps(data))
    c = parse_spec(tmp_path / "s.json")
    for s in (a, b, c):
        assert [p.text for p in s.prompts] == [
            "a red circle on a blue background",
            "a blue square on a red background",
        ]
        assert [cf.name for cf in s.configs] == [
            "ref",
            "es",
            "sampler=ddim steps=4",
            "sampler=ddim steps=8",
            "sampler=unipc steps=4",
            "sampler=unipc steps=8",
        ]
    assert a.configs == b.configs == c.configs


def test_tiny_prompt_generator_and_groups():
    s = parse_spec(
        _spec(
            prompts={
                "groups": {
                    "heldout": {"tiny": "heldout", "limit": 3},
                    "train": {"tiny": "train", "n": 2, "seed": 7},
                }
            }
        )
    )
    assert [p.group for p in s.prompts] == ["heldout"] * 3 + ["train"] * 2
    assert [p.index for p in s.prompts] == [0, 1, 2, 0, 1]
    from fastdiff.tiny import data as D

    assert [p.text for p in s.prompts[3:]] == [
        a.prompt for a in D.sample_attributes(2, seed=7, split="train")
    ]


def test_readme_example_spec_is_valid_and_cli_check_plans_it(tmp_path, capsys):
    """The README's sweep example parses, and ``fastdiff sweep --check`` plans it without loading a model."""
    import re
    from pathlib import Path

    from fastdiff.cli import main

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    section = readme.split("### Sweeps (`fastdiff sweep`)", 1)[1]
    toml = re.search(r"```toml\n(.*?)```", section, re.S).group(1)
    (tmp_path / "sweep.toml").write_text(toml)
    spec = parse_spec(tmp_path / "sweep.toml")
    assert len(spec.configs) == 4 + 4 and len(spec.prompts) == 12
    assert spec.config("dpm 30 cached").get("step_cache") == {"interval": 3}
    assert main(["sweep", str(tmp_path / "sweep.toml"), "--check", "--out", str(tmp_path / "o")]) == 0
    assert "8 configurations x 12 prompts x 2 seeds = 192 items" in capsys.readouterr().out
    assert not (tmp_path / "o").exists()


def test_cli_reports_a_bad_spec_file_without_a_traceback(tmp_path, capsys):
    from fastdiff.cli import main

    (tmp_path / "bad.json").write_text(
        json.dumps({"pipeline": "fastdiff-tiny", "prompts": [], "configs": [{}]})
    )
    assert main(["sweep", str(tmp_path / "bad.json")]) == 2
    assert "spec['prompts']" in capsys.readouterr().err


@pytest.mark.parametrize("only", [[], ["nonexistent"]])
def test_demo_only_rejects_empty_and_unknown_names_before_generating(only, capsys):
    from fastdiff.cli import main

    with pytest.raises(SystemExit) as e:
        main(["demo", "--only", *only])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--only" in err and "baseline" in err  # names the valid configurations
