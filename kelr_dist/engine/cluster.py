"""The Dask client every pass runs on: an existing scheduler, or one embedded ``LocalCluster``.

:func:`get_client` connects to a scheduler when an address is given (argument,
``DASK_SCHEDULER_ADDRESS`` or the dask config key ``scheduler-address``); otherwise it starts a
``LocalCluster`` of single-threaded worker processes sized to the machine (its HTTP server on a
free local port), once per process, and reuses it. That embedded cluster is the only
module-level state of the package; :func:`close_embedded_cluster` shuts it down (tests, the end
of a CLI run). :func:`client_for` is the context-manager form: it closes a client it connected
from an address, and only such a client.

The embedded cluster is sized with dask's own figures, which honour cgroup quotas and CPU
affinity: ``dask.system.CPU_COUNT`` worker processes (fewer when the machine's share would
give each less than ``MIN_WORKER_MEMORY``) and ``MEMORY_FRACTION`` of
``distributed.system.MEMORY_LIMIT`` between them. Each worker process runs its BLAS, OpenMP
and numba thread pools at its share of the cores (:func:`thread_share`), whatever the caller's
environment says: the nanny passes ``OMP_NUM_THREADS`` & co. from the caller's environment to
the worker interpreter it spawns (``distributed.nanny.pre-spawn-environ`` yields to the
environment), so with ``OMP_NUM_THREADS=2`` on a 2-core machine two workers would start 2 BLAS
threads each; :class:`WorkerTuning` sets the pools of the running worker to its share instead,
and tunes its allocator (:mod:`kelr_dist.engine.allocator`).

The workers of a user's own cluster (an address, a ``Client``) are left as they are: their
processes are not the package's to tune. A user who wants the same tuning there registers the
plugin, ``client.register_plugin(kelr_dist.WorkerTuning())``, and removes it (which undoes it)
with ``client.unregister_worker_plugin(kelr_dist.WorkerTuning.name)``.
"""

from __future__ import annotations

import asyncio
import gc
import ipaddress
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import CancelledError
from contextlib import contextmanager
from typing import Any

import dask
import dask.system
import distributed.system
from dask.utils import parse_bytes
from distributed import Client, LocalCluster, WorkerPlugin
from distributed.comm import CommClosedError, connect
from distributed.comm.addressing import parse_address
from distributed.security import Security

from kelr_dist.engine.allocator import restore_allocator, tune_allocator
from kelr_dist.kernels.reduction import SYNCHRONOUS

__all__ = [
    "ClusterError",
    "WorkerTuning",
    "check_address",
    "client_for",
    "close_embedded_cluster",
    "get_client",
    "lost_connection",
    "memory_kills",
    "thread_share",
]

CONNECT_TIMEOUT = 10.0  # seconds to reach a named scheduler
#: seconds a client whose request to its scheduler failed is given to notice that the connection
#: is lost (its own stream breaks a moment after the request's, which fails first)
LOST_NOTICE = 5.0
#: the address schemes of a scheduler to connect to (``scheme://host:port``)
SCHEMES = ("tcp", "tls", "ws", "wss")
MEMORY_FRACTION = 0.8  # share of the machine's RAM the embedded workers may use together
#: the least memory_limit an embedded worker is started with: 95% of it, where the nanny restarts
#: a worker, must hold an idle worker with the kernels imported and leave room for a task (Dask
#: distributed docs, "Worker Memory Management", distributed.worker.memory.terminate; see
#: docs/benchmarks.md, section 'Tuning constants'); workers that keep dying later are caught by
#: the passes (NO_WORKERS_TIMEOUT)
MIN_WORKER_MEMORY = 256 * 2**20

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


class WorkerTuning(WorkerPlugin):
    """Worker plugin: the worker process's BLAS/OpenMP pools lowered to its share of the cores
    (``threads``; default :func:`thread_share` of the worker's machine over its task threads;
    a pool is never raised) and glibc's allocator tuned for its memory limit
    (:func:`kelr_dist.engine.allocator.tune_allocator`), from its start (and for a worker that
    replaces a lost one) until the plugin is removed, which puts both back.

    The embedded cluster registers it for its workers. On a user's own cluster it is opt-in:
    ``client.register_plugin(WorkerTuning())``; ``client.unregister_worker_plugin(
    WorkerTuning.name)`` undoes it. The pools are process-wide, so the settings hold for every
    task of the worker while the plugin is registered, not per task. Pools loaded after the
    worker started read the worker's ``*_NUM_THREADS`` variables (set for the embedded workers).
    """

    name = "kelr-worker-tuning"

    def __init__(self, threads: int | None = None, one_arena: bool = False) -> None:
        self.threads = None if threads is None else int(threads)
        self.one_arena = one_arena
        self._limits: Any = None

    def setup(self, worker: Any) -> None:
        """Lower the pools of the worker process and tune its allocator."""
        from threadpoolctl import threadpool_info, threadpool_limits

        threads = self.threads or thread_share(1, worker.state.nthreads)
        lower = {
            pool["prefix"]: threads for pool in threadpool_info() if pool["num_threads"] > threads
        }
        self._limits = threadpool_limits(limits=lower) if lower else None
        tune_allocator(worker.memory_manager.memory_limit, one_arena=self.one_arena)

    def teardown(self, worker: Any) -> None:  # noqa: ARG002 - distributed's WorkerPlugin
        """Put the pools and the allocator's thresholds back."""
        if self._limits is not None:
            self._limits.restore_original_limits()
        restore_allocator()


class ClusterError(ValueError):
    """The Dask scheduler named by the user cannot be reached, or the cluster cannot run the
    work (settings its workers cannot run with, workers that keep dying)."""


class _MemoryKills(logging.Filter):
    """Counts the embedded nannies' kills of their worker for exceeding its memory limit (their
    log records, in this process; the records pass on unchanged)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if "memory budget" in record.getMessage():
            self.count += 1
        return True


#: the logger of the nannies' memory monitor (its warning: "... exceeded 95% memory budget")
_NANNY_MEMORY_LOGGER = "distributed.nanny.memory"
_memory_kills = _MemoryKills()


# The embedded cluster: (cluster, client, (n_workers, memory_limit in bytes)) or None.
_embedded: tuple[LocalCluster, Client, tuple[int, int]] | None = None


def memory_kills(client: Any) -> tuple[int, int] | None:
    """``(kills, memory_limit)`` when ``client`` is the embedded cluster's: how many times its
    nannies killed a worker for exceeding its memory limit (bytes per worker) since it
    started; ``None`` for any other client (its nannies log in their own processes)."""
    if _embedded is None or _embedded[1] is not client:
        return None
    return _memory_kills.count, _embedded[2][1]


def _scheduler_address(address: str | None) -> tuple[str, str] | None:
    """The address to connect to and where it came from (its name in messages): the argument
    (``address``), else ``DASK_SCHEDULER_ADDRESS``, else the dask config's ``scheduler-address``,
    else None."""
    for name, value in (
        ("address", address),
        ("DASK_SCHEDULER_ADDRESS", os.environ.get("DASK_SCHEDULER_ADDRESS")),
        ("dask config scheduler-address", dask.config.get("scheduler-address", None)),
    ):
        if value:
            return value, name
    return None


def _usable_memory() -> float:
    """Bytes the embedded workers may use together: ``MEMORY_FRACTION`` of the machine's
    (dask's cgroup-aware figure)."""
    return MEMORY_FRACTION * distributed.system.MEMORY_LIMIT


def _parse_memory(memory_limit: str | int | None, n_workers: int) -> int:
    """Bytes per worker: ``memory_limit`` ("300MiB", "2GB", bytes; a valid size, as
    :class:`~kelr_dist.pipeline.options.ClusterOptions` checks it) or a share of the machine,
    refused below what a worker needs (``MIN_WORKER_MEMORY``)."""
    if memory_limit is None:
        share = int(_usable_memory() / n_workers)
        if share < MIN_WORKER_MEMORY:
            raise ClusterError(
                f"n_workers={n_workers} workers would get {share / 2**20:.0f} MiB each (a share "
                f"of this machine's memory), below the {MIN_WORKER_MEMORY // 2**20} MiB a worker "
                "process needs to run at all; use fewer workers (n_workers= / --workers)"
            )
        return share
    nbytes = parse_bytes(memory_limit) if isinstance(memory_limit, str) else int(memory_limit)
    if nbytes < MIN_WORKER_MEMORY:
        raise ClusterError(
            f"memory_limit={memory_limit!r} ({nbytes / 2**20:.0f} MiB per worker) is below the "
            f"{MIN_WORKER_MEMORY // 2**20} MiB a worker process needs to run at all (with the "
            "kernels loaded it holds ~192 MiB, and its nanny kills it above 95% of its limit); "
            f"give each worker at least {MIN_WORKER_MEMORY // 2**20}MiB (memory_limit= / "
            "--memory-limit)"
        )
    return nbytes


def _parse_workers(n_workers: int | None, memory_limit: str | int | None = None) -> int:
    """``n_workers`` (a positive integer, as :class:`~kelr_dist.pipeline.options.ClusterOptions`
    checks it), or one per usable core, as many as get ``MIN_WORKER_MEMORY`` each of the
    machine's share when no ``memory_limit`` is given (a small container with many cores)."""
    if n_workers is None:
        if memory_limit is not None:
            return dask.system.CPU_COUNT
        fit = int(_usable_memory() // MIN_WORKER_MEMORY)
        return max(1, min(dask.system.CPU_COUNT, fit))
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


def _parse(address: str, name: str = "address") -> tuple[str, str, int]:
    """``(scheme, host, port)`` of a scheduler ``address`` (``name``: where it came from, for
    messages).

    Raises :class:`ClusterError` at once, naming the address and what is wrong, for a scheme
    other than ``SCHEMES``, a missing host or port, or a port that is not a number from 1 to
    65535.
    """
    scheme, location = parse_address(address)  # the config's default-scheme when none is given
    if scheme not in SCHEMES:
        raise ClusterError(
            f"scheduler {name}={address!r}: the scheme {scheme!r} is not one of "
            f"{', '.join(SCHEMES)}; expected e.g. 'tcp://scheduler:8786'"
        )
    host, colon, port = location.rpartition(":")
    example = f"e.g. '{scheme}://{(host if colon else location) or 'scheduler'}:8786'"
    if not colon or not host.strip("[]"):
        missing = "port number" if not colon else "host"
        raise ClusterError(
            f"scheduler {name}={address!r} has no {missing}; expected {scheme}://host:port, "
            f"{example}"
        )
    if not (port.isdigit() and 0 < int(port) < 65536):
        raise ClusterError(
            f"scheduler {name}={address!r}: the port {port!r} is not a number from 1 to 65535; "
            f"expected {scheme}://host:port, {example}"
        )
    return scheme, host.strip("[]"), int(port)


def _checked(address: str, name: str = "address") -> tuple[Security, str, int]:
    """The client's TLS settings for ``address``, from dask's config (``distributed.comm.*``),
    and the address's host and port (:func:`_parse`; ``name``: where it came from).

    ``tls://`` needs the config's TLS client settings. A plain ``tcp://`` address is refused
    when ``distributed.comm.require-encryption`` is set, unless it is a loopback address (the
    traffic never leaves this machine, e.g. ``kubectl port-forward`` or an SSH tunnel).
    """
    scheme, host, port = _parse(address, name)
    try:
        security = Security()
        context = security.get_connection_args("client").get("ssl_context")
    except (OSError, ValueError, TypeError) as err:  # e.g. a certificate file that is missing
        raise ClusterError(
            f"{name}={address!r}: the TLS settings of the dask config do not load: {err}"
        ) from None
    if scheme == "tls" and context is None:
        raise ClusterError(
            f"{name}={address!r} is a TLS address, but the dask config holds no TLS settings "
            "for the client (distributed.comm.tls.ca-file and distributed.comm.tls.client."
            "cert/key; e.g. DASK_CONFIG=deploy/tls)"
        )
    if scheme == "tcp" and security.require_encryption:
        if not _is_loopback(host):
            raise ClusterError(
                f"refusing the plain-TCP {name}={address!r}: the dask config sets "
                "distributed.comm.require-encryption, so a scheduler on another host must be "
                "reached over tls:// (see deploy/tls)"
            )
        # loopback: nothing leaves this machine
        return Security(require_encryption=False), host, port
    return security, host, port


def check_address(address: str | None = None, *, listening: bool = False) -> None:
    """Refuse, before any client is made, a scheduler address that is malformed or that dask's
    config forbids, and with ``listening`` one that nothing listens at.

    ``address`` as in :func:`get_client` (``None``: the environment's or the dask config's;
    nothing to check when there is none). A refused connection is known at once with
    ``listening``, whereas a client retries it until ``CONNECT_TIMEOUT`` (a scheduler that is
    still starting is then waited for).

    Raises :class:`ClusterError` for an address that cannot be parsed (a scheme other than
    ``SCHEMES``, no host or port), for a ``tls://`` address without the client's TLS settings
    in the dask config, for a ``tcp://`` address of another host when the config sets
    ``distributed.comm.require-encryption`` (see :func:`get_client`), and with ``listening``
    when a TCP connection to its host and port fails.
    """
    named = _scheduler_address(address)
    if named is None:
        return
    _, host, port = _checked(*named)
    if listening:
        try:
            socket.create_connection((host, port), timeout=CONNECT_TIMEOUT).close()
        except OSError as err:
            raise _unreachable(*named, err) from None


#: what else answers Dask's protocol (``identity()["type"]``), refused as a scheduler address
NOT_SCHEDULERS = ("Worker", "Nanny")


def _unreachable(address: str, name: str, err: BaseException) -> ClusterError:
    """The error for a scheduler at ``address`` (``name``: where it came from) that a
    connection failed to reach with ``err``."""
    timed_out = isinstance(err, TimeoutError)  # a socket's or the handshake probe's
    problem = f"no answer within {CONNECT_TIMEOUT:g} s" if timed_out else str(err)
    return ClusterError(f"cannot reach the Dask scheduler at {name}={address!r}: {problem}")


def _handshake(address: str, name: str, security: Security) -> None:
    """Raise :class:`ClusterError` unless a Dask scheduler at ``address`` completes Dask's
    handshake and answers an ``identity`` request within ``CONNECT_TIMEOUT`` each (connection
    attempts are retried until then, so a scheduler that is still starting is waited for).

    A client's own connect puts no deadline on the handshake (dask/distributed#7698): at an
    address where something accepts connections but never answers (another service's port, a
    frozen scheduler) it would wait forever. At a worker's or a nanny's address (they speak the
    same protocol) it fails with a ``TypeError`` from inside the worker and leaves a client that
    takes 20 s to give up at exit; the identity names what answered instead, and a worker's
    names its scheduler. The probe runs its own event loop in a thread, so it works where a
    loop is already running (Jupyter)."""
    outcome: list[Any] = []

    async def probe() -> Any:
        args = security.get_connection_args("client")
        comm = await asyncio.wait_for(
            connect(address, timeout=CONNECT_TIMEOUT, **args), CONNECT_TIMEOUT
        )
        try:
            await comm.write({"op": "identity", "reply": True})
            return await asyncio.wait_for(comm.read(), CONNECT_TIMEOUT)
        finally:
            await comm.close()

    def run() -> None:
        try:
            outcome.append(asyncio.run(probe()))
        except BaseException as err:  # noqa: BLE001 - handed to the caller's thread
            outcome.append(err)

    thread = threading.Thread(target=run, name="kelr-dist-handshake", daemon=True)
    thread.start()
    thread.join(CONNECT_TIMEOUT + 5.0)
    answer = outcome[0] if outcome else TimeoutError()
    if isinstance(answer, BaseException):
        raise _unreachable(address, name, answer)
    kind = answer.get("type") if isinstance(answer, dict) else None
    if kind in NOT_SCHEDULERS:
        scheduler = answer.get("scheduler")
        where = f"; its scheduler is at {scheduler!r}" if scheduler else ""
        raise ClusterError(
            f"{name}={address!r} is a Dask {kind.lower()}, not a scheduler{where} (the "
            "scheduler prints its address at start: 'Scheduler at: tcp://...')"
        )


def _connect(address: str, name: str = "address") -> Client:
    """A client of the scheduler at ``address`` (``name``: where the address came from),
    checked first (:func:`_checked`).

    A client that fails to connect is closed here, while its event loop still runs: left to
    the end of the process (held by a reference cycle through the error's traceback), its
    close would wait 20 s for a loop that is gone and print a traceback.
    """
    security, _, _ = _checked(address, name)
    _handshake(address, name, security)
    try:
        return Client(address, timeout=CONNECT_TIMEOUT, set_as_default=False, security=security)
    except (OSError, TimeoutError, ValueError, RuntimeError) as err:
        error = _unreachable(address, name, err)
    gc.collect()  # out of the except block the first error is gone: the client's close runs
    raise error


def _start_embedded(n_workers: int, memory_limit: int, quiet: bool) -> tuple[LocalCluster, Client]:
    # No pausing: our tasks hold one block and small partials, never accumulated data, so a
    # pause cannot free memory; a worker whose baseline (numba, scipy, ~230 MiB) sits above 80%
    # of a small limit would pause for good and hang the job. Over the limit the nanny still
    # restarts the worker, which fails the job with a clear error instead.
    threads = thread_share(n_workers)
    _memory_kills.count = 0  # the nannies run in this process: their kills are counted here
    logging.getLogger(_NANNY_MEMORY_LOGGER).addFilter(_memory_kills)  # added once (a set)
    # A short message log: the scheduler (in this process) keeps the last messages to each
    # worker, task specs included; at dask's 1000 an embedded client grew 10-12% over 50
    # estimates, at 100 it stays within 5% (scripts/soak.py)
    # One malloc arena for all of a worker's threads, read by glibc when the process starts, so
    # it goes in the environment the nanny spawns the worker with (as the nanny's own
    # MALLOC_TRIM_THRESHOLD_ does): the store's decoded chunks are then reused from the heap
    # (kelr_dist.engine.allocator)
    settings = {
        "distributed.worker.memory.pause": False,
        "distributed.admin.low-level-log-length": 100,
        "distributed.nanny.pre-spawn-environ.MALLOC_ARENA_MAX": 1,
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
    # also for workers that replace lost ones
    client.register_plugin(WorkerTuning(threads, one_arena=True))
    return cluster, client


def get_client(
    address: str | None = None,
    *,
    n_workers: int | None = None,
    memory_limit: str | int | None = None,
    quiet: bool = False,
) -> Client:
    """The client of :func:`kelr_dist.get_client` (see there), its arguments as validated by
    the options model."""
    global _embedded
    named = _scheduler_address(address)
    if named is not None:
        target, origin = named
        for name, value in (("n_workers", n_workers), ("memory_limit", memory_limit)):
            # the environment's scheduler is known here only (ClusterOptions refuses them with
            # a given address before a call here; a direct call is refused the same way)
            if value is not None:
                raise ValueError(
                    f"{name}={value!r} applies to the embedded cluster only, "
                    f"not to the scheduler at {origin}={target!r}"
                )
        return _connect(target, origin)
    workers = _parse_workers(n_workers, memory_limit)
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


def _scheduler_of(client: Client) -> str:
    return str(getattr(client.scheduler, "address", None) or "?")


def _is_lost(client: Client, err: BaseException) -> bool:
    """Whether ``err``, raised by a request of ``client``, means that the client lost its
    scheduler: the client says so (at once, or within :data:`LOST_NOTICE` seconds after an
    error of the connection itself)."""
    connection = isinstance(err, CommClosedError | ConnectionError | TimeoutError) or (
        isinstance(err, OSError) and str(err).startswith("Timed out trying to connect")
    )
    if not connection and not isinstance(err, CancelledError):
        return False
    deadline = time.monotonic() + (LOST_NOTICE if connection else 0.0)
    while client.status == "running" and time.monotonic() < deadline:
        time.sleep(0.05)
    return client.status != "running"


@contextmanager
def lost_connection(client: Client | str) -> Iterator[None]:
    """Inside the block, an error of a request to ``client``'s scheduler because the scheduler
    is gone (killed, its machine lost) is raised as one :class:`ClusterError` ("lost the
    connection to the Dask scheduler at ADDRESS"), wherever the request was: a pass's
    futures, or a request between passes (``Client.nthreads``, ``scatter``, ``run``...), which
    distributed fails with ``CommClosedError`` or ``OSError`` while the client still says it is
    running. Other errors pass unchanged; ``client="synchronous"`` changes nothing."""
    try:
        yield
    except ClusterError:
        raise
    except (OSError, CancelledError) as err:
        if isinstance(client, str) or not _is_lost(client, err):
            raise
        raise ClusterError(
            f"lost the connection to the Dask scheduler at {_scheduler_of(client)} "
            f"({type(err).__name__}); the work was abandoned"
        ) from err


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
        as :func:`get_client` (``client`` itself is validated by the options model,
        :class:`kelr_dist.pipeline.options.ClusterOptions`).
    ClusterError
        The scheduler was lost while the block ran (:func:`lost_connection`).
    """
    if client == SYNCHRONOUS or isinstance(client, Client):
        with lost_connection(client):
            yield client
        return
    created_from_address = _scheduler_address(client) is not None
    made = get_client(client, n_workers=n_workers, memory_limit=memory_limit, quiet=quiet)
    try:
        with lost_connection(made):
            yield made
    finally:
        if created_from_address:
            made.close()
