"""Partial-sum reductions: the contract between the core kernels and the engine.

Every pass of the estimate (moments, coefficient sums, the criteria sweep, lagged sums,
error-bar sums, KDE bins) is one :class:`Reduction`: a ``chunk`` kernel that turns one
in-memory block of a trajectory into a small *partial* (a dict of numpy arrays and
numbers), an associative and commutative ``combine`` (usually :func:`add_partials`), and a
``finalize`` that turns the combined partial into the result.

This module knows nothing of dask. :func:`reduce_in_memory` is the reference executor used
by the in-memory path and by the tests (any split into blocks must give the same result);
:mod:`kelr_dist.engine.passes` runs the same reductions over chunked stores on a Dask cluster.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

Partial = Any  # a number, a numpy array, or a (nested) dict of them

#: the executor name that runs a pass in this process, without a Dask cluster
SYNCHRONOUS = "synchronous"


@dataclass(frozen=True)
class BlockInfo:
    """Where a block sits in the trajectory.

    Attributes
    ----------
    chain : index of the independent chain the block belongs to.
    start, stop : rows ``[start, stop)`` of that chain (time indices).
    chain_length : number of samples in the chain.
    """

    chain: int
    start: int
    stop: int
    chain_length: int

    @property
    def length(self) -> int:
        return self.stop - self.start


ChunkKernel = Callable[[np.ndarray, BlockInfo, "np.ndarray | None"], Partial]


def add_partials(a: Partial, b: Partial) -> Partial:
    """Element-wise sum of two partials of the same structure (dicts are merged key by key)."""
    if isinstance(a, Mapping):
        return {k: add_partials(a[k], b[k]) for k in a}
    return a + b


def _finalize_identity(partial: Partial) -> Partial:
    return partial


@dataclass(frozen=True)
class Reduction:
    """One pass over a trajectory: ``finalize(combine(chunk(block_1), chunk(block_2), ...))``.

    Attributes
    ----------
    name : short label shown in progress bars.
    chunk : ``chunk(x, info, halo) -> partial`` with ``x`` of shape ``(L, d)`` (one block of one
        chain), ``info`` a :class:`BlockInfo` and ``halo`` the next ``min(halo, rows left)``
        rows of the same chain, shape ``(h, d)`` (``None`` when ``halo == 0``). It must not
        modify its inputs.
    combine : associative, commutative merge of two partials.
    finalize : turns the fully combined partial into the pass result.
    halo : rows of look-ahead the chunk kernel needs (the maximum lag ``S`` for lagged sums).
    partial_bytes : the size of one partial, about (0: small or not known); the engine narrows
        the combine tree where the partials are large, so that a combine task holds a bounded
        amount of them.
    """

    name: str
    chunk: ChunkKernel
    combine: Callable[[Partial, Partial], Partial] = add_partials
    finalize: Callable[[Partial], Any] = _finalize_identity
    halo: int = 0
    partial_bytes: int = 0


def block_bounds(n: int, chunk_lengths: Sequence[int] | int) -> list[tuple[int, int]]:
    """Split ``range(n)`` into consecutive ``[start, stop)`` blocks of the given lengths.

    ``chunk_lengths`` is either one length (the last block takes what is left) or the full
    list of lengths, which must add up to ``n``.
    """
    if isinstance(chunk_lengths, int | np.integer):
        if chunk_lengths <= 0:
            raise ValueError(f"chunk length must be positive, got {chunk_lengths}")
        edges = list(range(0, n, int(chunk_lengths))) + [n]
    else:
        edges = [0, *np.cumsum(chunk_lengths).tolist()]
        if edges[-1] != n:
            raise ValueError(f"chunk lengths add up to {edges[-1]}, not to the {n} samples")
    return [(a, b) for a, b in zip(edges[:-1], edges[1:], strict=True) if b > a]


def reduce_in_memory(
    reduction: Reduction,
    x: np.ndarray,
    chunks: Sequence[int] | int | None = None,
) -> Any:
    """Run ``reduction`` over an in-memory trajectory, block by block (reference executor).

    Parameters
    ----------
    x : ``(n, d)`` for one chain or ``(chains, n, d)``.
    chunks : block length(s) along time; ``None`` means one block per chain.
    """
    x = np.asarray(x)
    chains = x[None] if x.ndim == 2 else x
    partial = None
    for c, series in enumerate(chains):
        n = series.shape[0]
        for start, stop in block_bounds(n, n if chunks is None else chunks):
            halo = series[stop : stop + reduction.halo] if reduction.halo else None
            part = reduction.chunk(series[start:stop], BlockInfo(c, start, stop, n), halo)
            partial = part if partial is None else reduction.combine(partial, part)
    if partial is None:
        raise ValueError("the trajectory has no samples")
    return reduction.finalize(partial)
