"""The built-in observables and forcings that options name: ``square`` and the ``linear`` forcing.

Module-level functions, so that the Dask workers unpickle them by reference.
"""

from __future__ import annotations

import numpy as np


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
