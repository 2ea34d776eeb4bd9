"""Benchmark systems with angles: diffusions on a circle, a torus, and angles mixed with a line.

All are overdamped Langevin dynamics ``dX = -∇V dt + sqrt(2) dW`` with ``p_eq ∝ exp(-V)``,
sampled by MALA steps whose periodic components are wrapped to ``(-π, π]`` after each proposal
(:mod:`kelr_dist.models.mala`), so the analytic ``p_eq`` is exactly invariant and the exact score
``-∇V`` (periodic in the angles) is an unbiased reference.

* ``torus``: ``V(φ, ψ) = a cos 2φ + b cos(3ψ - 0.6) - c cos(φ - ψ - 0.8) + e sin φ`` —
  six basins (two in φ, three in ψ, tilted and coupled), with density at the wrap ``±π`` of both
  angles (so a wrapped angle's lag-0 response is ``1 - 2π p(±π)``, well away from 1).
* ``circle``: the von Mises diffusion ``V(θ) = -κ cos(θ - μ)`` on one circle (d = 1): its
  density is von Mises and its response can be computed without samples (the generator is
  tridiagonal in the Fourier modes).
* ``angles-line``: ``(φ, ψ, r)`` with the torus potential plus
  ``g (r² - 1)² + k r sin(φ) + r cos(ψ)/2`` — a double well on the line whose tilt follows the
  angles.

Wrapped angles are stored in radians in ``(-π, π]``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from kelr_dist.models import densities
from kelr_dist.models.mala import MalaSystem
from kelr_dist.models.parameters import parameter, real

if TYPE_CHECKING:
    from kelr_dist.models.protocol import Model


@dataclass(eq=False)
class _AngleSystem(MalaSystem):
    """A MALA system whose first two components are angles, started near the origin."""

    angles = 2

    def initial_state(self, rng: np.random.Generator) -> np.ndarray:
        """A small random state near the origin: ``(d,)``."""
        return 0.1 * rng.standard_normal(len(self.components))


@dataclass(eq=False)
class _TorusPotential(_AngleSystem):
    """The torus potential's amplitudes, the first parameters of :class:`Torus` and
    :class:`AnglesLine`."""

    a: float = parameter(0.8, real)
    b: float = parameter(0.7, real)
    c: float = parameter(0.6, real)
    e: float = parameter(0.3, real)


@dataclass(eq=False)
class Torus(_TorusPotential, name="torus", system=densities.TORUS, step=0.0075, subsample=20):
    """Two dihedral-like angles ``(φ, ψ)`` on a torus with six basins (d = 2), MALA-sampled.

    ``V = a cos 2φ + b cos(3ψ - 0.6) - c cos(φ - ψ - 0.8) + e sin φ``, ``p_eq ∝ exp(-V)``.

    Parameters
    ----------
    a, b, c, e : the potential's amplitudes (0.8, 0.7, 0.6, 0.3).
    step : MALA step ``h`` (0.0075).  subsample : steps per stored sample (20).
    """

    components = ("phi", "psi")


@dataclass(eq=False)
class AnglesLine(
    _TorusPotential, name="angles-line", system=densities.ANGLES_LINE, step=0.0025, subsample=60
):
    """Two angles and a real coordinate ``(φ, ψ, r)`` (d = 3), MALA-sampled.

    ``V = V_torus(φ, ψ) + g (r² - 1)² + k r sin φ + r cos(ψ) / 2``: a double well in ``r``
    tilted by the angles.

    Parameters
    ----------
    a, b, c, e : the torus part (0.8, 0.7, 0.6, 0.3).  g : well depth (1).  k : coupling (0.8).
    step : MALA step ``h`` (0.0025).  subsample : steps per stored sample (60).
    """

    components = ("phi", "psi", "r")
    g: float = parameter(1.0, real)
    k: float = parameter(0.8, real)


@dataclass(eq=False)
class Circle(_AngleSystem, name="circle", system=densities.CIRCLE, step=0.01, subsample=10):
    """The von Mises diffusion ``dθ = -κ sin(θ - μ) dt + sqrt(2) dW`` on the circle (d = 1).

    Parameters
    ----------
    kappa : concentration ``κ`` (1.5).  mu : mean direction ``μ`` in radians (2.2: the density
    at the wrap ``±π`` is well above 0).  step : MALA step ``h`` (0.01).  subsample : (10).
    """

    components = ("theta",)
    angles = 1
    kappa: float = parameter(1.5, real)
    mu: float = parameter(2.2, real)


#: the systems of this module, registered in :data:`kelr_dist.models.registry.MODEL_NAMES`
SYSTEMS: tuple[type[Model], ...] = (Torus, AnglesLine, Circle)
