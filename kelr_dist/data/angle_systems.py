"""Benchmark systems with angles: a diffusion on a torus and one mixing angles with a real line.

Both are overdamped Langevin dynamics ``dX = -∇V dt + sqrt(2) dW`` with ``p_eq ∝ exp(-V)``,
sampled by Metropolis-adjusted Langevin (MALA) steps whose periodic components are wrapped to
``(-π, π]`` after each proposal, so the analytic ``p_eq`` is exactly invariant and the exact score
``-∇V`` (periodic in the angles) is an unbiased reference. On the circle the proposal density
is the wrapped Gaussian; the chain uses its nearest image, the displacement wrapped to
``(-π, π]``: the other images weigh ``exp(-(2π - |Δ|)² / 4h)`` relative to it, below 1e-40
for the step sizes here (``sqrt(2h) ≤ 0.3``, ``|Δ| ≤ 5 sqrt(2h)``).

* ``torus``: ``V(φ, ψ) = a cos 2φ + b cos(3ψ - 0.6) - c cos(φ - ψ - 0.8) + e sin φ`` —
  six basins (two in φ, three in ψ, tilted and coupled), with density at the wrap ``±π`` of both
  angles (so a wrapped angle's lag-0 response is ``1 - 2π p(±π)``, well away from 1).
* ``circle``: the von Mises diffusion ``V(θ) = -κ cos(θ - μ)`` on one circle (d = 1): its
  density is von Mises and its response can be computed without samples (the generator is
  tridiagonal in the Fourier modes).
* ``angles-line``: ``(φ, ψ, r)`` with the torus potential plus
  ``g (r² - 1)² + k r sin(φ) + r cos(ψ)/2`` — a double well on the line whose tilt follows the
  angles.

Wrapped angles are stored in radians in ``(-π, π]``; :func:`degrees` converts a store's values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from kelr_dist.data.parametrised import Parameter, Parametrised, integration, real
from kelr_dist.kernels.checks import is_whole
from kelr_dist.kernels.compiled import compiled

TORUS, ANGLES_LINE, CIRCLE = 0, 1, 2
_INV_SQRT2 = 1.0 / math.sqrt(2.0)


@compiled
def _potential(system: int, x: np.ndarray, theta: np.ndarray, grad: np.ndarray) -> float:
    """``V`` at one point ``x`` and its gradient into ``grad`` (``-score``)."""
    if system == CIRCLE:
        grad[0] = theta[0] * math.sin(x[0] - theta[1])
        return -theta[0] * math.cos(x[0] - theta[1])
    a, b, c, e = theta[0], theta[1], theta[2], theta[3]
    phi, psi = x[0], x[1]
    v = (
        a * math.cos(2.0 * phi)
        + b * math.cos(3.0 * psi - 0.6)
        - c * math.cos(phi - psi - 0.8)
        + e * math.sin(phi)
    )
    grad[0] = -2.0 * a * math.sin(2.0 * phi) + c * math.sin(phi - psi - 0.8) + e * math.cos(phi)
    grad[1] = -3.0 * b * math.sin(3.0 * psi - 0.6) - c * math.sin(phi - psi - 0.8)
    if system == ANGLES_LINE:
        g, k, r = theta[4], theta[5], x[2]
        v += g * (r * r - 1.0) ** 2 + k * r * math.sin(phi) + 0.5 * r * math.cos(psi)
        grad[0] += k * r * math.cos(phi)
        grad[1] -= 0.5 * r * math.sin(psi)
        grad[2] = 4.0 * g * r * (r * r - 1.0) + k * math.sin(phi) + 0.5 * math.cos(psi)
    return v


@compiled
def _wrap(value: float) -> float:
    """``value`` wrapped to ``(-π, π]``."""
    out = value - 2.0 * math.pi * math.floor((value + math.pi) / (2.0 * math.pi))
    return math.pi if out == -math.pi else out


@compiled
def potential_and_gradient(system: int, x: np.ndarray, theta: np.ndarray) -> tuple:
    """``V`` ``(n,)`` and ``∇V`` ``(n, d)`` at ``x (n, d)``."""
    v = np.empty(x.shape[0])
    grad = np.empty(x.shape)
    for n in range(x.shape[0]):
        v[n] = _potential(system, x[n], theta, grad[n])
    return v, grad


@compiled
def periodic_mala(
    x0: np.ndarray,
    normals: np.ndarray,
    out: np.ndarray,
    step: float,
    subsample: int,
    system: int,
    theta: np.ndarray,
    angles: int,
) -> np.ndarray:  # pragma: no cover - compiled
    """MALA steps for ``dX = -∇V dt + sqrt(2) dW``; the first ``angles`` components wrapped.

    Proposal ``y = wrap(x - h ∇V(x) + sqrt(2h) ξ)``, accepted when ``Φ(z) < exp(log r)`` with
    ``log r = V(x) - V(y) - |wrap(x - y + h ∇V(y))|² / 4h + |ξ|² / 2``. ``normals`` holds
    ``(k * subsample, d + 1)`` standard normals: ``ξ`` then ``z``.
    """
    d = x0.shape[0]
    x = x0.copy()
    y = np.empty(d)
    gx = np.empty(d)
    gy = np.empty(d)
    vx = _potential(system, x, theta, gx)
    noise = math.sqrt(2.0 * step)
    row = 0
    for n in range(out.shape[0]):
        for _ in range(subsample):
            forward = 0.0
            for i in range(d):
                z = normals[row, i]
                y[i] = x[i] - step * gx[i] + noise * z
                if i < angles:
                    y[i] = _wrap(y[i])
                forward += z * z
            vy = _potential(system, y, theta, gy)
            backward = 0.0
            for i in range(d):
                r = x[i] - y[i] + step * gy[i]
                if i < angles:
                    r = _wrap(r)
                backward += r * r
            log_ratio = vx - vy - backward / (4.0 * step) + 0.5 * forward
            if log_ratio >= 0.0 or 0.5 * math.erfc(-normals[row, d] * _INV_SQRT2) < math.exp(
                log_ratio
            ):
                x, y = y, x
                gx, gy = gy, gx
                vx = vy
            row += 1
        for i in range(d):
            out[n, i] = x[i]
    return out


class _AngleSystem(Parametrised):
    """Sampler and exact score of the angle systems (subclasses set ``_system``, ``_theta``)."""

    name: str
    components: tuple[str, ...]
    default_burn_in = 20_000
    angles = 2  # the first two components are angles in (-π, π]
    step: float
    subsample: int
    _system: int
    _theta: np.ndarray

    @property
    def dt(self) -> float:
        """Time between stored samples, ``step * subsample``."""
        return self.step * self.subsample

    @property
    def periods(self) -> dict[str, float]:
        """The period of each angle (radians), as the ``periods`` attribute declares it."""
        return {c: 2.0 * math.pi for c in self.components[: self.angles]}

    def initial_state(self, rng: np.random.Generator) -> np.ndarray:
        """A small random state near the origin: ``(d,)``."""
        return 0.1 * rng.standard_normal(len(self.components))

    def advance(
        self, state: np.ndarray, n_samples: int, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        """The next ``n_samples`` stored samples ``(n_samples, d)`` and the new state ``(d,)``."""
        if not is_whole(n_samples):
            raise ValueError(f"n_samples={n_samples!r} must be a non-negative integer")
        d = len(self.components)

        def kernel(x0: np.ndarray, normals: np.ndarray, out: np.ndarray) -> np.ndarray:
            return periodic_mala(
                x0, normals.reshape(-1, d + 1), out, self.step, self.subsample, self._system,
                self._theta, self.angles,
            )  # fmt: skip

        return _run_blocks(state, n_samples, rng, (d + 1) * self.subsample, kernel, d)

    def score(self, x: np.ndarray) -> np.ndarray:
        """Exact ``∇ log p_eq = -∇V`` at ``x (n, d)``, shape ``(n, d)`` (periodic in the
        angles, whatever window they are given in)."""
        return -potential_and_gradient(self._system, _points(x, len(self.components)), self._theta)[
            1
        ]

    def log_density(self, x: np.ndarray) -> np.ndarray:
        """Unnormalised ``log p_eq = -V`` at ``x (n, d)``, shape ``(n,)``."""
        return -potential_and_gradient(self._system, _points(x, len(self.components)), self._theta)[
            0
        ]


_TORUS_PARAMETERS = {
    "a": Parameter(0.8, real),
    "b": Parameter(0.7, real),
    "c": Parameter(0.6, real),
    "e": Parameter(0.3, real),
}


class Torus(_AngleSystem):
    """Two dihedral-like angles ``(φ, ψ)`` on a torus with six basins (d = 2), MALA-sampled.

    ``V = a cos 2φ + b cos(3ψ - 0.6) - c cos(φ - ψ - 0.8) + e sin φ``, ``p_eq ∝ exp(-V)``.

    Parameters
    ----------
    a, b, c, e : the potential's amplitudes (0.8, 0.7, 0.6, 0.3).
    step : MALA step ``h`` (0.03).  subsample : steps per stored sample (5).
    """

    name = "torus"
    components = ("phi", "psi")
    parameters = {**_TORUS_PARAMETERS, **integration(step=0.03, subsample=5)}
    _system = TORUS

    def _derive(self) -> None:
        self._theta = np.array([self.a, self.b, self.c, self.e])


class AnglesLine(_AngleSystem):
    """Two angles and a real coordinate ``(φ, ψ, r)`` (d = 3), MALA-sampled.

    ``V = V_torus(φ, ψ) + g (r² - 1)² + k r sin φ + r cos(ψ) / 2``: a double well in ``r``
    tilted by the angles.

    Parameters
    ----------
    a, b, c, e : the torus part (0.8, 0.7, 0.6, 0.3).  g : well depth (1).  k : coupling (0.8).
    step : MALA step ``h`` (0.03).  subsample : steps per stored sample (5).
    """

    name = "angles-line"
    components = ("phi", "psi", "r")
    parameters = {
        **_TORUS_PARAMETERS,
        "g": Parameter(1.0, real),
        "k": Parameter(0.8, real),
        **integration(step=0.03, subsample=5),
    }
    _system = ANGLES_LINE

    def _derive(self) -> None:
        self._theta = np.array([self.a, self.b, self.c, self.e, self.g, self.k])


class Circle(_AngleSystem):
    """The von Mises diffusion ``dθ = -κ sin(θ - μ) dt + sqrt(2) dW`` on the circle (d = 1).

    Parameters
    ----------
    kappa : concentration ``κ`` (1.5).  mu : mean direction ``μ`` in radians (2.2: the density
    at the wrap ``±π`` is well above 0).  step : MALA step ``h`` (0.02).  subsample : (5).
    """

    name = "circle"
    components = ("theta",)
    angles = 1
    parameters = {
        "kappa": Parameter(1.5, real),
        "mu": Parameter(2.2, real),
        **integration(step=0.02, subsample=5),
    }
    _system = CIRCLE

    def _derive(self) -> None:
        self._theta = np.array([self.kappa, self.mu])


def degrees(x: np.ndarray, angles: int = 2) -> np.ndarray:
    """A copy of ``x (..., d)`` with its first ``angles`` components in degrees, wrapped to
    ``[0, 360)`` (the other usual window: a different wrap point as well as other units)."""
    out = np.array(x, dtype=np.float64)
    out[..., :angles] = np.mod(np.degrees(out[..., :angles]), 360.0)
    return out


@dataclass(frozen=True)
class DegreesScore:
    """The exact score of ``model`` for data in the units of :func:`degrees`:
    ``∂/∂(degrees) = (π/180) ∂/∂(radians)`` in the angles."""

    model: _AngleSystem

    def __call__(self, x: np.ndarray) -> np.ndarray:
        angles = self.model.angles
        radians = np.array(x, dtype=np.float64)
        radians[:, :angles] *= math.pi / 180.0
        score = self.model.score(radians)
        score[:, :angles] *= math.pi / 180.0
        return score


#: the systems of this module, registered in :data:`kelr_dist.data.models._MODELS`
SYSTEMS: tuple[type, ...] = (Torus, AnglesLine, Circle)

from kelr_dist.data.models import _points, _run_blocks  # noqa: E402  (as in data/systems.py)
