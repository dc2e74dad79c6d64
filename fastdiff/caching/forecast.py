"""Feature forecasting: on a cached step, extrapolate the cached feature from the last full evaluations.

Plain reuse (DeepCache, Ma et al. 2024; FORA, Selvaraju et al. 2024) returns the feature of the last full
step ``f(s1)`` unchanged on every cached step ``s``. TaylorSeer (Liu et al. 2025, "From Reusing to
Forecasting", Sec. 3.3) observes that deep features move smoothly along the sampling trajectory and
predicts them with a Taylor expansion whose derivatives are finite differences of the last full
evaluations. Here the same idea is written as polynomial extrapolation through the last ``order + 1``
full evaluations ``(s_j, f_j)`` in Lagrange form, which also holds when the refresh steps are not evenly
spaced (a planned schedule)::

    f(s) ~= sum_j L_j(s) f_j,    L_j(s) = prod_{i != j} (s - s_i) / (s_j - s_i)

First order (``"linear"``) is ``f1 + (f1 - f0) (s - s1) / (s1 - s0)``. ``strength`` ``lam`` blends the
forecast with plain reuse, ``lam * forecast + (1 - lam) * f1`` (for ``"linear"``: the extrapolated change
scaled by ``lam``). The position ``s`` is the
run-relative step index (``axis="step"``, TaylorSeer's choice) or the U-Net's timestep
(``axis="timestep"``); on evenly spaced timesteps the two give the same forecast.

Only the cache's *entry* feature is forecast (the output of the last replayed up-path unit, the one tensor
of a cached step that reaches a fresh unit, :meth:`.units.UNetLayout.entry`): every other replayed unit
only feeds replayed units. Memory: the cache keeps ``order`` more copies of that entry feature per call
slot (one more for ``"linear"``, two for ``"quadratic"``). Until a slot has ``order + 1`` full evaluations it
uses as many as it has (one: plain reuse). The history sits in the slot's feature dict under
``(key, age)`` keys, so :meth:`.rows.RowSelection.keep_rows` and the guidance halving select its rows with
the rest, and a run reset drops it.

torch.compile: the weights ``L_j(s)`` are Python floats computed from step positions (never from tensor data)
before the U-Net's units run; the cached path is a fixed weighted sum of tensors, without a graph break when
the loop calls ``begin_step`` (part compile of ``benchmarks/results/step_cache.md``; a weight *tensor* built
in the pre-hook cost one break). Like the step state the pre-hook already reads, the weights are guarded
values: a new weight is a new specialisation.
"""

from __future__ import annotations

import torch

FORECASTS = {"none": 0, "linear": 1, "quadratic": 2}  # name -> polynomial order
AXES = ("step", "timestep")


def lagrange_weights(nodes: list[float], s: float) -> list[float]:
    """``L_j(s)`` for the extrapolating polynomial through ``nodes`` (distinct positions, oldest first)."""
    out = []
    for j, sj in enumerate(nodes):
        w = 1.0
        for i, si in enumerate(nodes):
            if i != j:
                w *= (s - si) / (sj - si)
        out.append(w)
    return out


def combine(values: list, weights: list[float]):
    """``sum_j weights[j] * values[j]`` over tensors or tuples of tensors (plain tensor ops)."""
    first = values[0]
    if isinstance(first, torch.Tensor):
        acc = values[0] * weights[0]
        for j in range(1, len(values)):
            acc = acc + values[j] * weights[j]
        return acc
    if isinstance(first, (tuple, list)):
        return type(first)(combine([v[i] for v in values], weights) for i in range(len(first)))
    raise TypeError(f"step_cache: cannot forecast a cached {type(first).__name__}")


def _same_shapes(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape
    if isinstance(a, (tuple, list)):
        return (
            isinstance(b, (tuple, list))
            and len(a) == len(b)
            and all(_same_shapes(x, y) for x, y in zip(a, b))
        )
    return False


class Forecaster:
    """Forecast state of :class:`~fastdiff.caching.cache.StepCache` (mixed in; ``_fc_nodes`` is reset per run)."""

    def _fc_position(self, tvals: tuple) -> float:
        return float(self._step) if self.forecast_axis == "step" else float(tvals[0])

    def _fc_prepare(self) -> None:
        """Weights for the current call's slot (None: replay), from its full evaluations' positions."""
        nodes = self._fc_nodes[self._slot]
        order = FORECASTS[self.forecast]
        self._fc_weights = None
        if order and len(nodes) >= 2 and self._fc_s not in nodes:
            lam = self.forecast_strength  # blend with replay: lam * forecast + (1 - lam) * newest
            w = [lam * x for x in lagrange_weights(nodes, self._fc_s)]
            w[-1] += 1.0 - lam
            self._fc_weights = w

    def _fc_push(self, store: dict, key: int, out) -> None:
        """A full call's entry feature: the newest node; older ones move one age back."""
        nodes = self._fc_nodes[self._slot]
        order = FORECASTS[self.forecast]
        if order == 0:
            store[key] = out
            return
        old = store.get(key)
        if old is None or not _same_shapes(old, out) or (nodes and nodes[-1] == self._fc_s):
            # a new batch (rows changed without keep_rows) or a repeated position: start the history again
            for age in range(1, order + 1):
                store.pop((key, age), None)
            nodes.clear()
        else:
            for age in range(order, 1, -1):
                if (key, age - 1) in store:
                    store[(key, age)] = store[(key, age - 1)]
            store[(key, 1)] = old
        store[key] = out
        nodes.append(self._fc_s)
        del nodes[: -(order + 1)]

    def _fc_predict(self, store: dict, key: int):
        """The entry feature of a cached call: the weighted history, or the last full one (replay)."""
        if self._fc_weights is None:
            return store[key]
        n = len(self._fc_weights)
        values = [store[(key, age)] for age in range(n - 1, 0, -1)] + [store[key]]
        return combine(values, self._fc_weights)
