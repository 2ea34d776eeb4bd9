"""What a failed pass says: the pass, the block (chain and rows), the store and the worker.

:class:`PassContext` turns a failed or cancelled future of a pass into one exception whose
message names where it failed; :func:`check_store_on_workers` fails a pass at once when a
worker cannot open its store; :func:`check_functions_on_workers` fails an estimate before any
block runs when a worker cannot load a user's function.
"""

from __future__ import annotations

import os
from concurrent.futures import CancelledError
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr
from distributed import Client, KilledWorker

from kelr_dist.data.store import IN_MEMORY
from kelr_dist.engine.cluster import ClusterError, memory_kills
from kelr_dist.engine.graph import WORKER_ATTRIBUTE, ReductionGraph


class WorkersLost(ClusterError):
    """A pass stuck after its workers were lost while others are connected: what the lost
    workers held (blocks kept in their memory) waits for them, and only reading it again from
    its source can go on."""


@dataclass(frozen=True)
class PassContext:
    """What an error message says about where a pass failed."""

    name: str  # "pass 'moments, mean/covariance'"
    store: str
    scheduler: str
    prefix: str  # of the graph's own keys
    loads: frozenset[str]  # names of the trajectory's load tasks
    edges: tuple[int, ...]  # row boundaries of the time chunks
    task_edges: tuple[int, ...] = ()  # row boundaries of the block tasks (coalesced chunks)

    @classmethod
    def of(cls, trajectory: xr.DataArray, graph: ReductionGraph, client: Client) -> PassContext:
        data = trajectory.data
        edges = np.concatenate([[0], np.cumsum(data.chunks[1])]).astype(int)
        return cls(
            name=f"pass '{', '.join(r.name for r in graph.reductions)}'",
            store=str(trajectory.attrs.get("store", IN_MEMORY)),
            scheduler=str(getattr(client.scheduler, "address", None) or "?"),
            prefix=str(graph.blocks[0].key[0]).removesuffix("-block"),
            loads=frozenset({data.name, data.rechunk({0: 1, 2: -1}).name}),
            edges=tuple(int(e) for e in edges),
            task_edges=graph.task_edges,
        )

    def chunk(self, key: Any) -> str:
        """The chunk a task key belongs to: ``chain c, rows a-b`` (or the combine step)."""
        if isinstance(key, tuple) and len(key) >= 3 and isinstance(key[0], str):
            name = key[0]
            ours = name.startswith(self.prefix) and name.endswith(("-block", "-head"))
            if ours or (name in self.loads and len(key) == 4):
                chain, k = int(key[1]), int(key[2])
                edges = self.task_edges if name.endswith("-block") else self.edges
                if 0 <= k < len(edges) - 1:
                    return f"chain {chain}, rows {edges[k]}-{edges[k + 1]}"
            if name.startswith(self.prefix) and name.endswith("-combine"):
                return "the combine step"
        return f"task {key!r}"

    def require_connection(self, client: Client) -> None:
        """Raise at once when the client is not connected (work sent now would never end)."""
        if client.status != "running":
            raise ClusterError(
                f"{self.name}: lost the connection to the Dask scheduler at {self.scheduler} "
                f"(the client is {client.status})"
            )

    def unanswered(self, err: BaseException, timeout: float) -> ClusterError:
        """The error for a pass whose scheduler left the client's questions unanswered for
        ``timeout`` seconds (``err``: the last failure) while none of its tasks finished."""
        return ClusterError(
            f"{self.name}: lost the connection to the Dask scheduler at {self.scheduler}: "
            f"no answer for {timeout:g} s ({type(err).__name__}: {err})"
        )

    def no_live_workers(
        self, client: Client, connected: int, left: int, timeout: float, settle: float
    ) -> ClusterError:
        """The error for a pass none of whose tasks finished in ``timeout`` seconds while no
        worker stayed connected for ``settle`` seconds (``connected`` now, ``left`` seen
        leaving)."""
        stuck = (
            f"{self.name}: no task finished or ran for {timeout:g} s on the cluster at "
            f"{self.scheduler} (no worker up for {settle:g} s was running one)"
        )
        kills = memory_kills(client)
        if kills is not None and kills[0]:
            return ClusterError(
                f"{stuck}: the workers keep dying for memory ({kills[0]} killed by their nanny "
                f"for exceeding memory_limit={kills[1] / 2**20:.0f} MiB per worker); give each "
                "worker more memory (--memory-limit / memory_limit=), with fewer workers "
                "(--workers / n_workers=) if the machine has no more"
            )
        if connected == 0:
            return ClusterError(
                f"{stuck}: the cluster has no workers ({left} left while the pass waited); "
                "start workers, or see their logs for why they died (e.g. killed for exceeding "
                "their memory limit: give them more memory)"
            )
        if left == 0:
            return ClusterError(
                f"{stuck}: its tasks wait while the {connected} connected workers run none of "
                "them (no worker meets what the scheduler asks of them); see the scheduler's log"
            )
        return WorkersLost(
            f"{stuck}: {left} workers left while the pass waited, and the {connected} connected "
            "now run none of its tasks (blocks kept in the memory of the lost workers wait for "
            "them); see the workers' logs for why they died (e.g. killed for exceeding their "
            "memory limit: give them more memory)"
        )

    def paused(self, workers: dict[str, dict[str, Any]], timeout: float) -> ClusterError:
        """The error for a pass none of whose tasks finished in ``timeout`` seconds while the
        ``workers`` that hold its tasks (``scheduler_info()["workers"]`` entries) were paused
        for memory or over their memory target."""
        described = ", ".join(
            f"{address} (memory_limit {_mib(w.get('memory_limit'))}, "
            f"{_mib(w.get('metrics', {}).get('memory'))} in use, {w.get('status', '?')})"
            for address, w in sorted(workers.items())
        )
        return ClusterError(
            f"{self.name}: no task finished for {timeout:g} s on the cluster at {self.scheduler} "
            f"while its workers were paused for memory or over their memory target: "
            f"{described}; give each worker more memory (--memory-limit / memory_limit=) or "
            "fewer threads, or free the memory other work holds on them"
        )

    def failure(self, client: Client, future: Any) -> BaseException:
        """The exception to raise for a failed or cancelled future of this pass."""
        if future.status == "cancelled":
            reason = None
            try:
                future.result(timeout=5)
            except CancelledError as err:
                reason = getattr(err, "reason", None)
            except Exception:  # the client itself failed; say what is known
                pass
            if reason == "scheduler-connection-lost" or client.status != "running":
                return ClusterError(
                    f"{self.name}: lost the connection to the Dask scheduler at "
                    f"{self.scheduler}; the pass was abandoned"
                )
            if self.store == IN_MEMORY:  # samples sent from this process: no lineage
                return ClusterError(
                    f"{self.name}: the work was cancelled on the cluster ({reason}); in-memory "
                    "samples sent to the workers from this process cannot be read again once a "
                    "worker that held them is lost: write them to a zarr store "
                    "(xarray's Dataset.to_zarr, see the user guide's inputs page) and estimate "
                    "from the store to survive lost workers"
                )
            return ClusterError(f"{self.name}: the work was cancelled on the cluster ({reason})")
        try:
            error = future.exception(timeout=5)
        except Exception as err:  # the client itself failed
            return ClusterError(f"{self.name}: the Dask client failed ({err})")
        traceback = future.traceback()
        if error is None:
            return ClusterError(f"{self.name}: task {future.key!r} ended as {future.status}")
        if isinstance(error, KilledWorker):
            worker = getattr(error.last_worker, "address", error.last_worker)
            tries = error.allowed_failures + 1
            return ClusterError(
                f"{self.name}: {self.chunk(error.task)} of store {self.store!r} killed the "
                f"{tries} worker processes that ran it (the last: {worker}), so dask gave up "
                f"(distributed.scheduler.allowed-failures={error.allowed_failures}); a worker "
                "that dies on one block has usually run out of memory: give the workers more "
                "memory or the store smaller time chunks"
            )
        worker = getattr(error, WORKER_ATTRIBUTE, None)
        on = f" on worker {worker}" if worker else ""
        context = f"{self.name}, {self.chunk(future.key)} of store {self.store!r}{on}"
        return _with_context(error.with_traceback(traceback), context)


def _mib(nbytes: Any) -> str:
    return f"{nbytes / 2**20:.0f} MiB" if nbytes else "unknown"


def _with_context(error: BaseException, context: str) -> BaseException:
    """``error`` with ``context: `` before its message, of the same type where possible."""
    message = f"{context}: {error}"
    try:
        renamed = type(error)(message)
    except Exception:  # exception types with other constructors
        renamed = None
    if renamed is None or str(renamed) != message:
        error.add_note(context)
        return error
    renamed.__cause__ = error
    renamed.__traceback__ = error.__traceback__
    return renamed


def _store_problem(path: str, variable: str) -> str | None:
    """On a worker: why the zarr store ``path`` (and its ``variable``) cannot be opened here."""
    import zarr

    try:
        group = zarr.open_group(path, mode="r")
        if variable in group:
            group[variable]  # noqa: B018 - reads the array's metadata
        else:
            raise FileNotFoundError(f"no variable {variable!r} in the store")
    except Exception as err:  # any reason is reported
        resolved = os.path.abspath(path)
        return f"{type(err).__name__}: {err} (path resolved on the worker: {resolved!r})"
    return None


def _first_problem(client: Client, ask: Any, *args: Any) -> tuple[str, str] | None:
    """``ask(*args)`` run on every worker: the first worker (by address) whose answer is a
    problem (a text), as ``"ADDRESS (and N other workers)"``, and its problem; None when no
    worker has one, or when the workers do not answer (the tasks will tell)."""
    try:
        answers = client.run(ask, *args, on_error="return")
    except Exception:
        return None
    problems = sorted((w, p) for w, p in answers.items() if isinstance(p, str))
    if not problems:
        return None
    worker, problem = problems[0]
    others = len(problems) - 1
    more = f" (and {others} other worker{'s' if others > 1 else ''})" if others else ""
    return worker + more, problem


def check_store_on_workers(trajectory: xr.DataArray, client: Client, where: PassContext) -> None:
    """Fail at once, naming the store and the worker, when a worker cannot open the store.

    A worker that does not see the store (another cwd for a relative path, storage not
    mounted there, no permission) would otherwise fail on its first block, or read missing
    chunks as fill values.
    """
    from kelr_dist.data.store import TrajectoryError

    store = trajectory.attrs.get("store")
    if not isinstance(store, str) or "://" in store or not Path(store).exists():
        return  # in memory, or a remote store the workers open by URL
    variable = str(trajectory.name) if trajectory.name is not None else "x"
    found = _first_problem(client, _store_problem, store, variable)
    if found is not None:
        worker, problem = found
        raise TrajectoryError(
            f"store {store!r}, variable {variable!r}: {where.name}: worker {worker} "
            f"cannot open the store: {problem}; the store must be on storage every worker "
            "sees, at the same path"
        )


def _loads_problem(payload: bytes) -> str | None:
    """On a worker: why the pickled ``payload`` cannot be loaded here (its module is not
    importable, ...)."""
    import pickle

    try:
        pickle.loads(payload)  # noqa: S301 - what this client itself sends the workers
    except Exception as err:  # any reason is reported
        return f"{type(err).__name__}: {err}"
    return None


def check_functions_on_workers(functions: dict[str, Any], client: Client | str) -> None:
    """Fail before any block runs, naming the function and the worker, when a worker cannot
    load one of ``functions`` (``{what: object}``: a score function, an observable, a
    forcing given by the user).

    A function is sent to the workers by reference (its module and name): a module importable
    here but not on a worker (a file in the client's directory, a package installed only
    here) would otherwise fail the first block that uses it, in a traceback from inside the
    worker.

    Raises
    ------
    ValueError
        a worker cannot load a function; the message says which, where and why.
    """
    from distributed.protocol.pickle import dumps

    from kelr_dist.kernels.response.operator import function_reference

    if isinstance(client, str):  # no workers: this process runs the blocks
        return
    for what, function in functions.items():
        if function is None:
            continue
        found = _first_problem(client, _loads_problem, dumps(function))
        if found is not None:
            worker, problem = found
            raise ValueError(
                f"the {what} {function_reference(function)} cannot be loaded on worker "
                f"{worker}: {problem}; its module must be importable on every worker "
                "(installed there, or on the workers' PYTHONPATH), not only where the "
                "estimate is started"
            )
