"""The test systems: triple-well, Langevin-Morse (paper §5) and Ornstein-Uhlenbeck.

Each model has a closed-form equilibrium density ``p_eq`` (so the exact-FDT response, with the
true score ``grad log p_eq`` in eq. 5, is the reference the estimates are judged against)
and a resumable sampler: ``advance(state, n, rng)`` returns the next ``n`` stored samples, and
``advance(a)`` then ``advance(b)`` (same ``rng`` object continued) equals ``advance(a + b)`` bit
for bit, because the standard normals are drawn from one numpy ``Generator`` stream in order,
in sub-blocks of bounded size, and fed to the numba kernels of :mod:`kelr_dist.kernels.integrators`.

``make_model(name, **params)`` builds a model from its command-line name; ``model.params()`` is
JSON-serialisable and rebuilds the same model.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import numpy as np
from scipy.linalg import cholesky, expm, solve_continuous_lyapunov

from kelr_dist.data.parametrised import (
    Parameter,
    Parametrised,
    fraction,
    integration,
    matrix,
    positive,
    real,
)
from kelr_dist.kernels import integrators
from kelr_dist.kernels.checks import is_whole

# standard normals drawn per sub-block (bounds the simulator's scratch memory: 512 KiB)
_NORMALS_PER_BLOCK = 1 << 16


@runtime_checkable
class Model(Protocol):
    """A stochastic system with a known equilibrium density and a resumable sampler.

    Attributes
    ----------
    name : command-line name (one of :data:`MODEL_NAMES`).
    components : names of the ``d`` state components.
    dt : time between stored samples (integrator step times the subsampling factor).
    default_burn_in : stored samples to discard before the chain is at equilibrium.
    """

    name: str
    components: tuple[str, ...]
    dt: float
    default_burn_in: int

    def params(self) -> dict[str, Any]:
        """JSON-serialisable parameters; ``make_model(name, **params())`` rebuilds the model."""
        ...

    def initial_state(self, rng: np.random.Generator) -> np.ndarray:
        """A starting state, shape ``(d,)``."""
        ...

    def advance(
        self, state: np.ndarray, n_samples: int, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        """The next ``n_samples`` stored samples ``(n_samples, d)`` and the new state ``(d,)``."""
        ...

    def score(self, x: np.ndarray) -> np.ndarray:
        """Exact ``grad log p_eq`` at ``x (n, d)``, shape ``(n, d)``."""
        ...

    def log_density(self, x: np.ndarray) -> np.ndarray:
        """Unnormalised ``log p_eq`` at ``x (n, d)``, shape ``(n,)``."""
        ...


# --------------------------------------------------------------------------------------------
# shared helpers
# --------------------------------------------------------------------------------------------

Kernel = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]


def _start(state: np.ndarray, n_samples: int, d: int) -> np.ndarray:
    """A float64 copy of ``state`` (the caller's is never modified), after checking its shape
    ``(d,)`` and that ``n_samples`` is a non-negative integer."""
    x = np.array(state, dtype=np.float64)
    if x.shape != (d,):
        raise ValueError(f"state of shape {x.shape} must have shape ({d},)")
    if not is_whole(n_samples):
        raise ValueError(f"n_samples={n_samples!r} must be a non-negative integer")
    return x


def _run_blocks(
    state: np.ndarray,
    n_samples: int,
    rng: np.random.Generator,
    normals_per_sample: int,
    kernel: Kernel,
    d: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Advance ``state`` by ``n_samples`` stored samples, drawing normals in sub-blocks.

    ``kernel(x0 (d,), normals (k, normals_per_sample), out (k, d))`` fills ``out`` with the
    next ``k`` samples. The normals are drawn from ``rng`` in order, so the result does not
    depend on the sub-block size nor on how a run is split into calls.

    Returns
    -------
    samples : (n_samples, d) float64.
    new_state : (d,) float64, the last sample (a copy of ``state`` when ``n_samples == 0``).
    """
    x = _start(state, n_samples, d)
    out = np.empty((n_samples, d))
    per_block = max(1, _NORMALS_PER_BLOCK // normals_per_sample)
    buffer = np.empty((min(per_block, n_samples), normals_per_sample))
    for start in range(0, n_samples, per_block):
        stop = min(start + per_block, n_samples)
        normals = buffer[: stop - start]
        rng.standard_normal(out=normals)
        kernel(x, normals, out[start:stop])
        x = out[stop - 1].copy()
    return out, x


_MASK64 = (1 << 64) - 1
_NO_NORMALS = np.zeros((0, 4))  # the normals a kernel drawing its own does not read


def _run_pcg64(
    state: np.ndarray,
    n_samples: int,
    rng: np.random.Generator,
    d: int,
    kernel: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray],
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_run_blocks` for a kernel that draws its normals from ``rng``'s PCG64 state.

    ``kernel(x0 (d,), words (4,) uint64, out (k, d))`` fills ``out`` and advances ``words``
    (``[state high, state low, inc high, inc low]``) exactly as ``rng.standard_normal`` would
    (:func:`kelr_dist.kernels.integrators.pcg64_standard_normal`); the new state is written back to
    ``rng``, so the samples and the generator afterwards are those of the buffered path.
    """
    x = _start(state, n_samples, d)
    out = np.empty((n_samples, d))
    if n_samples == 0:
        return out, x
    generator = rng.bit_generator.state
    value, inc = generator["state"]["state"], generator["state"]["inc"]
    words = np.array([value >> 64, value & _MASK64, inc >> 64, inc & _MASK64], dtype=np.uint64)
    kernel(x, words, out)
    generator["state"]["state"] = (int(words[0]) << 64) | int(words[1])
    rng.bit_generator.state = generator  # has_uint32 / uinteger untouched: 64-bit draws only
    return out, out[-1].copy()


# --------------------------------------------------------------------------------------------
# Ornstein-Uhlenbeck
# --------------------------------------------------------------------------------------------

_OU_GAMMA = ((1.0, 0.6), (-0.4, 0.8))
_OU_SIGMA = ((math.sqrt(2.0), 0.0), (0.0, math.sqrt(2.0)))


class OrnsteinUhlenbeck(Parametrised):
    """``dX = -Gamma X dt + Sigma dW``, sampled exactly (not in the paper; a Gaussian check).

    The default ``Gamma`` is non-symmetric (eigenvalues ``0.9 +- 0.48i``), so the response
    ``expm(-Gamma t)`` has non-zero, unequal off-diagonal entries.

    Parameters
    ----------
    gamma : (d, d) drift matrix; its eigenvalues must have positive real parts.
    sigma : (d, d) noise matrix (``Sigma Sigma^T`` positive definite).
    dt : time between samples (exact transition, no discretisation error).
    """

    name = "ou"
    default_burn_in = 0  # initial_state draws from p_eq

    def __init__(
        self,
        gamma: Any = _OU_GAMMA,
        sigma: Any = _OU_SIGMA,
        dt: float = 0.05,
    ) -> None:
        self.gamma = matrix("gamma", gamma)
        if self.gamma.ndim != 2 or self.gamma.shape[0] != self.gamma.shape[1]:
            raise ValueError(f"gamma={gamma!r} must be a square (d, d) matrix")
        d = self.gamma.shape[0]
        if not np.all(np.isfinite(self.gamma)) or np.linalg.eigvals(self.gamma).real.min() <= 0:
            raise ValueError(
                f"gamma={gamma!r} must be finite with eigenvalues of positive real part"
            )
        self.sigma = matrix("sigma", sigma)
        if self.sigma.shape != (d, d) or not np.all(np.isfinite(self.sigma)):
            raise ValueError(f"sigma={sigma!r} must be a finite ({d}, {d}) matrix")
        diffusion = self.sigma @ self.sigma.T
        if np.linalg.eigvalsh(diffusion).min() <= 0:
            raise ValueError(f"sigma={sigma!r} must have full rank (Sigma Sigma^T > 0)")
        self.dt = positive("dt", dt)
        self.components = tuple(f"x{i + 1}" for i in range(d))
        covariance = solve_continuous_lyapunov(self.gamma, diffusion)
        self._covariance = 0.5 * (covariance + covariance.T)
        self._precision = np.linalg.inv(self._covariance)
        self._transition = expm(-self.gamma * self.dt)
        step_cov = self._covariance - self._transition @ self._covariance @ self._transition.T
        try:
            self._noise = cholesky(0.5 * (step_cov + step_cov.T), lower=True)
        except np.linalg.LinAlgError:
            raise ValueError(
                f"dt={dt!r} is too small for the transition covariance to be resolved"
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
        return _run_blocks(state, n_samples, rng, d, kernel, d)

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


class TripleWell(Parametrised):
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

    name = "triple-well"
    components = ("x1", "x2")
    default_burn_in = 2000  # 10 time units at dt = 5e-3: many well-hopping times at kT = 1.5

    parameters = {
        "a": Parameter(1.0, positive),
        "kT": Parameter(1.5, positive),
        "gamma": Parameter(0.25, fraction),
        **integration(step=1e-3, subsample=5),
        "variant": Parameter("paper", _variant),
    }

    def _derive(self) -> None:
        self.dt = self.step * self.subsample

    def _shape(self) -> tuple[float, float, bool]:
        return self.a, self.gamma, self.variant == "radial"

    def potential(self, x: np.ndarray) -> np.ndarray:
        """``V`` of eq. 60 at ``x (n, 2)``, shape ``(n,)``."""
        return integrators.triple_well_potential(_points(x, 2), *self._shape())

    def gradient(self, x: np.ndarray) -> np.ndarray:
        """Analytic ``grad V`` at ``x (n, 2)``, shape ``(n, 2)``."""
        return integrators.triple_well_gradient(_points(x, 2), *self._shape())

    def initial_state(self, rng: np.random.Generator) -> np.ndarray:
        centre = np.array([self.a, self.a / math.sqrt(3.0)])
        return centre + math.sqrt(self.kT / 1.6) * rng.standard_normal(2)

    def advance(
        self, state: np.ndarray, n_samples: int, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        if type(rng.bit_generator) is np.random.PCG64:  # normals drawn inside the kernel
            return _run_pcg64(state, n_samples, rng, 2, self._pcg64_kernel)

        def kernel(x0: np.ndarray, normals: np.ndarray, out: np.ndarray) -> np.ndarray:
            return self._kernel(x0, normals.reshape(-1, 4), out)

        return _run_blocks(state, n_samples, rng, 4 * self.subsample, kernel, 2)

    def _pcg64_kernel(self, x0: np.ndarray, words: np.ndarray, out: np.ndarray) -> np.ndarray:
        return self._kernel(x0, _NO_NORMALS, out, words)

    def _kernel(
        self, x0: np.ndarray, normals: np.ndarray, out: np.ndarray, words: np.ndarray | None = None
    ) -> np.ndarray:
        return integrators.weak_trapezoidal_triple_well(
            x0, normals, out, self.step, self.subsample, self.a, self.gamma, self.kT,
            self.variant == "radial", words,
        )  # fmt: skip

    def score(self, x: np.ndarray) -> np.ndarray:
        return -self.gradient(x) / self.kT

    def log_density(self, x: np.ndarray) -> np.ndarray:
        return -self.potential(x) / self.kT


# --------------------------------------------------------------------------------------------
# Langevin dynamics with the Morse potential (paper §5.2)
# --------------------------------------------------------------------------------------------


class LangevinMorse(Parametrised):
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

    name = "langevin-morse"
    components = ("x", "v")
    default_burn_in = 2000  # 20 time units at dt = 1e-2: ten velocity relaxation times 1/gamma

    parameters = {
        "gamma": Parameter(0.5, positive),
        "kT": Parameter(1.0, positive),
        "epsilon": Parameter(0.2, positive),
        "a": Parameter(10.0, positive),
        "x0": Parameter(0.0, real),
        **integration(step=1e-3, subsample=10),
    }

    def _derive(self) -> None:
        self.dt = self.step * self.subsample

    def potential(self, x: np.ndarray) -> np.ndarray:
        """Morse potential ``U`` at positions ``x (n,)``, shape ``(n,)``."""
        return integrators.morse_potential(_points(x, 1)[:, 0], self.epsilon, self.a, self.x0)

    def force_slope(self, x: np.ndarray) -> np.ndarray:
        """Analytic ``U'`` at positions ``x (n,)``, shape ``(n,)``."""
        return integrators.morse_slope(_points(x, 1)[:, 0], self.epsilon, self.a, self.x0)

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

        return _run_blocks(state, n_samples, rng, self.subsample, kernel, 2)

    def score(self, x: np.ndarray) -> np.ndarray:
        x = _points(x, 2)
        return np.stack([-self.force_slope(x[:, 0]), -x[:, 1]], axis=1) / self.kT

    def log_density(self, x: np.ndarray) -> np.ndarray:
        x = _points(x, 2)
        return -(self.potential(x[:, 0]) + 0.5 * x[:, 1] ** 2) / self.kT


def _points(x: np.ndarray, d: int) -> np.ndarray:
    """``x`` as a C-contiguous float64 ``(n, d)`` array (``(n,)`` accepted when ``d == 1``)."""
    x = np.ascontiguousarray(x, dtype=np.float64)
    if d == 1 and x.ndim == 1:
        x = x[:, None]
    if x.ndim != 2 or x.shape[1] != d:
        raise ValueError(f"points of shape {x.shape} must have shape (n, {d})")
    return x


# --------------------------------------------------------------------------------------------
# registry
# --------------------------------------------------------------------------------------------

from kelr_dist.data import angle_systems, systems  # noqa: E402  (imports the helpers above)

_MODELS: dict[str, type] = {
    TripleWell.name: TripleWell,
    LangevinMorse.name: LangevinMorse,
    OrnsteinUhlenbeck.name: OrnsteinUhlenbeck,
    **{cls.name: cls for cls in systems.SYSTEMS},
    **{cls.name: cls for cls in angle_systems.SYSTEMS},
}
MODEL_NAMES: tuple[str, ...] = tuple(_MODELS)


def make_model(name: str, **params: Any) -> Model:
    """Build the model called ``name`` (one of :data:`MODEL_NAMES`) with keyword ``params``.

    Raises
    ------
    ValueError
        naming an unknown model, an unknown parameter, or a parameter with a bad value.
    """
    try:
        cls = _MODELS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown model name={name!r}; expected one of {MODEL_NAMES}") from None
    accepted = set(inspect.signature(cls).parameters)
    unknown = sorted(set(params) - accepted)
    if unknown:
        raise ValueError(
            f"unknown parameter(s) {unknown} for model {name!r}; accepted: {sorted(accepted)}"
        )
    return cls(**params)
