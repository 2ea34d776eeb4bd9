"""Shared test set-up: one BLAS thread (tests share two cores; multithreaded BLAS on a busy
machine is several times slower for the small matrix products the kernels do), real
``dask scheduler`` / ``dask worker`` processes for the tests that need them, and the frame
along a forcing pattern."""

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")


def frame_along(f: np.ndarray) -> np.ndarray:
    """An orthonormal frame ``R (d, d)`` whose first row is ``f / |f|``: in the coordinates
    ``y = R x`` the constant forcing of ``y_1`` is the forcing along the pattern ``f``."""
    frame = np.linalg.qr(np.column_stack([f, np.eye(f.size)[:, 1:]]))[0].T
    return frame * np.sign(frame[0] @ f)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def dask_processes_in(
    folder: Path,
    workers: int = 2,
    cwd: Path | None = None,
    worker_options: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
) -> Iterator[str]:
    """A real ``dask scheduler`` and ``workers`` ``dask worker`` processes (one thread each, and
    ``worker_options``) on 127.0.0.1, started from the command line with their logs in
    ``folder``, ``cwd`` as their working directory and ``env`` added to their environment;
    yields the scheduler address, stops them afterwards."""
    address = f"tcp://127.0.0.1:{free_port()}"
    env = os.environ | {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p)} | (env or {})
    commands = [
        ["scheduler", "--host", "127.0.0.1", "--port", address.rsplit(":", 1)[1], "--no-dashboard"],
        *[["worker", address, "--nthreads", "1", *worker_options, "--no-dashboard"]] * workers,
    ]
    processes = []
    try:
        for k, command in enumerate(commands):
            with open(folder / f"{command[0]}-{k}.log", "w") as log:
                processes.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "dask", *command],
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        env=env,
                        cwd=cwd,
                    )
                )
        yield address
    finally:
        # the workers first, each to its end, then the scheduler: a worker whose scheduler is
        # gone while it closes waits 8 s for its nanny to kill it
        for process in reversed(processes):
            process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@pytest.fixture(scope="module")
def dask_processes(tmp_path_factory) -> Iterator[str]:
    """A real ``dask scheduler`` and two ``dask worker`` processes (one thread each) on
    127.0.0.1, started from the command line; yields the scheduler address."""
    with dask_processes_in(tmp_path_factory.mktemp("dask-processes")) as address:
        yield address
