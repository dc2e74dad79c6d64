"""Choose a step count per sample: ``steps="auto"``.

A planner runs a short probe (the first ``probe_steps`` steps of the ``min_steps`` schedule) and looks the
image up in a calibrated table (:mod:`fastdiff.dynamic.auto_steps_table`, written by
``benchmarks/dynamic_steps.py --phase calibrate`` from the shipped fastdiff-tiny weights and train-split
prompts). The table names its ``signal``:

* ``"hf_energy"``: the share of the probe's x0 spectral energy above half the Nyquist frequency;
* ``"x0_contrast"``: the spatial standard deviation of the probe's x0 (times the table's ``sign``);
* ``"tier"``: the prompt's keyword tier alone ("sketch, flat, minimalist, plain, simple" against "detailed,
  intricate, 4k, textured, striped, checkered, noisy").

A signal is kept only if it predicts the steps an image needs (Spearman correlation with the fewest steps
reaching the fidelity target against its reference (the table's ``meta``), :mod:`fastdiff.dynamic.step_calibration`). On
fastdiff-tiny none did on held-out prompts (``benchmarks/results/dynamic_steps.md``), so the committed table
gives every image one count: the steps that brought every calibration image to the target. The probe's
steps are not wasted when the shortest schedule is chosen (the run simply continues), and when the chosen
schedule starts at the same timestep the first evaluation is reused (with a one-step probe: nothing lost).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Sequence

import torch

from fastdiff.dynamic.checks import check_positive_int
from fastdiff.dynamic.protocols import StepChoice, StepPlanner

__all__ = [
    "AutoSteps",
    "StepChoice",
    "SIMPLE_WORDS",
    "DETAILED_WORDS",
    "prompt_tier",
    "high_frequency_energy",
    "x0_contrast",
]

SIMPLE_WORDS = ("sketch", "flat", "minimalist", "plain", "simple")
DETAILED_WORDS = ("detailed", "intricate", "4k", "textured", "striped", "checkered", "noisy")
# what a table's bins are keyed on; "tier": one bin per tier, x0 unused
SIGNALS = ("hf_energy", "x0_contrast", "tier")


def prompt_tier(prompt: str | None) -> tuple[str, list[str]]:
    """("simple" | "neutral" | "detailed", matched keywords). Detail words win over simplicity words."""
    if prompt is None:
        return "neutral", []
    if not isinstance(prompt, str):
        raise TypeError(f"prompt must be a str or None, got {type(prompt).__name__}")
    words = set(re.findall(r"[a-z0-9]+", prompt.lower()))
    detailed = [w for w in DETAILED_WORDS if w in words]
    if detailed:
        return "detailed", detailed
    simple = [w for w in SIMPLE_WORDS if w in words]
    if simple:
        return "simple", simple
    return "neutral", []


def high_frequency_energy(x0: torch.Tensor, cutoff: float = 0.25) -> torch.Tensor:
    """Per-row share of spectral energy at radial frequency above ``cutoff`` cycles/pixel (Nyquist = 0.5).

    x0: (B, C, H, W). The per-channel mean is removed first so the share measures texture, not brightness.
    """
    if x0.ndim != 4:
        raise ValueError(f"high_frequency_energy expects (B, C, H, W), got shape {tuple(x0.shape)}")
    x = x0.double()
    x = x - x.mean(dim=(-2, -1), keepdim=True)
    power = torch.fft.fft2(x).abs().square().sum(dim=1)  # (B, H, W)
    fy = torch.fft.fftfreq(x.shape[-2], dtype=torch.float64, device=x.device)
    fx = torch.fft.fftfreq(x.shape[-1], dtype=torch.float64, device=x.device)
    radius = (fy[:, None].square() + fx[None, :].square()).sqrt()
    high = power[:, radius > cutoff].sum(dim=-1)
    total = power.flatten(1).sum(dim=-1).clamp_min(1e-30)
    return (high / total).float()


def x0_contrast(x0: torch.Tensor) -> torch.Tensor:
    """Per-row spatial standard deviation of the x0 prediction (mean over channels). x0: (B, C, H, W).

    An early x0 prediction that is still undecided is a blend of the images it could become (low contrast);
    one that has committed to a composition early shows it (high contrast). Which of the two needs more steps
    is measured, not assumed: a table stores the ``sign`` its calibration found.
    """
    if x0.ndim != 4:
        raise ValueError(f"x0_contrast expects (B, C, H, W), got shape {tuple(x0.shape)}")
    return x0.double().flatten(2).std(dim=-1).mean(dim=1).float()


def _default_table() -> dict:
    from fastdiff.dynamic.auto_steps_table import TABLE

    return TABLE


class AutoSteps(StepPlanner):
    """Per-sample step count from prompt keywords and a probe of the x0 prediction (a :class:`StepPlanner`).

    Args:
        prompts: one prompt per row (or one for all rows); None means "neutral".
        min_steps, max_steps: the budget range; choices are clamped into it.
        probe_steps: steps of the ``min_steps`` schedule run before deciding; None: the table's
            ``probe_steps`` (2 if it has none).
        table: calibration table (see :mod:`fastdiff.dynamic.auto_steps_table`); default: the committed one.
    """

    def __init__(
        self,
        prompts: str | Sequence[str | None] | None = None,
        *,
        min_steps: int = 8,
        max_steps: int = 30,
        probe_steps: int | None = None,
        table: dict | None = None,
    ):
        table = table if table is not None else _default_table()
        signal = table.get("signal", "hf_energy")
        if signal not in SIGNALS:
            raise ValueError(f"AutoSteps table signal must be one of {SIGNALS}, got {signal!r}")
        if table.get("sign", 1) not in (1, -1):
            raise ValueError(f"AutoSteps table sign must be 1 or -1, got {table.get('sign')!r}")
        if probe_steps is None:
            probe_steps = int(table.get("probe_steps", 2))
        for name, v in (("min_steps", min_steps), ("max_steps", max_steps), ("probe_steps", probe_steps)):
            check_positive_int(f"AutoSteps {name}", v)
        if min_steps > max_steps:
            raise ValueError(f"AutoSteps min_steps ({min_steps}) must not exceed max_steps ({max_steps})")
        if probe_steps > min_steps:
            raise ValueError(f"AutoSteps probe_steps ({probe_steps}) must not exceed min_steps ({min_steps})")
        self.prompts = prompts
        self.min_steps = min_steps
        self.max_steps = max_steps
        self.probe_steps = probe_steps
        self.table = table
        self.signal = signal
        self.sign = table.get("sign", 1)

    @property
    def probe_schedule(self) -> int:
        """Length of the schedule whose first steps serve as the probe."""
        return self.min_steps

    def with_prompts(self, prompts) -> AutoSteps:
        """The same planner for other prompts."""
        planner = copy.copy(self)
        planner.prompts = prompts
        return planner

    def _prompt_for(self, row: int, batch: int):
        p = self.prompts
        if p is None or isinstance(p, str):
            return p
        if len(p) == batch:
            return p[row]
        if batch % len(p) == 0:  # num_images_per_prompt copies, laid out prompt-major like diffusers
            return p[row // (batch // len(p))]
        raise ValueError(f"AutoSteps got {len(p)} prompts for a batch of {batch}")

    def steps_for(self, tier: str, hf_energy: float) -> tuple[int, str]:
        """Look up (steps, rule) for a tier and probe energy in the table (a "tier" table ignores the energy)."""
        rows = self.table["tiers"].get(tier) or self.table["tiers"]["neutral"]
        if self.signal == "tier":
            return int(rows[-1][1]), f"table[{tier}] -> {rows[-1][1]}"
        for upper, steps in rows:
            if hf_energy <= upper:
                return int(steps), f"table[{tier}]: energy <= {upper:.4g} -> {steps}"
        upper, steps = rows[-1]
        return int(steps), f"table[{tier}]: energy above all bins -> {steps}"

    def choose(self, x0_probe: torch.Tensor) -> list[StepChoice]:
        """Pick a step count for every row of a probe's x0 prediction."""
        batch = x0_probe.shape[0]
        # a "tier" table does not read the probe; its choices still report the high-frequency energy
        measure = x0_contrast if self.signal == "x0_contrast" else high_frequency_energy
        energy = self.sign * measure(x0_probe)
        choices = []
        for r in range(batch):
            tier, words = prompt_tier(self._prompt_for(r, batch))
            e = float(energy[r])
            raw, rule = self.steps_for(tier, e)
            steps = max(self.min_steps, min(self.max_steps, raw))
            matched = f" (matched {', '.join(words)})" if words else ""
            label = {"hf_energy": "high-frequency energy", "x0_contrast": "x0 contrast"}.get(self.signal)
            sign = "-" if self.sign < 0 else ""
            probe = "" if self.signal == "tier" else f", probe {sign}{label} {e:.4f}"
            reason = (
                f"auto: prompt tier '{tier}'{matched}{probe} after {self.probe_steps} step(s); {rule}; "
                f"clamped to [{self.min_steps}, {self.max_steps}] -> {steps}"
            )
            choices.append(StepChoice(steps=steps, tier=tier, keywords=words, hf_energy=e, reason=reason))
        return choices

    def __repr__(self) -> str:
        return f"AutoSteps(min_steps={self.min_steps}, max_steps={self.max_steps}, probe_steps={self.probe_steps})"
