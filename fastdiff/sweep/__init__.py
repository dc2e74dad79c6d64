"""Quality/speed sweeps that scale out: ``fastdiff.sweep.sweep(spec, out_dir)`` and ``fastdiff sweep SPEC``.

A spec (see :mod:`fastdiff.sweep.spec`) names a pipeline, a grid of configurations, prompts, seeds and
metrics. Work items (configuration, prompt, seed) are split across processes with accelerate, so the
same call runs under ``python``, ``torchrun --nproc_per_node N`` and ``accelerate launch --multi_gpu``;
each finished item is written atomically and a re-run skips it (:mod:`fastdiff.sweep.store`); text
embeddings are computed once per prompt per process (:mod:`fastdiff.sweep.embeddings`); the results
are collated into CSV/JSON/markdown, a Pareto plot and an image grid (:mod:`fastdiff.sweep.collate`).

Where to add things: a metric -> ``spec.METRICS`` and ``runner.run_chunk``; a configuration option ->
``spec.CONFIG_KEYS`` and ``setup.configured``; a pipeline family -> ``setup.wrap`` and an
``embeddings.PromptEncoder``.
"""

from __future__ import annotations

import sys
import types

from fastdiff.sweep.collate import SweepResult, collate
from fastdiff.sweep.embeddings import PromptEncoder
from fastdiff.sweep.setup import SweepPipeline
from fastdiff.sweep.spec import METRICS, Spec, SpecError, load_spec_file, parse_spec


def sweep(
    spec, out_dir, *, extend: bool = False, progress: bool = True, collate: bool = True
) -> SweepResult | None:
    """Run (or resume) the sweep ``spec`` into ``out_dir``.

    Args:
        spec: a dict, or the path of a TOML / YAML / JSON file holding one.
        out_dir: the output folder. Finished items found there are skipped; a folder holding a
            different spec is refused unless ``extend=True`` (which allows added configurations,
            prompts and seeds, never a changed one).
        progress: a tqdm bar per process.
        collate: write the tables, plot and grid when done (main process).

    Returns:
        The :class:`SweepResult` on the main process (None on the others, or with ``collate=False``).
    """
    from fastdiff.sweep.runner import run

    return run(spec, out_dir, extend=extend, progress=progress, collate=collate)


class _CallableModule(types.ModuleType):
    """``fastdiff.sweep(spec, out_dir)`` calls :func:`sweep`, while ``fastdiff.sweep.collate`` etc. stay
    reachable: the package and the function share a name, as the issue and the CLI spell it."""

    def __call__(self, spec, out_dir, **kwargs):
        return sweep(spec, out_dir, **kwargs)


sys.modules[__name__].__class__ = _CallableModule

__all__ = [
    "METRICS",
    "PromptEncoder",
    "Spec",
    "SpecError",
    "SweepPipeline",
    "SweepResult",
    "collate",
    "load_spec_file",
    "parse_spec",
    "sweep",
]
