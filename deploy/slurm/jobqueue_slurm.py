"""Estimate a response operator on a SLURM cluster with dask-jobqueue.

dask-jobqueue submits the Dask workers as SLURM jobs of their own; this driver (run on a login
node or in a small allocation of its own) holds the scheduler and the client and calls the
Python API ``kelr_dist.estimate_response``. The store must be on a file system every compute
node sees (e.g. ``$SCRATCH``).

    pip install dask-jobqueue            # not a kelr_dist dependency
    python deploy/slurm/jobqueue_slurm.py $SCRATCH/triple-well.zarr $SCRATCH/response.zarr \\
        --jobs 8 --queue compute --account myproject
"""

from __future__ import annotations

import argparse
import os

from dask.distributed import Client
from dask_jobqueue import SLURMCluster

import kelr_dist


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("store", help="trajectory store (zarr) on a shared file system")
    parser.add_argument("out", help="result store (zarr) to write")
    parser.add_argument("--jobs", type=int, default=4, help="SLURM worker jobs to submit")
    parser.add_argument("--cores", type=int, default=8, help="cores (= worker processes) per job")
    parser.add_argument("--memory", default="32GiB", help="memory per job")
    parser.add_argument("--walltime", default="02:00:00", help="walltime per worker job")
    parser.add_argument("--queue", default=None, help="SLURM partition (#SBATCH -p)")
    parser.add_argument("--account", default=None, help="SLURM account (#SBATCH -A)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    cluster = SLURMCluster(
        cores=args.cores,
        processes=args.cores,  # one single-threaded worker process per core
        memory=args.memory,
        walltime=args.walltime,
        queue=args.queue,
        account=args.account,
        local_directory=os.environ.get("TMPDIR", "/tmp"),
        log_directory="dask-logs",
        job_script_prologue=[
            "export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1",
            "export MALLOC_ARENA_MAX=1",  # a store's decoded chunks reused from the heap
        ],
    )
    with cluster, Client(cluster) as client:
        cluster.scale(jobs=args.jobs)
        client.wait_for_workers(n_workers=args.cores)
        result = kelr_dist.estimate_response(args.store, client=client)
        result.to_zarr(args.out, mode="w")


if __name__ == "__main__":
    main()
