"""The numba compilation every kernel shares: ``@compiled`` is ``njit(cache=True, nogil=True)``."""

from __future__ import annotations

from numba import njit

compiled = njit(cache=True, nogil=True)
"""Decorator: compile in nopython mode, cache the machine code on disk, release the GIL (the
engine runs blocks in threads). The one place to change how the kernels are compiled."""
