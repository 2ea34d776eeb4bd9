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
are plain ``@compiled`` functions shared by the kernels and by the vectorised evaluators the models
use (one implementation of each formula).

The triple-well kernel can also draw its normals itself (:func:`weak_trapezoidal_triple_well`
given ``words``): numpy's PCG64 step and its ziggurat for
``standard_normal``, compiled into the integrator loop, give the very numbers
``Generator(PCG64).standard_normal`` gives, in the same order, and leave the generator in the
same state (checked bit for bit in ``tests/test_simulate.py``), with no buffer of normals and
the random numbers drawn while the previous step's arithmetic is still in flight.
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic
from numba.np.random._constants import (  # numpy's ziggurat tables, as numba's port holds them
    fi_double,
    ki_double,
    wi_double,
    ziggurat_nor_inv_r,
    ziggurat_nor_r,
)

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


# --------------------------------------------------------------------------------------------
# numpy's PCG64 and standard_normal, compiled into the kernels
# --------------------------------------------------------------------------------------------

_MULTIPLIER_HIGH = np.uint64(2549297995355413924)  # PCG's 128-bit default multiplier
_MULTIPLIER_LOW = np.uint64(4865540595714422341)
_MANTISSA = np.uint64(0x000FFFFFFFFFFFFF)
_DOUBLE_UNIT = 1.0 / 9007199254740992.0  # 2**-53


@intrinsic
def _high_product(typingctx, a, b):  # noqa: ARG001 (numba's intrinsic signature)
    """The high 64 bits of the 128-bit product ``a * b`` (both uint64): one widening multiply
    in LLVM's 128-bit integers, where numba has no 128-bit type."""

    def codegen(context, builder, signature, args):  # noqa: ARG001
        wide = ir.IntType(128)
        product = builder.mul(builder.zext(args[0], wide), builder.zext(args[1], wide))
        return builder.trunc(builder.lshr(product, ir.Constant(wide, 64)), ir.IntType(64))

    return types.uint64(types.uint64, types.uint64), codegen


@njit(inline="always")
def pcg64_next(
    high: np.uint64, low: np.uint64, inc_high: np.uint64, inc_low: np.uint64
) -> tuple[np.uint64, np.uint64, np.uint64]:
    """numpy's ``PCG64.random_raw()``: ``(output, new state high, new state low)``.

    The state advances ``s <- s * multiplier + inc (mod 2**128)``; the output is the XSL-RR
    permutation of the new state.
    """
    new_high = high * _MULTIPLIER_LOW + low * _MULTIPLIER_HIGH + _high_product(low, _MULTIPLIER_LOW)
    product_low = low * _MULTIPLIER_LOW
    new_low = product_low + inc_low
    new_high = new_high + inc_high + (np.uint64(1) if new_low < product_low else np.uint64(0))
    mixed = new_high ^ new_low
    rotation = new_high >> np.uint64(58)
    output = (mixed >> rotation) | (mixed << ((np.uint64(64) - rotation) & np.uint64(63)))
    return output, new_high, new_low


@njit(inline="always")
def _ziggurat_draw(
    high: np.uint64, low: np.uint64, inc_high: np.uint64, inc_low: np.uint64
) -> tuple[np.uint64, np.uint64, float, bool, np.uint64, np.uint64]:
    """One try of numpy's ziggurat: ``(layer, magnitude, x, accepted, new high, new low)``."""
    bits, high, low = pcg64_next(high, low, inc_high, inc_low)
    layer = bits & np.uint64(0xFF)
    bits = bits >> np.uint64(8)
    magnitude = (bits >> np.uint64(1)) & _MANTISSA
    # magnitude < 2**52: a signed conversion is exact. The sign is applied to the integer
    # (negated when the bit is set, exactly), not by a branch that random bits mispredict
    # half the time
    negative = np.int64(bits & np.uint64(1))
    x = ((np.int64(magnitude) ^ -negative) + negative) * wi_double[layer]
    return layer, magnitude, x, magnitude < ki_double[layer], high, low


@njit(inline="always")
def pcg64_standard_normal(
    high: np.uint64, low: np.uint64, inc_high: np.uint64, inc_low: np.uint64
) -> tuple[float, np.uint64, np.uint64]:
    """numpy's ``Generator.standard_normal()`` on PCG64 (its 256-layer ziggurat):
    ``(normal, new state high, new state low)``.

    Only the first try (accepted 98.8% of the time) is inlined where this is called; the rest
    of the loop is a compiled function of its own, so its wedge test keeps numpy's unfused
    arithmetic inside an integrator compiled with fused multiply-adds (``@contracted``)."""
    layer, magnitude, x, accepted, high, low = _ziggurat_draw(high, low, inc_high, inc_low)
    if accepted:
        return x, high, low
    return _ziggurat_rejected(layer, magnitude, x, high, low, inc_high, inc_low)


@compiled
def _ziggurat_rejected(
    layer: np.uint64,
    magnitude: np.uint64,
    x: float,
    high: np.uint64,
    low: np.uint64,
    inc_high: np.uint64,
    inc_low: np.uint64,
) -> tuple[float, np.uint64, np.uint64]:
    """numpy's ziggurat loop from a try outside its layer's rectangle: the tail or the wedge
    test, then tries again until one is accepted."""
    while True:
        if layer == 0:  # the tail beyond ziggurat_nor_r
            while True:
                u, high, low = pcg64_next(high, low, inc_high, inc_low)
                xx = -ziggurat_nor_inv_r * np.log1p(-np.int64(u >> np.uint64(11)) * _DOUBLE_UNIT)
                u, high, low = pcg64_next(high, low, inc_high, inc_low)
                yy = -np.log1p(-np.int64(u >> np.uint64(11)) * _DOUBLE_UNIT)
                if yy + yy > xx * xx:
                    if (magnitude >> np.uint64(8)) & np.uint64(1):
                        return -(ziggurat_nor_r + xx), high, low
                    return ziggurat_nor_r + xx, high, low
        else:
            u, high, low = pcg64_next(high, low, inc_high, inc_low)
            uniform = np.int64(u >> np.uint64(11)) * _DOUBLE_UNIT
            edge = (fi_double[layer - 1] - fi_double[layer]) * uniform + fi_double[layer]
            if edge < math.exp(-0.5 * x * x):
                return x, high, low
        layer, magnitude, x, accepted, high, low = _ziggurat_draw(high, low, inc_high, inc_low)
        if accepted:
            return x, high, low


@compiled
def pcg64_fill_normals(state: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``out[:] = Generator(PCG64).standard_normal(out.size)`` with the PCG64 state held in
    ``state`` (``[high, low, inc high, inc low]`` uint64, advanced in place)."""
    high, low, inc_high, inc_low = state[0], state[1], state[2], state[3]
    flat = out.reshape(-1)
    for i in range(flat.size):
        flat[i], high, low = pcg64_standard_normal(high, low, inc_high, inc_low)
    state[0] = high
    state[1] = low
    return out


@contracted
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
    words: np.ndarray | None = None,
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
    normals : (k * subsample, 4) rows ``(z1_1, z1_2, z2_1, z2_2)``, one per step (not read,
        and may be empty, when ``words`` is given).
    out : (k, 2) written with the state after every ``subsample`` steps.
    step : integrator step ``h``.
    words : None, or (4,) uint64 PCG64 state ``[high, low, inc high, inc low]``, advanced in
        place: the normals are then drawn from it inside the loop (:func:`pcg64_standard_normal`),
        in the order of a row of ``normals``, instead of read from ``normals``; the trajectory is
        the same, bit for bit, as with ``normals`` filled by ``Generator(PCG64).standard_normal``
        of the same generator. ``words is None`` is known when numba compiles, so each form
        compiles only its own branch.
    """
    half = 0.5 * step
    noise = math.sqrt(2.0 * kT) * math.sqrt(half)
    if words is not None:
        high, low, inc_high, inc_low = words[0], words[1], words[2], words[3]
    x1 = x0[0]
    x2 = x0[1]
    _, g1, g2 = triple_well_point(x1, x2, a, gamma, radial)
    row = 0
    for n in range(out.shape[0]):
        for _ in range(subsample):
            if words is not None:
                z1, high, low = pcg64_standard_normal(high, low, inc_high, inc_low)
                z2, high, low = pcg64_standard_normal(high, low, inc_high, inc_low)
                z3, high, low = pcg64_standard_normal(high, low, inc_high, inc_low)
                z4, high, low = pcg64_standard_normal(high, low, inc_high, inc_low)
            else:
                z1, z2, z3, z4 = normals[row, 0], normals[row, 1], normals[row, 2], normals[row, 3]
                row += 1
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
    if words is not None:
        words[0] = high
        words[1] = low
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
