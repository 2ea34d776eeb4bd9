"""Run reductions over a chunked trajectory on a Dask cluster: the engine's entry points.

Every pass of the estimate is a :class:`kelr_dist.kernels.reduction.Reduction`.
:func:`run_reductions` maps their ``chunk`` kernels over the blocks of a lazily loaded
trajectory, tree-combines the partials on the workers and finalizes them there, so that only
partial sums travel between workers, never samples (apart from the few halo rows a lagged
kernel needs), and only the results reach the caller.
Several reductions in one call share each block's read.

The engine's jobs, one module each:

- :mod:`kelr_dist.engine.graph`: the graph of a pass, and the rule that a task reads what it
  reduces (one task per block in any store chunking);
- :mod:`kelr_dist.engine.reading`: row ranges of a store read inside those tasks;
- :mod:`kelr_dist.engine.placement`: in-memory input and small stores put on the workers once
  (``Client.persist``);
- this module: sending a pass and waiting for it (``Future.add_done_callback``), progress;
- :mod:`kelr_dist.engine.watch`: what a waiting pass looks at (workers dying, paused);
- :mod:`kelr_dist.engine.failures`: what a failed pass says.
"""

from __future__ import annotations

import queue
import sys
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import CancelledError
from contextlib import contextmanager, suppress
from typing import Any

import dask
import xarray as xr
from distributed import Client, KilledWorker
from tqdm.auto import tqdm

from kelr_dist.data.store import check_unchanged
from kelr_dist.engine.failures import PassContext, check_store_on_workers
from kelr_dist.engine.graph import (
    MIN_TASKS,
    TASK_BYTES,
    ReductionGraph,
    build_graph,
)
from kelr_dist.engine.placement import (
    KEEP_FRACTION,
    cluster_memory,
    keep_in_memory,
    scatter_trajectory,
)
from kelr_dist.engine.watch import Watch
from kelr_dist.kernels.reduction import SYNCHRONOUS, Reduction

__all__ = [
    "KEEP_FRACTION",
    "MIN_TASKS",
    "PAUSED_TIMEOUT",
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

#: a pass fails (ClusterError) after this many seconds in which none of its tasks finished and
#: no worker connected for WORKER_SETTLE seconds was running a task: its workers keep dying
#: without dask blaming a task (killed by their nanny for memory at start-up or between tasks),
#: there are none (LocalCluster closes for good a nanny whose worker stays lost 15 s), or a
#: task is stuck (dask leaves a task whose loose worker restriction names a lost worker in
#: 'no-worker' when the other workers were lost too, e.g. keep_in_memory's loads); dask itself
#: would wait forever
NO_WORKERS_TIMEOUT = 30.0
#: distributed warns of a graph above ``distributed.admin.large-graph-warning-threshold``
#: (10 MB) as of data embedded in it. A pass's graph never holds data (its tasks read the store
#: or blocks already on the cluster), but it holds its reductions once, with the fitted model
#: they evaluate: the Gaussian-KDE baseline's grids alone take about 16 MiB in 2-D
GRAPH_WARNING = "256MiB"
#: seconds a worker must stay connected to count as alive (restart loops last ~1-4 s each)
WORKER_SETTLE = 10.0
#: seconds between two looks at the scheduler's workers while a pass waits
WATCH_INTERVAL = 1.0
#: a pass fails (ClusterError) after this many seconds in which none of its tasks finished
#: while the workers holding its tasks were paused by dask's memory monitor (or, with none
#: holding one, all workers were paused or over their memory target): a worker pauses above
#: distributed.worker.memory.pause (80 %) of its limit and resumes once spilling frees memory,
#: within seconds when it can
PAUSED_TIMEOUT = 60.0

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
    ``[reduction.finalize(combined partial) for reduction in reductions]``, computed by the
    worker that holds the combined partials (only the results are sent to this process); the
    same as :func:`kelr_dist.kernels.reduction.reduce_in_memory` on the whole array, up to
    rounding. An exception raised by a ``finalize`` is raised here as it is.

    Raises
    ------
    ValueError
        Invalid trajectory, reductions or ``split_every``.
    TrajectoryError
        A worker cannot open the trajectory's store (message: the store, the worker, why), or
        the store changed since it was opened (checked before and after the pass).
    ClusterError
        A block kept killing the workers that ran it (dask's ``KilledWorker``), the
        connection to the scheduler was lost, the workers kept dying or were paused for
        memory; the message names the pass and the chunk or the workers.
    Exception
        An exception raised by a kernel or by reading a block, re-raised with its own type;
        the message starts with the pass, the chunk (chain and rows), the store and the worker.

    Notes
    -----
    Worker processes lost while the pass runs cost time only: their tasks are recomputed and
    the result is identical. On the first failed block the rest of the pass is cancelled.
    An in-memory trajectory is scattered to the cluster for the pass (not embedded in its
    graph); call :func:`scatter_trajectory` once beforehand to send it once for many passes.
    A pass whose workers are paused for memory fails after :data:`PAUSED_TIMEOUT` seconds
    without a finished task (:mod:`kelr_dist.engine.watch`).
    """
    if isinstance(client, str) and client != SYNCHRONOUS:
        raise ValueError(f"client={client!r} must be a distributed.Client or {SYNCHRONOUS!r}")
    opened = trajectory  # its store is checked unchanged before and after the pass
    check_unchanged(opened)
    if not isinstance(client, str) and client.status == "running":
        trajectory = scatter_trajectory(trajectory, client)
    graph = build_graph(trajectory, reductions, split_every=split_every, task_bytes=task_bytes)
    for observer in tuple(_GRAPH_OBSERVERS):
        observer(graph)
    if isinstance(client, str):  # SYNCHRONOUS
        (outcome,) = dask.compute(graph.total, scheduler="synchronous")
        check_unchanged(opened)
        return outcome.results()
    where = PassContext.of(trajectory, graph, client)
    where.require_connection(client)
    check_store_on_workers(trajectory, client, where)
    where.require_connection(client)
    with dask.config.set({"distributed.admin.large-graph-warning-threshold": GRAPH_WARNING}):
        # every task of the tree is held, so that a failed pass can cancel what is left of it
        # (cancelling a task cancels its dependents, and distributed asserts that a client
        # holds each: the client's connection would be closed)
        futures = client.compute([*graph.blocks, *graph.combines, graph.total])
    total = futures[-1]
    finished: queue.SimpleQueue[Any] = queue.SimpleQueue()
    for future in futures:
        future.add_done_callback(finished.put)
    watch = Watch(
        client,
        where,
        timeout=NO_WORKERS_TIMEOUT,
        settle=WORKER_SETTLE,
        interval=WATCH_INTERVAL,
        paused_timeout=PAUSED_TIMEOUT,
    )
    bar = tqdm(
        total=len(graph.blocks),
        desc=", ".join(r.name for r in graph.reductions),
        unit="block",
        disable=not _show_progress(progress),
        file=sys.stderr,
    )
    pending = {future.key: future for future in futures}
    blocks = {block.key for block in graph.blocks}
    del futures, future  # block partials are released as soon as they are counted
    try:
        with bar:
            while pending:
                future = _next_finished(finished, WATCH_INTERVAL) or _undelivered(pending)
                if future is None:
                    watch.check()
                    continue
                if pending.pop(future.key, None) is None:
                    continue  # found by its status before its callback came
                watch.progress()
                if future.status != "finished":
                    raise where.failure(client, _blamed(future, pending, blocks))
                if future.key in blocks:
                    bar.update()
        try:
            outcome = total.result()
        except (CancelledError, KilledWorker):
            raise where.failure(client, total) from None
    except BaseException:
        # the rest of the pass is of no use: free the workers for other work (other clients
        # keep what they asked for; tasks wanted by nobody else are forgotten)
        with suppress(Exception):  # a client whose scheduler is gone may fail to cancel
            client.cancel([total, *pending.values()])
        raise
    check_unchanged(opened)
    return outcome.results()


def _blamed(future: Any, pending: dict[Any, Any], blocks: set[Any]) -> Any:
    """The failed block whose error a failed combine task (``future``) carries, when the
    block's own future has failed already (its message then names the block's rows), else
    ``future`` itself."""
    if future.key in blocks or future.status != "error":
        return future
    failed = (f for key, f in pending.items() if key in blocks and f.status == "error")
    return next(failed, future)


def _undelivered(pending: dict[Any, Any]) -> Any:
    """A future of ``pending`` that is done although its callback has not come, else ``None``.

    Distributed runs every future's done-callbacks in one thread shared by the whole process
    (``Future.add_done_callback``) after a coroutine on the client's event loop sees the
    future's state change; a pass that relied on them alone waited forever when one never
    came, so a pass with nothing delivered for ``WATCH_INTERVAL`` seconds looks at the
    futures' own status as well."""
    return next((f for f in pending.values() if f.done()), None)


def _next_finished(finished: queue.SimpleQueue, timeout: float) -> Any:
    """The next finished future, or ``None`` when none finished within ``timeout`` seconds."""
    try:
        return finished.get(timeout=timeout)
    except queue.Empty:
        return None


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
