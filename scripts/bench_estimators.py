"""Cost of the automatic estimate against the kernel embedding alone, alternating in one run.

``estimator="auto"`` fits both estimators, scores them on held-out folds, computes the lag-0
Stein residuals and the affine Stein correction; ``estimator="kernel-embedding"`` is the
paper's method alone. Both run on the same store and the same embedded cluster, alternating
``--repeats`` times; printed: each wall time, the medians, their ratio (target ≤ 2 at d = 2) and
the machine's load average.

    python scripts/bench_estimators.py --store runs/accuracy/triple-well-1e+07.zarr
    python scripts/bench_estimators.py --system triple-well --samples 1e6   # simulates first
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings
from pathlib import Path

import kelr_dist

ESTIMATORS = ("kernel-embedding", "auto")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", type=Path, default=None)
    parser.add_argument("--system", default="triple-well")
    parser.add_argument("--samples", type=float, default=1e7)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    store = args.store
    if store is None:
        store = Path("runs/bench") / f"{args.system}-{args.samples:.0e}.zarr"
        if not store.exists():
            kelr_dist.simulate(args.system, store, n_samples=int(args.samples), seed=2026)
    times: dict[str, list[float]] = {name: [] for name in ESTIMATORS}
    kelr_dist.estimate_response(store, estimator="kernel-embedding", progress=False)  # warm-up
    for repeat in range(args.repeats):
        for name in ESTIMATORS:
            started = time.perf_counter()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ds = kelr_dist.estimate_response(store, estimator=name, progress=False)
            times[name].append(time.perf_counter() - started)
            print(
                f"repeat {repeat}: {name:16} {times[name][-1]:6.1f} s  "
                f"(passes {ds.attrs['passes']}, store reads {ds.attrs['store_reads']}, "
                f"load {os.getloadavg()[0]:.1f})",
                flush=True,
            )
    medians = {name: statistics.median(v) for name, v in times.items()}
    print(
        f"\n{store}: median kernel embedding {medians['kernel-embedding']:.1f} s, automatic "
        f"{medians['auto']:.1f} s, ratio {medians['auto'] / medians['kernel-embedding']:.2f} "
        "(target <= 2)"
    )


if __name__ == "__main__":
    main()
