"""An exactly solvable diffusion model: a Gaussian mixture with a closed-form denoiser.

Data ``x0 ~ sum_k pi_k N(mu_k, s^2 I)`` (isotropic components).  Under VE noise
``x = x0 + sigma * eps`` the marginal is ``sum_k pi_k N(mu_k, (s^2 + sigma^2) I)``, so

* posterior component weights ``w_k(x) ∝ pi_k N(x; mu_k, (s^2 + sigma^2) I)`` (a softmax);
* per component ``E[x0 | x, k] = mu_k + s^2 / (s^2 + sigma^2) (x - mu_k)``;
* the optimal denoiser ``D(x, sigma) = E[x0 | x] = sum_k w_k(x) E[x0 | x, k]``.

:class:`GMMDenoiser` wraps ``D`` as an epsilon-prediction model on a discrete training
schedule (Stable Diffusion's by default) -- exactly what a perfectly trained U-Net would be --
conditioned on a possibly fractional timestep ``t`` through the continuous
``alpha_bar(t)`` of :class:`~fastdiff.samplers.NoiseSchedule` (linear interpolation of
``log alpha_bar`` between training steps).  Class conditioning restricts the mixture to the
components of one class; classifier-free guidance combines conditional and unconditional
predictions, ``eps = eps_u + w (eps_c - eps_u)``.

:func:`probability_flow_reference` integrates the probability-flow ODE
``dx/dsigma = (x - D(x, sigma)) / sigma`` (Karras et al. 2022, eq. 3) in float64 with scipy's
DOP853, giving the exact sample that every deterministic sampler approximates.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from .noise_schedule import NoiseSchedule


class GaussianMixture:
    """Isotropic Gaussian mixture; all maths in float64."""

    def __init__(self, means: torch.Tensor, std: float, weights: torch.Tensor | None = None, classes=None):
        self.means = torch.as_tensor(means, dtype=torch.float64)
        if self.means.ndim != 2:
            raise ValueError(f"means must have shape (components, dims), got {tuple(self.means.shape)}")
        k = self.means.shape[0]
        w = (
            torch.full((k,), 1.0 / k, dtype=torch.float64)
            if weights is None
            else torch.as_tensor(weights).double()
        )
        if w.shape != (k,) or torch.any(w <= 0):
            raise ValueError("weights must be positive, one per component")
        self.log_weights = torch.log(w / w.sum())
        if std <= 0:
            raise ValueError(f"std must be > 0, got {std}")
        self.std = float(std)
        # class id of each component (for class-conditional sampling); default: one class per component
        self.classes = torch.arange(k) if classes is None else torch.as_tensor(classes, dtype=torch.long)

    @classmethod
    def random(
        cls, dims: int = 48, components: int = 6, std: float = 0.15, num_classes: int = 3, seed: int = 0
    ):
        """Means ~ N(0, I) (data scale ~1, like SD latents); components split round-robin into classes."""
        g = torch.Generator().manual_seed(seed)
        means = torch.randn(components, dims, generator=g, dtype=torch.float64)
        return cls(means, std, classes=torch.arange(components) % num_classes)

    @property
    def dims(self) -> int:
        return self.means.shape[1]

    def sample(self, n: int, generator: torch.Generator | None = None, class_labels=None) -> torch.Tensor:
        """Draw ``n`` data points (optionally from given per-sample classes)."""
        logits = self.log_weights.expand(n, -1).clone()
        if class_labels is not None:
            logits = logits + self._class_mask(class_labels)
        comp = torch.multinomial(torch.softmax(logits, -1), 1, generator=generator).squeeze(1)
        eps = torch.randn(n, self.dims, generator=generator, dtype=torch.float64)
        return self.means[comp] + self.std * eps

    def _class_mask(self, class_labels) -> torch.Tensor:
        labels = torch.as_tensor(class_labels, dtype=torch.long).reshape(-1, 1)
        return torch.where(labels == self.classes.reshape(1, -1), 0.0, -math.inf).double()

    def denoise(self, x: torch.Tensor, sigma, class_labels=None) -> torch.Tensor:
        """``E[x0 | x]`` for VE-noised ``x`` of shape ``(n, dims)`` at noise level(s) ``sigma``."""
        x = x.double()
        sigma = torch.as_tensor(sigma, dtype=torch.float64).reshape(-1, 1)
        var = self.std**2 + sigma**2  # (n or 1, 1)
        diff = x[:, None, :] - self.means[None]  # (n, K, d)
        logits = self.log_weights[None] - diff.pow(2).sum(-1) / (2 * var)
        if class_labels is not None:
            logits = logits + self._class_mask(class_labels)
        w = torch.softmax(logits, dim=-1)  # (n, K)
        shrink = (self.std**2 / var)[:, :, None]  # (n or 1, 1, 1)
        comp_mean = self.means[None] + shrink * diff
        return (w[..., None] * comp_mean).sum(1)


class GMMDenoiser:
    """The mixture as a diffusers-style epsilon model ``model(x_t, t) -> eps`` (VP state, any shape
    ``(n, *)`` with ``prod(*) == dims``), optionally class-conditional with guidance scale ``w``."""

    def __init__(
        self,
        mixture: GaussianMixture,
        schedule_config: Mapping | None = None,
        class_labels=None,
        guidance_scale: float = 1.0,
    ):
        self.mixture = mixture
        self.noise = NoiseSchedule.from_config(schedule_config)
        self.class_labels = None if class_labels is None else torch.as_tensor(class_labels, dtype=torch.long)
        self.guidance_scale = float(guidance_scale)
        # no call counter here: fastdiff.dynamic.sample reports NFE (SampleResult.nfe / nfe_per_sample)

    def denoise_ve(self, x: torch.Tensor, sigma, rows=None) -> torch.Tensor:
        """Guided x0-prediction for the VE state ``x`` (n, dims), float64; ``rows``: which samples of
        the class labels ``x`` holds (default: all, in order)."""
        d_u = self.mixture.denoise(x, sigma)
        if self.class_labels is None or self.guidance_scale == 0.0:
            return d_u
        labels = self.class_labels if rows is None else self.class_labels[torch.as_tensor(rows)]
        d_c = self.mixture.denoise(x, sigma, labels)
        # eps = (x - D) / sigma is affine in D at fixed x, so CFG on eps equals CFG on D.
        return d_u + self.guidance_scale * (d_c - d_u)

    def __call__(self, x: torch.Tensor, t, rows=None) -> torch.Tensor:
        """``t``: one timestep, or one per row (rows on their own schedules); ``rows``: the batch rows in
        ``x`` (passed by :func:`fastdiff.dynamic.sample` once rows leave the batch)."""
        t = torch.as_tensor(t, dtype=torch.float64).reshape(-1).cpu().numpy()
        sigma = torch.from_numpy(self.noise.sigma_of_t(t)).reshape(-1, 1)
        alpha = 1.0 / torch.sqrt(1.0 + sigma**2)
        flat = x.double().reshape(x.shape[0], -1)
        x_ve = flat / alpha
        eps = (x_ve - self.denoise_ve(x_ve, sigma, rows)) / sigma
        return eps.reshape(x.shape).to(x.dtype)


class GMMFamilyDenoiser(GMMDenoiser):
    """Several :class:`GMMDenoiser` of the same dimension as one model over a stacked batch: rows
    ``[0, sizes[0])`` belong to ``members[0]``, the next ``sizes[1]`` to ``members[1]``, and so on.  For
    fitting a schedule on a *family* of mixtures in one calibration batch (``fit_schedule`` needs one
    ``model_fn``), the way one would calibrate a real pipeline over many prompts."""

    def __init__(self, members, sizes):
        members, sizes = list(members), [int(s) for s in sizes]
        if not members or len(members) != len(sizes) or any(s <= 0 for s in sizes):
            raise ValueError("GMMFamilyDenoiser needs one positive row count per member (and >= 1 member)")
        dims = {m.mixture.dims for m in members}
        if len(dims) != 1:
            raise ValueError(f"family members must share one dimension, got {sorted(dims)}")
        for m, s in zip(members, sizes):
            if m.class_labels is not None and len(m.class_labels) != s:
                raise ValueError(f"a member has {len(m.class_labels)} class labels for {s} rows")
        self.members, self.sizes = members, sizes
        self.mixture = members[0].mixture  # dims; the noise schedule is the first member's
        self.noise = members[0].noise
        self.class_labels, self.guidance_scale = None, 1.0
        self.offsets = [0, *torch.cumsum(torch.tensor(sizes), 0).tolist()]

    def denoise_ve(self, x: torch.Tensor, sigma, rows=None) -> torch.Tensor:
        rows = torch.arange(x.shape[0]) if rows is None else torch.as_tensor(rows, dtype=torch.long)
        if rows.numel() and (int(rows.min()) < 0 or int(rows.max()) >= self.offsets[-1]):
            raise IndexError(f"rows must lie in [0, {self.offsets[-1]}), got {rows.tolist()}")
        sigma = torch.as_tensor(sigma, dtype=torch.float64).reshape(-1, 1)
        out = torch.empty(x.shape, dtype=torch.float64)
        for m, lo, hi in zip(self.members, self.offsets, self.offsets[1:]):
            pos = ((rows >= lo) & (rows < hi)).nonzero().reshape(-1)
            if pos.numel():
                s = sigma if sigma.shape[0] == 1 else sigma[pos]
                out[pos] = m.denoise_ve(x[pos], s, rows[pos] - lo)
        return out


def probability_flow_reference(
    model: GMMDenoiser,
    x_start: torch.Tensor,
    sigma_start: float | None = None,
    rtol: float = 1e-10,
    atol: float = 1e-10,
) -> torch.Tensor:
    """Exact x0 for VP start states ``x_start`` at ``sigma_start`` (default: the last training step).

    Integrates ``dx/dlog(sigma) = x - D(x, sigma)`` for the VE state from ``sigma_start`` down to
    ``sigma_end = 1e-5 * sigma_min`` with DOP853 (float64), then takes one Euler step in
    ``u = sigma^2`` to sigma = 0 (local error O(sigma_end^4), negligible).
    """
    from scipy.integrate import solve_ivp

    sigma_start = model.noise.sigma_max if sigma_start is None else float(sigma_start)
    sigma_end = 1e-5 * model.noise.sigma_min
    n = x_start.shape[0]
    x0 = x_start.double().reshape(n, -1) * math.sqrt(1.0 + sigma_start**2)

    def rhs(s, y):
        x = torch.from_numpy(y).reshape(n, -1)
        return (x - model.denoise_ve(x, math.exp(s))).reshape(-1).numpy()

    sol = solve_ivp(
        rhs,
        (math.log(sigma_start), math.log(sigma_end)),
        x0.reshape(-1).numpy(),
        method="DOP853",
        rtol=rtol,
        atol=atol,
    )
    if not sol.success:
        raise RuntimeError(f"reference ODE solve failed: {sol.message}")
    x = torch.from_numpy(sol.y[:, -1]).reshape(n, -1)
    x = 0.5 * (x + model.denoise_ve(x, sigma_end))
    return x.reshape(x_start.shape)


def rms_errors(samples: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """Per-sample RMS error (float64)."""
    d = samples.double().reshape(samples.shape[0], -1) - reference.double().reshape(reference.shape[0], -1)
    return d.pow(2).mean(1).sqrt()


def median_rms_error(samples: torch.Tensor, reference: torch.Tensor) -> float:
    return float(rms_errors(samples, reference).median())


__all__ = [
    "GMMDenoiser",
    "GMMFamilyDenoiser",
    "GaussianMixture",
    "median_rms_error",
    "probability_flow_reference",
    "rms_errors",
]
