"""Every ``k``-th sample of a trajectory, gathered in one pass (a pilot's subsample).

The rows kept are those at time indices ``0, k, 2k, ...`` of each chain, as
``trajectory.isel(time=slice(None, None, k))`` keeps them: a block of rows ``[start, stop)``
keeps its row ``(-start) mod k`` and every ``k``-th after it. Each block's rows are keyed by
where the block sits, so the merge of partials is associative and commutative (any split and any
order of combination give the same result).
"""

from __future__ import annotations

from functools import partial

import numpy as np

from kelr_dist.kernels.checks import is_whole
from kelr_dist.kernels.reduction import BlockInfo, Partial, Reduction


def _strided_rows(stride: int, x: np.ndarray, info: BlockInfo, _halo: np.ndarray | None) -> Partial:
    return {(info.chain, info.start): np.array(x[(-info.start) % stride :: stride])}


def _merge(a: Partial, b: Partial) -> Partial:
    return {**a, **b}


def _stack(partial_rows: Partial) -> np.ndarray:
    """``(chains, rows, d)``: each chain's blocks in time order."""
    chains: dict[int, list[np.ndarray]] = {}
    for (chain, _), rows in sorted(partial_rows.items()):
        chains.setdefault(chain, []).append(rows)
    return np.stack([np.concatenate(chains[c]) for c in sorted(chains)])


def strided_rows_reduction(stride: int) -> Reduction:
    """The samples at time indices ``0, stride, 2 stride, ...`` of every chain: finalizes to
    ``(chains, ceil(n / stride), d)``, in the trajectory's dtype."""
    if not is_whole(stride, 1):
        raise ValueError(f"stride must be a whole number >= 1, got {stride!r}")
    return Reduction(
        name="subsample",
        chunk=partial(_strided_rows, int(stride)),
        combine=_merge,
        finalize=_stack,
    )
