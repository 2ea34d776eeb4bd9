"""Benchmark the test-system integrators and end-to-end simulation into a trajectory store.

1. Integrator throughput of every model on one core (median of a few repeats): integrator
   steps/s of ``model.advance`` by the wall clock and per CPU second of this process (the
   figure that holds on a machine shared with other jobs), and what drawing the same standard
   normals with numpy's ``Generator.standard_normal`` alone takes, as a share of ``advance``
   (the triple-well draws its normals inside its kernel, from numba's compiled
   ``Generator.standard_normal``: the same numbers).
2. ``kelr_dist.models.simulate.simulate`` of the triple-well (one chain, no Dask client) for several
   N:
   wall time and peak resident memory of a fresh process (itself and its children), with the
   target "flat in N, under 1 GiB".

Usage::

    python scripts/bench_simulate.py            # N = 1e6, 1e7, 1e8
    python scripts/bench_simulate.py --quick    # N <= 1e7, shorter throughput runs
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from kelr_dist.models.registry import MODEL_NAMES, make_model

# standard normals each integrator step consumes (kelr_dist.models.integrators kernels)
NORMALS_PER_STEP = {"triple-well": 4, "langevin-morse": 1, "ou": 2}
GIB = 1 << 30


def steps_per_sample(model) -> int:
    return getattr(model, "subsample", 1)


def throughput(name: str, steps: int, repeats: int) -> dict[str, float]:
    """Median integrator steps/s of ``advance`` and of drawing its normals alone."""
    model = make_model(name)
    n_samples = max(1, steps // steps_per_sample(model))
    rng = np.random.Generator(np.random.PCG64(0))
    state = model.advance(model.initial_state(rng), 1000, rng)[1]  # compile, then time
    total_steps = n_samples * steps_per_sample(model)
    buffer = np.empty(1 << 16)
    advance_times, cpu_times, normal_times = [], [], []
    for _ in range(repeats):
        start, cpu = time.perf_counter(), time.process_time()
        state = model.advance(state, n_samples, rng)[1]
        advance_times.append(time.perf_counter() - start)
        cpu_times.append(time.process_time() - cpu)
        start = time.perf_counter()
        for _ in range(total_steps * NORMALS_PER_STEP.get(name, 0) // buffer.size + 1):
            rng.standard_normal(out=buffer)
        normal_times.append(time.perf_counter() - start)
    advance_time = statistics.median(advance_times)
    normal_time = statistics.median(normal_times)
    return {
        "steps_per_s": total_steps / advance_time,
        "steps_per_cpu_s": total_steps / statistics.median(cpu_times),
        "samples_per_s": n_samples / advance_time,
        "normals_share": normal_time / advance_time,
    }


def child(n_samples: int, path: str, chunk: int) -> None:
    """Run one simulation in this (fresh) process and print its figures as JSON."""
    from kelr_dist.models.simulate import simulate

    start = time.perf_counter()
    simulate("triple-well", path, n_samples, chains=1, seed=0, chunk=chunk, progress=False)
    elapsed = time.perf_counter() - start
    size = sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())
    # ru_maxrss is in KiB on Linux
    rss = max(
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,
    )
    print(json.dumps({"seconds": elapsed, "peak_rss": rss * 1024, "store_bytes": size}))


def end_to_end(n_samples: int, chunk: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="kelr-bench-") as tmp:
        path = str(Path(tmp) / "traj.zarr")
        command = [sys.executable, __file__, "--child", str(n_samples), path, str(chunk)]
        done = subprocess.run(command, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="N <= 1e7, shorter timings")
    parser.add_argument("--chunk", type=int, default=262144, help="samples per store chunk")
    parser.add_argument("--repeats", type=int, default=3, help="throughput repeats (median)")
    parser.add_argument("--no-store", action="store_true", help="throughput only")
    parser.add_argument("--models", nargs="*", choices=MODEL_NAMES, help="default: all")
    parser.add_argument("--child", nargs=3, metavar=("N", "PATH", "CHUNK"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(int(args.child[0]), args.child[1], int(args.child[2]))
        return

    steps = 2_000_000 if args.quick else 10_000_000
    print(f"integrator throughput, one core, median of {args.repeats} x {steps:.0e} steps")
    print(f"load average: {os.getloadavg()[0]:.1f} (wall-clock figures need a quiet machine)")
    print(f"{'model':<16}{'steps/s':>12}{'steps/CPU-s':>13}{'samples/s':>12}{'numpy normals':>15}")
    for name in args.models or MODEL_NAMES:
        r = throughput(name, steps, args.repeats)
        print(
            f"{name:<16}{r['steps_per_s']:>12.3g}{r['steps_per_cpu_s']:>13.3g}"
            f"{r['samples_per_s']:>12.3g}"
            + (f"{r['normals_share']:>15.0%}" if name in NORMALS_PER_STEP else f"{'-':>15}")
        )
    if args.no_store:
        return

    sizes = [10**6, 10**7] if args.quick else [10**6, 10**7, 10**8]
    print(f"\nsimulate('triple-well', chains=1, chunk={args.chunk}, client=None), fresh process")
    print(f"{'N':>8}{'seconds':>10}{'samples/s':>12}{'peak RSS MiB':>14}{'store MiB':>11}")
    peaks = []
    for n in sizes:
        r = end_to_end(n, args.chunk)
        peaks.append(r["peak_rss"])
        print(
            f"{n:>8.0e}{r['seconds']:>10.1f}{n / r['seconds']:>12.3g}"
            f"{r['peak_rss'] / 2**20:>14.0f}{r['store_bytes'] / 2**20:>11.0f}"
        )
    verdict = "met" if max(peaks) < GIB and max(peaks) < 1.5 * min(peaks) else "NOT met"
    print(f"target 'peak RSS flat in N and under 1 GiB': {verdict}")


if __name__ == "__main__":
    main()
