"""The Dask client every pass runs on: an existing scheduler, or one embedded ``LocalCluster``.

:func:`get_client` connects to a scheduler when an address is given (argument,
``DASK_SCHEDULER_ADDRESS`` or the dask config key ``scheduler-address``); otherwise it starts a
``LocalCluster`` of single-threaded worker processes sized to the machine (its HTTP server on a
free local port), once per process, and reuses it. That embedded cluster is the only
module-level state of the package; :func:`close_embedded_cluster` shuts it down (tests, the end
of a CLI run). :func:`client_for` is the context-manager form: it closes a client it connected
from an address, and only such a client.

The embedded cluster is sized with dask's own figures, which honour cgroup quotas and CPU
affinity: ``dask.system.CPU_COUNT`` worker processes and ``MEMORY_FRACTION`` of
``distributed.system.MEMORY_LIMIT`` between them. Each worker process runs its BLAS, OpenMP
and numba thread pools at its share of the cores (:func:`thread_share`), whatever the caller's
environment says: the nanny passes ``OMP_NUM_THREADS`` & co. from the caller's environment to
the worker interpreter it spawns (``distributed.nanny.pre-spawn-environ`` yields to the
environment), so with ``OMP_NUM_THREADS=2`` on a 2-core machine two workers would start 2 BLAS
threads each; :class:`ThreadLimits` sets the pools of the running worker to its share instead.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import dask
import dask.system
import distributed.system
from dask.utils import parse_bytes
from distributed import Client, LocalCluster, WorkerPlugin
from distributed.comm.addressing import parse_address
from distributed.security import Security

from kelr_dist.kernels.checks import is_whole
from kelr_dist.kernels.reduction import SYNCHRONOUS

__all__ = [
    "ClusterError",
    "ThreadLimits",
    "check_address",
    "client_for",
    "close_embedded_cluster",
    "get_client",
    "thread_share",
]

CONNECT_TIMEOUT = "10s"
MEMORY_FRACTION = 0.8  # share of the machine's RAM the embedded workers may use together

#: thread-pool variables of the embedded workers (set to their share of the cores)
THREAD_VARIABLES = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "NUMBA_NUM_THREADS",
)


def thread_share(workers: int, threads_per_worker: int = 1, cpus: int | None = None) -> int:
    """Cores per worker thread: ``max(1, cpus // (workers * threads_per_worker))``.

    ``cpus`` defaults to ``dask.system.CPU_COUNT`` (cgroup quota and CPU affinity honoured).
    """
    cpus = dask.system.CPU_COUNT if cpus is None else cpus
    return max(1, cpus // max(1, workers * threads_per_worker))


def _worker_env(threads: int) -> dict[str, str]:
    """Environment of an embedded worker process: its thread pools at ``threads`` threads
    (read by libraries the worker loads later, e.g. scipy's own OpenBLAS, numba)."""
    return {**dict.fromkeys(THREAD_VARIABLES, str(threads)), "MALLOC_TRIM_THRESHOLD_": "65536"}


class ThreadLimits(WorkerPlugin):
    """Worker plugin: the worker process's BLAS/OpenMP pools at ``threads`` threads.

    Applied when the worker starts (and again to a worker that replaces a lost one), to the
    thread pools already loaded then (numpy's OpenBLAS: loaded before the nanny's environment
    reaches the worker); pools loaded later read the worker's ``*_NUM_THREADS`` variables.
    """

    name = "kelr-thread-limits"

    def __init__(self, threads: int) -> None:
        self.threads = int(threads)
        self._limits: Any = None

    def setup(self, worker: Any) -> None:
        """Set the pools of the worker process (kept until the process ends)."""
        from threadpoolctl import threadpool_limits

        self._limits = threadpool_limits(limits=self.threads)


class ClusterError(ValueError):
    """The Dask scheduler named by the user cannot be reached."""


# The embedded cluster: (cluster, client, (n_workers, memory_limit in bytes)) or None.
_embedded: tuple[LocalCluster, Client, tuple[int, int]] | None = None


def _scheduler_address(address: str | None) -> str | None:
    """The address to connect to: the argument, else the environment / dask config, else None."""
    if address:
        return address
    return os.environ.get("DASK_SCHEDULER_ADDRESS") or dask.config.get("scheduler-address", None)


def _parse_memory(memory_limit: str | int | None, n_workers: int) -> int:
    """Bytes per worker: ``memory_limit`` ("300MiB", "2GB", bytes) or a share of the machine."""
    if memory_limit is None:
        return int(MEMORY_FRACTION * distributed.system.MEMORY_LIMIT / n_workers)
    try:
        nbytes = parse_bytes(memory_limit) if isinstance(memory_limit, str) else int(memory_limit)
    except (TypeError, ValueError) as err:
        raise ValueError(
            f"memory_limit={memory_limit!r} is not a memory size like '300MiB' or '2GB'"
        ) from err
    if nbytes <= 0:
        raise ValueError(f"memory_limit={memory_limit!r} must be a positive memory size")
    return nbytes


def _parse_workers(n_workers: int | None) -> int:
    if n_workers is None:
        return dask.system.CPU_COUNT
    if not is_whole(n_workers, 1):
        raise ValueError(f"n_workers={n_workers!r} must be a positive integer")
    return n_workers


def _is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an IP address) is this machine's loopback interface only."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        found = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except OSError:
        return False
    return bool(found) and all(
        ipaddress.ip_address(str(ip).split("%")[0]).is_loopback for ip in found
    )


def _security(address: str) -> Security:
    """The client's TLS settings for ``address``, from dask's config (``distributed.comm.*``).

    ``tls://`` needs the config's TLS client settings. A plain ``tcp://`` address is refused
    when ``distributed.comm.require-encryption`` is set, unless it is a loopback address (the
    traffic never leaves this machine, e.g. ``kubectl port-forward`` or an SSH tunnel).
    """
    scheme, location = parse_address(address)  # the config's default-scheme when none is given
    try:
        security = Security()
        context = security.get_connection_args("client").get("ssl_context")
    except (OSError, ValueError, TypeError) as err:  # e.g. a certificate file that is missing
        raise ClusterError(
            f"address={address!r}: the TLS settings of the dask config do not load: {err}"
        ) from None
    if scheme == "tls" and context is None:
        raise ClusterError(
            f"address={address!r} is a TLS address, but the dask config holds no TLS settings "
            "for the client (distributed.comm.tls.ca-file and distributed.comm.tls.client."
            "cert/key; e.g. DASK_CONFIG=deploy/tls)"
        )
    if scheme == "tcp" and security.require_encryption:
        host = location.rsplit(":", 1)[0] if ":" in location else location
        if not _is_loopback(host):
            raise ClusterError(
                f"refusing the plain-TCP address={address!r}: the dask config sets "
                "distributed.comm.require-encryption, so a scheduler on another host must be "
                "reached over tls:// (see deploy/tls)"
            )
        return Security(require_encryption=False)  # loopback: nothing leaves this machine
    return security


def check_address(address: str) -> None:
    """Refuse, before any connection, a scheduler address that dask's config forbids.

    Raises :class:`ClusterError` for a ``tls://`` address without the client's TLS settings in
    the dask config, and for a ``tcp://`` address of another host when the config sets
    ``distributed.comm.require-encryption`` (see :func:`get_client`).
    """
    _security(address)


def _connect(address: str) -> Client:
    security = _security(address)
    try:
        return Client(address, timeout=CONNECT_TIMEOUT, set_as_default=False, security=security)
    except (OSError, TimeoutError, ValueError, RuntimeError) as err:
        raise ClusterError(
            f"cannot reach the Dask scheduler at address={address!r} "
            f"within {CONNECT_TIMEOUT}: {err}"
        ) from None


def _start_embedded(n_workers: int, memory_limit: int, quiet: bool) -> tuple[LocalCluster, Client]:
    # No pausing: our tasks hold one block and small partials, never accumulated data, so a
    # pause cannot free memory; a worker whose baseline (numba, scipy, ~230 MiB) sits above 80%
    # of a small limit would pause for good and hang the job. Over the limit the nanny still
    # restarts the worker, which fails the job with a clear error instead.
    threads = thread_share(n_workers)
    # A short message log: the scheduler (in this process) keeps the last messages to each
    # worker, task specs included; at dask's 1000 an embedded client grew 10-12% over 50
    # estimates, at 100 it stays within 5% (scripts/soak.py)
    settings = {
        "distributed.worker.memory.pause": False,
        "distributed.admin.low-level-log-length": 100,
    }
    with dask.config.set(settings):
        cluster = LocalCluster(
            n_workers=n_workers,
            threads_per_worker=1,
            processes=True,
            memory_limit=memory_limit,
            dashboard_address="127.0.0.1:0",  # on a free port, this machine only
            silence_logs=logging.CRITICAL if quiet else logging.ERROR,
            env=_worker_env(threads),
        )
    client = Client(cluster, set_as_default=False)
    client.register_plugin(ThreadLimits(threads))  # also for workers that replace lost ones
    return cluster, client


def get_client(
    address: str | None = None,
    *,
    n_workers: int | None = None,
    memory_limit: str | int | None = None,
    quiet: bool = False,
) -> Client:
    """A ``distributed.Client`` to run the passes on.

    Parameters
    ----------
    address : scheduler address (``tcp://host:port``, or ``tls://host:port`` with the TLS
        settings of the dask config, see ``deploy/tls``). When ``None`` the environment variable
        ``DASK_SCHEDULER_ADDRESS`` or the dask config key ``scheduler-address`` is used; when
        neither is set, the embedded ``LocalCluster`` is started (or reused).
    n_workers : worker processes of the embedded cluster (one thread each); default:
        ``dask.system.CPU_COUNT`` (the cores this process may use: cgroup quota, affinity).
    memory_limit : memory per embedded worker, bytes or a string like ``"300MiB"``;
        default: 80 % of ``distributed.system.MEMORY_LIMIT`` (the machine's RAM or the
        cgroup's limit) divided by ``n_workers``.
    quiet : silence the embedded cluster's logs entirely (default: errors are still logged).

    Returns
    -------
    A client of the named scheduler (a new one per call, the caller closes it) or the client of
    the embedded cluster (shared; a call asking for other ``n_workers``/``memory_limit`` replaces
    the cluster).

    Raises
    ------
    ClusterError
        The scheduler at the address cannot be reached within 10 s; a ``tls://`` address
        without TLS settings in the dask config; a ``tcp://`` address of another host while
        the dask config sets ``distributed.comm.require-encryption``.
    ValueError
        ``n_workers``/``memory_limit`` are invalid, or given together with an address.
    """
    global _embedded
    target = _scheduler_address(address)
    if target is not None:
        for name, value in (("n_workers", n_workers), ("memory_limit", memory_limit)):
            if value is not None:
                raise ValueError(
                    f"{name}={value!r} applies to the embedded cluster only, "
                    f"not to the scheduler at {target!r}"
                )
        return _connect(target)
    workers = _parse_workers(n_workers)
    settings = (workers, _parse_memory(memory_limit, workers))
    if _embedded is not None:
        cluster, client, running = _embedded
        compatible = (n_workers is None or running[0] == settings[0]) and (
            memory_limit is None or running[1] == settings[1]
        )
        if compatible and client.status == "running":
            return client
        close_embedded_cluster()
    cluster, client = _start_embedded(*settings, quiet=quiet)
    _embedded = (cluster, client, settings)
    return client


def close_embedded_cluster() -> None:
    """Shut the embedded cluster down (no-op when none is running)."""
    global _embedded
    if _embedded is None:
        return
    cluster, client, _ = _embedded
    _embedded = None
    cluster.close()
    client.close()


@contextmanager
def client_for(
    client: Client | str | None = None,
    *,
    n_workers: int | None = None,
    memory_limit: str | int | None = None,
    quiet: bool = False,
) -> Iterator[Client | str]:
    """The client to run on, closed on leaving the block if (and only if) it was made here.

    Parameters
    ----------
    client : a ``distributed.Client`` (yielded as it is, left open), ``"synchronous"`` (yielded
        as it is), a scheduler address, or ``None`` (see :func:`get_client`: the address of
        the environment / dask config, else the embedded cluster).
    n_workers, memory_limit, quiet : settings of the embedded cluster (:func:`get_client`).

    Yields
    ------
    The client. One connected here to a scheduler address (given, or from the environment)
    is closed when the block ends, also on an error; the embedded cluster's shared client and
    a client passed in are left open.

    Raises
    ------
    ValueError
        ``client`` is of another type; as :func:`get_client` otherwise.
    """
    if client == SYNCHRONOUS or isinstance(client, Client):
        yield client
        return
    if client is not None and not isinstance(client, str):
        raise ValueError(
            f"client={client!r} must be a distributed.Client, a scheduler address, "
            f"{SYNCHRONOUS!r} or None"
        )
    created_from_address = _scheduler_address(client) is not None
    made = get_client(client, n_workers=n_workers, memory_limit=memory_limit, quiet=quiet)
    try:
        yield made
    finally:
        if created_from_address:
            made.close()
