"""Soak test: many estimates in a row on one long-lived cluster, two clients at once.

1. One OU store (``--samples``, default 2e5, in ``--chunk`` time chunks) and the embedded
   cluster of ``--workers`` single-threaded worker processes, kept for the whole run.
2. ``--runs`` estimates in a row (default 50), each result written over the previous one with
   ``write_result``. A psutil thread samples the resident memory of this process (the client)
   and of every worker; open file descriptors and threads are counted after the first run (the
   warm-up: imports, numba caches, the allocator's pools) and after the last. Target: every
   count flat (<= 5 % growth). Every result must equal the first one exactly.
3. Temporary folders left once the cluster is closed: the workers' scratch folders, and
   anything in the work folder besides the store and the result (e.g. ``.result.zarr.tmp-*``).
4. Two client processes estimating on the same cluster at once, and one alone: the maximum
   absolute difference of ``response`` (target 0).

Usage::

    python scripts/soak.py                      # 50 runs of 2e5 samples (a few minutes)
    python scripts/soak.py --runs 10 --samples 50000
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import dask
import numpy as np
import psutil

import kelr_dist
from kelr_dist.engine.cluster import close_embedded_cluster, get_client
from kelr_dist.models.simulate import simulate
from kelr_dist.testing import peak_memory

MiB = 2**20
ESTIMATE = {"max_lag": 200, "progress": False}

CLIENT_PROCESS = textwrap.dedent(
    """
    import sys, time
    import numpy as np
    from distributed import Client
    from kelr_dist import estimate_response
    address, store, out, start_at = sys.argv[1:5]
    with Client(address, set_as_default=False) as client:
        while time.time() < float(start_at):  # both clients begin together
            time.sleep(0.01)
        began = time.time()
        ds = estimate_response(store, client=client, max_lag=200, progress=False)
    np.save(out, ds["response"].values)
    print(began, time.time())
    """
)


def counts(pid: int) -> tuple[int, int, int]:
    """``(resident bytes, open file descriptors, threads)`` of process ``pid``."""
    process = psutil.Process(pid)
    return process.memory_info().rss, process.num_fds(), process.num_threads()


def snapshot(pids: dict[str, int]) -> dict[str, tuple[int, int, int]]:
    return {name: counts(pid) for name, pid in pids.items()}


def growth(before: float, after: float) -> str:
    return f"{100 * (after - before) / before:+.1f} %" if before else "n/a"


def _local_directory(dask_worker) -> str:
    """On a worker: its scratch folder (removed when the cluster closes)."""
    return dask_worker.local_directory


def two_clients(address: str, store: Path, work: Path) -> tuple[list[np.ndarray], float, float]:
    """Two client processes estimating at once: their responses, the seconds during which
    both were estimating, and the seconds from the first start to the last end."""
    start_at = time.time() + 10.0  # both have imported kelr_dist and connected by then
    outs = [work / f"concurrent-{k}.npy" for k in range(2)]
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", CLIENT_PROCESS, address, str(store), str(out), str(start_at)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for out in outs
    ]
    spans = []
    for process in processes:
        stdout, _ = process.communicate(timeout=600)
        if process.returncode != 0:
            raise SystemExit(f"a concurrent client failed (exit {process.returncode})")
        spans.append([float(t) for t in stdout.split()[-2:]])
    overlap = min(end for _, end in spans) - max(begin for begin, _ in spans)
    wall = max(end for _, end in spans) - min(begin for begin, _ in spans)
    return [np.load(out) for out in outs], overlap, wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=50, help="estimates in a row (default 50)")
    parser.add_argument("--samples", type=int, default=200_000, help="OU samples (default 2e5)")
    parser.add_argument("--chunk", type=int, default=25_000, help="time chunk (default 25000)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    parser.add_argument("--workdir", type=Path, default=None, help="default: a new temp folder")
    parser.add_argument(
        "--log-length",
        type=int,
        default=None,
        help="dask's distributed.admin.low-level-log-length for the cluster (default: dask's, "
        "1000): the scheduler keeps that many recent messages per worker, task specs included",
    )
    args = parser.parse_args()
    if args.log_length is not None:  # before the cluster starts: scheduler and workers see it
        dask.config.set({"distributed.admin.low-level-log-length": args.log_length})
    if args.runs < 2:
        parser.error("--runs must be at least 2 (the first run is the warm-up)")

    work = args.workdir or Path(tempfile.mkdtemp(prefix="kelr-soak-"))
    work.mkdir(parents=True, exist_ok=True)
    store, result = work / "ou.zarr", work / "result.zarr"
    if not store.exists():
        simulate("ou", store, args.samples, chunk=args.chunk, seed=12, progress=False)
    load = os.getloadavg()[0]
    print(f"soak: {args.runs} estimates of an OU store, {args.samples} samples in chunks of "
          f"{args.chunk}, {args.workers} workers; load average {load:.2f}")  # fmt: skip

    client = get_client(n_workers=args.workers, quiet=True)
    address = client.scheduler.address
    workers = {f"worker {k}": pid for k, pid in enumerate(sorted(client.run(os.getpid).values()))}
    worker_folders = list(client.run(_local_directory).values())
    pids = {"client": os.getpid(), **workers}

    first = kelr_dist.estimate_response(store, client=client, **ESTIMATE)
    kelr_dist.write_result(first, result, overwrite=True)
    before = snapshot(pids)
    times, writes, worst = [], [], 0.0
    checkpoints = {1: before}
    with peak_memory(list(pids.values())) as peaks:
        for run in range(2, args.runs + 1):
            started = time.perf_counter()
            ds = kelr_dist.estimate_response(store, client=client, **ESTIMATE)
            estimated = time.perf_counter()
            kelr_dist.write_result(ds, result, overwrite=True)
            times.append(estimated - started)
            writes.append(time.perf_counter() - estimated)
            worst = max(worst, float(np.max(np.abs(ds["response"] - first["response"]))))
            if run % 10 == 0:
                checkpoints[run] = snapshot(pids)
    after = snapshot(pids)
    restarted = set(client.run(os.getpid).values()) != set(workers.values())

    (a, b), overlap, concurrent_wall = two_clients(address, store, work)
    alone = first["response"].values
    concurrent_diff = float(np.max(np.abs(a - b)))
    vs_alone = max(float(np.max(np.abs(r - alone))) for r in (a, b))
    close_embedded_cluster()
    time.sleep(1.0)
    for name in ("concurrent-0.npy", "concurrent-1.npy"):
        (work / name).unlink()  # ours, not left-overs
    left = sorted(
        [str(folder) for folder in worker_folders if Path(folder).exists()]
        + [str(entry) for entry in work.iterdir() if entry not in {store, result}]
    )

    median, slowest = statistics.median(times), max(times)
    print(f"estimates run: {args.runs} (the first is the warm-up); estimate median {median:.2f} s, "
          f"max {slowest:.2f} s; write_result median {statistics.median(writes):.2f} s; load "
          f"average now {os.getloadavg()[0]:.2f}")  # fmt: skip
    print(f"max |response - first response| over the runs: {worst:.3g}")
    print(f"worker processes restarted during the soak: {'yes' if restarted else 'no'}")
    header = (
        f"{'process':10} {'RSS after run 1':>16} {'peak':>10} {'final':>10} {'growth':>9}   "
        f"{'fds before->after':>18}   {'threads before->after':>22}"
    )
    print(header)
    for name in pids:
        rss0, fds0, threads0 = before[name]
        rss1, fds1, threads1 = after[name]
        print(
            f"{name:10} {rss0 / MiB:13.0f} MiB {peaks[pids[name]] / MiB:6.0f} MiB "
            f"{rss1 / MiB:6.0f} MiB {growth(rss0, rss1):>9}   {fds0:>8} -> {fds1:<7}   "
            f"{threads0:>10} -> {threads1:<9}"
        )
    print("RSS (MiB) after run " + ", ".join(str(run) for run in checkpoints) + ":")
    for name in pids:
        print(f"  {name:10} " + " ".join(f"{c[name][0] / MiB:6.0f}" for c in checkpoints.values()))
    print(f"temporary folders left: {len(left)}" + "".join(f"\n  {entry}" for entry in left))
    if args.workdir is None:
        shutil.rmtree(work)
    print(f"two clients at once: {concurrent_wall:.1f} s for both ({overlap:.1f} s "
          f"overlapping); max |A - B| = {concurrent_diff:.3g}, max |concurrent - alone| = "
          f"{vs_alone:.3g}")  # fmt: skip


if __name__ == "__main__":
    main()
