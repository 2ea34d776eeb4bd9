"""A straightforward numpy script of the kernel-embedding response estimate (the baseline of
``scripts/bench_vs_numpy.py``).

All samples in memory; orthonormal Hermite-function tables by their three-term recurrence (and
their derivatives from the same tables); the coefficients of every tensor function of total
degree <= 70 by one GEMM per row block (``C = T1^T T2 / N``); p and grad p at the samples by
GEMM and row sums (``p = rowsum((T1 C_M) * T2)``); a scan of 7 orders M (p_M at every
sample, one GEMM per block for all 7; the highest order whose share of samples with
``p_M < 0`` stays under ``NEGATIVE_SHARE``: the density estimate's negative lobes mark where
the order outgrows the data); the score
``B = -grad p / p`` where ``p >= delta``; and the lagged sums
``k(s, i, j) = sum_n A_i(X_{n+s}) B_j(X_n) / (N - s)`` by FFT, ``A = x - mean``.

Usage::

    python scripts/numpy_kernel_embedding.py STORE [--max-lag S]

prints one JSON line: seconds (the estimate, store read included), the chosen order and the
response's shape.
"""

from __future__ import annotations

import argparse
import json
import math
import time

import numpy as np
import zarr

ORDERS = (10, 20, 30, 40, 50, 60, 70)  # the 7-order scan
ROWS = 8192  # row block of the tables
DELTA = 1e-3  # p below DELTA * max p: no score there (eq. 46)
NEGATIVE_SHARE = 0.01  # the scan's criterion


def hermite_tables(u: np.ndarray, order: int, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """Orthonormal Hermite functions of ``x = mean + scale * u`` and their x-derivatives,
    both ``(len(u), order + 1)``, by the three-term recurrence (``psi_m' = sqrt(m/2)
    psi_{m-1} - sqrt((m+1)/2) psi_{m+1}``). Built order by order as contiguous rows."""
    psi = np.empty((order + 2, u.shape[0]))
    psi[0] = math.pi**-0.25 * np.exp(-0.5 * u * u)
    psi[1] = math.sqrt(2.0) * u * psi[0]
    for m in range(1, order + 1):
        psi[m + 1] = math.sqrt(2.0 / (m + 1)) * u * psi[m] - math.sqrt(m / (m + 1)) * psi[m - 1]
    up = np.sqrt(np.arange(order + 1) / 2.0)[:, None]
    down = np.sqrt((np.arange(order + 1) + 1) / 2.0)[:, None]
    deriv = -down * psi[1:]
    deriv[1:] += up[1:] * psi[:order]
    norm = 1.0 / math.sqrt(scale)
    return (psi[: order + 1] * norm).T, (deriv * (norm / scale)).T


def estimate(x: np.ndarray, max_lag: int) -> tuple[np.ndarray, int]:
    """``(k (S+1, 2, 2), chosen order)`` for samples ``x (N, 2)``."""
    n = x.shape[0]
    top = max(ORDERS)
    mean, scale = x.mean(axis=0), x.std(axis=0)
    u = (x - mean) / scale

    def tables(rows: slice) -> tuple[np.ndarray, ...]:
        t1, d1 = hermite_tables(u[rows, 0], top, scale[0])
        t2, d2 = hermite_tables(u[rows, 1], top, scale[1])
        return t1, d1, t2, d2

    blocks = [slice(a, min(a + ROWS, n)) for a in range(0, n, ROWS)]
    coef = np.zeros((top + 1, top + 1))
    for rows in blocks:  # coefficients: one GEMM per block
        t1, _, t2, _ = tables(rows)
        coef += t1.T @ t2
    coef /= n
    degree = np.add.outer(np.arange(top + 1), np.arange(top + 1))
    masked = [np.where(degree <= m, coef, 0.0) for m in ORDERS]
    stacked = np.concatenate(masked, axis=1)  # (top + 1, 7 (top + 1))

    negative = np.zeros(len(ORDERS))
    for rows in blocks:  # the scan: p_M at the samples for all 7 orders, one GEMM
        t1, _, t2, _ = tables(rows)
        p_all = ((t1 @ stacked).reshape(len(t1), len(ORDERS), top + 1) * t2[:, None, :]).sum(2)
        negative += (p_all < 0).sum(axis=0)
    fine = [j for j in range(len(ORDERS)) if negative[j] <= NEGATIVE_SHARE * n]
    best = fine[-1] if fine else 0
    c = masked[best]

    p = np.empty(n)
    grad = np.empty((n, 2))
    for rows in blocks:  # p and grad p at the chosen order: GEMMs and row sums
        t1, d1, t2, d2 = tables(rows)
        t1c = t1 @ c
        p[rows] = (t1c * t2).sum(axis=1)
        grad[rows, 0] = ((d1 @ c) * t2).sum(axis=1)
        grad[rows, 1] = (t1c * d2).sum(axis=1)
    kept = p >= DELTA * p.max()
    score = np.where(kept[:, None], -grad / np.where(kept, p, 1.0)[:, None], 0.0)

    a = x - mean
    length = 1 << math.ceil(math.log2(n + max_lag + 1))
    fa = np.fft.rfft(a, length, axis=0)
    fb = np.fft.rfft(score, length, axis=0)
    pairs = n - np.arange(max_lag + 1)
    response = np.empty((max_lag + 1, 2, 2))
    for i in range(2):
        for j in range(2):
            lagged = np.fft.irfft(fa[:, i] * np.conj(fb[:, j]), length)[: max_lag + 1]
            response[:, i, j] = lagged / pairs
    return response, ORDERS[best]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("store", help="a trajectory store of one chain, (chain, time, component)")
    parser.add_argument("--max-lag", type=int, default=None, help="default min(2000, N/20)")
    args = parser.parse_args()
    start = time.perf_counter()
    x = np.asarray(zarr.open_array(args.store, path="x", mode="r")[0], dtype=np.float64)
    max_lag = args.max_lag if args.max_lag is not None else min(2000, x.shape[0] // 20)
    response, order = estimate(x, max_lag)
    seconds = time.perf_counter() - start
    print(json.dumps({"seconds": seconds, "order": order, "shape": list(response.shape)}))


if __name__ == "__main__":
    main()
