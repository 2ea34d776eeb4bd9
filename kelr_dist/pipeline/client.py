"""The public :func:`get_client`: the engine's client, its arguments checked first.

The options model checks them (the engine takes validated values)."""

from __future__ import annotations

from distributed import Client

from kelr_dist.engine import cluster
from kelr_dist.pipeline.options import ClusterOptions, checked, python_name


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

    ``n_workers`` and ``memory_limit`` are checked by the options model
    (``kelr_dist.pipeline.options.ClusterOptions``: a positive integer and a positive memory
    size), as ``estimate_response`` and the command line check them.

    Returns
    -------
    A client of the named scheduler (a new one per call, the caller closes it) or the client of
    the embedded cluster (shared; a call asking for other ``n_workers``/``memory_limit`` replaces
    the cluster).

    Raises
    ------
    ClusterError
        The address cannot be parsed (unknown scheme, no host or port: at once); the
        scheduler at the address cannot be reached within 10 s; a ``tls://`` address
        without TLS settings in the dask config; a ``tcp://`` address of another host while
        the dask config sets ``distributed.comm.require-encryption``; an embedded worker
        would get less than ``kelr_dist.engine.cluster.MIN_WORKER_MEMORY`` (``memory_limit``
        or the default share).
    ValueError
        ``n_workers``/``memory_limit`` given with a scheduler address (the argument,
        ``DASK_SCHEDULER_ADDRESS`` or the dask config's); either of them invalid
        (``OptionsError``, one line naming it).
    """
    checked(ClusterOptions, {"workers": n_workers, "memory_limit": memory_limit}, python_name)
    return cluster.get_client(address, n_workers=n_workers, memory_limit=memory_limit, quiet=quiet)
