"""Numba integrators for the test systems of the paper's §5 (and the Ornstein-Uhlenbeck check).

Every kernel advances one state through a block of pre-drawn standard normals and writes the
state after every ``subsample`` integrator steps into ``out``:

    kernel(x0 (d,), normals (k * subsample, m), out (k, d), step, subsample, *params) -> out

``normals`` holds the ``m`` standard normals each integrator step consumes, in the order the
step uses them. The state after the block is ``out[-1]``, so a long run is a sequence of kernel
calls, each started from the last row of the previous one; because the normals come from one
numpy ``Generator`` stream drawn in order, splitting a run into blocks anywhere gives the same
trajectory bit for bit (the models' ``advance`` relies on this).

Kernels assume validated input and never allocate per step. The scalar potentials and forces
are plain ``@njit`` functions shared by the kernels and by the vectorised evaluators the models
use (one implementation of each formula).
"""

from __future__ import annotations

import numpy as np
from numba import njit

# --------------------------------------------------------------------------------------------
# Ornstein-Uhlenbeck: exact Gaussian transition
# --------------------------------------------------------------------------------------------


@njit(cache=True, nogil=True)
def linear_gaussian(
    x0: np.ndarray, normals: np.ndarray, out: np.ndarray, transition: np.ndarray, noise: np.ndarray
) -> np.ndarray:
    """Exact sampling of a linear Gaussian recursion ``x_{n+1} = E x_n + L z_n``.

    Parameters
    ----------
    x0 : (d,) state before the block.
    normals : (k, d) standard normals ``z_n``.
    out : (k, d) written with ``x_1 .. x_k``.
    transition : (d, d) ``E = expm(-Gamma dt)``.
    noise : (d, d) ``L`` with ``L L^T = C - E C E^T`` (C the stationary covariance).
    """
    d = x0.shape[0]
    x = x0.copy()
    y = np.empty(d)
    for n in range(out.shape[0]):
        for i in range(d):
            acc = 0.0
            for j in range(d):
                acc += transition[i, j] * x[j] + noise[i, j] * normals[n, j]
            y[i] = acc
        for i in range(d):
            x[i] = y[i]
            out[n, i] = y[i]
    return out
