"""The built-in observables and forcings that options name, and a wrapped angle's derivative.

Built-ins: the observables ``square`` and ``angles``, the ``linear`` forcing; the derivative of
a wrapped angle carries its jump at the wrap.

Module-level functions and frozen dataclasses, so that the Dask workers unpickle them by
reference.

Angles. A periodic component ``x_j`` of period ``P_j`` is the angle ``θ_j = 2π x_j / P_j``.
:class:`Angles` gives ``(cos θ_j, sin θ_j)`` for it and ``x_j`` for a component on the line:
smooth functions on the torus, for which Stein's identity holds without boundary terms. The
wrapped angle itself (the identity observable on stored angles) jumps by ``-P_j`` where the
values wrap, so its derivative on the circle is ``1 - P_j δ(x_j - wrap_j)`` and the lag-0
identity reads ``k_jj(0) = 1 - P_j p_j(wrap_j)`` (constant forcing; ``p_j`` the marginal density).
:class:`WrappedJacobian` is that derivative with the delta smoothed by a von Mises kernel of
width ``h`` radians, :func:`wrap_bandwidth`: its sample mean is then a kernel estimate of the
boundary term, and the block averaging of the Stein residual carries its standard error.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.special import i0e

#: the wrap's smoothed delta has width WRAP_BANDWIDTH · N^(-1/5) radians for N samples:
#: Silverman's rule 1.06 σ N^(-1/5) (Silverman 1986, eq. 3.28) for a density that varies on the
#: scale of a radian (its bias, ~h² p''/2, then stays below its noise)
WRAP_BANDWIDTH = 1.0


def wrap_bandwidth(samples: int) -> float:
    """Width ``h`` (radians) of the smoothed delta at the wrap for ``samples`` samples."""
    return WRAP_BANDWIDTH * max(int(samples), 1) ** -0.2


@dataclass(frozen=True)
class WrappedJacobian:
    """``∂_j A_i`` of the identity observable when some components are wrapped angles:
    ``δ_ij (1 - P_j K_h(x_j - wrap_j))`` with ``K_h`` the von Mises kernel of concentration
    ``1/h²`` on the circle of period ``P_j`` (unit integral); ``(n, d) -> (n, d, d)``.

    ``periods`` ``(d,)`` (0: on the line), ``wraps`` ``(d,)`` the wrap points, ``bandwidth`` ``h``.
    """

    periods: tuple[float, ...]
    wraps: tuple[float, ...]
    bandwidth: float

    def __call__(self, x: np.ndarray) -> np.ndarray:
        n, d = x.shape
        out = np.zeros((n, d, d))
        idx = np.arange(d)
        out[:, idx, idx] = 1.0
        kappa = 1.0 / self.bandwidth**2
        for j, period in enumerate(self.periods):
            if period > 0:
                angle = (2.0 * math.pi / period) * (x[:, j] - self.wraps[j])
                kernel = np.exp(kappa * (np.cos(angle) - 1.0)) / (period * i0e(kappa))
                out[:, j, j] -= period * kernel
        return out


@dataclass(frozen=True)
class Angles:
    """``(cos θ_j, sin θ_j)`` for each component of period ``P_j > 0`` (``θ_j = 2π x_j / P_j``),
    ``x_j`` for the others: ``(n, d) -> (n, q)``, ``q = d + (periodic components)``."""

    periods: tuple[float, ...]

    def __call__(self, x: np.ndarray) -> np.ndarray:
        columns = []
        for j, period in enumerate(self.periods):
            if period > 0:
                angle = (2.0 * math.pi / period) * x[:, j]
                columns += [np.cos(angle), np.sin(angle)]
            else:
                columns.append(x[:, j])
        return np.column_stack(columns)

    def derivative(self, x: np.ndarray) -> np.ndarray:
        """``∂_j A_i``, ``(n, q, d)``."""
        n, d = x.shape
        out = np.zeros((n, d + sum(p > 0 for p in self.periods), d))
        row = 0
        for j, period in enumerate(self.periods):
            if period > 0:
                rate = 2.0 * math.pi / period
                angle = rate * x[:, j]
                out[:, row, j] = -rate * np.sin(angle)
                out[:, row + 1, j] = rate * np.cos(angle)
                row += 2
            else:
                out[:, row, j] = 1.0
                row += 1
        return out


def angle_names(components: Sequence[str], periods: Sequence[float]) -> tuple[str, ...]:
    """Names of :class:`Angles`' components: ``cos(c), sin(c)`` for a periodic ``c``, else ``c``."""
    names: list[str] = []
    for c, period in zip(components, periods, strict=True):
        names += [f"cos({c})", f"sin({c})"] if period > 0 else [c]
    return tuple(names)


def square(x: np.ndarray) -> np.ndarray:
    """``A(x) = x**2`` per component: ``(n, d) -> (n, d)``."""
    return np.square(x)


def square_derivative(x: np.ndarray) -> np.ndarray:
    """``∂_j A_i = 2 x_i δ_ij`` of :func:`square`: ``(n, d) -> (n, d, d)``."""
    out = np.zeros((*x.shape, x.shape[1]))
    idx = np.arange(x.shape[1])
    out[:, idx, idx] = 2.0 * x
    return out


def linear_forcing(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``c_i(x) = x_i`` and ``d c_i / d x_i = 1``: two ``(n, d)`` arrays."""
    return np.array(x, dtype=np.float64), np.ones_like(x, dtype=np.float64)
