"""Observables of a field stacked into components: a weighted mean and leading EOF amplitudes.

A field ``(time, lat, lon, ...)`` enters the estimate with its grid points as components
(:mod:`kelr_dist.data.fields`). Two linear observables of it, ``A(x) = L x`` with a fixed
``L (q, d)``, need no more than the matrix:

- :class:`LinearObservable` with ``L = w / Σ w`` (one row): the area-weighted mean, weights from a
  grid coordinate (``cos(lat)``);
- with ``L`` the leading EOFs (:func:`leading_eofs`): the amplitudes of the field's leading
  empirical orthogonal functions, from the survey's covariance.

Their derivative ``∂_j A_i = L_ij`` is constant, so the lag-0 self-check of eq. 5 needs no
differences. Frozen dataclasses, so that the Dask workers unpickle them by reference.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from kelr_dist.kernels.bases.eof import leading_eofs as eof_basis

#: the field observables options name: ``mean``, ``mean(weights=...)``, ``eof(k)``,
#: ``eof(k, weights=...)``
FIELD_SPEC = re.compile(r"^\s*(?P<kind>mean|eof)\s*(\((?P<inside>.*)\))?\s*$")
#: ``cos(NAME)``: the cosine of a grid coordinate in degrees (latitude); else a coordinate's name
COSINE = re.compile(r"^cos\(\s*(?P<name>[^()\s]+)\s*\)$")
FIELD_SPEC_FORMS = "'mean', 'mean(weights=cos(lat))', 'eof(k)' or 'eof(k, weights=cos(lat))'"


@dataclass(frozen=True)
class FieldSpec:
    """A field observable as options name it: ``kind`` ``"mean"`` or ``"eof"``, the number of
    EOFs ``k`` (0 for the mean) and the ``weights`` expression (``""``: equal weights)."""

    kind: str
    k: int
    weights: str
    text: str


def parse_field_spec(text: str) -> FieldSpec | None:
    """``"mean"``, ``"mean(weights=cos(lat))"``, ``"eof(3)"``, ``"eof(3, weights=area)"`` as a
    :class:`FieldSpec`; None for text that names no field observable.

    Raises
    ------
    ValueError
        ``eof`` without a number of EOFs ``k >= 1``, ``mean`` with one, or an empty weight.
    """
    if not re.match(r"^\s*(mean|eof)\b", text):
        return None
    found = FIELD_SPEC.match(text)
    parts = [] if found is None or found["inside"] is None else found["inside"].split(",", 1)
    k: int | None = None
    weights = ""
    for part in (p.strip() for p in parts):
        if part.isdigit() and k is None and not weights:
            k = int(part)
        elif part.startswith("weights=") and part[len("weights=") :].strip():
            weights = part[len("weights=") :].strip()
        else:
            found = None
    if found is None:
        raise ValueError(f"{text!r} is not a field observable: write {FIELD_SPEC_FORMS}")
    kind = found["kind"]
    if kind == "eof" and not k:
        raise ValueError(f"{text!r}: eof(k) needs the number of EOFs k >= 1")
    if kind == "mean" and k is not None:
        raise ValueError(f"{text!r}: mean takes no number, only weights=...")
    return FieldSpec(kind, k or 0, weights, text.strip())


@dataclass(frozen=True, eq=False)
class LinearObservable:
    """``A(x) = x Lᵀ``: ``(n, d) -> (n, q)`` for a fixed ``L (q, d)`` (``matrix``); for EOF
    amplitudes ``explained`` ``(q,)`` holds each EOF's share of the variance."""

    matrix: np.ndarray
    explained: np.ndarray | None = None

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return x @ self.matrix.T

    def derivative(self, x: np.ndarray) -> np.ndarray:
        """``∂_j A_i = L_ij``, ``(n, q, d)`` (a broadcast view)."""
        return np.broadcast_to(self.matrix, (x.shape[0], *self.matrix.shape))


def weighted_mean_matrix(weights: np.ndarray) -> np.ndarray:
    """``L = w / Σ w`` ``(1, d)`` of the weighted mean over the points ``weights (d,)``."""
    return (weights / weights.sum())[np.newaxis, :]


def leading_eofs(
    covariance: np.ndarray, k: int, weights: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` leading EOFs of a field with covariance ``C (d, d)``.

    With weights ``w (d,)`` (area) they are the eigenvectors ``u`` of ``D C D``,
    ``D = diag(√w)``, and the amplitude of EOF ``m`` is ``a_m(x) = u_mᵀ D x``; without, of ``C``.
    Signs are fixed so that each loading's largest entry in absolute value is positive.

    Returns
    -------
    loadings : ``(k, d)`` the rows ``u_mᵀ D`` (the observable's matrix ``L``)
    explained : ``(k,)`` the share of the (weighted) total variance each EOF carries
    """
    d = covariance.shape[0]
    root = np.ones(d) if weights is None else np.sqrt(weights)
    eofs = eof_basis(np.zeros(d), covariance * np.outer(root, root), k)
    total = max(eofs.total, np.finfo(float).tiny)
    return eofs.patterns.T * root, eofs.variances / total
