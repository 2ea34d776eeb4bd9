"""The graph of one pass: one task per block of rows, and a tree that combines their partials.

For reductions with largest halo ``H`` over a trajectory of shape ``(chains, n, d)``, the rows
of each chain are cut into *blocks*: runs of consecutive stored chunks of up to ``task_bytes``
(:data:`TASK_BYTES`, 16 MiB, by default; at least one chunk, and by default at most a
:data:`MIN_TASKS`-th of the trajectory, so that a small trajectory still spreads over the
workers). The rule that keeps a pass small in any chunking: **a task reads what it reduces.**

- A trajectory that is a store as :func:`kelr_dist.data.store.open_trajectory` opens it: the
  block task of rows ``a:b`` of chain ``c`` reads rows ``a:min(b + H, n)`` of the store itself
  (:mod:`kelr_dist.engine.reading`). A pass is one task per block plus the combine tree, for a
  store in 4096-row chunks as for one in 1e6-row chunks.
- Any other dask array (in-memory data on the cluster, a user's lazy array): the block task
  takes the array's own chunks of its rows and, for a halo, small ``head`` tasks that copy the
  first rows of the chunks after it; each chunk is computed once per pass.

Then a ``split_every``-ary tree of ``combine`` tasks over the blocks in (chain, time) order;
its root goes to the client for ``finalize``. The tree's shape depends only on the blocks, so a
task recomputed after a lost worker gives the identical result. The graph is built with
``dask.delayed`` (task keys ``(<pass>-block, chain, block)``) and computes nothing.

Before its kernels, a block task sets up its worker process once (:func:`prepare_worker`): the
BLAS/OpenMP pools capped at the worker's share of the cores (``dask.system.CPU_COUNT`` divided
by the worker's threads; a pool is never raised) and glibc's allocator tuned for the worker's
memory limit (:mod:`kelr_dist.engine.allocator`); after its kernels it gives the freed heap
back. Neither happens in the caller's process (``"synchronous"``).
"""

from __future__ import annotations

import bisect
import functools
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import dask
import dask.array as da
import numpy as np
import xarray as xr
from dask.delayed import Delayed
from distributed import get_worker

from kelr_dist.engine.allocator import release_when_full, tune_allocator
from kelr_dist.engine.cluster import thread_share
from kelr_dist.engine.reading import StoreRows, store_rows
from kelr_dist.kernels.checks import is_whole
from kelr_dist.kernels.reduction import BlockInfo, Partial, Reduction

T = TypeVar("T")

DIMS = ("chain", "time", "component")
#: default byte target of one task: consecutive store chunks of a chain up to this size are
#: read and reduced by one task (as stored; a single larger chunk is a task of its own). A task
#: holds its chunks and their float64 join (up to twice this) besides the kernels' own tables,
#: within a small worker's memory (the out-of-core test runs 300 MiB workers); at 16 MiB the
#: per-task overhead (~1 ms on the scheduler) is well under 1% of the task's kernels.
TASK_BYTES = 16 * 2**20
#: with the default target, a task holds at most this fraction of the trajectory (1/MIN_TASKS)
MIN_TASKS = 32


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


# --- on the workers -------------------------------------------------------------------------


@functools.cache
def _thread_pools() -> Any:
    """This process's BLAS/OpenMP pools (threadpoolctl), looked up once per process."""
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


def cap_thread_pools(threads: int) -> None:
    """Lower the BLAS/OpenMP pools of this process that exceed ``threads`` threads to it.

    Pools at or below ``threads`` are left alone (a worker's nanny starts one thread per process
    unless the caller's environment says otherwise). Called on a worker before its kernels run,
    and not undone: the share belongs to the worker, and the pools are process-wide, so putting
    them back after a task would lift the cap under a task still running in another thread.
    """
    for library in _thread_pools().lib_controllers:
        if library.num_threads > threads:
            library.set_num_threads(threads)


@functools.cache
def prepare_worker(memory_limit: int | None, threads: int) -> None:
    """Tune this worker process's allocator and cap its thread pools, once per process (and
    per memory limit and thread count)."""
    tune_allocator(memory_limit)
    cap_thread_pools(thread_share(1, threads))


def _as_float64(array: np.ndarray) -> np.ndarray:
    """A read-only float64 view (or copy) of ``array``: kernels must not modify their inputs."""
    out = np.asarray(array, dtype=np.float64).view()
    out.flags.writeable = False
    return out


def _partials(
    x: np.ndarray,
    halo: np.ndarray,
    where: tuple[int, int, int, int],
    reductions: tuple[Reduction, ...],
) -> tuple[Partial, ...]:
    """Partials of every reduction on the block's rows ``x (L, d)``, with the rows after them
    ``halo (h, d)``; ``where`` holds the fields of the block's :class:`BlockInfo`."""
    try:
        worker = get_worker()
    except ValueError:  # the caller's process ("synchronous"): leave it alone
        worker = None
    if worker is not None:
        prepare_worker(worker.memory_manager.memory_limit, worker.state.nthreads)
    x, halo = _as_float64(x), _as_float64(halo)
    info = BlockInfo(*where)
    partials = tuple(
        reduction.chunk(x, info, halo[: reduction.halo] if reduction.halo else None)
        for reduction in reductions
    )
    if worker is not None:  # free heap kept for the next task unless the worker is filling up
        release_when_full(worker.memory_manager.memory_limit)
    return partials


#: attribute a task's exception carries from the worker it failed on (its address), read by
#: kelr_dist.engine.failures to name the worker; attributes travel with the pickled exception
WORKER_ATTRIBUTE = "kelr_worker"


def naming_the_worker(task: Callable[..., T]) -> Callable[..., T]:
    """``task`` whose exceptions carry the address of the worker they were raised on."""

    @functools.wraps(task)
    def run(*args: Any, **kwargs: Any) -> T:
        try:
            return task(*args, **kwargs)
        except Exception as err:
            try:
                setattr(err, WORKER_ATTRIBUTE, get_worker().address)
            except (ValueError, AttributeError):  # not on a worker, or a frozen exception
                pass
            raise

    return run


@naming_the_worker
def _read_and_reduce(
    reader: StoreRows, where: tuple[int, int, int, int], halo_rows: int, reductions: tuple
) -> tuple[Partial, ...]:
    """Block task of a store: read rows ``start:stop + halo_rows`` of the chain and reduce."""
    chain, start, stop, _ = where
    rows = reader.read(chain, start, stop + halo_rows)
    return _partials(rows[: stop - start], rows[stop - start :], where, reductions)


@naming_the_worker
def _reduce_chunks(
    where: tuple[int, int, int, int],
    halo_rows: int,
    reductions: tuple,
    count: int,
    *arrays: np.ndarray,
) -> tuple[Partial, ...]:
    """Block task of a dask array: its ``count`` ``(1, L_i, d)`` chunks joined (one is used as
    it is), and ``halo_rows`` rows of the heads after them (the rest of ``arrays``; separate
    arguments, not lists: dask.delayed finalizes a list of delayed values as a collection of its
    own, at a cost per task that dominated a small pass's graph)."""
    chunks, heads = [c[0] for c in arrays[:count]], arrays[count:]
    x = chunks[0] if count == 1 else np.concatenate(chunks)
    halo = np.concatenate(heads)[:halo_rows] if heads else x[:0]
    return _partials(x, halo, where, reductions)


def _head(chunk: np.ndarray, rows: int) -> np.ndarray:
    """Copy of the first ``rows`` rows of a ``(1, L, d)`` chunk, shape ``(rows, d)``."""
    return np.array(chunk[0, :rows])


@naming_the_worker
def _combine(reductions: tuple[Reduction, ...], *parts: tuple[Partial, ...]) -> tuple:
    """Left fold of tuples of partials with each reduction's ``combine``."""
    total = parts[0]
    for part in parts[1:]:
        total = tuple(
            reduction.combine(a, b) for reduction, a, b in zip(reductions, total, part, strict=True)
        )
    return total


# --- on the client ----------------------------------------------------------------------------


def validate(trajectory: Any, reductions: Sequence[Reduction], split_every: int) -> da.Array:
    """The trajectory's dask array with one chain and all components per chunk."""
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


def task_target(task_bytes: int | None, total_bytes: int) -> int:
    """The byte target of a task: ``task_bytes``, or by default the smaller of
    :data:`TASK_BYTES` and a :data:`MIN_TASKS`-th of the trajectory."""
    if task_bytes is None:
        return min(TASK_BYTES, total_bytes // MIN_TASKS)
    if isinstance(task_bytes, bool) or not isinstance(task_bytes, int | np.integer):
        raise ValueError(f"task_bytes={task_bytes!r} must be a number of bytes (int) or None")
    if task_bytes < 0:
        raise ValueError(f"task_bytes={task_bytes!r} must be >= 0 (0: one chunk per task)")
    return int(task_bytes)


def task_groups(lengths: Sequence[int], row_bytes: int, target: int) -> list[tuple[int, int]]:
    """Runs ``[k0, k1)`` of consecutive chunks (rows ``lengths``) of at most ``target`` bytes
    together (at least one chunk each), in order."""
    groups: list[tuple[int, int]] = []
    start, size = 0, 0
    for k, rows in enumerate(lengths):
        nbytes = int(rows) * row_bytes
        if k > start and size + nbytes > target:
            groups.append((start, k))
            start, size = k, 0
        size += nbytes
    groups.append((start, len(lengths)))
    return groups


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
    reductions : the passes to run; they share the reads.
    split_every : fan-in of the combine tree (>= 2).
    task_bytes : byte target of a task: consecutive store chunks of a chain up to this size
        (as stored) are reduced by one task; ``0``: one chunk per task; ``None`` (default):
        ``min(TASK_BYTES, trajectory bytes // MIN_TASKS)``.
    """
    reductions = tuple(reductions)
    data = validate(trajectory, reductions, split_every)
    chains, n, d = data.shape
    edges = np.concatenate([[0], np.cumsum(data.chunks[1])]).astype(int).tolist()
    row_bytes = d * data.dtype.itemsize
    groups = task_groups(data.chunks[1], row_bytes, task_target(task_bytes, chains * n * row_bytes))
    max_halo = max(int(r.halo) for r in reductions)
    prefix = f"kelr-{'-'.join(r.name for r in reductions)}-{uuid.uuid4().hex[:12]}"
    block_name, head_name = f"{prefix}-block", f"{prefix}-head"
    reader = store_rows(trajectory)
    chunks = None if reader is not None else data.to_delayed()  # [chain, time chunk, 0]
    # the reductions (and the store reader) enter the graph once, as data every task depends
    # on: not walked, tokenized and serialized again for every task
    shared = dask.delayed(reductions, name=f"{prefix}-reductions", traverse=False)
    source = None
    if reader is not None:
        source = dask.delayed(reader, name=f"{prefix}-reader", traverse=False)
    blocks = []
    for c in range(chains):
        heads: dict[int, Delayed] = {}
        for g, (k0, k1) in enumerate(groups):
            start, stop = edges[k0], edges[k1]
            halo_rows = min(max_halo, n - stop)
            where = (c, start, stop, n)
            key = (block_name, c, g)
            if reader is not None:
                task = dask.delayed(_read_and_reduce, pure=False)(
                    source, where, halo_rows, shared, dask_key_name=key
                )
            else:
                assert chunks is not None  # no store reader: the array's own chunks
                last = bisect.bisect_left(edges, stop + halo_rows)  # k1..last-1 hold the halo
                for k in range(k1, last):
                    if k not in heads:
                        rows = min(max_halo, edges[k + 1] - edges[k])
                        heads[k] = dask.delayed(_head, pure=False)(
                            chunks[c, k, 0], rows, dask_key_name=(head_name, c, k)
                        )
                task = dask.delayed(_reduce_chunks, pure=False)(
                    where,
                    halo_rows,
                    shared,
                    k1 - k0,
                    *[chunks[c, k, 0] for k in range(k0, k1)],
                    *[heads[k] for k in range(k1, last)],
                    dask_key_name=key,
                )
            blocks.append(task)
    total = combine_tree(blocks, shared, split_every, f"{prefix}-combine")
    return ReductionGraph(
        tuple(blocks), total, reductions, tuple(edges[k0] for k0, _ in groups) + (n,)
    )


def combine_tree(parts: list[Delayed], reductions: Delayed, split_every: int, name: str) -> Delayed:
    """A ``split_every``-ary tree of :func:`_combine` over ``parts`` (in order); its root.
    ``reductions`` is the graph's node of the tuple of reductions."""
    level = 0
    while len(parts) > 1:
        runs = [parts[j : j + split_every] for j in range(0, len(parts), split_every)]
        parts = [
            run[0]
            if len(run) == 1
            else dask.delayed(_combine, pure=False)(
                reductions, *run, dask_key_name=(name, level, i)
            )
            for i, run in enumerate(runs)
        ]
        level += 1
    return parts[0]
