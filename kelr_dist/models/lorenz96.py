"""Stochastic Lorenz-96 on a ring of sites: a test bed without a closed-form density.

``dx_k = ((x_{k+1} - x_{k-2}) x_{k-1} - x_k + F_k) dt + sigma dW_k``, ``k = 1..K`` on a ring
(Lorenz 1996; the quasi-Gaussian FDT is tested on it against direct perturbation by Abramov &
Majda 2007). Each integrator step is a classical Runge-Kutta step of the drift followed by the
noise increment ``sigma sqrt(h) z`` (a splitting of weak order one); every ``subsample``-th
state is stored. Its equilibrium density is not known in closed form, so there is no exact-FDT
reference: :meth:`Lorenz96.score` and :meth:`Lorenz96.log_density` refuse, and the response is
checked against a direct perturbation experiment (``scripts/lorenz96_response.py``) instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from kelr_dist.kernels.compiled import compiled
from kelr_dist.models.parameters import Parameters, count, derived, parameter, positive, real
from kelr_dist.models.sampling import run_blocks

if TYPE_CHECKING:
    from kelr_dist.models.protocol import Model


@compiled
def lorenz96_drift(x: np.ndarray, forcing: np.ndarray, out: np.ndarray) -> None:
    """``out_k = (x_{k+1} - x_{k-2}) x_{k-1} - x_k + forcing_k`` on a ring, all ``(K,)``."""
    n = x.shape[0]
    for k in range(n):
        out[k] = (x[(k + 1) % n] - x[k - 2]) * x[k - 1] - x[k] + forcing[k]


@compiled
def lorenz96_steps(
    x0: np.ndarray,
    normals: np.ndarray,
    out: np.ndarray,
    step: float,
    subsample: int,
    forcing: np.ndarray,
    sigma: float,
) -> np.ndarray:
    """Integrate Lorenz-96 from ``x0 (K,)`` and store every ``subsample``-th state.

    Parameters
    ----------
    normals : (k, subsample * K) standard normals, ``K`` per integrator step, in step order.
    out : (k, K) written with the stored states.
    step : integrator step ``h``.
    forcing : (K,) the forcing ``F_k`` of each site (``F`` everywhere for the model; a
        perturbed one for a direct perturbation experiment, which passes the same ``normals``
        with both signs of its perturbation).
    sigma : additive noise amplitude.
    """
    n = x0.shape[0]
    x = x0.copy()
    k1 = np.empty(n)
    k2 = np.empty(n)
    k3 = np.empty(n)
    k4 = np.empty(n)
    y = np.empty(n)
    kick = sigma * np.sqrt(step)
    for row in range(out.shape[0]):
        for s in range(subsample):
            lorenz96_drift(x, forcing, k1)
            for i in range(n):
                y[i] = x[i] + 0.5 * step * k1[i]
            lorenz96_drift(y, forcing, k2)
            for i in range(n):
                y[i] = x[i] + 0.5 * step * k2[i]
            lorenz96_drift(y, forcing, k3)
            for i in range(n):
                y[i] = x[i] + step * k3[i]
            lorenz96_drift(y, forcing, k4)
            for i in range(n):
                x[i] += step / 6.0 * (k1[i] + 2.0 * (k2[i] + k3[i]) + k4[i])
                x[i] += kick * normals[row, s * n + i]
        out[row] = x
    return out


def _sites(name: str, value: object) -> int:
    """At least 4 sites (the drift reaches two sites back and one ahead), or a ValueError."""
    sites = count(name, value)
    if sites < 4:
        raise ValueError(f"{name}={value!r} must be at least 4 (the ring of sites)")
    return sites


@dataclass(eq=False)
class Lorenz96(Parameters):
    """Stochastic Lorenz-96 on ``K`` sites with forcing ``F`` and additive noise ``sigma``.

    Parameters
    ----------
    K : number of sites (default 40, as in Lorenz 1996 and Abramov & Majda 2007).
    F : forcing (8: chaotic; 4-6: weakly chaotic, with strongly non-Gaussian statistics when
        the noise is small).
    sigma : additive noise amplitude on every site.
    step : integrator step ``h``.
    subsample : steps between stored samples.
    """

    name: ClassVar[str] = "lorenz96"
    closed_form_density: ClassVar[bool] = False
    default_burn_in: ClassVar[int] = 2000  # 100 time units at dt = 0.05

    K: int = parameter(40, _sites)
    F: float = parameter(8.0, real)
    sigma: float = parameter(0.5, positive)
    step: float = parameter(0.01, positive)
    subsample: int = parameter(5, count)
    components: tuple[str, ...] = derived()

    def _derive(self) -> None:
        self.components = tuple(f"x{k + 1}" for k in range(self.K))

    @property
    def dt(self) -> float:
        """Time between stored samples, ``step * subsample``."""
        return self.step * self.subsample

    def forcing(self, perturbation: np.ndarray | float = 0.0) -> np.ndarray:
        """The forcing of every site, ``F + perturbation``, shape ``(K,)``."""
        return np.full(self.K, self.F) + perturbation

    def initial_state(self, rng: np.random.Generator) -> np.ndarray:
        return self.F + rng.standard_normal(self.K)

    def advance(
        self,
        state: np.ndarray,
        n_samples: int,
        rng: np.random.Generator,
        perturbation: np.ndarray | float = 0.0,
    ) -> tuple[np.ndarray, np.ndarray]:
        """The next ``n_samples`` stored samples and the new state; ``perturbation`` (a number
        or ``(K,)``) is added to the forcing."""
        forcing = self.forcing(perturbation)

        def kernel(x0: np.ndarray, normals: np.ndarray, out: np.ndarray) -> np.ndarray:
            return lorenz96_steps(x0, normals, out, self.step, self.subsample, forcing, self.sigma)

        return run_blocks(state, n_samples, rng, self.subsample * self.K, kernel, self.K)

    def _no_density(self) -> ValueError:
        return ValueError(
            f"model {self.name!r} has no closed-form equilibrium density: no exact score or "
            "exact-FDT response (compare with a direct perturbation experiment)"
        )

    def score(self, x: np.ndarray) -> np.ndarray:  # noqa: ARG002 (the protocol's signature)
        raise self._no_density()

    def log_density(self, x: np.ndarray) -> np.ndarray:  # noqa: ARG002
        raise self._no_density()


#: the systems of this module, registered in :data:`kelr_dist.models.registry.MODEL_NAMES`
SYSTEMS: tuple[type[Model], ...] = (Lorenz96,)
