"""``params()`` of the models and systems, read from their constructor's signature."""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np


class Parametrised:
    """:meth:`params` for a model that keeps each constructor parameter as the attribute of
    the same name (a numpy array is returned as nested lists)."""

    def params(self) -> dict[str, Any]:
        """JSON-serialisable parameters; ``make_model(name, **params())`` rebuilds the model."""
        values = {name: getattr(self, name) for name in inspect.signature(type(self)).parameters}
        return {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in values.items()}
