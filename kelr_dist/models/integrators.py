"""Numba integrators of the paper's test systems (§5) and of the Ornstein-Uhlenbeck check.

The Langevin and Ornstein-Uhlenbeck kernels advance one state through a block of pre-drawn
standard normals and write the state after every ``subsample`` integrator steps into ``out``:

    kernel(x0 (d,), normals (k * subsample, m), out (k, d), step, subsample, *params) -> out

``normals`` holds the ``m`` standard normals each integrator step consumes, in the order the
step uses them. The state after the block is ``out[-1]``, so a long run is a sequence of kernel
calls, each started from the last row of the previous one; because the normals come from one
numpy ``Generator`` stream drawn in order, splitting a run into blocks anywhere gives the same
trajectory bit for bit (the models' ``advance`` relies on this).

Kernels assume validated input and never allocate per step. The scalar potentials and forces
are plain ``@compiled`` functions shared by the kernels and by the vectorised evaluators the models
use (one implementation of each formula).

The triple-well kernel takes the numpy ``Generator`` in place of ``normals`` and draws from it
(numba compiles ``Generator.standard_normal``: the same numbers in the same order as numpy's, and
the generator is left in the same state), so it needs no buffer of normals.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from kelr_dist.kernels.compiled import compiled, contracted

# --------------------------------------------------------------------------------------------
# Ornstein-Uhlenbeck: exact Gaussian transition
# --------------------------------------------------------------------------------------------


@compiled
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
# triple-well gradient system (eq. 59, eq. 60)
# --------------------------------------------------------------------------------------------

# underflow guard: exp(1/t) is 0 in float64 for 1/t below about -745
_EXP_FLOOR = -700.0


@njit(inline="always")
def well_bump(s: float, a: float, radial: bool) -> tuple[float, float]:
    """The well profile ``v`` of eq. 60 at squared distance ``s``, as ``(e, rate)`` with
    ``v = 10 e`` and ``dv/ds = rate * e``.

    ``radial=False`` (the paper as written): ``v(s) = 10 exp(1/(s^2 - a^2))`` for ``s < a``.
    ``radial=True``: ``v = 10 exp(1/(r^2 - a^2))`` for ``r < a`` with ``r^2 = s``.
    Both vanish, with all derivatives, at the edge of their support (``(0, 0)`` outside it).

    The exponential is returned as a factor of its own so that it is the last thing the
    gradient waits for: ``rate`` (a division and a few products) is computed while ``exp``
    runs, and one multiply-add then puts the well into the drift. The integrators' steps are
    chains of two dependent drift evaluations, so this shortens the step itself. An exponent
    below ``_EXP_FLOOR`` (the edge of the support, where ``exp`` underflows) gives ``(0, 0)``,
    selected rather than branched on.
    """
    t = s - a * a if radial else s * s - a * a
    if t >= 0.0:
        return 0.0, 0.0
    inv = 1.0 / t
    rate = -10.0 * inv * inv * (1.0 if radial else 2.0 * s)
    inside = inv >= _EXP_FLOOR
    return math.exp(inv) if inside else 0.0, rate if inside else 0.0


@njit(inline="always")
def triple_well_point(
    x1: float, x2: float, a: float, gamma: float, radial: bool
) -> tuple[float, float, float]:
    """``V(x)`` of eq. 60 and its gradient ``(dV/dx1, dV/dx2)`` at one point.

    Wells of depth weights ``1, 1 - gamma, 1 + gamma`` centred at ``(0, 0)``, ``(2a, 0)``,
    ``(a, sqrt(3) a)``; retaining term ``0.8 |x - (a, a/sqrt(3))|^2``. Inlined into the
    integrators' loops (the potential is then computed only where it is used).
    """
    r1 = x1 - a
    r2 = x2 - a / math.sqrt(3.0)
    potential = 0.8 * (r1 * r1 + r2 * r2)
    g1 = 1.6 * r1
    g2 = 1.6 * r2
    centres = ((0.0, 0.0, 1.0), (2.0 * a, 0.0, 1.0 - gamma), (a, math.sqrt(3.0) * a, 1.0 + gamma))
    for centre in centres:
        c1, c2, weight = centre
        d1 = x1 - c1
        d2 = x2 - c2
        e, rate = well_bump(d1 * d1 + d2 * d2, a, radial)
        potential -= e * (10.0 * weight)
        scale = 2.0 * weight * rate  # d(weight v)/dx = e * scale * d
        g1 -= e * (scale * d1)
        g2 -= e * (scale * d2)
    return potential, g1, g2


@compiled
def triple_well_potential(x: np.ndarray, a: float, gamma: float, radial: bool) -> np.ndarray:
    """``V`` at ``x (n, 2)``, shape ``(n,)``."""
    out = np.empty(x.shape[0])
    for n in range(x.shape[0]):
        out[n] = triple_well_point(x[n, 0], x[n, 1], a, gamma, radial)[0]
    return out


@compiled
def triple_well_gradient(x: np.ndarray, a: float, gamma: float, radial: bool) -> np.ndarray:
    """``grad V`` at ``x (n, 2)``, shape ``(n, 2)``."""
    out = np.empty((x.shape[0], 2))
    for n in range(x.shape[0]):
        _, out[n, 0], out[n, 1] = triple_well_point(x[n, 0], x[n, 1], a, gamma, radial)
    return out


@contracted
def weak_trapezoidal_triple_well(
    x0: np.ndarray,
    rng: np.random.Generator,
    out: np.ndarray,
    step: float,
    subsample: int,
    a: float,
    gamma: float,
    kT: float,
    radial: bool,
) -> np.ndarray:
    """Weak trapezoidal scheme (Anderson & Mattingly 2011, theta = 1/2) for eq. 59.

    For ``dx = b(x) dt + sigma dW`` with ``b = -grad V`` and additive ``sigma = sqrt(2 kT)``:

        y   = x + b(x) h/2 + sigma sqrt(h/2) z1
        x'  = y + (2 b(y) - b(x)) h/2 + sigma sqrt(h/2) z2

    (weak order 2; for additive noise the scheme's ``sqrt(2 sigma(y)^2 - sigma(x)^2)`` is
    ``sigma``). Two drift evaluations per step. The second line is computed as its equal
    ``x' = x + b(y) h + sigma sqrt(h/2) (z1 + z2)``, and multiply-adds are fused
    (``@contracted``): each drift then enters the step through one multiply-add, which
    shortens the chain of two dependent drift evaluations that bounds a step (1.4e-15 from
    the terms as written above after 1000 steps; ``tests/test_models.py`` checks the scheme).

    Parameters
    ----------
    x0 : (2,) state before the block.
    rng : the generator of the four normals ``z1_1, z1_2, z2_1, z2_2`` of each step, drawn in
        that order (advanced in place).
    out : (k, 2) written with the state after every ``subsample`` steps.
    step : integrator step ``h``.
    """
    half = 0.5 * step
    noise = math.sqrt(2.0 * kT) * math.sqrt(half)
    x1 = x0[0]
    x2 = x0[1]
    _, g1, g2 = triple_well_point(x1, x2, a, gamma, radial)
    for n in range(out.shape[0]):
        for _ in range(subsample):
            z1 = rng.standard_normal()
            z2 = rng.standard_normal()
            z3 = rng.standard_normal()
            z4 = rng.standard_normal()
            # grouped so that each drift enters with one multiply-add (the step is a chain of
            # two dependent drift evaluations; everything else is computed while they run)
            y1 = (x1 + noise * z1) - half * g1
            y2 = (x2 + noise * z2) - half * g2
            _, h1, h2 = triple_well_point(y1, y2, a, gamma, radial)
            x1 = (x1 + noise * (z1 + z3)) - step * h1
            x2 = (x2 + noise * (z2 + z4)) - step * h2
            _, g1, g2 = triple_well_point(x1, x2, a, gamma, radial)
        out[n, 0] = x1
        out[n, 1] = x2
    return out


# --------------------------------------------------------------------------------------------
# Langevin dynamics with the Morse potential (eq. 64)
# --------------------------------------------------------------------------------------------


@compiled
def morse_point(x: float, epsilon: float, a: float, x0: float) -> tuple[float, float]:
    """``U(x) = U0(a (x - x0))``, ``U0(y) = eps (e^{-2y} - 2 e^{-y} + 0.03 y^2)``, and ``U'(x)``."""
    y = a * (x - x0)
    e = math.exp(-y)
    potential = epsilon * (e * e - 2.0 * e + 0.03 * y * y)
    slope = a * epsilon * (2.0 * e * (1.0 - e) + 0.06 * y)
    return potential, slope


@compiled
def _morse_points(x: np.ndarray, epsilon: float, a: float, x0: float, which: int) -> np.ndarray:
    """Entry ``which`` (0: ``U``, 1: ``U'``) of :func:`morse_point` at ``x (n,)``: ``(n,)``."""
    out = np.empty(x.shape[0])
    for n in range(x.shape[0]):
        out[n] = morse_point(x[n], epsilon, a, x0)[which]
    return out


def morse_potential(x: np.ndarray, epsilon: float, a: float, x0: float) -> np.ndarray:
    """``U`` at ``x (n,)``, shape ``(n,)``."""
    return _morse_points(x, epsilon, a, x0, 0)


def morse_slope(x: np.ndarray, epsilon: float, a: float, x0: float) -> np.ndarray:
    """``U'`` at ``x (n,)``, shape ``(n,)``."""
    return _morse_points(x, epsilon, a, x0, 1)


@compiled
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
    """BAOAB splitting (Leimkuhler & Matthews) for eq. 64 with unit mass.

    B: ``v -= U'(x) h/2``; A: ``x += v h/2``; O: ``v = c v + sqrt(kT (1 - c^2)) z`` with
    ``c = exp(-gamma h)``; then A, B. One force evaluation and one normal per step; the O step
    is exact, so the Gaussian velocity marginal is sampled with no bias in ``kT``.

    Parameters
    ----------
    x0 : (2,) state ``(x, v)`` before the block.
    normals : (k * subsample, 1), one per step.
    out : (k, 2) written with ``(x, v)`` after every ``subsample`` steps.
    center : the Morse centre ``x0`` of eq. 64.
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
