"""Keep the kernels' per-block tables off ``mmap`` on Dask workers (glibc only; else a no-op).

The kernels allocate tables of a few MiB per row block. glibc serves allocations above its mmap
threshold with fresh ``mmap`` pages and returns them on free, and trims the heap top once more
than its trim threshold is free, so every block pays the page faults of its tables again. Dask's
nanny sets ``MALLOC_TRIM_THRESHOLD_`` in workers, which also switches glibc's adaptive
thresholds off.

:func:`tune_allocator` raises both thresholds so one block's working set (about ten tables) is
reused from the heap (the kernels size their blocks for it: basis tables within
:data:`kelr_dist.kernels.bases.CACHE_BUDGET`, FFT groups and blocking segments below the mmap
threshold). The heap
then keeps up to the trim threshold of freed memory, which a Dask worker with a small memory
limit cannot spare, so the threshold scales with the limit, ``min(64 MiB, limit / 16)``, and the
engine returns all free heap memory after a task once the worker holds more than
:data:`RELEASE_SHARE` of its limit (:func:`release_when_full`). Below that the next task reuses
the heap: returned after every task, it would be faulted in again by every task.

Only the engine calls these, in its tasks on Dask workers: importing :mod:`kelr_dist` changes
nothing, and a ``"synchronous"`` run leaves the caller's allocator alone. The thresholds are glibc's
``M_TRIM_THRESHOLD`` and ``M_MMAP_THRESHOLD`` (mallopt(3), the GNU C Library manual); the gain
lies in the passes' combined working sets on the workers (see docs/benchmarks.md, section
'Tuning constants').
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from typing import Any

import psutil

#: largest trim threshold (bytes): one block's working set at order 70 is about 40 MiB
TRIM_THRESHOLD = 64 * 2**20
#: the trim threshold is at most this share of a worker's memory limit
LIMIT_SHARE = 16
#: a worker gives its free heap memory back after a task once its resident memory is above this
#: share of its memory limit (dask's own target for spilling is 0.6 of it: "Worker Memory
#: Management", distributed.worker.memory.target); below it, keeping the heap saves the page
#: faults of the next task (see docs/benchmarks.md, section 'Tuning constants')
RELEASE_SHARE = 0.5
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


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


def tune_allocator(memory_limit: int | None = None) -> bool:
    """Set glibc's mmap and trim thresholds (:func:`thresholds`); ``True`` if it took effect."""
    mallopt = _glibc_function("mallopt")
    if mallopt is None:
        return False
    mmap, trim = thresholds(memory_limit)
    return mallopt(_M_MMAP_THRESHOLD, mmap) == 1 and mallopt(_M_TRIM_THRESHOLD, trim) == 1


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
