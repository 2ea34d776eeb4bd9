"""Order and threshold selection: δ_M, R_M, η_M for every order in one sweep (paper §4).

For one set of coefficients (they do not depend on the order), the order-``M`` estimate at a
sample is the running sum of its *shell* contributions ``Σ_{level(m) = L} ĉ_m Ψ_m(X_n)`` over
``L ≤ M``. One pass over the data evaluates every shell at every sample (a compiled loop over
the index set: there is no matrix-product form for per-sample shell sums), accumulates the
running sums and records, per order, mergeable statistics of ``p_M(X_n)``, in standardized
units (the density of the mapped coordinates ``y = (x - loc) / scale``, i.e. ``p_M(x) Π scale_k``,
so that every threshold and histogram below is the same whatever the data's units):

* the smallest positive value (``δ_M``, eq. 52) and the smallest value (most negative);
* histograms of ``|p_M(X_n)|`` for positive and negative values on a fixed grid of quarter
  octaves (bin edges ``2^{t/4}``), so the rejection rate ``R_M(δ) = #{p_M(X_n) < δ} / N``
  (eq. 53) is exact for every threshold on the grid — the threshold can be chosen *after* the
  sweep without another pass.

The automatic threshold (:func:`choose_delta`). Where ``p_M < 0`` the error of the estimate is at
least ``|p_M|`` (``p_eq > 0``): the negative values are samples of the size of the estimate's
error where the density is smallest — exactly where ``B̂ = -∇p_M/p_M`` is fragile. Their
largest magnitude ``ε_M = max(0, -min_n p_M(X_n))`` is a certified lower bound of
``‖p_eq - p_M‖_∞``, but it is one extreme excursion (often a Gibbs overshoot at a steep wall),
and a threshold tied to it discards far too much (see docs/benchmarks.md, section 'Tuning
constants'). The threshold is tied instead to
their median magnitude ``ε^{50}_M``, the typical error size in the low-density region: by
eq. 42 with that error size, ``δ = ε^{50}_M`` keeps the samples whose estimate exceeds the
typical error there. Orders without negative values borrow the largest ``ε^{50}`` within two
orders (:func:`error_scale`); δ never goes below the paper's ``δ_M``. The paper's own choice
``δ = δ_M`` (≈ 1e-7) keeps samples with ``p_M ≈ 1e-7``, where ``B̂`` reaches 1e5 and ruins the
response (the same section).

The automatic order (:func:`choose_order`) uses the certified bound: ``ε̃_M`` (the largest ``ε``
within two orders of M) falls while the truncation (Gibbs)
oscillations shrink and rises once sampling noise in high-order coefficients dominates, so its
minimum balances bias and variance. Among orders after which every ``η`` stays within twice its
final level (the series has converged, eq. 54), we take the smallest order whose ``ε_M`` is
within a factor 2 of the smallest (once η is at its noise floor, ε̃ fluctuates with the noise,
so a tighter tolerance would pick an arbitrary high order); the rejection rate at the resulting
δ is reported. Orders below the smallest one whose held-out L² loss is within one standard
error of the least (:func:`least_adequate_order`) are not considered: at low orders ``p_M`` is
positive everywhere and ``ε̃_M = 0`` certifies nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from kelr_dist.kernels.bases.families import Fourier, TensorBasis, Workspace
from kelr_dist.kernels.compiled import compiled, contracted
from kelr_dist.kernels.reduction import BlockInfo, Reduction
from kelr_dist.kernels.scores.kernel_embedding import KernelDensity, check_samples, row_blocks

#: histogram grid: |p| in [2^{t/4}, 2^{(t+1)/4}) for t = T_MIN..T_MAX (clamped at both ends)
T_MIN = -4 * 90
T_MAX = 4 * 20
N_BINS = T_MAX - T_MIN + 1

#: κ of the automatic threshold δ = κ ε^{50}_M: the typical error size in the low-density region
#: (eq. 42; see docs/benchmarks.md, section 'Tuning constants')
DELTA_FACTOR = 1.0
#: orders on each side whose negative excursion also bounds the error at M
ERROR_WINDOW = 2


def bin_edges() -> np.ndarray:
    """Lower edges ``2^{t/4}`` of the histogram bins, ``(N_BINS,)``."""
    return 2.0 ** (np.arange(T_MIN, T_MAX + 1) / 4.0)


#: mantissa bits of the quarter-octave edges 2^{1/4}, 2^{1/2}, 2^{3/4}
_QUARTERS = tuple(int((2.0 ** (k / 4) - 1.0) * 2**52) for k in (1, 2, 3))
_MANTISSA = (1 << 52) - 1
#: samples per tile of the sweep (keeps the tile's running sums in cache)
SWEEP_TILE = 512


@compiled
def _bin(bits):  # pragma: no cover - compiled
    """Histogram bin of |v| from the IEEE bits of v: t = 4 (exponent) + quarter, clamped."""
    expo = ((bits >> 52) & 0x7FF) - 1023
    mant = bits & _MANTISSA
    t = 4 * expo + (mant >= _QUARTERS[0]) + (mant >= _QUARTERS[1]) + (mant >= _QUARTERS[2])
    return min(max(t, T_MIN), T_MAX) - T_MIN


@contracted
def _block(first, tails, coef_t, block, acc, lo, hi):  # pragma: no cover - compiled
    """The 16 terms of one register block (:func:`_blocks`) on the tile ``lo:hi``: tails
    r_0..r_3 (levels s..s+3) times first-coordinate degrees m_0..m_0+3, on the running sums of
    levels L..L+6 (``block`` = r_0..r_3, m_0, L)."""
    r0, r1, r2, r3, m0, level = block[0], block[1], block[2], block[3], block[4], block[5]
    w = hi - lo
    h0, h1, h2, h3 = tails[r0, lo:hi], tails[r1, lo:hi], tails[r2, lo:hi], tails[r3, lo:hi]
    f0, f1 = first[m0, lo:hi], first[m0 + 1, lo:hi]
    f2, f3 = first[m0 + 2, lo:hi], first[m0 + 3, lo:hi]
    a0, a1, a2, a3 = acc[level, :w], acc[level + 1, :w], acc[level + 2, :w], acc[level + 3, :w]
    a4, a5, a6 = acc[level + 4, :w], acc[level + 5, :w], acc[level + 6, :w]
    c0, c1 = coef_t[r0, m0 : m0 + 4], coef_t[r1, m0 : m0 + 4]
    c2, c3 = coef_t[r2, m0 : m0 + 4], coef_t[r3, m0 : m0 + 4]
    c00, c01, c02, c03 = c0[0], c0[1], c0[2], c0[3]
    c10, c11, c12, c13 = c1[0], c1[1], c1[2], c1[3]
    c20, c21, c22, c23 = c2[0], c2[1], c2[2], c2[3]
    c30, c31, c32, c33 = c3[0], c3[1], c3[2], c3[3]
    for i in range(w):
        x0, x1, x2, x3 = f0[i], f1[i], f2[i], f3[i]
        y0, y1, y2, y3 = h0[i], h1[i], h2[i], h3[i]
        a0[i] += c00 * y0 * x0
        a1[i] += c01 * y0 * x1 + c10 * y1 * x0
        a2[i] += c02 * y0 * x2 + c11 * y1 * x1 + c20 * y2 * x0
        a3[i] += c03 * y0 * x3 + c12 * y1 * x2 + c21 * y2 * x1 + c30 * y3 * x0
        a4[i] += c13 * y1 * x3 + c22 * y2 * x2 + c31 * y3 * x1
        a5[i] += c23 * y2 * x3 + c32 * y3 * x2
        a6[i] += c33 * y3 * x3


@compiled
def _sweep(first, tails, coef_t, blocks, singles, pos, neg, zeros, min_pos, min_val, acc, low):
    """Shell sums of one row block, then per-order statistics of the running sums of the orders
    from ``low`` on.

    first (M1+1, n), tails (R, n): Ψ_1 table and tail products, function-major (each row
    contiguous over samples, so the inner loops run in SIMD); coef_t (R, M1+1). The terms
    come as register blocks (B, 6) and singles (S, 3) = (r, m1, level) (:func:`_blocks`).
    acc (levels, SWEEP_TILE): scratch for the running sums of a tile.
    """  # pragma: no cover - compiled
    n_levels = pos.shape[0]
    n = first.shape[1]
    bits = acc.view(np.int64)
    for lo in range(0, n, SWEEP_TILE):
        width = min(SWEEP_TILE, n - lo)
        acc[:, :width] = 0.0
        for b in range(blocks.shape[0]):
            _block(first, tails, coef_t, blocks[b], acc, lo, lo + width)
        for k in range(singles.shape[0]):
            r, m, level = singles[k, 0], singles[k, 1], singles[k, 2]
            c = coef_t[r, m]
            row = acc[level]
            h = tails[r, lo : lo + width]
            col = first[m, lo : lo + width]
            for i in range(width):
                row[i] += c * h[i] * col[i]
        for level in range(1, n_levels):
            prev = acc[level - 1]
            row = acc[level]
            for i in range(width):
                row[i] += prev[i]
        for level in range(low, n_levels):
            _tally(acc[level], bits[level], width, level, pos, neg, zeros, min_pos, min_val)


@compiled
def _tally(values, bits, width, level, pos, neg, zeros, min_pos, min_val):  # pragma: no cover
    """The statistics of order ``level`` of ``values[:width]`` (``bits``: their int64 view):
    histogram counts by sign, zeros, the least positive value and the least value."""
    for i in range(width):
        v = values[i]
        if v > 0.0:
            pos[level, _bin(bits[i])] += 1
            if v < min_pos[level]:
                min_pos[level] = v
        elif v < 0.0:
            neg[level, _bin(bits[i])] += 1
        else:
            zeros[level] += 1
        if v < min_val[level]:
            min_val[level] = v


@compiled
def _recurrence_sweep(
    x, start, tails, diag, tilt, back, coef, pos, neg, zeros, min_pos, min_val, low
):  # pragma: no cover - compiled
    """:func:`_sweep` for a basis whose functions vary in the first coordinate only: the
    running sums ``p_M = Σ_{m ≤ M} c_m Ψ_m(x) h`` built as the three-term recurrence of
    :func:`kelr_dist.kernels.bases.families._recurrence_series` runs (``Ψ_0 = start``, the tail
    product ``h = tails``, all ``(n,)``), each order's statistics taken from ``low`` on. No tables:
    each row block's running rows stay in the first-level cache."""
    n = x.shape[0]
    cur = np.empty(SWEEP_TILE)
    prev = np.empty(SWEEP_TILE)
    acc = np.empty(SWEEP_TILE)
    bits = acc.view(np.int64)
    for first in range(0, n, SWEEP_TILE):
        width = min(SWEEP_TILE, n - first)
        xs = x[first : first + width]
        h = tails[first : first + width]
        c = coef[0]
        for i in range(width):
            cur[i] = start[first + i]
            prev[i] = cur[i]
            acc[i] = c * h[i] * cur[i]
        if low <= 0:
            _tally(acc, bits, width, 0, pos, neg, zeros, min_pos, min_val)
        for m in range(diag.shape[0]):
            a, t, b, c = diag[m], tilt[m], back[m], coef[m + 1]
            for i in range(width):
                value = (a + t * xs[i]) * cur[i] - b * prev[i]
                prev[i] = cur[i]
                cur[i] = value
                acc[i] += c * h[i] * value
            if m + 1 >= low:
                _tally(acc, bits, width, m + 1, pos, neg, zeros, min_pos, min_val)


def _blocks(basis: TensorBasis, coef_t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The sweep's terms ``(r, m1)`` as 4 x 4 register blocks and singles.

    A block holds four tails of consecutive levels ``s..s+3`` (a total index set) and four
    consecutive first-coordinate degrees ``m_0..m_0+3``: its 16 terms fall on the seven running
    sums of levels ``s+m_0 .. s+m_0+6``, so one pass over a tile's samples loads 8 table rows
    and 7 sums for 16 terms, where term by term it loads 2 rows and a sum per term (see
    docs/benchmarks.md, section 'Tuning constants'). Terms in no block, and all terms
    of a box index set (level ``max(m1, floor)``), are singles; singles with a zero coefficient
    are left out. Returns blocks ``(B, 6)`` = r_0..r_3, m_0, level and singles ``(S, 3)`` =
    r, m1, level, both int64.
    """
    shift, floor, stop = _layout(basis)
    used = np.zeros(coef_t.shape, dtype=bool)
    blocks = []
    if basis.index_set == "total":
        by_level = [np.flatnonzero(shift == s) for s in range(int(shift.max()) + 1)]
        for s in range(0, len(by_level) - 3, 4):
            # the tails of levels s..s+3 paired by rank
            for chain in zip(*by_level[s : s + 4], strict=False):
                for m0 in range(0, int(stop[chain[3]]) - 2, 4):  # m0 + 3 <= every stop
                    blocks.append((*chain, m0, m0 + s))
                    used[list(chain), m0 : m0 + 4] = True
    in_set = np.arange(coef_t.shape[1]) <= stop[:, None]
    r, m = np.nonzero(in_set & ~used & (coef_t != 0.0))
    singles = np.column_stack([r, m, np.maximum(m + shift[r], floor[r])]).astype(np.int64)
    return np.asarray(blocks, dtype=np.int64).reshape(-1, 6), singles


def _layout(basis: TensorBasis) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per tail r: level shift, level floor and last first-coordinate degree."""
    tails = basis.tails
    if basis.index_set == "total":
        shift = tails.sum(axis=1)
        floor = np.zeros(len(tails), dtype=np.int64)
    else:
        shift = np.zeros(len(tails), dtype=np.int64)
        floor = tails.max(axis=1, initial=0)
    stop = basis.first_stops
    return shift.astype(np.int64), floor.astype(np.int64), stop


def sweep_sums(density: KernelDensity, x: np.ndarray, lowest: int = 0) -> dict[str, Any]:
    """Partial statistics of ``p_M(X_n)`` for every order ``M = lowest..max_level`` over
    ``x (n, d)`` (the orders below ``lowest`` keep empty statistics: a given order needs only
    its own and its neighbours', and the statistics, not the running sums, are the sweep's cost).

    Returns counts ``pos``/``neg`` ``(levels, N_BINS)``, ``zeros`` ``(levels,)``, ``n``, and the
    minima ``min_pos`` and ``min_val`` ``(levels,)`` (combine with :func:`combine_sweeps`).
    """
    basis = density.basis
    x = check_samples(basis, x)
    levels = basis.max_level + 1
    out: dict[str, Any] = {
        "pos": np.zeros((levels, N_BINS), dtype=np.int64),
        "neg": np.zeros((levels, N_BINS), dtype=np.int64),
        "zeros": np.zeros(levels, dtype=np.int64),
        "min_pos": np.full(levels, np.inf),
        "min_val": np.full(levels, np.inf),
        "n": np.int64(x.shape[0]),
    }
    # tables in the mapped coordinates: p_M in standardized units (no Jacobian), so every
    # threshold and histogram is independent of the data's units
    coef_t = np.ascontiguousarray(density.matrix().T)
    head = basis.coordinates[0]
    if basis.first_only and not isinstance(head.family, Fourier):
        # the first coordinate's recurrence, no tables, for the samples where it holds; the
        # rest go by the tables below
        y = head.mapped(x[:, 0])
        inside = head.family.fast(y, head.family.beta)
        y = y[inside]
        tails = np.ones(y.shape[0])
        for k, c in enumerate(basis.coordinates[1:], start=1):
            tails *= c.family.weighted_polynomials(c.mapped(x[inside, k]), 0, c.family.beta)[:, 0]
        start, _ = head.family.weight(y, head.family.beta)
        _recurrence_sweep(
            y, start, tails, *head.family.recurrence(basis.max_orders[0]), coef_t[0],
            out["pos"], out["neg"], out["zeros"], out["min_pos"], out["min_val"], lowest,
        )  # fmt: skip
        x = x[~inside]
    blocks, singles = _blocks(basis, coef_t)
    # every row block's tables (and the tile's running sums) in the same memory (Workspace)
    spaces = [Workspace() for _ in basis.coordinates]
    acc = np.empty((levels, SWEEP_TILE))
    for rows in row_blocks(x.shape[0], basis.row_block()):
        values = [
            c.family.weighted_polynomials(c.mapped(x[rows, k]), m, c.family.beta, space)
            for k, (c, m, space) in enumerate(
                zip(basis.coordinates, basis.max_orders, spaces, strict=True)
            )
        ]
        tails, _ = basis.tail_products(values)
        _sweep(
            np.ascontiguousarray(values[0].T),
            np.ascontiguousarray(tails.T),
            coef_t,
            blocks,
            singles,
            out["pos"],
            out["neg"],
            out["zeros"],
            out["min_pos"],
            out["min_val"],
            acc,
            lowest,
        )
    return out


def combine_sweeps(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Merge two :func:`sweep_sums` partials: counts add, minima take the minimum."""
    return {k: np.minimum(a[k], b[k]) if k.startswith("min") else a[k] + b[k] for k in a}


@dataclass(frozen=True)
class Criteria:
    """δ_M, R_M and η_M for orders ``0..max_level`` (eqs. 52–54).

    Attributes
    ----------
    orders : ``(L,)`` the orders scanned.
    delta_paper : ``δ_M`` of eq. 52, the smallest positive ``p_M(X_n)``.
    negative_excursion : ``ε_M = max(0, -min_n p_M(X_n))``, a lower bound of the sup error.
    eta : ``η_M`` (eq. 54); ``nan`` at the last order (needs order M+1).
    eta_noise : the independent-sample noise level of ``η_M``.
    n : number of samples; ``pos``/``neg``/``zeros``: the histograms of ``p_M(X_n)``.
    held_out_loss, held_out_loss_stderr : the held-out L² loss of each order and its standard
        error over folds
        (:meth:`~kelr_dist.kernels.scores.kernel_embedding.KernelDensity.held_out_l2`); ``None``
        when the estimate was not fitted by fold.
    lowest : the lowest order swept (:func:`sweep_sums`); the statistics of the orders below it
        are NaN.
    """

    orders: np.ndarray
    delta_paper: np.ndarray
    negative_excursion: np.ndarray
    eta: np.ndarray
    eta_noise: np.ndarray
    n: int
    pos: np.ndarray
    neg: np.ndarray
    zeros: np.ndarray
    held_out_loss: np.ndarray | None = None
    held_out_loss_stderr: np.ndarray | None = None
    lowest: int = 0

    @classmethod
    def from_sums(
        cls, density: KernelDensity, sums: dict[str, np.ndarray], lowest: int = 0
    ) -> Criteria:
        levels = density.basis.max_level + 1
        eta = np.full(levels, np.nan)
        noise = np.full(levels, np.nan)
        eta[:-1] = density.eta()
        noise[:-1] = density.eta_noise()
        loss, loss_se = density.held_out_l2() if density.fold_sums is not None else (None, None)
        return cls(
            orders=np.arange(levels),
            delta_paper=np.where(np.isfinite(sums["min_pos"]), sums["min_pos"], np.nan),
            negative_excursion=np.where(
                np.arange(levels) >= lowest, np.maximum(-sums["min_val"], 0.0), np.nan
            ),
            eta=eta,
            eta_noise=noise,
            n=int(sums["n"]),
            pos=sums["pos"],
            neg=sums["neg"],
            zeros=sums["zeros"],
            held_out_loss=loss,
            held_out_loss_stderr=loss_se,
            lowest=lowest,
        )

    def rejection(self, delta: float | np.ndarray) -> np.ndarray:
        """``R_M(δ) = #{p_M(X_n) < δ} / N`` per order (eq. 53); δ is a scalar or per order ``(L,)``.

        Exact when δ is a bin edge (as :func:`choose_delta` returns) or a value no sample
        reaches between edges; otherwise counts the whole bin holding δ as rejected.
        """
        delta = np.broadcast_to(np.asarray(delta, dtype=np.float64), self.orders.shape)
        below = self.neg.sum(axis=1) + self.zeros
        edges = bin_edges()
        # bins whose lower edge is below δ hold values < δ (exact if δ is an upper edge)
        cut = np.searchsorted(edges, delta, side="left")
        cum = np.concatenate(
            [np.zeros((len(self.orders), 1), dtype=np.int64), np.cumsum(self.pos, axis=1)], axis=1
        )
        return self.swept((below + cum[np.arange(len(self.orders)), cut]) / self.n)

    def rejection_paper(self) -> np.ndarray:
        """``R_M`` at the paper's threshold ``δ_M``: the fraction with ``p_M(X_n) ≤ 0``."""
        return self.swept((self.neg.sum(axis=1) + self.zeros) / self.n)

    def swept(self, values: np.ndarray) -> np.ndarray:
        """``values`` per order, NaN below :attr:`lowest`."""
        return np.where(self.orders >= self.lowest, values, np.nan)


def round_up_to_edge(delta: np.ndarray) -> np.ndarray:
    """The smallest histogram bin edge ``≥ δ`` (so ``R_M(δ)`` is exact)."""
    edges = bin_edges()
    idx = np.clip(np.searchsorted(edges, delta, side="left"), 0, len(edges) - 1)
    return edges[idx]


def windowed_max(values: np.ndarray, window: int = ERROR_WINDOW) -> np.ndarray:
    """``max_{|M' - M| ≤ window} values[M']`` for every ``M``; a NaN (a criterion that is not
    finite) counts as infinite: no certified error there."""
    values = np.asarray(values, dtype=float)
    values = np.where(np.isnan(values), np.inf, values)
    padded = np.pad(values, window, mode="edge")
    return np.lib.stride_tricks.sliding_window_view(padded, 2 * window + 1).max(axis=1)


def error_scale(criteria: Criteria, window: int = ERROR_WINDOW) -> np.ndarray:
    """``ε̃_M = max_{|M' - M| ≤ window} ε_{M'}``: the certified error bound the order rule uses.

    ``ε_M`` bounds the sup error from below only where ``p_M`` dips below zero; an order whose
    estimate happens to stay positive on every sample has ``ε_M = 0`` although its error is of
    the size of its neighbours'. The error changes slowly with M, so the neighbours' bound
    stands in.
    """
    return windowed_max(criteria.negative_excursion, window)


def typical_error(criteria: Criteria, window: int = ERROR_WINDOW) -> np.ndarray:
    """``ε^{50}_M``: the median of ``|p_M(X_n)|`` over the samples where ``p_M < 0`` (the upper
    edge of the histogram bin holding it); orders without negative values take the largest
    value within ``window`` orders."""
    counts = criteria.neg
    total = counts.sum(axis=1)
    above = np.cumsum(counts, axis=1)  # samples with |p| below each bin's upper edge
    median_bin = np.argmax(above >= 0.5 * total[:, None], axis=1)
    upper = 2.0 ** ((np.arange(T_MIN, T_MAX + 1) + 1) / 4.0)
    median = np.where(total > 0, upper[median_bin], 0.0)
    return criteria.swept(np.where(total > 0, median, windowed_max(median, window)))


def choose_delta(criteria: Criteria, factor: float = DELTA_FACTOR) -> np.ndarray:
    """Automatic threshold per order: ``δ = κ ε^{50}_M`` rounded up to a bin edge, at least
    ``δ_M`` (see the module docstring and :func:`typical_error`)."""
    raw = np.fmax(factor * typical_error(criteria), criteria.delta_paper)
    raw = np.where(np.isfinite(raw) & (raw > 0), raw, bin_edges()[0])
    return criteria.swept(round_up_to_edge(raw))


def least_adequate_order(criteria: Criteria) -> int:
    """The smallest order whose held-out L² loss is within one standard error of the least
    (the one-standard-error rule); 0 when the estimate was not fitted by fold.

    A floor for :func:`choose_order`: ``ε̃_M`` certifies nothing at low orders, whose estimates
    (the Gaussian weight and its first shells) are positive everywhere — ``ε̃ = 0`` there means
    no evidence, not no error. The held-out loss sees what they miss. The rule is that of
    Hastie, Tibshirani & Friedman, *The Elements of Statistical Learning* (2nd ed., 2009),
    §7.10; its effect on the orders is in docs/benchmarks.md, section 'Tuning constants'.
    """
    loss, spread = criteria.held_out_loss, criteria.held_out_loss_stderr
    if loss is None or spread is None:
        return 0
    return one_standard_error_floor(loss, spread)


def one_standard_error_floor(loss: np.ndarray, stderr: np.ndarray) -> int:
    """Index of the first ``loss`` within one standard error (``stderr`` at the least) of the
    least ``loss``."""
    best = int(np.nanargmin(loss))
    return int(np.argmax(loss <= loss[best] + stderr[best]))


def convergence(eta: np.ndarray) -> tuple[np.ndarray, float]:
    """``(max_{M' ≥ M} η_{M'}`` for every M, the convergence line): twice the level the scan
    of ``eta`` ends at (its last order with ``η`` defined; eq. 54). Orders whose later maximum is
    at most the line count as converged.

    The last entry is the scan's end, whose ``η`` needs order ``M + 1``: when NaN it is left out
    (no later shell). Any other NaN (a criterion that is not finite) counts as infinite, so the
    orders up to it are *not* converged, and a NaN at the end leaves no order converged."""
    eta = np.asarray(eta, dtype=float)
    known = eta.copy()
    if np.isnan(known[-1]):
        known[-1] = -np.inf
    known[np.isnan(known)] = np.inf
    later_max = np.maximum.accumulate(known[::-1])[::-1]
    tail = eta[-2:] if eta.size > 1 else eta
    if np.isnan(eta[-1]) and eta.size > 1:
        tail = tail[:1]
    return np.maximum(later_max, 0.0), 2.0 * float(np.max(tail))


def choose_order(
    criteria: Criteria, min_order: int = 0, max_order: int | None = None, tolerance: float = 1.0
) -> int:
    """Automatic order: smallest converged order within ``1 + tolerance`` of the least ``ε̃_M``,
    at least :func:`least_adequate_order` (when held-out losses are known) and ``min_order``.

    Converged (eq. 54): every later ``η_{M'}`` (M' ≥ M) is at most twice the level the scan ends
    at — shells beyond M carry no more than sampling noise. Taking the maximum over later orders
    makes the rule immune to shells that vanish by symmetry (odd shells of symmetric densities).
    A NaN ``η`` is not converged (:func:`convergence`); ``ValueError`` when no order is.
    """
    top = int(criteria.orders[-1]) if max_order is None else int(max_order)
    if not 0 <= min_order <= top <= criteria.orders[-1]:
        raise ValueError(
            f"order range {min_order}..{top} is outside the scanned 0..{criteria.orders[-1]}"
        )
    min_order = min(max(min_order, least_adequate_order(criteria)), top)
    later_max, line = convergence(criteria.eta[: top + 1])
    converged = later_max[min_order:] <= line
    if not converged.any():
        raise ValueError(
            f"no order in {min_order}..{top} has converged: the shell norms eta are "
            f"{criteria.eta[min_order : top + 1]} (NaN: not finite); give order= explicitly"
        )
    eps = error_scale(criteria)[min_order : top + 1]
    candidates = criteria.orders[min_order : top + 1][converged]
    eps_c = eps[converged]
    return int(candidates[np.argmax(eps_c <= (1.0 + tolerance) * eps_c.min())])


#: coefficients up to this level decide which coordinates carry structure
INDEX_SET_LEVEL = 10
#: a coordinate whose coefficients hold less than this share of that energy is inactive
INACTIVE_ENERGY = 0.05


def active_coordinates(density: KernelDensity) -> np.ndarray:
    """Which coordinates carry structure beyond their weight, ``(d,)`` bool.

    Coordinate ``k`` is *inactive* when the coefficients that involve it (``m_k > 0``) hold less
    than :data:`INACTIVE_ENERGY` of ``Σ ĉ_m²`` over ``0 < |m|_1 ≤`` :data:`INDEX_SET_LEVEL`
    (the low orders, where a smooth density's structure lives and sampling noise is small):
    the density is then, to that accuracy, its weight in ``y_k`` times a density of the other
    coordinates — the situation of the paper's Langevin example (§5.2), where ``M_2 = 0``.
    """
    idx = density.basis.indices
    low = (idx.sum(axis=1) > 0) & (idx.sum(axis=1) <= INDEX_SET_LEVEL)
    energy = density.coefficients**2
    total = energy[low].sum()
    if total == 0.0:
        return np.zeros(density.basis.dim, dtype=bool)
    shares = np.array([energy[low & (idx[:, k] > 0)].sum() for k in range(idx.shape[1])]) / total
    return shares >= INACTIVE_ENERGY


def _sweep_chunk(
    density: KernelDensity,
    lowest: int,
    x: np.ndarray,
    _info: BlockInfo,
    _halo: np.ndarray | None,
) -> dict[str, np.ndarray]:
    return sweep_sums(density, x, lowest)


def criteria_reduction(density: KernelDensity, lowest: int = 0) -> Reduction:
    """The order-selection pass: chunk = :func:`sweep_sums` (orders from ``lowest`` on),
    combine = :func:`combine_sweeps`, finalize = :meth:`Criteria.from_sums`."""
    return Reduction(
        name="criteria",
        chunk=partial(_sweep_chunk, density, lowest),
        combine=combine_sweeps,
        finalize=partial(Criteria.from_sums, density, lowest=lowest),
    )
