"""What the tests and scripts check the package with: reference computations, worker memory."""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from kelr_dist.kernels.checks import is_whole
from kelr_dist.kernels.reduction import reduce_in_memory

if TYPE_CHECKING:  # the models are heavy (numba kernels); worker processes never need them
    from kelr_dist.models.mala import MalaSystem


def lag_counts(chain_lengths: int | list[int] | np.ndarray, max_lag: int) -> np.ndarray:
    """Number of pairs ``(n, n+s)`` per lag: ``sum_c max(N_c - s, 0)``, shape ``(S+1,)``.

    The denominators ``N - s`` of eq. 6, pooled over independent chains.
    """
    if not is_whole(max_lag):
        raise ValueError(f"max_lag must be a non-negative integer, got {max_lag!r}")
    lengths = np.atleast_1d(np.asarray(chain_lengths))
    if lengths.ndim != 1 or not np.issubdtype(lengths.dtype, np.integer) or (lengths < 0).any():
        raise ValueError(
            f"chain_lengths must be non-negative integers, one per chain, got {chain_lengths!r}"
        )
    lags = np.arange(max_lag + 1)
    return np.clip(lengths[:, None] - lags[None, :], 0, None).sum(axis=0).astype(np.int64)


def kde_exact(
    samples: np.ndarray, points: np.ndarray, bandwidth: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian product-kernel KDE (eq. 58) and its gradient at ``points``, by direct summation.

    Cost O(N n d), memory O(n d): meant for references on subsamples.

    Parameters
    ----------
    samples : ``(N, d)`` samples ``X_n``.
    points : ``(n, d)`` evaluation points.
    bandwidth : ``(d,)`` per-coordinate bandwidths ``h_k``.

    Returns
    -------
    density : ``(n,)`` ``p_N(points)``.
    gradient : ``(n, d)`` ``grad p_N(points)``.
    """
    from kelr_dist.kernels.baselines.kde import (  # numba: not for workers
        as_samples,
        exact_kde_reduction,
    )

    reduction = exact_kde_reduction(points, bandwidth)
    samples = as_samples("samples", samples, np.asarray(points).shape[1])
    if samples.shape[0] == 0:
        raise ValueError("samples must hold at least one sample, got shape (0, d)")
    return reduce_in_memory(reduction, samples)


def degrees(x: np.ndarray, angles: int = 2) -> np.ndarray:
    """A copy of ``x (..., d)`` with its first ``angles`` components in degrees, wrapped to
    ``[0, 360)`` (the other usual window: a different wrap point as well as other units)."""
    out = np.array(x, dtype=np.float64)
    out[..., :angles] = np.mod(np.degrees(out[..., :angles]), 360.0)
    return out


@dataclass(frozen=True)
class DegreesScore:
    """The exact score of ``model`` for data in the units of :func:`degrees`:
    ``∂/∂(degrees) = (π/180) ∂/∂(radians)`` in the angles."""

    model: MalaSystem

    def __call__(self, x: np.ndarray) -> np.ndarray:
        angles = self.model.angles
        radians = np.array(x, dtype=np.float64)
        radians[:, :angles] *= math.pi / 180.0
        score = self.model.score(radians)
        score[:, :angles] *= math.pi / 180.0
        return score


@contextmanager
def peak_memory(pids: list[int], interval: float = 0.02) -> Iterator[dict[int, int]]:
    """Sample the resident memory of processes ``pids`` in a thread while the block runs.

    Yields ``{pid: peak bytes}``, filled in as the samples come (worker pids:
    ``client.run(os.getpid).values()``).
    """
    import psutil  # the test and bench extras

    peaks = dict.fromkeys(pids, 0)
    processes = [psutil.Process(pid) for pid in pids]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            for proc in processes:
                with suppress(psutil.NoSuchProcess):
                    peaks[proc.pid] = max(peaks[proc.pid], proc.memory_info().rss)
            stop.wait(interval)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield peaks
    finally:
        stop.set()
        thread.join()
