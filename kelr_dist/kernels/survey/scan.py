"""A pass that counts the non-finite values (NaN, ±inf) of a trajectory and finds the first ones.

``kelr info --scan`` runs it through the engine, one block of one chain at a time, so a store
of any size is scanned in the memory of one block. Positions are ``(chain, time index,
component index)``; the partial keeps the ``first`` positions in that (lexicographic) order, so
combining partials in any order gives the same result.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np

from kelr_dist.kernels.reduction import BlockInfo, Partial, Reduction

#: positions reported by default
FIRST = 10


@dataclass(frozen=True)
class NonFinite:
    """The scan's result: ``count`` non-finite values, ``by_component (d,)`` counts, and the
    first ``positions (k, 3)`` ``(chain, time, component)`` with their ``values (k,)``."""

    count: int
    by_component: np.ndarray
    positions: np.ndarray
    values: np.ndarray


def _chunk(first: int, x: np.ndarray, info: BlockInfo, _halo: np.ndarray | None) -> Partial:
    bad = ~np.isfinite(x)
    rows, columns = np.nonzero(bad)  # row-major: time, then component
    rows, columns = rows[:first], columns[:first]
    positions = np.stack([np.full(rows.shape, info.chain), rows + info.start, columns], axis=1)
    return {
        "count": int(bad.sum()),
        "by_component": bad.sum(axis=0).astype(np.int64),
        "positions": positions.astype(np.int64).reshape(-1, 3),
        "values": np.asarray(x[rows, columns], dtype=np.float64),
    }


def _combine(first: int, a: Partial, b: Partial) -> Partial:
    positions = np.concatenate([a["positions"], b["positions"]])
    values = np.concatenate([a["values"], b["values"]])
    order = np.lexsort(positions.T[::-1])[:first]
    return {
        "count": a["count"] + b["count"],
        "by_component": a["by_component"] + b["by_component"],
        "positions": positions[order],
        "values": values[order],
    }


def _finalize(partial: Partial) -> NonFinite:
    return NonFinite(
        int(partial["count"]),
        np.asarray(partial["by_component"]),
        np.asarray(partial["positions"]),
        np.asarray(partial["values"]),
    )


def nonfinite_reduction(first: int = FIRST) -> Reduction:
    """The scan as a :class:`~kelr_dist.kernels.reduction.Reduction` (no halo)."""
    return Reduction(
        "scan",
        partial(_chunk, first),
        combine=partial(_combine, first),
        finalize=_finalize,
    )
