"""Model parameters as dataclass fields, each checked on construction by the check it names."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from kelr_dist.kernels.checks import is_whole

Check = Callable[[str, Any], Any]
"""``check(name, value)``: the value to keep (converted), or a ValueError naming the parameter."""


def parameter(default: Any, check: Check) -> Any:
    """A dataclass field with ``default`` whose given value ``check`` converts or rejects."""
    return dataclasses.field(default=default, metadata={"check": check})


def derived() -> Any:
    """A dataclass field computed from the parameters (not a constructor argument)."""
    return dataclasses.field(init=False, repr=False, compare=False)


@dataclasses.dataclass(eq=False)
class Parameters:
    """A model whose constructor arguments are dataclass fields made by :func:`parameter`.

    A subclass is a ``@dataclass``: on construction each parameter is checked and set in field
    order, then :meth:`_derive` computes the :func:`derived` fields (and makes the checks that
    involve several parameters). :meth:`params` gives the parameters back.
    """

    #: whether ``score`` and ``log_density`` are known in closed form (the exact FDT)
    closed_form_density: ClassVar[bool] = True

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            if field.init:
                value = getattr(self, field.name)
                setattr(self, field.name, field.metadata["check"](field.name, value))
        self._derive()

    def _derive(self) -> None:
        """What follows from the checked parameters (and the checks that involve several)."""

    def params(self) -> dict[str, Any]:
        """JSON-serialisable parameters; ``make_model(name, **params())`` rebuilds the model
        (a numpy array is returned as nested lists)."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.init}
        return {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in values.items()}


# --------------------------------------------------------------------------------------------
# checks
# --------------------------------------------------------------------------------------------


def real(name: str, value: Any) -> float:
    """``value`` as a finite float, or a ValueError naming the parameter."""
    try:
        result = float(value)
    except (TypeError, ValueError):
        result = math.nan
    if not math.isfinite(result):
        raise ValueError(f"{name}={value!r} must be a finite real number")
    return result


def positive(name: str, value: Any) -> float:
    """``value`` as a finite positive float, or a ValueError naming the parameter."""
    result = real(name, value)
    if result <= 0:
        raise ValueError(f"{name}={value!r} must be positive")
    return result


def fraction(name: str, value: Any) -> float:
    """``value`` as a float in the open interval ``(0, 1)``, or a ValueError naming it."""
    result = real(name, value)
    if not 0.0 < result < 1.0:
        raise ValueError(f"{name}={value!r} must lie in (0, 1)")
    return result


def count(name: str, value: Any) -> int:
    """``value`` as a positive integer (not a bool), or a ValueError naming the parameter."""
    if not is_whole(value, 1):
        raise ValueError(f"{name}={value!r} must be a positive integer")
    return int(value)


def matrix(name: str, value: Any) -> np.ndarray:
    """``value`` as a float64 array, or a ValueError naming the parameter."""
    try:
        return np.array(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{name}={value!r} must be a matrix of real numbers") from None


def vector(name: str, value: Any, d: int) -> np.ndarray:
    """``value`` as a finite float64 ``(d,)`` array, or a ValueError naming the parameter."""
    try:
        result = np.array(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{name}={value!r} must be {d} real numbers") from None
    if result.shape != (d,) or not np.all(np.isfinite(result)):
        raise ValueError(f"{name}={value!r} must be {d} finite real numbers")
    return result
