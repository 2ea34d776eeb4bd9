"""The one module that runs dask computations: reductions over a chunked trajectory.

Every pass of the estimate is a :class:`kelr_dist.kernels.reduction.Reduction`. This module maps its
``chunk`` kernel over the (chain, time-chunk) blocks of a lazily loaded trajectory on a Dask
cluster, tree-combines the partials on the workers and finalizes on the client, so that only
partial sums travel, never samples (apart from the few halo rows a lagged kernel needs).

The task graph, for blocks ``b[c, k]`` (chain ``c``, time chunk ``k``) and ``H`` the largest
halo of the reductions::

    load[c, k]   the trajectory's own task that reads the block (zarr, or in memory)
    head[c, k]   copy of the first min(H, rows) rows of load[c, k]       (blocks in a halo)
    block[c, g]  (reduction_1.chunk(x, info, halo[:h_1]), ..., reduction_R.chunk(...))
                 x = load[c, k0], ..., load[c, k1 - 1] joined, as float64 (task g covers the
                 consecutive store chunks k0..k1-1 of chain c, see below), halo = head[c, k1],
                 head[c, k1+1], ... (the next min(H, rows left in chain c) rows; it may span
                 several short blocks)
    combine      split_every-ary tree over the blocks in (chain, time) order, element-wise per
                 reduction with reduction.combine; the root goes to the client for finalize.

Store chunks smaller than a byte target are coalesced: a task takes as many consecutive chunks
of one chain as fit in ``task_bytes`` (:data:`TASK_BYTES`, 16 MiB, by default; at least one
chunk), so a store of 4096-row chunks does not become millions of tasks per pass. By default the
target is also at most a :data:`MIN_TASKS`-th of the trajectory, so that a small trajectory
still spreads over the workers.

In-memory (numpy-backed) trajectories are put on the cluster once (:func:`scatter_trajectory`)
and referenced by the graph, never embedded in it. Before its kernels run, every task caps the
BLAS/OpenMP thread pools of its worker process at the worker's share of the cores
(``dask.system.CPU_COUNT`` divided by the worker's threads; threadpoolctl; a pool is never
raised), whatever environment the worker was started in; it also tunes the worker's glibc
allocator for its memory limit and gives the freed heap back after its kernels
(:mod:`kelr_dist.engine.allocator`). Neither happens in the caller's process (``"synchronous"``).

Several reductions in one call share the loads: each block is read once per call. The tree's
shape depends only on the chunking, so a task recomputed after a lost worker gives the identical
result. Building the graph (:func:`build_graph`) computes nothing.
"""

from __future__ import annotations

import bisect
import os
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import CancelledError
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import dask
import dask.array as da
import numpy as np
import xarray as xr
from dask.delayed import Delayed
from dask.highlevelgraph import HighLevelGraph, MaterializedLayer
from distributed import Client, KilledWorker, as_completed, get_worker
from tqdm.auto import tqdm

from kelr_dist.engine.allocator import release_free_memory, tune_allocator
from kelr_dist.engine.cluster import ClusterError, memory_kills, thread_share
from kelr_dist.kernels.checks import is_whole
from kelr_dist.kernels.reduction import SYNCHRONOUS, BlockInfo, Partial, Reduction

__all__ = [
    "MIN_TASKS",
    "TASK_BYTES",
    "ReductionGraph",
    "build_graph",
    "cluster_memory",
    "keep_in_memory",
    "observe_graphs",
    "run_reduction",
    "run_reductions",
    "scatter_trajectory",
]

DIMS = ("chain", "time", "component")
#: default byte target of one task: consecutive store chunks of a chain up to this size are
#: read and reduced by one task (as stored; a single larger chunk is a task of its own). A task
#: holds its chunks and their float64 join (up to twice this) besides the kernels' own tables,
#: within a small worker's memory (the out-of-core test runs 300 MiB workers); at 16 MiB the
#: per-task overhead (~1 ms on the scheduler) is well under 1% of the task's kernels.
TASK_BYTES = 16 * 2**20
#: with the default target, a task holds at most this fraction of the trajectory (1/MIN_TASKS)
MIN_TASKS = 32
#: a pass fails (ClusterError) after this many seconds in which none of its tasks finished and
#: no worker connected for WORKER_SETTLE seconds was running a task: its workers keep dying
#: without dask blaming a task (killed by their nanny for memory at start-up or between tasks),
#: there are none (LocalCluster closes for good a nanny whose worker stays lost 15 s), or a
#: task is stuck (dask leaves a task whose loose worker restriction names a lost worker in
#: 'no-worker' when the other workers were lost too, e.g. keep_in_memory's loads); dask itself
#: would wait forever
NO_WORKERS_TIMEOUT = 30.0
#: seconds a worker must stay connected to count as alive (restart loops last ~1-4 s each)
WORKER_SETTLE = 10.0
#: seconds between two looks at the scheduler's workers while a pass waits
WATCH_INTERVAL = 1.0


@dataclass(frozen=True)
class ReductionGraph:
    """The lazy graph of one call: one task per block and the root of the combine tree.

    Attributes
    ----------
    blocks : one ``Delayed`` per task (a run of consecutive store chunks of one chain),
        giving the tuple of its partials (one per reduction), in (chain, time) order.
    total : ``Delayed`` of the tuple of fully combined partials (one per reduction).
    reductions : the reductions, in the order of the partials.
    task_edges : row boundaries of the tasks within a chain (the same for every chain):
        task ``g`` of chain ``c`` reduces rows ``task_edges[g]:task_edges[g + 1]``.
    """

    blocks: tuple[Delayed, ...]
    total: Delayed
    reductions: tuple[Reduction, ...]
    task_edges: tuple[int, ...] = ()


def _as_float64(array: np.ndarray) -> np.ndarray:
    """A read-only float64 view (or copy) of ``array``: kernels must not modify their inputs."""
    out = np.asarray(array, dtype=np.float64).view()
    out.flags.writeable = False
    return out


def _head(block: np.ndarray, rows: int) -> np.ndarray:
    """Copy of the first ``rows`` rows of a ``(1, L, d)`` block, shape ``(rows, d)``."""
    return np.array(block[0, :rows], dtype=np.float64)


def _worker() -> Any:
    """The Dask worker running this task (``None`` outside a worker)."""
    try:
        return get_worker()
    except ValueError:
        return None


def _cap_thread_pools(threads: int) -> None:
    """Lower the BLAS/OpenMP pools of this process that exceed ``threads`` threads to it.

    Pools at or below ``threads`` are left alone (a worker's nanny starts one thread per process
    unless the caller's environment says otherwise). Called on a worker before its kernels run,
    and not undone: the share belongs to the worker, and the pools are process-wide, so putting
    them back after a task would lift the cap under a task still running in another thread.
    """
    from threadpoolctl import ThreadpoolController

    for library in ThreadpoolController().lib_controllers:
        if library.num_threads > threads:
            library.set_num_threads(threads)


def _block_partials(
    loads: list[np.ndarray],
    heads: list[np.ndarray],
    where: tuple[int, int, int, int],
    halo_rows: int,
    reductions: tuple[Reduction, ...],
) -> tuple[Partial, ...]:
    """Partials of every reduction on consecutive ``(1, L_i, d)`` blocks of one chain (joined)
    and the halo of ``halo_rows`` rows after them; ``where`` holds the fields of their
    :class:`BlockInfo` (a plain tuple is half the bytes in the graph)."""
    info = BlockInfo(*where)
    worker = _worker()
    if worker is not None:  # allocator and thread pools: on workers only, never the caller's
        tune_allocator(worker.memory_manager.memory_limit)
        _cap_thread_pools(thread_share(1, worker.state.nthreads))
    x = _as_float64(loads[0][0] if len(loads) == 1 else np.concatenate([b[0] for b in loads]))
    if heads:
        halo = _as_float64(np.concatenate(heads)[:halo_rows])
    else:
        halo = _as_float64(np.empty((0, x.shape[1])))
    partials = tuple(
        reduction.chunk(x, info, halo[: reduction.halo] if reduction.halo else None)
        for reduction in reductions
    )
    release_free_memory()  # nothing retained between tasks (see kelr_dist.engine.allocator)
    return partials


def _task_groups(lengths: Sequence[int], row_bytes: int, task_bytes: int) -> list[tuple[int, int]]:
    """Runs ``[k0, k1)`` of consecutive chunks (rows ``lengths``) of at most ``task_bytes``
    together (at least one chunk each), in order."""
    groups: list[tuple[int, int]] = []
    start, size = 0, 0
    for k, rows in enumerate(lengths):
        nbytes = int(rows) * row_bytes
        if k > start and size + nbytes > task_bytes:
            groups.append((start, k))
            start, size = k, 0
        size += nbytes
    groups.append((start, len(lengths)))
    return groups


def scatter_trajectory(trajectory: xr.DataArray, client: Client | str) -> xr.DataArray:
    """``trajectory`` with its in-memory blocks put on the cluster once, referenced by key.

    A numpy-backed trajectory (e.g. :func:`kelr_dist.data.store.as_trajectory` of an array) holds
    its
    samples in its dask graph; every pass would ship them to the scheduler again. This sends
    each block to a worker once (``client.scatter``) and returns the same ``DataArray`` backed
    by those futures: graphs built from it hold keys only. The data stay on the cluster while
    the returned object (or a graph built from it) is alive. Run several passes over the
    returned trajectory to send the data once in all.

    Anything else (a store-backed trajectory, ``client="synchronous"``, not a dask-backed
    ``DataArray``) is returned unchanged.
    """
    if client == SYNCHRONOUS or not isinstance(trajectory, xr.DataArray):
        return trajectory
    data = trajectory.data
    if not isinstance(data, da.Array):
        return trajectory
    layer = data.dask.layers.get(data.name)
    if not isinstance(layer, MaterializedLayer):
        return trajectory
    keys = list(dask.core.flatten(data.__dask_keys__()))
    blocks = [layer.get(key) for key in keys]
    if not all(isinstance(block, np.ndarray) for block in blocks):
        return trajectory
    futures = {}
    for worker, run in _spread([b.shape[1] for b in blocks], client).items():
        sent = client.scatter([blocks[i] for i in run], workers=worker, hash=False)
        futures.update(zip(run, sent, strict=True))
    name = f"kelr-scattered-{uuid.uuid4().hex[:12]}"
    return trajectory.copy(data=_array_of_futures(data, name, futures))


def _spread(rows: Sequence[int], client: Client) -> dict[tuple[str, ...] | None, list[int]]:
    """Blocks (their rows, in chain, time order) per worker, as ``(address,)``: each block in
    turn goes to the worker thread with the fewest rows so far, so every thread gets the same
    rows to within a block and each pass's tasks, which run where their blocks are, keep both
    cores busy to the end (measured: dask's own placement of a 1e7-row store's ten blocks left
    one worker with both short chain ends and the other idle for 2 s of a 10.7 s pass; spread,
    the estimate took 16.7-18.2 s against 19.9-22.3 s, alternating fresh runs). With no worker
    connected yet, all blocks go to ``None`` (any worker: dask waits for one)."""
    threads = [w for w, k in sorted(client.nthreads().items()) for _ in range(k)]
    if not threads:
        return {None: list(range(len(rows)))}
    load = [0] * len(threads)
    placed: dict[tuple[str, ...] | None, list[int]] = {}
    for i, n in enumerate(rows):
        t = load.index(min(load))
        load[t] += int(n)
        placed.setdefault((threads[t],), []).append(i)
    return placed


def _array_of_futures(data: da.Array, name: str, futures: dict[int, Any]) -> da.Array:
    """``data``'s layout, named ``name``, backed by the futures of its blocks (position in
    ``data.__dask_keys__()`` order -> future): a graph built from it holds keys only."""
    keys = list(dask.core.flatten(data.__dask_keys__()))
    mapping = {(name, *key[1:]): futures[i] for i, key in enumerate(keys)}
    graph = HighLevelGraph.from_collections(name, mapping, dependencies=[])
    return da.Array(graph, name, data.chunks, dtype=data.dtype, meta=data._meta)


#: a store-backed trajectory is kept in the workers' memory after its first read when its
#: float64 samples take at most this fraction of the cluster's memory (the rest is the passes'
#: working memory and dask's spill margin)
KEEP_FRACTION = 0.25


def cluster_memory(client: Client) -> int:
    """Total ``memory_limit`` of the client's workers in bytes (0 when unknown or unlimited)."""
    workers = client.scheduler_info().get("workers", {})
    return int(sum(w.get("memory_limit") or 0 for w in workers.values()))


def keep_in_memory(
    trajectory: xr.DataArray, client: Client | str, fraction: float = KEEP_FRACTION
) -> tuple[xr.DataArray, bool]:
    """``trajectory`` persisted on the workers when it fits, and whether it was.

    A store-backed trajectory is read from the store by every pass. When its samples (as
    float64) take at most ``fraction`` of the cluster's memory, this returns it backed by
    futures of its blocks (about :data:`TASK_BYTES` each, one chain each), which the workers
    start loading at once: the store is read once for all passes, and the blocks are released
    with the returned object. The blocks are spread evenly over the worker threads
    (:func:`_spread`).
    Larger trajectories, numpy input already scattered, and ``client="synchronous"`` are
    returned unchanged (``False``): each pass reads the store again, out of core.
    """
    if client == SYNCHRONOUS or not isinstance(trajectory, xr.DataArray):
        return trajectory, False
    data = trajectory.data
    if not isinstance(data, da.Array) or any(np.isnan(c) for c in data.chunks[1]):
        return trajectory, False
    nbytes = int(np.prod(data.shape)) * 8
    if nbytes > fraction * cluster_memory(client):
        return trajectory, False
    chunk = max(data.chunks[1])
    rows = max(1, _task_target(None, nbytes) // (data.shape[2] * 8) // chunk) * chunk
    blocks = data.astype(np.float64).rechunk({0: 1, 1: rows, 2: -1})
    keys = list(dask.core.flatten(blocks.__dask_keys__()))
    futures = {}
    lengths = [blocks.chunks[1][key[2]] for key in keys]
    for worker, run in _spread(lengths, client).items():
        # loose restrictions: a block lost with its worker is loaded again elsewhere
        wanted = [keys[i] for i in run]
        loaded = client.get(
            blocks.__dask_graph__().cull(set(wanted)),
            wanted,
            sync=False,
            workers=worker,
            allow_other_workers=True,
        )
        futures.update(zip(run, loaded, strict=True))
    return trajectory.copy(data=_array_of_futures(blocks, blocks.name, futures)), True


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
            "trajectory must be backed by dask (open it with kelr_dist.data.store.open_trajectory "
            f"or call .chunk()), got {type(trajectory.data).__name__}"
        )
    if trajectory.shape[1] == 0:
        raise ValueError(f"trajectory has no samples (shape {trajectory.shape})")
    if any(np.isnan(c) for c in trajectory.data.chunks[1]):
        raise ValueError("trajectory has unknown chunk sizes along time")
    if not reductions or not all(isinstance(r, Reduction) for r in reductions):
        raise ValueError(f"reductions must be a non-empty sequence of Reduction, got {reductions}")
    for r in reductions:
        if not is_whole(r.halo):
            raise ValueError(f"reduction {r.name!r} has halo={r.halo!r}; need an integer >= 0")
    if not is_whole(split_every, 2):
        raise ValueError(f"split_every={split_every!r} must be an integer >= 2")
    return trajectory.data.rechunk({0: 1, 2: -1})


def _task_target(task_bytes: int | None, total_bytes: int) -> int:
    """The byte target of a task: ``task_bytes``, or by default the smaller of
    :data:`TASK_BYTES` and a :data:`MIN_TASKS`-th of the trajectory."""
    if task_bytes is None:
        return min(TASK_BYTES, total_bytes // MIN_TASKS)
    if isinstance(task_bytes, bool) or not isinstance(task_bytes, int | np.integer):
        raise ValueError(f"task_bytes={task_bytes!r} must be a number of bytes (int) or None")
    if task_bytes < 0:
        raise ValueError(f"task_bytes={task_bytes!r} must be >= 0 (0: one chunk per task)")
    return int(task_bytes)


def build_graph(
    trajectory: xr.DataArray,
    reductions: Sequence[Reduction],
    *,
    split_every: int = 8,
    task_bytes: int | None = None,
) -> ReductionGraph:
    """Lazy graph running ``reductions`` over ``trajectory`` (see the module docstring).

    Parameters
    ----------
    trajectory : dask-backed ``DataArray`` with dims ``("chain", "time", "component")``,
        shape ``(chains, n, d)``, chunked along ``time``.
    reductions : the passes to run; they share the block loads.
    split_every : fan-in of the combine tree (>= 2).
    task_bytes : byte target of a task: consecutive store chunks of a chain up to this size
        (as stored) are reduced by one task; ``0``: one chunk per task; ``None`` (default):
        ``min(TASK_BYTES, trajectory bytes // MIN_TASKS)``.
    """
    reductions = tuple(reductions)
    data = _validate(trajectory, reductions, split_every)
    n = data.shape[1]
    edges = np.concatenate([[0], np.cumsum(data.chunks[1])]).astype(int).tolist()
    row_bytes = data.shape[2] * data.dtype.itemsize
    target = _task_target(task_bytes, data.shape[0] * n * row_bytes)
    groups = _task_groups(data.chunks[1], row_bytes, target)
    max_halo = max(int(r.halo) for r in reductions)
    prefix = f"kelr-{'-'.join(r.name for r in reductions)}-{uuid.uuid4().hex[:12]}"

    loads = data.__dask_keys__()  # [chain][time chunk][0] -> key of the block's load task
    shared = f"{prefix}-reductions"
    layer: dict[Any, Any] = {shared: reductions}
    blocks = []
    # one string object per key family: pickle stores it once, not once per task
    head_name, block_name = f"{prefix}-head", f"{prefix}-block"
    for c in range(data.shape[0]):
        heads = [(head_name, c, k) for k in range(len(edges) - 1)]
        for g, (k0, k1) in enumerate(groups):
            start, stop = edges[k0], edges[k1]
            halo_rows = min(max_halo, n - stop)
            last = bisect.bisect_left(edges, stop + halo_rows)  # chunks k1..last-1 hold the halo
            for k in range(k1, last):
                if heads[k] not in layer:
                    rows = min(max_halo, edges[k + 1] - edges[k])
                    layer[heads[k]] = (_head, loads[c][k][0], rows)
            key = (block_name, c, g)
            layer[key] = (
                _block_partials,
                [loads[c][k][0] for k in range(k0, k1)],
                heads[k1:last],
                (c, start, stop, n),
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
        tuple(edges[k0] for k0, _ in groups) + (n,),
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


#: callbacks given the graph of every pass :func:`run_reductions` sends (:func:`observe_graphs`)
_GRAPH_OBSERVERS: list[Callable[[ReductionGraph], Any]] = []


@contextmanager
def observe_graphs(callback: Callable[[ReductionGraph], Any]) -> Iterator[None]:
    """While the block runs, call ``callback(graph)`` with the :class:`ReductionGraph` of every
    pass that :func:`run_reductions` runs in this process, before it is sent (benchmarks: the
    bytes and tasks a pass sends). Computes nothing; the callback should not keep the graph
    longer than it needs."""
    _GRAPH_OBSERVERS.append(callback)
    try:
        yield
    finally:
        _GRAPH_OBSERVERS.remove(callback)


def _show_progress(progress: bool | None) -> bool:
    return progress if progress is not None else sys.stderr.isatty()


def run_reductions(
    trajectory: xr.DataArray,
    reductions: Sequence[Reduction],
    client: Client | str,
    *,
    split_every: int = 8,
    progress: bool | None = None,
    task_bytes: int | None = None,
) -> list[Any]:
    """Run several reductions over a trajectory on a Dask cluster, sharing the block loads.

    Parameters
    ----------
    trajectory : dask-backed ``DataArray`` with dims ``("chain", "time", "component")``,
        shape ``(chains, n, d)``, chunked along ``time`` (e.g. from
        ``kelr_dist.data.store.open_trajectory``).
    reductions : the passes; each ``chunk`` gets one block ``(L, d)`` float64 of one chain,
        its :class:`BlockInfo` and the next ``min(halo, rows left)`` rows of that chain.
    client : the ``distributed.Client`` to run on (see :func:`kelr_dist.engine.cluster.get_client`),
        or ``"synchronous"``: the same graph in this process (dask's synchronous scheduler).
    split_every : fan-in of the combine tree on the workers.
    progress : tqdm bar over completed blocks on stderr; ``None``: when stderr is a terminal.
    task_bytes : byte target of a task (consecutive store chunks of a chain reduced together),
        see :func:`build_graph`; default ``min(TASK_BYTES, trajectory bytes // MIN_TASKS)``.

    Returns
    -------
    ``[reduction.finalize(combined partial) for reduction in reductions]``; the same as
    :func:`kelr_dist.kernels.reduction.reduce_in_memory` on the whole array, up to rounding.

    Raises
    ------
    ValueError
        Invalid trajectory, reductions or ``split_every``.
    TrajectoryError
        A worker cannot open the trajectory's store (message: the store, the worker, why).
    ClusterError
        A block kept killing the workers that ran it (dask's ``KilledWorker``), or the
        connection to the scheduler was lost; the message names the pass and the chunk.
    Exception
        An exception raised by a kernel or by reading a block, re-raised with its own type;
        the message starts with the pass, the chunk (chain and rows), the store and the worker.

    Notes
    -----
    Worker processes lost while the pass runs cost time only: their tasks are recomputed and
    the result is identical. On the first failed block the rest of the pass is cancelled.
    An in-memory trajectory is scattered to the cluster for the pass (not embedded in its
    graph); call :func:`scatter_trajectory` once beforehand to send it once for many passes.
    """
    if client != SYNCHRONOUS and getattr(client, "status", None) == "running":
        trajectory = scatter_trajectory(trajectory, client)
    graph = build_graph(trajectory, reductions, split_every=split_every, task_bytes=task_bytes)
    for observer in tuple(_GRAPH_OBSERVERS):
        observer(graph)
    if client == SYNCHRONOUS:
        (partials,) = dask.compute(graph.total, scheduler="synchronous", optimize_graph=False)
        return [r.finalize(p) for r, p in zip(graph.reductions, partials, strict=True)]
    where = _PassContext.of(trajectory, graph, client)
    where.require_connection(client)
    _check_store_on_workers(trajectory, client, where)
    where.require_connection(client)
    futures = client.compute([*graph.blocks, graph.total], optimize_graph=False)
    total = futures.pop()
    bar = tqdm(
        total=len(futures),
        desc=", ".join(r.name for r in graph.reductions),
        unit="block",
        disable=not _show_progress(progress),
        file=sys.stderr,
    )
    done = as_completed([*futures, total], loop=client.loop)
    del futures  # block partials are released as soon as they are counted
    try:
        with bar:
            for future in _finishing(done, _Liveness(client, where)):
                if future.status != "finished":
                    raise where.failure(client, future)
                if future is not total:
                    bar.update()
        if total.status not in ("pending", "finished"):
            raise where.failure(client, total)
        try:
            partials = total.result()
        except (CancelledError, KilledWorker):
            raise where.failure(client, total) from None
    except BaseException:
        # the rest of the pass is of no use: free the workers for other work (other clients
        # keep what they asked for; tasks wanted by nobody else are forgotten)
        remaining = [*done.futures, total]
        done.clear()
        with suppress(Exception):  # a client whose scheduler is gone may fail to cancel
            client.cancel(remaining)
        raise
    return [r.finalize(p) for r, p in zip(graph.reductions, partials, strict=True)]


def _finishing(done: as_completed, watch: _Liveness) -> Iterator[Any]:
    """The futures of ``done`` as they finish; while none is ready, ``watch.check()`` (which
    raises :class:`ClusterError` when the cluster has no live worker)."""
    while done.count():
        if done.has_ready():
            watch.progress()
            yield next(done)
        else:
            watch.check()
            time.sleep(0.02)


class _Liveness:
    """Whether a pass's cluster has a live worker: one connected for :data:`WORKER_SETTLE`
    seconds and running a task, looked at every :data:`WATCH_INTERVAL` seconds
    (``client.processing()``)."""

    def __init__(self, client: Client, where: _PassContext) -> None:
        self.client, self.where = client, where
        self.alive_at = self.next_look = time.monotonic()
        self.seen: dict[str, float] = {}  # connected workers -> first seen
        self.left = 0  # workers seen to leave while the pass waited

    def progress(self) -> None:
        self.alive_at = time.monotonic()

    def check(self) -> None:
        now = time.monotonic()
        if now < self.next_look or self.client.status != "running":
            return  # a lost scheduler cancels the futures: failure() says so
        self.next_look = now + WATCH_INTERVAL
        try:
            present = self.client.processing()
        except Exception:  # the client's own failure ends the pass's futures
            return
        self.left += len(set(self.seen) - set(present))
        self.seen = {w: self.seen.get(w, now) for w in present}
        # a cluster of one's own that has had no worker yet is waited for, as dask does (an
        # adaptive or batch-queue cluster starts from none); the embedded one has its workers
        waiting = not present and not self.left and memory_kills(self.client) is None
        if waiting or any(now - t >= WORKER_SETTLE and present[w] for w, t in self.seen.items()):
            self.alive_at = now
        elif now - self.alive_at >= NO_WORKERS_TIMEOUT:
            raise self.where.no_live_workers(self.client, len(present), self.left)


@dataclass(frozen=True)
class _PassContext:
    """What an error message says about where a pass failed."""

    name: str  # "pass 'moments, mean/covariance'"
    store: str
    scheduler: str
    prefix: str  # of the graph's own keys
    loads: frozenset[str]  # names of the trajectory's load tasks
    edges: tuple[int, ...]  # row boundaries of the time chunks
    task_edges: tuple[int, ...] = ()  # row boundaries of the block tasks (coalesced chunks)

    @classmethod
    def of(cls, trajectory: xr.DataArray, graph: ReductionGraph, client: Client) -> _PassContext:
        data = trajectory.data
        edges = np.concatenate([[0], np.cumsum(data.chunks[1])]).astype(int)
        return cls(
            name=f"pass '{', '.join(r.name for r in graph.reductions)}'",
            store=str(trajectory.attrs.get("store", "<in-memory>")),
            scheduler=str(getattr(client.scheduler, "address", None) or "?"),
            prefix=str(graph.blocks[0].key[0]).removesuffix("-block"),
            loads=frozenset({data.name, data.rechunk({0: 1, 2: -1}).name}),
            edges=tuple(int(e) for e in edges),
            task_edges=graph.task_edges,
        )

    def chunk(self, key: Any) -> str:
        """The chunk a task key belongs to: ``chain c, rows a-b`` (or the combine step)."""
        if isinstance(key, tuple) and len(key) >= 3 and isinstance(key[0], str):
            name = key[0]
            ours = name.startswith(self.prefix) and name.endswith(("-block", "-head"))
            if ours or (name in self.loads and len(key) == 4):
                chain, k = int(key[1]), int(key[2])
                edges = self.task_edges if name.endswith("-block") else self.edges
                if 0 <= k < len(edges) - 1:
                    return f"chain {chain}, rows {edges[k]}-{edges[k + 1]}"
            if name.startswith(self.prefix) and name.endswith("-combine"):
                return "the combine step"
        return f"task {key!r}"

    def require_connection(self, client: Client) -> None:
        """Raise at once when the client is not connected (work sent now would never end)."""
        if client.status != "running":
            raise ClusterError(
                f"{self.name}: lost the connection to the Dask scheduler at {self.scheduler} "
                f"(the client is {client.status})"
            )

    def no_live_workers(self, client: Client, connected: int, left: int) -> ClusterError:
        """The error for a pass none of whose tasks finished in :data:`NO_WORKERS_TIMEOUT`
        seconds while no worker stayed connected (``connected`` now, ``left`` seen leaving)."""
        stuck = (
            f"{self.name}: no task finished or ran for {NO_WORKERS_TIMEOUT:g} s on the cluster at "
            f"{self.scheduler} (no worker up for {WORKER_SETTLE:g} s was running one)"
        )
        kills = memory_kills(client)
        if kills is not None and kills[0]:
            return ClusterError(
                f"{stuck}: the workers keep dying for memory ({kills[0]} killed by their nanny "
                f"for exceeding memory_limit={kills[1] / 2**20:.0f} MiB per worker); give each "
                "worker more memory (--memory-limit / memory_limit=), with fewer workers "
                "(--workers / n_workers=) if the machine has no more"
            )
        if connected == 0:
            return ClusterError(
                f"{stuck}: the cluster has no workers ({left} left while the pass waited); "
                "start workers, or see their logs for why they died (e.g. killed for exceeding "
                "their memory limit: give them more memory)"
            )
        return ClusterError(
            f"{stuck}: {left} workers left while the pass waited; see the workers' logs for why "
            "they died (e.g. killed for exceeding their memory limit: give them more memory)"
        )

    def failure(self, client: Client, future: Any) -> BaseException:
        """The exception to raise for a failed or cancelled future of this pass."""
        if future.status == "cancelled":
            reason = None
            try:
                future.result(timeout=5)
            except CancelledError as err:
                reason = getattr(err, "reason", None)
            except Exception:  # the client itself failed; say what is known
                pass
            if reason == "scheduler-connection-lost" or client.status != "running":
                return ClusterError(
                    f"{self.name}: lost the connection to the Dask scheduler at "
                    f"{self.scheduler}; the pass was abandoned"
                )
            return ClusterError(f"{self.name}: the work was cancelled on the cluster ({reason})")
        try:
            error = future.exception(timeout=5)
        except Exception as err:  # the client itself failed
            return ClusterError(f"{self.name}: the Dask client failed ({err})")
        traceback = future.traceback()
        if error is None:
            return ClusterError(f"{self.name}: task {future.key!r} ended as {future.status}")
        if isinstance(error, KilledWorker):
            worker = getattr(error.last_worker, "address", error.last_worker)
            tries = error.allowed_failures + 1
            return ClusterError(
                f"{self.name}: {self.chunk(error.task)} of store {self.store!r} killed the "
                f"{tries} worker processes that ran it (the last: {worker}), so dask gave up "
                f"(distributed.scheduler.allowed-failures={error.allowed_failures}); a worker "
                "that dies on one block has usually run out of memory: give the workers more "
                "memory or the store smaller time chunks"
            )
        workers = _erred_on(client, future.key)
        on = f" on worker {', '.join(workers)}" if workers else ""
        context = f"{self.name}, {self.chunk(future.key)} of store {self.store!r}{on}"
        return _with_context(error.with_traceback(traceback), context)


def _with_context(error: BaseException, context: str) -> BaseException:
    """``error`` with ``context: `` before its message, of the same type where possible."""
    message = f"{context}: {error}"
    try:
        renamed = type(error)(message)
    except Exception:  # exception types with other constructors
        renamed = None
    if renamed is None or str(renamed) != message:
        error.add_note(context)
        return error
    renamed.__cause__ = error
    renamed.__traceback__ = error.__traceback__
    return renamed


def _erred_on(client: Client, key: Any) -> list[str]:
    """Addresses of the workers where the task to blame for ``key``'s error failed."""

    def blame(dask_scheduler: Any) -> list[str]:  # pickled by value: no kelr_dist needed there
        task = dask_scheduler.tasks.get(key)
        if task is None:
            return []
        task = task.exception_blame or task
        return sorted(getattr(task, "erred_on", None) or ())

    try:
        return list(client.run_on_scheduler(blame))
    except Exception:  # the worker's address is a courtesy
        return []


def _store_problem(path: str, variable: str) -> str | None:
    """On a worker: why the zarr store ``path`` (and its ``variable``) cannot be opened here."""
    import zarr

    try:
        group = zarr.open_group(path, mode="r")
        if variable in group:
            group[variable]  # noqa: B018 - reads the array's metadata
        else:
            raise FileNotFoundError(f"no variable {variable!r} in the store")
    except Exception as err:  # any reason is reported
        resolved = os.path.abspath(path)
        return f"{type(err).__name__}: {err} (path resolved on the worker: {resolved!r})"
    return None


def _check_store_on_workers(trajectory: xr.DataArray, client: Client, where: _PassContext) -> None:
    """Fail at once, naming the store and the worker, when a worker cannot open the store.

    A worker that does not see the store (another cwd for a relative path, storage not
    mounted there, no permission) would otherwise fail on its first block, or read missing
    chunks as fill values.
    """
    from kelr_dist.data.store import TrajectoryError

    store = trajectory.attrs.get("store")
    if not isinstance(store, str) or "://" in store or not Path(store).exists():
        return  # in memory, or a remote store the workers open by URL
    variable = str(trajectory.name) if trajectory.name is not None else "x"
    try:
        answers = client.run(_store_problem, store, variable, on_error="return")
    except Exception:  # no answer: the tasks will tell
        return
    problems = sorted((w, p) for w, p in answers.items() if isinstance(p, str))
    if problems:
        worker, problem = problems[0]
        others = len(problems) - 1
        more = f" (and {others} other worker{'s' if others > 1 else ''})" if others else ""
        raise TrajectoryError(
            f"store {store!r}, variable {variable!r}: {where.name}: worker {worker}{more} "
            f"cannot open the store: {problem}; the store must be on storage every worker "
            "sees, at the same path"
        )


def run_reduction(
    trajectory: xr.DataArray,
    reduction: Reduction,
    client: Client | str,
    *,
    split_every: int = 8,
    progress: bool | None = None,
    task_bytes: int | None = None,
) -> Any:
    """Run one reduction over a trajectory on a Dask cluster (see :func:`run_reductions`)."""
    return run_reductions(
        trajectory,
        [reduction],
        client,
        split_every=split_every,
        progress=progress,
        task_bytes=task_bytes,
    )[0]
