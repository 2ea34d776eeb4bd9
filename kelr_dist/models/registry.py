"""The model registry: every built-in model by its command-line name.

``make_model(name, **params)`` builds a model (:class:`~kelr_dist.models.protocol.Model`) from its
command-line name; ``model.params()`` is JSON-serialisable and rebuilds the same model.
"""

from __future__ import annotations

import inspect
from typing import Any

from kelr_dist.models import angle_systems, benchmark_systems, lattice, lorenz96, paper_systems
from kelr_dist.models.protocol import Model

_MODELS: dict[str, type[Model]] = {
    cls.name: cls
    for cls in (
        *paper_systems.SYSTEMS,
        *benchmark_systems.SYSTEMS,
        *angle_systems.SYSTEMS,
        *lorenz96.SYSTEMS,
        *lattice.SYSTEMS,
    )
}
#: the names of the built-in models (:func:`make_model`, ``kelr simulate``)
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
