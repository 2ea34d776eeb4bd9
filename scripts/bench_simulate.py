"""Benchmark the test-system integrators and end-to-end simulation into a trajectory store.

1. Integrator throughput of every model on one core (median of a few repeats): integrator
   steps/s of ``model.advance``, and the share of that time spent drawing the standard normals
   (numpy ``Generator.standard_normal`` into a reused buffer, as ``advance`` does).
2. ``kelr_dist.simulate.simulate`` of the triple-well (one chain, no Dask client) for several N:
   wall time and peak resident memory of a fresh process (itself and its children), with the
   target "flat in N, under 1 GiB".

Usage::

    python scripts/bench_simulate.py            # N = 1e6, 1e7, 1e8
    python scripts/bench_simulate.py --quick    # N <= 1e7, shorter throughput runs
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from kelr_dist.models import MODEL_NAMES, make_model

# standard normals each integrator step consumes (kelr_dist.integrators kernels)
NORMALS_PER_STEP = {"triple-well": 4, "langevin-morse": 1, "ou": 2}
GIB = 1 << 30


def steps_per_sample(model) -> int:
    return getattr(model, "subsample", 1)


def throughput(name: str, steps: int, repeats: int) -> dict[str, float]:
    """Median integrator steps/s of ``advance`` and of drawing its normals alone."""
    model = make_model(name)
    n_samples = max(1, steps // steps_per_sample(model))
    rng = np.random.default_rng(0)
    state = model.advance(model.initial_state(rng), 1000, rng)[1]  # compile, then time
    total_steps = n_samples * steps_per_sample(model)
    buffer = np.empty(1 << 16)
    advance_times, normal_times = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        state = model.advance(state, n_samples, rng)[1]
        advance_times.append(time.perf_counter() - start)
        start = time.perf_counter()
        for _ in range(total_steps * NORMALS_PER_STEP[name] // buffer.size + 1):
            rng.standard_normal(out=buffer)
        normal_times.append(time.perf_counter() - start)
    advance_time = statistics.median(advance_times)
    normal_time = statistics.median(normal_times)
    return {
        "steps_per_s": total_steps / advance_time,
        "samples_per_s": n_samples / advance_time,
        "normals_share": normal_time / advance_time,
    }


def child(n_samples: int, path: str, chunk: int) -> None:
    """Run one simulation in this (fresh) process and print its figures as JSON."""
    from kelr_dist.simulate import simulate

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
    parser.add_argument("--child", nargs=3, metavar=("N", "PATH", "CHUNK"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(int(args.child[0]), args.child[1], int(args.child[2]))
        return

    steps = 2_000_000 if args.quick else 10_000_000
    print(f"integrator throughput, one core, median of {args.repeats} x {steps:.0e} steps")
    print(f"{'model':<16}{'steps/s':>12}{'samples/s':>12}{'normals share':>15}")
    for name in MODEL_NAMES:
        r = throughput(name, steps, args.repeats)
        print(
            f"{name:<16}{r['steps_per_s']:>12.3g}{r['samples_per_s']:>12.3g}"
            f"{r['normals_share']:>15.0%}"
        )

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
