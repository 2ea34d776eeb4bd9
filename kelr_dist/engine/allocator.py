"""Keep the kernels' tables and a store's decoded chunks off ``mmap`` on Dask workers (glibc).

Elsewhere the functions here do nothing.

The kernels allocate tables of a few MiB per row block, and a task that reads a store decodes
its stored chunks (64 MiB for 2^22 rows of two float64 components). glibc serves allocations
above its mmap threshold with fresh ``mmap`` pages and returns them on free, and trims the heap
top once more than its trim threshold is free, so every block pays the page faults of its arrays
again. Dask's nanny sets ``MALLOC_TRIM_THRESHOLD_`` in workers, which also switches glibc's
adaptive thresholds off. Besides, glibc gives threads arenas of their own whose heaps hold at
most 64 MiB: a larger array allocated in a worker's task thread, or in zarr's decoding threads,
is mapped fresh whatever the thresholds say.

:func:`tune_allocator` raises both thresholds so one task's working set (a block's tables, or a
stored chunk read with its file bytes, its decoded bytes and the rows, and the chunk of its
halo) is reused from the heap, and keeps new threads in the one main arena (``M_ARENA_MAX``; the
embedded cluster starts its workers with ``MALLOC_ARENA_MAX=1``, so none of their threads has
an arena of its own). The heap then keeps up to the trim threshold of freed memory, which a Dask
worker with a small memory limit cannot spare, so the threshold scales with the limit,
``min(1 GiB, limit / 16)``, and the engine returns all free heap memory after a task once the
worker holds more than :data:`RELEASE_SHARE` of its limit (:func:`release_when_full`). Below that
the next task reuses the heap: returned after every task, it would be faulted in again by every
task.

Only the engine's worker plugin calls these
(:class:`kelr_dist.engine.cluster.WorkerTuning`), in the embedded cluster's workers and, when a
user registers it, in the workers of their own cluster: importing :mod:`kelr_dist` changes
nothing, a ``"synchronous"`` run leaves the caller's allocator alone, and a user's cluster is
left as it is unless asked. :func:`restore_allocator` puts the thresholds back when the plugin is
removed (``M_ARENA_MAX`` is set for the embedded workers only, also through their start
environment: glibc fixes the arena count once threads have made their arenas, so it cannot be
undone). The settings are glibc's ``M_TRIM_THRESHOLD``, ``M_MMAP_THRESHOLD`` and
``M_ARENA_MAX`` (mallopt(3), the GNU C Library manual); the gain lies in the passes' combined
working sets on the workers (see docs/benchmarks.md, section 'Tuning constants').
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
from typing import Any

import psutil

#: largest trim threshold (bytes): a task that reads a stored chunk of 64 MiB and the chunk of
#: its halo holds about six arrays of that size (file bytes, decoded bytes, rows, twice)
TRIM_THRESHOLD = 2**30
#: the trim threshold is at most this share of a worker's memory limit
LIMIT_SHARE = 16
#: a worker gives its free heap memory back after a task once its resident memory is above this
#: share of its memory limit (dask's own target for spilling is 0.6 of it: "Worker Memory
#: Management", distributed.worker.memory.target); below it, keeping the heap saves the page
#: faults of the next task (see docs/benchmarks.md, section 'Tuning constants')
RELEASE_SHARE = 0.5
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8


def thresholds(memory_limit: int | None = None) -> tuple[int, int]:
    """``(mmap threshold, trim threshold)`` in bytes for a process with ``memory_limit``."""
    trim = TRIM_THRESHOLD if not memory_limit else min(TRIM_THRESHOLD, memory_limit // LIMIT_SHARE)
    return trim // 2, trim


@functools.cache
def _glibc_function(name: str) -> Any:
    """glibc's function ``name`` (``None`` elsewhere), looked up once per process
    (``find_library`` runs a subprocess)."""
    library = ctypes.util.find_library("c")
    if library is None:
        return None
    try:
        return getattr(ctypes.CDLL(library), name)
    except (OSError, AttributeError):  # not glibc
        return None


def tune_allocator(memory_limit: int | None = None, one_arena: bool = True) -> bool:
    """Set glibc's mmap and trim thresholds (:func:`thresholds`) and, with ``one_arena``, keep
    threads started from now on in the main arena; ``True`` if it took effect."""
    mmap, trim = thresholds(memory_limit)
    settings = [(_M_MMAP_THRESHOLD, mmap), (_M_TRIM_THRESHOLD, trim)]
    return _mallopt(settings + ([(_M_ARENA_MAX, 1)] if one_arena else []))


#: glibc's default mmap and trim thresholds (mallopt(3): 128 KiB each)
GLIBC_THRESHOLD = 128 * 1024


def restore_allocator() -> bool:
    """Put glibc's mmap threshold back to its default and the trim threshold to the process's
    ``MALLOC_TRIM_THRESHOLD_`` (Dask's nanny sets it) or the default; ``True`` on glibc."""
    trim = int(os.environ.get("MALLOC_TRIM_THRESHOLD_", GLIBC_THRESHOLD))
    return _mallopt([(_M_MMAP_THRESHOLD, GLIBC_THRESHOLD), (_M_TRIM_THRESHOLD, trim)])


def _mallopt(settings: list[tuple[int, int]]) -> bool:
    mallopt = _glibc_function("mallopt")
    if mallopt is None:
        return False
    return all(mallopt(option, value) == 1 for option, value in settings)


def release_free_memory() -> bool:
    """Give all free heap memory back to the system (``malloc_trim(0)``); ``True`` on glibc."""
    trim = _glibc_function("malloc_trim")
    if trim is None:
        return False
    trim(0)
    return True


@functools.cache
def _this_process() -> psutil.Process:
    return psutil.Process()


def release_when_full(memory_limit: int | None) -> bool:
    """:func:`release_free_memory` when this process's resident memory is above
    :data:`RELEASE_SHARE` of ``memory_limit`` (never without a limit); ``True`` if it did."""
    if not memory_limit or _this_process().memory_info().rss <= RELEASE_SHARE * memory_limit:
        return False
    return release_free_memory()
