"""Gaussian kernel density estimate, exact and binned: the paper's baseline (§5, eq. 58).

The response estimator needs the density ``p`` and its gradient ``grad p`` at every sample
(the conjugate variable of a constant forcing is ``B = -grad p / p``, eq. 5). The paper's
baseline plugs a Gaussian KDE with Silverman's bandwidth into the same formula,

    p_N(x) = (1/N) sum_n prod_k phi((x_k - X_{n,k}) / h_k) / h_k                 (eq. 58)

with ``phi`` the standard normal density and ``h_k = (4 / ((d+2) N))^(1/(d+4)) sigma_k``
(:func:`silverman_bandwidth`, the paper's formula with one sigma per coordinate).

Two evaluators:

* :func:`exact_kde_reduction`: the direct O(N n)
  sum over all samples for n evaluation points, numba, O(1) extra memory. It is the reference
  on subsamples; the paper ran it at all N = 1e7 samples (Table 1, 2e4 s).
* :func:`binned_kde_reduction`: linear binning (Wand 1994: each sample spreads its unit mass
  over the 2^d surrounding nodes of a fixed grid) as a
  :class:`~kelr_dist.kernels.reduction.Reduction`
  (combine = add), finalised into a :class:`BinnedKDE` whose density and gradient grids come
  from separable zero-padded FFT convolutions with the Gaussian kernel and its derivative, then
  interpolated back to arbitrary points. Out of core, any N, d = 1..3.

Accuracy of the binned KDE: linear binning and multilinear interpolation are both second order
in the node spacing (Wand, "Fast computation of multivariate kernel estimators", J. Comput.
Graph. Stat., 1994), so the default grid (:func:`default_grid`) uses a node spacing of ``h / 4``
per coordinate (:data:`DEFAULT_SPACING`), which keeps the score error of the binning far below
the KDE's statistical error (see docs/benchmarks.md, section 'Tuning constants'); since both
the binning error (~delta^2) and the KDE bias (~h^2) scale with h the ratio holds at every N
(Silverman's h shrinks as N^(-1/6), so the grid grows with N).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from kelr_dist.kernels.compiled import compiled
from kelr_dist.kernels.reduction import BlockInfo, Partial, Reduction

DEFAULT_PAD = 4.0
"""Grid padding beyond the data range, in bandwidths."""

DEFAULT_SPACING = 0.25
"""Default grid spacing, in bandwidths: second-order binning error far below the statistical
error (see the module docstring and docs/benchmarks.md, section 'Tuning constants')."""

DEFAULT_MAX_GRID_BYTES = 2**30
"""Largest grid working set (counts, density, gradients, FFT buffers) allowed by default."""

_KERNEL_REACH = 8.0
"""The Gaussian kernel is truncated at this many bandwidths (exp(-32) ~ 1e-14)."""

_BLOCK = 4096
"""Samples per cache block in the exact KDE."""


# ----------------------------------------------------------------------------- validation


def as_finite_array(name: str, value: object, ndim: int) -> np.ndarray:
    """``value`` as a float64 array of ``ndim`` dimensions; ``ValueError`` naming ``name``."""
    array = np.asarray(value, dtype=np.float64)
    if array.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimension(s), got shape {array.shape}")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name} must be finite, got non-finite values")
    return array


def as_samples(name: str, value: object, d: int | None = None) -> np.ndarray:
    """``value`` as finite samples ``(n, d)``; ``ValueError`` naming ``name``."""
    array = as_finite_array(name, value, 2)
    if d is not None and array.shape[1] != d:
        raise ValueError(f"{name} must have {d} columns, got shape {array.shape}")
    return array


def _as_positive(name: str, value: object, d: int | None = None) -> np.ndarray:
    array = as_finite_array(name, value, 1)
    if d is not None and array.shape != (d,):
        raise ValueError(f"{name} must have shape ({d},), got {array.shape}")
    if np.any(array <= 0):
        raise ValueError(f"{name} must be positive, got {array}")
    return array


# ----------------------------------------------------------------------------- bandwidth


def silverman_bandwidth(std: np.ndarray, n: int) -> np.ndarray:
    """Silverman's rule (paper §5): ``h_k = (4 / ((d+2) n))^(1/(d+4)) sigma_k``.

    Parameters
    ----------
    std : ``(d,)`` per-coordinate sample standard deviations ``sigma_k``.
    n : number of samples.

    Returns
    -------
    ``(d,)`` bandwidths.
    """
    std = _as_positive("std", std)
    if int(n) != n or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    d = std.shape[0]
    return (4.0 / ((d + 2) * n)) ** (1.0 / (d + 4)) * std


# ----------------------------------------------------------------------------- exact KDE


@compiled
def _kernel_sums(
    samples: np.ndarray, points: np.ndarray, inv_h: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Unnormalised ``sum_n exp(-|z|^2/2)`` and ``sum_n -z/h exp(-|z|^2/2)``, ``z = (x-X_n)/h``."""
    n, d = points.shape
    n_samples = samples.shape[0]
    sums = np.zeros(n)
    grads = np.zeros((n, d))
    z = np.empty(d)
    g = np.empty(d)
    for s0 in range(0, n_samples, _BLOCK):
        s1 = min(s0 + _BLOCK, n_samples)
        for i in range(n):
            total = 0.0
            g[:] = 0.0
            for j in range(s0, s1):
                r2 = 0.0
                for k in range(d):
                    z[k] = (points[i, k] - samples[j, k]) * inv_h[k]
                    r2 += z[k] * z[k]
                w = math.exp(-0.5 * r2)
                total += w
                for k in range(d):
                    g[k] -= w * z[k] * inv_h[k]
            sums[i] += total
            for k in range(d):
                grads[i, k] += g[k]
    return sums, grads


def _kernel_norm(bandwidth: np.ndarray) -> float:
    """``(2 pi)^(d/2) prod_k h_k``: the Gaussian product kernel's normalisation."""
    return (2.0 * np.pi) ** (bandwidth.shape[0] / 2.0) * float(np.prod(bandwidth))


def exact_kde_reduction(points: np.ndarray, bandwidth: np.ndarray) -> Reduction:
    """Mergeable exact KDE (eq. 58) and its gradient at fixed ``points`` over a trajectory.

    Parameters
    ----------
    points : ``(n, d)`` evaluation points.
    bandwidth : ``(d,)`` per-coordinate bandwidths ``h_k``.

    Returns
    -------
    A :class:`~kelr_dist.kernels.reduction.Reduction` whose partial holds the sample count and the
    unnormalised kernel sums; it finalises to ``(density (n,), gradient (n, d))``.
    """
    points = as_samples("points", points)
    d = points.shape[1]
    bandwidth = _as_positive("bandwidth", bandwidth, d)
    inv_h = 1.0 / bandwidth
    norm = _kernel_norm(bandwidth)

    def chunk(x: np.ndarray, _info: BlockInfo, _halo: np.ndarray | None) -> Partial:
        x = as_samples("samples", x, d)
        sums, grads = _kernel_sums(x, points, inv_h)
        return {"n": x.shape[0], "sums": sums, "grads": grads}

    def finalize(partial: Partial) -> tuple[np.ndarray, np.ndarray]:
        scale = 1.0 / (partial["n"] * norm)
        return partial["sums"] * scale, partial["grads"] * scale

    return Reduction("exact KDE", chunk, finalize=finalize)


# ----------------------------------------------------------------------------- binned KDE


@dataclass(frozen=True, eq=False)
class Grid:
    """A regular grid: ``shape[k]`` nodes from ``lower[k]`` to ``upper[k]`` inclusive.

    Attributes
    ----------
    lower, upper : ``(d,)`` first and last node coordinates.
    shape : ``(d,)`` node counts (each >= 2).
    """

    lower: np.ndarray
    upper: np.ndarray
    shape: tuple[int, ...]

    @property
    def spacing(self) -> np.ndarray:
        """``(d,)`` node spacings ``delta_k``."""
        return (self.upper - self.lower) / (np.asarray(self.shape) - 1)

    @property
    def working_bytes(self) -> int:
        """Bytes of the evaluation working set: counts, d+1 result grids, two FFT buffers."""
        d = len(self.shape)
        return 8 * int(np.prod(self.shape)) * (d + 4)


def make_grid(
    lower: np.ndarray,
    upper: np.ndarray,
    shape: tuple[int, ...] | np.ndarray,
    max_bytes: float = DEFAULT_MAX_GRID_BYTES,
) -> Grid:
    """Validate a grid for d = 1..3; ``ValueError`` if it is malformed or needs > ``max_bytes``."""
    lower = as_finite_array("lower", lower, 1)
    d = lower.shape[0]
    if not 1 <= d <= 3:
        raise ValueError(f"the binned KDE supports d = 1..3 coordinates, got lower of shape {d}")
    upper = as_finite_array("upper", upper, 1)
    if upper.shape != (d,) or np.any(upper <= lower):
        raise ValueError(f"upper must have shape ({d},) and exceed lower={lower}, got {upper}")
    shape_array = np.asarray(shape)
    if (
        shape_array.shape != (d,)
        or not np.issubdtype(shape_array.dtype, np.integer)
        or np.any(shape_array < 2)
    ):
        raise ValueError(f"shape must be {d} integers >= 2, got {shape!r}")
    grid = Grid(lower, upper, tuple(int(s) for s in shape_array))
    if grid.working_bytes > max_bytes:
        raise ValueError(
            f"shape={grid.shape} needs {grid.working_bytes / 2**20:.0f} MiB of grids, more than "
            f"max_bytes={max_bytes / 2**20:.0f} MiB: use a coarser grid or raise max_bytes"
        )
    return grid


def default_grid(
    minimum: np.ndarray,
    maximum: np.ndarray,
    bandwidth: np.ndarray,
    *,
    pad: float = DEFAULT_PAD,
    spacing: float = DEFAULT_SPACING,
    max_bytes: float = DEFAULT_MAX_GRID_BYTES,
) -> Grid:
    """The grid for a binned KDE of data in ``[minimum, maximum]``.

    Bounds are the data range padded by ``pad`` bandwidths; the node spacing is at most
    ``spacing * h_k`` (the module docstring tabulates the error against the spacing).

    Parameters
    ----------
    minimum, maximum : ``(d,)`` per-coordinate data range.
    bandwidth : ``(d,)`` KDE bandwidths.
    """
    bandwidth = _as_positive("bandwidth", bandwidth)
    minimum = as_finite_array("minimum", minimum, 1)
    maximum = as_finite_array("maximum", maximum, 1)
    if not minimum.shape == maximum.shape == bandwidth.shape or np.any(maximum < minimum):
        raise ValueError(
            f"minimum={minimum} and maximum={maximum} must match bandwidth's shape "
            f"{bandwidth.shape} with maximum >= minimum"
        )
    if not pad > 0 or not spacing > 0:
        raise ValueError(f"pad and spacing must be positive, got pad={pad}, spacing={spacing}")
    lower = minimum - pad * bandwidth
    upper = maximum + pad * bandwidth
    shape = np.ceil((upper - lower) / (spacing * bandwidth)).astype(np.int64) + 1
    return make_grid(lower, upper, shape, max_bytes)


@compiled
def _strides(shape: np.ndarray) -> np.ndarray:
    """C-order strides, in elements, of a grid of ``shape``."""
    d = shape.shape[0]
    strides = np.empty(d, dtype=np.int64)
    stride = 1
    for k in range(d - 1, -1, -1):
        strides[k] = stride
        stride *= shape[k]
    return strides


@compiled
def _inside(row: np.ndarray, lower: np.ndarray, upper: np.ndarray) -> bool:
    for k in range(row.shape[0]):
        if not lower[k] <= row[k] <= upper[k]:
            return False
    return True


@compiled
def _locate(
    row: np.ndarray,
    lower: np.ndarray,
    inv_delta: np.ndarray,
    shape: np.ndarray,
    base: np.ndarray,
    frac: np.ndarray,
) -> None:
    """Fill ``base`` (lower node of the cell) and ``frac`` (position in it, 0..1) of a row."""
    for k in range(row.shape[0]):
        t = (row[k] - lower[k]) * inv_delta[k]
        j = min(int(t), shape[k] - 2)
        base[k] = j
        frac[k] = min(t - j, 1.0)


@compiled
def _corner(
    corner: int, base: np.ndarray, frac: np.ndarray, strides: np.ndarray
) -> tuple[int, float]:
    """Flat index and multilinear weight of corner ``corner`` (bit k: upper node along k)."""
    weight = 1.0
    index = 0
    for k in range(base.shape[0]):
        if (corner >> k) & 1:
            weight *= frac[k]
            index += (base[k] + 1) * strides[k]
        else:
            weight *= 1.0 - frac[k]
            index += base[k] * strides[k]
    return index, weight


@compiled
def _linear_binning(
    x: np.ndarray,
    lower: np.ndarray,
    upper: np.ndarray,
    inv_delta: np.ndarray,
    shape: np.ndarray,
    counts: np.ndarray,
) -> int:
    """Add the linear-binning weights of the rows of ``x`` to the flat ``counts``.

    Returns the index of the first sample outside the grid (``-1`` when all are inside); the
    counts are then incomplete.
    """
    n, d = x.shape
    strides = _strides(shape)
    base = np.empty(d, dtype=np.int64)
    frac = np.empty(d)
    for i in range(n):
        if not _inside(x[i], lower, upper):
            return i
        _locate(x[i], lower, inv_delta, shape, base, frac)
        for corner in range(1 << d):
            index, weight = _corner(corner, base, frac, strides)
            counts[index] += weight
    return -1


@compiled
def _multilinear(
    points: np.ndarray,
    lower: np.ndarray,
    upper: np.ndarray,
    inv_delta: np.ndarray,
    shape: np.ndarray,
    values: np.ndarray,
) -> np.ndarray:
    """Multilinear interpolation of the flat node ``values (m, nodes)`` at ``points (n, d)``.

    The transpose of :func:`_linear_binning`; ``(m, n)`` result, 0 outside the grid.
    """
    n, d = points.shape
    strides = _strides(shape)
    base = np.empty(d, dtype=np.int64)
    frac = np.empty(d)
    out = np.zeros((values.shape[0], n))
    for i in range(n):
        if not _inside(points[i], lower, upper):
            continue
        _locate(points[i], lower, inv_delta, shape, base, frac)
        for corner in range(1 << d):
            index, weight = _corner(corner, base, frac, strides)
            for m in range(values.shape[0]):
                out[m, i] += weight * values[m, index]
    return out


def linear_binning(x: np.ndarray, grid: Grid) -> np.ndarray:
    """Linear binning (Wand 1994) of samples ``x (L, d)`` on ``grid``: counts of ``grid.shape``.

    Each sample gives its unit mass to the 2^d nodes of its cell, with multilinear weights, so
    ``counts.sum() == L``. ``ValueError`` for non-finite samples or samples outside the grid.
    """
    x = as_samples("samples", x, len(grid.shape))
    counts = np.zeros(int(np.prod(grid.shape)))
    shape = np.asarray(grid.shape, dtype=np.int64)
    outside = _linear_binning(x, grid.lower, grid.upper, 1.0 / grid.spacing, shape, counts)
    if outside >= 0:
        raise ValueError(
            f"sample {x[outside]} lies outside the KDE grid [{grid.lower}, {grid.upper}]: "
            "the grid bounds must cover the data range"
        )
    return counts.reshape(grid.shape)


def _kernel_taps(delta: float, h: float, n_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian kernel ``phi(u/h)/h`` and its derivative at grid offsets ``u = j delta``."""
    reach = min(n_nodes - 1, math.ceil(_KERNEL_REACH * h / delta))
    u = np.arange(-reach, reach + 1) * delta
    value = np.exp(-0.5 * (u / h) ** 2) / (math.sqrt(2.0 * np.pi) * h)
    return value, -u / h**2 * value


def _convolve_axis(grid: np.ndarray, taps: np.ndarray, axis: int) -> np.ndarray:
    """Linear (zero-padded, no wrap-around) FFT convolution of ``grid`` with ``taps`` on an axis."""
    shape = [1] * grid.ndim
    shape[axis] = taps.shape[0]
    from scipy.signal import fftconvolve  # deferred: scipy.signal costs seconds to import

    return fftconvolve(grid, taps.reshape(shape), mode="same", axes=axis)


def _smooth(density: np.ndarray, spacing: np.ndarray, bandwidth: np.ndarray) -> np.ndarray:
    """``(d+1, *shape)``: binned masses convolved with the kernel, then with its d derivatives.

    Separable: the density is the masses smoothed along every axis; derivative k replaces the
    smoothing along axis k by the kernel derivative.
    """
    d = density.ndim
    taps = [
        _kernel_taps(delta, h, n)
        for delta, h, n in zip(spacing, bandwidth, density.shape, strict=True)
    ]
    out = np.empty((d + 1, *density.shape))
    for target in range(d + 1):  # 0: density, 1 + k: derivative along k
        values = density
        for axis in range(d):
            value_taps, slope_taps = taps[axis]
            values = _convolve_axis(values, slope_taps if target == axis + 1 else value_taps, axis)
        out[target] = values
    return out


@dataclass(frozen=True, eq=False)
class BinnedKDE:
    """Binned Gaussian KDE (eq. 58) of ``n`` samples on ``grid``: evaluates ``p`` and ``grad p``.

    The node values are computed at construction (on the client, when it finalises the
    reduction), so workers that evaluate it receive finished grids.

    Attributes
    ----------
    grid : the :class:`Grid`.
    counts : linear-binning counts, shape ``grid.shape`` (they sum to ``n``).
    n : number of samples.
    bandwidth : ``(d,)`` bandwidths ``h_k``.
    order : interpolation order back to the points: 1 (multilinear) or 3 (cubic spline).
    node_values : ``(d+1, *grid.shape)``: the density, then its d partial derivatives, at the
        nodes (spline coefficients when ``order == 3``).
    """

    grid: Grid
    counts: np.ndarray
    n: int
    bandwidth: np.ndarray
    order: int = 1
    node_values: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        values = _smooth(self.counts / self.n, self.grid.spacing, self.bandwidth)
        if self.order == 3:
            from scipy import ndimage

            values = np.stack([ndimage.spline_filter(v, order=3, mode="mirror") for v in values])
        object.__setattr__(self, "node_values", values)

    def evaluate(self, points: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Density and gradient at ``points (n, d)``, interpolated from the grid.

        Returns
        -------
        density : ``(n,)``; 0 outside the grid.
        gradient : ``(n, d)``; 0 outside the grid.
        """
        d = len(self.grid.shape)
        points = as_samples("points", points, d)
        if self.order == 1:
            values = _multilinear(
                points,
                self.grid.lower,
                self.grid.upper,
                1.0 / self.grid.spacing,
                np.asarray(self.grid.shape, dtype=np.int64),
                self.node_values.reshape(d + 1, -1),
            )
            return values[0], values[1:].T
        coords = ((points - self.grid.lower) / self.grid.spacing).T
        inside = np.all((points >= self.grid.lower) & (points <= self.grid.upper), axis=1)
        values = np.zeros((d + 1, points.shape[0]))
        for target in range(d + 1):
            from scipy import ndimage

            values[target, inside] = ndimage.map_coordinates(
                self.node_values[target],
                coords[:, inside],
                order=3,
                mode="mirror",
                prefilter=False,
            )
        return values[0], values[1:].T

    def score(self, points: np.ndarray) -> np.ndarray:
        """``grad log p = grad p / p`` at ``points (n, d)``; 0 where the density is not positive."""
        density, gradient = self.evaluate(points)
        positive = density > 0
        out = np.zeros_like(gradient)
        out[positive] = gradient[positive] / density[positive, None]
        return out


def binned_kde_reduction(grid: Grid, bandwidth: np.ndarray, order: int = 1) -> Reduction:
    """Linear binning on a fixed ``grid`` as a Reduction, finalised into a :class:`BinnedKDE`.

    The partial is ``{"counts": grid.shape array, "n": samples}``; combine adds. The grid
    (see :func:`default_grid`) must cover every sample.

    Parameters
    ----------
    grid : a :class:`Grid` from :func:`make_grid` or :func:`default_grid`.
    bandwidth : ``(d,)`` KDE bandwidths (e.g. :func:`silverman_bandwidth`).
    order : interpolation order of :meth:`BinnedKDE.evaluate`, 1 or 3.
    """
    bandwidth = _as_positive("bandwidth", bandwidth, len(grid.shape))
    if order not in (1, 3):
        raise ValueError(f"order must be 1 or 3, got {order!r}")

    def chunk(x: np.ndarray, _info: BlockInfo, _halo: np.ndarray | None) -> Partial:
        return {"counts": linear_binning(x, grid), "n": int(np.shape(x)[0])}

    def finalize(partial: Partial) -> BinnedKDE:
        return BinnedKDE(grid, partial["counts"], partial["n"], bandwidth, order)

    return Reduction("KDE binning", chunk, finalize=finalize)
