"""The paper's test systems (§5), triple-well and Langevin-Morse, and an Ornstein-Uhlenbeck check.

Each has a closed-form ``p_eq`` and a resumable sampler (:mod:`kelr_dist.models.sampling`): the
Langevin-Morse and Ornstein-Uhlenbeck kernels of :mod:`kelr_dist.models.integrators` read
sub-blocks of normals, the triple-well kernel draws them from the generator itself.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from scipy.linalg import cholesky, expm, solve_continuous_lyapunov

from kelr_dist.models import integrators
from kelr_dist.models.parameters import (
    Parameters,
    count,
    derived,
    fraction,
    matrix,
    parameter,
    positive,
    real,
)
from kelr_dist.models.sampling import points, run_blocks, start

if TYPE_CHECKING:
    from kelr_dist.models.protocol import Model

# --------------------------------------------------------------------------------------------
# Ornstein-Uhlenbeck
# --------------------------------------------------------------------------------------------

_OU_GAMMA = ((1.0, 0.6), (-0.4, 0.8))
_OU_SIGMA = ((math.sqrt(2.0), 0.0), (0.0, math.sqrt(2.0)))


@dataclass(eq=False)
class OrnsteinUhlenbeck(Parameters):
    """``dX = -Gamma X dt + Sigma dW``, sampled exactly (not in the paper; a Gaussian check).

    The default ``Gamma`` is non-symmetric (eigenvalues ``0.9 +- 0.48i``), so the response
    ``expm(-Gamma t)`` has non-zero, unequal off-diagonal entries.

    Parameters
    ----------
    gamma : (d, d) drift matrix; its eigenvalues must have positive real parts.
    sigma : (d, d) noise matrix (``Sigma Sigma^T`` positive definite).
    dt : time between samples (exact transition, no discretisation error).
    """

    name: ClassVar[str] = "ou"
    default_burn_in: ClassVar[int] = 0  # initial_state draws from p_eq

    gamma: np.ndarray = parameter(_OU_GAMMA, matrix)
    sigma: np.ndarray = parameter(_OU_SIGMA, matrix)
    dt: float = parameter(0.05, positive)
    components: tuple[str, ...] = derived()
    _covariance: np.ndarray = derived()
    _precision: np.ndarray = derived()
    _transition: np.ndarray = derived()
    _noise: np.ndarray = derived()
    _stationary_factor: np.ndarray = derived()

    def _derive(self) -> None:
        gamma, sigma = self.gamma, self.sigma
        if gamma.ndim != 2 or gamma.shape[0] != gamma.shape[1]:
            raise ValueError(f"gamma={gamma.tolist()!r} must be a square (d, d) matrix")
        d = gamma.shape[0]
        if not np.all(np.isfinite(gamma)) or np.linalg.eigvals(gamma).real.min() <= 0:
            raise ValueError(
                f"gamma={gamma.tolist()!r} must be finite with eigenvalues of positive real part"
            )
        if sigma.shape != (d, d) or not np.all(np.isfinite(sigma)):
            raise ValueError(f"sigma={sigma.tolist()!r} must be a finite ({d}, {d}) matrix")
        diffusion = sigma @ sigma.T
        if np.linalg.eigvalsh(diffusion).min() <= 0:
            raise ValueError(f"sigma={sigma.tolist()!r} must have full rank (Sigma Sigma^T > 0)")
        self.components = tuple(f"x{i + 1}" for i in range(d))
        covariance = solve_continuous_lyapunov(gamma, diffusion)
        self._covariance = 0.5 * (covariance + covariance.T)
        self._precision = np.linalg.inv(self._covariance)
        self._transition = expm(-gamma * self.dt)
        step_cov = self._covariance - self._transition @ self._covariance @ self._transition.T
        try:
            self._noise = cholesky(0.5 * (step_cov + step_cov.T), lower=True)
        except np.linalg.LinAlgError:
            raise ValueError(
                f"dt={self.dt!r} is too small for the transition covariance to be resolved"
            ) from None
        self._stationary_factor = cholesky(self._covariance, lower=True)

    def stationary_covariance(self) -> np.ndarray:
        """``C`` solving ``Gamma C + C Gamma^T = Sigma Sigma^T``, shape ``(d, d)``."""
        return self._covariance.copy()

    def response(self, t: np.ndarray) -> np.ndarray:
        """Exact linear response ``expm(-Gamma t)`` for ``A = x`` and constant forcing.

        Parameters
        ----------
        t : (T,) times.

        Returns
        -------
        (T, d, d) ``k_A(t)`` of eq. 5, entry ``[s, i, j] = d<x_i(t_s)> / d f_j``.
        """
        return np.stack([expm(-self.gamma * float(s)) for s in np.atleast_1d(t)])

    def lag_covariance(self, t: np.ndarray) -> np.ndarray:
        """``E[x(t) x(0)^T] = expm(-Gamma t) C`` at times ``t (T,)``, shape ``(T, d, d)``."""
        return self.response(t) @ self._covariance

    def initial_state(self, rng: np.random.Generator) -> np.ndarray:
        return self._stationary_factor @ rng.standard_normal(self.gamma.shape[0])

    def advance(
        self, state: np.ndarray, n_samples: int, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        def kernel(x0: np.ndarray, normals: np.ndarray, out: np.ndarray) -> np.ndarray:
            return integrators.linear_gaussian(x0, normals, out, self._transition, self._noise)

        d = self.gamma.shape[0]
        return run_blocks(state, n_samples, rng, d, kernel, d)

    def score(self, x: np.ndarray) -> np.ndarray:
        return -np.asarray(x, dtype=np.float64) @ self._precision

    def log_density(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        return -0.5 * np.einsum("ni,ij,nj->n", x, self._precision, x)


# --------------------------------------------------------------------------------------------
# triple-well gradient system (paper §5.1)
# --------------------------------------------------------------------------------------------

TRIPLE_WELL_VARIANTS = ("paper", "radial")


def _variant(name: str, value: Any) -> str:
    """One of :data:`TRIPLE_WELL_VARIANTS`, or a ValueError naming the parameter."""
    if value not in TRIPLE_WELL_VARIANTS:
        raise ValueError(f"{name}={value!r} must be one of {TRIPLE_WELL_VARIANTS}")
    return value


@dataclass(eq=False)
class TripleWell(Parameters):
    """Gradient system ``dx = -grad V dt + sqrt(2 kT) dW`` (eq. 59, eq. 60).

    ``p_eq ∝ exp(-V / kT)`` (eq. 61). The well profile ``v`` is applied to squared
    distances, ``v(|x - c|^2)``; read literally (``variant="paper"``) its exponent
    ``1/(z^2 - a^2)`` then holds ``r^4`` (flat-bottomed wells with steep walls, support
    ``r < sqrt(a)``); ``variant="radial"`` is the other reading ``10 exp(1/(r^2 - a^2))`` on
    ``r < a``. Integrated by the weak trapezoidal scheme (Anderson & Mattingly 2011), keeping
    every ``subsample``-th step.

    Parameters
    ----------
    a : well spacing / radius (paper: 1).
    kT : temperature ``k_B T`` (paper: 1.5).
    gamma : well-depth asymmetry in (0, 1) (paper: 0.25).
    step : integrator step ``h`` (paper: 1e-3).
    subsample : steps between stored samples (paper: 5).
    variant : ``"paper"`` or ``"radial"`` (see above).
    """

    name: ClassVar[str] = "triple-well"
    components: ClassVar[tuple[str, ...]] = ("x1", "x2")
    default_burn_in: ClassVar[int] = 2000  # 10 time units at dt = 5e-3: many well-hopping times

    a: float = parameter(1.0, positive)
    kT: float = parameter(1.5, positive)
    gamma: float = parameter(0.25, fraction)
    step: float = parameter(1e-3, positive)
    subsample: int = parameter(5, count)
    variant: str = parameter("paper", _variant)

    @property
    def dt(self) -> float:
        """Time between stored samples, ``step * subsample``."""
        return self.step * self.subsample

    def _shape(self) -> tuple[float, float, bool]:
        return self.a, self.gamma, self.variant == "radial"

    def potential(self, x: np.ndarray) -> np.ndarray:
        """``V`` of eq. 60 at ``x (n, 2)``, shape ``(n,)``."""
        return integrators.triple_well_potential(points(x, 2), *self._shape())

    def gradient(self, x: np.ndarray) -> np.ndarray:
        """Analytic ``grad V`` at ``x (n, 2)``, shape ``(n, 2)``."""
        return integrators.triple_well_gradient(points(x, 2), *self._shape())

    def initial_state(self, rng: np.random.Generator) -> np.ndarray:
        centre = np.array([self.a, self.a / math.sqrt(3.0)])
        return centre + math.sqrt(self.kT / 1.6) * rng.standard_normal(2)

    def advance(
        self, state: np.ndarray, n_samples: int, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        x = start(state, n_samples, 2)
        out = np.empty((n_samples, 2))
        if n_samples == 0:
            return out, x
        integrators.weak_trapezoidal_triple_well(
            x, rng, out, self.step, self.subsample, self.a, self.gamma, self.kT,
            self.variant == "radial",
        )  # fmt: skip
        return out, out[-1].copy()

    def score(self, x: np.ndarray) -> np.ndarray:
        return -self.gradient(x) / self.kT

    def log_density(self, x: np.ndarray) -> np.ndarray:
        return -self.potential(x) / self.kT


# --------------------------------------------------------------------------------------------
# Langevin dynamics with the Morse potential (paper §5.2)
# --------------------------------------------------------------------------------------------


@dataclass(eq=False)
class LangevinMorse(Parameters):
    """``dx = v dt, dv = -U'(x) dt - gamma v dt + sqrt(2 gamma kT) dW`` (eq. 64).

    ``U(x) = U0(a (x - x0))``, ``U0(y) = epsilon (e^{-2y} - 2 e^{-y} + 0.03 y^2)``;
    ``p_eq ∝ exp(-(U(x) + v^2/2) / kT)`` (eq. 65). Integrated by BAOAB splitting, keeping
    every ``subsample``-th step.

    Parameters
    ----------
    gamma : damping (paper: 0.5, under-damped).
    kT : temperature (paper: 1).
    epsilon, a, x0 : Morse depth, stiffness and centre (paper: 0.2, 10, 0).
    step : integrator step (paper: 1e-3).
    subsample : steps between stored samples (paper: 10).
    """

    name: ClassVar[str] = "langevin-morse"
    components: ClassVar[tuple[str, ...]] = ("x", "v")
    default_burn_in: ClassVar[int] = 2000  # 20 time units at dt = 1e-2: ten times 1/gamma

    gamma: float = parameter(0.5, positive)
    kT: float = parameter(1.0, positive)
    epsilon: float = parameter(0.2, positive)
    a: float = parameter(10.0, positive)
    x0: float = parameter(0.0, real)
    step: float = parameter(1e-3, positive)
    subsample: int = parameter(10, count)

    @property
    def dt(self) -> float:
        """Time between stored samples, ``step * subsample``."""
        return self.step * self.subsample

    def potential(self, x: np.ndarray) -> np.ndarray:
        """Morse potential ``U`` at positions ``x (n,)``, shape ``(n,)``."""
        return integrators.morse_potential(points(x, 1)[:, 0], self.epsilon, self.a, self.x0)

    def force_slope(self, x: np.ndarray) -> np.ndarray:
        """Analytic ``U'`` at positions ``x (n,)``, shape ``(n,)``."""
        return integrators.morse_slope(points(x, 1)[:, 0], self.epsilon, self.a, self.x0)

    def initial_state(self, rng: np.random.Generator) -> np.ndarray:
        return np.array([self.x0, math.sqrt(self.kT) * rng.standard_normal()])

    def advance(
        self, state: np.ndarray, n_samples: int, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        def kernel(x0: np.ndarray, normals: np.ndarray, out: np.ndarray) -> np.ndarray:
            return integrators.baoab_morse(
                x0, normals.reshape(-1, 1), out, self.step, self.subsample, self.gamma,
                self.kT, self.epsilon, self.a, self.x0,
            )  # fmt: skip

        return run_blocks(state, n_samples, rng, self.subsample, kernel, 2)

    def score(self, x: np.ndarray) -> np.ndarray:
        x = points(x, 2)
        return np.stack([-self.force_slope(x[:, 0]), -x[:, 1]], axis=1) / self.kT

    def log_density(self, x: np.ndarray) -> np.ndarray:
        x = points(x, 2)
        return -(self.potential(x[:, 0]) + 0.5 * x[:, 1] ** 2) / self.kT


#: the systems of this module, registered in :data:`kelr_dist.models.registry.MODEL_NAMES`
SYSTEMS: tuple[type[Model], ...] = (TripleWell, LangevinMorse, OrnsteinUhlenbeck)
