"""A sweep's specification: parsed and validated completely before any model loads.

A spec is a dict (or a TOML / YAML / JSON file holding one)::

    pipeline = "fastdiff-tiny"            # a path, "fastdiff-tiny[:lcm]", "package.module:factory", or a callable
    reference = "dpm 30"                  # configuration the fidelity metrics compare against
    prompts = {tiny = "heldout"}          # a list, {file = "prompts.txt"}, {tiny = split, n = 24, seed = 1},
                                          # or {groups = {name = <one of those>, ...}}
    seeds = [0, 1]                        # every prompt with every seed (seed_per_prompt: seed + prompt index)
    guidance = 5.0
    metrics = ["psnr", "ssim", "attributes", "nfe", "unet_s", "wall_s", "peak_mem"]
    warmup = 1                            # untimed calls of each configuration's first batch before timing
                                          # (default 1 when wall_s or unet_s is measured, else 0)
    configs = [{name = "dpm 30", sampler = "dpmpp_2m", steps = 30}, ...]
    grid = {sampler = ["ddim", "unipc"], steps = [5, 10]}   # optional: the product, named automatically

A configuration may set ``optimize`` (``fastdiff.optimize`` options), ``step_cache`` (``fastdiff.step_cache``
options, e.g. ``{mode = "uniform", interval = 3}``; installed after ``optimize``) or ``engine``
(``fastdiff.compile_engine`` options; not with ``step_cache``).

Every error names the key, the value received and what is valid. (Every rule lives in this one module, the
reason it is a little longer than most.)
"""

from __future__ import annotations

import copy
import itertools
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from fastdiff._checks import is_int, is_number
from fastdiff.sweep.prompts import Prompt, SpecError, _err, prompts_of

METRICS = ("psnr", "ssim", "attributes", "nfe", "unet_s", "wall_s", "peak_mem")
FIDELITY_METRICS = ("psnr", "ssim")
PRESETS = ("fast", "balanced", "quality", "auto")
CONFIG_KEYS = (
    "name",
    "pipeline",
    "sampler",
    "schedule",
    "sampler_options",
    "steps",
    "early_stop",
    "draft",
    "guidance",
    "optimize",
    "step_cache",
    "engine",
)
TOP_KEYS = (
    "pipeline",
    "configs",
    "grid",
    "reference",
    "prompts",
    "seeds",
    "seed_per_prompt",
    "guidance",
    "negative_prompt",
    "height",
    "width",
    "metrics",
    "batch_size",
    "save_arrays",
    "device",
    "dtype",
    "embedding_cache",
    "warmup",
)
TIMING_METRICS = ("wall_s", "unet_s")
SAVE_ARRAYS = ("reference", "all", "none")
DTYPES = ("float32", "float16", "bfloat16")


@dataclass(frozen=True)
class Config:
    """One point of the grid: how to set up the pipeline and call it."""

    name: str
    options: dict  # every key of CONFIG_KEYS except name that the spec set

    def get(self, key, default=None):
        return self.options.get(key, default)


@dataclass
class Spec:
    pipeline: object
    configs: list[Config]
    prompts: list[Prompt]
    seeds: list[int]
    seed_per_prompt: bool = False
    reference: str | None = None
    guidance: float = 7.5
    negative_prompt: str | None = None
    height: int | None = None
    width: int | None = None
    metrics: tuple[str, ...] = ("nfe", "wall_s")
    batch_size: int = 8
    save_arrays: str = "reference"
    device: str = "auto"
    dtype: str = "float32"
    embedding_cache: bool = True
    warmup: int = 1  # untimed calls per configuration and process (default: 1 with a timing metric, else 0)
    raw: dict = field(
        default_factory=dict, repr=False
    )  # the canonical, JSON-able spec recorded in the folder

    def config(self, name: str) -> Config:
        return next(c for c in self.configs if c.name == name)


def load_spec_file(path: str | os.PathLike) -> dict:
    """Read a spec from TOML (``tomllib``), YAML (PyYAML, which transformers already requires) or JSON."""
    path = Path(path)
    if not path.is_file():
        raise SpecError(f"spec file {str(path)!r} does not exist")
    suffix = path.suffix.lower()
    if suffix == ".toml":
        try:
            import tomllib
        except ModuleNotFoundError:  # Python 3.10
            raise SpecError("TOML specs need Python >= 3.11 (tomllib); use YAML or JSON") from None
        with open(path, "rb") as f:
            data = tomllib.load(f)
    elif suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ModuleNotFoundError:
            raise SpecError("YAML specs need PyYAML (pip install pyyaml); or use TOML or JSON") from None
        data = yaml.safe_load(path.read_text())
    elif suffix == ".json":
        data = json.loads(path.read_text())
    else:
        raise SpecError(f"spec file {str(path)!r}: expected .toml, .yaml, .yml or .json")
    if not isinstance(data, dict):
        raise SpecError(f"spec file {str(path)!r} must hold a table/mapping, got {type(data).__name__}")
    base = path.parent
    prompts = data.get("prompts")  # a prompts file is relative to the spec file
    if isinstance(prompts, dict) and isinstance(prompts.get("file"), str):
        prompts["file"] = str((base / prompts["file"]).resolve())
    return data


def _pipeline_name(p, key: str) -> str | Callable:
    if callable(p):
        return p
    if not isinstance(p, str) or not p:
        raise _err(
            key, p, "expected a path, 'fastdiff-tiny', 'fastdiff-tiny:lcm', 'module:factory' or a callable"
        )
    if p.startswith("fastdiff-tiny") and p not in (
        "fastdiff-tiny",
        "fastdiff-tiny:base",
        "fastdiff-tiny:lcm",
    ):
        raise _err(key, p, "fastdiff-tiny variants are 'fastdiff-tiny' (base) and 'fastdiff-tiny:lcm'")
    return p


def _check_sampler(value, key: str) -> None:
    if value is None or value == "default":
        return
    if not isinstance(value, str):
        raise _err(key, value, "expected a sampler name")
    if value.startswith("diffusers:"):
        import diffusers

        cls = getattr(diffusers, value.split(":", 1)[1], None)
        if not (isinstance(cls, type) and issubclass(cls, diffusers.SchedulerMixin)):
            raise _err(key, value, "'diffusers:<SchedulerClass>' must name a diffusers scheduler class")
        return
    from fastdiff.samplers import SAMPLERS

    if value not in SAMPLERS:
        raise _err(
            key, value, f"valid: {', '.join(SAMPLERS)}, 'default' (the pipeline's own) or 'diffusers:<Class>'"
        )


def _check_steps(value, key: str, sampler) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise _err(key, value, f"expected an int >= 1 or one of {PRESETS}")
    if isinstance(value, int) and not 1 <= value <= 1000:
        raise _err(key, value, "step counts must be in 1..1000")
    if isinstance(value, str):
        if value not in PRESETS:
            raise _err(key, value, f"expected an int >= 1 or one of {PRESETS}")
        if sampler not in (None, "default"):
            raise _err(
                key, value, "presets run fastdiff's default sampler (dpmpp_2m); give an int with 'sampler'"
            )


def _check_config(options: dict, key: str) -> None:
    unknown = sorted(set(options) - set(CONFIG_KEYS))
    if unknown:
        raise _err(
            f"{key}.{unknown[0]}", options[unknown[0]], f"unknown key; valid: {', '.join(CONFIG_KEYS)}"
        )
    sampler = options.get("sampler")
    _check_sampler(sampler, f"{key}.sampler")
    if "steps" in options:
        _check_steps(options["steps"], f"{key}.steps", sampler)
    if ("schedule" in options or "sampler_options" in options) and (
        sampler is None or sampler == "default" or sampler.startswith("diffusers:")
    ):
        raise _err(
            f"{key}.schedule", options.get("schedule"), "schedule/sampler_options need a fastdiff sampler"
        )
    if "sampler_options" in options and not isinstance(options["sampler_options"], dict):
        raise _err(
            f"{key}.sampler_options", options["sampler_options"], "expected a table of make_scheduler options"
        )
    es = options.get("early_stop")
    if es is not None and not isinstance(es, (bool, dict)):
        raise _err(
            f"{key}.early_stop",
            es,
            "expected true/false or a table of EarlyStop options (with jumps: FastForward)",
        )
    draft = options.get("draft")
    if draft is not None:
        if not isinstance(draft, dict) or "model" not in draft:
            raise _err(
                f"{key}.draft", draft, "expected a table with 'model' (a pipeline name) and strength/steps"
            )
        _pipeline_name(draft["model"], f"{key}.draft.model")
    for k in ("optimize", "engine", "step_cache"):
        if k in options and not isinstance(options[k], dict):
            raise _err(f"{key}.{k}", options[k], "expected a table of options")
    if "step_cache" in options:
        _check_step_cache(options, key)
    if "guidance" in options:
        _check_guidance(options["guidance"], f"{key}.guidance")
    if "pipeline" in options:
        _pipeline_name(options["pipeline"], f"{key}.pipeline")


def _check_step_cache(options: dict, key: str) -> None:
    """``fastdiff.step_cache`` keywords; what depends on the U-Net (``branch``'s range, ``gate_step`` on a
    U-Net without cross-attention) is checked when the configuration is set up."""
    from fastdiff.caching.cache import POLICY_OPTIONS, check_policy

    opts, key = options["step_cache"], f"{key}.step_cache"
    for k, v in opts.items():
        if k not in ("mode", *POLICY_OPTIONS):
            raise _err(
                f"{key}.{k}", v, f"unknown step_cache option; valid: mode, {', '.join(POLICY_OPTIONS)}"
            )
    if "engine" in options:
        raise _err(
            key,
            opts,
            "a step cache replays the diffusers U-Net's own blocks, which an engine replaces: use one or the other",
        )
    try:
        check_policy(**opts)
    except (TypeError, ValueError) as e:
        raise _err(key, opts, str(e)) from None


def _check_guidance(g, key: str) -> None:
    if not is_number(g) or g != g or g < 0:
        raise _err(key, g, "expected a finite number >= 0 (<= 1 disables classifier-free guidance)")


def _auto_name(options: dict) -> str:
    return " ".join(
        f"{k}={json.dumps(v, sort_keys=True) if isinstance(v, dict) else v}" for k, v in options.items()
    )


def _configs(data: dict) -> list[Config]:
    entries = data.get("configs", [])
    if not isinstance(entries, list):
        raise _err("configs", entries, "expected a list of tables")
    out = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise _err(f"configs[{i}]", entry, "expected a table")
        options = {k: v for k, v in entry.items() if k != "name"}
        _check_config(entry, f"configs[{i}]")
        out.append(Config(str(entry.get("name") or _auto_name(options)), options))
    grid = data.get("grid")
    if grid is not None:
        if not isinstance(grid, dict) or not grid:
            raise _err("grid", grid, "expected a non-empty table of lists")
        for k, v in grid.items():
            if not isinstance(v, list) or not v:
                raise _err(f"grid.{k}", v, "expected a non-empty list")
        keys = list(grid)
        for values in itertools.product(*(grid[k] for k in keys)):
            options = dict(zip(keys, values))
            _check_config(options, "grid")
            out.append(Config(_auto_name(options), options))
    if not out:
        raise _err("configs", entries, "the sweep needs at least one configuration ('configs' or 'grid')")
    names = [c.name for c in out]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise _err("configs", dupes, "configuration names must be unique")
    for c in out:
        if "/" in c.name or c.name.startswith("."):
            raise _err("configs.name", c.name, "names may not contain '/' or start with '.'")
    return out


def parse_spec(spec: dict | str | os.PathLike) -> Spec:
    """Validate a spec (dict or file path) and return it parsed. Loads no model."""
    if isinstance(spec, (str, os.PathLike)):
        data = load_spec_file(spec)
    elif isinstance(spec, dict):
        data = copy.deepcopy(spec)
    else:
        raise SpecError(f"spec must be a dict or a path to a TOML/YAML/JSON file, got {type(spec).__name__}")
    unknown = sorted(set(data) - set(TOP_KEYS))
    if unknown:
        raise _err(unknown[0], data[unknown[0]], f"unknown key; valid: {', '.join(TOP_KEYS)}")
    if "pipeline" not in data:
        raise _err("pipeline", None, "the sweep needs a pipeline")
    pipeline = _pipeline_name(data["pipeline"], "pipeline")
    configs = _configs(data)
    prompts = prompts_of(data)
    seeds = data.get("seeds", [0])
    if is_int(seeds):
        seeds = [seeds]
    if not isinstance(seeds, list) or not seeds or not all(is_int(s) for s in seeds):
        raise _err("seeds", seeds, "expected a non-empty list of integers")
    if len(set(seeds)) != len(seeds):
        raise _err("seeds", seeds, "seeds must be distinct")
    metrics = data.get("metrics", ["nfe", "wall_s"])
    if not isinstance(metrics, list):
        raise _err("metrics", metrics, f"expected a list from {', '.join(METRICS)}")
    for m in metrics:
        if m not in METRICS:
            raise _err("metrics", m, f"unknown metric; valid: {', '.join(METRICS)}")
    reference = data.get("reference")
    if reference is not None and reference not in [c.name for c in configs]:
        raise _err("reference", reference, f"no configuration of that name; have {[c.name for c in configs]}")
    if any(m in FIDELITY_METRICS for m in metrics) and reference is None:
        raise _err("reference", None, "psnr/ssim compare against a reference: name one of the configurations")
    if "attributes" in metrics:
        from fastdiff.tiny.data import parse_prompt

        for p in prompts:
            try:
                parse_prompt(p.text)
            except ValueError as e:
                raise _err(
                    "metrics", "attributes", f"the attribute checker reads fastdiff-tiny prompts only: {e}"
                ) from None
    guidance = data.get("guidance", 7.5)
    _check_guidance(guidance, "guidance")
    for k in ("height", "width"):
        v = data.get(k)
        if v is not None and (not is_int(v) or v < 8 or v % 8):
            raise _err(k, v, "expected a multiple of 8, >= 8 (or leave it out for the model's default)")
    batch_size = data.get("batch_size", 8)
    if not is_int(batch_size) or batch_size < 1:
        raise _err("batch_size", batch_size, "expected an int >= 1")
    save_arrays = data.get("save_arrays", "reference")
    if save_arrays not in SAVE_ARRAYS:
        raise _err("save_arrays", save_arrays, f"valid: {', '.join(SAVE_ARRAYS)}")
    dtype = data.get("dtype", "float32")
    if dtype not in DTYPES:
        raise _err("dtype", dtype, f"valid: {', '.join(DTYPES)}")
    device = data.get("device", "auto")
    if not isinstance(device, str):
        raise _err("device", device, "expected 'auto', 'cpu', 'cuda' or a torch device string")
    neg = data.get("negative_prompt")
    if neg is not None and not isinstance(neg, str):
        raise _err("negative_prompt", neg, "expected a string")
    if not isinstance(data.get("embedding_cache", True), bool):
        raise _err("embedding_cache", data["embedding_cache"], "expected true or false")
    warmup = data.get("warmup", 1 if any(m in TIMING_METRICS for m in metrics) else 0)
    if not is_int(warmup) or warmup < 0:
        raise _err(
            "warmup", warmup, "expected an int >= 0 (untimed calls of each configuration's first batch)"
        )
    if not isinstance(data.get("seed_per_prompt", False), bool):
        raise _err("seed_per_prompt", data["seed_per_prompt"], "expected true or false")
    return Spec(
        pipeline=pipeline,
        configs=configs,
        prompts=prompts,
        seeds=seeds,
        seed_per_prompt=data.get("seed_per_prompt", False),
        reference=reference,
        guidance=float(guidance),
        negative_prompt=neg,
        height=data.get("height"),
        width=data.get("width"),
        metrics=tuple(metrics),
        batch_size=batch_size,
        save_arrays=save_arrays,
        device=device,
        dtype=dtype,
        embedding_cache=data.get("embedding_cache", True),
        warmup=warmup,
        raw=canonical(data),
    )


def canonical(data):
    """A JSON-able copy of the spec; callables become ``module:qualname``."""
    if callable(data):
        return f"{getattr(data, '__module__', '?')}:{getattr(data, '__qualname__', repr(data))}"
    if isinstance(data, dict):
        return {str(k): canonical(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [canonical(v) for v in data]
    return data


__all__ = ["Config", "METRICS", "Prompt", "Spec", "SpecError", "canonical", "load_spec_file", "parse_spec"]
