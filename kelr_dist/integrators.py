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

import math

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


# --------------------------------------------------------------------------------------------
# triple-well gradient system (eq:triple, eq:potential_well)
# --------------------------------------------------------------------------------------------

# underflow guard: exp(1/t) is 0 in float64 for 1/t below about -745
_EXP_FLOOR = -700.0


@njit(cache=True, nogil=True)
def well_bump(s: float, a: float, radial: bool) -> tuple[float, float]:
    """The well profile ``v`` of eq:potential_well at squared distance ``s``, and ``dv/ds``.

    ``radial=False`` (the paper as written): ``v(s) = 10 exp(1/(s^2 - a^2))`` for ``s < a``.
    ``radial=True``: ``v = 10 exp(1/(r^2 - a^2))`` for ``r < a`` with ``r^2 = s``.
    Both vanish, with all derivatives, at the edge of their support.
    """
    t = s - a * a if radial else s * s - a * a
    if t >= 0.0:
        return 0.0, 0.0
    inv = 1.0 / t
    if inv < _EXP_FLOOR:
        return 0.0, 0.0
    value = 10.0 * math.exp(inv)
    dvalue_dt = -value * inv * inv
    return value, dvalue_dt if radial else dvalue_dt * 2.0 * s


@njit(cache=True, nogil=True)
def triple_well_point(
    x1: float, x2: float, a: float, gamma: float, radial: bool
) -> tuple[float, float, float]:
    """``V(x)`` of eq:potential_well and its gradient ``(dV/dx1, dV/dx2)`` at one point.

    Wells of depth weights ``1, 1 - gamma, 1 + gamma`` centred at ``(0, 0)``, ``(2a, 0)``,
    ``(a, sqrt(3) a)``; retaining term ``0.8 |x - (a, a/sqrt(3))|^2``.
    """
    r1 = x1 - a
    r2 = x2 - a / math.sqrt(3.0)
    potential = 0.8 * (r1 * r1 + r2 * r2)
    g1 = 1.6 * r1
    g2 = 1.6 * r2
    for k in range(3):
        if k == 0:
            c1, c2, weight = 0.0, 0.0, 1.0
        elif k == 1:
            c1, c2, weight = 2.0 * a, 0.0, 1.0 - gamma
        else:
            c1, c2, weight = a, math.sqrt(3.0) * a, 1.0 + gamma
        d1 = x1 - c1
        d2 = x2 - c2
        value, slope = well_bump(d1 * d1 + d2 * d2, a, radial)
        potential -= weight * value
        g1 -= weight * slope * 2.0 * d1
        g2 -= weight * slope * 2.0 * d2
    return potential, g1, g2


@njit(cache=True, nogil=True)
def triple_well_potential(x: np.ndarray, a: float, gamma: float, radial: bool) -> np.ndarray:
    """``V`` at ``x (n, 2)``, shape ``(n,)``."""
    out = np.empty(x.shape[0])
    for n in range(x.shape[0]):
        out[n] = triple_well_point(x[n, 0], x[n, 1], a, gamma, radial)[0]
    return out


@njit(cache=True, nogil=True)
def triple_well_gradient(x: np.ndarray, a: float, gamma: float, radial: bool) -> np.ndarray:
    """``grad V`` at ``x (n, 2)``, shape ``(n, 2)``."""
    out = np.empty((x.shape[0], 2))
    for n in range(x.shape[0]):
        _, out[n, 0], out[n, 1] = triple_well_point(x[n, 0], x[n, 1], a, gamma, radial)
    return out


@njit(cache=True, nogil=True)
def weak_trapezoidal_triple_well(
    x0: np.ndarray,
    normals: np.ndarray,
    out: np.ndarray,
    step: float,
    subsample: int,
    a: float,
    gamma: float,
    kT: float,
    radial: bool,
) -> np.ndarray:
    """Weak trapezoidal scheme (Anderson & Mattingly 2011, theta = 1/2) for eq:triple.

    For ``dx = b(x) dt + sigma dW`` with ``b = -grad V`` and additive ``sigma = sqrt(2 kT)``:

        y   = x + b(x) h/2 + sigma sqrt(h/2) z1
        x'  = y + (2 b(y) - b(x)) h/2 + sigma sqrt(h/2) z2

    (weak order 2; for additive noise the scheme's ``sqrt(2 sigma(y)^2 - sigma(x)^2)`` is
    ``sigma``). Two drift evaluations per step.

    Parameters
    ----------
    x0 : (2,) state before the block.
    normals : (k * subsample, 4) rows ``(z1_1, z1_2, z2_1, z2_2)``, one per step.
    out : (k, 2) written with the state after every ``subsample`` steps.
    step : integrator step ``h``.
    """
    half = 0.5 * step
    noise = math.sqrt(2.0 * kT) * math.sqrt(half)
    x1 = x0[0]
    x2 = x0[1]
    _, g1, g2 = triple_well_point(x1, x2, a, gamma, radial)
    row = 0
    for n in range(out.shape[0]):
        for _ in range(subsample):
            y1 = x1 - g1 * half + noise * normals[row, 0]
            y2 = x2 - g2 * half + noise * normals[row, 1]
            _, h1, h2 = triple_well_point(y1, y2, a, gamma, radial)
            x1 = y1 + (g1 - 2.0 * h1) * half + noise * normals[row, 2]
            x2 = y2 + (g2 - 2.0 * h2) * half + noise * normals[row, 3]
            _, g1, g2 = triple_well_point(x1, x2, a, gamma, radial)
            row += 1
        out[n, 0] = x1
        out[n, 1] = x2
    return out


# --------------------------------------------------------------------------------------------
# Langevin dynamics with the Morse potential (eq:Lan_sys)
# --------------------------------------------------------------------------------------------


@njit(cache=True, nogil=True)
def morse_point(x: float, epsilon: float, a: float, x0: float) -> tuple[float, float]:
    """``U(x) = U0(a (x - x0))``, ``U0(y) = eps (e^{-2y} - 2 e^{-y} + 0.03 y^2)``, and ``U'(x)``."""
    y = a * (x - x0)
    e = math.exp(-y)
    potential = epsilon * (e * e - 2.0 * e + 0.03 * y * y)
    slope = a * epsilon * (2.0 * e * (1.0 - e) + 0.06 * y)
    return potential, slope


@njit(cache=True, nogil=True)
def morse_potential(x: np.ndarray, epsilon: float, a: float, x0: float) -> np.ndarray:
    """``U`` at ``x (n,)``, shape ``(n,)``."""
    out = np.empty(x.shape[0])
    for n in range(x.shape[0]):
        out[n] = morse_point(x[n], epsilon, a, x0)[0]
    return out


@njit(cache=True, nogil=True)
def morse_slope(x: np.ndarray, epsilon: float, a: float, x0: float) -> np.ndarray:
    """``U'`` at ``x (n,)``, shape ``(n,)``."""
    out = np.empty(x.shape[0])
    for n in range(x.shape[0]):
        out[n] = morse_point(x[n], epsilon, a, x0)[1]
    return out


@njit(cache=True, nogil=True)
def baoab_morse(
    x0: np.ndarray,
    normals: np.ndarray,
    out: np.ndarray,
    step: float,
    subsample: int,
    gamma: float,
    kT: float,
    epsilon: float,
    a: float,
    center: float,
) -> np.ndarray:
    """BAOAB splitting (Leimkuhler & Matthews) for eq:Lan_sys with unit mass.

    B: ``v -= U'(x) h/2``; A: ``x += v h/2``; O: ``v = c v + sqrt(kT (1 - c^2)) z`` with
    ``c = exp(-gamma h)``; then A, B. One force evaluation and one normal per step; the O step
    is exact, so the Gaussian velocity marginal is sampled with no bias in ``kT``.

    Parameters
    ----------
    x0 : (2,) state ``(x, v)`` before the block.
    normals : (k * subsample, 1), one per step.
    out : (k, 2) written with ``(x, v)`` after every ``subsample`` steps.
    center : the Morse centre ``x0`` of eq:Lan_sys.
    """
    half = 0.5 * step
    damping = math.exp(-gamma * step)
    kick = math.sqrt(kT * (1.0 - damping * damping))
    x = x0[0]
    v = x0[1]
    slope = morse_point(x, epsilon, a, center)[1]
    row = 0
    for n in range(out.shape[0]):
        for _ in range(subsample):
            v -= half * slope
            x += half * v
            v = damping * v + kick * normals[row, 0]
            x += half * v
            slope = morse_point(x, epsilon, a, center)[1]
            v -= half * slope
            row += 1
        out[n, 0] = x
        out[n, 1] = v
    return out
