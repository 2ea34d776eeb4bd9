"""Per-coordinate statistics passes: moments and tail statistics, and the Gamma MLE.

They feed step 1 of the algorithm in §4 of the paper (the basis per coordinate,
:mod:`kelr_dist.kernels.bases.coordinates`): Hermite β from the sample excess kurtosis (Remark
1), Laguerre θ from the Gamma maximum-likelihood fit of each coordinate (§3.2).

Two light passes, each a :class:`kelr_dist.kernels.reduction.Reduction`:

1. :func:`moments_reduction` — per coordinate: count, mean, central sums M2, M3, M4 (merged
   with the exact pairwise update of Chan, Golub & LeVeque (1979) / Pébay (2008), stable for
   data with a large offset; within a block a corrected two-pass algorithm; the sums are kept
   in units of a power of two per partial, so that no unit of the data, 1e-300 or 1e300,
   overflows or underflows them), minimum,
   maximum, and the count and first position of non-finite values (rejected with a
   :class:`ValueError` by the finalize step). Empty blocks are the identity of the combine;
   a trajectory without samples is an error. Result: :class:`Moments`.
2. :func:`wrap_reduction` — in the same read as pass 1: per coordinate, the steps between
   consecutive samples of a chain (within blocks, and across them from the blocks' end rows),
   measured on the circle of each usual period (:data:`PERIODS`, 2π and 360): how many steps
   jump by more than half the period, and the mean squares of the circular step
   ``min(|Δ|, P - |Δ|)`` over all steps and over the jumps. Wrapped angles jump by nearly a
   whole period at the wrap while their ordinary steps are small
   (:func:`kelr_dist.kernels.bases.coordinates.periodicity`). Result: :class:`WrapStatistics`.
3. :func:`edge_reduction` — in the same read: the :data:`EDGE_SAMPLES` smallest and largest
   values of each coordinate (merged by keeping the extremes of both partials), whose spacing
   tells a density that vanishes at the data's edge from one that does not (a wall, clipped
   data): :class:`EdgeStatistics`.
4. :func:`gamma_reduction` — only for Laguerre coordinates whose θ is to be estimated: sums of
   ``y`` and ``log y`` for ``y = (x - loc) / scale`` (shift from pass 1), finalized into the
   Gamma MLE (:class:`GammaFit`). :func:`~kelr_dist.kernels.bases.coordinates.gamma_reduction_for`
   builds it from pass 1 and a spec (or returns ``None`` when no coordinate needs it).

Moments are the population (biased) ones, as ``numpy.var``, ``scipy.stats.skew`` and
``scipy.stats.kurtosis`` with their defaults.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.special import digamma, polygamma

from kelr_dist.kernels.compiled import compiled
from kelr_dist.kernels.reduction import BlockInfo, Reduction, add_partials

SUB_BLOCK = 1 << 16
"""Rows per sub-block inside the chunk kernels: bounds the temporaries, and each sub-block's
moments are summed alone and merged (the merges bound the rounding of long sums)."""

_NO_INDEX = np.iinfo(np.int64).max
UNIT_LIMIT = 1e140
"""Accepted units: every ``|x| <= UNIT_LIMIT`` and every standard deviation ``>= 1 / UNIT_LIMIT``.
The moments hold in any units, but the estimate squares observables (``|x|``) and scores
(``~1/std``) for its error bars, summed over up to a chunk's rows; this keeps them in float64."""

_NO_UNIT = -(1 << 16)
"""The unit exponent of sums that are all zero (an empty partial, a constant block): below any
float64 exponent, so that it never decides the unit of a merge."""


class CoordinateError(ValueError):
    """Data a statistic cannot use in one coordinate (column) of a trajectory.

    ``coordinate`` is its index and ``problem`` says what is wrong; the pipeline re-raises it
    with the component's name and the store (:func:`kelr_dist.pipeline.steps.survey_data`).
    """

    def __init__(self, coordinate: int, problem: str) -> None:
        super().__init__(coordinate, problem)  # picklable: rebuilt from its args
        self.coordinate = int(coordinate)
        self.problem = problem

    def __str__(self) -> str:
        return f"coordinate {self.coordinate}: {self.problem}"


# --------------------------------------------------------------------------- pass 1: moments


@dataclass(frozen=True, eq=False)
class Moments:
    """Per-coordinate sample statistics, arrays of shape ``(d,)`` (population moments).

    Attributes
    ----------
    n : number of samples per coordinate.
    mean, variance, std : ``variance = M2 / n`` (``numpy.var`` with ``ddof=0``).
    skewness : ``sqrt(n) M3 / M2^{3/2}`` (``scipy.stats.skew``); NaN for a constant coordinate.
    excess_kurtosis : ``n M4 / M2² - 3`` (``scipy.stats.kurtosis``); NaN for a constant one.
    minimum, maximum : extreme values.
    """

    n: np.ndarray
    mean: np.ndarray
    variance: np.ndarray
    std: np.ndarray
    skewness: np.ndarray
    excess_kurtosis: np.ndarray
    minimum: np.ndarray
    maximum: np.ndarray

    @property
    def d(self) -> int:
        return int(self.mean.shape[0])


def _empty_moments(d: int) -> dict[str, np.ndarray]:
    """The identity of :func:`combine_moments` for ``d`` coordinates."""
    no_index = np.full(d, _NO_INDEX, dtype=np.int64)
    return {
        **{name: np.zeros(d) for name in ("mean", "m2", "m3", "m4")},
        "n": np.zeros(d, dtype=np.int64),
        "unit": np.full(d, _NO_UNIT, dtype=np.int64),
        "nonfinite": np.zeros(d, dtype=np.int64),
        "min": np.full(d, np.inf),
        "max": np.full(d, -np.inf),
        "bad_chain": no_index,
        "bad_time": no_index,
    }


def _times_power_of_two(x: np.ndarray, exponent: np.ndarray) -> np.ndarray:
    """``x 2^exponent``, exact (``np.ldexp``; its exponents as int32, which every platform's
    ``ldexp`` takes)."""
    return np.ldexp(x, np.asarray(exponent).astype(np.int32))


def _exponent(x: np.ndarray) -> np.ndarray:
    """The binary exponent ``e`` with ``|x| < 2^e`` (``np.frexp``); :data:`_NO_UNIT` for 0."""
    return np.where(x == 0, _NO_UNIT, np.frexp(x)[1]).astype(np.int64)


def _block_moments(x: np.ndarray, chain: int, start: int) -> dict[str, np.ndarray]:
    """Partial of one sub-block ``x (L, d)`` whose first row is row ``start`` of ``chain``.

    Corrected two-pass algorithm per coordinate (one compiled kernel, :func:`_column_sums`):
    the mean of the first pass is refined by the mean of the deviations, so an offset
    (x = 1e6 + noise) costs no more than the rounding of the mean itself. The central sums are
    those of the deviations in units of ``2^unit``, the power of two just above the largest one
    (exact scaling: ``M_k = m_k 2^(k unit)``).
    """
    d = x.shape[1]
    sums = np.zeros((7, d))  # mean, m2, m3, m4, min, max, largest deviation
    counts = np.zeros((3, d), dtype=np.int64)  # finite, non-finite, first non-finite row
    for k in range(d):
        _column_sums(x[:, k], sums[:, k], counts[:, k])
    n, nonfinite, first_bad = counts
    unit = _exponent(sums[6])
    bad = nonfinite > 0
    return {
        "n": n,
        "unit": unit,
        "mean": sums[0],
        "m2": sums[1],
        "m3": sums[2],
        "m4": sums[3],
        "min": sums[4],
        "max": sums[5],
        "nonfinite": nonfinite,
        "bad_chain": np.where(bad, chain, _NO_INDEX).astype(np.int64),
        "bad_time": np.where(bad, start + first_bad, _NO_INDEX).astype(np.int64),
    }


#: the deviations of a sub-block are scaled to their unit by one multiplication while the unit's
#: power of two is a normal float64 (an exact scaling then, as ``ldexp``), by ``ldexp`` beyond
_SCALE_EXPONENT = 1000


@compiled
def _column_sums(column, sums, counts):  # pragma: no cover - compiled
    """Moments of one coordinate's values ``column (L,)``, ignoring non-finite ones: ``sums``
    gets the mean, the sums of the 2nd, 3rd and 4th powers of the deviations from it in units
    of ``2^u`` (``u`` the exponent of the largest deviation, in ``sums[6]``), the minimum and
    the maximum; ``counts`` the finite values, the non-finite ones and the first one's row.
    Every sum is compensated (:func:`_compensated_add`), in four lanes: its rounding hardly
    grows with ``L``, so where a chunk or a sub-block starts moves it by a few ulps at most."""
    n, count, low, high, first = column.shape[0], 0, np.inf, -np.inf, -1
    lanes = np.zeros((5, 2, 4))  # per sum (x, deviation, its 2nd, 3rd, 4th power): value, carry
    for i in range(n):
        v = column[i]
        if np.isfinite(v):
            count += 1
            _compensated_add(lanes[0], i & 3, v)
            low = min(low, v)
            high = max(high, v)
        elif first < 0:
            first = i
    mean = _lane_total(lanes[0]) / max(count, 1)
    for i in range(n):
        v = column[i]
        if np.isfinite(v):
            _compensated_add(lanes[1], i & 3, v - mean)
    correction = _lane_total(lanes[1]) / max(count, 1)
    largest = 0.0
    for i in range(n):
        v = column[i]
        if np.isfinite(v):
            largest = max(largest, abs((v - mean) - correction))
    unit = math.frexp(largest)[1] if largest > 0 else 0
    exact = abs(unit) < _SCALE_EXPONENT
    scale = math.ldexp(1.0, -unit) if exact else 1.0
    for i in range(n):
        v = column[i]
        if np.isfinite(v):
            dev = (v - mean) - correction
            dev = dev * scale if exact else math.ldexp(dev, -unit)
            dev2 = dev * dev
            _compensated_add(lanes[2], i & 3, dev2)
            _compensated_add(lanes[3], i & 3, dev2 * dev)
            _compensated_add(lanes[4], i & 3, dev2 * dev2)
    sums[0] = mean + correction
    sums[1], sums[2], sums[3] = _lane_total(lanes[2]), _lane_total(lanes[3]), _lane_total(lanes[4])
    sums[4], sums[5], sums[6] = low, high, largest
    counts[0], counts[1], counts[2] = count, n - count, max(first, 0)


@compiled
def _compensated_add(lanes, lane, value):  # pragma: no cover - compiled
    """Add ``value`` to lane ``lane`` of ``lanes (2, k)`` (sums, carries) by Kahan's
    compensated summation: the carry keeps what the sum's rounding lost."""
    y = value - lanes[1, lane]
    t = lanes[0, lane] + y
    lanes[1, lane] = (t - lanes[0, lane]) - y
    lanes[0, lane] = t


@compiled
def _lane_total(lanes):  # pragma: no cover - compiled
    """The total of the compensated lanes of :func:`_compensated_add`."""
    return (lanes[0] - lanes[1]).sum()


def combine_moments(a: dict, b: dict) -> dict:
    """Merge two moment partials (Pébay 2008, eqs. 2.1-2.3; exact, order-independent).

    With ``n = n_a + n_b`` and ``δ = mean_b - mean_a``::

        mean = mean_a + δ n_b / n
        M2 = M2_a + M2_b + δ² n_a n_b / n
        M3 = M3_a + M3_b + δ³ n_a n_b (n_a - n_b) / n² + 3δ (n_a M2_b - n_b M2_a) / n
        M4 = M4_a + M4_b + δ⁴ n_a n_b (n_a² - n_a n_b + n_b²) / n³
             + 6δ² (n_a² M2_b + n_b² M2_a) / n² + 4δ (n_a M3_b - n_b M3_a) / n

    evaluated in units of ``2^unit``, the larger of the two partials' units and of ``|δ|``'s
    (both partials are rescaled to it by exact powers of two). An empty partial (``n = 0``,
    zero sums) is the identity (exactly).
    """
    with np.errstate(over="ignore", invalid="ignore"):  # too large values: see _finalize_moments
        return _combined(a, b)


def _combined(a: dict, b: dict) -> dict:
    """:func:`combine_moments` (overflow checked by the caller)."""
    na = a["n"].astype(np.float64)
    nb = b["n"].astype(np.float64)
    n = np.maximum(na + nb, 1.0)
    delta = np.where((na > 0) & (nb > 0), b["mean"] - a["mean"], 0.0)
    unit = np.maximum(np.maximum(a["unit"], b["unit"]), _exponent(delta))
    shift_a, shift_b = a["unit"] - unit, b["unit"] - unit
    m2a, m3a, m4a = (_times_power_of_two(a[f"m{k}"], k * shift_a) for k in (2, 3, 4))
    m2b, m3b, m4b = (_times_power_of_two(b[f"m{k}"], k * shift_b) for k in (2, 3, 4))
    delta = _times_power_of_two(delta, -unit)
    d_n = delta / n
    m2 = m2a + m2b + delta * d_n * na * nb
    m3 = m3a + m3b + d_n**2 * delta * na * nb * (na - nb) + 3.0 * d_n * (na * m2b - nb * m2a)
    m4 = (
        m4a
        + m4b
        + d_n**3 * delta * na * nb * (na * na - na * nb + nb * nb)
        + 6.0 * d_n**2 * (na * na * m2b + nb * nb * m2a)
        + 4.0 * d_n * (na * m3b - nb * m3a)
    )
    a_first = (a["bad_chain"] < b["bad_chain"]) | (
        (a["bad_chain"] == b["bad_chain"]) & (a["bad_time"] <= b["bad_time"])
    )
    return {
        "n": a["n"] + b["n"],
        "unit": unit,
        "mean": np.where(na == 0, b["mean"], a["mean"] + (b["mean"] - a["mean"]) * (nb / n)),
        "m2": m2,
        "m3": m3,
        "m4": m4,
        "min": np.minimum(a["min"], b["min"]),
        "max": np.maximum(a["max"], b["max"]),
        "nonfinite": a["nonfinite"] + b["nonfinite"],
        "bad_chain": np.where(a_first, a["bad_chain"], b["bad_chain"]),
        "bad_time": np.where(a_first, a["bad_time"], b["bad_time"]),
    }


def _moments_chunk(x: np.ndarray, info: BlockInfo, _halo: np.ndarray | None) -> dict:
    """Moment partial of one block ``x (L, d)``, in sub-blocks of :data:`SUB_BLOCK` rows."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError(f"a trajectory block must have shape (L, d), got shape {x.shape}")
    partial = _empty_moments(x.shape[1])
    for lo in range(0, x.shape[0], SUB_BLOCK):
        part = _block_moments(x[lo : lo + SUB_BLOCK], info.chain, info.start + lo)
        partial = combine_moments(partial, part)
    return partial


def _finalize_moments(p: dict) -> Moments:
    """:class:`Moments` of the merged partial; :class:`CoordinateError` for non-finite samples,
    or for units outside :data:`UNIT_LIMIT` (values too large, or a spread too small)."""
    bad = np.flatnonzero(p["nonfinite"])
    if bad.size:  # named by the component of the earliest one, over all components
        k = bad[np.lexsort((p["bad_time"][bad], p["bad_chain"][bad]))[0]]
        where = f"in {bad.size} components" if bad.size > 1 else "all in this component"
        raise CoordinateError(
            int(k),
            f"the earliest non-finite sample (NaN or inf) is at chain {p['bad_chain'][k]}, "
            f"time index {p['bad_time'][k]}; {int(p['nonfinite'].sum())} in all, {where} "
            "(`kelr info --scan` lists them)",
        )
    if not np.all(p["n"] > 0):
        raise ValueError("the trajectory has no samples")
    largest = np.maximum(np.abs(p["min"]), np.abs(p["max"]))
    finite = np.isfinite(np.stack([p["mean"], p["m2"], p["m3"], p["m4"]])).all(axis=0)
    for k in np.flatnonzero(~finite | (largest > UNIT_LIMIT)):
        raise CoordinateError(
            int(k),
            f"values too large (max |x| = {largest[k]:.3g}; the estimate's products overflow "
            f"float64 beyond {UNIT_LIMIT:.0e}): rescale the data (e.g. to unit scale)",
        )
    n = p["n"].astype(np.float64)
    std = _times_power_of_two(np.sqrt(p["m2"] / n), p["unit"])
    for k in np.flatnonzero((std < 1.0 / UNIT_LIMIT) & (p["m2"] > 0)):
        raise CoordinateError(
            int(k),
            f"values too small (standard deviation {std[k]:.3g}; the estimate's scores "
            f"overflow float64 below {1.0 / UNIT_LIMIT:.0e}): rescale the data "
            "(e.g. to unit scale)",
        )
    constant = p["m2"] == 0
    with np.errstate(divide="ignore", invalid="ignore"):  # (a constant coordinate)
        skewness = np.sqrt(n) * p["m3"] / p["m2"] / np.sqrt(p["m2"])
        kurtosis = n * p["m4"] / p["m2"] / p["m2"] - 3.0
    return Moments(
        n=p["n"].copy(),
        mean=p["mean"].copy(),
        variance=std * std,
        std=std,
        skewness=np.where(constant, np.nan, skewness),
        excess_kurtosis=np.where(constant, np.nan, kurtosis),
        minimum=p["min"].copy(),
        maximum=p["max"].copy(),
    )


def moments_reduction() -> Reduction:
    """Pass 0: per-coordinate count, mean, central moments, extremes (finalize: :class:`Moments`).

    The finalize step raises :class:`CoordinateError` naming the coordinate, the number of
    non-finite samples and the (chain, time) of the first one, or the largest |x| (the standard
    deviation) when the units are beyond :data:`UNIT_LIMIT` (no overflow warning); empty blocks
    are allowed (they are the identity of the combine), a trajectory with no samples at all is
    an error.
    """
    return Reduction("moments", _moments_chunk, combine_moments, _finalize_moments)


# ------------------------------------------------------------------ wrapped coordinates

#: the usual periods of stored angles: radians and degrees
PERIODS = (2.0 * np.pi, 360.0)


@dataclass(frozen=True, eq=False)
class WrapStatistics:
    """Steps between consecutive samples on the circle of each period of :data:`PERIODS`.

    Attributes
    ----------
    periods : ``(c,)`` the candidate periods.
    steps : ``(d,)`` steps counted (within chains).
    jumps : ``(d, c)`` steps with ``|Δ| > P / 2``.
    step_rms : ``(d, c)`` RMS circular step ``min(|Δ|, P - |Δ|)`` over all steps.
    jump_rms : ``(d, c)`` RMS circular step over the jumps (NaN without jumps).
    """

    periods: np.ndarray
    steps: np.ndarray
    jumps: np.ndarray
    step_rms: np.ndarray
    jump_rms: np.ndarray


def _wrap_chunk(x: np.ndarray, info: BlockInfo, _halo: np.ndarray | None) -> dict:
    """Step sums within one block ``x (L, d)``, by sub-blocks, with the block's first and last
    rows keyed by their chain and position: the step across two neighbouring blocks is added
    once both are known (:func:`_finalize_wraps`), so the read needs no halo."""
    x = np.asarray(x, dtype=np.float64)
    periods = np.asarray(PERIODS)
    d, c = x.shape[1], periods.shape[0]
    out = {
        "steps": np.zeros(d, dtype=np.int64),
        "jumps": np.zeros((d, c), dtype=np.int64),
        "circular": np.zeros((d, c)),
        "jump_circular": np.zeros((d, c)),
        "firsts": {(info.chain, info.start): x[0].copy()} if x.shape[0] else {},
        "lasts": {(info.chain, info.stop): x[-1].copy()} if x.shape[0] else {},
    }
    with np.errstate(over="ignore", invalid="ignore"):  # too large values: _finalize_moments
        _add_steps(out, x, periods)
    return out


#: the sums of a wraps partial (besides its blocks' end rows)
_STEP_SUMS = ("steps", "jumps", "circular", "jump_circular")


def _combine_wraps(a: dict, b: dict) -> dict:
    """Step sums added; the blocks' first and last rows gathered (neighbours may be combined
    in any order, so their step waits for :func:`_finalize_wraps`)."""
    out = {key: a[key] + b[key] for key in _STEP_SUMS}
    return out | {"firsts": a["firsts"] | b["firsts"], "lasts": a["lasts"] | b["lasts"]}


def _add_steps(out: dict, rows: np.ndarray, periods: np.ndarray) -> None:
    """Add the step sums of consecutive ``rows (L, d)`` to ``out`` (one compiled pass)."""
    out["steps"] += max(rows.shape[0] - 1, 0)
    _step_sums(rows, periods, out["jumps"], out["circular"], out["jump_circular"])


@compiled
def _step_sums(rows, periods, jumps, circular, jump_circular):  # pragma: no cover - compiled
    """Per component ``k`` and period ``P``: steps ``|x_{n+1,k} - x_{n,k}|`` beyond ``P / 2``
    (``jumps``), and the sums of the squared circular steps ``min(step, P - step)²`` over all
    steps (``circular``) and over the jumps (``jump_circular``); NaN and inf propagate as in
    numpy."""
    for n in range(rows.shape[0] - 1):
        for k in range(rows.shape[1]):
            step = abs(rows[n + 1, k] - rows[n, k])
            for c in range(periods.shape[0]):
                jump = step > periods[c] / 2.0
                arc = (periods[c] - step if jump else step) ** 2
                circular[k, c] += arc
                if jump:
                    jumps[k, c] += 1
                    jump_circular[k, c] += arc


def _finalize_wraps(p: dict) -> WrapStatistics:
    sums = {key: np.copy(p[key]) for key in _STEP_SUMS}
    periods = np.asarray(PERIODS)
    with np.errstate(over="ignore", invalid="ignore"):
        for where in sorted(p["lasts"]):  # a block's last row and its successor's first
            if where in p["firsts"]:
                _add_steps(sums, np.stack([p["lasts"][where], p["firsts"][where]]), periods)
    steps = np.maximum(sums["steps"], 1)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        jump_rms = np.sqrt(sums["jump_circular"] / sums["jumps"])
    return WrapStatistics(
        periods, sums["steps"], sums["jumps"], np.sqrt(sums["circular"] / steps),
        np.where(sums["jumps"] > 0, jump_rms, np.nan),
    )  # fmt: skip


def wrap_reduction() -> Reduction:
    """Steps between consecutive samples on the circles of :data:`PERIODS` (finalize:
    :class:`WrapStatistics`). Partials are sums and the blocks' end rows: no halo, so the read
    that shares it decodes no stored chunk twice."""
    return Reduction("wraps", _wrap_chunk, combine=_combine_wraps, finalize=_finalize_wraps)


# ------------------------------------------------------------------ hard edges

#: extreme values kept per coordinate and side
EDGE_SAMPLES = 256
#: a side is a hard edge when its spacing ratio exceeds this, between the ratios of tails and of
#: walls (see :class:`EdgeStatistics` and docs/benchmarks.md, section 'Tuning constants')
EDGE_RATIO = 3.2


@dataclass(frozen=True, eq=False)
class EdgeStatistics:
    """The :data:`EDGE_SAMPLES` smallest values of each coordinate and of its negative.

    Near an edge ``a`` where ``p(x) ~ (x - a)^α``, the ``i``-th smallest value lies at
    ``x_(i) - a ∝ i^{1/(α+1)}``; the ratio ``(x_(K) - x_(1)) / (x_(K/4) - x_(1))`` is about 4 for a
    density that does not vanish there (``α = 0``: a reflecting wall), about 2 for ``α = 1``
    (a diffusion path near its minimum) and less for a Gaussian tail; clipped data put ``K/4``
    samples at one value: an infinite ratio. :data:`EDGE_RATIO` lies between the ratios of
    tails and of walls (see docs/benchmarks.md, section 'Tuning constants').

    Attributes
    ----------
    lowest, highest : ``(d, K)`` the smallest and the largest values, each from its extreme
        inwards (fewer than ``K`` with fewer samples).
    """

    lowest: np.ndarray
    highest: np.ndarray

    def ratios(self) -> np.ndarray:
        """``(d, 2)`` the spacing ratio at the lower and the upper edge (NaN: too few samples,
        inf: ``K/4`` samples at the extreme value)."""
        out = np.full((self.lowest.shape[0], 2), np.nan)
        k = self.lowest.shape[1]
        if k < EDGE_SAMPLES:
            return out
        for side, values in enumerate((self.lowest, -self.highest)):
            span = values[:, -1] - values[:, 0]
            inner = values[:, k // 4 - 1] - values[:, 0]
            with np.errstate(divide="ignore", invalid="ignore"):  # an atom: inner = 0, inf
                out[:, side] = np.where(inner > 0, span / np.where(inner > 0, inner, 1.0), np.inf)
        return out

    def hard(self) -> np.ndarray:
        """``(d, 2)`` bool: the density does not vanish at the lower / upper edge."""
        return self.ratios() > EDGE_RATIO


def _edge_chunk(x: np.ndarray, _info: BlockInfo, _halo: np.ndarray | None) -> dict:
    x = np.asarray(x, dtype=np.float64)
    return {"lowest": _smallest(x.T), "highest": -_smallest(x.T, sign=-1.0)}


def _smallest(values: np.ndarray, sign: float = 1.0) -> np.ndarray:
    """The :data:`EDGE_SAMPLES` smallest of each row of ``sign * values (d, n)``, sorted as by
    ``np.sort`` (NaN last)."""
    out = np.empty((values.shape[0], min(EDGE_SAMPLES, values.shape[1])))
    for row, target in zip(values, out, strict=True):
        _smallest_of_row(row, sign, target)
    return out


@compiled
def _smallest_of_row(row, sign, out):  # pragma: no cover - compiled
    """The ``len(out)`` smallest of ``sign * row`` into ``out``, sorted, NaN last: one pass
    with a max-heap of the smallest so far (``O(n log K)`` whatever the order of the values,
    about ``n`` comparisons with the heap's top for values in random order)."""
    size, heap, count = out.shape[0], out, 0
    for i in range(row.shape[0] if size else 0):
        v = sign * row[i]
        if np.isnan(v):
            continue
        if count < size:  # sift up
            j = count
            count += 1
            while j > 0 and heap[(j - 1) // 2] < v:
                heap[j] = heap[(j - 1) // 2]
                j = (j - 1) // 2
            heap[j] = v
        elif v < heap[0]:  # replace the largest, sift down
            j = 0
            while True:
                child = 2 * j + 1
                if child >= size:
                    break
                if child + 1 < size and heap[child + 1] > heap[child]:
                    child += 1
                if heap[child] <= v:
                    break
                heap[j] = heap[child]
                j = child
            heap[j] = v
    out[:count] = np.sort(heap[:count])
    out[count:] = np.nan


def _combine_edges(a: dict, b: dict) -> dict:
    return {
        "lowest": _smallest(np.hstack([a["lowest"], b["lowest"]])),
        "highest": -_smallest(np.hstack([a["highest"], b["highest"]]), sign=-1.0),
    }


def _finalize_edges(p: dict) -> EdgeStatistics:
    return EdgeStatistics(p["lowest"].copy(), p["highest"].copy())


def edge_reduction() -> Reduction:
    """The extreme values of each coordinate (finalize: :class:`EdgeStatistics`)."""
    return Reduction("edges", _edge_chunk, _combine_edges, _finalize_edges)


# ------------------------------------------------------------------ pass 2: Gamma likelihood


@dataclass(frozen=True, eq=False)
class GammaFit:
    """Gamma maximum-likelihood fit of ``x[:, columns] - loc``, arrays of shape ``(k,)``.

    Attributes
    ----------
    columns : the coordinates fitted.
    loc : the shift used (Laguerre ``loc``).
    n : number of samples.
    shape : MLE shape ``k̂`` (the Laguerre weight Gamma(θ+1) has shape ``θ + 1``).
    scale : MLE scale in the units of ``x`` (``mean(x - loc) / k̂``).
    """

    columns: np.ndarray
    loc: np.ndarray
    n: np.ndarray
    shape: np.ndarray
    scale: np.ndarray

    @property
    def theta(self) -> np.ndarray:
        """Unrounded Laguerre θ = k̂ - 1, shape ``(k,)``."""
        return self.shape - 1.0


def gamma_shape_mle(log_mean: np.ndarray, mean_log: np.ndarray) -> np.ndarray:
    """Solve ``log k - ψ(k) = s``, ``s = log mean(y) - mean(log y) > 0``, for the MLE shape.

    Minka's (2002) closed-form start ``(3 - s + sqrt((s - 3)² + 24 s)) / (12 s)``, then his
    generalised Newton step on ``1/k`` (monotone, a handful of iterations to full precision).
    Shapes ``(k,)``.
    """
    s = np.asarray(log_mean - mean_log, dtype=np.float64)
    k = (3.0 - s + np.sqrt((s - 3.0) ** 2 + 24.0 * s)) / (12.0 * s)
    for _ in range(100):
        step = (np.log(k) - digamma(k) - s) / (k * k * (1.0 / k - polygamma(1, k)))
        k_new = 1.0 / (1.0 / k + step)
        done = np.all(np.abs(k_new - k) <= 1e-15 * k)
        k = k_new
        if done:
            break
    return k


def _gamma_chunk(
    x: np.ndarray, info: BlockInfo, columns: np.ndarray, loc: np.ndarray, scale: np.ndarray
) -> dict:
    """Sums ``n, Σ y, Σ log y`` of ``y = (x[:, columns] - loc) / scale`` for one block."""
    partial = {name: np.zeros(columns.shape[0]) for name in ("n", "sum_y", "sum_log_y")}
    for lo in range(0, x.shape[0], SUB_BLOCK):
        y = (np.asarray(x[lo : lo + SUB_BLOCK, columns], dtype=np.float64) - loc) / scale
        bad = ~(y > 0)
        if bad.any():
            row, j = np.argwhere(bad)[0]
            raise ValueError(
                f"coordinate {columns[j]}: {bad[:, j].sum()} samples not above the Laguerre "
                f"shift loc={loc[j]!r} (first: x={x[lo + row, columns[j]]!r} at chain "
                f"{info.chain}, time index {info.start + lo + row})"
            )
        part = {"n": np.full(columns.shape[0], float(y.shape[0])), "sum_y": y.sum(axis=0)}
        part["sum_log_y"] = np.log(y).sum(axis=0)
        partial = add_partials(partial, part)
    return partial


def gamma_reduction(
    loc: Sequence[float] | np.ndarray,
    scale: Sequence[float] | np.ndarray,
    columns: Sequence[int] | np.ndarray | None = None,
) -> Reduction:
    """Gamma MLE pass over ``y = (x[:, columns] - loc) / scale`` (finalize: :class:`GammaFit`).

    Parameters
    ----------
    loc, scale : ``(k,)`` shift and positive provisional scale per fitted column (see
        :func:`laguerre_shift`).
    columns : ``(k,)`` coordinates to fit; default ``0 .. k-1``.

    The chunk kernel raises :class:`ValueError` if a ``y`` is not ``> 0`` (naming the coordinate
    and the first offending sample). Partials are plain sums (combine by addition).
    """
    loc = np.atleast_1d(np.asarray(loc, dtype=np.float64))
    scale = np.atleast_1d(np.asarray(scale, dtype=np.float64))
    columns = np.arange(loc.shape[0]) if columns is None else np.asarray(columns, dtype=np.intp)
    if not (loc.shape == scale.shape == columns.shape) or loc.ndim != 1:
        raise ValueError(
            f"loc, scale and columns must have the same length, got shapes {loc.shape}, "
            f"{scale.shape} and {columns.shape}"
        )
    if not np.all(np.isfinite(loc)) or not np.all((scale > 0) & np.isfinite(scale)):
        raise ValueError(
            f"Gamma fit of coordinates {columns.tolist()}: need finite loc and finite scale > 0, "
            f"got loc={loc.tolist()}, scale={scale.tolist()} (a constant coordinate?)"
        )

    def chunk(x: np.ndarray, info: BlockInfo, _halo: np.ndarray | None) -> dict:
        return _gamma_chunk(x, info, columns, loc, scale)

    def finalize(p: dict) -> GammaFit:
        if not np.all(p["n"] > 0):
            raise ValueError("the trajectory has no samples")
        mean_y = p["sum_y"] / p["n"]
        s = np.log(mean_y) - p["sum_log_y"] / p["n"]
        for j in np.flatnonzero(~(s > 0)):
            raise ValueError(f"coordinate {columns[j]} is constant: no Gamma fit exists")
        shape = gamma_shape_mle(np.log(mean_y), p["sum_log_y"] / p["n"])
        return GammaFit(columns, loc, p["n"].astype(np.int64), shape, scale * mean_y / shape)

    return Reduction("gamma", chunk, finalize=finalize)
