"""What a waiting pass looks at on the cluster: live workers, and workers paused for memory.

Dask waits forever for a task in two cases a pass must not: when its workers keep dying
without dask blaming a task (killed by their nanny for memory between tasks, or no worker
left), and when the workers that hold its tasks are paused by dask's memory monitor
(``distributed.worker.memory.pause``) or all over their memory target and stay so (a paused
worker keeps its tasks while others sit idle). Distributed's own ``no-workers-timeout`` is a
setting of the scheduler process (a scheduler started elsewhere has it off) and does not cover
tasks already sent to a paused worker, so :class:`Watch` looks at the scheduler's workers
(``Client.processing``, ``Client.scheduler_info``: status, memory, memory limit) every few
seconds while no task of the pass finishes, and raises :class:`ClusterError` with one line.

A third case: all workers lost at once. The blocks kept in their memory
(:func:`kelr_dist.engine.placement.keep_in_memory`) carry worker restrictions naming them,
which dask leaves in 'no-worker' even when new workers join; the pass then fails with
:class:`~kelr_dist.engine.failures.WorkersLost`, and the caller reads the store again
(:class:`kelr_dist.pipeline.steps.Passes`).
"""

from __future__ import annotations

import time
from typing import Any

import dask
from distributed import Client

from kelr_dist.engine.cluster import memory_kills
from kelr_dist.engine.failures import PassContext

#: memory kills (of the embedded cluster's workers) with no task of the pass finished after which
#: a worker up for ``settle`` seconds no longer counts as alive: the workers keep dying
REPEATED_KILLS = 2


class Watch:
    """Whether a waiting pass can still progress; :meth:`check` raises when it cannot.

    Parameters
    ----------
    timeout : seconds with no task finished and no worker up for ``settle`` seconds running a
        task before the pass fails (workers dying, none left, or a task stuck); also the
        seconds the scheduler may leave the client's questions unanswered (the client not
        running, or its requests failing) before the pass fails.
    settle : seconds a worker must stay connected to count as alive.
    interval : seconds between two looks at the scheduler's workers.
    paused_timeout : seconds with no task finished while every worker that holds a task of the
        cluster is paused for memory (or, when none holds one, every worker is paused or over
        its memory target) before the pass fails.
    """

    def __init__(
        self,
        client: Client,
        where: PassContext,
        *,
        timeout: float,
        settle: float,
        interval: float,
        paused_timeout: float,
    ) -> None:
        self.client, self.where = client, where
        self.timeout, self.settle = timeout, settle
        self.interval, self.paused_timeout = interval, paused_timeout
        self.alive_at = self.next_look = self.free_at = self.answered_at = time.monotonic()
        self.seen: dict[str, float] = {}  # connected workers -> first seen
        try:  # the workers at the start: all of them may be lost before the first look
            self.seen = dict.fromkeys(client.processing(), self.alive_at)
        except Exception:  # the client's own failure ends the pass's futures
            pass
        self.left = 0  # workers seen to leave while the pass waited
        self.kills_at_progress = self._kills()

    def _kills(self) -> int:
        """Workers of the embedded cluster killed for memory so far (0 for another cluster)."""
        kills = memory_kills(self.client)
        return 0 if kills is None else kills[0]

    def progress(self) -> None:
        """A task of the pass finished."""
        self.alive_at = self.free_at = self.answered_at = time.monotonic()
        self.kills_at_progress = self._kills()

    def check(self) -> None:
        """Look at the cluster (at most every ``interval`` seconds); raise when stuck."""
        now = time.monotonic()
        if now < self.next_look:
            return
        self.next_look = now + self.interval
        try:
            if self.client.status != "running":
                raise ConnectionError(f"the client is {self.client.status}")
            present = self.client.processing()
            workers = self.client.scheduler_info(n_workers=-1).get("workers", {})
        except Exception as err:  # a lost scheduler cancels the futures, which says so
            if now - self.answered_at >= self.timeout:  # ... unless they never end
                raise self.where.unanswered(err, self.timeout) from err
            return
        self.answered_at = now
        self._check_alive(now, present)
        self._check_paused(now, present, workers)

    def _check_alive(self, now: float, present: dict[str, Any]) -> None:
        self.left += len(set(self.seen) - set(present))
        self.seen = {w: self.seen.get(w, now) for w in present}
        # a cluster of one's own that has had no worker yet is waited for, as dask does (an
        # adaptive or batch-queue cluster starts from none); the embedded one has its workers
        waiting = not present and not self.left and memory_kills(self.client) is None
        settled = any(now - t >= self.settle and present[w] for w, t in self.seen.items())
        # workers killed for memory again and again with no task finished: a restarted worker
        # may stay up past `settle` on a busy machine before its task kills it once more
        dying = self._kills() - self.kills_at_progress >= REPEATED_KILLS
        if (waiting or settled) and not dying:
            self.alive_at = now
        elif now - self.alive_at >= self.timeout:
            raise self.where.no_live_workers(
                self.client, len(present), self.left, self.timeout, self.settle
            )

    def _check_paused(
        self, now: float, present: dict[str, Any], workers: dict[str, dict[str, Any]]
    ) -> None:
        paused = {a: w for a, w in workers.items() if w.get("status") == "paused"}
        over = {a: w for a, w in workers.items() if a in paused or _over_target(w)}
        holding = [a for a, keys in present.items() if keys]
        if holding:
            stuck, held = (
                all(a in paused for a in holding),
                {a: paused[a] for a in holding if a in paused},
            )
        else:  # tasks wait: dask sends none to paused workers
            stuck, held = bool(workers) and len(over) == len(workers), over
        if not stuck:
            self.free_at = now
        elif now - self.free_at >= self.paused_timeout:
            raise self.where.paused(held, self.paused_timeout)


def _over_target(worker: dict[str, Any]) -> bool:
    """Whether a worker (as in ``scheduler_info()["workers"]``) uses more than its memory
    target (``distributed.worker.memory.target`` of its limit)."""
    limit = worker.get("memory_limit") or 0
    target = dask.config.get("distributed.worker.memory.target")
    memory = worker.get("metrics", {}).get("memory", 0)
    return bool(limit and target and memory > float(target) * limit)
