"""The one module that runs dask computations: reductions over a chunked trajectory.

Every pass of the estimate is a :class:`kelr_dist.reduction.Reduction`. This module maps its
``chunk`` kernel over the (chain, time-chunk) blocks of a lazily loaded trajectory on a Dask
cluster, tree-combines the partials on the workers and finalizes on the client, so that only
partial sums travel, never samples (apart from the few halo rows a lagged kernel needs).

The task graph, for blocks ``b[c, k]`` (chain ``c``, time chunk ``k``) and ``H`` the largest
halo of the reductions::

    load[c, k]   the trajectory's own task that reads the block (zarr, or in memory)
    head[c, k]   copy of the first min(H, rows) rows of load[c, k]            (k >= 1, H > 0)
    block[c, k]  (reduction_1.chunk(x, info, halo[:h_1]), ..., reduction_R.chunk(...))
                 x = load[c, k] as float64, halo = head[c, k+1], head[c, k+2], ... (the next
                 min(H, rows left in chain c) rows; it may span several short blocks)
    combine      split_every-ary tree over the blocks in (chain, time) order, element-wise per
                 reduction with reduction.combine; the root goes to the client for finalize.

Several reductions in one call share the loads: each block is read once per call. The tree's
shape depends only on the chunking, so a task recomputed after a lost worker gives the identical
result. Building the graph (:func:`build_graph`) computes nothing.
"""

from __future__ import annotations

import bisect
import sys
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import dask
import dask.array as da
import numpy as np
import xarray as xr
from dask.delayed import Delayed
from dask.highlevelgraph import HighLevelGraph
from distributed import Client, as_completed, get_worker
from tqdm.auto import tqdm

from kelr_dist.allocator import release_free_memory, tune_allocator
from kelr_dist.reduction import SYNCHRONOUS, BlockInfo, Partial, Reduction

__all__ = ["ReductionGraph", "build_graph", "run_reduction", "run_reductions"]

DIMS = ("chain", "time", "component")


@dataclass(frozen=True)
class ReductionGraph:
    """The lazy graph of one call: one task per block and the root of the combine tree.

    Attributes
    ----------
    blocks : one ``Delayed`` per (chain, time-chunk) block, giving the tuple of its partials
        (one per reduction), in (chain, time) order.
    total : ``Delayed`` of the tuple of fully combined partials (one per reduction).
    reductions : the reductions, in the order of the partials.
    """

    blocks: tuple[Delayed, ...]
    total: Delayed
    reductions: tuple[Reduction, ...]


def _as_float64(array: np.ndarray) -> np.ndarray:
    """A read-only float64 view (or copy) of ``array``: kernels must not modify their inputs."""
    out = np.asarray(array, dtype=np.float64).view()
    out.flags.writeable = False
    return out


def _head(block: np.ndarray, rows: int) -> np.ndarray:
    """Copy of the first ``rows`` rows of a ``(1, L, d)`` block, shape ``(rows, d)``."""
    return np.array(block[0, :rows], dtype=np.float64)


def _worker_memory_limit() -> int | None:
    """The memory limit of the Dask worker running this task (``None`` outside a worker)."""
    try:
        return get_worker().memory_manager.memory_limit
    except ValueError:
        return None


def _block_partials(
    block: np.ndarray,
    heads: list[np.ndarray],
    info: BlockInfo,
    halo_rows: int,
    reductions: tuple[Reduction, ...],
) -> tuple[Partial, ...]:
    """Partials of every reduction on one ``(1, L, d)`` block and its halo of ``halo_rows``."""
    tune_allocator(_worker_memory_limit())
    x = _as_float64(block[0])
    if heads:
        halo = _as_float64(np.concatenate(heads)[:halo_rows])
    else:
        halo = _as_float64(np.empty((0, x.shape[1])))
    partials = tuple(
        reduction.chunk(x, info, halo[: reduction.halo] if reduction.halo else None)
        for reduction in reductions
    )
    release_free_memory()  # nothing retained between tasks (see kelr_dist.allocator)
    return partials


def _combine(reductions: tuple[Reduction, ...], *parts: tuple[Partial, ...]) -> tuple:
    """Left fold of tuples of partials with each reduction's ``combine``."""
    total = parts[0]
    for part in parts[1:]:
        total = tuple(
            reduction.combine(a, b) for reduction, a, b in zip(reductions, total, part, strict=True)
        )
    return total


def _validate(trajectory: Any, reductions: Sequence[Reduction], split_every: int) -> da.Array:
    """The trajectory's dask array with one chain and all components per block."""
    if not isinstance(trajectory, xr.DataArray) or trajectory.dims != DIMS:
        dims = getattr(trajectory, "dims", None)
        raise ValueError(
            f"trajectory must be an xarray.DataArray with dims {DIMS}, got "
            f"{type(trajectory).__name__} with dims {dims}"
        )
    if not isinstance(trajectory.data, da.Array):
        raise ValueError(
            "trajectory must be backed by dask (open it with kelr_dist.store.open_trajectory "
            f"or call .chunk()), got {type(trajectory.data).__name__}"
        )
    if trajectory.shape[1] == 0:
        raise ValueError(f"trajectory has no samples (shape {trajectory.shape})")
    if any(np.isnan(c) for c in trajectory.data.chunks[1]):
        raise ValueError("trajectory has unknown chunk sizes along time")
    if not reductions or not all(isinstance(r, Reduction) for r in reductions):
        raise ValueError(f"reductions must be a non-empty sequence of Reduction, got {reductions}")
    for r in reductions:
        if isinstance(r.halo, bool) or not isinstance(r.halo, int | np.integer) or r.halo < 0:
            raise ValueError(f"reduction {r.name!r} has halo={r.halo!r}; need an integer >= 0")
    if isinstance(split_every, bool) or not isinstance(split_every, int) or split_every < 2:
        raise ValueError(f"split_every={split_every!r} must be an integer >= 2")
    return trajectory.data.rechunk({0: 1, 2: -1})


def build_graph(
    trajectory: xr.DataArray,
    reductions: Sequence[Reduction],
    *,
    split_every: int = 8,
) -> ReductionGraph:
    """Lazy graph running ``reductions`` over ``trajectory`` (see the module docstring).

    Parameters
    ----------
    trajectory : dask-backed ``DataArray`` with dims ``("chain", "time", "component")``,
        shape ``(chains, n, d)``, chunked along ``time``.
    reductions : the passes to run; they share the block loads.
    split_every : fan-in of the combine tree (>= 2).
    """
    reductions = tuple(reductions)
    data = _validate(trajectory, reductions, split_every)
    n = data.shape[1]
    edges = np.concatenate([[0], np.cumsum(data.chunks[1])]).astype(int).tolist()
    max_halo = max(int(r.halo) for r in reductions)
    prefix = f"kelr-{'-'.join(r.name for r in reductions)}-{uuid.uuid4().hex[:12]}"

    loads = data.__dask_keys__()  # [chain][time chunk][0] -> key of the block's load task
    shared = f"{prefix}-reductions"
    layer: dict[Any, Any] = {shared: reductions}
    blocks = []
    for c in range(data.shape[0]):
        heads = [(f"{prefix}-head", c, k) for k in range(len(edges) - 1)]
        if max_halo > 0:
            for k in range(1, len(edges) - 1):
                rows = min(max_halo, edges[k + 1] - edges[k])
                layer[heads[k]] = (_head, loads[c][k][0], rows)
        for k, (start, stop) in enumerate(zip(edges[:-1], edges[1:], strict=True)):
            halo_rows = min(max_halo, n - stop)
            last = bisect.bisect_left(edges, stop + halo_rows)  # blocks k+1..last-1 hold the halo
            key = (f"{prefix}-block", c, k)
            info = BlockInfo(c, start, stop, n)
            layer[key] = (
                _block_partials,
                loads[c][k][0],
                heads[k + 1 : last],
                info,
                halo_rows,
                shared,
            )
            blocks.append(key)
    root = _tree(layer, blocks, shared, split_every, f"{prefix}-combine")
    graph = HighLevelGraph.from_collections(prefix, layer, dependencies=[data])
    return ReductionGraph(
        tuple(Delayed(key, graph, layer=prefix) for key in blocks),
        Delayed(root, graph, layer=prefix),
        reductions,
    )


def _tree(layer: dict, keys: list, shared: str, split_every: int, name: str) -> Any:
    """Add a ``split_every``-ary combine tree over ``keys`` (in order) to ``layer``; its root."""
    level = 0
    while len(keys) > 1:
        groups = [keys[j : j + split_every] for j in range(0, len(keys), split_every)]
        keys = []
        for i, group in enumerate(groups):
            if len(group) == 1:
                keys.append(group[0])
                continue
            keys.append((name, level, i))
            layer[keys[-1]] = (_combine, shared, *group)
        level += 1
    return keys[0]


def _show_progress(progress: bool | None) -> bool:
    return progress if progress is not None else sys.stderr.isatty()


def run_reductions(
    trajectory: xr.DataArray,
    reductions: Sequence[Reduction],
    client: Client | str,
    *,
    split_every: int = 8,
    progress: bool | None = None,
) -> list[Any]:
    """Run several reductions over a trajectory on a Dask cluster, sharing the block loads.

    Parameters
    ----------
    trajectory : dask-backed ``DataArray`` with dims ``("chain", "time", "component")``,
        shape ``(chains, n, d)``, chunked along ``time`` (e.g. from
        ``kelr_dist.store.open_trajectory``).
    reductions : the passes; each ``chunk`` gets one block ``(L, d)`` float64 of one chain,
        its :class:`BlockInfo` and the next ``min(halo, rows left)`` rows of that chain.
    client : the ``distributed.Client`` to run on (see :func:`kelr_dist.cluster.get_client`),
        or ``"synchronous"``: the same graph in this process (dask's synchronous scheduler).
    split_every : fan-in of the combine tree on the workers.
    progress : tqdm bar over completed blocks on stderr; ``None``: when stderr is a terminal.

    Returns
    -------
    ``[reduction.finalize(combined partial) for reduction in reductions]``; the same as
    :func:`kelr_dist.reduction.reduce_in_memory` on the whole array, up to rounding.

    Raises
    ------
    ValueError
        Invalid trajectory, reductions or ``split_every``.
    Exception
        An exception raised by a kernel, re-raised with its own type and message.
    """
    graph = build_graph(trajectory, reductions, split_every=split_every)
    if client == SYNCHRONOUS:
        (partials,) = dask.compute(graph.total, scheduler="synchronous", optimize_graph=False)
        return [r.finalize(p) for r, p in zip(graph.reductions, partials, strict=True)]
    futures = client.compute([*graph.blocks, graph.total], optimize_graph=False)
    total = futures.pop()
    bar = tqdm(
        total=len(futures),
        desc=", ".join(r.name for r in graph.reductions),
        unit="block",
        disable=not _show_progress(progress),
        file=sys.stderr,
    )
    done = as_completed(futures, loop=client.loop)
    del futures  # block partials are released as soon as they are counted
    with bar:
        for future in done:
            if future.status == "error":
                future.result()  # re-raises the kernel's exception
            bar.update()
    partials = total.result()
    return [r.finalize(p) for r, p in zip(graph.reductions, partials, strict=True)]


def run_reduction(
    trajectory: xr.DataArray,
    reduction: Reduction,
    client: Client | str,
    *,
    split_every: int = 8,
    progress: bool | None = None,
) -> Any:
    """Run one reduction over a trajectory on a Dask cluster (see :func:`run_reductions`)."""
    return run_reductions(
        trajectory, [reduction], client, split_every=split_every, progress=progress
    )[0]
