"""One read that refits estimated scores on test functions: ``ŝ + V [z̃, φ]`` by eq. (1).

Each request is a base score ``ŝ`` (an estimate, its refits without each fold, its neighbouring
models) with a feature set ``φ`` (:class:`~kelr_dist.kernels.response.stein_correction.Features`)
and the held-out fold its sums leave out (a fold refit's refit is fitted without that fold too):
random Fourier features, which reach outside a polynomial span, or the observable's own functions
(:class:`~kelr_dist.kernels.response.stein_correction.ObservableFeatures`), which make the lag-0
identity ``k(0) = Ê[∂A]`` hold for every column of ``A`` (the bins of a PDF, say). The chunk sums
``Σ ŝ [z̃, φ]ᵀ`` per request and ``Σ [z̃, φ][z̃, φ]ᵀ``, ``Σ ∂[z̃, φ]`` per feature set, by blocks
of :data:`~kelr_dist.kernels.scores.score_matching.FEATURE_ROWS` rows and by fold, with every base
evaluated once per block (:func:`~kelr_dist.kernels.response.operator.evaluate_scores`); the
finalize solves eq. (1) per request on its rows
(:meth:`~kelr_dist.kernels.response.stein_correction.ExtendedScore.fit`).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

import numpy as np

from kelr_dist.kernels.reduction import BlockInfo, Reduction
from kelr_dist.kernels.response.operator import Score, evaluate_scores
from kelr_dist.kernels.response.stein_correction import ExtendedScore, Features, refit_design
from kelr_dist.kernels.scores.folds import Folds
from kelr_dist.kernels.scores.kernel_embedding import row_blocks
from kelr_dist.kernels.scores.score_matching import FEATURE_ROWS

#: a request: a base score, the features it is refitted on, and the held-out fold its sums leave
#: out (``None``: every row) — a fold refit's refit leaves out the same fold, so the jackknife
#: over folds sees the refit's own variance
Request = tuple[Score, Features, int | None]


def _feature_sets(requests: Sequence[Request]) -> tuple[list[Features], list[int]]:
    """The distinct feature sets (by identity) and each request's index among them."""
    sets: list[Features] = []
    slots = []
    for _, features, _ in requests:
        found = next((k for k, f in enumerate(sets) if f is features), None)
        if found is None:
            found = len(sets)
            sets.append(features)
        slots.append(found)
    return sets, slots


def refit_sums(requests: Sequence[Request], x: np.ndarray, fold: int, folds: int) -> dict[str, Any]:
    """On the rows ``x (n, d)``, all in held-out ``fold`` of ``folds``, each sum by fold
    (axis 0, zero but for ``fold``): ``moment`` per request ``Σ ŝ [z̃, φ]ᵀ`` ``(folds, d, w)``
    (``ŝ = 0`` where the base keeps no row), per feature set ``second`` ``Σ [z̃, φ][z̃, φ]ᵀ`` and
    ``divergence`` ``Σ ∂_j [z̃, φ]``; ``n`` ``(folds,)``."""
    sets, slots = _feature_sets(requests)
    bases = [base for base, _, _ in requests]
    d = x.shape[1]
    widths = [d + 1 + features(x[:1]).shape[1] for features in sets]
    moment = [np.zeros((folds, d, widths[slots[r]])) for r in range(len(requests))]
    second = [np.zeros((folds, w, w)) for w in widths]
    divergence = [np.zeros((folds, d, w)) for w in widths]
    for rows in row_blocks(x.shape[0], FEATURE_ROWS):
        block = x[rows]
        evaluated: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # parts shared by the sets
        designs = [refit_design(block, features, evaluated) for features in sets]
        for k, (z, div) in enumerate(designs):
            second[k][fold] += z.T @ z
            divergence[k][fold] += div
        for r, (score, kept) in enumerate(evaluate_scores(bases, block)):
            s = np.where(kept[:, None], score, 0.0)
            moment[r][fold] += s.T @ designs[slots[r]][0]
    n = np.zeros(folds, dtype=np.int64)
    n[fold] = x.shape[0]
    return {"moment": moment, "second": second, "divergence": divergence, "n": n}


def _chunk(
    requests: Sequence[Request],
    folds: Folds | None,
    stride: int,
    x: np.ndarray,
    info: BlockInfo,
    _halo: None,
) -> dict[str, Any]:
    pieces = [(0, slice(0, info.length))] if folds is None else list(folds.segments(info))
    count = 1 if folds is None else folds.count
    total = None
    for fold, rows in pieces:
        first = info.start + rows.start  # the piece's first time index
        part = refit_sums(requests, x[rows][-first % stride :: stride], fold, count)
        total = part if total is None else _combine(total, part)
    assert total is not None
    return total


def _combine(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    return {
        key: a[key] + b[key] if key == "n" else [u + v for u, v in zip(a[key], b[key], strict=True)]
        for key in a
    }


def _finalize(requests: Sequence[Request], sums: dict[str, Any]) -> list[ExtendedScore]:
    sets, slots = _feature_sets(requests)

    def without(total: np.ndarray, fold: int | None) -> np.ndarray:
        return total.sum(axis=0) if fold is None else total.sum(axis=0) - total[fold]

    return [
        ExtendedScore.fit(
            base,
            features,
            without(sums["moment"][r], fold),
            {
                "second": without(sums["second"][slots[r]], fold),
                "divergence": without(sums["divergence"][slots[r]], fold),
                "n": without(sums["n"], fold),
            },
        )
        for r, (base, features, fold) in enumerate(requests)
    ]


def refit_reduction(
    requests: Sequence[Request],
    folds: Folds | None = None,
    stride: int = 1,
    name: str = "score refits",
) -> Reduction:
    """The read that refits each ``(base, features, fold)`` of ``requests`` as
    ``base + V [z̃, φ]`` (eq. 1;
    :class:`~kelr_dist.kernels.response.stein_correction.ExtendedScore`) on the rows whose time
    index is a multiple of ``stride``, leaving out held-out ``fold`` of ``folds``
    (:class:`~kelr_dist.kernels.scores.folds.Folds`) when it is not ``None``; finalizes to the
    refitted scores in the requests' order."""
    requests = tuple(requests)
    if folds is None and any(fold is not None for _, _, fold in requests):
        raise ValueError("a request that leaves out a fold needs the folds")
    return Reduction(
        name=name,
        chunk=partial(_chunk, requests, folds, stride),
        combine=_combine,
        finalize=partial(_finalize, requests),
    )
