"""Benchmark systems with closed-form equilibrium densities, sampled with no discretisation bias.

These are for the accuracy suite of score / response estimators: unlike the paper's triple-well
and Langevin-Morse (whose integrators carry an O(h) bias in the stationary law), every sampler
here leaves the analytic ``p_eq`` *exactly* invariant, so the exact score ``grad log p_eq``
evaluated on the same samples is an unbiased reference.

* ``curved-wells``, ``coupled-3d``, ``coupled-4d``, ``coupled-6d``, ``heavy-tail``:
  Metropolis-adjusted Langevin (MALA). Each step proposes
  ``y = x + h s(x) + sqrt(2h) xi`` (``s = grad log p_eq``, ``xi`` standard normal) and accepts
  it with probability ``min(1, p(y) q(x|y) / (p(x) q(y|x)))``, ``q(y|x) ∝ exp(-|y - x -
  h s(x)|^2 / 4h)``; every ``subsample``-th state is stored, ``dt = step * subsample``. For small
  ``h`` this is the overdamped Langevin dynamics ``dX = s(X) dt + sqrt(2) dW`` (for a potential,
  ``dX = -grad V / kT dt + sqrt(2) dW``: the physical ``dX = -grad V dt + sqrt(2 kT) dW`` with
  its time multiplied by ``kT``); the Metropolis step removes the discretisation bias.
* ``wall``: a Cox-Ingersoll-Ross coordinate (Gamma law, hard wall at 0) and a Gaussian
  coordinate coupled to it, both sampled with their exact transition laws.

Resumability (``advance(a)`` then ``advance(b)`` equals ``advance(a + b)`` bit for bit) comes from
:func:`kelr_dist.data.models._run_blocks`: each stored sample consumes a fixed number of standard
normals from the numpy ``Generator`` stream, in order. The uniform of the Metropolis test is one
of them, ``u = Phi(z)`` (exactly uniform), so no second stream has to be interleaved; the state
is the stored sample itself (MALA recomputes ``log p`` and ``s`` at the start of each sub-block,
the same numbers it carried; the ``wall`` kernel recomputes its auxiliary coordinate every step).

Measured with the default parameters (one core of a shared 2-core machine, numba-compiled;
1e6 stored samples after the default burn-in; 1e7 samples of curved-wells took 12.8 s and of
coupled-3d 15.7 s, the two slowest). ``tau`` is the integrated autocorrelation time of each
coordinate in stored samples (Sokal's window, c = 5):

============  ==  =====  =========  ====  =========  ==========  ============================
system        d   h      subsample  dt    samples/s  acceptance  tau per coordinate
============  ==  =====  =========  ====  =========  ==========  ============================
curved-wells  2   0.03   10         0.3   7.8e5      0.82        59, 37
coupled-3d    3   0.04   10         0.4   6.4e5      0.78        40, 34, 26
coupled-4d    4   0.04   5          0.2   1.1e6      0.81        42, 14, 7, 6
coupled-6d    6   0.04   5          0.2   1.0e6      0.81        41, 13, 6, 5, 6, 6
heavy-tail    2   0.3    2          0.6   3.2e6      0.81        11, 10
wall          2   exact  -          0.05  1.3e7      -           42, 31 (exact: 40.0, 30.1)
============  ==  =====  =========  ====  =========  ==========  ============================

Curved-wells: well populations 0.33 / 0.49 / 0.19, the well indicators have tau 30-54 and
the chain crosses a barrier top ~5e5 times in 1e7 samples. Coupled systems: ``P(x1 > 0)`` is
0.39 and the sign of ``x1`` has tau ~42 (3.5e5 sign changes in 1e7 samples of coupled-3d).
Heavy-tail: the quadratic form ``(x - loc)^T Q (x - loc)`` has tau 17; the sample excess
kurtosis of 1e6 samples is ~4 against the exact 6 (at ``nu = 5`` its estimator has infinite
variance). An unadjusted Langevin chain (no Metropolis step) diverges on coupled-3d at
``h = 0.04`` and, at ``h = 0.02``, misses ``E[x1^2]`` by 22 standard errors in 2e5 samples.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import numpy as np

from kelr_dist.data.parametrised import (
    Parameter,
    Parametrised,
    count,
    integration,
    matrix,
    positive,
    real,
    vector,
)
from kelr_dist.kernels.checks import is_whole
from kelr_dist.kernels.compiled import compiled

# --------------------------------------------------------------------------------------------
# numba kernels: densities and scores at one point (``grad`` is written with grad log p)
# --------------------------------------------------------------------------------------------

CURVED_WELLS, COUPLED_3D, CHAIN, STUDENT, TRIG_4D, GAMMA_3D = 0, 1, 2, 3, 4, 5
_INV_SQRT2 = 1.0 / math.sqrt(2.0)


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

    ``theta = (H, tilt, a, b, g2, c3, g3, 1/kT)``.
    """
    barrier, tilt, a, b, g2, c3, g3, beta = (
        theta[0], theta[1], theta[2], theta[3], theta[4], theta[5], theta[6], theta[7],
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

    ``theta = (H, tilt, kappa, c, g, 1/kT)``.
    """
    barrier, tilt, kappa, c, g, beta = theta[0], theta[1], theta[2], theta[3], theta[4], theta[5]
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

    ``theta = (H, kappa, omega, a, b, 1/kT)``.
    """
    barrier, kappa, omega, a, b, beta = (
        theta[0], theta[1], theta[2], theta[3], theta[4], theta[5],
    )  # fmt: skip
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
def _point(system: int, x: np.ndarray, theta: np.ndarray, grad: np.ndarray) -> float:
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
        log_p[n] = _point(system, x[n], theta, score[n])
    return log_p, score


@compiled
def mala(
    x0: np.ndarray,
    normals: np.ndarray,
    out: np.ndarray,
    step: float,
    subsample: int,
    system: int,
    theta: np.ndarray,
    accepted: np.ndarray,
) -> np.ndarray:
    """Metropolis-adjusted Langevin steps for ``system``, storing every ``subsample``-th state.

    Proposal ``y = x + h s(x) + sqrt(2h) xi``; accepted when ``Phi(z) < exp(log r)`` with
    ``log r = log p(y) - log p(x) - |x - y - h s(y)|^2 / 4h + |xi|^2 / 2`` (a NaN ratio, e.g.
    an overflowing proposal, is rejected).

    Parameters
    ----------
    x0 : (d,) state before the block.
    normals : (k * subsample, d + 1) per step: ``xi`` (d) then ``z`` for the uniform ``Phi(z)``.
    out : (k, d) written with the state after every ``subsample`` steps.
    step : ``h``.
    accepted : (1,) int64, incremented by the number of accepted proposals.
    """
    d = x0.shape[0]
    x = x0.copy()
    y = np.empty(d)
    gx = np.empty(d)
    gy = np.empty(d)
    lpx = _point(system, x, theta, gx)
    noise = math.sqrt(2.0 * step)
    inv4h = 0.25 / step
    row = 0
    count = 0
    for n in range(out.shape[0]):
        for _ in range(subsample):
            forward = 0.0
            for i in range(d):
                z = normals[row, i]
                y[i] = x[i] + step * gx[i] + noise * z
                forward += z * z
            lpy = _point(system, y, theta, gy)
            backward = 0.0
            for i in range(d):
                r = x[i] - y[i] - step * gy[i]
                backward += r * r
            log_ratio = lpy - lpx - inv4h * backward + 0.5 * forward
            if log_ratio >= 0.0 or 0.5 * math.erfc(-normals[row, d] * _INV_SQRT2) < math.exp(
                log_ratio
            ):
                x, y = y, x
                gx, gy = gy, gx
                lpx = lpy
                count += 1
            row += 1
        for i in range(d):
            out[n, i] = x[i]
    accepted[0] += count
    return out


@compiled
def cir_gaussian(
    x0: np.ndarray,
    normals: np.ndarray,
    out: np.ndarray,
    decay: float,
    spread: float,
    coupling: float,
    rho: float,
    kick: float,
) -> np.ndarray:
    """Exact transitions of :class:`Wall`: ``x1`` CIR with integer ``dof``, ``x2 = c x1 + w``.

    ``x1 = |Y|^2`` for ``Y`` an OU process in ``R^dof``; by rotation invariance only ``|Y| =
    sqrt(x1)`` matters, so ``x1' = (decay sqrt(x1) + spread z_0)^2 + spread^2 (z_1^2 + ... +
    z_{dof-1}^2)`` (the noncentral chi-square transition), and ``w' = rho w + kick z_dof`` with
    ``w = x2 - c x1`` recomputed from the stored state every step.

    Parameters
    ----------
    x0 : (2,) state before the block (``x1 > 0``).
    normals : (k, dof + 1) standard normals per stored sample.
    out : (k, 2) written with the next ``k`` states.
    decay : ``exp(-kappa dt / 2)``.  spread : ``sqrt(mean / dof * (1 - exp(-kappa dt)))``.
    coupling : ``c``.  rho : ``exp(-gamma dt)``.  kick : ``sigma_w sqrt(1 - rho^2)``.
    """
    dof = normals.shape[1] - 1
    x1 = x0[0]
    x2 = x0[1]
    for n in range(out.shape[0]):
        w = x2 - coupling * x1
        centre = decay * math.sqrt(x1) + spread * normals[n, 0]
        rest = 0.0
        for i in range(1, dof):
            rest += normals[n, i] * normals[n, i]
        x1 = centre * centre + spread * spread * rest
        w = rho * w + kick * normals[n, dof]
        x2 = coupling * x1 + w
        out[n, 0] = x1
        out[n, 1] = x2
    return out


# --------------------------------------------------------------------------------------------
# MALA systems
# --------------------------------------------------------------------------------------------


class _MalaSystem(Parametrised):
    """Shared sampler and evaluators of the MALA systems (subclasses set ``_system, _theta``)."""

    name: str
    components: tuple[str, ...]
    default_burn_in = 20_000  # stored samples, for every MALA system
    step: float
    subsample: int
    _system: int
    _theta: np.ndarray

    @property
    def dt(self) -> float:
        """Time between stored samples, ``step * subsample``."""
        return self.step * self.subsample

    def advance_with_acceptance(
        self, state: np.ndarray, n_samples: int, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray, float]:
        """:meth:`advance`, and the fraction of accepted proposals (NaN when ``n_samples = 0``).

        Returns
        -------
        samples : (n_samples, d).  new_state : (d,).  acceptance : float.
        """
        _check_count(n_samples)
        d = len(self.components)
        accepted = np.zeros(1, dtype=np.int64)

        def kernel(x0: np.ndarray, normals: np.ndarray, out: np.ndarray) -> np.ndarray:
            return mala(
                x0, normals.reshape(-1, d + 1), out, self.step, self.subsample, self._system,
                self._theta, accepted,
            )  # fmt: skip

        samples, new = _run_blocks(state, n_samples, rng, (d + 1) * self.subsample, kernel, d)
        steps = samples.shape[0] * self.subsample
        return samples, new, (accepted[0] / steps if steps else math.nan)

    def advance(
        self, state: np.ndarray, n_samples: int, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        """The next ``n_samples`` stored samples ``(n_samples, d)`` and the new state ``(d,)``."""
        samples, new, _ = self.advance_with_acceptance(state, n_samples, rng)
        return samples, new

    def score(self, x: np.ndarray) -> np.ndarray:
        """Exact ``grad log p_eq`` at ``x (n, d)``, shape ``(n, d)``."""
        return log_density_and_score(self._system, _points(x, len(self.components)), self._theta)[1]

    def log_density(self, x: np.ndarray) -> np.ndarray:
        """Unnormalised ``log p_eq`` at ``x (n, d)``, shape ``(n,)``."""
        return log_density_and_score(self._system, _points(x, len(self.components)), self._theta)[0]


def _check_count(n_samples: Any) -> None:
    """A ValueError naming ``n_samples`` unless it is a non-negative integer (checked first)."""
    if not is_whole(n_samples):
        raise ValueError(f"n_samples={n_samples!r} must be a non-negative integer")


class CurvedWells(_MalaSystem):
    """Three wells in a curved, rotated valley (d = 2): ``p_eq ∝ exp(-V / kT)``, MALA-sampled.

    In local coordinates ``(u, v) = R(-angle) (x - center)``::

        V = H 27/(4 a^6) u^2 (u^2 - a^2)^2 + tilt u + (kappa / 2) (v - b u^2)^2

    The profile along ``u`` has three minima ``u = 0, +-a`` (tilted by ``tilt u``) separated by
    barriers of height ``~H`` at ``u^2 = a^2 / 3``; the valley floor is the parabola
    ``v = b u^2`` of width ``sqrt(kT / kappa)``. Not a product density in any rotation.

    Parameters
    ----------
    barrier : ``H`` (default 2.5).  spacing : ``a`` (2).  tilt : (0.15).
    curvature : ``b`` (0.5).  stiffness : ``kappa`` (4).  angle : rotation in degrees (30).
    center : the shift ``(2,)`` ((1, -0.5)).  kT : temperature (1).
    step : MALA step ``h`` (0.03).  subsample : steps per stored sample (10).
    """

    name = "curved-wells"
    components = ("x1", "x2")

    parameters = {
        "barrier": Parameter(2.5, positive),
        "spacing": Parameter(2.0, positive),
        "tilt": Parameter(0.15, real),
        "curvature": Parameter(0.5, real),
        "stiffness": Parameter(4.0, positive),
        "angle": Parameter(30.0, real),
        "center": Parameter((1.0, -0.5), partial(vector, d=2)),
        "kT": Parameter(1.0, positive),
        **integration(step=0.03, subsample=10),
    }

    def _derive(self) -> None:
        radians = math.radians(self.angle)
        self._theta = np.array([
            27.0 * self.barrier / (4.0 * self.spacing**6), self.spacing**2, self.tilt,
            self.curvature, self.stiffness, math.cos(radians), math.sin(radians),
            self.center[0], self.center[1], 1.0 / self.kT,
        ])  # fmt: skip

    _system = CURVED_WELLS  # the kernels' potential; _theta (from _derive) holds its parameters

    def to_local(self, x: np.ndarray) -> np.ndarray:
        """Valley coordinates ``(u, v) = R(-angle) (x - center)`` of ``x (n, 2)``: ``(n, 2)``."""
        radians = math.radians(self.angle)
        co, si = math.cos(radians), math.sin(radians)
        d = _points(x, 2) - self.center
        return np.column_stack([co * d[:, 0] + si * d[:, 1], co * d[:, 1] - si * d[:, 0]])

    def from_local(self, uv: np.ndarray) -> np.ndarray:
        """Inverse of :meth:`to_local`: ``x = center + R(angle) (u, v)``, shape ``(n, 2)``."""
        radians = math.radians(self.angle)
        co, si = math.cos(radians), math.sin(radians)
        uv = _points(uv, 2)
        return self.center + np.column_stack(
            [co * uv[:, 0] - si * uv[:, 1], si * uv[:, 0] + co * uv[:, 1]]
        )

    def initial_state(self, rng: np.random.Generator) -> np.ndarray:
        """The middle well's bottom ``center``, perturbed by ``0.1 N(0, I)``: ``(2,)``."""
        return self.center + 0.1 * rng.standard_normal(2)


class Coupled3D(_MalaSystem):
    """A double well driving two non-Gaussian coordinates (d = 3), MALA-sampled.

    ``p_eq ∝ exp(-V / kT)`` with ``y2 = x2 - a x1``, ``y3 = x3 - b x2`` and::

        V = H (x1^2 - 1)^2 + tilt x1 + y2^2/2 + g2 y2^4/4 + y3^2/2 + c3 y3^3/3 + g3 y3^4/4

    The map ``x -> (x1, y2, y3)`` is triangular with unit Jacobian, so ``x1``, ``y2``, ``y3`` are
    independent with 1-D densities ``∝ exp(-V_k / kT)`` (exact moments by 1-D quadrature);
    ``y3`` is skewed (``c3^2 < 4 g3`` keeps it unimodal).

    Parameters
    ----------
    barrier : ``H`` (3).  tilt : (0.25).  a : (1).  b : (0.8).
    quartic2 : ``g2`` (1).  cubic3 : ``c3`` (0.6).  quartic3 : ``g3`` (0.5).  kT : (1).
    step : MALA step (0.04).  subsample : (10).
    """

    name = "coupled-3d"
    components = ("x1", "x2", "x3")

    parameters = {
        "barrier": Parameter(3.0, positive),
        "tilt": Parameter(0.25, real),
        "a": Parameter(1.0, real),
        "b": Parameter(0.8, real),
        "quartic2": Parameter(1.0, positive),
        "cubic3": Parameter(0.6, real),
        "quartic3": Parameter(0.5, positive),
        "kT": Parameter(1.0, positive),
        **integration(step=0.04, subsample=10),
    }

    def _derive(self) -> None:
        self._theta = np.array([
            self.barrier, self.tilt, self.a, self.b, self.quartic2, self.cubic3, self.quartic3,
            1.0 / self.kT,
        ])  # fmt: skip

    _system = COUPLED_3D  # the kernels' potential; _theta (from _derive) holds its parameters

    def factors(self, x: np.ndarray) -> np.ndarray:
        """The independent coordinates ``(x1, y2, y3)`` of ``x (n, 3)``, shape ``(n, 3)``."""
        x = _points(x, 3)
        return np.column_stack([x[:, 0], x[:, 1] - self.a * x[:, 0], x[:, 2] - self.b * x[:, 1]])

    def initial_state(self, rng: np.random.Generator) -> np.ndarray:
        """Near the bottom ``(1, a, a b)`` of the right well, ``0.1 N(0, I)`` off: ``(3,)``."""
        return np.array([1.0, self.a, self.a * self.b]) + 0.1 * rng.standard_normal(3)


class AnharmonicChain(_MalaSystem):
    """A chain of anharmonic oscillators, nearest-neighbour coupled, one double well; MALA.

    ``p_eq ∝ exp(-V / kT)`` with::

        V = H (x1^2 - 1)^2 + tilt x1 + sum_{i>=2} (x_i^2/2 + c x_i^3/3 + g x_i^4/4)
            + (kappa / 2) sum_{i=1}^{d-1} (x_{i+1} - x_i)^2

    A Markov-chain density: its 1-D and neighbour-pair marginals follow exactly from 1-D
    transfer-matrix quadrature. Use :class:`Coupled4D` / :class:`Coupled6D` (d = 4, 6).

    Parameters
    ----------
    barrier : ``H`` (3).  tilt : (0.2).  coupling : ``kappa`` (1).  cubic : ``c`` (0.5).
    quartic : ``g`` (0.5; ``c^2 < 4 g`` keeps each oscillator unimodal).  kT : (1).
    step : MALA step (0.04).  subsample : (5).
    """

    dimension: int

    parameters = {
        "barrier": Parameter(3.0, positive),
        "tilt": Parameter(0.2, real),
        "coupling": Parameter(1.0, real),
        "cubic": Parameter(0.5, real),
        "quartic": Parameter(0.5, positive),
        "kT": Parameter(1.0, positive),
        **integration(step=0.04, subsample=5),
    }

    def _derive(self) -> None:
        self.components = tuple(f"x{i + 1}" for i in range(self.dimension))
        self._theta = np.array([
            self.barrier, self.tilt, self.coupling, self.cubic, self.quartic, 1.0 / self.kT,
        ])  # fmt: skip

    _system = CHAIN  # the kernels' potential; _theta (from _derive) holds its parameters

    def initial_state(self, rng: np.random.Generator) -> np.ndarray:
        """``x1 = 1`` (right well), the rest 0, plus ``0.1 N(0, I)``: ``(d,)``."""
        state = np.zeros(self.dimension)
        state[0] = 1.0
        return state + 0.1 * rng.standard_normal(self.dimension)


class Coupled4D(AnharmonicChain):
    """:class:`AnharmonicChain` with d = 4."""

    name = "coupled-4d"
    dimension = 4


class Coupled6D(AnharmonicChain):
    """:class:`AnharmonicChain` with d = 6."""

    name = "coupled-6d"
    dimension = 6


class TrigTie4D(_MalaSystem):
    """Two coupled double wells with a trigonometric tie (d = 4), MALA-sampled.

    ``p_eq ∝ exp(-V / kT)`` with ``u3 = x3 - a sin(omega x1)``, ``u4 = x4 - b x2`` and::

        V = H (x1^2 - 1)^2 + H (x2^2 - 1)^2 - kappa cos(omega (x1 - x2)) + u3^2/2 + u4^2/2

    The score has ``sin`` and ``cos`` terms in ``x1`` and ``x2``, which no polynomial of low
    degree follows: ``x3`` sits on a sine of ``x1`` and the wells are tied by a cosine. Given
    ``(x1, x2)``, ``u3`` and ``u4`` are independent standard normals (``kT = 1``).

    Parameters
    ----------
    barrier : ``H`` (1.5).  kappa : (0.5).  omega : (2.5).  a : (0.8).  b : (0.7).  kT : (1).
    step : MALA step (0.04).  subsample : (5).
    """

    name = "trig-4d"
    components = ("x1", "x2", "x3", "x4")

    parameters = {
        "barrier": Parameter(1.5, positive),
        "kappa": Parameter(0.5, real),
        "omega": Parameter(2.5, positive),
        "a": Parameter(0.8, real),
        "b": Parameter(0.7, real),
        "kT": Parameter(1.0, positive),
        **integration(step=0.04, subsample=5),
    }

    def _derive(self) -> None:
        self._theta = np.array(
            [self.barrier, self.kappa, self.omega, self.a, self.b, 1.0 / self.kT]
        )

    _system = TRIG_4D

    def initial_state(self, rng: np.random.Generator) -> np.ndarray:
        """Near ``(1, 1, a sin(omega), b)``, ``0.1 N(0, I)`` off: ``(4,)``."""
        start = np.array([1.0, 1.0, self.a * math.sin(self.omega), self.b])
        return start + 0.1 * rng.standard_normal(4)


class GammaTie3D(_MalaSystem):
    """A Gamma coordinate with a log tie and a quadratic tie (d = 3), MALA-sampled.

    ``p_eq(x) ∝ x1^(k-1) exp(-x1 / theta) exp(-(x2 - alpha log x1)^2 / 2) exp(-(x3 - gamma
    x2^2)^2 / 2)`` on ``x1 > 0``: ``x1 ~ Gamma(k, theta)``, ``x2 | x1 ~ N(alpha log x1, 1)``,
    ``x3 | x2 ~ N(gamma x2^2, 1)``. The score of ``x1`` has terms in ``1 / x1`` and
    ``log(x1) / x1``; proposals with ``x1 <= 0`` are rejected (``p_eq = 0`` there).

    Parameters
    ----------
    shape : ``k`` (3).  theta : (1).  alpha : (0.7).  gamma : (0.4).
    step : MALA step (0.25).  subsample : (5).
    """

    name = "gamma-3d"
    components = ("x1", "x2", "x3")

    parameters = {
        "shape": Parameter(3.0, positive),
        "theta": Parameter(1.0, positive),
        "alpha": Parameter(0.7, real),
        "gamma": Parameter(0.4, real),
        **integration(step=0.25, subsample=5),
    }

    def _derive(self) -> None:
        self._theta = np.array([self.shape, self.theta, self.alpha, self.gamma])

    _system = GAMMA_3D

    def initial_state(self, rng: np.random.Generator) -> np.ndarray:
        """Near the mode of ``x1`` and the ties' centres, ``0.05 N(0, I)`` off: ``(3,)``."""
        u = max(self.shape - 1.0, 0.5) * self.theta
        x2 = self.alpha * math.log(u)
        return np.array([u, x2, self.gamma * x2 * x2]) + 0.05 * rng.standard_normal(3)


_HEAVY_SCALE = ((1.0, 0.6), (0.6, 0.8))


class HeavyTail(_MalaSystem):
    """Multivariate Student-t density (default d = 2), MALA-sampled.

    ``p_eq ∝ (1 + (x - loc)^T Q (x - loc) / nu)^(-(nu + d)/2)``, ``Q = scale^{-1}``; mean
    ``loc``, covariance ``nu / (nu - 2) scale`` (``nu > 2``), marginal excess kurtosis
    ``6 / (nu - 4)`` (``nu > 4``; 6 at the default ``nu = 5``), and ``(x - loc)^T Q (x - loc) / d``
    is ``F(d, nu)``-distributed. Score ``-(nu + d) Q (x - loc) / (nu + (x - loc)^T Q (x - loc))``.

    Parameters
    ----------
    nu : degrees of freedom (5; must exceed 2 for a finite variance).
    scale : (d, d) symmetric positive-definite scale matrix (((1, 0.6), (0.6, 0.8))).
    loc : (d,) location ((0.5, -0.3)).
    step : MALA step (0.3).  subsample : (2).
    """

    name = "heavy-tail"
    _system = STUDENT

    # a constructor of its own, not a table of parameters: the length of loc follows from scale
    def __init__(
        self,
        nu: float = 5.0,
        scale: Any = _HEAVY_SCALE,
        loc: Any = (0.5, -0.3),
        step: float = 0.3,
        subsample: int = 2,
    ) -> None:
        self.nu = positive("nu", nu)
        if self.nu <= 2.0:
            raise ValueError(f"nu={nu!r} must exceed 2 (finite variance)")
        self.scale = matrix("scale", scale)
        if self.scale.ndim != 2 or self.scale.shape[0] != self.scale.shape[1]:
            raise ValueError(f"scale={scale!r} must be a square (d, d) matrix")
        d = self.scale.shape[0]
        if (
            d == 0
            or not np.all(np.isfinite(self.scale))
            or not np.allclose(self.scale, self.scale.T)
            or np.linalg.eigvalsh(self.scale).min() <= 0
        ):
            raise ValueError(f"scale={scale!r} must be symmetric positive definite")
        self.loc = vector("loc", loc, d)
        self.step = positive("step", step)
        self.subsample = count("subsample", subsample)
        self.components = tuple(f"x{i + 1}" for i in range(d))
        self.precision = np.linalg.inv(self.scale)
        self._theta = np.concatenate([[self.nu], self.loc, self.precision.ravel()])

    def covariance(self) -> np.ndarray:
        """Exact covariance ``nu / (nu - 2) scale``, shape ``(d, d)``."""
        return self.nu / (self.nu - 2.0) * self.scale

    def initial_state(self, rng: np.random.Generator) -> np.ndarray:
        """``loc`` plus ``0.1 N(0, I)``: ``(d,)``."""
        return self.loc + 0.1 * rng.standard_normal(self.loc.shape[0])


# --------------------------------------------------------------------------------------------
# hard wall: exactly sampled CIR coordinate and a Gaussian coordinate riding on it
# --------------------------------------------------------------------------------------------


def _gamma_shape(name: str, value: Any) -> float:
    """A real multiple of 1/2 that is at least 1, or a ValueError naming the parameter."""
    result = real(name, value)
    if result < 1.0 or 2.0 * result != round(2.0 * result):
        raise ValueError(f"{name}={value!r} must be a multiple of 1/2 and at least 1")
    return result


class Wall(Parametrised):
    """A skewed density with a hard wall at ``x1 = 0`` (d = 2), sampled exactly.

    ``x1`` is the CIR process ``dx1 = kappa (mean - x1) dt + sigma sqrt(x1) dW1`` with
    ``sigma^2 = 2 kappa mean / shape``; ``x2 = coupling x1 + w`` with ``w`` the OU process
    ``dw = -gamma w dt + sigma_w sqrt(2 gamma) dW2``. The stationary density is::

        p_eq(x1, x2) = Gamma(x1; shape, scale = mean / shape) N(x2 - coupling x1; 0, sigma_w^2)
                     ∝ x1^(shape - 1) exp(-shape x1 / mean - (x2 - coupling x1)^2 / (2 sigma_w^2))

    on ``x1 > 0``. Score: ``((shape - 1)/x1 - shape/mean + coupling r / sigma_w^2,
    -r / sigma_w^2)`` with ``r = x2 - coupling x1``. ``2 shape`` must be an integer ``>= 2``
    (``shape >= 1``): then ``x1`` is the squared norm of a ``2 shape``-dimensional OU process and
    its noncentral chi-square transition costs ``2 shape`` normals (no rejection sampling), so
    each stored sample uses ``2 shape + 1`` normals and is an exact draw of the transition over
    ``dt``. ``log_density`` is ``-inf`` and ``score`` NaN/inf where ``x1 <= 0``.

    Parameters
    ----------
    shape : Gamma shape (2.5; a multiple of 1/2, ``>= 1``).  mean : ``E[x1]`` (1).
    kappa : CIR rate (1).  coupling : (0.8).  gamma : OU rate of ``w`` (2).
    sigma_w : stationary std of ``w`` (0.5).  dt : time between samples (0.05).
    """

    name = "wall"
    components = ("x1", "x2")
    default_burn_in = 0  # initial_state draws from p_eq

    parameters = {
        "shape": Parameter(2.5, _gamma_shape),
        "mean": Parameter(1.0, positive),
        "kappa": Parameter(1.0, positive),
        "coupling": Parameter(0.8, real),
        "gamma": Parameter(2.0, positive),
        "sigma_w": Parameter(0.5, positive),
        "dt": Parameter(0.05, positive),
    }

    def _derive(self) -> None:
        self._dof = int(round(2.0 * self.shape))
        self._decay = math.exp(-0.5 * self.kappa * self.dt)
        self._spread = math.sqrt(self.mean / self._dof * -math.expm1(-self.kappa * self.dt))
        self._rho = math.exp(-self.gamma * self.dt)
        self._kick = self.sigma_w * math.sqrt(-math.expm1(-2.0 * self.gamma * self.dt))
        if self._spread == 0.0 or self._kick == 0.0:
            raise ValueError(f"dt={self.dt!r} is too small for the transition to be resolved")

    def initial_state(self, rng: np.random.Generator) -> np.ndarray:
        """A draw from ``p_eq``: ``(2,)``."""
        x1 = self.mean / self.shape * rng.standard_gamma(self.shape)
        return np.array([x1, self.coupling * x1 + self.sigma_w * rng.standard_normal()])

    def advance(
        self, state: np.ndarray, n_samples: int, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray]:
        """The next ``n_samples`` stored samples ``(n_samples, 2)`` and the new state ``(2,)``."""
        _check_count(n_samples)
        state = np.asarray(state, dtype=np.float64)
        if state.shape == (2,) and not state[0] > 0.0:
            raise ValueError(f"state={state!r} must have x1 > 0 (the wall)")

        def kernel(x0: np.ndarray, normals: np.ndarray, out: np.ndarray) -> np.ndarray:
            return cir_gaussian(
                x0, normals, out, self._decay, self._spread, self.coupling, self._rho, self._kick
            )

        return _run_blocks(state, n_samples, rng, self._dof + 1, kernel, 2)

    def score(self, x: np.ndarray) -> np.ndarray:
        """Exact ``grad log p_eq`` at ``x (n, 2)`` (``x1 > 0``), shape ``(n, 2)``."""
        x = _points(x, 2)
        r = (x[:, 1] - self.coupling * x[:, 0]) / self.sigma_w**2
        with np.errstate(divide="ignore", invalid="ignore"):
            first = (self.shape - 1.0) / x[:, 0] - self.shape / self.mean + self.coupling * r
        first[x[:, 0] <= 0] = math.nan
        return np.column_stack([first, -r])

    def log_density(self, x: np.ndarray) -> np.ndarray:
        """Unnormalised ``log p_eq`` at ``x (n, 2)``, ``-inf`` where ``x1 <= 0``: ``(n,)``."""
        x = _points(x, 2)
        r = x[:, 1] - self.coupling * x[:, 0]
        with np.errstate(divide="ignore", invalid="ignore"):
            out = (
                (self.shape - 1.0) * np.log(x[:, 0])
                - self.shape / self.mean * x[:, 0]
                - 0.5 * r * r / self.sigma_w**2
            )
        out[x[:, 0] <= 0] = -math.inf
        return out


#: the systems of this module, registered in :data:`kelr_dist.data.models._MODELS`
SYSTEMS: tuple[type, ...] = (
    CurvedWells, Coupled3D, Coupled4D, Coupled6D, HeavyTail, Wall, TrigTie4D, GammaTie3D,
)  # fmt: skip

# Imported last: kelr_dist.data.models imports this module for its registry, after defining these
# helpers; importing them here, after the classes, works whichever module is imported first.
from kelr_dist.data.models import _points, _run_blocks  # noqa: E402
