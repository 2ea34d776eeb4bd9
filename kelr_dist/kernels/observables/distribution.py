"""Distribution observables: bin functions (the PDF), centred moments and smooth exceedances.

The response of ``E[A(X(t))]`` holds for any observable ``A`` (eq. 5), so families of
observables of one component give the response of that component's whole distribution, as
columns of the one response read:

- ``pdf``: smooth bin functions ``A_b(x_c)``, cardinal B-splines of degree 2 (``quadratic``) or 3
  (``cubic``) centred on a uniform grid ``c_b = lo + b h``, ``b = 0..K-1``. The splines beyond
  either end are folded into the first and last bin, so that ``Σ_b A_b(x) = 1`` for every ``x``:
  the bins partition unity, the predicted PDF ``p_b = E[A_b] / h`` integrates to 1 with weights
  ``h``, and its response integrates to 0 at every lag. ``E[A_b] / h`` is the density smoothed
  by the spline (a histogram with a smooth window); the first and last bins also hold the mass
  beyond the grid.
- ``moments``: ``(x_c - μ_c)^k``, ``k = 1..4``, centred at the equilibrium mean ``μ`` (fixed): the
  response of the second is that of the variance to first order, ``δE[(X - μ)²] = δVar + δμ²``.
- ``exceedance``: ``Φ((x_c - x_q) / w)``, a smooth step at the data's quantile ``x_q``
  (``Φ`` the standard normal distribution function, ``w`` a width in standard deviations):
  the smoothed probability ``P(X_c > x_q)``.

The grid and thresholds come from the data: the survey's extremes, mean and standard deviation,
and a fine histogram (:func:`histogram_reduction`) for the quantiles and the equilibrium means
``Ā`` (the centre of the covariance form).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import numpy as np
from scipy.special import ndtr

from kelr_dist.kernels.reduction import BlockInfo, Reduction
from kelr_dist.kernels.response.operator import Observable

KINDS = ("pdf", "moments", "exceedance")
#: B-spline degree of each bin kernel
KERNELS = {"quadratic": 2, "cubic": 3}
DEFAULT_KERNEL = "cubic"
#: bins per component: 40 bins resolve a unimodal or three-well density (a bin per ~0.3 std)
#: while the response read's cost grows linearly with the number of observables
DEFAULT_BINS = 40
DEFAULT_QUANTILES = (0.01, 0.05, 0.5, 0.95, 0.99)
#: the exceedances' smoothing width in standard deviations of the component: small against the
#: distance between the default quantiles (≥ 0.3 std for a Gaussian), smooth on the bin scale
DEFAULT_WIDTH = 0.05
#: the PDF grid spans the data, cut at mean ± GRID_SPREAD standard deviations (Chebyshev: at most
#: 1/36 of any distribution beyond, in the folded end bins; 2e-9 of a Gaussian)
GRID_SPREAD = 6.0
#: bins of the survey histogram behind the quantiles and the equilibrium means (its midpoint rule
#: is ~(HISTOGRAM_BINS / K)² / 24 ~ 1e-5 relative on a bin function of K = 40 bins)
HISTOGRAM_BINS = 8192
MOMENTS = (1, 2, 3, 4)


# --------------------------------------------------------------------------------------------
# the spec: what the user names
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DistributionSpec:
    """A distribution observable as named in options: ``pdf(bins=40,kernel=cubic)``,
    ``moments``, ``exceedance(quantiles=0.9,0.99,width=0.05)``."""

    kind: str
    bins: int = DEFAULT_BINS
    kernel: str = DEFAULT_KERNEL
    quantiles: tuple[float, ...] = DEFAULT_QUANTILES
    width: float = DEFAULT_WIDTH

    @property
    def text(self) -> str:
        """The spec as text (what a result records and :func:`parse_distribution_spec` reads)."""
        if self.kind == "pdf":
            return f"pdf(bins={self.bins},kernel={self.kernel})"
        if self.kind == "exceedance":
            levels = ",".join(f"{q:g}" for q in self.quantiles)
            return f"exceedance(quantiles={levels},width={self.width:g})"
        return "moments"

    @property
    def levels(self) -> tuple[float, ...]:
        """The labels along the component's family: bin numbers, moment orders or quantiles."""
        if self.kind == "pdf":
            return tuple(float(b) for b in range(self.bins))
        if self.kind == "moments":
            return tuple(float(k) for k in MOMENTS)
        return self.quantiles

    def names(self, components: Sequence[str]) -> tuple[str, ...]:
        """Names of the observables: ``x1:bin0``, ``x1:moment2``, ``x1:exceed0.99``, component by
        component."""
        if self.kind == "pdf":
            labels = [f"bin{b}" for b in range(self.bins)]
        elif self.kind == "moments":
            labels = [f"moment{k}" for k in MOMENTS]
        else:
            labels = [f"exceed{q:g}" for q in self.quantiles]
        return tuple(f"{c}:{label}" for c in components for label in labels)


def _parameters(body: str) -> dict[str, list[str]]:
    """``key=v1,v2,key2=v`` as ``{key: [v1, v2], key2: [v]}`` (a comma-separated item without
    ``=`` continues the previous key's list)."""
    out: dict[str, list[str]] = {}
    key = None
    for item in (part.strip() for part in body.split(",")):
        if "=" in item:
            key, _, value = (s.strip() for s in item.partition("="))
            if not key or key in out:
                raise ValueError(f"expected distinct key=value parameters, got {body!r}")
            out[key] = [value]
        elif key is None or not item:
            raise ValueError(f"expected key=value parameters, got {body!r}")
        else:
            out[key].append(item)
    return out


def parse_distribution_spec(text: str) -> DistributionSpec | None:
    """The :class:`DistributionSpec` of ``text`` (``pdf``, ``pdf(bins=60,kernel=quadratic)``,
    ``moments``, ``exceedance(quantiles=0.9,0.99,width=0.1)``), or None when ``text`` does not
    name a distribution observable.

    Raises
    ------
    ValueError
        for a distribution observable with a bad parameter (named, with the allowed values).
    """
    head, paren, rest = text.strip().partition("(")
    head = head.strip()
    if head not in KINDS:
        return None
    if paren and not rest.rstrip().endswith(")"):
        raise ValueError(f"expected {head}(key=value,...), got {text!r}")
    params = _parameters(rest.rstrip()[:-1]) if paren and rest.strip() != ")" else {}
    allowed = {"pdf": ("bins", "kernel"), "moments": (), "exceedance": ("quantiles", "width")}
    unknown = sorted(set(params) - set(allowed[head]))
    if unknown:
        raise ValueError(
            f"{head}: unknown parameter(s) {unknown}; allowed: {list(allowed[head])}, got {text!r}"
        )
    spec: dict[str, Any] = {"kind": head}
    for key, values in params.items():
        if key != "quantiles" and len(values) != 1:
            raise ValueError(f"{head}: {key} takes one value, got {','.join(values)!r}")
        spec[key] = _parameter(head, key, values)
    return DistributionSpec(**spec)


def _parameter(head: str, key: str, values: list[str]) -> Any:
    value = values[0]
    if key == "kernel":
        if value not in KERNELS:
            raise ValueError(f"{head}: kernel must be one of {list(KERNELS)}, got {value!r}")
        return value
    try:
        numbers = [float(v) for v in values]
    except ValueError:
        raise ValueError(f"{head}: {key} must be numeric, got {','.join(values)!r}") from None
    if key == "bins":
        if not numbers[0].is_integer() or not 3 <= numbers[0] <= 10_000:
            raise ValueError(f"{head}: bins must be an integer from 3 to 10000, got {value!r}")
        return int(numbers[0])
    if key == "width":
        if not numbers[0] > 0 or not np.isfinite(numbers[0]):
            raise ValueError(f"{head}: width must be a positive number (std units), got {value!r}")
        return numbers[0]
    if not all(0 < q < 1 for q in numbers) or len(set(numbers)) != len(numbers):
        raise ValueError(f"{head}: quantiles must be distinct numbers in (0, 1), got {values}")
    return tuple(numbers)


@dataclass(frozen=True)
class PendingDistribution:
    """A distribution observable whose grid or thresholds are still to come from the data's
    survey (:func:`resolve_distribution`); it knows its names already."""

    spec: DistributionSpec
    components: tuple[str, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return self.spec.names(self.components)


# --------------------------------------------------------------------------------------------
# cardinal B-splines (centred) and the folded bin functions
# --------------------------------------------------------------------------------------------


def cardinal_bspline(t: np.ndarray, degree: int) -> tuple[np.ndarray, np.ndarray]:
    """The centred cardinal B-spline of ``degree`` 2 or 3 and its derivative at ``t``.

    Quadratic: ``3/4 - t²`` for ``|t| ≤ 1/2``, ``(3/2 - |t|)²/2`` up to 3/2; cubic:
    ``2/3 - t² + |t|³/2`` for ``|t| ≤ 1``, ``(2 - |t|)³/6`` up to 2. Their integer shifts sum
    to 1 and each integrates to 1.
    """
    a = np.abs(t)
    sign = np.sign(t)
    if degree == 2:
        inner, outer = a <= 0.5, (a > 0.5) & (a < 1.5)
        value = np.where(inner, 0.75 - a * a, np.where(outer, 0.5 * (1.5 - a) ** 2, 0.0))
        slope = np.where(inner, -2.0 * t, np.where(outer, -(1.5 - a) * sign, 0.0))
    else:
        inner, outer = a <= 1.0, (a > 1.0) & (a < 2.0)
        value = np.where(
            inner, 2.0 / 3.0 - a * a + 0.5 * a**3, np.where(outer, (2.0 - a) ** 3 / 6.0, 0.0)
        )
        slope = np.where(
            inner, -2.0 * t + 1.5 * t * a, np.where(outer, -0.5 * (2.0 - a) ** 2 * sign, 0.0)
        )
    return value, slope


def bin_functions(
    x: np.ndarray, lo: float, h: float, bins: int, degree: int
) -> tuple[np.ndarray, np.ndarray]:
    """Folded B-spline bins ``A_b(x)`` and ``dA_b/dx`` at ``x (n,)``: two ``(n, bins)`` arrays.

    ``A_b(x) = Σ_m B((x - lo)/h - m)`` over the shifts ``m`` clamped to ``b`` (the shifts below 0
    fold into bin 0, those above ``bins - 1`` into the last), so ``Σ_b A_b(x) = 1`` exactly.
    """
    u = (np.asarray(x, dtype=np.float64) - lo) / h
    half = 0.5 * (degree + 1)
    first = np.ceil(u - half).astype(np.int64)
    values = np.zeros((u.size, bins))
    slopes = np.zeros((u.size, bins))
    rows = np.arange(u.size)
    for offset in range(degree + 2):  # every shift m with |u - m| < (degree + 1) / 2
        m = first + offset
        value, slope = cardinal_bspline(u - m, degree)
        column = np.clip(m, 0, bins - 1)
        values[rows, column] += value
        slopes[rows, column] += slope / h
    return values, slopes


# --------------------------------------------------------------------------------------------
# the resolved observables
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class DistributionGrid:
    """A distribution observable fitted to the data, per component ``(d,)`` or ``(d, r)``.

    ``lo``, ``h``: the PDF grid's first bin centre and spacing; ``mean``: the equilibrium mean
    ``μ``; ``thresholds`` ``(d, r)``: the exceedances' ``x_q``; ``scale``: their widths ``w``;
    ``equilibrium`` ``(d, r)``: ``Ā`` of each observable (``r`` per component).
    """

    spec: DistributionSpec
    components: tuple[str, ...]
    lo: np.ndarray
    h: np.ndarray
    mean: np.ndarray
    thresholds: np.ndarray
    scale: np.ndarray
    equilibrium: np.ndarray

    @property
    def names(self) -> tuple[str, ...]:
        return self.spec.names(self.components)

    def coordinates(self) -> np.ndarray:
        """``(d, r)`` positions in data units: bin centres, moment orders, thresholds."""
        if self.spec.kind == "pdf":
            return self.lo[:, None] + self.h[:, None] * np.arange(self.spec.bins)
        if self.spec.kind == "moments":
            return np.broadcast_to(np.array(MOMENTS, dtype=float), (len(self.components), 4))
        return self.thresholds

    def columns(self, x: np.ndarray, c: int) -> tuple[np.ndarray, np.ndarray]:
        """Values and derivatives ``(n, r)`` of component ``c``'s observables at ``x (n,)``."""
        spec = self.spec
        if spec.kind == "pdf":
            degree = KERNELS[spec.kernel]
            return bin_functions(x, self.lo[c], self.h[c], spec.bins, degree)
        if spec.kind == "moments":
            y = (x - self.mean[c])[:, None]
            k = np.array(MOMENTS, dtype=float)
            return y**k, k * y ** (k - 1)
        z = (x[:, None] - self.thresholds[c]) / self.scale[c]
        return ndtr(z), np.exp(-0.5 * z * z) / (np.sqrt(2.0 * np.pi) * self.scale[c])


def distribution_values(grid: DistributionGrid, x: np.ndarray) -> np.ndarray:
    """``A(x)``: ``(n, d) -> (n, d r)``, component by component."""
    return np.concatenate([grid.columns(x[:, c], c)[0] for c in range(x.shape[1])], axis=1)


def distribution_derivative(grid: DistributionGrid, x: np.ndarray) -> np.ndarray:
    """``∂_j A_i(x)``: ``(n, d) -> (n, d r, d)``, nonzero only for ``j`` the component of ``i``."""
    n, d = x.shape
    r = len(grid.spec.levels)
    out = np.zeros((n, d * r, d))
    for c in range(d):
        out[:, c * r : (c + 1) * r, c] = grid.columns(x[:, c], c)[1]
    return out


# --------------------------------------------------------------------------------------------
# the survey histogram: quantiles and equilibrium means
# --------------------------------------------------------------------------------------------


def _histogram_chunk(
    lo: np.ndarray, hi: np.ndarray, bins: int, x: np.ndarray, _info: BlockInfo, _halo: Any
) -> np.ndarray:
    """Counts ``(d, bins)`` of a block ``x (L, d)`` on ``[lo, hi]`` per component."""
    x = np.asarray(x, dtype=np.float64)
    span = np.where(hi > lo, hi - lo, 1.0)
    index = np.clip(((x - lo) / span * bins).astype(np.int64), 0, bins - 1)
    return np.stack([np.bincount(index[:, c], minlength=bins) for c in range(x.shape[1])])


def histogram_reduction(
    minimum: np.ndarray, maximum: np.ndarray, bins: int = HISTOGRAM_BINS
) -> Reduction:
    """Counts ``(d, bins)`` of each component on ``[minimum, maximum]`` (the survey's extremes,
    so that no sample falls outside)."""
    lo, hi = np.asarray(minimum, dtype=float), np.asarray(maximum, dtype=float)
    return Reduction("histogram", partial(_histogram_chunk, lo, hi, bins))


def histogram_quantiles(
    counts: np.ndarray, lo: float, hi: float, levels: Sequence[float]
) -> np.ndarray:
    """Quantiles ``(r,)`` of a histogram ``counts (bins,)`` on ``[lo, hi]``, linear within a
    bin."""
    edges = np.linspace(lo, hi, counts.size + 1)
    cumulative = np.concatenate([[0.0], np.cumsum(counts)]) / counts.sum()
    return np.interp(levels, cumulative, edges)


def resolve_distribution(
    pending: PendingDistribution,
    mean: np.ndarray,
    std: np.ndarray,
    minimum: np.ndarray,
    maximum: np.ndarray,
    central: np.ndarray,
    counts: np.ndarray | None,
) -> DistributionGrid:
    """The :class:`DistributionGrid` of ``pending`` for data with these survey statistics
    ``(d,)``, central moments ``(d, 4)`` (``0, var, m3, m4``) and histogram ``counts (d, bins)``
    on ``[minimum, maximum]`` (needed by ``pdf`` and ``exceedance``).

    The PDF grid spans ``[max(min, μ - 6σ), min(max, μ + 6σ)]`` (:data:`GRID_SPREAD`); the
    exceedance thresholds are the histogram's quantiles; ``Ā`` of the moments is exact, that of
    the bins and exceedances the histogram's midpoint rule.
    """
    spec = pending.spec
    d = mean.size
    lo = np.maximum(minimum, mean - GRID_SPREAD * std)
    hi = np.minimum(maximum, mean + GRID_SPREAD * std)
    h = np.where(hi > lo, hi - lo, 1.0) / (spec.bins - 1)
    thresholds = np.zeros((d, len(spec.quantiles)))
    if spec.kind == "exceedance":
        assert counts is not None
        for c in range(d):
            thresholds[c] = histogram_quantiles(counts[c], minimum[c], maximum[c], spec.quantiles)
    # Ā: exact for the moments; for the others filled in below from the histogram
    r = len(spec.levels)
    known = np.asarray(central, float) if spec.kind == "moments" else np.zeros((d, r))
    grid = DistributionGrid(
        spec, pending.components, lo, h, np.asarray(mean, float), thresholds, spec.width * std,
        known,
    )  # fmt: skip
    if spec.kind == "moments":
        return grid
    assert counts is not None
    bins = counts.shape[1]
    equilibrium = np.empty((d, r))
    for c in range(d):
        mids = minimum[c] + (np.arange(bins) + 0.5) * (maximum[c] - minimum[c]) / bins
        equilibrium[c] = counts[c] @ grid.columns(mids, c)[0] / counts[c].sum()
    return replace(grid, equilibrium=equilibrium)


@dataclass(frozen=True)
class DistributionObservable(Observable):
    """The :class:`~kelr_dist.kernels.response.operator.Observable` of a fitted
    :class:`DistributionGrid` (its functions pickle by reference, with the grid, for the
    workers)."""

    grid: DistributionGrid | None = None

    @classmethod
    def on(cls, grid: DistributionGrid) -> DistributionObservable:
        return cls(
            grid.names,
            partial(distribution_values, grid),
            partial(distribution_derivative, grid),
            grid,
        )
