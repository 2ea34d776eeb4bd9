"""The resumable sampling loop the models share: normals drawn in order, kernels fed sub-blocks.

A model's ``advance(state, n, rng)`` returns the next ``n`` stored samples; ``advance(a)`` then
``advance(b)`` (the same ``rng`` continued) equals ``advance(a + b)`` bit for bit, because each
stored sample consumes a fixed number of standard normals from one numpy ``Generator`` stream, in
order, whatever the sub-block size.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kelr_dist.kernels.checks import is_whole

#: standard normals drawn per sub-block (bounds the simulator's scratch memory: 512 KiB)
NORMALS_PER_BLOCK = 1 << 16

Kernel = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]
"""``kernel(x0 (d,), normals (k, m), out (k, d))`` fills ``out`` with the next ``k`` samples."""


def start(state: np.ndarray, n_samples: int, d: int) -> np.ndarray:
    """A float64 copy of ``state`` (the caller's is never modified), after checking that
    ``n_samples`` is a non-negative integer and that ``state`` has shape ``(d,)``."""
    if not is_whole(n_samples):
        raise ValueError(f"n_samples={n_samples!r} must be a non-negative integer")
    x = np.array(state, dtype=np.float64)
    if x.shape != (d,):
        raise ValueError(f"state of shape {x.shape} must have shape ({d},)")
    return x


def run_blocks(
    state: np.ndarray,
    n_samples: int,
    rng: np.random.Generator,
    normals_per_sample: int,
    kernel: Kernel,
    d: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Advance ``state`` by ``n_samples`` stored samples, drawing normals in sub-blocks.

    ``kernel(x0 (d,), normals (k, normals_per_sample), out (k, d))`` fills ``out`` with the
    next ``k`` samples. The normals are drawn from ``rng`` in order, so the result does not
    depend on the sub-block size nor on how a run is split into calls.

    Returns
    -------
    samples : (n_samples, d) float64.
    new_state : (d,) float64, the last sample (a copy of ``state`` when ``n_samples == 0``).
    """
    x = start(state, n_samples, d)
    out = np.empty((n_samples, d))
    per_block = max(1, NORMALS_PER_BLOCK // normals_per_sample)
    buffer = np.empty((min(per_block, n_samples), normals_per_sample))
    for begin in range(0, n_samples, per_block):
        stop = min(begin + per_block, n_samples)
        normals = buffer[: stop - begin]
        rng.standard_normal(out=normals)
        kernel(x, normals, out[begin:stop])
        x = out[stop - 1].copy()
    return out, x


def points(x: np.ndarray, d: int) -> np.ndarray:
    """``x`` as a C-contiguous float64 ``(n, d)`` array (``(n,)`` accepted when ``d == 1``)."""
    x = np.ascontiguousarray(x, dtype=np.float64)
    if d == 1 and x.ndim == 1:
        x = x[:, None]
    if x.ndim != 2 or x.shape[1] != d:
        raise ValueError(f"points of shape {x.shape} must have shape (n, {d})")
    return x
