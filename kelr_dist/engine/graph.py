"""The graph of one pass: one task per block of rows, and a tree that combines their partials.

For reductions with largest halo ``H`` over a trajectory of shape ``(chains, n, d)``, the rows
of each chain are cut into *blocks*: runs of consecutive stored chunks of up to ``task_bytes``
(:data:`TASK_BYTES`, 16 MiB, by default; at least one chunk, and by default at most a
:data:`MIN_TASKS`-th of the trajectory, so that a small trajectory still spreads over the
workers). The rule that keeps a pass small in any chunking: **a task reads what it reduces.**

- A trajectory that is a store as :func:`kelr_dist.data.store.open_trajectory` opens it: the
  block task of rows ``a:b`` of chain ``c`` reads rows ``a:b`` of the store itself
  (:mod:`kelr_dist.engine.reading`). A pass is one task per block plus the combine tree, for a
  store in 4096-row chunks as for one in 1e6-row chunks. A reduction with halo ``h`` reduces
  rows ``a:b-h`` there (its halo is the block's own last ``h`` rows); rows ``b-h:b``, whose
  halo lies in the next block, are reduced where the two blocks' partials meet in the combine
  tree, from the ``h`` rows each lends (:class:`Stitched`): the next block's stored chunks are
  decoded once, by its own task. A block of at most ``H`` rows, or the last of a chain, reads
  its halo ``b:min(b + H, n)`` and reduces all its rows.
- Any other dask array (in-memory data on the cluster, a user's lazy array): the block task
  takes the array's own chunks of its rows and, for a halo, small ``head`` tasks that copy the
  first rows of the chunks after it; each chunk is computed once per pass.

Then a ``split_every``-ary tree of ``combine`` tasks over the blocks in (chain, time) order;
its root (every cut stitched) is finalized by a last task on the worker that holds it
(:class:`Finished`): the caller receives the results, never the partials. Any split of a chain into
pieces gives the same partials up to rounding (the reductions' contract,
:mod:`kelr_dist.kernels.reduction`). The tree's shape depends only on the blocks, so a
task recomputed after a lost worker gives the identical result. The graph is built with
``dask.delayed`` (task keys ``(<pass>-block, chain, block)``) and computes nothing.

A block task changes nothing in its worker process: the embedded cluster's workers are tuned
when they start (:class:`kelr_dist.engine.cluster.WorkerTuning`: BLAS/OpenMP pools at the
worker's share of the cores, glibc's allocator for its memory limit), a user's cluster only if
the user registered that plugin. On a tuned worker a task gives the freed heap back after its
kernels once the worker is filling up (:func:`kelr_dist.engine.allocator.release_when_full`).
Nothing of this happens in the caller's process (``"synchronous"``).
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

from kelr_dist.engine.allocator import release_when_full
from kelr_dist.engine.cluster import WorkerTuning
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
        giving its :class:`Stitched` partials, in (chain, time) order.
    total : ``Delayed`` of the :class:`Finished` results (one per reduction, finalized where
        the combined partials are).
    reductions : the reductions, in the order of the partials.
    task_edges : row boundaries of the tasks within a chain (the same for every chain):
        task ``g`` of chain ``c`` reduces rows ``task_edges[g]:task_edges[g + 1]``.
    combines : the combine tasks between the blocks and ``total``.
    """

    blocks: tuple[Delayed, ...]
    total: Delayed
    reductions: tuple[Reduction, ...]
    task_edges: tuple[int, ...] = ()
    combines: tuple[Delayed, ...] = ()


# --- on the workers -------------------------------------------------------------------------


def _as_float64(array: np.ndarray) -> np.ndarray:
    """A read-only float64 view (or copy) of ``array``: kernels must not modify their inputs."""
    out = np.asarray(array, dtype=np.float64).view()
    out.flags.writeable = False
    return out


@dataclass(frozen=True)
class Stitched:
    """Partials of a run of blocks, and the rows it lends to the cuts still open at its ends.

    Attributes
    ----------
    partials : one per reduction.
    tails : ``{(chain, b): rows}``: the last ``H`` rows (the largest halo) before a cut at row
        ``b``, not yet reduced by the reductions with a halo (their halo is after the cut).
    heads : ``{(chain, a): rows}``: the first ``min(H, n - a)`` rows after a cut at row ``a``.
    chain_length : ``n``, the rows of every chain.
    """

    partials: tuple[Partial, ...]
    tails: dict[tuple[int, int], np.ndarray]
    heads: dict[tuple[int, int], np.ndarray]
    chain_length: int


def _partials(
    pieces: Sequence[tuple[np.ndarray, np.ndarray | None, BlockInfo]],
    reductions: Sequence[Reduction],
) -> tuple[Partial, ...]:
    """Partials of each reduction on its piece: rows ``x (L, d)``, the rows after them
    ``halo (h, d)`` (``None`` for a reduction without a halo) and where they sit."""
    try:
        worker = get_worker()
    except ValueError:  # the caller's process ("synchronous"): leave it alone
        worker = None
    tuned = worker is not None and WorkerTuning.name in worker.plugins
    partials = tuple(
        reduction.chunk(_as_float64(x), info, None if halo is None else _as_float64(halo))
        for reduction, (x, halo, info) in zip(reductions, pieces, strict=True)
    )
    if tuned and worker is not None:  # free heap kept for the next task unless filling up
        release_when_full(worker.memory_manager.memory_limit)
    return partials


def _whole(
    x: np.ndarray, halo: np.ndarray, where: tuple[int, int, int, int], reductions: tuple
) -> list[tuple[np.ndarray, np.ndarray | None, BlockInfo]]:
    """Every reduction's piece of a block that holds its halo: the block's rows ``x`` and the
    first ``halo`` rows after them it needs."""
    info = BlockInfo(*where)
    return [(x, halo[: r.halo] if r.halo else None, info) for r in reductions]


def cuts(start: int, stop: int, halo_rows: int, halo: int) -> bool:
    """Whether the store's block of rows ``start:stop`` leaves its last ``halo`` rows to the
    cut after it (it is longer than the halo, and rows follow it: ``halo_rows > 0``)."""
    return halo_rows > 0 and stop - start > halo


def _cut(
    x: np.ndarray, where: tuple[int, int, int, int], reductions: tuple
) -> list[tuple[np.ndarray, np.ndarray | None, BlockInfo]]:
    """Every reduction's piece of a block without its halo: a reduction with halo ``h`` takes
    the rows before the last ``h``, which are its halo (``len(x) > h``)."""
    chain, start, stop, n = where
    pieces: list[tuple[np.ndarray, np.ndarray | None, BlockInfo]] = []
    for r in reductions:
        h = int(r.halo)
        if h:
            pieces.append((x[:-h], x[-h:], BlockInfo(chain, start, stop - h, n)))
        else:
            pieces.append((x, None, BlockInfo(*where)))
    return pieces


def _lent(
    x: np.ndarray, where: tuple[int, int, int, int], halo: int, tail: bool, head: bool
) -> tuple[dict[tuple[int, int], np.ndarray], dict[tuple[int, int], np.ndarray]]:
    """The rows a block lends to its cuts: its last ``halo`` rows when ``tail`` (it left them
    unreduced), and its first ``min(halo, n - start)`` (``x`` holds them) when ``head`` (the
    block before it left a tail). Copies: the block's own rows are freed with the task."""
    chain, start, stop, n = where
    tails = {(chain, stop): x[stop - start - halo : stop - start].copy()} if tail else {}
    heads = {(chain, start): x[: min(halo, n - start)].copy()} if head else {}
    return tails, heads


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
    reader: StoreRows,
    where: tuple[int, int, int, int],
    halo_rows: int,
    head: bool,
    reductions: tuple,
) -> Stitched:
    """Block task of a store: read rows ``start:stop`` of the chain and reduce them, leaving
    the last ``H`` rows of the reductions with a halo to the cut after them (:func:`cuts`); a
    block of at most ``H`` rows, or the last of its chain, reads its halo
    ``stop:stop + halo_rows`` instead. ``head``: lend the first rows to the cut before."""
    chain, start, stop, n = where
    halo = max(int(r.halo) for r in reductions)
    tail = cuts(start, stop, halo_rows, halo)
    rows = reader.read(chain, start, stop if tail else stop + halo_rows)
    x = rows[: stop - start]
    pieces = (
        _cut(x, where, reductions) if tail else _whole(x, rows[stop - start :], where, reductions)
    )
    return Stitched(_partials(pieces, reductions), *_lent(rows, where, halo, tail, head), n)


@naming_the_worker
def _reduce_chunks(
    where: tuple[int, int, int, int],
    halo_rows: int,
    reductions: tuple,
    count: int,
    *arrays: np.ndarray,
) -> Stitched:
    """Block task of a dask array: its ``count`` ``(1, L_i, d)`` chunks joined (one is used as
    it is), and ``halo_rows`` rows of the heads after them (the rest of ``arrays``; separate
    arguments, not lists: dask.delayed finalizes a list of delayed values as a collection of its
    own, at a cost per task that dominated a small pass's graph)."""
    chunks, heads = [c[0] for c in arrays[:count]], arrays[count:]
    x = chunks[0] if count == 1 else np.concatenate(chunks)
    halo = np.concatenate(heads)[:halo_rows] if heads else x[:0]
    return Stitched(_partials(_whole(x, halo, where, reductions), reductions), {}, {}, where[3])


def _head(chunk: np.ndarray, rows: int) -> np.ndarray:
    """Copy of the first ``rows`` rows of a ``(1, L, d)`` chunk, shape ``(rows, d)``."""
    return np.array(chunk[0, :rows])


@naming_the_worker
def _combine(reductions: tuple[Reduction, ...], *parts: Stitched) -> Stitched:
    """Left fold of the parts with each reduction's ``combine``, then the cuts whose rows on
    both sides are in (:func:`_stitch`)."""
    total = parts[0]
    for part in parts[1:]:
        total = Stitched(
            tuple(
                r.combine(a, b)
                for r, a, b in zip(reductions, total.partials, part.partials, strict=True)
            ),
            {**total.tails, **part.tails},
            {**total.heads, **part.heads},
            total.chain_length,
        )
    return _stitch(total, reductions)


def _stitch(part: Stitched, reductions: tuple[Reduction, ...]) -> Stitched:
    """``part`` with every cut it holds both sides of reduced: for a cut at row ``b``, each
    reduction with halo ``h`` reduces rows ``b-h:b`` with the next ``min(h, n - b)`` rows as
    their halo, and its partial is combined in (in the order of the cuts)."""
    n = part.chain_length
    partials, tails, heads = list(part.partials), dict(part.tails), dict(part.heads)
    lagged = [(k, r) for k, r in enumerate(reductions) if r.halo]
    for key in sorted(tails.keys() & heads.keys()):
        (chain, cut), tail, head = key, tails.pop(key), heads.pop(key)
        pieces = [
            (
                tail[tail.shape[0] - r.halo :],
                head[: min(r.halo, n - cut)],
                BlockInfo(chain, cut - r.halo, cut, n),
            )
            for _, r in lagged
        ]
        for (k, r), seam in zip(lagged, _partials(pieces, [r for _, r in lagged]), strict=True):
            partials[k] = r.combine(partials[k], seam)
    return Stitched(tuple(partials), tails, heads, n)


@dataclass(frozen=True)
class Finished:
    """What the root of a pass sends back: each reduction's finalized result, or the exception
    a ``finalize`` raised (re-raised as it is where the pass was sent, :meth:`results`)."""

    values: tuple[Any, ...] | None
    error: Exception | None = None

    def results(self) -> list[Any]:
        """The reductions' results; raises the exception of a ``finalize`` that failed."""
        if self.error is not None:
            raise self.error
        assert self.values is not None
        return list(self.values)


def _in_c_order(partial: Partial) -> Partial:
    """``partial`` with every array C-ordered, as a partial sent between processes arrives (a
    strided array is pickled as a C-ordered copy): a ``finalize`` that sums along an axis
    rounds by the array's layout, so the root partial held where it was combined and the
    same partial received from another worker must look alike to give the same bits."""
    if isinstance(partial, np.ndarray):
        return np.ascontiguousarray(partial)
    if isinstance(partial, dict):
        return {key: _in_c_order(value) for key, value in partial.items()}
    if isinstance(partial, list | tuple):
        return type(partial)(_in_c_order(value) for value in partial)
    return partial


@naming_the_worker
def _finish(part: Stitched, reductions: tuple[Reduction, ...]) -> Finished:
    """The root task: every reduction's ``finalize`` on the partials of the whole trajectory
    (no rows may be left before a cut), on the worker that holds them. The caller receives
    the results alone, a few arrays the size of the estimate, not the partials (which can be
    much larger: block statistics of every lag and pair of columns)."""
    if part.tails or part.heads:
        left = ", ".join(f"chain {c} row {b}" for c, b in sorted({**part.tails, **part.heads}))
        raise RuntimeError(f"the cuts at {left} were never stitched")
    partials = _in_c_order(part.partials)
    try:
        values = tuple(r.finalize(p) for r, p in zip(reductions, partials, strict=True))
    except Exception as err:  # noqa: BLE001 - the caller raises it as the pass's own error
        return Finished(None, err)
    return Finished(values)


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
                # the block before lent its tail when it cut (its halo rows: min(H, n - start))
                before = edges[groups[g - 1][0]] if g else start
                head = g > 0 and cuts(before, start, min(max_halo, n - start), max_halo)
                task = dask.delayed(_read_and_reduce, pure=False)(
                    source, where, halo_rows, head, shared, dask_key_name=key
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
    fan_in = combine_fan_in(split_every, sum(int(r.partial_bytes) for r in reductions))
    root, combines = combine_tree(blocks, shared, fan_in, f"{prefix}-combine")
    total = dask.delayed(_finish, pure=False)(root, shared, dask_key_name=f"{prefix}-total")
    return ReductionGraph(
        tuple(blocks),
        total,
        reductions,
        tuple(edges[k0] for k0, _ in groups) + (n,),
        tuple(combines),
    )


#: bytes of partials one combine task may hold at once: where the reductions' partials are
#: large (the response pass's block statistics with hundreds of components) the tree's fan-in
#: shrinks to fit, down to 2, so a worker holds a few partials, not ``split_every`` of them
COMBINE_BYTES = 1 << 30


def combine_fan_in(split_every: int, partial_bytes: int) -> int:
    """The combine tree's fan-in: ``split_every``, or fewer (at least 2) so that a combine
    task's partials, ``partial_bytes`` each, fit in :data:`COMBINE_BYTES`."""
    if partial_bytes <= 0:
        return split_every
    return max(2, min(split_every, COMBINE_BYTES // partial_bytes))


def combine_tree(
    parts: list[Delayed], reductions: Delayed, split_every: int, name: str
) -> tuple[Delayed, list[Delayed]]:
    """A ``split_every``-ary tree of :func:`_combine` over ``parts`` (in order): its root and
    its combine tasks. ``reductions`` is the graph's node of the tuple of reductions."""
    level, combines = 0, []
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
        combines += [part for part, run in zip(parts, runs, strict=True) if len(run) > 1]
        level += 1
    return parts[0], combines
