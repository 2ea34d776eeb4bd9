"""Benchmark of the numerical core: wall time of each stage, its rate against this
machine's measured GEMM / FFT rate, a per-basis-function loop and the KDE baseline.

Usage::

    python scripts/bench_core.py             # N = 1e6 and 1e7
    python scripts/bench_core.py --quick     # N = 1e6 only
    python scripts/bench_core.py --base-blocks  # the error bars' base block: default vs fitted

Data: the paper's triple-well (eq. 59), simulated with ``make_model("triple-well").advance``
(every stored sample, after the model's burn-in); ``--iid`` uses i.i.d. samples of a
three-component Gaussian mixture at the well centres instead. d = 2, M = 60 (1891 functions),
sweep over M = 0..70, S = 2000 lags.

Every stage runs on ``--threads`` threads (default 2), rows split evenly, partials combined; BLAS
is single-threaded per thread (environment variables set before numpy is imported;
``threadpoolctl`` is not installed). The kernels release the GIL (numba ``nogil``, BLAS, pocketfft).
Prints medians of ``--repeats`` runs (default 3 at N <= 1e6, 1 above) and the load average.
"""

from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import math  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from functools import partial, reduce  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
from scipy import fft  # noqa: E402

from kelr_dist.kernels.baselines import kde  # noqa: E402
from kelr_dist.kernels.bases.coordinates import fit_basis  # noqa: E402
from kelr_dist.kernels.bases.families import TensorBasis, Workspace  # noqa: E402
from kelr_dist.kernels.reduction import BlockInfo, add_partials, reduce_in_memory  # noqa: E402
from kelr_dist.kernels.response.blocking import (  # noqa: E402
    combine_block_partials,
    default_base_block,
    fitted_base_block,
    response_block_partial,
)
from kelr_dist.kernels.response.lagged import default_block_rows, lagged_sums  # noqa: E402
from kelr_dist.kernels.scores.kernel_embedding import (  # noqa: E402
    KernelDensity,
    coefficient_reduction,
    coefficient_sums,
    row_blocks,
)
from kelr_dist.kernels.scores.selection import combine_sweeps, sweep_sums  # noqa: E402
from kelr_dist.models.registry import make_model  # noqa: E402
from kelr_dist.testing import kde_exact  # noqa: E402

ORDER = 60
SWEEP_ORDER = 70
MAX_LAG = 2000
DELTA = 1e-4  # threshold of B in the benchmark (the pipeline chooses it from the sweep)


# --------------------------------------------------------------------------- machine rates


def _median_time(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def parallel(threads: int, jobs: Sequence[Callable[[], Any]]) -> list[Any]:
    with ThreadPoolExecutor(threads) as pool:
        return list(pool.map(lambda job: job(), jobs))


def gemm_rate(threads: int) -> float:
    """float64 GEMM flop/s on ``threads`` threads (one single-threaded GEMM each)."""
    size = 1500
    rng = np.random.default_rng(0)
    mats = [(rng.random((size, size)), rng.random((size, size))) for _ in range(threads)]
    run = lambda: parallel(threads, [partial(np.matmul, a, b) for a, b in mats])  # noqa: E731
    run()
    return threads * 2 * size**3 / _median_time(run, 3)


def fft_rate(length: int, threads: int) -> float:
    """Real-FFT flop/s (model 2.5 F log2 F per transform) for length ``length`` on ``threads``."""
    batch = max(1, (1 << 20) // length)
    rng = np.random.default_rng(0)
    data = [rng.random((batch, length)) for _ in range(threads)]
    run = lambda: parallel(threads, [partial(fft.rfft, v, axis=-1) for v in data])  # noqa: E731
    run()
    return threads * batch * fft_flops(length) / _median_time(run, 5)


def write_rate(threads: int) -> float:
    """Bytes/s written when ``threads`` threads each fill an 8 MiB array 16 times: the tables'
    bound (one row block's four tables, 4096 x 61 values and derivatives of two coordinates,
    are 8 MiB per thread, written once per block; their inputs are a few rows in cache)."""
    arrays = [np.empty(1 << 20) for _ in range(threads)]

    def fill(a: np.ndarray) -> None:
        for _ in range(16):
            a.fill(1.0)

    run = lambda: parallel(threads, [partial(fill, a) for a in arrays])  # noqa: E731
    run()
    return threads * 16 * arrays[0].nbytes / _median_time(run, 7)


def fft_flops(length: int) -> float:
    return 2.5 * length * math.log2(length)


# --------------------------------------------------------------------------- data


def triple_well_samples(n: int, seed: int) -> np.ndarray:
    model = make_model("triple-well")
    rng = np.random.default_rng(seed)
    state = model.advance(model.initial_state(rng), model.default_burn_in, rng)[1]
    return model.advance(state, n, rng)[0]


def mixture_samples(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = np.array([[0.0, 0.0], [1.0, 0.0], [0.5, math.sqrt(3) / 2]]) * 1.7
    labels = rng.choice(3, n, p=[0.4, 0.35, 0.25])
    return centres[labels] + 0.45 * rng.standard_normal((n, 2))


# --------------------------------------------------------------------------- stages


@dataclass
class Stage:
    name: str
    seconds: float
    flops: float
    bound: str  # "gemm" or "fft" or "loop"
    model: str


def split_rows(n: int, threads: int) -> list[tuple[int, int]]:
    edges = np.linspace(0, n, threads + 1).astype(int)
    return list(zip(edges[:-1], edges[1:], strict=True))


def table_stage(basis: TensorBasis, x: np.ndarray, threads: int) -> None:
    """Values and derivatives of every coordinate's functions at the mapped samples, row block
    by row block in reused buffers: the tables ``p_M`` and ``∇p_M`` build."""

    def job(lo: int, hi: int) -> None:
        spaces = [Workspace() for _ in basis.coordinates]
        for rows in row_blocks(hi - lo, basis.row_block()):  # the package's blocks
            part = x[lo:hi][rows]
            for k, c in enumerate(basis.coordinates):
                c.family.evaluate(c.mapped(part[:, k]), basis.max_orders[k], spaces[k])

    parallel(threads, [partial(job, a, b) for a, b in split_rows(len(x), threads)])


def coefficient_stage(basis: TensorBasis, x: np.ndarray, threads: int) -> KernelDensity:
    parts = parallel(
        threads,
        [partial(coefficient_sums, basis, x[a:b]) for a, b in split_rows(len(x), threads)],
    )
    return KernelDensity.from_sums(basis, reduce(add_partials, parts))


def evaluate_stage(density: KernelDensity, x: np.ndarray, threads: int) -> np.ndarray:
    """``B = -grad p / p`` where ``p >= DELTA``, else 0 (eq. 46), ``(n, 2)``."""
    parts = parallel(
        threads,
        [partial(density.evaluate, x[a:b]) for a, b in split_rows(len(x), threads)],
    )
    p = np.concatenate([part[0] for part in parts])
    grad = np.concatenate([part[1] for part in parts])
    kept = p >= DELTA
    return np.where(kept[:, None], -grad / np.where(kept, p, 1.0)[:, None], 0.0)


def sweep_stage(density: KernelDensity, x: np.ndarray, threads: int) -> dict:
    parts = parallel(
        threads,
        [partial(sweep_sums, density, x[a:b]) for a, b in split_rows(len(x), threads)],
    )
    return reduce(combine_sweeps, parts)


def lagged_stage(a: np.ndarray, b: np.ndarray, threads: int) -> np.ndarray:
    jobs = [
        partial(lagged_sums, a[lo : hi + MAX_LAG], b[lo:hi], MAX_LAG)
        for lo, hi in split_rows(len(b), threads)
    ]
    return sum(parallel(threads, jobs))


def error_bar_stage(a: np.ndarray, b: np.ndarray, threads: int) -> dict:
    n = len(b)
    jobs = [
        partial(
            response_block_partial, a[lo : hi + MAX_LAG], b[lo:hi], MAX_LAG, BlockInfo(0, lo, hi, n)
        )
        for lo, hi in split_rows(n, threads)
    ]
    return reduce(combine_block_partials, parallel(threads, jobs))


# --------------------------------------------------------------------------- flop models


def table_flops(n: int, basis: TensorBasis) -> tuple[float, str]:
    entries = n * sum(m + 1 for m in basis.max_orders)
    return (
        16.0 * entries,
        "16 bytes written per (sample, coordinate, degree): value and derivative (bound: the "
        "measured fill rate; 6 flops per entry, 0.4 flop/byte, cannot reach the GEMM rate)",
    )


def coefficient_flops(n: int, basis: TensorBasis) -> tuple[float, str]:
    rows, cols = basis.max_orders[0] + 1, len(basis.tails)
    gemm = 2 * 2.0 * n * rows * cols
    return gemm, (
        f"2 GEMMs (sum, sum of squares) of 2 n {rows} x {cols} flops; tables not counted "
        f"(useful share {basis.size / (rows * cols):.0%}: the box holds the total index set)"
    )


def evaluate_flops(n: int, basis: TensorBasis) -> tuple[float, str]:
    rows, cols = basis.max_orders[0] + 1, len(basis.tails)
    gemm = 2.0 * (2 * n) * rows * cols
    rowsums = 2.0 * 3 * n * cols
    return gemm + rowsums, f"GEMM [Psi1; Psi1'] C: 2 (2n) {rows} x {cols}, row sums 6 n {cols}"


def sweep_flops(n: int, density: KernelDensity) -> tuple[float, str]:
    return 3.0 * n * density.basis.size, (
        f"3 flops per (sample, function), P = {density.basis.size}; a scalar loop, no GEMM form"
    )


def lagged_flops(n: int, q: int, d: int) -> tuple[float, str]:
    block = default_block_rows(MAX_LAG)
    length = fft.next_fast_len(block + MAX_LAG, real=True)
    blocks = math.ceil(n / block)
    transforms = blocks * (q + d) + q * d
    products = blocks * q * d * (length // 2 + 1) * 8
    return transforms * fft_flops(length) + products, (
        f"{transforms} real FFTs of length {length} (2.5 F log2 F each) + spectral products"
    )


def error_bar_flops(n: int, q: int, d: int) -> tuple[float, str]:
    k0 = default_base_block(MAX_LAG)
    length = fft.next_fast_len(k0 + MAX_LAG, real=True)
    blocks = math.ceil(n / k0)
    transforms = blocks * (q + d + q * d)
    squares, _ = lagged_flops(n, q, d)
    products = blocks * q * d * (length // 2 + 1) * 8
    return transforms * fft_flops(length) + products + squares, (
        f"per base block K0 = {k0}: {q + d} forward + {q * d} inverse FFTs of length {length}, "
        "plus the lagged sums of the squares"
    )


# --------------------------------------------------------------------------- baselines


def per_basis_loop(
    basis: TensorBasis, density: KernelDensity, x: np.ndarray, tables_once: bool
) -> tuple[float, float]:
    """The straightforward way (the paper's MATLAB timing): for each multi-index, evaluate the
    product of the 1-D functions at all samples and accumulate (a vector operation over the
    samples per basis function). ``tables_once=False`` evaluates each 1-D function by its own
    recurrence per multi-index (as calling a polynomial routine per function does);
    ``tables_once=True`` reads it from 1-D tables computed once (the fastest such loop).
    Returns (coefficient seconds, p and grad p seconds) on ``x``."""
    coords = basis.coordinates
    ys = [c.mapped(x[:, k]) for k, c in enumerate(coords)]
    orders = basis.max_orders

    def coef_column(k: int, m: int, table: list[np.ndarray]) -> np.ndarray:
        if tables_once:
            return table[k][:, m]
        c = coords[k]
        return c.family.weighted_polynomials(ys[k], m, 1 - c.family.beta)[:, -1]

    def eval_columns(k: int, m: int, table: list) -> tuple[np.ndarray, np.ndarray]:
        if tables_once:
            return table[k][0][:, m], table[k][1][:, m]
        values, derivs = coords[k].evaluate(x[:, k], m)
        return values[:, -1], derivs[:, -1]

    start = time.perf_counter()
    table: list[Any] = (
        [c.coefficient_table(x[:, k], orders[k]) for k, c in enumerate(coords)]
        if tables_once
        else []
    )
    coefficients = np.empty(basis.size)
    for i, m in enumerate(basis.indices):
        coefficients[i] = np.mean(
            coef_column(0, int(m[0]), table) * coef_column(1, int(m[1]), table)
        )
    coef_seconds = time.perf_counter() - start

    start = time.perf_counter()
    table = [c.evaluate(x[:, k], orders[k]) for k, c in enumerate(coords)] if tables_once else []
    p = np.zeros(len(x))
    grad = np.zeros(x.shape)
    for m, cm in zip(basis.indices, density.coefficients, strict=True):
        (v1, d1), (v2, d2) = eval_columns(0, int(m[0]), table), eval_columns(1, int(m[1]), table)
        p += cm * v1 * v2
        grad[:, 0] += cm * d1 * v2
        grad[:, 1] += cm * v1 * d2
    return coef_seconds, time.perf_counter() - start


def direct_lag_loop(a: np.ndarray, b: np.ndarray, lags: int) -> float:
    """eq. 6 lag by lag (``a[s:].T @ b[:n-s]``), seconds for ``lags`` lags."""
    n = len(b)
    start = time.perf_counter()
    for s in range(lags):
        a[s:n].T @ b[: n - s]
    return time.perf_counter() - start


def kde_binned(x: np.ndarray, threads: int) -> float:
    start = time.perf_counter()
    h = kde.silverman_bandwidth(x.std(axis=0, ddof=1), len(x))
    grid = kde.default_grid(x.min(axis=0), x.max(axis=0), h)
    chunks = split_rows(len(x), threads)
    parts = parallel(
        threads,
        [partial(kde.linear_binning, x[a:b], grid) for a, b in chunks],
    )
    estimate = kde.BinnedKDE(grid, sum(parts), len(x), h)
    parallel(threads, [partial(estimate.evaluate, x[a:b]) for a, b in chunks])
    return time.perf_counter() - start


def kde_exact_seconds(x: np.ndarray, n_samples: int, n_points: int, threads: int) -> float:
    h = kde.silverman_bandwidth(x.std(axis=0, ddof=1), len(x))
    points = x[:n_points]
    chunks = split_rows(n_points, threads)
    start = time.perf_counter()
    parallel(
        threads,
        [partial(kde_exact, x[:n_samples], points[a:b], h) for a, b in chunks],
    )
    return time.perf_counter() - start


# --------------------------------------------------------------------------- report


def report(title: str, stages: list[Stage], rates: dict[str, float]) -> None:
    print(f"\n{title}")
    print(f"  {'stage':<34} {'seconds':>9} {'Gflop':>9} {'Gflop/s':>8} {'of bound':>8}")
    print("  (the tables' row is in GB and GB/s written)")
    for s in stages:
        rate = s.flops / s.seconds / 1e9 if s.seconds > 0 else float("nan")
        frac = f"{s.flops / s.seconds / rates[s.bound]:.0%}" if s.bound in rates else "-"
        print(f"  {s.name:<34} {s.seconds:9.3f} {s.flops / 1e9:9.2f} {rate:8.2f} {frac:>8}")
    for s in stages:
        print(f"    {s.name}: {s.model}")


def bench(n: int, args: argparse.Namespace, rates: dict[str, float]) -> None:
    repeats = args.repeats or (3 if n <= 1_000_000 else 1)
    t = time.perf_counter()
    x = mixture_samples(n, args.seed) if args.iid else triple_well_samples(n, args.seed)
    source = "i.i.d. mixture" if args.iid else "triple-well simulation"
    print(f"\n=== N = {n:.0e}, d = 2, {source} ({time.perf_counter() - t:.1f} s to make) ===")
    print(f"load average before: {os.getloadavg()}")
    coords = tuple(fit_basis(x))
    basis = TensorBasis(coords, ORDER)
    wide = TensorBasis(coords, SWEEP_ORDER)
    threads = args.threads
    timed = lambda fn: _median_time(fn, repeats)  # noqa: E731

    density = coefficient_stage(basis, x, threads)
    # untimed: the sweep needs the coefficients up to order 70
    density_70 = reduce_in_memory(coefficient_reduction(wide), x, 1 << 20)
    a, b = x, evaluate_stage(density, x, threads)
    stages = []
    for name, fn, (flops, model), bound in [
        ("basis tables (values + derivs)", lambda: table_stage(basis, x, threads),
         table_flops(n, basis), "write"),
        (f"coefficients M={ORDER} (P={basis.size})", lambda: coefficient_stage(basis, x, threads),
         coefficient_flops(n, basis), "gemm"),
        ("p and grad p at all samples", lambda: evaluate_stage(density, x, threads),
         evaluate_flops(n, basis), "gemm"),
        (f"delta/R/eta sweep M=0..{SWEEP_ORDER}", lambda: sweep_stage(density_70, x, threads),
         sweep_flops(n, density_70), "gemm"),
        (f"lagged sums S={MAX_LAG}", lambda: lagged_stage(a, b, threads),
         lagged_flops(n, 2, 2), "fft"),
        ("error bars (block partials + sums)", lambda: error_bar_stage(a, b, threads),
         error_bar_flops(n, 2, 2), "fft_k0"),
    ]:  # fmt: skip
        stages.append(Stage(name, timed(fn), flops, bound, model))
    print(f"load average after: {os.getloadavg()}")
    report(f"core stages, {threads} threads, median of {repeats}", stages, rates)
    by = {s.name.split(" ")[0]: s.seconds for s in stages}
    pipeline = by["coefficients"] + by["p"] + by["delta/R/eta"] + by["error"]
    print(
        f"\n  core path (coefficients + p/grad p + sweep + error bars, which include the lagged "
        f"sums): {pipeline:.2f} s  [target at N = 1e7: < 15 s on 2 cores]"
    )

    # per-basis-function loops on a subsample, extrapolated linearly in N and divided by the
    # threads (as if the loop were split over rows perfectly)
    sub = min(n, args.loop_rows)
    factor = n / sub / threads
    lag_loop = direct_lag_loop(a, b, args.loop_lags) * (MAX_LAG + 1) / args.loop_lags / threads
    print(
        f"\nper-basis-function loop (each multi-index: product of 1-D functions at all samples, "
        f"accumulate), timed on {sub} rows, extrapolated linearly to N, divided by {threads} "
        f"threads; the sweep as one more evaluation of p at P = {wide.size} (values only, a "
        f"third of p and grad p); lags by the direct loop a[s:].T @ b[:n-s] "
        f"({args.loop_lags} lags timed, scaled to {MAX_LAG + 1})"
    )
    for label, once in (("1-D tables computed once", True), ("recurrence per function", False)):
        coef_loop, eval_loop = (t * factor for t in per_basis_loop(basis, density, x[:sub], once))
        sweep_loop = eval_loop * wide.size / basis.size / 3
        loop_total = coef_loop + eval_loop + sweep_loop + lag_loop
        print(
            f"  {label}: coefficients {coef_loop:.1f} s, p and grad p {eval_loop:.1f} s, "
            f"sweep ~{sweep_loop:.1f} s, lags {lag_loop:.1f} s; total {loop_total:.1f} s = "
            f"{loop_total / pipeline:.0f}x the core path  [target >= 25x]"
        )

    binned = kde_binned(x, threads)
    n_samples, n_points = min(n, 100_000), 2000
    exact = kde_exact_seconds(x, n_samples, n_points, threads) * (n / n_samples) * (n / n_points)
    print(
        f"\nKDE baseline (Silverman): binned (linear binning + FFT + interpolation at all N "
        f"samples) {binned:.2f} s; exact at all N samples ~{exact:.3g} s (timed {n_samples} "
        f"samples x {n_points} points, extrapolated as N^2)"
    )


def base_blocks(repeats: int, seed: int) -> None:
    """The error bars' partial (:func:`response_block_partial`) of one chunk on one thread,
    at the default base block (``>= max(S, 256)``) and at the fitted one (``>= 4 S``, see
    :func:`fitted_base_block`), alternated; medians of ``repeats`` (3 by default)."""
    rng = np.random.default_rng(seed)
    repeats = repeats or 3
    print(
        "\n| S | q x columns | rows | default K0 | fitted K0 | default (s) | fitted (s) | ratio |\n"
        "|---|---|---|---|---|---|---|---|"
    )
    cases = ((200, 2, 5, 10**6), (2000, 2, 5, 10**6), (600, 80, 5, 2 * 10**5))
    for lags, q, columns, rows in cases:
        a = rng.standard_normal((rows + lags, q))
        b = rng.standard_normal((rows, columns))
        info = BlockInfo(0, 0, rows, rows + lags)
        sizes = (default_base_block(lags), fitted_base_block(lags, 1, 10**7))
        times: dict[int, list[float]] = {k0: [] for k0 in sizes}
        for _ in range(repeats):
            for k0 in sizes:
                start = time.perf_counter()
                response_block_partial(a, b, lags, info, base_block=k0)
                times[k0].append(time.perf_counter() - start)
        old, new = (statistics.median(times[k0]) for k0 in sizes)
        print(
            f"| {lags} | {q} x {columns} | {rows:.0e} | {sizes[0]} | {sizes[1]} | {old:.3f} | "
            f"{new:.3f} | {new / old:.2f} |"
        )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=float, nargs="+", default=[1e6, 1e7])
    parser.add_argument("--quick", action="store_true", help="N = 1e6 only")
    parser.add_argument("--iid", action="store_true", help="i.i.d. mixture instead of simulation")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=0, help="0: 3 at N <= 1e6, else 1")
    parser.add_argument("--loop-rows", type=int, default=20_000)
    parser.add_argument("--loop-lags", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--base-blocks", action="store_true", help="only the error bars' base block comparison"
    )
    args = parser.parse_args(argv)
    if args.base_blocks:
        print(f"one thread, load average: {os.getloadavg()}")
        base_blocks(args.repeats, args.seed)
        return
    sizes = [1e6] if args.quick else args.n
    print(f"cores: {os.cpu_count()}, threads: {args.threads}, load average: {os.getloadavg()}")
    k0 = default_base_block(MAX_LAG)
    rates = {
        "gemm": gemm_rate(args.threads),
        "fft": fft_rate(
            fft.next_fast_len(default_block_rows(MAX_LAG) + MAX_LAG, real=True), args.threads
        ),
        "fft_k0": fft_rate(fft.next_fast_len(k0 + MAX_LAG, real=True), args.threads),
        "write": write_rate(args.threads),
    }
    print(
        f"measured on {args.threads} threads: GEMM {rates['gemm'] / 1e9:.1f} Gflop/s "
        f"(1500^3 per thread), real FFT {rates['fft'] / 1e9:.2f} Gflop/s (length "
        f"{fft.next_fast_len(default_block_rows(MAX_LAG) + MAX_LAG, real=True)}, 2.5 F log2 F), "
        f"{rates['fft_k0'] / 1e9:.2f} Gflop/s (length "
        f"{fft.next_fast_len(k0 + MAX_LAG, real=True)}), memory fill "
        f"{rates['write'] / 1e9:.1f} GB/s"
    )
    for n in sizes:
        bench(int(n), args, rates)


if __name__ == "__main__":
    main()
