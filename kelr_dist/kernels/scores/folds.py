"""Held-out folds of a trajectory that respect time correlation: whole chains or long blocks.

Held-out selection (:mod:`kelr_dist.kernels.scores.heldout`) fits every candidate on all folds but
one and scores
it on the one left out. Samples of a time series are correlated, so a fold must not interleave
with the others at the scale of the correlation time: with at least ``K`` chains a fold is a set of
whole chains (chain ``c`` goes to fold ``c mod K``); otherwise each chain is cut into ``K``
contiguous blocks of ``n / K`` rows (fold ``f`` holds rows ``[f n / K, (f + 1) n / K)`` of every
chain), which are much longer than the correlation time of any trajectory worth estimating a
response from (the response itself needs lags far shorter than the chain).

Fold membership depends only on the global time index and the chain, never on the chunking, so
partial sums split by fold add up to the same totals for any chunking.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from kelr_dist.kernels.checks import is_whole
from kelr_dist.kernels.reduction import BlockInfo

#: default number of folds
DEFAULT_FOLDS = 4
#: most folds: every partial carries each fold's coefficient sums and score-matching Gram
#: matrices (folds x P² floats), so a pass's cost grows with the folds (see docs/benchmarks.md,
#: section 'Tuning constants')
MAX_FOLDS = 20
#: fewest samples a fold may hold
MIN_FOLD_SAMPLES = 200


def fold_stderr(values: np.ndarray, axis: int = 0) -> np.ndarray | float:
    """Standard error of the mean over folds, ``sd(values, ddof=1) / sqrt(K)`` along ``axis``
    (NaN with fewer than two folds or a non-finite value). Computed on ``values / max |values|``
    and scaled back, so losses of data in very small units (``~1/scale²``, up to 1e300) do not
    overflow when squared."""
    values = np.asarray(values, dtype=np.float64)
    k = values.shape[axis]
    if k < 2:
        return np.full(np.delete(values.shape, axis), np.nan) if values.ndim > 1 else np.nan
    size = np.max(np.abs(values), axis=axis, keepdims=True)
    size = np.where(np.isfinite(size) & (size > 0), size, 1.0)
    with np.errstate(invalid="ignore"):  # a non-finite loss has a NaN spread, silently
        spread = np.std(values / size, axis=axis, ddof=1, keepdims=True) * size / np.sqrt(k)
    return np.squeeze(spread, axis=axis) if values.ndim > 1 else float(spread.item())


@dataclass(frozen=True)
class Folds:
    """``count`` folds of ``chains`` chains of ``chain_length`` rows (see the module docstring)."""

    count: int
    chains: int
    chain_length: int

    def __post_init__(self) -> None:
        if not is_whole(self.count, 2):
            raise ValueError(f"folds must be an integer >= 2, got {self.count!r}")
        smallest = self.sizes()
        if min(smallest) < MIN_FOLD_SAMPLES:
            raise ValueError(
                f"folds={self.count}: the trajectory ({self.chains} chain(s) x "
                f"{self.chain_length} samples) gives a fold of only {min(smallest)} samples; "
                f"each fold needs at least {MIN_FOLD_SAMPLES} (use fewer folds or more data)"
            )

    @property
    def by_chain(self) -> bool:
        """Whether a fold is a set of whole chains (at least ``count`` chains)."""
        return self.chains >= self.count

    def edge(self, fold: int) -> int:
        """First row of ``fold`` within a chain (contiguous folds)."""
        return fold * self.chain_length // self.count

    def sizes(self) -> list[int]:
        """Samples per fold."""
        if self.by_chain:
            return [
                len(range(f, self.chains, self.count)) * self.chain_length
                for f in range(self.count)
            ]
        return [self.chains * (self.edge(f + 1) - self.edge(f)) for f in range(self.count)]

    def segments(self, info: BlockInfo) -> Iterator[tuple[int, slice]]:
        """``(fold, rows)`` pieces of one block; ``rows`` index the block's own rows."""
        if self.by_chain:
            yield info.chain % self.count, slice(0, info.length)
            return
        for fold in range(self.count):
            lo, hi = max(self.edge(fold), info.start), min(self.edge(fold + 1), info.stop)
            if hi > lo:
                yield fold, slice(lo - info.start, hi - info.start)


def sums_by_fold(
    folds: Folds,
    empty: Callable[[], dict[str, Any]],
    sums: Callable[[np.ndarray, int], dict[str, Any]],
    x: np.ndarray,
    info: BlockInfo,
) -> list[dict[str, Any]]:
    """One block's sums per held-out fold: ``sums(rows, first_row)`` of each piece the block
    gives a fold (:meth:`Folds.segments`), ``empty()`` for the folds it gives nothing."""
    out = [empty() for _ in range(folds.count)]
    for fold, rows in folds.segments(info):
        out[fold] = sums(x[rows], info.start + rows.start)
    return out


def combine_by_fold(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Two blocks' :func:`sums_by_fold` added fold by fold, key by key."""
    return [{k: p[k] + q[k] for k in p} for p, q in zip(a, b, strict=True)]
