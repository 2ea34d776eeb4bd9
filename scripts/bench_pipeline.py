"""Benchmark the whole estimate: out of core, accuracy with automatic choices, speed.

1. Out of core: an OU trajectory store of >= 8 GiB (float64) estimated on the embedded
   cluster of 2 workers x 1 GiB; wall time and every worker's peak resident memory (sampled by
   a psutil thread on the worker pids).
2. Accuracy, nothing tuned by hand: error = max over lags t <= 10 of |estimate -
   response_exact| on the same data, diagonal and off-diagonal entries apart, with the largest
   reported standard error; OU (N = 1e7) against ``expm(-Γt)`` for t <= 3 in units of the
   reported standard error; triple-well (N = 1e7, M = 60 and automatic, KDE baseline) and
   Langevin-Morse (N = 1e7, Laguerre(θ=1) x Hermite M = (90, 0) box and automatic, KDE).
3. Speed: wall time and samples/s of the whole estimate (triple-well, M = 60, S = 2000) for
   N = 1e6, 1e7, 1e8 on the embedded 2-worker cluster, wall time per pass at N = 1e7
   (through ``kelr_dist.engine.passes.run_reductions``), the in-memory core path
   (``client="synchronous"`` on a numpy array) at the same N, and the ratio to the paper's
   1.54e3 s (MATLAB, N = 1e7).

Every figure is printed with the machine's load average (the machine is shared). Generated
stores are kept in ``--cache`` (default ``runs/bench``) and reused; the out-of-core store is
deleted after its run.

Usage::

    python scripts/bench_pipeline.py                      # full sizes (~25 min on 2 cores)
    python scripts/bench_pipeline.py --quick              # small smoke run
    python scripts/bench_pipeline.py --only speed accuracy
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

from kelr_dist.data.models import make_model
from kelr_dist.data.simulate import simulate
from kelr_dist.data.store import open_trajectory
from kelr_dist.engine.cluster import close_embedded_cluster, get_client
from kelr_dist.engine.memory import peak_memory
from kelr_dist.engine.passes import run_reductions
from kelr_dist.kernels.bases import TensorBasis
from kelr_dist.kernels.coordinates import choose_basis, gamma_reduction_for
from kelr_dist.kernels.density import coefficient_reduction
from kelr_dist.kernels.moments import moments_reduction
from kelr_dist.kernels.response import (
    DensityScore,
    constant_forcing,
    identity_observable,
    response_reduction,
)
from kelr_dist.kernels.selection import choose_delta, criteria_reduction
from kelr_dist.pipeline.estimate import estimate_response

GIB = 1 << 30
PAPER_SECONDS = 1.54e3  # paper, Table 1: triple-well, M = 60, N = 1e7
CHAINS = 2


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load {one:.1f}/{five:.1f}/{fifteen:.1f}"


def say(text: str) -> None:
    print(f"{text}   [{load()}]", flush=True)


def cached_store(cache: Path, model: str, n: int, *, client: Any, path: Path | None = None) -> Path:
    """A ``model`` store of ``n`` samples in ``CHAINS`` chains (seed 0) and time chunks of
    2**20 samples, simulated on ``client`` once (the path says model and N)."""
    path = path or cache / f"{model}-{n:.0e}.zarr"
    if not path.exists():
        start = time.perf_counter()
        simulate(model, path, n // CHAINS, chains=CHAINS, chunk=1 << 20, client=client)
        say(f"  simulated {path.name}: {time.perf_counter() - start:.1f} s")
    return path


# --- 1. out of core -------------------------------------------------------------------------------


def out_of_core(cache: Path, quick: bool) -> None:
    # workers pause at 80 % of their limit; one that imported kelr_dist holds ~250 MiB already
    memory, nbytes = (600 << 20, GIB // 2) if quick else (GIB, 8 * GIB + (64 << 20))
    print(f"\n== out of core: OU store {nbytes / GIB:.2f} GiB on 2 workers x {memory >> 20} MiB")
    free = shutil.disk_usage(cache).free
    if free < 1.5 * nbytes:
        say(f"  skipped: {free / GIB:.1f} GiB free disk, need {1.5 * nbytes / GIB:.1f} GiB")
        return
    n = nbytes // (2 * 8)  # two float64 components
    path = cache / "out-of-core-ou.zarr"
    try:
        start = time.perf_counter()
        cached_store(cache, "ou", n, client=get_client(n_workers=2, quiet=True), path=path)
        say(f"  simulated {n:.3g} samples: {time.perf_counter() - start:.0f} s")
        client = get_client(n_workers=2, memory_limit=memory, quiet=True)  # replaces the cluster
        pids = list(client.run(os.getpid).values())
        start = time.perf_counter()
        with peak_memory(pids) as peaks:
            ds = estimate_response(path, client=client, max_order=8, max_lag=200, exact=True)
        wall = time.perf_counter() - start
    finally:
        shutil.rmtree(path, ignore_errors=True)
        close_embedded_cluster()
    peaks_mib = [round(p / 2**20) for p in peaks.values()]
    say(
        f"  estimate of {ds.attrs['n_samples']:.3g} samples: {wall:.0f} s "
        f"({ds.attrs['n_samples'] / wall:.3g} samples/s); worker peak RSS {peaks_mib} MiB "
        f"(limit {memory >> 20} MiB each; store / total limit = {nbytes / (2 * memory):.1f})"
    )


# --- 2. accuracy ----------------------------------------------------------------------------------


def errors(ds: xr.Dataset, name: str, t_max: float) -> tuple[float, float, float]:
    """(max diagonal, max off-diagonal |name - response_exact|, max stderr) over t <= t_max."""
    window = ds.sel(lag=ds["time"] <= t_max + 1e-12)
    diff = np.abs(window[name] - window["response_exact"]).values
    diagonal = np.eye(diff.shape[1], diff.shape[2], dtype=bool)
    off = diff[:, ~diagonal].max() if (~diagonal).any() else float("nan")
    return float(diff[:, diagonal].max()), float(off), float(window[f"{name}_stderr"].max())


def accuracy_row(label: str, path: Path, client: Any, **kwargs: Any) -> xr.Dataset:
    start = time.perf_counter()
    ds = estimate_response(path, client=client, exact=True, max_time=10.0, **kwargs)
    wall = time.perf_counter() - start
    for name in [v for v in ("response", "response_kde") if v in ds]:
        diag, off, stderr = errors(ds, name, 10.0)
        kind = label if name == "response" else f"{label} KDE"
        say(
            f"  {kind:<40} diag {diag:.4f}  off-diag {off:.4f}  max stderr {stderr:.4f}  "
            f"order {ds.attrs['order']}  rejection {ds.attrs['rejection']:.2e}  {wall:.0f} s"
        )
    return ds


def accuracy(cache: Path, quick: bool) -> None:
    n = 10**5 if quick else 10**7
    print(f"\n== accuracy, N = {n:.0e} (error: max over t <= 10 of |estimate - exact FDT|)")
    client = get_client(n_workers=2, quiet=True)

    ou = cached_store(cache, "ou", n, client=client)
    ds = estimate_response(ou, client=client, exact=True, max_time=3.0)
    truth = make_model("ou").response(ds["time"].values)
    error = np.abs(ds["response"].values - truth)
    ratio = error / ds["response_stderr"].values
    say(
        f"  {'OU vs expm(-Γt), t <= 3':<40} max error {error.max():.4f}  "
        f"max error/stderr {ratio.max():.2f}  within 2 stderr: {np.mean(ratio <= 2):.1%} of "
        f"entries  order {ds.attrs['order']}  basis {ds.attrs['basis'].split('(')[0]}"
    )

    tw = cached_store(cache, "triple-well", n, client=client)
    accuracy_row("triple-well M = 60", tw, client, order=60, kde=True)
    accuracy_row("triple-well automatic", tw, client)

    lm = cached_store(cache, "langevin-morse", n, client=client)
    accuracy_row(
        "Langevin-Morse Laguerre x Hermite (90, 0)",
        lm,
        client,
        basis="laguerre(theta=1),hermite",
        order=(90, 0),
        index_set="box",
        kde=True,
    )
    accuracy_row("Langevin-Morse automatic", lm, client)


# --- 3. speed -------------------------------------------------------------------------------------


def pass_times(path: Path, client: Any, order: int, max_lag: int) -> dict[str, float]:
    """Wall time of each pass of the estimate (basis fixed by the moments, order given)."""
    traj = open_trajectory(path)
    times = {}

    def timed(name: str, *reductions: Any) -> list[Any]:
        start = time.perf_counter()
        out = run_reductions(traj, reductions, client, progress=False)
        times[name] = time.perf_counter() - start
        return out

    (moments,) = timed("moments", moments_reduction())
    gamma_pass = gamma_reduction_for(moments)
    gamma = timed("gamma", gamma_pass)[0] if gamma_pass is not None else None
    basis = TensorBasis(tuple(choose_basis(moments, gamma)), order, "total")
    (density,) = timed("coefficients", coefficient_reduction(basis))
    (criteria,) = timed("criteria", criteria_reduction(density))
    delta = float(choose_delta(criteria)[order])
    names = [str(c) for c in traj["component"].values]
    scores = {"kme": DensityScore(density, order, delta)}
    timed(
        "response",
        response_reduction(scores, identity_observable(names), constant_forcing(names), max_lag),
    )
    return times


def speed(cache: Path, quick: bool, sizes: tuple[int, ...] | None = None) -> None:
    sizes = sizes or ((10**5, 10**6) if quick else (10**6, 10**7, 10**8))
    order, max_lag = 60, 2000
    print(f"\n== speed: triple-well, M = {order}, S = {max_lag}, 2 workers")
    client = get_client(n_workers=2, quiet=True)
    walls = {}
    for n in sizes:
        path = cached_store(cache, "triple-well", n, client=client)
        start = time.perf_counter()
        estimate_response(
            path, client=client, estimator="kernel-embedding", order=order, max_lag=max_lag
        )
        walls[n] = time.perf_counter() - start
        say(f"  N = {n:.0e}: {walls[n]:.1f} s, {n / walls[n]:.3g} samples/s")
    middle = 10**7 if 10**7 in sizes else min(sizes)
    if middle <= 10**7:  # per pass and the in-memory core path (a 1e8 array: 1.6 GB)
        times = pass_times(cache / f"triple-well-{middle:.0e}.zarr", client, order, max_lag)
        passes = ", ".join(f"{k} {v:.1f} s" for k, v in times.items())
        say(f"  passes at N = {middle:.0e}: {passes}")

        x = open_trajectory(cache / f"triple-well-{middle:.0e}.zarr").values
        close_embedded_cluster()  # the core path gets the two cores alone
        start = time.perf_counter()
        estimate_response(
            x,
            dt=make_model("triple-well").dt,
            client="synchronous",
            estimator="kernel-embedding",
            order=order,
            max_lag=max_lag,
        )
        core = time.perf_counter() - start
        say(
            f"  in-memory core path (synchronous; this process, OPENBLAS_NUM_THREADS="
            f"{os.environ.get('OPENBLAS_NUM_THREADS', 'unset')}) at N = {middle:.0e}: "
            f"{core:.1f} s; "
            f"engine / core = {walls[middle] / core:.2f} (engine on 2 workers); "
            f"engine / (core / 2) = {2 * walls[middle] / core:.2f}"
        )
    if 10**7 in walls:
        say(
            f"  paper (MATLAB, N = 1e7): {PAPER_SECONDS:.3g} s; this: {walls[10**7]:.1f} s, "
            f"{PAPER_SECONDS / walls[10**7]:.0f}x faster (target: < 20 s, >= 75x)"
        )
    if len(sizes) > 1:
        per_sample = {n: walls[n] / n for n in sizes}
        say(
            "  seconds per 1e6 samples: "
            + json.dumps({f"{n:.0e}": round(v * 1e6, 2) for n, v in per_sample.items()})
        )


SECTIONS = {"ooc": out_of_core, "accuracy": accuracy, "speed": speed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (smoke run)")
    parser.add_argument("--cache", type=Path, default=Path("runs/bench"), help="store cache")
    parser.add_argument("--only", nargs="+", choices=list(SECTIONS), default=list(SECTIONS))
    parser.add_argument(
        "--speed-sizes", nargs="+", type=float, help="N of the speed runs (default 1e6 1e7 1e8)"
    )
    args = parser.parse_args()
    cache = args.cache / ("quick" if args.quick else "full")
    cache.mkdir(parents=True, exist_ok=True)
    say(f"bench_pipeline ({'quick' if args.quick else 'full'}), {os.cpu_count()} CPUs")
    for name in args.only:
        if name == "speed" and args.speed_sizes:
            speed(cache, args.quick, tuple(int(n) for n in args.speed_sizes))
        else:
            SECTIONS[name](cache, args.quick)
    close_embedded_cluster()


if __name__ == "__main__":
    main()
