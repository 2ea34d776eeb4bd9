"""Peak resident memory of processes (Dask workers), sampled in a thread, for benchmarks."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress

import psutil


@contextmanager
def peak_memory(pids: list[int], interval: float = 0.02) -> Iterator[dict[int, int]]:
    """Sample the resident memory of processes ``pids`` in a thread while the block runs.

    Yields ``{pid: peak bytes}``, filled in as the samples come (worker pids:
    ``client.run(os.getpid).values()``).
    """
    peaks = dict.fromkeys(pids, 0)
    processes = [psutil.Process(pid) for pid in pids]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            for proc in processes:
                with suppress(psutil.NoSuchProcess):
                    peaks[proc.pid] = max(peaks[proc.pid], proc.memory_info().rss)
            stop.wait(interval)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield peaks
    finally:
        stop.set()
        thread.join()
