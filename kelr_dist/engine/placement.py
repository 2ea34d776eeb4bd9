"""Trajectories put on the cluster: in-memory input sent once, small stores read once.

Both return the trajectory backed by futures of its blocks, held by the workers, which the
passes' graphs reference by key: :func:`scatter_trajectory` for data already in the caller's
memory (a numpy-backed array), sent with ``Client.scatter``; :func:`keep_in_memory` for a store
whose float64 samples fit in :data:`KEEP_FRACTION` of the cluster's memory, read on the workers
with ``Client.persist``. The blocks are spread so that every worker thread holds the same rows
to within one block (:func:`spread`): each pass's tasks run where their blocks are.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from typing import Any

import dask.array as da
import numpy as np
import xarray as xr
from dask.highlevelgraph import HighLevelGraph
from distributed import Client, Future, futures_of

from kelr_dist.data.store import IN_MEMORY
from kelr_dist.engine.graph import DIMS, naming_the_worker, task_target
from kelr_dist.engine.reading import store_rows

#: a store-backed trajectory is kept in the workers' memory after its first read when its
#: float64 samples take at most this fraction of the cluster's memory (the rest is the passes'
#: working memory and dask's spill margin)
KEEP_FRACTION = 0.25


def cluster_memory(client: Client) -> int:
    """Total ``memory_limit`` of the client's workers in bytes (0 when unknown or unlimited)."""
    workers = client.scheduler_info().get("workers", {})
    return int(sum(w.get("memory_limit") or 0 for w in workers.values()))


def on_cluster(data: da.Array) -> bool:
    """Whether every block of ``data`` is a future already (nothing is computed to read it)."""
    graph = data.__dask_graph__()
    return len(graph) == data.npartitions and len(futures_of(data)) == data.npartitions


def _in_memory(data: da.Array) -> bool:
    """Whether ``data``'s graph is only its blocks (data held in the graph, or futures)."""
    return len(data.__dask_graph__()) == data.npartitions


def spread(rows: Sequence[int], client: Client) -> dict[tuple[str, ...] | None, list[int]]:
    """Blocks (their rows, in chain, time order) per worker, as ``(address,)``: the worker
    threads take consecutive runs of blocks of equal rows, the block whose middle row falls in
    a thread's share of all the rows going to it. Every thread then holds the same rows to
    within a block, so each pass's tasks, which run where their blocks are, keep all cores busy
    to the end; and a block's successor is on the same worker except at the runs' ends, so the
    first rows it lends as a halo (:func:`kelr_dist.engine.graph.build_graph`) stay there
    instead of crossing to another worker in every pass (see docs/benchmarks.md, section
    'Tuning constants'). With no worker connected yet, all blocks go to ``None`` (any worker:
    dask waits for one)."""
    threads = [w for w, k in sorted(client.nthreads().items()) for _ in range(k)]
    if not threads:
        return {None: list(range(len(rows)))}
    total = max(sum(int(n) for n in rows), 1)
    placed: dict[tuple[str, ...] | None, list[int]] = {}
    before = 0
    for i, n in enumerate(rows):
        middle = before + int(n) / 2
        thread = min(int(middle * len(threads) / total), len(threads) - 1)
        placed.setdefault((threads[thread],), []).append(i)
        before += int(n)
    return placed


def _place_spread(
    blocks: da.Array,
    client: Client,
    place: Callable[[list[int], tuple[str, ...] | None], list[Future]],
) -> da.Array:
    """``blocks`` (one chain and all components per block) as an array backed by futures (same
    keys): ``place(indices, workers)`` puts the blocks of those flat indices on ``workers`` and
    returns their futures; the blocks are spread by :func:`spread`."""
    keys = [part.key for part in blocks.to_delayed().ravel()]
    lengths = [
        blocks.chunks[1][k] for _ in range(blocks.numblocks[0]) for k in range(blocks.numblocks[1])
    ]
    futures: dict[Any, Future] = {}
    for workers, run in spread(lengths, client).items():
        futures.update(zip((keys[i] for i in run), place(run, workers), strict=True))
    graph = HighLevelGraph.from_collections(blocks.name, futures, dependencies=())
    return da.Array(
        graph,
        blocks.name,
        blocks.chunks,
        dtype=blocks.dtype,
        meta=np.empty((0, 0, 0), dtype=blocks.dtype),
    )


def _persist_spread(blocks: da.Array, client: Client) -> da.Array:
    """``blocks`` computed on the workers (``Client.persist``), placed by :func:`spread`."""
    parts = blocks.to_delayed().ravel()

    def persist(run: list[int], workers: tuple[str, ...] | None) -> list[Future]:
        # loose restrictions: a block lost with its worker is computed again elsewhere
        kept = client.persist([parts[i] for i in run], workers=workers, allow_other_workers=True)
        return [futures_of(delayed)[0] for delayed in kept]

    return _place_spread(blocks, client, persist)


def _scatter_spread(blocks: da.Array, client: Client) -> da.Array:
    """``blocks`` held in this process sent straight to the workers (``Client.scatter``), placed
    by :func:`spread`: the data never pass through the scheduler in a graph."""
    parts = blocks.to_delayed().ravel()

    def scatter(run: list[int], workers: tuple[str, ...] | None) -> list[Future]:
        arrays = [np.asarray(parts[i].compute(scheduler="sync")) for i in run]
        return list(client.scatter(arrays, workers=workers, hash=False))

    return _place_spread(blocks, client, scatter)


def scatter_trajectory(trajectory: xr.DataArray, client: Client | str) -> xr.DataArray:
    """``trajectory`` with its in-memory blocks put on the cluster once, referenced by key.

    A numpy-backed trajectory (e.g. :func:`kelr_dist.data.store.as_trajectory` of an array) holds
    its samples in its dask graph; every pass would ship them to the scheduler again. This sends
    each block to a worker once and returns the same ``DataArray`` backed by those futures:
    graphs built from it hold keys only. The data stay on the cluster while the returned object
    (or a graph built from it) is alive. Run several passes over the returned trajectory to send
    the data once in all.

    Anything else (a lazy or store-backed trajectory, one already on the cluster,
    ``client="synchronous"``, not a dask-backed ``DataArray``) is returned unchanged.
    """
    if isinstance(client, str) or not isinstance(trajectory, xr.DataArray):  # SYNCHRONOUS
        return trajectory
    data = trajectory.data
    if not isinstance(data, da.Array) or trajectory.dims != DIMS:
        return trajectory  # run_reductions says what is wrong
    if trajectory.attrs.get("store", IN_MEMORY) != IN_MEMORY:
        return trajectory  # read from its store by the tasks
    if not _in_memory(data) or on_cluster(data):
        return trajectory
    return trajectory.copy(data=_scatter_spread(data.rechunk({0: 1, 2: -1}), client))


def keep_in_memory(
    trajectory: xr.DataArray, client: Client | str, fraction: float = KEEP_FRACTION
) -> tuple[xr.DataArray, bool]:
    """``trajectory`` persisted on the workers when it fits, and whether it was.

    A store-backed trajectory is read from the store by every pass. When its samples (as
    float64) take at most ``fraction`` of the cluster's memory, this returns it backed by
    futures of its blocks (about :data:`kelr_dist.engine.graph.TASK_BYTES` each, one chain
    each, each read by one task), which the workers start loading at once: the store is read
    once for all passes, and the blocks are released with the returned object. The blocks are
    spread evenly over the worker threads (:func:`spread`).
    Larger trajectories, numpy input already scattered, and ``client="synchronous"`` are
    returned unchanged (``False``): each pass reads the store again, out of core.
    """
    if isinstance(client, str) or not isinstance(trajectory, xr.DataArray):  # SYNCHRONOUS
        return trajectory, False
    data = trajectory.data
    if not isinstance(data, da.Array) or any(np.isnan(c) for c in data.chunks[1]):
        return trajectory, False
    nbytes = int(np.prod(data.shape)) * 8
    if nbytes > fraction * cluster_memory(client) or on_cluster(data):
        return trajectory, False
    chunk = max(data.chunks[1])
    rows = max(1, task_target(None, nbytes) // (data.shape[2] * 8) // chunk) * chunk
    reader = store_rows(trajectory)
    if reader is not None:  # one read task per block, whatever the store's chunks
        source = da.map_blocks(
            _read_block,
            dtype=np.float64,
            chunks=((1,) * data.shape[0], _split(data.shape[1], rows), (data.shape[2],)),
            meta=np.empty((0, 0, 0)),
            name=f"kelr-kept-{uuid.uuid4().hex[:12]}",
            reader=reader,
        )
    else:
        source = data.astype(np.float64).rechunk({0: 1, 1: rows, 2: -1})
    return trajectory.copy(data=_persist_spread(source, client)), True


def _split(n: int, rows: int) -> tuple[int, ...]:
    """``n`` rows in blocks of ``rows`` (the last one shorter)."""
    return (rows,) * (n // rows) + ((n % rows,) if n % rows else ())


@naming_the_worker
def _read_block(reader: Any, block_info: dict[Any, Any]) -> np.ndarray:
    """One ``(1, L, d)`` float64 block of a store, read by its own task (``map_blocks``)."""
    (chain, _), (start, stop), _ = block_info[None]["array-location"]
    return np.asarray(reader.read(chain, start, stop), dtype=np.float64)[None]
