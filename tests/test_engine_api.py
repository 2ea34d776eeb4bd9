"""The engine on dask's public machinery: tasks per pass in any store chunking, no dask
internals, and passes on paused workers that fail instead of hanging (real processes)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import numpy as np
import pytest
from conftest import dask_processes_in
from distributed import Client, LocalCluster, get_task_stream

from kelr_dist import estimate_response
from kelr_dist.data.store import open_trajectory
from kelr_dist.engine import passes
from kelr_dist.engine.cluster import ClusterError
from kelr_dist.engine.passes import build_graph, run_reductions
from kelr_dist.kernels.reduction import BlockInfo, Reduction, reduce_in_memory
from kelr_dist.models.simulate import simulate

PACKAGE = Path(__file__).resolve().parent.parent / "kelr_dist"
MAX_LAG = 7


def sums(x: np.ndarray, info: BlockInfo, halo: None) -> dict:
    return {"count": len(x), "sum": x.sum(axis=0)}


def lagged_of(max_lag: int) -> Reduction:
    """``sum_n x[n] * x[n + s]`` (element-wise) over the block's n with ``n + s`` in the chain,
    for ``s = 0..max_lag``: a reduction whose halo is ``max_lag``."""

    def kernel(x: np.ndarray, info: BlockInfo, halo: np.ndarray) -> dict:
        y = np.concatenate([x, halo])
        out = np.zeros((max_lag + 1, x.shape[1]))
        for s in range(max_lag + 1):
            m = max(0, min(len(x), len(y) - s))
            out[s] = (x[:m] * y[s : s + m]).sum(axis=0)
        return {"sums": out}

    return Reduction(f"lagged-{max_lag}", kernel, halo=max_lag)


SUMS = Reduction("sums", sums)
LAGGED = lagged_of(MAX_LAG)


@pytest.fixture(scope="module")
def client() -> Iterator[Client]:
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        Client(cluster) as c,
    ):
        yield c


@pytest.mark.parametrize("reductions", [[SUMS], [SUMS, LAGGED]], ids=["no halo", "halo"])
def test_tasks_per_pass_follow_blocks_not_store_chunks(tmp_path, client, reductions) -> None:
    """A store of 64-row chunks (250 a chain): the scheduler runs about one task per block
    (plus the combine tree), not one per stored chunk, and the result is the reference's."""
    path = tmp_path / "ou.zarr"
    simulate("ou", path, 16_000, chains=2, chunk=64, seed=1, progress=False)
    trajectory = open_trajectory(path)
    assert len(trajectory.data.chunks[1]) == 250
    graph = build_graph(trajectory, reductions, task_bytes=64 * 2 * 8 * 25)  # 25 chunks a task
    blocks = len(graph.blocks)
    assert blocks == 2 * 10
    with get_task_stream(client) as stream:
        results = run_reductions(trajectory, reductions, client, task_bytes=64 * 2 * 8 * 25)
    assert blocks < len(stream.data) <= 2 * blocks, len(stream.data)
    x = trajectory.values
    for reduction, result in zip(reductions, results, strict=True):
        expected = reduce_in_memory(reduction, x)
        for key in expected:
            np.testing.assert_allclose(result[key], expected[key], rtol=1e-12)


@pytest.mark.parametrize(
    ("chunk", "task_bytes", "halos", "once"),
    [
        (64, 64 * 2 * 8 * 3, [MAX_LAG], True),  # blocks of 192 rows, one halo
        (64, 64 * 2 * 8 * 3, [1, MAX_LAG, 150], True),  # halos up to most of a block
        (64, 0, [1, 100], False),  # blocks of 64 rows: shorter than the longer halo
        (1000, 0, [MAX_LAG], True),  # one stored chunk a block: the case the cuts are for
    ],
    ids=["one halo", "three halos", "short blocks", "large chunks"],
)
def test_store_tasks_read_each_row_once_and_the_cuts_are_stitched(
    tmp_path, monkeypatch, chunk, task_bytes, halos, once
) -> None:
    """A store's block tasks read their own rows only (no row twice, unless a block is no
    longer than the halo and reads it); the rows before each cut are reduced where the two
    blocks' partials meet, so every reduction's result is the whole series' (to rounding)."""
    from kelr_dist.engine.reading import StoreRows

    path = tmp_path / "ou.zarr"
    simulate("ou", path, 6_000, chains=2, chunk=chunk, seed=3, progress=False)
    trajectory = open_trajectory(path)
    reads: list[tuple[int, int, int]] = []
    read = StoreRows.read

    def recorded(self: StoreRows, chain: int, start: int, stop: int) -> np.ndarray:
        reads.append((chain, start, stop))
        return read(self, chain, start, stop)

    monkeypatch.setattr(StoreRows, "read", recorded)
    reductions = [SUMS, *(lagged_of(h) for h in halos)]
    results = run_reductions(trajectory, reductions, "synchronous", task_bytes=task_bytes)
    x = trajectory.values
    for reduction, result in zip(reductions, results, strict=True):
        expected = reduce_in_memory(reduction, x)
        for key in expected:
            scale = np.abs(expected[key]).max()  # sums near zero at some lags: rounding alone
            np.testing.assert_allclose(result[key], expected[key], rtol=1e-12, atol=1e-14 * scale)
    rows_read = sum(stop - start for _, start, stop in reads)
    if once:  # each block read its own rows, nothing else
        assert rows_read == x.shape[0] * x.shape[1]
    else:  # the blocks (one stored chunk each) no longer than the halo read it as well
        n = x.shape[1]
        halo = sum(min(max(halos), n - stop) for stop in range(chunk, n, chunk))
        assert rows_read == x.shape[0] * (n + halo)


def test_a_selection_of_a_store_is_read_as_selected(tmp_path, client) -> None:
    """Anything but the store as opened (here a time slice of it, doubled, with the store's
    attributes) is read through its own chunks: the result is the selection's."""
    path = tmp_path / "ou.zarr"
    simulate("ou", path, 4_000, chains=2, chunk=100, seed=2, progress=False)
    trajectory = open_trajectory(path)
    part = trajectory.isel(time=slice(500, 3500)) * 2.0
    part.attrs = trajectory.attrs
    (result,) = run_reductions(part, [LAGGED], client)
    expected = reduce_in_memory(LAGGED, part.values)
    np.testing.assert_allclose(result["sums"], expected["sums"], rtol=1e-12)


@pytest.mark.parametrize(
    "dims", [("chain", "time", "component"), ("component", "chain", "time"), ("time", "component")]
)
def test_a_task_reads_the_stored_rows_in_any_layout(tmp_path, dims) -> None:
    """The rows a block task reads of a store (``StoreRows.read``) are the trajectory's, as
    ``(rows, d)``, within one stored chunk and across several, in any order of the dims."""
    import xarray as xr

    from kelr_dist.engine.reading import store_rows

    rng = np.random.default_rng(5)
    chains = 2 if "chain" in dims else 1
    x = rng.standard_normal((chains, 1000, 3))  # (chain, time, component)
    by_dim = {"chain": 0, "time": 1, "component": 2}
    data = x if "chain" in dims else x[0]
    axes = [by_dim[d] for d in dims] if "chain" in dims else [by_dim[d] - 1 for d in dims]
    path = tmp_path / "s.zarr"
    ds = xr.Dataset({"x": (dims, data.transpose(axes))}, attrs={"dt": 0.1})
    ds.chunk({"time": 128}).to_zarr(path)
    trajectory = open_trajectory(path)
    reader = store_rows(trajectory)
    assert reader is not None
    for chain in range(chains):
        for start, stop in [(0, 128), (130, 250), (100, 700), (900, 1000)]:
            np.testing.assert_array_equal(reader.read(chain, start, stop), x[chain, start:stop])


# public API only ----------------------------------------------------------------------------

PRIVATE = [
    (r"\bMaterializedLayer\b|\bBlockwise\b|\bLayer\b", "dask graph layer classes"),
    (r"\.layers\b|\.dependencies\[", "reading a high-level graph's layers"),
    (r"\b(dask|distributed)\._\w+|from (dask|distributed)\._", "private dask modules"),
    (r"\bdask\.(core|optimization|blockwise|local)\b", "dask's low-level graph modules"),
    (r"optimize_graph\s*=\s*False", "unoptimised hand-built graphs"),
    (r"\bcull\(", "culling graphs by hand"),
    (r"run_on_scheduler|\bdask_scheduler\b", "the scheduler's internal state"),
]


def test_the_package_uses_no_dask_internals() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for pattern, what in PRIVATE:
                if re.search(pattern, line):
                    found.append(f"{path.relative_to(PACKAGE)}:{number}: {what}: {line.strip()}")
    assert not found, "\n".join(found)


# paused workers -----------------------------------------------------------------------------


def paused_cluster(folder: Path, memory_limit: str) -> AbstractContextManager[str]:
    """A real ``dask scheduler`` and two ``dask worker`` processes on 127.0.0.1 whose memory
    monitor pauses them at 1% of ``memory_limit`` (below what an idle worker holds)."""
    return dask_processes_in(
        folder,
        worker_options=("--memory-limit", memory_limit),
        env={"DASK_DISTRIBUTED__WORKER__MEMORY__PAUSE": "0.01"},
    )


def test_paused_workers_fail_the_estimate_with_one_line(tmp_path, monkeypatch) -> None:
    """Both workers of an external cluster paused for memory: the estimate ends within
    PAUSED_TIMEOUT (shortened here) with one line naming the workers and their limits."""
    monkeypatch.setattr(passes, "PAUSED_TIMEOUT", 5.0)
    monkeypatch.delenv("DASK_SCHEDULER_ADDRESS", raising=False)
    path = tmp_path / "ou.zarr"
    simulate("ou", path, 20_000, seed=0, progress=False)
    with (
        paused_cluster(tmp_path, "1GiB") as address,
        Client(address, timeout=120, set_as_default=False) as client,
    ):
        deadline = time.monotonic() + 120  # paused workers do not count for wait_for_workers
        while time.monotonic() < deadline:
            workers = client.scheduler_info(n_workers=-1)["workers"]
            if len(workers) == 2 and all(w["status"] == "paused" for w in workers.values()):
                break
            time.sleep(0.2)
        started = time.monotonic()
        with pytest.raises(ClusterError) as caught:
            estimate_response(path, client=address, max_order=4, max_lag=10, progress=False)
        elapsed = time.monotonic() - started
    message = str(caught.value)
    assert "\n" not in message
    assert re.match(r"pass '[^']+': no task finished for 5 s", message), message
    assert message.count("memory_limit 1024 MiB") == 2 and "paused" in message, message
    assert "--memory-limit" in message
    assert elapsed < 5.0 + 20, elapsed


def test_an_estimate_read_out_of_core_is_the_estimate_kept_in_memory(
    tmp_path, client, monkeypatch
) -> None:
    """The whole estimate (both families, the jackknife, the Stein correction) of a store read
    by every pass, its cuts stitched in the combine tree, is the estimate of the same store
    kept on the workers, whose blocks read their halos: to 1e-12, relative to each variable or,
    for one that is zero up to rounding, to the error bars."""
    from functools import partial

    import kelr_dist.pipeline.steps as steps
    from kelr_dist.engine.placement import keep_in_memory

    path = tmp_path / "tw.zarr"
    simulate("triple-well", path, 60_000, chains=2, chunk=10_000, seed=4, progress=False)
    options = {"client": client, "max_lag": 40, "max_order": 10, "progress": False}
    with pytest.warns(Warning):  # a short trajectory: the checks may warn, alike in both
        kept = estimate_response(path, **options)
    monkeypatch.setattr(steps, "keep_in_memory", partial(keep_in_memory, fraction=0.0))
    with pytest.warns(Warning):
        read = estimate_response(path, **options)
    assert (kept.attrs["store_reads"], read.attrs["store_reads"]) == (1, read.attrs["passes"])
    # variables zero up to rounding by construction (the Stein residuals, the jackknife of a fit
    # its refits share) are compared on the scale of the error bars
    floor = float(np.nanmax(kept["response_total_stderr"].values))
    for name, values in kept.data_vars.items():
        old, new = values.values, read[name].values
        if old.dtype.kind != "f":
            np.testing.assert_array_equal(new, old, err_msg=name)
            continue
        scale = max(np.nanmax(np.abs(old), initial=0.0), floor)
        np.testing.assert_allclose(new, old, rtol=0, atol=1e-12 * scale, err_msg=name)
