"""Benchmark systems with closed-form equilibrium densities, sampled with no discretisation bias.

These are for the accuracy suite of score / response estimators: unlike the paper's triple-well
and Langevin-Morse (whose integrators carry an O(h) bias in the stationary law), every sampler
here leaves the analytic ``p_eq`` *exactly* invariant, so the exact score ``grad log p_eq``
evaluated on the same samples is an unbiased reference.

* ``curved-wells``, ``coupled-3d``, ``coupled-4d``, ``coupled-6d``, ``trig-4d``, ``gamma-3d``,
  ``heavy-tail``: Metropolis-adjusted Langevin (:mod:`kelr_dist.models.mala`); every
  ``subsample``-th state is stored, ``dt = step * subsample``. For a potential the chain follows
  ``dX = -grad V / kT dt + sqrt(2) dW``: the physical ``dX = -grad V dt + sqrt(2 kT) dW`` with
  its time multiplied by ``kT``; the Metropolis step removes the discretisation bias.
* ``wall``: a Cox-Ingersoll-Ross coordinate (Gamma law, hard wall at 0) and a Gaussian
  coordinate coupled to it, both sampled with their exact transition laws (its kernel
  recomputes its auxiliary coordinate from the stored state every step, so it resumes exactly).

Their sampling rates, acceptance rates and autocorrelation times, and how closely the chains
at the default steps follow the diffusion (:mod:`kelr_dist.models.mala`), are in the
documentation's benchmarks page.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from kelr_dist.kernels.compiled import compiled
from kelr_dist.models import densities
from kelr_dist.models.mala import MalaSystem
from kelr_dist.models.parameters import (
    Parameters,
    derived,
    matrix,
    parameter,
    positive,
    real,
    vector,
)
from kelr_dist.models.sampling import points, run_blocks, start

if TYPE_CHECKING:
    from kelr_dist.models.protocol import Model


@compiled
def cir_gaussian(
    x0: np.ndarray,
    normals: np.ndarray,
    out: np.ndarray,
    decay: float,
    spread: float,
    coupling: float,
    rho: float,
    kick: float,
) -> np.ndarray:
    """Exact transitions of :class:`Wall`: ``x1`` CIR with integer ``dof``, ``x2 = c x1 + w``.

    ``x1 = |Y|^2`` for ``Y`` an OU process in ``R^dof``; by rotation invariance only ``|Y| =
    sqrt(x1)`` matters, so ``x1' = (decay sqrt(x1) + spread z_0)^2 + spread^2 (z_1^2 + ... +
    z_{dof-1}^2)`` (the noncentral chi-square transition), and ``w' = rho w + kick z_dof`` with
    ``w = x2 - c x1`` recomputed from the stored state every step.

    Parameters
    ----------
    x0 : (2,) state before the block (``x1 > 0``).
    normals : (k, dof + 1) standard normals per stored sample.
    out : (k, 2) written with the next ``k`` states.
    decay : ``exp(-kappa dt / 2)``.  spread : ``sqrt(mean / dof * (1 - exp(-kappa dt)))``.
    coupling : ``c``.  rho : ``exp(-gamma dt)``.  kick : ``sigma_w sqrt(1 - rho^2)``.
    """
    dof = normals.shape[1] - 1
    x1 = x0[0]
    x2 = x0[1]
    for n in range(out.shape[0]):
        w = x2 - coupling * x1
        centre = decay * math.sqrt(x1) + spread * normals[n, 0]
        rest = 0.0
        for i in range(1, dof):
            rest += normals[n, i] * normals[n, i]
        x1 = centre * centre + spread * spread * rest
        w = rho * w + kick * normals[n, dof]
        x2 = coupling * x1 + w
        out[n, 0] = x1
        out[n, 1] = x2
    return out


# --------------------------------------------------------------------------------------------
# MALA systems
# --------------------------------------------------------------------------------------------


@dataclass(eq=False)
class Potential(MalaSystem):
    """A MALA system with ``p_eq ∝ exp(-V / kT)``: the temperature ``kT`` is its first
    parameter (default 1)."""

    kT: float = parameter(1.0, positive)


@dataclass(eq=False)
class CurvedWells(
    Potential, name="curved-wells", system=densities.CURVED_WELLS, step=0.001, subsample=300
):
    """Three wells in a curved, rotated valley (d = 2): ``p_eq ∝ exp(-V / kT)``, MALA-sampled.

    In local coordinates ``(u, v) = R(-angle) (x - center)``::

        V = H 27/(4 a^6) u^2 (u^2 - a^2)^2 + tilt u + (kappa / 2) (v - b u^2)^2

    The profile along ``u`` has three minima ``u = 0, +-a`` (tilted by ``tilt u``) separated by
    barriers of height ``~H`` at ``u^2 = a^2 / 3``; the valley floor is the parabola
    ``v = b u^2`` of width ``sqrt(kT / kappa)``. Not a product density in any rotation.

    Parameters
    ----------
    kT : temperature (default 1).  barrier : ``H`` (2.5).  spacing : ``a`` (2).  tilt : (0.15).
    center : the shift ``(2,)`` ((1, -0.5)).  angle : rotation in degrees (30).
    curvature : ``b`` (0.5).  stiffness : ``kappa`` (4).
    step : MALA step ``h`` (0.001).  subsample : steps per stored sample (300).
    """

    components = ("x1", "x2")

    barrier: float = parameter(2.5, positive)
    spacing: float = parameter(2.0, positive)
    tilt: float = parameter(0.15, real)
    center: np.ndarray = parameter((1.0, -0.5), partial(vector, d=2))
    angle: float = parameter(30.0, real)
    curvature: float = parameter(0.5, real)
    stiffness: float = parameter(4.0, positive)

    def _derive(self) -> None:
        radians = math.radians(self.angle)
        self._theta = np.array([
            27.0 * self.barrier / (4.0 * self.spacing**6), self.spacing**2, self.tilt,
            self.curvature, self.stiffness, math.cos(radians), math.sin(radians),
            self.center[0], self.center[1], 1.0 / self.kT,
        ])  # fmt: skip

    def to_local(self, x: np.ndarray) -> np.ndarray:
        """Valley coordinates ``(u, v) = R(-angle) (x - center)`` of ``x (n, 2)``: ``(n, 2)``."""
        radians = math.radians(self.angle)
        co, si = math.cos(radians), math.sin(radians)
        d = points(x, 2) - self.center
        return np.column_stack([co * d[:, 0] + si * d[:, 1], co * d[:, 1] - si * d[:, 0]])

    def from_local(self, uv: np.ndarray) -> np.ndarray:
        """Inverse of :meth:`to_local`: ``x = center + R(angle) (u, v)``, shape ``(n, 2)``."""
        radians = math.radians(self.angle)
        co, si = math.cos(radians), math.sin(radians)
        uv = points(uv, 2)
        return self.center + np.column_stack(
            [co * uv[:, 0] - si * uv[:, 1], si * uv[:, 0] + co * uv[:, 1]]
        )

    def initial_state(self, rng: np.random.Generator) -> np.ndarray:
        """The middle well's bottom ``center``, perturbed by ``0.1 N(0, I)``: ``(2,)``."""
        return self.center + 0.1 * rng.standard_normal(2)


@dataclass(eq=False)
class Coupled3D(
    Potential, name="coupled-3d", system=densities.COUPLED_3D, step=0.0008, subsample=500
):
    """A double well driving two non-Gaussian coordinates (d = 3), MALA-sampled.

    ``p_eq ∝ exp(-V / kT)`` with ``y2 = x2 - a x1``, ``y3 = x3 - b x2`` and::

        V = H (x1^2 - 1)^2 + tilt x1 + y2^2/2 + g2 y2^4/4 + y3^2/2 + c3 y3^3/3 + g3 y3^4/4

    The map ``x -> (x1, y2, y3)`` is triangular with unit Jacobian, so ``x1``, ``y2``, ``y3`` are
    independent with 1-D densities ``∝ exp(-V_k / kT)`` (exact moments by 1-D quadrature);
    ``y3`` is skewed (``c3^2 < 4 g3`` keeps it unimodal).

    Parameters
    ----------
    kT : (1).  barrier : ``H`` (3).  tilt : (0.25).  a : (1).  b : (0.8).
    quartic2 : ``g2`` (1).  cubic3 : ``c3`` (0.6).  quartic3 : ``g3`` (0.5).
    step : MALA step (0.0008).  subsample : (500).
    """

    components = ("x1", "x2", "x3")

    barrier: float = parameter(3.0, positive)
    tilt: float = parameter(0.25, real)
    a: float = parameter(1.0, real)
    b: float = parameter(0.8, real)
    quartic2: float = parameter(1.0, positive)
    cubic3: float = parameter(0.6, real)
    quartic3: float = parameter(0.5, positive)

    def factors(self, x: np.ndarray) -> np.ndarray:
        """The independent coordinates ``(x1, y2, y3)`` of ``x (n, 3)``, shape ``(n, 3)``."""
        x = points(x, 3)
        return np.column_stack([x[:, 0], x[:, 1] - self.a * x[:, 0], x[:, 2] - self.b * x[:, 1]])

    def initial_state(self, rng: np.random.Generator) -> np.ndarray:
        """Near the bottom ``(1, a, a b)`` of the right well, ``0.1 N(0, I)`` off: ``(3,)``."""
        return np.array([1.0, self.a, self.a * self.b]) + 0.1 * rng.standard_normal(3)


@dataclass(eq=False)
class AnharmonicChain(Potential, system=densities.CHAIN):
    """A chain of anharmonic oscillators, nearest-neighbour coupled, one double well; MALA.

    ``p_eq ∝ exp(-V / kT)`` with::

        V = H (x1^2 - 1)^2 + tilt x1 + sum_{i>=2} (x_i^2/2 + c x_i^3/3 + g x_i^4/4)
            + (kappa / 2) sum_{i=1}^{d-1} (x_{i+1} - x_i)^2

    A Markov-chain density: its 1-D and neighbour-pair marginals follow exactly from 1-D
    transfer-matrix quadrature. Use :class:`Coupled4D` / :class:`Coupled6D` (d = 4, 6).

    Parameters
    ----------
    kT : (1).  barrier : ``H`` (3).  tilt : (0.2).  coupling : ``kappa`` (1).  cubic : ``c`` (0.5).
    quartic : ``g`` (0.5; ``c^2 < 4 g`` keeps each oscillator unimodal).
    step : MALA step (0.001).  subsample : (200).
    """

    dimension: ClassVar[int]

    barrier: float = parameter(3.0, positive)
    tilt: float = parameter(0.2, real)
    coupling: float = parameter(1.0, real)
    cubic: float = parameter(0.5, real)
    quartic: float = parameter(0.5, positive)

    def _derive(self) -> None:
        self.components = tuple(f"x{i + 1}" for i in range(self.dimension))
        super()._derive()

    def initial_state(self, rng: np.random.Generator) -> np.ndarray:
        """``x1 = 1`` (right well), the rest 0, plus ``0.1 N(0, I)``: ``(d,)``."""
        state = np.zeros(self.dimension)
        state[0] = 1.0
        return state + 0.1 * rng.standard_normal(self.dimension)


@dataclass(eq=False)
class Coupled4D(AnharmonicChain, name="coupled-4d"):
    """:class:`AnharmonicChain` with d = 4."""

    dimension = 4


@dataclass(eq=False)
class Coupled6D(AnharmonicChain, name="coupled-6d"):
    """:class:`AnharmonicChain` with d = 6."""

    dimension = 6


@dataclass(eq=False)
class TrigTie4D(Potential, name="trig-4d", system=densities.TRIG_4D):
    """Two coupled double wells with a trigonometric tie (d = 4), MALA-sampled.

    ``p_eq ∝ exp(-V / kT)`` with ``u3 = x3 - a sin(omega x1)``, ``u4 = x4 - b x2`` and::

        V = H (x1^2 - 1)^2 + H (x2^2 - 1)^2 - kappa cos(omega (x1 - x2)) + u3^2/2 + u4^2/2

    The score has ``sin`` and ``cos`` terms in ``x1`` and ``x2``, which no polynomial of low
    degree follows: ``x3`` sits on a sine of ``x1`` and the wells are tied by a cosine. Given
    ``(x1, x2)``, ``u3`` and ``u4`` are independent standard normals (``kT = 1``).

    Parameters
    ----------
    kT : (1).  barrier : ``H`` (1.5).  kappa : (0.5).  omega : (2.5).  a : (0.8).  b : (0.7).
    step : MALA step (0.001).  subsample : (200).
    """

    components = ("x1", "x2", "x3", "x4")

    barrier: float = parameter(1.5, positive)
    kappa: float = parameter(0.5, real)
    omega: float = parameter(2.5, positive)
    a: float = parameter(0.8, real)
    b: float = parameter(0.7, real)

    def initial_state(self, rng: np.random.Generator) -> np.ndarray:
        """Near ``(1, 1, a sin(omega), b)``, ``0.1 N(0, I)`` off: ``(4,)``."""
        start = np.array([1.0, 1.0, self.a * math.sin(self.omega), self.b])
        return start + 0.1 * rng.standard_normal(4)


@dataclass(eq=False)
class GammaTie3D(MalaSystem, name="gamma-3d", system=densities.GAMMA_3D, step=0.005, subsample=250):
    """A Gamma coordinate with a log tie and a quadratic tie (d = 3), MALA-sampled.

    ``p_eq(x) ∝ x1^(k-1) exp(-x1 / theta) exp(-(x2 - alpha log x1)^2 / 2) exp(-(x3 - gamma
    x2^2)^2 / 2)`` on ``x1 > 0``: ``x1 ~ Gamma(k, theta)``, ``x2 | x1 ~ N(alpha log x1, 1)``,
    ``x3 | x2 ~ N(gamma x2^2, 1)``. The score of ``x1`` has terms in ``1 / x1`` and
    ``log(x1) / x1``. ``x1`` moves in ``log x1`` (:func:`~kelr_dist.models.mala.mala`), so the
    chain enters the region near ``x1 = 0`` as often as ``p_eq`` says (steps in ``x1`` itself are
    rejected there almost always).

    Parameters
    ----------
    shape : ``k`` (3).  theta : (1).  alpha : (0.7).  gamma : (0.4).  step : MALA step (0.005).
    subsample : (250).
    """

    components = ("x1", "x2", "x3")
    positives = 1  # x1 moves in log x1

    shape: float = parameter(3.0, positive)
    theta: float = parameter(1.0, positive)
    alpha: float = parameter(0.7, real)
    gamma: float = parameter(0.4, real)

    def initial_state(self, rng: np.random.Generator) -> np.ndarray:
        """Near the mode of ``x1`` and the ties' centres, ``0.05 N(0, I)`` off: ``(3,)``."""
        u = max(self.shape - 1.0, 0.5) * self.theta
        x2 = self.alpha * math.log(u)
        return np.array([u, x2, self.gamma * x2 * x2]) + 0.05 * rng.standard_normal(3)


_HEAVY_SCALE = ((1.0, 0.6), (0.6, 0.8))


@dataclass(eq=False)
class HeavyTail(MalaSystem, name="heavy-tail", system=densities.STUDENT, step=0.01, subsample=60):
    """Multivariate Student-t density (default d = 2), MALA-sampled.

    ``p_eq ∝ (1 + (x - loc)^T Q (x - loc) / nu)^(-(nu + d)/2)``, ``Q = scale^{-1}``; mean
    ``loc``, covariance ``nu / (nu - 2) scale`` (``nu > 2``), marginal excess kurtosis
    ``6 / (nu - 4)`` (``nu > 4``; 6 at the default ``nu = 5``), and ``(x - loc)^T Q (x - loc) / d``
    is ``F(d, nu)``-distributed. Score ``-(nu + d) Q (x - loc) / (nu + (x - loc)^T Q (x - loc))``.

    Parameters
    ----------
    nu : degrees of freedom (5; must exceed 2 for a finite variance).
    scale : (d, d) symmetric positive-definite scale matrix (((1, 0.6), (0.6, 0.8))).
    loc : (d,) location ((0.5, -0.3)).
    step : MALA step (0.01).  subsample : (60).
    """

    nu: float = parameter(5.0, positive)
    scale: np.ndarray = parameter(_HEAVY_SCALE, matrix)
    loc: np.ndarray = parameter((0.5, -0.3), matrix)  # (d,): checked once d is known
    precision: np.ndarray = derived()

    def _derive(self) -> None:
        if self.nu <= 2.0:
            raise ValueError(f"nu={self.nu!r} must exceed 2 (finite variance)")
        scale = self.scale
        if scale.ndim != 2 or scale.shape[0] != scale.shape[1]:
            raise ValueError(f"scale={scale.tolist()!r} must be a square (d, d) matrix")
        d = scale.shape[0]
        if (
            d == 0
            or not np.all(np.isfinite(scale))
            or not np.allclose(scale, scale.T)
            or np.linalg.eigvalsh(scale).min() <= 0
        ):
            raise ValueError(f"scale={scale.tolist()!r} must be symmetric positive definite")
        self.loc = vector("loc", self.loc, d)
        self.components = tuple(f"x{i + 1}" for i in range(d))
        self.precision = np.linalg.inv(scale)
        self._theta = np.concatenate([[self.nu], self.loc, self.precision.ravel()])

    def covariance(self) -> np.ndarray:
        """Exact covariance ``nu / (nu - 2) scale``, shape ``(d, d)``."""
        return self.nu / (self.nu - 2.0) * self.scale

    def initial_state(self, rng: np.random.Generator) -> np.ndarray:
        """``loc`` plus ``0.1 N(0, I)``: ``(d,)``."""
        return self.loc + 0.1 * rng.standard_normal(self.loc.shape[0])


# --------------------------------------------------------------------------------------------
# hard wall: exactly sampled CIR coordinate and a Gaussian coordinate riding on it
# --------------------------------------------------------------------------------------------


def _gamma_shape(name: str, value: Any) -> float:
    """A real multiple of 1/2 that is at least 1, or a ValueError naming the parameter."""
    result = real(name, value)
    if result < 1.0 or 2.0 * result != round(2.0 * result):
        raise ValueError(f"{name}={value!r} must be a multiple of 1/2 and at least 1")
    return result


@dataclass(eq=False)
class Wall(Parameters):
    """A skewed density with a hard wall at ``x1 = 0`` (d = 2), sampled exactly.

    ``x1`` is the CIR process ``dx1 = kappa (mean - x1) dt + sigma sqrt(x1) dW1`` with
    ``sigma^2 = 2 kappa mean / shape``; ``x2 = coupling x1 + w`` with ``w`` the OU process
    ``dw = -gamma w dt + sigma_w sqrt(2 gamma) dW2``. The stationary density is::

        p_eq(x1, x2) = Gamma(x1; shape, scale = mean / shape) N(x2 - coupling x1; 0, sigma_w^2)
                     ∝ x1^(shape - 1) exp(-shape x1 / mean - (x2 - coupling x1)^2 / (2 sigma_w^2))

    on ``x1 > 0``. Score: ``((shape - 1)/x1 - shape/mean + coupling r / sigma_w^2,
    -r / sigma_w^2)`` with ``r = x2 - coupling x1``. ``2 shape`` must be an integer ``>= 2``
    (``shape >= 1``): then ``x1`` is the squared norm of a ``2 shape``-dimensional OU process and
    its noncentral chi-square transition costs ``2 shape`` normals (no rejection sampling), so
    each stored sample uses ``2 shape + 1`` normals and is an exact draw of the transition over
    ``dt``. ``log_density`` is ``-inf`` and ``score`` NaN/inf where ``x1 <= 0``.

    Parameters
    ----------
    shape : Gamma shape (2.5; a multiple of 1/2, ``>= 1``).  mean : ``E[x1]`` (1).
    kappa : CIR rate (1).  coupling : (0.8).  gamma : OU rate of ``w`` (2).
    sigma_w : stationary std of ``w`` (0.5).  dt : time between samples (0.05).
    """

    name: ClassVar[str] = "wall"
    components: ClassVar[tuple[str, ...]] = ("x1", "x2")
    default_burn_in: ClassVar[int] = 0  # initial_state draws from p_eq

    # x1, the CIR coordinate, and its transition's constants
    shape: float = parameter(2.5, _gamma_shape)
    mean: float = parameter(1.0, positive)
    kappa: float = parameter(1.0, positive)
    _dof: int = derived()
    _decay: float = derived()
    _spread: float = derived()
    # x2 = coupling x1 + w, with w's OU transition
    coupling: float = parameter(0.8, real)
    gamma: float = parameter(2.0, positive)
    sigma_w: float = parameter(0.5, positive)
    _rho: float = derived()
    _kick: float = derived()
    dt: float = parameter(0.05, positive)

    def _derive(self) -> None:
        self._dof = int(round(2.0 * self.shape))
        self._decay = math.exp(-0.5 * self.kappa * self.dt)
        self._spread = math.sqrt(self.mean / self._dof * -math.expm1(-self.kappa * self.dt))
        self._rho = math.exp(-self.gamma * self.dt)
        self._kick = self.sigma_w * math.sqrt(-math.expm1(-2.0 * self.gamma * self.dt))
        if self._spread == 0.0 or self._kick == 0.0:
            raise ValueError(f"dt={self.dt!r} is too small for the transition to be resolved")

    def initial_state(self, rng: np.random.Generator) -> np.ndarray:
        """A draw from ``p_eq``: ``(2,)``."""
        x1 = self.mean / self.shape * rng.standard_gamma(self.shape)
        return np.array([x1, self.coupling * x1 + self.sigma_w * rng.standard_normal()])

    def advance(
        self, state: np.ndarray, n_samples: int, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        """The next ``n_samples`` stored samples ``(n_samples, 2)`` and the new state ``(2,)``."""
        x = start(state, n_samples, 2)
        if not x[0] > 0.0:
            raise ValueError(f"state={x!r} must have x1 > 0 (the wall)")

        def kernel(x0: np.ndarray, normals: np.ndarray, out: np.ndarray) -> np.ndarray:
            return cir_gaussian(
                x0, normals, out, self._decay, self._spread, self.coupling, self._rho, self._kick
            )

        return run_blocks(x, n_samples, rng, self._dof + 1, kernel, 2)

    def score(self, x: np.ndarray) -> np.ndarray:
        """Exact ``grad log p_eq`` at ``x (n, 2)`` (``x1 > 0``), shape ``(n, 2)``."""
        x = points(x, 2)
        r = (x[:, 1] - self.coupling * x[:, 0]) / self.sigma_w**2
        with np.errstate(divide="ignore", invalid="ignore"):
            first = (self.shape - 1.0) / x[:, 0] - self.shape / self.mean + self.coupling * r
        first[x[:, 0] <= 0] = math.nan
        return np.column_stack([first, -r])

    def log_density(self, x: np.ndarray) -> np.ndarray:
        """Unnormalised ``log p_eq`` at ``x (n, 2)``, ``-inf`` where ``x1 <= 0``: ``(n,)``."""
        x = points(x, 2)
        r = x[:, 1] - self.coupling * x[:, 0]
        with np.errstate(divide="ignore", invalid="ignore"):
            out = (
                (self.shape - 1.0) * np.log(x[:, 0])
                - self.shape / self.mean * x[:, 0]
                - 0.5 * r * r / self.sigma_w**2
            )
        out[x[:, 0] <= 0] = -math.inf
        return out


#: the systems of this module, registered in :data:`kelr_dist.models.registry.MODEL_NAMES`
SYSTEMS: tuple[type[Model], ...] = (
    CurvedWells, Coupled3D, Coupled4D, Coupled6D, HeavyTail, Wall, TrigTie4D, GammaTie3D,
)  # fmt: skip
