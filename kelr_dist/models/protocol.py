"""The model protocol: what every built-in model offers the simulator and the exact FDT.

Each model but Lorenz-96 has a closed-form equilibrium density ``p_eq`` (so the exact-FDT
response, with the true score ``grad log p_eq`` in eq. 5, is the reference the estimates are
judged against); each has a resumable sampler (:mod:`kelr_dist.models.sampling`). The systems
import this protocol; the registry (:mod:`kelr_dist.models.registry`) imports the systems, so no
import goes in a circle.
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class Model(Protocol):
    """A stochastic system with a known equilibrium density and a resumable sampler."""

    #: command-line name (one of :data:`MODEL_NAMES`)
    name: ClassVar[str]
    #: whether ``score`` and ``log_density`` are known in closed form; a model without them
    #: (Lorenz-96) raises ValueError from both, and has no exact-FDT response
    closed_form_density: ClassVar[bool]

    @property
    def components(self) -> tuple[str, ...]:
        """Names of the ``d`` state components."""
        ...

    @property
    def dt(self) -> float:
        """Time between stored samples (integrator step times the subsampling factor)."""
        ...

    @property
    def default_burn_in(self) -> int:
        """Stored samples to discard before the chain is at equilibrium."""
        ...

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
