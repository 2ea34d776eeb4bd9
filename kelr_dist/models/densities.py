"""The MALA-sampled systems' unnormalised log-densities and scores, compiled, at one point or many.

Every function here writes ``grad log p_eq(x)`` into ``grad`` and returns ``log p_eq(x)`` (up to
a constant); :func:`log_density_point` picks the system by its number, so that one compiled MALA
kernel (:mod:`kelr_dist.models.mala`) serves them all.
"""

from __future__ import annotations

import math

import numpy as np

from kelr_dist.kernels.compiled import compiled

#: the systems' numbers, as the kernels know them (the angle systems last)
CURVED_WELLS, COUPLED_3D, CHAIN, STUDENT, TRIG_4D, GAMMA_3D, TORUS, ANGLES_LINE, CIRCLE = range(9)
#: the lattice fields (:mod:`kelr_dist.models.lattice`), numbered after the angle systems
LATTICE = 9


@compiled
def _curved_wells_point(x: np.ndarray, theta: np.ndarray, grad: np.ndarray) -> float:
    """``-V / kT`` of :class:`CurvedWells` and its gradient at one point ``x (2,)``.

    ``theta = (A, a^2, tilt, b, kappa, cos, sin, c1, c2, 1/kT)`` with ``A = 27 H / (4 a^6)``.
    """
    amp, a2, tilt, b, kappa, co, si, c1, c2, beta = (
        theta[0], theta[1], theta[2], theta[3], theta[4], theta[5], theta[6], theta[7],
        theta[8], theta[9],
    )  # fmt: skip
    d1 = x[0] - c1
    d2 = x[1] - c2
    u = co * d1 + si * d2
    v = co * d2 - si * d1
    u2 = u * u
    w = u2 - a2
    valley = v - b * u2
    potential = amp * u2 * w * w + tilt * u + 0.5 * kappa * valley * valley
    dv_du = amp * (2.0 * u * w * w + 4.0 * u * u2 * w) + tilt - 2.0 * kappa * b * u * valley
    dv_dv = kappa * valley
    grad[0] = -beta * (co * dv_du - si * dv_dv)
    grad[1] = -beta * (si * dv_du + co * dv_dv)
    return -beta * potential


@compiled
def _coupled_3d_point(x: np.ndarray, theta: np.ndarray, grad: np.ndarray) -> float:
    """``-V / kT`` of :class:`Coupled3D` and its gradient at one point ``x (3,)``.

    ``theta = (kT, H, tilt, a, b, g2, c3, g3)``.
    """
    beta = 1.0 / theta[0]
    barrier, tilt, a, b, g2, c3, g3 = (
        theta[1], theta[2], theta[3], theta[4], theta[5], theta[6], theta[7],
    )  # fmt: skip
    s = x[0]
    y2 = x[1] - a * s
    y3 = x[2] - b * x[1]
    w = s * s - 1.0
    y22 = y2 * y2
    y32 = y3 * y3
    potential = (
        barrier * w * w + tilt * s + 0.5 * y22 + 0.25 * g2 * y22 * y22
        + 0.5 * y32 + c3 * y32 * y3 / 3.0 + 0.25 * g3 * y32 * y32
    )  # fmt: skip
    dv_ds = 4.0 * barrier * s * w + tilt
    dv_dy2 = y2 + g2 * y22 * y2
    dv_dy3 = y3 + c3 * y32 + g3 * y32 * y3
    grad[0] = -beta * (dv_ds - a * dv_dy2)
    grad[1] = -beta * (dv_dy2 - b * dv_dy3)
    grad[2] = -beta * dv_dy3
    return -beta * potential


@compiled
def _chain_point(x: np.ndarray, theta: np.ndarray, grad: np.ndarray) -> float:
    """``-V / kT`` of :class:`AnharmonicChain` and its gradient at one point ``x (d,)``.

    ``theta = (kT, H, tilt, kappa, c, g)``.
    """
    beta = 1.0 / theta[0]
    barrier, tilt, kappa, c, g = theta[1], theta[2], theta[3], theta[4], theta[5]
    d = x.shape[0]
    s = x[0]
    w = s * s - 1.0
    potential = barrier * w * w + tilt * s
    grad[0] = 4.0 * barrier * s * w + tilt
    for i in range(1, d):
        xi = x[i]
        x2 = xi * xi
        potential += 0.5 * x2 + c * x2 * xi / 3.0 + 0.25 * g * x2 * x2
        grad[i] = xi + c * x2 + g * x2 * xi
    for i in range(d - 1):
        gap = x[i + 1] - x[i]
        potential += 0.5 * kappa * gap * gap
        grad[i] -= kappa * gap
        grad[i + 1] += kappa * gap
    for i in range(d):
        grad[i] *= -beta
    return -beta * potential


@compiled
def _student_point(x: np.ndarray, theta: np.ndarray, grad: np.ndarray) -> float:
    """``log p`` of :class:`HeavyTail` and its gradient at one point ``x (d,)``.

    ``theta = (nu, loc (d), Q (d*d, row-major))``.
    """
    d = x.shape[0]
    nu = theta[0]
    quad = 0.0
    for i in range(d):
        qr = 0.0
        for j in range(d):
            qr += theta[1 + d + i * d + j] * (x[j] - theta[1 + j])
        grad[i] = qr
        quad += (x[i] - theta[1 + i]) * qr
    factor = -(nu + d) / (nu + quad)
    for i in range(d):
        grad[i] *= factor
    return -0.5 * (nu + d) * math.log1p(quad / nu)


@compiled
def _trig_4d_point(x: np.ndarray, theta: np.ndarray, grad: np.ndarray) -> float:
    """``-V / kT`` of :class:`TrigTie4D` and its gradient at one point ``x (4,)``.

    ``theta = (kT, H, kappa, omega, a, b)``.
    """
    beta = 1.0 / theta[0]
    barrier, kappa, omega, a, b = theta[1], theta[2], theta[3], theta[4], theta[5]
    w1 = x[0] * x[0] - 1.0
    w2 = x[1] * x[1] - 1.0
    u3 = x[2] - a * math.sin(omega * x[0])
    u4 = x[3] - b * x[1]
    tie = math.cos(omega * (x[0] - x[1]))
    twist = kappa * omega * math.sin(omega * (x[0] - x[1]))
    potential = barrier * (w1 * w1 + w2 * w2) - kappa * tie + 0.5 * (u3 * u3 + u4 * u4)
    grad[0] = -beta * (4.0 * barrier * x[0] * w1 + twist - u3 * a * omega * math.cos(omega * x[0]))
    grad[1] = -beta * (4.0 * barrier * x[1] * w2 - twist - b * u4)
    grad[2] = -beta * u3
    grad[3] = -beta * u4
    return -beta * potential


@compiled
def _gamma_3d_point(x: np.ndarray, theta: np.ndarray, grad: np.ndarray) -> float:
    """``log p`` of :class:`GammaTie3D` and its gradient at one point ``x (3,)`` (``-inf`` and a
    zero gradient where ``x1 <= 0``).

    ``theta = (k, theta, alpha, gamma)``.
    """
    shape, mean_scale, alpha, gamma = theta[0], theta[1], theta[2], theta[3]
    u = x[0]
    if u <= 0.0:
        grad[0] = 0.0
        grad[1] = 0.0
        grad[2] = 0.0
        return -math.inf
    log_u = math.log(u)
    r2 = x[1] - alpha * log_u
    r3 = x[2] - gamma * x[1] * x[1]
    grad[0] = (shape - 1.0) / u - 1.0 / mean_scale + alpha * r2 / u
    grad[1] = -r2 + 2.0 * gamma * x[1] * r3
    grad[2] = -r3
    return (shape - 1.0) * log_u - u / mean_scale - 0.5 * (r2 * r2 + r3 * r3)


@compiled
def _angle_point(system: int, x: np.ndarray, theta: np.ndarray, grad: np.ndarray) -> float:
    """``log p = -V`` of :class:`~kelr_dist.models.angle_systems.Torus`,
    :class:`~kelr_dist.models.angle_systems.AnglesLine` or
    :class:`~kelr_dist.models.angle_systems.Circle` and its gradient ``-∇V`` at one point ``x``.

    ``theta = (a, b, c, e[, g, k])`` (torus, angles-line) or ``(kappa, mu)`` (circle).
    """
    if system == CIRCLE:
        grad[0] = -theta[0] * math.sin(x[0] - theta[1])
        return theta[0] * math.cos(x[0] - theta[1])
    a, b, c, e = theta[0], theta[1], theta[2], theta[3]
    phi, psi = x[0], x[1]
    v = (
        a * math.cos(2.0 * phi)
        + b * math.cos(3.0 * psi - 0.6)
        - c * math.cos(phi - psi - 0.8)
        + e * math.sin(phi)
    )
    g0 = -2.0 * a * math.sin(2.0 * phi) + c * math.sin(phi - psi - 0.8) + e * math.cos(phi)
    g1 = -3.0 * b * math.sin(3.0 * psi - 0.6) - c * math.sin(phi - psi - 0.8)
    if system == ANGLES_LINE:
        g, k, r = theta[4], theta[5], x[2]
        v += g * (r * r - 1.0) ** 2 + k * r * math.sin(phi) + 0.5 * r * math.cos(psi)
        g0 += k * r * math.cos(phi)
        g1 -= 0.5 * r * math.sin(psi)
        grad[2] = -(4.0 * g * r * (r * r - 1.0) + k * math.sin(phi) + 0.5 * math.cos(psi))
    grad[0] = -g0
    grad[1] = -g1
    return -v


@compiled
def _lattice_point(x: np.ndarray, theta: np.ndarray, grad: np.ndarray) -> float:
    """``log p`` of :class:`~kelr_dist.models.lattice.Lattice` and its gradient at one point
    ``x (rows * columns,)``, the sites row by row.

    ``theta = (rows, columns, barrier, tilt, coupling, twist, omega)``: each site a double well
    ``-H (x² - 1)² - tilt x``, each bond ``(i, j)`` to the next site along a row or a column
    (periodic along a side of at least 3 sites) ``-κ (x_i - x_j)² / 2 + τ cos(ω (x_i - x_j))``.
    """
    rows, columns = int(theta[0]), int(theta[1])
    barrier, tilt, kappa, twist, omega = theta[2], theta[3], theta[4], theta[5], theta[6]
    log_p = 0.0
    for i in range(x.shape[0]):
        w = x[i] * x[i] - 1.0
        log_p -= barrier * w * w + tilt * x[i]
        grad[i] = -4.0 * barrier * x[i] * w - tilt
    for r in range(rows):
        for c in range(columns):
            i = r * columns + c
            for j in (
                r * columns + (c + 1) % columns if c + 1 < columns or columns >= 3 else -1,
                ((r + 1) % rows) * columns + c if r + 1 < rows or rows >= 3 else -1,
            ):
                if j < 0:
                    continue
                gap = x[i] - x[j]
                log_p += -0.5 * kappa * gap * gap + twist * math.cos(omega * gap)
                force = -kappa * gap - twist * omega * math.sin(omega * gap)
                grad[i] += force
                grad[j] -= force
    return log_p


@compiled
def log_density_point(system: int, x: np.ndarray, theta: np.ndarray, grad: np.ndarray) -> float:
    """Unnormalised ``log p_eq(x)`` of ``system``; writes ``grad log p_eq(x)`` into ``grad``."""
    if system == CURVED_WELLS:
        return _curved_wells_point(x, theta, grad)
    if system == COUPLED_3D:
        return _coupled_3d_point(x, theta, grad)
    if system == CHAIN:
        return _chain_point(x, theta, grad)
    if system == TRIG_4D:
        return _trig_4d_point(x, theta, grad)
    if system == GAMMA_3D:
        return _gamma_3d_point(x, theta, grad)
    if system == LATTICE:
        return _lattice_point(x, theta, grad)
    if system >= TORUS:
        return _angle_point(system, x, theta, grad)
    return _student_point(x, theta, grad)


@compiled
def log_density_and_score(
    system: int, x: np.ndarray, theta: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Unnormalised ``log p_eq`` ``(n,)`` and ``grad log p_eq`` ``(n, d)`` of ``system`` at
    ``x (n, d)``."""
    log_p = np.empty(x.shape[0])
    score = np.empty(x.shape)
    for n in range(x.shape[0]):
        log_p[n] = log_density_point(system, x[n], theta, score[n])
    return log_p, score
