"""The quasi-Gaussian FDT: the fitted Gaussian's mean and covariance, mergeable, and its score.

:func:`mean_covariance_reduction` gives count, mean and co-moment matrix merged by the parallel
formula of Chan, Golub & LeVeque (also min and max, which fix the KDE grid of
:mod:`kelr_dist.kernels.baselines.kde`); :func:`gaussian_score` is ``grad log p = -Sigma^{-1} (x -
mu)`` of the fitted Gaussian. :func:`collinear_component` reads the same covariance for a
component that is (nearly) a linear combination of the ones before it, which no estimate of a
density in the components' own coordinates can resolve.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import linalg

from kelr_dist.kernels.baselines.kde import as_finite_array, as_samples
from kelr_dist.kernels.reduction import BlockInfo, Partial, Reduction


@dataclass(frozen=True, eq=False)
class SampleMoments:
    """Sample count, mean ``(d,)``, covariance ``(d, d)`` (ddof = 1, as ``numpy.cov``), range."""

    count: int
    mean: np.ndarray
    cov: np.ndarray
    minimum: np.ndarray
    maximum: np.ndarray


#: a component whose variance left after its least-squares regression on the components before
#: it is below this fraction of its variance (``1 - R² <``, a variance inflation factor above
#: 1e8; Belsley, Kuh & Welsch, *Regression Diagnostics*, Wiley 1980, ch. 3) is collinear: its
#: residual spread is below 1e-4 of its own, the level of data rounded to four significant
#: digits, far above float32 storage's rounding (``1 - R² ≈ 1e-15``). The equilibrium density
#: then lives on a thin neighbourhood of a hyperplane that neither a tensor-product basis nor the
#: affine Stein correction's normal equations resolve.
COLLINEAR_TOLERANCE = 1e-8


def collinear_component(cov: np.ndarray) -> tuple[int, float] | None:
    """The first component of ``cov (d, d)`` whose ``1 - R²`` on the components before it is
    below :data:`COLLINEAR_TOLERANCE`, with that ``1 - R²``, or None (also for a covariance with
    a zero variance or a non-finite entry, which other checks refuse by name).

    ``1 - R²`` of component ``j`` is the squared ``j``-th diagonal entry of the Cholesky factor
    of the correlation matrix (the Schur complement of the leading ``j`` components).
    """
    variance = np.diag(cov)
    if not (np.isfinite(cov).all() and (variance > 0).all()):
        return None  # a constant or non-finite component: refused by the checks that name it
    std = np.sqrt(variance)
    correlation = cov / np.outer(std, std)
    d = correlation.shape[0]
    factor = np.zeros((d, d))
    for j in range(d):
        factor[j, :j] = linalg.solve_triangular(factor[:j, :j], correlation[:j, j], lower=True)
        left = float(correlation[j, j] - factor[j, :j] @ factor[j, :j])
        if left < COLLINEAR_TOLERANCE:
            return j, max(left, 0.0)
        factor[j, j] = math.sqrt(left)
    return None


def _covariance_chunk(x: np.ndarray, _info: BlockInfo, _halo: np.ndarray | None) -> Partial:
    # non-finite or too large samples are refused by the moments pass of the same read, which
    # names them; here they only make the covariance non-finite
    x = np.asarray(x, dtype=np.float64)
    if x.shape[0] == 0:
        d = x.shape[1]
        return {
            "count": 0,
            "mean": np.zeros(d),
            "comoment": np.zeros((d, d)),
            "minimum": np.full(d, np.inf),
            "maximum": np.full(d, -np.inf),
        }
    with np.errstate(over="ignore", invalid="ignore"):
        mean = x.mean(axis=0)
        centred = x - mean
        comoment = centred.T @ centred
    return {
        "count": x.shape[0],
        "mean": mean,
        "comoment": comoment,
        "minimum": x.min(axis=0),
        "maximum": x.max(axis=0),
    }


def _covariance_combine(a: Partial, b: Partial) -> Partial:
    """Chan, Golub & LeVeque's pairwise update of count, mean and co-moment matrix."""
    count = a["count"] + b["count"]
    if count == 0:
        return a
    weight = b["count"] / count
    with np.errstate(over="ignore", invalid="ignore"):  # samples the moments pass refuses
        delta = b["mean"] - a["mean"]
        mean = a["mean"] + delta * weight
        comoment = a["comoment"] + b["comoment"] + np.outer(delta, delta) * a["count"] * weight
    return {
        "count": count,
        "mean": mean,
        "comoment": comoment,
        "minimum": np.minimum(a["minimum"], b["minimum"]),
        "maximum": np.maximum(a["maximum"], b["maximum"]),
    }


def _covariance_finalize(partial: Partial) -> SampleMoments:
    count = partial["count"]
    if count < 2:
        raise ValueError(f"the covariance needs at least 2 samples, got {count}")
    return SampleMoments(
        count,
        partial["mean"],
        partial["comoment"] / (count - 1),
        partial["minimum"],
        partial["maximum"],
    )


def mean_covariance_reduction() -> Reduction:
    """Mergeable sample mean, covariance and range: a Reduction finalised to SampleMoments.

    Combine is Chan et al.'s parallel update (not a plain sum), stable for long series.
    """
    return Reduction(
        "mean/covariance", _covariance_chunk, _covariance_combine, _covariance_finalize
    )


@dataclass(frozen=True, eq=False)
class GaussianScore:
    """``x (n, d) -> -Sigma^{-1} (x - mu)``: the score of the Gaussian ``N(mu, Sigma)``."""

    mean: np.ndarray
    cholesky: tuple[np.ndarray, bool]

    def __call__(self, x: np.ndarray) -> np.ndarray:
        x = as_samples("x", x, self.mean.shape[0])
        return -linalg.cho_solve(self.cholesky, (x - self.mean).T).T


def gaussian_score(mean: np.ndarray, cov: np.ndarray) -> GaussianScore:
    """Quasi-Gaussian FDT: the score ``grad log p = -Sigma^{-1}(x - mu)`` of the fitted Gaussian.

    For constant forcing the conjugate variable (eq. 5) is ``B = -score``.

    Parameters
    ----------
    mean : ``(d,)`` mean ``mu``.
    cov : ``(d, d)`` symmetric positive definite covariance ``Sigma``.

    Returns
    -------
    A picklable callable ``(n, d) -> (n, d)``.
    """
    mean = as_finite_array("mean", mean, 1)
    d = mean.shape[0]
    cov = as_finite_array("cov", cov, 2)
    if cov.shape != (d, d) or np.max(np.abs(cov - cov.T)) > 1e-10 * np.max(np.abs(cov)):
        raise ValueError(f"cov must be a symmetric ({d}, {d}) matrix, got {cov}")
    try:
        factor = linalg.cho_factor(cov)
    except linalg.LinAlgError:
        raise ValueError(f"cov must be positive definite, got {cov}") from None
    return GaussianScore(mean, factor)
