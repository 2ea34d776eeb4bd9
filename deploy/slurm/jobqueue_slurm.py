"""Estimate a response operator on a SLURM cluster with dask-jobqueue.

dask-jobqueue submits the Dask workers as SLURM jobs of their own; this driver (run on a login
node or in a small allocation of its own) holds the scheduler and the client and calls the
Python API ``kelr_dist.estimate_response``. The store must be on a file system every compute
node sees (e.g. ``$SCRATCH``).

The scheduler, the workers and this client talk over TLS with the certificates of
``deploy/tls/make-certs.sh`` (in ``--certs``, default ``$KELR_TLS_CERTS`` or ``~/.kelr/tls``,
on storage only you can read): whoever reaches a plain-TCP scheduler on a shared login node
can run code on the workers. The dashboard listens on loopback only (``ssh -L
8787:localhost:8787`` to see it). The result is written with ``kelr_dist.write_result``: all
or nothing, and an existing result is not replaced.

    pip install dask-jobqueue            # not a kelr_dist dependency
    deploy/tls/make-certs.sh ~/.kelr/tls $(hostname) $(sinfo -h -N -o %N | sort -u)
    python deploy/slurm/jobqueue_slurm.py $SCRATCH/triple-well.zarr $SCRATCH/response.zarr \\
        --jobs 8 --queue compute --account myproject
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from dask.distributed import Client
from dask_jobqueue import SLURMCluster
from distributed.security import Security

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
    parser.add_argument(
        "--certs",
        type=Path,
        default=Path(os.environ.get("KELR_TLS_CERTS", Path.home() / ".kelr" / "tls")),
        help="directory of deploy/tls/make-certs.sh's certificates",
    )
    return parser.parse_args(argv)


def security(certs: Path) -> Security:
    """TLS for the scheduler, the workers and the client, encryption required; the workers
    get the certificate files' paths (the directory must be on storage they see)."""
    missing = sorted(
        {
            name
            for role in ("scheduler", "worker", "client")
            for name in (f"{role}.pem", f"{role}-key.pem", "ca.pem")
            if not (certs / name).is_file()
        }
    )
    if missing:
        raise SystemExit(
            f"jobqueue_slurm.py: {certs}: no {', '.join(missing)}; make the certificates with "
            f"deploy/tls/make-certs.sh {certs} $(hostname)"
        )
    return Security(
        tls_ca_file=str(certs / "ca.pem"),
        tls_scheduler_cert=str(certs / "scheduler.pem"),
        tls_scheduler_key=str(certs / "scheduler-key.pem"),
        tls_worker_cert=str(certs / "worker.pem"),
        tls_worker_key=str(certs / "worker-key.pem"),
        tls_client_cert=str(certs / "client.pem"),
        tls_client_key=str(certs / "client-key.pem"),
        require_encryption=True,
    )


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    tls = security(args.certs)
    cluster = SLURMCluster(
        protocol="tls",
        security=tls,
        scheduler_options={"dashboard_address": "127.0.0.1:8787"},
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
    with cluster, Client(cluster, security=tls) as client:
        cluster.scale(jobs=args.jobs)
        client.wait_for_workers(n_workers=args.cores)
        result = kelr_dist.estimate_response(args.store, client=client)
        kelr_dist.write_result(result, args.out)


if __name__ == "__main__":
    main()
