"""One read that refits estimated scores on test functions: ``ŝ + V [z̃, φ]`` by eq. (1).

Each request is a base score ``ŝ`` (an estimate, its refits without each fold, its neighbouring
models) with a feature set ``φ`` (:class:`~kelr_dist.kernels.stein_correction.Features`): random
Fourier features, which reach outside a polynomial span, or the observable's own functions
(:class:`~kelr_dist.kernels.stein_correction.ObservableFeatures`), which make the lag-0 identity
``k(0) = Ê[∂A]`` hold for every column of ``A`` (the bins of a PDF, say). The chunk sums
``Σ ŝ [z̃, φ]ᵀ`` per request and ``Σ [z̃, φ][z̃, φ]ᵀ``, ``Σ ∂[z̃, φ]`` per feature set, by blocks
of :data:`~kelr_dist.kernels.score_matching.FEATURE_ROWS` rows, with every base evaluated once
per block (:func:`~kelr_dist.kernels.response.evaluate_scores`); the finalize solves eq. (1)
per request (:meth:`~kelr_dist.kernels.stein_correction.ExtendedScore.fit`).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

import numpy as np

from kelr_dist.kernels.density import row_blocks
from kelr_dist.kernels.reduction import BlockInfo, Reduction
from kelr_dist.kernels.response import Score, evaluate_scores
from kelr_dist.kernels.score_matching import FEATURE_ROWS
from kelr_dist.kernels.stein_correction import ExtendedScore, Features, refit_design


def _feature_sets(requests: Sequence[tuple[Score, Features]]) -> tuple[list[Features], list[int]]:
    """The distinct feature sets (by identity) and each request's index among them."""
    sets: list[Features] = []
    slots = []
    for _, features in requests:
        found = next((k for k, f in enumerate(sets) if f is features), None)
        if found is None:
            found = len(sets)
            sets.append(features)
        slots.append(found)
    return sets, slots


def refit_sums(requests: Sequence[tuple[Score, Features]], x: np.ndarray) -> dict[str, Any]:
    """On the rows ``x (n, d)``: ``moment`` per request ``Σ ŝ [z̃, φ]ᵀ`` ``(d, w)`` (``ŝ = 0``
    where the base keeps no row), and per feature set ``second`` ``Σ [z̃, φ][z̃, φ]ᵀ`` and
    ``divergence`` ``Σ ∂_j [z̃, φ]``; ``n``."""
    sets, slots = _feature_sets(requests)
    bases = [base for base, _ in requests]
    moment: list[Any] = [0.0] * len(requests)
    second: list[Any] = [0.0] * len(sets)
    divergence: list[Any] = [0.0] * len(sets)
    for rows in row_blocks(x.shape[0], FEATURE_ROWS):
        block = x[rows]
        designs = [refit_design(block, features) for features in sets]
        for k, (z, div) in enumerate(designs):
            second[k] = second[k] + z.T @ z
            divergence[k] = divergence[k] + div
        for r, (score, kept) in enumerate(evaluate_scores(bases, block)):
            s = np.where(kept[:, None], score, 0.0)
            moment[r] = moment[r] + s.T @ designs[slots[r]][0]
    return {"moment": moment, "second": second, "divergence": divergence, "n": x.shape[0]}


def _chunk(
    requests: Sequence[tuple[Score, Features]],
    stride: int,
    x: np.ndarray,
    info: BlockInfo,
    _halo: None,
) -> dict[str, Any]:
    return refit_sums(requests, x[-info.start % stride :: stride])


def _combine(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    return {
        key: a[key] + b[key] if key == "n" else [u + v for u, v in zip(a[key], b[key], strict=True)]
        for key in a
    }


def _finalize(
    requests: Sequence[tuple[Score, Features]], sums: dict[str, Any]
) -> list[ExtendedScore]:
    sets, slots = _feature_sets(requests)
    return [
        ExtendedScore.fit(
            base,
            features,
            sums["moment"][r],
            {
                "second": sums["second"][slots[r]],
                "divergence": sums["divergence"][slots[r]],
                "n": sums["n"],
            },
        )
        for r, (base, features) in enumerate(requests)
    ]


def refit_reduction(
    requests: Sequence[tuple[Score, Features]], stride: int = 1, name: str = "score refits"
) -> Reduction:
    """The read that refits each ``(base, features)`` of ``requests`` as ``base + V [z̃, φ]``
    (eq. 1; :class:`~kelr_dist.kernels.stein_correction.ExtendedScore`) on the rows whose time
    index is a multiple of ``stride``; finalizes to the refitted scores in the requests' order."""
    requests = tuple(requests)
    return Reduction(
        name=name,
        chunk=partial(_chunk, requests, stride),
        combine=_combine,
        finalize=partial(_finalize, requests),
    )
