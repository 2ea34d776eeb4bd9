"""A 5-D system written outside the package, in odd units: does the automatic estimate hold?

The accuracy suite's systems come from :mod:`kelr_dist.data`; its rules were checked on them.
This script writes its own: in 5-D (no suite system has d = 5), a curved valley (a banana in
``x1, x2``), a double well in ``x3`` coupled to ``x1``, and a heavy-tailed correlated pair
``x4, x5`` (a Student-like radial tail), ``p ∝ exp(-U)`` with

    U = x1²/8 + (x2 - 0.4 x1² + 1)² / 0.72 + (x3² - 1)² + x1 x3 / 2
        + 3.5 log(1 + (x4² + x5² - 0.6 x4 x5) / 5)

It is sampled by its own MALA chain (numba; step 0.01, every 10th state kept, ``dt = 0.1``),
so the samples have exactly ``p`` as their law, and the exact FDT response uses the true score
``-∇U`` on the same samples. ``--units`` puts coordinate k in units of ``units**k`` and adds
100 to every coordinate (the estimate must not change). Printed: the largest error over lags
of each diagonal entry (``|k̂_ii - k_ii| / max|k_ii|``) for the chosen, the kernel-embedding
and the score-matching responses, the choice, and every warning raised.

    python scripts/unseen_5d.py --samples 1e6
    python scripts/unseen_5d.py --samples 1e6 --units 10
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
from numba import njit

D = 5


@njit(cache=True)
def potential_and_gradient(x: np.ndarray, g: np.ndarray) -> float:  # pragma: no cover
    """``U(x)`` and ``∇U`` (into ``g``) of the module docstring's system."""
    x1, x2, x3, x4, x5 = x[0], x[1], x[2], x[3], x[4]
    v = x2 - 0.4 * x1 * x1 + 1.0
    r = x4 * x4 + x5 * x5 - 0.6 * x4 * x5
    tail = 3.5 / (5.0 + r)
    g[0] = x1 / 4.0 - 0.8 * x1 * v / 0.36 + 0.5 * x3
    g[1] = v / 0.36
    g[2] = 4.0 * x3 * (x3 * x3 - 1.0) + 0.5 * x1
    g[3] = tail * (2.0 * x4 - 0.6 * x5)
    g[4] = tail * (2.0 * x5 - 0.6 * x4)
    return (
        x1 * x1 / 8.0
        + v * v / 0.72
        + (x3 * x3 - 1.0) ** 2
        + 0.5 * x1 * x3
        + 3.5 * np.log(1.0 + r / 5.0)
    )


@njit(cache=True)
def mala(n: int, step: float, keep_every: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` states of a Metropolis-adjusted Langevin chain for ``p ∝ exp(-U)`` from 0."""
    x, y = np.zeros(D), np.zeros(D)
    g, gy = np.zeros(D), np.zeros(D)
    u = potential_and_gradient(x, g)
    out = np.empty((n, D))
    noise = np.sqrt(2.0 * step)
    for i in range(n):
        for _ in range(keep_every):
            for k in range(D):
                y[k] = x[k] - step * g[k] + noise * rng.standard_normal()
            uy = potential_and_gradient(y, gy)
            forward, backward = 0.0, 0.0
            for k in range(D):
                forward += (y[k] - x[k] + step * g[k]) ** 2
                backward += (x[k] - y[k] + step * gy[k]) ** 2
            if np.log(rng.random()) < u - uy - (backward - forward) / (4.0 * step):
                x[:] = y
                g[:] = gy
                u = uy
        out[i] = x
    return out


def score(x: np.ndarray) -> np.ndarray:
    """The exact score ``-∇U`` at ``x (n, 5)``."""
    out = np.empty_like(x)
    for i in range(x.shape[0]):
        potential_and_gradient(x[i], out[i])
    return -out


def diagonal_errors(ds, name: str) -> np.ndarray:
    exact = ds["response_exact"].values
    k = ds[name].values
    return np.array(
        [np.abs(k[:, i, i] - exact[:, i, i]).max() / np.abs(exact[:, i, i]).max() for i in range(D)]
    )


def main() -> None:
    import kelr_dist

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=float, default=1e6)
    parser.add_argument("--units", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    started = time.perf_counter()
    rng = np.random.default_rng(args.seed)
    x = mala(int(args.samples) + 5000, 0.01, 10, rng)[5000:]  # burn-in: 500 time units
    print(f"simulated {x.shape[0]:.0e} samples in {time.perf_counter() - started:.1f} s")
    units = args.units ** np.arange(D)
    data = x * units + 100.0

    def exact_score(z: np.ndarray) -> np.ndarray:
        return score((z - 100.0) / units) / units

    started = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds = kelr_dist.estimate_response(
            data, dt=0.1, max_time=5.0, exact=True, score=exact_score, progress=False
        )
    print(f"estimated in {time.perf_counter() - started:.1f} s (embedded cluster)")
    for w in caught:
        print(f"warning: {w.category.__name__}: {w.message}")
    for name in ("response", "response_kernel_embedding", "response_score_matching"):
        if name in ds:
            print(f"{name:26} diagonal errors {np.round(diagonal_errors(ds, name), 3)}")
    keys = ("estimator", "order", "degree", "estimator_disagreement")
    print({k: ds.attrs[k] for k in keys if k in ds.attrs})


if __name__ == "__main__":
    main()
