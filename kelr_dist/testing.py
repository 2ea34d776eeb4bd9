"""What the tests and scripts check the package with: reference computations, worker memory."""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import numpy as np

from kelr_dist.kernels.checks import is_whole
from kelr_dist.kernels.reduction import reduce_in_memory
from kelr_dist.kernels.response.lagged import lagged_sums

if TYPE_CHECKING:  # the models are heavy (numba kernels); worker processes never need them
    from kelr_dist.models.mala import MalaSystem
    from kelr_dist.models.protocol import Model


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


def _generator_pairs(model: MalaSystem, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Observables ``f`` and their ``B = -L f`` on the chain's states ``x (n, d)``, ``L`` the
    generator ``L g = Δg + s · ∇g`` in the sampler's coordinates ``u``; each with
    ``E|∇_u f|^2`` summing to 1 per component. Returns ``f (n, q)``, ``B (n, q)`` and the
    component of each column ``(q,)``.

    A real component: ``f = x``, ``B = -s``. An angle: ``cos θ`` and ``sin θ`` (``|∇f|^2`` is
    ``sin^2`` and ``cos^2``), ``B = cos θ + s sin θ`` and ``sin θ - s cos θ``. A positive
    component, moved in ``u = log x``: ``f = u``, ``B = -(x s + 1)`` (the score of ``u``).
    """
    score = model.score(x)
    f, b, component = [], [], []
    for i in range(x.shape[1]):
        s = score[:, i]
        if i < model.angles:
            cos, sin = np.cos(x[:, i]), np.sin(x[:, i])
            f += [cos, sin]
            b += [cos + s * sin, sin - s * cos]
            component += [i, i]
        elif i < model.angles + model.positives:
            f.append(np.log(x[:, i]))
            b.append(-(x[:, i] * s + 1.0))
            component.append(i)
        else:
            f.append(x[:, i])
            b.append(-s)
            component.append(i)
    return np.column_stack(f), np.column_stack(b), np.array(component)


def _gap_terms(f: np.ndarray, b: np.ndarray, max_lag: int) -> tuple[np.ndarray, np.ndarray]:
    """On one stretch of a chain, per lag ``m = 0..S`` and column: ``(E[(f_m - f_0)^2] / 2,
    E[(f_m - f_0)(B_0 - B_m)] / 2)``, each ``(S+1, q)``: ``C(0) - C(m)`` and ``k(m) - k(0)``
    in their time-symmetric forms (small variance at short lags)."""
    n, q = f.shape
    z = np.concatenate([f, b], axis=1)
    sums = lagged_sums(z, z, max_lag)
    lags = np.arange(max_lag + 1)
    pairs = (n - lags)[:, None]
    cols = np.arange(q)
    squares = np.concatenate([np.zeros((1, q)), np.cumsum(f * f, axis=0)])
    products = np.concatenate([np.zeros((1, q)), np.cumsum(f * b, axis=0)])

    def ends(total: np.ndarray) -> np.ndarray:
        # sum over t in [m, n) plus sum over t in [0, n - m)
        return (total[n] - total[lags]) + total[n - lags]

    spread = 0.5 * ends(squares) / pairs - sums[:, cols, cols] / pairs
    drift = 0.5 * (sums[:, cols, cols + q] + sums[:, cols + q, cols] - ends(products)) / pairs
    return spread, drift


def fdt_identity(
    model: MalaSystem,
    n_steps: int,
    times: Sequence[float],
    rng: np.random.Generator,
    batches: int = 20,
    burn_in: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """``(C(0) - C(t)) / ∫_0^t k(s) ds`` per component of a MALA chain at its own ``step``,
    with its standard error: 1 where the chain follows the diffusion ``dU = s dt + sqrt(2) dW``.

    For that reversible diffusion the response of ``f`` to the forcing ``∇f``,
    ``k(t) = E[f(X_t) B(X_0)]`` with ``B = -L f`` (eq. 5), is ``-dC/dt`` with
    ``C(t) = E[f(X_t) f(X_0)]``, so the step response ``∫_0^t k`` (eq. 4) is ``C(0) - C(t)`` at
    every ``t``; a chain whose rejections or discretisation make it run at another speed misses by
    that factor. ``f`` per component as ``_generator_pairs`` says (``k(0) = E|∇f|^2 = 1``
    exactly, used as such); both sides are measured on the chain run at ``subsample = 1``
    after the model's burn-in, ``k`` integrated by the trapezoid rule over every step.

    Parameters
    ----------
    model : a MALA system (its ``subsample`` is ignored).
    n_steps : chain length in steps, split into ``batches`` stretches (batch means).
    times : ``t``, each rounded to a whole number of steps (at least one).
    rng : the chain's generator.
    batches : batches of the batch means.
    burn_in : steps run before the chain (default: the model's burn-in).

    Returns
    -------
    ratio, stderr : ``(len(times), d)``.
    """
    lags = np.array([max(1, round(t / model.step)) for t in times])
    length = n_steps // batches
    if length <= lags.max():
        raise ValueError(f"n_steps={n_steps!r} must give batches longer than the longest lag")
    chain = type(model)(**{**model.params(), "subsample": 1})
    state = cast("Model", model).initial_state(rng)
    steps = model.default_burn_in * model.subsample if burn_in is None else burn_in
    _, state = chain.advance(state, steps, rng)
    x, _ = chain.advance(state, n_steps, rng)
    f, b, component = _generator_pairs(chain, x)
    max_lag = int(lags.max())
    d = x.shape[1]
    members = np.eye(d)[component]  # (q, d): the component of each observable
    left = np.zeros((batches, len(lags), d))
    right = np.zeros((batches, len(lags), d))
    for k in range(batches):
        rows = slice(k * length, (k + 1) * length)
        spread, drift = _gap_terms(f[rows], b[rows], max_lag)
        trapezoid = np.cumsum(0.5 * (drift[1:] + drift[:-1]), axis=0)[lags - 1]
        left[k] = spread[lags] @ members
        right[k] = trapezoid @ members
    right = chain.step * (lags[:, None] + right)  # k(0) = 1 per component
    ratio = left.mean(axis=0) / right.mean(axis=0)
    residual = left - ratio * right
    stderr = residual.std(axis=0, ddof=1) / math.sqrt(batches) / right.mean(axis=0)
    return ratio, stderr


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
