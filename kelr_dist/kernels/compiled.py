"""The numba compilation every kernel shares: ``@compiled`` is ``njit(cache=True, nogil=True)``."""

from __future__ import annotations

from numba import njit

compiled = njit(cache=True, nogil=True)
"""Decorator: compile in nopython mode, cache the machine code on disk, release the GIL (the
engine runs blocks in threads). The one place to change how the kernels are compiled."""

contracted = njit(cache=True, nogil=True, fastmath={"contract"})
"""As :data:`compiled`, and ``a * b + c`` may be fused into one FMA instruction (one rounding
instead of two; no other fast-math freedom): for kernels bound by their multiply-adds (the
order sweep's register blocks, 1.2x with it)."""

reassociated = njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
"""As :data:`contracted`, and sums may be reassociated (no other fast-math freedom: NaN and inf
keep their meaning): a reduction over rows is then vectorised, in a rounding order of the
compiler's choosing. For kernels that reduce over many rows what is computed per row (the
coefficient sums of a recurrence, 3x with it)."""
