"""Controllers decide, per sample, when a sampling run has done enough work.

The protocol is :class:`fastdiff.dynamic.Controller` (:mod:`fastdiff.dynamic.protocols`): ``reset(batch_size)``
before the first step, then ``decide(...) -> Decision`` after every step of a row (its default asks
``should_stop(row, steps_done, num_steps, x0_change, sigma) -> bool``).

* :class:`EarlyStop`: a converged row returns its current x0 prediction and leaves the batch.
* :class:`FastForward`: a converged row finishes with one or two large solver steps to sigma = 0 instead
  (a ``jump`` decision); measured against fixed schedules in ``benchmarks/results/step_control.md``.
"""

from __future__ import annotations

import math

from fastdiff._checks import is_number
from fastdiff.dynamic.checks import check_positive_int
from fastdiff.dynamic.protocols import Controller, Decision

__all__ = ["Controller", "EarlyStop", "FastForward"]


class EarlyStop(Controller):
    """Stop a sample once its x0 prediction has converged.

    The x0 prediction of a deterministic sampler moves a lot while the noise level is high and settles as
    sigma falls; once it changes by less than ``rtol`` (relative, L2) for ``patience`` consecutive steps,
    later steps only polish details. The row then returns that x0.

    Args:
        rtol: relative-change threshold, e.g. 0.01 = 1 %.
        patience: consecutive steps below ``rtol`` required.
        min_steps: never stop before this many steps of the row's schedule have run.
        max_sigma: only steps at noise level (VE sigma = sigma_t / alpha_t) <= ``max_sigma`` count as calm,
            so a row stops after ``patience`` calm steps *below* it. At high noise the x0 prediction sits
            near the data mean and can stall, which would pass for convergence. Default 1.0; None
            disables the guard. Measured effects are in ``benchmarks/results/step_control.md``.
    """

    def __init__(
        self, rtol: float = 0.01, patience: int = 2, min_steps: int = 5, max_sigma: float | None = 1.0
    ):
        if not (is_number(rtol) and rtol > 0 and math.isfinite(rtol)):
            raise ValueError(f"EarlyStop rtol must be a positive finite number, got {rtol!r}")
        check_positive_int("EarlyStop patience", patience)
        check_positive_int("EarlyStop min_steps", min_steps)
        if max_sigma is not None and not (isinstance(max_sigma, (int, float)) and max_sigma > 0):
            raise ValueError(f"EarlyStop max_sigma must be a positive number or None, got {max_sigma!r}")
        self.rtol = float(rtol)
        self.patience = patience
        self.min_steps = min_steps
        self.max_sigma = None if max_sigma is None else float(max_sigma)
        self._calm: list[int] = []

    @classmethod
    def coerce(cls, value) -> EarlyStop | None:
        """Accept the forms a pipeline's ``early_stop=`` takes: bool, dict of options or an EarlyStop.

        A dict with ``jumps`` gives a :class:`FastForward` (so sweep specs, which hold only plain values,
        can run it too); without it an EarlyStop."""
        if value is None or value is False:
            return None
        if value is True:
            return cls()
        if isinstance(value, cls):
            return value
        if isinstance(value, dict):
            unknown = set(value) - {"rtol", "patience", "min_steps", "max_sigma", "jumps"}
            if unknown:
                raise ValueError(
                    f"unknown early_stop options {sorted(unknown)}; valid: rtol, patience, min_steps, "
                    "max_sigma, and jumps (FastForward)"
                )
            return FastForward(**value) if "jumps" in value else cls(**value)
        raise TypeError(
            f"early_stop must be a bool, a dict of EarlyStop options or an EarlyStop, got {value!r}"
        )

    def reset(self, batch_size: int) -> None:
        self._calm = [0] * batch_size

    def should_stop(
        self, row: int, steps_done: int, num_steps: int, x0_change: float, sigma: float = 0.0
    ) -> bool:
        if self.max_sigma is not None and sigma > self.max_sigma:
            self._calm[row] = 0  # high-noise steps never count towards patience (#12)
            return False
        if math.isnan(x0_change) or x0_change >= self.rtol:
            self._calm[row] = 0
            return False
        self._calm[row] += 1
        # stopping on the very last step saves nothing and would return x0 instead of the final sample
        return self._calm[row] >= self.patience and steps_done >= self.min_steps and steps_done < num_steps

    def __repr__(self) -> str:
        return (
            f"EarlyStop(rtol={self.rtol}, patience={self.patience}, min_steps={self.min_steps}, "
            f"max_sigma={self.max_sigma})"
        )


class FastForward(EarlyStop):
    """On convergence, replace the rest of a row's schedule by ``jumps`` large solver steps to sigma = 0.

    Convergence is :class:`EarlyStop`'s criterion (same arguments, same sigma guard). Returning x0 at
    sigma ~ 1 is not a finished image; here the row keeps its state and solver history and continues on
    the tail ``sigma_cur -> ... -> sigma_end -> 0``: ``jumps`` steps (each one model evaluation) spaced
    geometrically from its current noise level to ``sigma_end``, the last non-zero level of its own schedule,
    then the schedule's usual final step to 0. ``jumps=1`` is a single step to 0 (the x0 prediction at the
    current level); ``jumps=2`` is ``sigma_cur -> sigma_end -> 0``. A row whose schedule has no more than
    ``jumps`` steps left continues unchanged. Needs a reschedulable scheduler (``make_scheduler``'s).
    """

    reschedules = True  # sample() checks the scheduler can jump before the first model evaluation

    def __init__(
        self,
        rtol: float = 0.01,
        patience: int = 2,
        min_steps: int = 5,
        max_sigma: float | None = 1.0,
        jumps: int = 2,
    ):
        super().__init__(rtol=rtol, patience=patience, min_steps=min_steps, max_sigma=max_sigma)
        check_positive_int("FastForward jumps", jumps)
        self.jumps = jumps

    def decide(self, row, steps_done, num_steps, x0_change, sigma, sigmas_ahead) -> Decision:
        if not self.should_stop(row, steps_done, num_steps, x0_change, sigma=sigma):
            return Decision.go_on()
        if sigmas_ahead is None:
            raise TypeError(
                "FastForward needs a scheduler whose remaining schedule can be replaced "
                "(fastdiff.dynamic.adapters.Reschedulable), e.g. fastdiff.samplers.make_scheduler(...)"
            )
        if len(sigmas_ahead) - 1 <= self.jumps:
            return Decision.go_on()  # no shorter finish exists
        return Decision.jump(jump_tail(sigmas_ahead, self.jumps))

    def __repr__(self) -> str:
        return super().__repr__()[:-1].replace("EarlyStop", "FastForward") + f", jumps={self.jumps})"


def jump_tail(sigmas_ahead, jumps: int) -> tuple[float, ...]:
    """The levels after ``sigmas_ahead[0]`` of a ``jumps``-step finish: geometric from the current level
    to the last non-zero one, then 0 (the current level's own evaluation is the first of the steps)."""
    cur, end = float(sigmas_ahead[0]), float(sigmas_ahead[-2])
    inner = [cur * (end / cur) ** (k / (jumps - 1)) for k in range(1, jumps)] if jumps > 1 else []
    return (*inner, 0.0)
