"""get_client: the embedded LocalCluster, and real `dask scheduler`/`dask worker` processes."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import dask
import dask.array as da
import numpy as np
import psutil
import pytest
import xarray as xr
from conftest import free_port

from kelr_dist.cluster import ClusterError, close_embedded_cluster, get_client
from kelr_dist.engine import run_reduction
from kelr_dist.reduction import BlockInfo, Reduction


def column_sums(x: np.ndarray, info: BlockInfo, halo: None) -> np.ndarray:
    return x.sum(axis=0)


SUMS = Reduction("sums", column_sums)


@pytest.fixture
def no_address(monkeypatch) -> Iterator[None]:
    """No scheduler address in the environment or the dask config."""
    monkeypatch.delenv("DASK_SCHEDULER_ADDRESS", raising=False)
    with dask.config.set({"scheduler-address": None}):
        yield


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


def test_embedded_settings_rejected_with_address(dask_processes: str) -> None:
    with pytest.raises(ValueError, match="n_workers=2 applies to the embedded cluster only"):
        get_client(dask_processes, n_workers=2)


def test_unreachable_address_raises_cluster_error() -> None:
    address = f"tcp://127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(ClusterError, match=f"address='{address}'"):
        get_client(address)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"memory_limit": "lots"}, "memory_limit='lots'"),
        ({"memory_limit": 0}, "memory_limit=0"),
        ({"n_workers": 0}, "n_workers=0"),
        ({"n_workers": 1.5}, "n_workers=1.5"),
    ],
)
def test_invalid_embedded_settings(no_address: None, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        get_client(**kwargs)


def test_embedded_cluster_is_started_once_and_sized(no_address: None) -> None:
    try:
        client = get_client(n_workers=1, memory_limit="300MiB", quiet=True)
        workers = client.scheduler_info()["workers"].values()
        assert [(w["nthreads"], w["memory_limit"]) for w in workers] == [(1, 300 * 2**20)]
        assert list(client.run(os.environ.get, "OMP_NUM_THREADS").values()) == ["1"]
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
        n = os.cpu_count()
        assert len(workers) == n
        expected_memory = int(0.8 * psutil.virtual_memory().total / n)
        assert all(abs(w["memory_limit"] - expected_memory) < 2**20 for w in workers)
    finally:
        close_embedded_cluster()
    close_embedded_cluster()  # a second close is a no-op


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
    from kelr_dist.simulate import simulate

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
