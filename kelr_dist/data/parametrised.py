"""Model parameters: their checks, the constructor a table of them generates, and ``params()``."""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from kelr_dist.kernels.checks import is_whole

Check = Callable[[str, Any], Any]
"""``check(name, value)``: the value to keep (converted), or a ValueError naming the parameter."""


@dataclass(frozen=True)
class Parameter:
    """A constructor parameter: its default and the :data:`Check` of a given value."""

    default: Any
    check: Check

    def signature(self, name: str) -> inspect.Parameter:
        """This parameter in a constructor signature, annotated with its check's return type."""
        kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
        annotation = inspect.signature(self.check).return_annotation
        return inspect.Parameter(name, kind, default=self.default, annotation=annotation)


class Parametrised:
    """A model that keeps each constructor parameter as the attribute of the same name.

    A subclass either lists its parameters in :attr:`parameters` (name -> :class:`Parameter`, in
    signature order), which generates its constructor: each value is checked and set in that
    order, then :meth:`_derive` computes what follows from them; or it writes its own
    ``__init__``. :meth:`params` reads the names from the constructor's signature either way.
    """

    parameters: ClassVar[dict[str, Parameter]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "parameters" in vars(cls):  # the generated constructor's signature, typed by the checks
            cls.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
                [p.signature(name) for name, p in cls.parameters.items()]
            )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        bound = inspect.signature(type(self)).bind(*args, **kwargs)
        bound.apply_defaults()
        for name, value in bound.arguments.items():
            setattr(self, name, self.parameters[name].check(name, value))
        self._derive()

    def _derive(self) -> None:
        """What follows from the checked parameters (and the checks that involve several)."""

    def params(self) -> dict[str, Any]:
        """JSON-serialisable parameters; ``make_model(name, **params())`` rebuilds the model
        (a numpy array is returned as nested lists)."""
        values = {name: getattr(self, name) for name in inspect.signature(type(self)).parameters}
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


def integration(step: float, subsample: int) -> dict[str, Parameter]:
    """The ``step`` and ``subsample`` parameters of an integrated model, with these defaults."""
    return {"step": Parameter(step, positive), "subsample": Parameter(subsample, count)}
