"""get_client: the embedded LocalCluster, and real `dask scheduler`/`dask worker` processes."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import dask
import dask.array as da
import dask.system
import distributed.system
import numpy as np
import pytest
import xarray as xr
from conftest import free_port

from kelr_dist.engine import cluster
from kelr_dist.engine.cluster import ClusterError, client_for, close_embedded_cluster, get_client
from kelr_dist.engine.passes import run_reduction
from kelr_dist.kernels.reduction import BlockInfo, Reduction


def column_sums(x: np.ndarray, info: BlockInfo, halo: None) -> np.ndarray:
    return x.sum(axis=0)


SUMS = Reduction("sums", column_sums)


@pytest.fixture
def no_address(monkeypatch) -> Iterator[None]:
    """No scheduler address in the environment or the dask config."""
    monkeypatch.delenv("DASK_SCHEDULER_ADDRESS", raising=False)
    with dask.config.set({"scheduler-address": None}):
        yield


def worker_variable(name: str) -> str | None:
    """The environment variable ``name`` of the process this runs in."""
    return os.environ.get(name)


def check_sums_on(client) -> None:
    client.wait_for_workers(1, timeout=60)
    x = np.random.default_rng(0).standard_normal((2, 40, 3))
    data = xr.DataArray(da.from_array(x, chunks=(1, 7, 3)), dims=("chain", "time", "component"))
    result = run_reduction(data, SUMS, client, progress=False)
    np.testing.assert_allclose(result, x.sum(axis=(0, 1)), rtol=1e-12)


def test_connects_to_address(dask_processes: str) -> None:
    with get_client(dask_processes) as client:
        assert client.scheduler.address == dask_processes
        check_sums_on(client)


def test_connects_to_environment_address(dask_processes: str, monkeypatch) -> None:
    monkeypatch.setenv("DASK_SCHEDULER_ADDRESS", dask_processes)
    with get_client() as client:
        assert client.scheduler.address == dask_processes
        check_sums_on(client)


def test_embedded_settings_rejected_with_an_environment_address(monkeypatch) -> None:
    # the environment's address is known to the engine only (the options model refuses a given
    # one), which refuses them before any connection
    monkeypatch.setenv("DASK_SCHEDULER_ADDRESS", "tcp://127.0.0.1:1")
    message = "n_workers=2 applies to the embedded cluster only, not to the scheduler at DASK_"
    with pytest.raises(ValueError, match=message):
        get_client(n_workers=2)


def test_unreachable_address_raises_cluster_error(monkeypatch) -> None:
    monkeypatch.setattr(cluster, "CONNECT_TIMEOUT", 2.0)  # a refused connection is retried
    address = f"tcp://127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(ClusterError, match=f"address='{address}'"):
        get_client(address)


def test_a_listener_that_never_answers_is_an_error_not_a_hang(monkeypatch) -> None:
    """Something accepts connections at the address but never speaks Dask (another service's
    port, a frozen scheduler): dask's client waits for its handshake without a deadline."""
    monkeypatch.setattr(cluster, "CONNECT_TIMEOUT", 1.0)
    with socket.create_server(("127.0.0.1", 0)) as server:
        accepted: list[socket.socket] = []
        threading.Thread(target=lambda: accepted.append(server.accept()[0]), daemon=True).start()
        address = f"tcp://127.0.0.1:{server.getsockname()[1]}"
        errors: list[BaseException] = []

        def attempt() -> None:
            try:
                get_client(address)
            except BaseException as err:  # noqa: BLE001 - checked below
                errors.append(err)

        worker = threading.Thread(target=attempt, daemon=True)
        worker.start()
        worker.join(60.0)  # fails instead of hanging the suite
        assert errors, "get_client is still waiting for the handshake after 60 s"
        assert isinstance(errors[0], ClusterError)
        assert f"address='{address}': no answer within 1 s" in str(errors[0])
        assert accepted  # the connection was made: the handshake is what never came
        for sock in accepted:
            sock.close()


def test_a_memory_limit_below_the_floor_is_refused(no_address: None) -> None:
    # what the options model cannot know (its values' ranges are its own: test_options)
    message = r"memory_limit='100MiB' \(100 MiB per worker\) is below"
    with pytest.raises(ClusterError, match=message):
        get_client(memory_limit="100MiB")


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"n_workers": 0}, "n_workers: expected a positive integer, got 0"),
        ({"n_workers": True}, "n_workers: expected a positive integer, got True"),
        ({"memory_limit": "lots"}, "memory_limit: expected a memory size"),
    ],
)
def test_the_public_get_client_checks_its_arguments_by_the_options_model(
    no_address: None, given: dict, message: str
) -> None:
    """The public function refuses what ``estimate_response`` refuses, in the same words,
    before any cluster is started."""
    import kelr_dist

    with pytest.raises(ValueError, match=re.escape(message)):
        kelr_dist.get_client(**given)


def test_embedded_cluster_is_started_once_and_sized(no_address: None) -> None:
    try:
        client = get_client(n_workers=1, memory_limit="300MiB", quiet=True)
        workers = client.scheduler_info()["workers"].values()
        assert [(w["nthreads"], w["memory_limit"]) for w in workers] == [(1, 300 * 2**20)]
        share = str(max(1, dask.system.CPU_COUNT))  # one worker: all the cores are its share
        # (a function of the worker's own environment: os.environ.get would pickle this one's)
        assert list(client.run(worker_variable, "OMP_NUM_THREADS").values()) == [share]
        assert list(client.run(worker_variable, "NUMBA_NUM_THREADS").values()) == [share]
        assert os.getpid() not in client.run(os.getpid).values()  # a worker process
        assert client.scheduler_info()["services"]["dashboard"] != 8787  # a free port
        assert get_client() is client
        assert get_client(n_workers=1, memory_limit=300 * 2**20) is client
        check_sums_on(client)

        bigger = get_client(n_workers=1, memory_limit="2GB", quiet=True)
        assert bigger is not client and client.status != "running"
        memory = [w["memory_limit"] for w in bigger.scheduler_info()["workers"].values()]
        assert memory == [2 * 10**9]

        close_embedded_cluster()
        default = get_client(quiet=True)
        workers = default.scheduler_info()["workers"].values()
        n = dask.system.CPU_COUNT  # cgroup quota and affinity honoured
        assert len(workers) == n
        expected_memory = int(0.8 * distributed.system.MEMORY_LIMIT / n)
        assert all(abs(w["memory_limit"] - expected_memory) < 2**20 for w in workers)
    finally:
        close_embedded_cluster()
    close_embedded_cluster()  # a second close is a no-op


def test_the_default_size_gives_each_worker_at_least_the_floor(monkeypatch) -> None:
    """Many cores and little memory (a small container): the default embedded cluster starts
    as many workers as get MIN_WORKER_MEMORY each, not one per core that the floor would then
    refuse; a machine that cannot give even one worker the floor is refused, naming it."""
    monkeypatch.setattr(dask.system, "CPU_COUNT", 8)
    monkeypatch.setattr(distributed.system, "MEMORY_LIMIT", 1_000 * 2**20)
    workers = cluster._parse_workers(None)
    assert workers == 3  # 0.8 x 1000 MiB / 256 MiB
    assert cluster._parse_memory(None, workers) >= cluster.MIN_WORKER_MEMORY
    assert cluster._parse_workers(None, "2GiB") == 8  # a given limit: one worker per core
    monkeypatch.setattr(distributed.system, "MEMORY_LIMIT", 200 * 2**20)
    with pytest.raises(ClusterError, match="below the 256 MiB a worker process needs"):
        cluster._parse_memory(None, cluster._parse_workers(None))


def test_cli_refuses_a_memory_limit_below_what_a_worker_needs(tmp_path) -> None:
    """A worker below the floor was killed by its nanny at start-up, again and again, and the
    estimate hung with no worker left; now one line before any worker starts."""
    from kelr_dist.models.simulate import simulate

    simulate("ou", tmp_path / "ou.zarr", 2000, chunk=1000, progress=False)
    started = time.perf_counter()
    run = subprocess.run(
        [str(Path(sys.executable).parent / "kelr"), "estimate", str(tmp_path / "ou.zarr"),
         str(tmp_path / "out.zarr"), "--quiet", "--workers", "1", "--memory-limit", "100MiB"],
        capture_output=True, text=True, timeout=120,
        env={k: v for k, v in os.environ.items() if k != "DASK_SCHEDULER_ADDRESS"},
    )  # fmt: skip
    assert run.returncode == 2, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in run.stderr, run.stderr
    floor = cluster.MIN_WORKER_MEMORY // 2**20
    assert lines[0].startswith("kelr estimate: error: memory_limit='100MiB' (100 MiB per worker)")
    assert f"below the {floor} MiB a worker process needs" in lines[0]
    assert "--memory-limit" in lines[0]
    assert time.perf_counter() - started < 30  # no cluster was started
    assert not (tmp_path / "out.zarr").exists()


def test_the_floor_is_below_the_limits_the_suite_runs_with() -> None:
    assert cluster.MIN_WORKER_MEMORY <= 300 * 2**20


# --- security: tls:// from the dask config, plain TCP refused under require-encryption --------


def test_plain_tcp_to_another_host_refused_under_require_encryption() -> None:
    address = "tcp://192.0.2.1:8786"  # TEST-NET: refused before any connection is tried
    with dask.config.set({"distributed.comm.require-encryption": True}):
        with pytest.raises(ClusterError, match=f"refusing the plain-TCP address='{address}'"):
            get_client(address)
        with pytest.raises(ClusterError, match="refusing the plain-TCP address='192.0.2.1:8786'"):
            get_client("192.0.2.1:8786")  # no scheme: dask's default, tcp


def test_loopback_tcp_accepted_under_require_encryption(dask_processes: str) -> None:
    """An SSH tunnel or ``kubectl port-forward`` ends on loopback: nothing leaves this host."""
    with dask.config.set({"distributed.comm.require-encryption": True}):
        with get_client(dask_processes) as client:
            check_sums_on(client)


def test_tls_address_needs_tls_settings() -> None:
    with pytest.raises(ClusterError, match="no TLS settings for the client"):
        get_client(f"tls://127.0.0.1:{free_port()}")
    missing = {
        "distributed.comm.tls.ca-file": "/nonexistent/ca.pem",
        "distributed.comm.tls.client.cert": "/nonexistent/client.pem",
    }
    with dask.config.set(missing), pytest.raises(ClusterError, match="do not load"):
        get_client(f"tls://127.0.0.1:{free_port()}")


def test_cli_refuses_plain_tcp_under_require_encryption(tmp_path) -> None:
    from kelr_dist.models.simulate import simulate

    simulate("ou", tmp_path / "ou.zarr", 2000, chunk=1000, progress=False)
    env = os.environ | {"DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION": "True"}
    run = subprocess.run(
        [str(Path(sys.executable).parent / "kelr"), "estimate", str(tmp_path / "ou.zarr"),
         str(tmp_path / "out.zarr"), "--scheduler", "tcp://192.0.2.1:8786"],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert run.returncode == 2
    assert run.stderr.splitlines() == [
        "kelr estimate: error: refusing the plain-TCP address='tcp://192.0.2.1:8786': the dask "
        "config sets distributed.comm.require-encryption, so a scheduler on another host must "
        "be reached over tls:// (see deploy/tls)"
    ]
    assert not (tmp_path / "out.zarr").exists()


@pytest.mark.parametrize(
    ("address", "message"),
    [
        ("bogus", "address='bogus' has no port number; expected tcp://host:port, "
                  "e.g. 'tcp://bogus:8786'"),
        ("tcp://:8786", "address='tcp://:8786' has no host"),
        ("tcp://host:abc", "the port 'abc' is not a number from 1 to 65535"),
        ("tcp://host:0", "the port '0' is not a number from 1 to 65535"),
        ("bogus://host:1", "the scheme 'bogus' is not one of tcp, tls, ws, wss"),
        ("ucx://host:1", "the scheme 'ucx' is not one of"),
    ],
)  # fmt: skip
def test_malformed_address_refused_before_connecting(address: str, message: str) -> None:
    with pytest.raises(ClusterError, match=re.escape(message)):
        get_client(address)


def test_malformed_environment_address_named(monkeypatch) -> None:
    monkeypatch.setenv("DASK_SCHEDULER_ADDRESS", "localhost")
    with pytest.raises(ClusterError, match="DASK_SCHEDULER_ADDRESS='localhost' has no port"):
        get_client()


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--scheduler", "bogus"], {}, "address='bogus' has no port number"),
        ([], {"DASK_SCHEDULER_ADDRESS": "localhost"},
         "DASK_SCHEDULER_ADDRESS='localhost' has no port number"),
    ],
)  # fmt: skip
def test_cli_malformed_address_is_one_line_at_once(tmp_path, argv, env, message) -> None:
    """No client is left to close at exit (it waited 20 s and printed a traceback)."""
    from kelr_dist.models.simulate import simulate

    simulate("ou", tmp_path / "ou.zarr", 2000, chunk=1000, progress=False)
    started = time.perf_counter()
    run = subprocess.run(
        [str(Path(sys.executable).parent / "kelr"), "estimate", str(tmp_path / "ou.zarr"),
         str(tmp_path / "out.zarr"), "--quiet", *argv],
        capture_output=True, text=True, env=os.environ | env, timeout=120,
    )  # fmt: skip
    assert run.returncode == 2
    assert len(run.stderr.splitlines()) == 1, run.stderr
    assert run.stderr.startswith("kelr estimate: error: scheduler ") and message in run.stderr
    assert time.perf_counter() - started < 15  # the import and the store's check, no timeout
    assert not (tmp_path / "out.zarr").exists()


# --- client hygiene and thread pools ----------------------------------------------------------


def test_client_for_closes_only_the_clients_it_made(dask_processes: str, no_address) -> None:
    with client_for(dask_processes) as made:
        assert made.status == "running"
        check_sums_on(made)
    assert made.status == "closed"  # made from an address: closed afterwards
    with pytest.raises(ZeroDivisionError), client_for(dask_processes) as failed:
        raise ZeroDivisionError("an error inside the block")
    assert failed.status == "closed"  # also on an error
    with get_client(dask_processes) as own:
        with client_for(own) as same:
            assert same is own
        assert own.status == "running"  # the caller's client stays open
    with client_for("synchronous") as sync:
        assert sync == "synchronous"


def test_a_worker_or_nanny_address_is_refused_naming_what_answered(
    dask_processes: str, no_address
) -> None:
    """A worker's or a nanny's address (they speak Dask's protocol too) is not taken for a
    scheduler's: one ClusterError naming what answered and, for a worker, its scheduler (a
    client raised a TypeError from inside the worker and hung 20 s at exit)."""
    with get_client(dask_processes) as own:
        own.wait_for_workers(1, timeout=60)
        worker, info = next(iter(own.scheduler_info()["workers"].items()))
    with pytest.raises(
        ClusterError,
        match=re.escape(
            f"address={worker!r} is a Dask worker, not a scheduler; its scheduler is at "
            f"{dask_processes!r}"
        ),
    ):
        get_client(worker)
    with pytest.raises(ClusterError, match="is a Dask nanny, not a scheduler"):
        get_client(info["nanny"])


def test_client_for_closes_a_client_made_from_the_environment(
    dask_processes: str, monkeypatch
) -> None:
    monkeypatch.setenv("DASK_SCHEDULER_ADDRESS", dask_processes)
    with client_for() as made:
        assert made.scheduler.address == dask_processes
    assert made.status == "closed"


def test_client_for_leaves_the_embedded_cluster_running(no_address: None) -> None:
    try:
        with client_for(n_workers=1, memory_limit="300MiB", quiet=True) as embedded:
            pass
        assert embedded.status == "running" and get_client() is embedded
    finally:
        close_embedded_cluster()


EMBEDDED_THREADS = """
from kelr_dist.engine.cluster import close_embedded_cluster, get_client

def pools():
    from threadpoolctl import threadpool_info
    import os
    return sorted({p["num_threads"] for p in threadpool_info()}), os.environ["OMP_NUM_THREADS"]

if __name__ == "__main__":
    client = get_client(n_workers=2, memory_limit="500MiB", quiet=True)
    print(sorted(set(map(str, client.run(pools).values()))))
    client.restart()  # workers that replace lost ones get the same settings
    print(sorted(set(map(str, client.run(pools).values()))))
    close_embedded_cluster()
"""


def test_embedded_workers_use_their_share_of_threads_whatever_the_environment(
    tmp_path,
) -> None:
    """The caller exports 2 BLAS/OpenMP threads (a common site default): the embedded workers
    run theirs at their share of the cores all the same."""
    script = tmp_path / "threads.py"
    script.write_text(EMBEDDED_THREADS)
    env = os.environ | dict.fromkeys(
        ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"), "2"
    )
    env.pop("DASK_SCHEDULER_ADDRESS", None)
    run = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=180
    )
    assert run.returncode == 0, run.stderr
    share = max(1, dask.system.CPU_COUNT // 2)
    expected = [str(([share], str(share)))]
    assert run.stdout.splitlines() == [str(expected)] * 2
