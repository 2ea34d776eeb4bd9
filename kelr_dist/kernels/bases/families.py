"""Orthonormal function families, affine maps and tensor bases (paper §3.1, eq. 24, eq. 31).

One coordinate at a time:

* :class:`Hermite` — ``Ψ_m(x) = ψ_m(x) W(x)^β`` with ``ψ_m`` the Hermite polynomials orthonormal
  for the standard Gaussian density ``W`` (Mehler RKHS, §3.1.1);
* :class:`Laguerre` — ``Ψ_m(x) = ℓ^{(θ)}_m(x) G(x; θ)^β`` with ``ℓ^{(θ)}_m`` orthonormal for the
  Gamma(θ+1) density ``G(x; θ) = x^θ e^{-x} / Γ(θ+1)``, ``x ≥ 0`` (Hille–Hardy RKHS, §3.1.2);
* :class:`Fourier` — ``Ψ_m(θ) = φ_m(θ) w^β`` on the circle, ``φ_0 = 1``, ``φ_{2k-1} = √2 cos kθ``,
  ``φ_{2k} = √2 sin kθ``, orthonormal for the uniform density ``w = 1/2π`` (a periodic
  coordinate: an angle, mapped to radians by its coordinate's scale ``period / 2π``).

Values come from the normalised three-term recurrences with the weight carried along and a
running power-of-two rescaling, so orders in the hundreds and ``|x|`` up to 1e3 give finite
values with the families' weight exponents ``β ≥ 1/2`` (tiny ones underflow to 0). The
coefficients' integrands ``ψ_m W^{1-β}`` carry a *growing* weight when ``β > 1``
(:meth:`_Family.weighted_polynomials`): where their true value is beyond float64 (``|y|`` of
tens of standard deviations) they are ``±inf``, never NaN, and the coefficient pass refuses
them by name (:meth:`kelr_dist.kernels.scores.kernel_embedding.KernelDensity.from_sums`).
Derivatives come from the same forward pass (the recurrence differentiated term by term), never
from monomial coefficients, which lose all digits near order 60.

A :class:`Coordinate` is a family plus an affine map ``y = (x - loc) / scale``; the density of
``x`` is the density of ``y`` divided by ``scale`` (the chain rule is applied in
:meth:`Coordinate.evaluate`). A :class:`TensorBasis` combines coordinates with an index set:
``total`` (``|m|_1 ≤ M``, the paper's default) or ``box`` (``m_k ≤ M_k``, as in eq. 67).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal, cast

import numpy as np

from kelr_dist.kernels.compiled import compiled, contracted, reassociated

IndexSet = Literal["total", "box"]

#: Largest dense coefficient matrix the basis may ask for (bytes).
MAX_MATRIX_BYTES = 2 * 1024**3
#: Memory the kernels may use for the basis tables of one row block (bytes).
TABLE_BUDGET = 256 * 1024**2
#: Rows per block the kernels aim for at most, and the fewest worth running with.
ROW_BLOCK = 4096
MIN_ROWS = 256
#: Bytes of tables one row block may take so that they stay in a core's share of the cache: the
#: matrix products and row sums over the tail products then read them from cache, not memory
#: (see docs/benchmarks.md, section 'Tuning constants')
CACHE_BUDGET = 8 * 1024**2

_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)
_RESCALE = 2.0**64  # rescale the running recurrence once it exceeds this
_LOG_RESCALE = 64.0 * math.log(2.0)
#: |x| (Hermite) or x / 10 (Laguerre) below which the branch-free vectorised kernels are used
FAST_RANGE = 30.0


@compiled
def _hermite_kernel(x, order, beta, values, derivs):  # pragma: no cover - compiled
    """Ψ_m = ψ_m W^β, Ψ_m' = √m Ψ_{m-1} - β x Ψ_m; ψ_m = (x ψ_{m-1} - √(m-1) ψ_{m-2}) / √m."""
    inv_root = np.empty(order + 1)  # 1/√m
    ratio = np.empty(order + 1)  # √((m-1)/m)
    for m in range(1, order + 1):
        inv_root[m] = 1.0 / math.sqrt(float(m))
        ratio[m] = math.sqrt((m - 1.0) / m)
    for n in range(x.shape[0]):
        xn = x[n]
        log_scale = -beta * (0.5 * xn * xn + _LOG_SQRT_2PI)
        factor = math.exp(log_scale)
        h_prev = 0.0
        h = 1.0
        values[n, 0] = factor
        for m in range(1, order + 1):
            h_next = xn * h * inv_root[m] - ratio[m] * h_prev
            h_prev = h
            h = h_next
            if abs(h) > _RESCALE:
                h /= _RESCALE
                h_prev /= _RESCALE
                log_scale += _LOG_RESCALE
                factor = math.exp(log_scale)
            values[n, m] = h * factor if h != 0.0 else 0.0  # never 0 · inf
        if derivs.shape[0] > 0:
            derivs[n, 0] = -beta * xn * values[n, 0]
            for m in range(1, order + 1):
                derivs[n, m] = math.sqrt(float(m)) * values[n, m - 1] - beta * xn * values[n, m]


@compiled
def _laguerre_kernel(x, order, theta, beta, values, derivs):  # pragma: no cover - compiled
    """Ψ_m = ℓ_m G^β with √((m+1)(m+θ+1)) ℓ_{m+1} = (2m+1+θ-x) ℓ_m - √(m(m+θ)) ℓ_{m-1}.

    ℓ_m' follows from the same recurrence differentiated; (G^β)' = β(θ/x - 1) G^β.
    """
    log_norm = -beta * math.lgamma(theta + 1.0)
    want_d = derivs.shape[0] > 0
    inv_c = np.empty(order + 1)  # 1/√((m+1)(m+θ+1))
    a0 = np.empty(order + 1)  # (2m+1+θ)/√((m+1)(m+θ+1))
    b = np.empty(order + 1)  # √(m(m+θ)) / √((m+1)(m+θ+1))
    for m in range(order + 1):
        inv_c[m] = 1.0 / math.sqrt((m + 1.0) * (m + theta + 1.0))
        a0[m] = (2.0 * m + 1.0 + theta) * inv_c[m]
        b[m] = math.sqrt(m * (m + theta)) * inv_c[m]
    for n in range(x.shape[0]):
        xn = x[n]
        if xn < 0.0:
            for m in range(order + 1):
                values[n, m] = 0.0
                if want_d:
                    derivs[n, m] = 0.0
            continue
        if xn == 0.0:
            tb = theta * beta
            log_scale = -math.inf if tb > 0.0 else (log_norm if tb == 0.0 else math.inf)
        else:
            log_scale = log_norm + beta * (theta * math.log(xn) - xn)
        factor = math.exp(log_scale)
        # running (scaled) ℓ_m and ℓ_m'
        l_prev, l_cur = 0.0, 1.0
        d_prev, d_cur = 0.0, 0.0
        values[n, 0] = factor
        if want_d:
            derivs[n, 0] = 0.0  # ℓ_0' = 0; the weight term is added below
        for m in range(order):
            a = a0[m] - xn * inv_c[m]
            l_next = a * l_cur - b[m] * l_prev
            d_next = a * d_cur - inv_c[m] * l_cur - b[m] * d_prev
            l_prev, l_cur = l_cur, l_next
            d_prev, d_cur = d_cur, d_next
            if abs(l_cur) > _RESCALE or abs(d_cur) > _RESCALE:
                l_cur /= _RESCALE
                l_prev /= _RESCALE
                d_cur /= _RESCALE
                d_prev /= _RESCALE
                log_scale += _LOG_RESCALE
                factor = math.exp(log_scale)
            values[n, m + 1] = l_cur * factor if l_cur != 0.0 else 0.0  # never 0 · inf
            if want_d:
                derivs[n, m + 1] = d_cur * factor if d_cur != 0.0 else 0.0
        if want_d:
            # add ℓ_m · (G^β)' = Ψ_m · β(θ/x - 1); at x = 0 take the one-sided limit.
            if xn > 0.0:
                w = beta * (theta / xn - 1.0)
                for m in range(order + 1):
                    derivs[n, m] += values[n, m] * w
            elif theta * beta == 1.0:
                # G^β ~ x/Γ^β near 0, so ℓ_m (G^β)' -> ℓ_m(0) θβ ... = ℓ_m(0) Γ(θ+1)^{-β}
                lim = math.exp(log_norm)
                l_prev, l_cur = 0.0, 1.0
                derivs[n, 0] += lim
                for m in range(order):
                    l_prev, l_cur = l_cur, a0[m] * l_cur - b[m] * l_prev
                    derivs[n, m + 1] += l_cur * lim
            elif theta * beta == 0.0:
                w = -beta
                for m in range(order + 1):
                    derivs[n, m] += values[n, m] * w
            elif theta * beta < 1.0:
                # θβ < 1: the weight's derivative is unbounded at 0 (one-sided limit)
                for m in range(order + 1):
                    derivs[n, m] = math.inf
            # θβ > 1: (G^β)' -> 0 and G^β -> 0, nothing to add


@compiled
def _fourier_columns(x, order, factor, values, derivs):  # pragma: no cover - compiled
    """``φ_m(x) factor`` into ``values (order+1, n)`` and their derivatives into ``derivs``
    (``(0, n)``: none): ``cos kx, sin kx`` by the angle-addition recurrence from ``cos x, sin x``
    (rounding grows like ``k`` ulps: ~1e-13 at k = 150)."""
    root2 = math.sqrt(2.0) * factor
    want_d = derivs.shape[0] > 0
    for i in range(x.shape[0]):
        c1 = math.cos(x[i])
        s1 = math.sin(x[i])
        values[0, i] = factor
        if want_d:
            derivs[0, i] = 0.0
        ck, sk = 1.0, 0.0
        for m in range(1, order + 1, 2):
            k = (m + 1) // 2
            ck, sk = ck * c1 - sk * s1, sk * c1 + ck * s1
            values[m, i] = root2 * ck
            if want_d:
                derivs[m, i] = -k * root2 * sk
            if m + 1 <= order:
                values[m + 1, i] = root2 * sk
                if want_d:
                    derivs[m + 1, i] = k * root2 * ck


@compiled
def _hermite_columns(x, order, beta, values, derivs):  # pragma: no cover - compiled
    """Vectorised twin of :func:`_hermite_kernel` for moderate ``|x|``: outputs ``(order+1, n)``.

    The weight is carried from the start (no rescaling), so the loop over samples is free of
    branches and runs in SIMD; valid while ``W^β`` and the polynomials stay in range.
    """
    n = x.shape[0]
    for i in range(n):
        values[0, i] = math.exp(-beta * (0.5 * x[i] * x[i] + _LOG_SQRT_2PI))
    for m in range(1, order + 1):
        a = 1.0 / math.sqrt(float(m))
        b = math.sqrt((m - 1.0) / m)
        prev = values[m - 1]
        prev2 = values[m - 2] if m >= 2 else values[0]
        out = values[m]
        for i in range(n):
            out[i] = a * x[i] * prev[i] - b * prev2[i]
    if derivs.shape[0] > 0:
        for m in range(order + 1):
            root = math.sqrt(float(m))
            cur = values[m]
            low = values[m - 1] if m >= 1 else values[0]
            out = derivs[m]
            for i in range(n):
                out[i] = root * low[i] - beta * x[i] * cur[i]


@compiled
def _laguerre_columns(x, order, theta, beta, values, derivs):  # pragma: no cover - compiled
    """Vectorised twin of :func:`_laguerre_kernel` for ``0 < x`` of moderate size."""
    n = x.shape[0]
    log_norm = -beta * math.lgamma(theta + 1.0)
    want_d = derivs.shape[0] > 0
    for i in range(n):
        values[0, i] = math.exp(log_norm + beta * (theta * math.log(x[i]) - x[i]))
        if want_d:
            derivs[0, i] = 0.0
    for m in range(order):
        inv_c = 1.0 / math.sqrt((m + 1.0) * (m + theta + 1.0))
        a0 = (2.0 * m + 1.0 + theta) * inv_c
        b = math.sqrt(m * (m + theta)) * inv_c
        cur = values[m]
        prev = values[m - 1] if m >= 1 else values[0]
        out = values[m + 1]
        for i in range(n):
            out[i] = (a0 - x[i] * inv_c) * cur[i] - b * prev[i]
        if want_d:
            dcur = derivs[m]
            dprev = derivs[m - 1] if m >= 1 else derivs[0]
            dout = derivs[m + 1]
            for i in range(n):
                dout[i] = (a0 - x[i] * inv_c) * dcur[i] - inv_c * cur[i] - b * dprev[i]
    if want_d:
        slope = np.empty(n)  # (G^β)' / G^β = β(θ/x - 1), one division per sample
        for i in range(n):
            slope[i] = theta / x[i] - 1.0
        for m in range(order + 1):
            cur = values[m]
            dout = derivs[m]
            for i in range(n):
                dout[i] += cur[i] * beta * slope[i]


#: rows of a block of :func:`_recurrence_series` and :func:`_recurrence_moments`: the running
#: rows, and a few estimates' sums, stay in the first-level cache
SERIES_ROWS = 256


@contracted
def _recurrence_series(
    x, start, log_slope, diag, tilt, back, coef, sums, slopes
):  # pragma: no cover - compiled
    """``Σ_m c_km Ψ_m(x)`` into ``sums (count, n)`` and its derivative into ``slopes``, for
    functions ``Ψ_m = P_m W`` of a three-term recurrence
    ``Ψ_{m+1} = (diag_m + tilt_m x) Ψ_m - back_m Ψ_{m-1}`` from ``Ψ_0 = start (n,)``, summed as
    they go (no tables): one run of the recurrence serves every row ``k`` of ``coef``. The
    derivative runs the differentiated recurrence from ``0`` (the polynomials' part, ``P_m' W``)
    and adds ``(W'/W) Σ c_m Ψ_m`` with ``W'/W = log_slope (n,)``; the recurrence of
    :func:`_laguerre_columns` and :func:`_hermite_columns` term for term."""
    n, count = x.shape[0], coef.shape[0]
    cur = np.empty(SERIES_ROWS)
    prev = np.empty(SERIES_ROWS)
    dcur = np.empty(SERIES_ROWS)
    dprev = np.empty(SERIES_ROWS)
    acc = np.empty((count, SERIES_ROWS))
    dacc = np.empty((count, SERIES_ROWS))
    for first in range(0, n, SERIES_ROWS):
        xs = x[first : min(first + SERIES_ROWS, n)]
        rows = xs.shape[0]
        for i in range(rows):
            cur[i] = start[first + i]
            prev[i] = cur[i]
            dcur[i] = 0.0
            dprev[i] = 0.0
        for k in range(count):
            for i in range(rows):
                acc[k, i] = coef[k, 0] * cur[i]
                dacc[k, i] = 0.0
        for m in range(diag.shape[0]):
            a, t, b = diag[m], tilt[m], back[m]
            for i in range(rows):
                f = a + t * xs[i]
                value = f * cur[i] - b * prev[i]
                slope = f * dcur[i] + t * cur[i] - b * dprev[i]
                prev[i] = cur[i]
                cur[i] = value
                dprev[i] = dcur[i]
                dcur[i] = slope
            for k in range(count):
                c, values, slopes_k = coef[k, m + 1], acc[k], dacc[k]
                for i in range(rows):
                    values[i] += c * cur[i]
                    slopes_k[i] += c * dcur[i]
        for k in range(count):
            for i in range(rows):
                sums[k, first + i] = acc[k, i]
                slopes[k, first + i] = dacc[k, i] + log_slope[first + i] * acc[k, i]


@reassociated
def _recurrence_moments(x, start, diag, tilt, back, weights, squared, out):  # pragma: no cover
    """``out[m] += Σ_i weights_i Ψ_m(x_i)`` (``Ψ_m(x_i)²`` when ``squared``) for ``m = 0..M``,
    the functions of the three-term recurrence of :func:`_recurrence_series` from
    ``Ψ_0 = start (n,)``, summed as they go (no tables), by row blocks held in the first-level
    cache; each block's sum is vectorised (reassociated)."""
    n = x.shape[0]
    cur = np.empty(SERIES_ROWS)
    prev = np.empty(SERIES_ROWS)
    for first in range(0, n, SERIES_ROWS):
        xs = x[first : min(first + SERIES_ROWS, n)]
        ws = weights[first : first + xs.shape[0]]
        total = 0.0
        for i in range(xs.shape[0]):
            cur[i] = start[first + i]
            prev[i] = cur[i]
            total += ws[i] * (cur[i] * cur[i] if squared else cur[i])
        out[0] += total
        for m in range(diag.shape[0]):
            a, t, b = diag[m], tilt[m], back[m]
            total = 0.0
            for i in range(xs.shape[0]):
                value = (a + t * xs[i]) * cur[i] - b * prev[i]
                prev[i] = cur[i]
                cur[i] = value
                total += ws[i] * (value * value if squared else value)
            out[m + 1] += total


def _check_order(order: int) -> int:
    if int(order) != order or order < 0:
        raise ValueError(f"order must be a non-negative integer, got {order!r}")
    return int(order)


def _as_points(x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float64)
    if x.ndim != 1:
        raise ValueError(f"x must be one-dimensional (n,), got shape {x.shape}")
    return x


class _Family:
    """:meth:`evaluate` and :meth:`weighted_polynomials` of :class:`Hermite`,
    :class:`Laguerre` and :class:`Fourier` (one table kernel)."""

    beta: float

    def evaluate(
        self, x: np.ndarray, order: int, out: Workspace | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Values and x-derivatives of ``Ψ_0..Ψ_order`` at ``x (n,)``, each ``(n, order + 1)``
        (written into ``out``'s buffers when given, see :class:`Workspace`)."""
        family = cast("Family", self)  # the only subclasses
        return _evaluate(
            family, _as_points(x), _check_order(order), self.beta, derivatives=True, out=out
        )

    def series(self, x: np.ndarray, coefficients: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``Σ_m c_km Ψ_m(x)`` (eq. 40 in one coordinate) and its x-derivative at ``x (n,)`` for
        each row ``k`` of ``coefficients (count, order + 1)``: each ``(count, n)``. The same as
        contracting :meth:`evaluate`'s tables, without the tables (Hermite and Laguerre: their
        three-term recurrence summed as it goes, :func:`_recurrence_series`; samples outside
        :data:`FAST_RANGE`, and Fourier, by the tables)."""
        family = cast("Family", self)
        x = _as_points(x)
        coefficients = np.ascontiguousarray(coefficients, dtype=np.float64)
        order = coefficients.shape[1] - 1
        sums = np.empty((coefficients.shape[0], x.shape[0]))
        slopes = np.empty_like(sums)
        recurrent, inside, y = self._fast_points(x, self.beta)
        if recurrent is not None and inside.any():
            _recurrence_series(y, *recurrent.weight(y, self.beta), *recurrent.recurrence(order),
                               coefficients, sums, slopes)  # fmt: skip
        if not inside.all():
            far = np.flatnonzero(~inside)
            values, derivs = _evaluate(family, x[far], order, self.beta, derivatives=True)
            sums[:, far] = coefficients @ values.T
            slopes[:, far] = coefficients @ derivs.T
        return sums, slopes

    def _fast_points(
        self, x: np.ndarray, power: float
    ) -> tuple[Hermite | Laguerre | None, np.ndarray, np.ndarray]:
        """The family when it has a three-term recurrence (``None`` for Fourier), the samples
        :meth:`series` and :meth:`moments` take by it (``fast``), and the samples with the others
        moved to ``fast_point``."""
        family = cast("Family", self)
        if isinstance(family, Fourier):
            return None, np.zeros(x.shape[0], dtype=bool), x
        inside = family.fast(x, power)
        return family, inside, np.where(inside, x, family.fast_point)

    def moments(
        self, x: np.ndarray, order: int, weight: float, factors: np.ndarray, squared: bool = False
    ) -> np.ndarray:
        """``Σ_i f_i T_m(x_i)`` (or ``Σ_i f_i T_m(x_i)²``) for m = 0..order, ``(order + 1,)``,
        with ``T_m`` the columns of :meth:`weighted_polynomials` and ``f = factors (n,)``: the
        tables contracted, without the tables (Hermite and Laguerre: their three-term recurrence
        summed as it goes, :func:`_recurrence_moments`; samples outside :data:`FAST_RANGE`, and
        Fourier, by the tables). With ``weight = 1 - β``, eq. 39's sums."""
        x = _as_points(x)
        order = _check_order(order)
        factors = np.ascontiguousarray(factors, dtype=np.float64)
        out = np.zeros(order + 1)
        recurrent, inside, y = self._fast_points(x, weight)
        if recurrent is not None and inside.any():
            start, _ = recurrent.weight(y, weight)
            _recurrence_moments(y, start, *recurrent.recurrence(order),
                                np.where(inside, factors, 0.0), squared, out)  # fmt: skip
        if not inside.all():
            far = np.flatnonzero(~inside)
            table = self.weighted_polynomials(x[far], order, weight)
            out += (np.square(table) if squared else table).T @ factors[far]
        return out

    def weighted_polynomials(
        self, x: np.ndarray, order: int, weight: float, out: Workspace | None = None
    ) -> np.ndarray:
        """The family's orthonormal polynomials times its weight to the power ``weight``
        (``ψ_m W^weight``, ``ℓ_m G^weight``, ``φ_m w^weight``) for m = 0..order, shape
        ``(n, order + 1)``. With ``weight = 1 - β`` these are the integrands of the
        coefficients (eq. 39).

        Finite wherever the value is representable in float64; for a negative ``weight`` (a
        weight that grows, ``β > 1``) far in the tails (at order 0 from ``|y| ≈ 27`` for
        ``weight = -2`` and ``|y| ≈ 38`` for ``weight = -1``, nearer at high orders) the value is
        beyond float64 and returned as ``±inf``, never NaN."""
        family = cast("Family", self)
        return _evaluate(
            family, _as_points(x), _check_order(order), weight, derivatives=False, out=out
        )[0]


@dataclass(frozen=True)
class Hermite(_Family):
    """Hermite functions ``Ψ_m = ψ_m W^β`` (eq. 24), orthonormal in ``L²(W^{1-2β})``.

    Parameters
    ----------
    beta : weight exponent, ``β ≥ 1/2`` (the paper uses 1; Remark 1).
    """

    beta: float = 1.0
    name = "hermite"

    def __post_init__(self) -> None:
        if not (self.beta >= 0.5 and math.isfinite(self.beta)):
            raise ValueError(f"Hermite beta must be a finite number >= 1/2, got {self.beta!r}")

    def second_derivatives(
        self, x: np.ndarray, values: np.ndarray, derivs: np.ndarray
    ) -> np.ndarray:
        """``Ψ_m''`` at ``x (n,)`` from the tables of :meth:`evaluate`, ``(n, order + 1)``.

        Differentiating ``Ψ_m' = √m Ψ_{m-1} - β x Ψ_m`` once more:
        ``Ψ_m'' = √m Ψ_{m-1}' - β Ψ_m - β x Ψ_m'``.
        """
        x = _as_points(x)[:, None]
        root = np.sqrt(np.arange(values.shape[1], dtype=np.float64))
        lower = np.zeros_like(derivs)
        lower[:, 1:] = derivs[:, :-1]
        return root * lower - self.beta * (values + x * derivs)

    def spec(self) -> str:
        return f"hermite(beta={self.beta:g})"

    #: where :meth:`series` evaluates the samples outside :meth:`fast` (then replaced)
    fast_point = 0.0

    def fast(self, x: np.ndarray, power: float) -> np.ndarray:
        """Samples the vectorised recurrence with the weight to ``power`` holds for
        (``|x| ≤`` :data:`FAST_RANGE`; none for ``power < -1``), as in :func:`_evaluate`."""
        return (x > -FAST_RANGE) & (x <= FAST_RANGE) & (power >= -1.0)

    def weight(self, x: np.ndarray, power: float) -> tuple[np.ndarray, np.ndarray]:
        """``Ψ_0 = W^power`` and ``(W^power)'/W^power = -power x`` at ``x (n,)``."""
        return np.exp(-power * (0.5 * x * x + _LOG_SQRT_2PI)), -power * x

    @staticmethod
    def recurrence(order: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(diag, tilt, back)`` of ``Ψ_{m+1} = x Ψ_m / √(m+1) - √(m/(m+1)) Ψ_{m-1}``,
        m = 0..order-1."""
        m = np.arange(order, dtype=np.float64)
        return np.zeros(order), 1.0 / np.sqrt(m + 1.0), np.sqrt(m / (m + 1.0))


@dataclass(frozen=True)
class Laguerre(_Family):
    """Laguerre functions ``Ψ_m = ℓ^{(θ)}_m G(·; θ)^β`` (eq. 31) on ``x ≥ 0`` (0 below).

    Parameters
    ----------
    theta : Gamma shape minus one, ``θ > -1`` (the paper uses integers; any real works).
    beta : weight exponent, ``β ≥ 1/2``.
    """

    theta: float = 1.0
    beta: float = 1.0
    name = "laguerre"

    def __post_init__(self) -> None:
        if not (self.theta > -1.0 and math.isfinite(self.theta)):
            raise ValueError(f"Laguerre theta must be a finite number > -1, got {self.theta!r}")
        if not (self.beta >= 0.5 and math.isfinite(self.beta)):
            raise ValueError(f"Laguerre beta must be a finite number >= 1/2, got {self.beta!r}")

    def second_derivatives(
        self, x: np.ndarray, values: np.ndarray, derivs: np.ndarray
    ) -> np.ndarray:
        """``Ψ_m''`` at ``x (n,)`` from the tables of :meth:`evaluate`, ``(n, order + 1)``.

        With ``w = β(θ/x - 1)`` (so ``(G^β)' = w G^β``) and ``D = ℓ_m' G^β = Ψ_m' - w Ψ_m``, the
        Laguerre equation ``x ℓ'' + (θ + 1 - x) ℓ' + m ℓ = 0`` gives
        ``Ψ_m'' = -((θ + 1 - x) D + m Ψ_m) / x + 2 w D + (w² - βθ/x²) Ψ_m`` for ``x > 0``
        (0 at ``x ≤ 0``, outside the support).
        """
        x = _as_points(x)
        inside = x > 0
        y = np.where(inside, x, 1.0)[:, None]
        w = self.beta * (self.theta / y - 1.0)
        d = derivs - w * values
        m = np.arange(values.shape[1], dtype=np.float64)
        out = -((self.theta + 1.0 - y) * d + m * values) / y + 2.0 * w * d
        out += (w * w - self.beta * self.theta / (y * y)) * values
        out[~inside] = 0.0
        return out

    def spec(self) -> str:
        return f"laguerre(theta={self.theta:g},beta={self.beta:g})"

    #: where :meth:`series` evaluates the samples outside :meth:`fast` (then replaced)
    fast_point = 1.0

    def fast(self, x: np.ndarray, power: float) -> np.ndarray:
        """Samples the vectorised recurrence with the weight to ``power`` holds for
        (``0 < x ≤ 10`` :data:`FAST_RANGE`; none for ``power < -1``), as in :func:`_evaluate`."""
        return (x > 0.0) & (x <= 10.0 * FAST_RANGE) & (power >= -1.0)

    def weight(self, x: np.ndarray, power: float) -> tuple[np.ndarray, np.ndarray]:
        """``Ψ_0 = G^power`` and ``(G^power)'/G^power = power (θ/x - 1)`` at ``0 < x (n,)``."""
        log_norm = -power * math.lgamma(self.theta + 1.0)
        start = np.exp(log_norm + power * (self.theta * np.log(x) - x))
        return start, power * (self.theta / x - 1.0)

    def recurrence(self, order: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(diag, tilt, back)`` of ``Ψ_{m+1} = ((2m+1+θ) - x) Ψ_m / c_m - √(m(m+θ)) Ψ_{m-1}
        / c_m`` with ``c_m = √((m+1)(m+θ+1))``, m = 0..order-1."""
        m = np.arange(order, dtype=np.float64)
        inv_c = 1.0 / np.sqrt((m + 1.0) * (m + self.theta + 1.0))
        return (2.0 * m + 1.0 + self.theta) * inv_c, -inv_c, np.sqrt(m * (m + self.theta)) * inv_c


@dataclass(frozen=True)
class Fourier(_Family):
    """Fourier functions on the circle ``θ ∈ [0, 2π)``: ``Ψ_m = φ_m w^β`` with ``φ_0 = 1``,
    ``φ_{2k-1} = √2 cos kθ``, ``φ_{2k} = √2 sin kθ`` (index ``m`` counts cosines and sines in
    turn, so a truncation at order ``M`` keeps the frequencies up to ``⌈M/2⌉``), orthonormal in
    ``L²(w)`` for the uniform density ``w = 1/2π``.

    ``β = 1`` as for the other families (``Ψ_m = φ_m / 2π``): the kernel embedding's
    coefficients are then the sample means ``E[φ_m]`` (eq. 39) and ``p = Σ ĉ_m Ψ_m`` the
    truncated Fourier series of the density. The weight is constant, so the expansion of any
    square-integrable density on the circle converges, and its derivative has no boundary: the
    circle has none. A :class:`Coordinate` maps a periodic component of period ``P`` to radians
    with ``scale = P / 2π``.
    """

    name = "fourier"
    beta = 1.0  # the weight is constant: Ψ_m = φ_m w (a class constant, not a parameter)

    def second_derivatives(
        self,
        x: np.ndarray,  # noqa: ARG002 - the families' common signature
        values: np.ndarray,
        derivs: np.ndarray,  # noqa: ARG002
    ) -> np.ndarray:
        """``Ψ_m'' = -k² Ψ_m`` (frequency ``k = ⌈m/2⌉``), ``(n, order + 1)``."""
        k = (np.arange(values.shape[1]) + 1) // 2
        return -(k * k) * values

    def spec(self) -> str:
        return "fourier()"


Family = Hermite | Laguerre | Fourier


def polynomials(family: Family, x: np.ndarray, order: int) -> tuple[np.ndarray, np.ndarray]:
    """The family's orthonormal polynomials ``ψ_m`` (or ``ℓ^{(θ)}_m``) without weight, and their
    derivatives, at ``x (n,)``: each ``(n, order + 1)`` (the recurrences with weight exponent 0).
    """
    return _evaluate(family, _as_points(x), _check_order(order), 0.0, derivatives=True)


class Workspace:
    """Reusable table buffers for a kernel's row blocks.

    A kernel that builds tables of a few MiB for each row block would otherwise allocate them
    afresh per block; above glibc's mmap threshold every such allocation costs its page faults
    again (mallopt(3), ``M_MMAP_THRESHOLD``; see docs/benchmarks.md, section 'Tuning
    constants'). A workspace hands out the same memory for
    every block: :meth:`take` ``(slot, rows, columns)`` returns a C-contiguous ``(rows,
    columns)`` array over the slot's buffer, grown when needed (contents undefined). One
    workspace per thread; the arrays it returned are overwritten by the next :meth:`take` of the
    same slot (tables of several coordinates: one workspace each).
    """

    def __init__(self) -> None:
        self._buffers: dict[object, np.ndarray] = {}

    def take(self, slot: object, rows: int, columns: int) -> np.ndarray:
        size = rows * columns
        buffer = self._buffers.get(slot)
        if buffer is None or buffer.size < size:
            buffer = self._buffers[slot] = np.empty(size)
        return buffer[:size].reshape(rows, columns)


def _evaluate(
    family: Family,
    x: np.ndarray,
    order: int,
    weight: float,
    derivatives: bool,
    out: Workspace | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Tables ``(n, order + 1)`` (Fortran order: each function's column is contiguous),
    in ``out``'s slots ``"values"`` and ``"derivs"`` when given.

    Samples inside :data:`FAST_RANGE` go through the vectorised kernels; the rest (far tails,
    ``x ≤ 0`` for Laguerre, weights below -1) through the rescaled per-sample recurrences.
    """
    n = x.shape[0]
    rows = order + 1 if derivatives else 0
    if out is None:
        values = np.empty((order + 1, n))
        derivs = np.empty((rows, n))
    else:
        values = out.take("values", order + 1, n)
        derivs = out.take("derivs", rows, n) if rows else np.empty((0, n))
    if isinstance(family, Fourier):
        _fourier_columns(x, order, (2.0 * math.pi) ** -float(weight), values, derivs)
        return values.T, derivs.T
    if isinstance(family, Hermite):
        lo, hi = (-FAST_RANGE, FAST_RANGE) if weight >= -1.0 else (0.0, -1.0)
    else:
        lo, hi = (0.0, 10.0 * FAST_RANGE) if weight >= -1.0 else (0.0, -1.0)
    inside = (x > lo) & (x <= hi)
    if isinstance(family, Hermite):
        _hermite_columns(x, order, float(weight), values, derivs)
    else:
        _laguerre_columns(
            np.where(inside, x, 1.0), order, float(family.theta), float(weight), values, derivs
        )
    if not inside.all():
        far = np.flatnonzero(~inside)
        v = np.empty((far.size, order + 1))
        dv = np.empty((far.size if derivatives else 0, order + 1))
        if isinstance(family, Hermite):
            _hermite_kernel(x[far], order, float(weight), v, dv)
        else:
            _laguerre_kernel(x[far], order, float(family.theta), float(weight), v, dv)
        values[:, far] = v.T
        if derivatives:
            derivs[:, far] = dv.T
    return values.T, derivs.T


@dataclass(frozen=True)
class Coordinate:
    """A family on the mapped coordinate ``y = (x - loc) / scale``.

    ``loc`` is the centre for Hermite, the shift for Laguerre (the data must satisfy
    ``x ≥ loc``) and the wrap point for Fourier (the lower edge of the window ``[loc, loc +
    period)`` the angles are stored in; ``scale = period / 2π``); the density of ``x`` is the
    density of ``y`` divided by ``scale``.
    """

    family: Family = field(default_factory=Hermite)
    loc: float = 0.0
    scale: float = 1.0

    def __post_init__(self) -> None:
        if not (self.scale > 0 and math.isfinite(self.scale)):
            raise ValueError(f"scale must be a finite positive number, got {self.scale!r}")
        if not math.isfinite(self.loc):
            raise ValueError(f"loc must be finite, got {self.loc!r}")

    def mapped(self, x: np.ndarray) -> np.ndarray:
        return (np.asarray(x, dtype=np.float64) - self.loc) / self.scale

    def evaluate(self, x: np.ndarray, order: int) -> tuple[np.ndarray, np.ndarray]:
        """``Ψ_m(y) / scale`` and its x-derivative ``Ψ_m'(y) / scale²``, each ``(n, order + 1)``."""
        values, derivs = self.family.evaluate(self.mapped(x), order)
        values /= self.scale
        derivs /= self.scale**2
        return values, derivs

    def coefficient_table(self, x: np.ndarray, order: int) -> np.ndarray:
        """Integrands of eq. 39, ``ψ_m(y) W(y)^{1-β}`` (or ``ℓ_m G^{1-β}``), ``(n, M + 1)``."""
        return self.family.weighted_polynomials(self.mapped(x), order, 1.0 - self.family.beta)

    @property
    def period(self) -> float | None:
        """The period ``2π scale`` of a :class:`Fourier` coordinate in ``x`` units, else None."""
        return 2.0 * math.pi * self.scale if isinstance(self.family, Fourier) else None

    def spec(self) -> str:
        inner = self.family.spec()[:-1]
        sep = "" if inner.endswith("(") else ","
        return f"{inner}{sep}loc={self.loc:.17g},scale={self.scale:.17g})"


def _stack_tables(tables: list[np.ndarray]) -> np.ndarray:
    """Per-coordinate tables ``(n, M_k + 1)`` as one function-major ``(d', max M_k + 1, n)``
    (a copy without transposing when the tables are Fortran-ordered, as the families give them;
    the padding is never read)."""
    out = np.empty((len(tables), max(t.shape[1] for t in tables), tables[0].shape[0]))
    for k, t in enumerate(tables):
        out[k, : t.shape[1]] = t.T
    return out


def _tail_runs(tails: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Runs of consecutive tails that differ only in the last coordinate, which counts up by
    one: the run heads ``(runs, d' + 1)`` = (first row, its tail) and lengths ``(runs,)``."""
    if tails.shape[0] == 0:
        return np.zeros((0, tails.shape[1] + 1), dtype=np.int64), np.zeros(0, dtype=np.int64)
    new_run = np.ones(tails.shape[0], dtype=bool)
    new_run[1:] = np.any(tails[1:, :-1] != tails[:-1, :-1], axis=1) | (
        tails[1:, -1] != tails[:-1, -1] + 1
    )
    first = np.flatnonzero(new_run)
    lengths = np.diff(np.r_[first, tails.shape[0]])
    return np.column_stack([first, tails[first]]).astype(np.int64), lengths.astype(np.int64)


def _tail_products(
    values: np.ndarray,
    derivatives: np.ndarray,
    runs: tuple[np.ndarray, np.ndarray],
    size: int,
    with_gradients: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """``H[r, n] = Π_k values[k, R[r, k], n]`` ``(|R|, n)`` and, with gradients, each ``∂_k H``
    stacked ``(d', |R|, n)`` (one factor replaced by its derivative); ``values``,
    ``derivatives`` function-major ``(d', W, n)`` (:func:`_stack_tables`), the tails given by
    their runs (:func:`_tail_runs`)."""
    m, n = values.shape[0], values.shape[2]
    product = np.empty((size, n))
    grads = np.empty((m if with_gradients else 0, size, n))
    _fill_tail_products(values, derivatives, runs[0], runs[1], product, grads)
    return product, grads


@compiled
def _fill_tail_products(values, derivatives, heads, lengths, product, grads):  # pragma: no cover
    """Run by run: the run's fixed leading factors are multiplied once per sample, then each of
    the run's functions is the last coordinate's contiguous table row scaled by them."""
    m, n = values.shape[0], values.shape[2]
    last = m - 1
    gradients = grads.shape[0] > 0
    fixed = np.empty(n)
    lead = np.empty((m, n))  # lead[k]: the fixed factors with the k-th replaced by its derivative
    for run in range(heads.shape[0]):
        first, offset, count = heads[run, 0], heads[run, m], lengths[run]
        fixed[:] = 1.0
        for k in range(last):
            fixed *= values[k, heads[run, 1 + k]]
        if gradients:
            for k in range(last):
                lead[k] = derivatives[k, heads[run, 1 + k]]
                for other in range(last):
                    if other != k:
                        lead[k] *= values[other, heads[run, 1 + other]]
        for j in range(count):
            row = values[last, offset + j]
            out = product[first + j]
            for i in range(n):
                out[i] = fixed[i] * row[i]
            if gradients:
                for k in range(last):
                    g = grads[k, first + j]
                    for i in range(n):
                        g[i] = lead[k, i] * row[i]
                slope = derivatives[last, offset + j]
                g = grads[last, first + j]
                for i in range(n):
                    g[i] = fixed[i] * slope[i]


@compiled
def _fill_columns(first, tails, stops, out):  # pragma: no cover - compiled
    """``out[p] = first[m_1] * tails[r]`` for the functions ``p`` of each tail ``r`` in layout
    order (``m_1 = 0..stops[r]``); all arrays function-major ``(functions, n)``."""
    p = 0
    for r in range(tails.shape[0]):
        tail = tails[r]
        for m1 in range(stops[r] + 1):
            row = first[m1]
            target = out[p]
            for i in range(row.shape[0]):
                target[i] = row[i] * tail[i]
            p += 1


def multi_indices(caps: tuple[int, ...] | list[int], total: int | None = None) -> np.ndarray:
    """Every multi-index ``m`` with ``0 ≤ m_k ≤ caps[k]`` (and ``|m|_1 ≤ total`` when given),
    ``(P, len(caps))`` int64 in lexicographic order (the last coordinate fastest).

    Built one coordinate at a time from the prefixes that can still be completed, so time and
    memory are proportional to the ``P d`` entries returned, never to ``Π (caps_k + 1)``: a total
    degree of 1 in 128 coordinates is 129 rows, not ``2^128``."""
    rows = np.zeros((1, 0), dtype=np.int64)
    used = np.zeros(1, dtype=np.int64)
    for cap in caps:
        room = np.full(used.shape, int(cap)) if total is None else np.minimum(cap, total - used)
        counts = room + 1
        starts = np.repeat(np.cumsum(counts) - counts, counts)
        values = np.arange(int(counts.sum()), dtype=np.int64) - starts
        rows = np.column_stack([np.repeat(rows, counts, axis=0), values])
        used = np.repeat(used, counts) + values
    return np.ascontiguousarray(rows, dtype=np.int64)


@dataclass(frozen=True)
class TensorBasis:
    """Tensor products of per-coordinate families over an index set (eq. 17, eq. 38).

    Parameters
    ----------
    coordinates : one :class:`Coordinate` per component.
    order : ``M`` for ``total`` (``|m|_1 ≤ M``), or ``M`` / ``(M_1, ..., M_d)`` for ``box``
        (``m_k ≤ M_k``).
    index_set : ``"total"`` or ``"box"``.

    For the nested families scanned by the order criteria, the *level* of a multi-index is
    ``|m|_1`` (total) or ``max_k m_k`` (box); the order-``L`` truncation keeps levels ``≤ L``.

    Computation layout: with ``R`` the distinct tails ``(m_2, ..., m_d)`` of the index set,
    every sum over the basis is a matrix product between the first coordinate's table
    ``(n, M_1 + 1)`` and the tail products ``H[n, r] = Π_{k≥2} T_k[n, R[r, k-2]]`` ``(n, |R|)``.
    """

    coordinates: tuple[Coordinate, ...]
    order: int | tuple[int, ...]
    index_set: IndexSet = "total"

    def __post_init__(self) -> None:
        coords = tuple(self.coordinates)
        if not coords:
            raise ValueError("a basis needs at least one coordinate")
        object.__setattr__(self, "coordinates", coords)
        if self.index_set not in ("total", "box"):
            raise ValueError(f"index_set must be 'total' or 'box', got {self.index_set!r}")
        if isinstance(self.order, tuple | list):
            orders = self.order
            if self.index_set == "total":
                raise ValueError("a per-coordinate order tuple needs index_set='box'")
            if len(orders) != len(coords):
                raise ValueError(
                    f"order has {len(orders)} entries but the basis has {len(coords)} coordinates"
                )
            object.__setattr__(self, "order", tuple(_check_order(m) for m in orders))
        else:
            object.__setattr__(self, "order", _check_order(self.order))
        nbytes = 8 * (self.max_orders[0] + 1) * self._tail_count()
        if nbytes > MAX_MATRIX_BYTES:
            raise ValueError(
                f"order {self.order!r} needs a {nbytes / 2**30:.1f} GiB coefficient matrix "
                f"(limit {MAX_MATRIX_BYTES / 2**30:.0f} GiB); choose a smaller order"
            )

    @property
    def dim(self) -> int:
        return len(self.coordinates)

    def _tail_count(self) -> int:
        """``|R|`` without building the tails: C(M + d - 1, d - 1) (total) or Π_{k≥2}(M_k + 1)."""
        if self.index_set == "total":
            return math.comb(self.total_order + self.dim - 1, self.dim - 1)
        return math.prod(m + 1 for m in self.max_orders[1:])

    @property
    def total_order(self) -> int:
        """The total degree ``M`` of a ``"total"`` index set (whose order is one integer)."""
        if isinstance(self.order, tuple):
            raise ValueError(f"a box basis of orders {self.order} has no single total degree")
        return self.order

    @property
    def max_orders(self) -> tuple[int, ...]:
        """Highest degree per coordinate, ``(d,)``."""
        if isinstance(self.order, tuple):
            return self.order
        return (self.order,) * self.dim

    @property
    def max_level(self) -> int:
        return max(self.max_orders) if self.index_set == "box" else self.total_order

    @cached_property
    def indices(self) -> np.ndarray:
        """Multi-indices ``(P, d)`` in the layout order: by tail, then by first degree."""
        rows = [
            (m1, *tail)
            for tail in map(tuple, self.tails)
            for m1 in range(self.first_stop(tail) + 1)
        ]
        return np.asarray(rows, dtype=np.int64).reshape(-1, self.dim)

    @property
    def size(self) -> int:
        return int(self.indices.shape[0])

    @cached_property
    def tails(self) -> np.ndarray:
        """Distinct tails ``(m_2..m_d)`` of the index set, ``(|R|, d-1)``, sorted."""
        total = self.total_order if self.index_set == "total" else None
        return multi_indices(self.max_orders[1:], total)

    def first_stop(self, tail: tuple[int, ...] | np.ndarray) -> int:
        """Highest first-coordinate degree paired with ``tail``."""
        if self.index_set == "total":
            return self.total_order - int(np.sum(tail))
        return self.max_orders[0]

    def levels(self, indices: np.ndarray | None = None) -> np.ndarray:
        """Level of each multi-index: ``|m|_1`` (total) or ``max_k m_k`` (box)."""
        m = self.indices if indices is None else indices
        return m.sum(axis=1) if self.index_set == "total" else m.max(axis=1)

    def to_matrix(self, coefficients: np.ndarray) -> np.ndarray:
        """Flat coefficients ``(P,)`` -> the layout matrix ``(M_1 + 1, |R|)`` (zeros outside)."""
        out = np.zeros((self.max_orders[0] + 1, len(self.tails)))
        tail_pos = self._tail_positions()
        out[self.indices[:, 0], tail_pos] = coefficients
        return out

    def from_matrix(self, matrix: np.ndarray) -> np.ndarray:
        """Layout matrix ``(M_1 + 1, |R|)`` -> flat coefficients ``(P,)``."""
        return matrix[self.indices[:, 0], self._tail_positions()]

    def _tail_positions(self) -> np.ndarray:
        return np.repeat(np.arange(len(self.tails)), self.first_stops + 1)

    @property
    def first_only(self) -> bool:
        """Whether the functions vary in the first coordinate only (one tail, ``|R| = 1``: d = 1,
        or orders ``(M, 0, ..., 0)``): the basis is then that coordinate's series times the
        other coordinates' ``Ψ_0``."""
        return self.tails.shape[0] == 1

    @cached_property
    def first_stops(self) -> np.ndarray:
        """:meth:`first_stop` of every tail, ``(|R|,)`` int64."""
        return np.asarray([self.first_stop(t) for t in self.tails], dtype=np.int64)

    def columns(self, first: np.ndarray, tails: np.ndarray) -> np.ndarray:
        """Every basis function at the rows of a first-coordinate table ``(n, M_1 + 1)`` and tail
        products ``(n, |R|)`` (:meth:`tail_products`): ``(n, P)`` in :attr:`indices` order,
        Fortran-ordered like the tables."""
        out = np.empty((self.size, first.shape[0]))
        _fill_columns(
            np.ascontiguousarray(first.T), np.ascontiguousarray(tails.T), self.first_stops, out
        )
        return out.T

    def tail_products(
        self, tables: list[np.ndarray], derivative_tables: list[np.ndarray] | None = None
    ) -> tuple[np.ndarray, list[np.ndarray]]:
        """``H[n, r] = Π_{k≥2} T_k[n, R[r]]`` ``(n, |R|)`` and, if derivative tables are given,
        ``∂_k H`` for k = 2..d (each ``(n, |R|)``). For d = 2 these are the tables themselves
        (no copy). Transposed views of :meth:`function_major_tail_products`."""
        tails, grads = self.function_major_tail_products(tables, derivative_tables)
        return tails.T, [g.T for g in grads]

    def function_major_tail_products(
        self, tables: list[np.ndarray], derivative_tables: list[np.ndarray] | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`tail_products` function-major: ``H`` ``(|R|, n)`` and the ``∂_k H`` stacked
        ``(d - 1, |R|, n)`` (``(0, |R|, n)`` without derivative tables)."""
        n = tables[0].shape[0]
        if self.dim == 1:
            return np.ones((1, n)), np.empty((0, 1, n))
        if self.dim == 2:
            tails = tables[1].T
            if derivative_tables is None:
                return tails, np.empty((0, *tails.shape))
            return tails, derivative_tables[1].T[None]
        rest, runs, size = _stack_tables(tables[1:]), self._runs, len(self.tails)
        if derivative_tables is None:
            return _tail_products(rest, rest[:0], runs, size, with_gradients=False)
        return _tail_products(rest, _stack_tables(derivative_tables[1:]), runs, size, True)

    @cached_property
    def _runs(self) -> tuple[np.ndarray, np.ndarray]:
        return _tail_runs(self.tails)

    @property
    def row_bytes(self) -> int:
        """Bytes of basis tables per sample in the kernels: the per-coordinate value and
        derivative tables plus the tail products and their d - 1 gradients."""
        tables = sum(m + 1 for m in self.max_orders)
        return 8 * 2 * (tables + self.dim * len(self.tails) + self.max_orders[0] + 1)

    def row_block(self) -> int:
        """Rows per block: tables within :data:`CACHE_BUDGET`, between :data:`MIN_ROWS` and
        :data:`ROW_BLOCK` rows, and never beyond :data:`TABLE_BUDGET`.

        Raises ``ValueError`` (naming the bytes) when even :data:`MIN_ROWS` rows would not fit.
        """
        need = MIN_ROWS * self.row_bytes
        if need > TABLE_BUDGET:
            raise ValueError(
                f"order {self.order!r} needs {need / 2**30:.2f} GiB of basis tables for "
                f"{MIN_ROWS} samples (budget {TABLE_BUDGET / 2**30:.2f} GiB); choose a smaller "
                "order or fewer coordinates"
            )
        return int(min(ROW_BLOCK, max(MIN_ROWS, CACHE_BUDGET // self.row_bytes)))

    def spec(self) -> str:
        return ",".join(c.spec() for c in self.coordinates)
