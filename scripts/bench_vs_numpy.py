"""The package against a straightforward numpy script of the same estimate, alternating.

``scripts/numpy_kernel_embedding.py`` (all samples in memory, Hermite tables by recurrence,
coefficients by one GEMM, p and grad p by GEMM and row sums, a 7-order scan, FFT lagged sums)
and ``kelr_dist.estimate_response(store, estimator="kernel-embedding")`` on the embedded
cluster run on the same triple-well store, each in a fresh process, one after the other,
``--repeats`` times, in two environments: as this shell has it with the three thread variables
removed, and with ``OMP_NUM_THREADS``, ``OPENBLAS_NUM_THREADS`` and ``MKL_NUM_THREADS`` set to
the core count (a common site default). Prints each run, the medians and the ratio
package / numpy (target: <= 0.33, goal 0.2).

The package's time is that of the ``estimate_response`` call (store read included), after the
embedded cluster has started and the package is imported; the numpy script's is its estimate,
store read included, after its imports.

Usage::

    python scripts/bench_vs_numpy.py                  # N = 1e6, 3 alternations: ~2-4 minutes
    python scripts/bench_vs_numpy.py --samples 10000000 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import dask.system

HERE = Path(__file__).resolve().parent
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def package_child(store: str) -> None:
    """In a fresh process: the package's estimate on the embedded cluster, timed (JSON).

    Imports come before the clock starts, as they do in the numpy script (there numpy and zarr;
    here the pipeline, which brings numba and zarr: ~0.8 s that is not the estimate)."""
    from kelr_dist import estimate_response
    from kelr_dist.engine.cluster import close_embedded_cluster, get_client

    get_client(quiet=True).wait_for_workers(1)
    start = time.perf_counter()
    result = estimate_response(store, estimator="kernel-embedding", progress=False)
    seconds = time.perf_counter() - start
    close_embedded_cluster()
    print(json.dumps({"seconds": seconds, "shape": list(result["response"].shape)}))


def run(command: list[str], env: dict[str, str]) -> float:
    done = subprocess.run(command, check=True, capture_output=True, text=True, env=env)
    return float(json.loads(done.stdout.strip().splitlines()[-1])["seconds"])


def make_store(path: Path, n: int) -> None:
    from kelr_dist.models.simulate import simulate

    simulate("triple-well", path, n, chains=1, seed=0, progress=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=float, default=1e6, help="N (default 1e6)")
    parser.add_argument("--repeats", type=int, default=3, help="alternations per environment")
    parser.add_argument("--store", help="an existing triple-well store to use instead")
    parser.add_argument(
        "--alternate",
        choices=("programs", "environments"),
        default="programs",
        help="programs: numpy and package in turn, per environment (default); environments: "
        "the package alone, with and without the thread variables in turn",
    )
    parser.add_argument("--output", type=Path, help="also write the table as Markdown here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        package_child(args.child)
        return

    cores = dask.system.CPU_COUNT
    with tempfile.TemporaryDirectory(prefix="kelr-vs-numpy-") as tmp:
        store = args.store
        if store is None:
            store = str(Path(tmp) / "triple-well.zarr")
            started = time.perf_counter()
            make_store(Path(store), int(args.samples))
            print(f"store: {int(args.samples):.0e} samples ({time.perf_counter() - started:.0f} s)")
        else:  # the figures below name the store's own size
            from kelr_dist.data.store import open_trajectory

            chains, length, _ = open_trajectory(store).shape
            args.samples = chains * length
        clean = {k: v for k, v in os.environ.items() if k not in THREAD_VARIABLES}
        clean.pop("DASK_SCHEDULER_ADDRESS", None)
        environments = {
            "thread variables unset": clean,
            f"thread variables = {cores} (core count)": clean
            | dict.fromkeys(THREAD_VARIABLES, str(cores)),
        }
        numpy_cmd = [sys.executable, str(HERE / "numpy_kernel_embedding.py"), store]
        package_cmd = [sys.executable, __file__, "--child", store]
        if args.alternate == "environments":
            runs: dict[str, list[float]] = {label: [] for label in environments}
            for r in range(args.repeats):
                for label, env in environments.items():
                    runs[label].append(run(package_cmd, env))
                    print(f"  run {r + 1}: package, {label:<36}{runs[label][-1]:8.2f} s")
            print(f"\nN = {int(args.samples):.0e}, package only, {args.repeats} alternations")
            for label, values in runs.items():
                print(f"{label:<40}median {statistics.median(values):8.2f} s")
            return
        summary = []
        for label, env in environments.items():
            print(f"\n{label}: load average {os.getloadavg()[0]:.1f}")
            times: dict[str, list[float]] = {"numpy": [], "package": []}
            for r in range(args.repeats):
                for name, command in (("numpy", numpy_cmd), ("package", package_cmd)):
                    times[name].append(run(command, env))
                    print(f"  run {r + 1}: {name:<8}{times[name][-1]:8.2f} s", flush=True)
            medians = {k: statistics.median(v) for k, v in times.items()}
            ratio = medians["package"] / medians["numpy"]
            summary.append((label, medians, ratio))
        print(f"\nN = {int(args.samples):.0e}, {args.repeats} alternations, {cores} cores")
        print(f"{'environment':<36}{'numpy':>9}{'package':>9}{'ratio':>8}")
        for label, medians, ratio in summary:
            print(f"{label:<36}{medians['numpy']:>8.2f}s{medians['package']:>8.2f}s{ratio:>8.2f}")
        print("target: ratio <= 0.33 (goal 0.2)")
        if args.output is not None:
            args.output.write_text(markdown(summary, int(args.samples), args.repeats, cores))
            print(f"wrote {args.output}")


def markdown(
    summary: list[tuple[str, dict[str, float], float]], samples: int, repeats: int, cores: int
) -> str:
    """The comparison as a Markdown table, with the command, the date and the machine."""
    rows = [
        "| environment | numpy script | package | package / numpy |",
        "|---|---|---|---|",
        *(
            f"| {label} | {m['numpy']:.1f} s | {m['package']:.1f} s | {ratio:.2f} |"
            for label, m, ratio in summary
        ),
    ]
    command = f"python scripts/bench_vs_numpy.py --samples {samples:.0e} --repeats {repeats}"
    return (
        "\n".join(rows)
        + f"\n\nMedians of {repeats} alternations, N = {samples:.0e}. Written by `{command} "
        f"--output docs/benchmarks/vs_numpy.md` on {time.strftime('%Y-%m-%d')} ({cores} cores, "
        f"{platform.machine()}, load {os.getloadavg()[0]:.1f} at the end).\n"
    )


if __name__ == "__main__":
    main()
