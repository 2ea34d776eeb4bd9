"""The model protocol and registry: every built-in model by its command-line name.

Each model has a closed-form equilibrium density ``p_eq`` (so the exact-FDT response, with the
true score ``grad log p_eq`` in eq. 5, is the reference the estimates are judged against) and a
resumable sampler (:mod:`kelr_dist.models.sampling`). ``make_model(name, **params)`` builds a
model from its command-line name; ``model.params()`` is JSON-serialisable and rebuilds the same
model.
"""

from __future__ import annotations

import inspect
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np

from kelr_dist.models import angle_systems, benchmark_systems, paper_systems


@runtime_checkable
class Model(Protocol):
    """A stochastic system with a known equilibrium density and a resumable sampler."""

    #: command-line name (one of :data:`MODEL_NAMES`)
    name: ClassVar[str]

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


_MODELS: dict[str, type[Model]] = {
    cls.name: cls
    for cls in (*paper_systems.SYSTEMS, *benchmark_systems.SYSTEMS, *angle_systems.SYSTEMS)
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
