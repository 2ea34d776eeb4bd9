"""Empirical orthogonal functions (principal components) as coordinates, and responses lifted back.

The leading ``k`` eigenvectors ``V (d, k)`` of the sample covariance are the EOF patterns; the
amplitudes ``y = Vᵀ (x - x̄)`` are the coordinates an estimate runs in when a field has too many
components for a score model. A response ``k_y(t)`` of the amplitudes to constant forcings on the
amplitudes (eq. 5) is the response of the *projected* dynamics; the forcing ``e_j`` on component
``j`` enters the amplitudes as ``Vᵀ e_j`` and the components are read back as ``x̄ + V y``, so

    k_x(t) = V k_y(t) Vᵀ                                    (d, d) from (k, k)

which at lag 0 is the projector ``V Vᵀ`` onto the EOFs, not the identity.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, eq=False)
class Eofs:
    """The leading EOFs of a covariance: ``mean (d,)``, ``patterns (d, k)`` (orthonormal
    columns, each with its largest entry positive), their ``variances (k,)`` (descending) and
    the ``total`` variance (the covariance's trace)."""

    mean: np.ndarray
    patterns: np.ndarray
    variances: np.ndarray
    total: float

    @property
    def explained(self) -> np.ndarray:
        """The fraction of the total variance each EOF explains, ``(k,)``."""
        return self.variances / self.total

    def project(self, x: np.ndarray) -> np.ndarray:
        """Amplitudes ``(x - mean) V`` of samples ``x (n, d)``, shape ``(n, k)``."""
        return (np.asarray(x, dtype=np.float64) - self.mean) @ self.patterns


def leading_eofs(mean: np.ndarray, cov: np.ndarray, k: int) -> Eofs:
    """The ``k`` leading EOFs of the covariance ``cov (d, d)`` of samples with mean ``mean (d,)``.

    Each pattern's sign is fixed so that its entry of largest magnitude is positive (the
    eigenvectors' signs are otherwise arbitrary).
    """
    values, vectors = np.linalg.eigh(0.5 * (cov + cov.T))
    order = np.argsort(values)[::-1][:k]
    patterns = vectors[:, order]
    peaks = patterns[np.argmax(np.abs(patterns), axis=0), np.arange(k)]
    patterns = patterns * np.where(peaks < 0, -1.0, 1.0)
    total = float(np.trace(cov))
    return Eofs(np.asarray(mean, dtype=np.float64), patterns, np.maximum(values[order], 0.0), total)


def lift(values: np.ndarray, patterns: np.ndarray) -> np.ndarray:
    """``V values Vᵀ`` over the last two axes: ``(..., k, k)`` in EOF coordinates to
    ``(..., d, d)`` in the components."""
    return np.einsum("ia,...ab,jb->...ij", patterns, values, patterns)


def lift_bound(errors: np.ndarray, patterns: np.ndarray) -> np.ndarray:
    """``|V| errors |V|ᵀ``: a bound on the error of :func:`lift` from the errors of its entries
    (whatever their correlation), ``(..., k, k)`` to ``(..., d, d)``."""
    return lift(np.abs(errors), np.abs(patterns))


def eof_names(k: int) -> tuple[str, ...]:
    """The names of ``k`` EOF amplitudes: ``eof1, eof2, ...``."""
    return tuple(f"eof{a + 1}" for a in range(k))
