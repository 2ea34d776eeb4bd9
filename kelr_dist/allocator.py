"""glibc allocator helpers for the engine's worker tasks (glibc only; a no-op elsewhere).

:func:`release_free_memory` (``malloc_trim(0)``) is what the engine uses: after every task it
gives the freed heap back, so a worker with a small memory limit keeps no garbage between
tasks. Nothing here runs at import, and nothing changes the caller's process.

:func:`tune_allocator` raised glibc's mmap and trim thresholds so that the kernels' per-block
tables were reused from the heap instead of fresh ``mmap`` pages (once measured: p and ∇p at
1e6 samples, order 60, 2.7 s instead of 1.0 s). The kernels now reuse their tables, and the
tuning no longer pays, so the engine does not call it. Measured again (this machine, a fresh
process with the nanny's ``MALLOC_TRIM_THRESHOLD_=65536``, one BLAS thread, 1e6 samples, order
60, min of 3; a busy machine, ±15 %)::

    stage                 untuned          tuned            minor page faults
    p and ∇p              1.16-1.47 s      1.20-1.48 s      32.2-32.7 k both
    coefficient sums      0.52-0.59 s      0.52-0.57 s      29.9 k both

It is kept, with :func:`thresholds`, to repeat that measurement on other kernels.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Any

#: largest trim threshold (bytes): one block's working set at order 70 is about 40 MiB
TRIM_THRESHOLD = 64 * 2**20
#: the trim threshold is at most this share of a worker's memory limit
LIMIT_SHARE = 16
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def thresholds(memory_limit: int | None = None) -> tuple[int, int]:
    """``(mmap threshold, trim threshold)`` in bytes for a process with ``memory_limit``."""
    trim = TRIM_THRESHOLD if not memory_limit else min(TRIM_THRESHOLD, memory_limit // LIMIT_SHARE)
    return trim // 2, trim


def _glibc_function(name: str) -> Any:
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
