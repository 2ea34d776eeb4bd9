"""The Dask engine against the numpy reference executor, on real clusters and zarr stores."""

from __future__ import annotations

import dataclasses
import logging
import os
import pickle
import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from functools import partial

import dask
import dask.array as da
import numpy as np
import pytest
import xarray as xr
import zarr
from dask.callbacks import Callback
from distributed import Client, LocalCluster
from distributed.comm import CommClosedError

from kelr_dist.engine.cluster import ClusterError, WorkerTuning, close_embedded_cluster, get_client
from kelr_dist.engine.failures import PassContext
from kelr_dist.engine.graph import COMBINE_BYTES, combine_fan_in
from kelr_dist.engine.passes import (
    build_graph,
    keep_in_memory,
    observe_graphs,
    run_reduction,
    run_reductions,
)
from kelr_dist.engine.placement import spread
from kelr_dist.engine.watch import Watch
from kelr_dist.kernels.reduction import BlockInfo, Reduction, reduce_in_memory
from kelr_dist.testing import peak_memory

DIMS = ("chain", "time", "component")
MAX_LAG = 5
log = logging.getLogger(__name__)


# --- test kernels (module level: worker processes import them) ---------------------------------


def lagged_kernel(x: np.ndarray, info: BlockInfo, halo: np.ndarray) -> dict:
    """Brute-force ``sum_n x[n] (x) x[n+s]`` over the block's n with ``n + s`` in the chain."""
    y = np.concatenate([x, halo])
    sums = np.zeros((MAX_LAG + 1, x.shape[1], x.shape[1]))
    pairs = np.zeros(MAX_LAG + 1)
    for s in range(MAX_LAG + 1):
        m = max(0, min(len(x), len(y) - s))
        sums[s] = (x[:m, :, None] * y[s : s + m, None, :]).sum(axis=0)  # no BLAS: bitwise stable
        pairs[s] = m
    return {"sums": sums, "pairs": pairs}


def moments_kernel(x: np.ndarray, info: BlockInfo, halo: None) -> dict:
    return {"count": len(x), "sum": x.sum(axis=0), "sumsq": (x * x).sum(axis=0)}


def exact_blocks_kernel(full: np.ndarray, x: np.ndarray, info: BlockInfo, halo: np.ndarray) -> dict:
    """Counts blocks whose rows or halo differ from ``full[chain]``, and rows seen per chain."""
    series = full[info.chain]
    wrong = not (
        info.chain_length == series.shape[0]
        and np.array_equal(x, series[info.start : info.stop])
        and np.array_equal(halo, series[info.stop : info.stop + MAX_LAG])
    )
    rows = np.zeros(full.shape[0])
    rows[info.chain] = info.length
    return {"wrong": int(wrong), "rows": rows}


def sleepy_lagged_kernel(x: np.ndarray, info: BlockInfo, halo: np.ndarray) -> dict:
    time.sleep(0.02)
    return lagged_kernel(x, info, halo)


def failing_kernel(x: np.ndarray, info: BlockInfo, halo: None) -> dict:
    if info.start == 5:
        raise ZeroDivisionError(f"kernel failed at row {info.start}")
    return {"count": len(x)}


LAGGED = Reduction("lagged", lagged_kernel, halo=MAX_LAG)
MOMENTS = Reduction("moments", moments_kernel)


# --- helpers --------------------------------------------------------------------------------------


def assert_partials_close(actual, expected, rtol: float) -> None:
    """Each array agrees to ``rtol`` relative to its largest entry."""
    if isinstance(expected, dict):
        assert actual.keys() == expected.keys()
        for key in expected:
            assert_partials_close(actual[key], expected[key], rtol)
        return
    expected = np.asarray(expected, dtype=float)
    scale = max(np.abs(expected).max(), 1e-300)
    assert np.abs(np.asarray(actual) - expected).max() <= rtol * scale


def make_trajectory(rng: np.random.Generator, chains: int, n: int, d: int = 2) -> np.ndarray:
    """Random ``(chains, n, d)`` samples; chains are offset so that mixing them shows."""
    return rng.standard_normal((chains, n, d)) + 10.0 * np.arange(chains)[:, None, None]


def random_chunks(rng: np.random.Generator, n: int) -> tuple[int, ...]:
    """Random block lengths adding up to ``n``, many of them shorter than the halo."""
    edges = np.sort(rng.choice(np.arange(1, n), size=rng.integers(1, n // 3), replace=False))
    return tuple(np.diff(np.concatenate([[0], edges, [n]])).tolist())


def as_dask(x: np.ndarray, time_chunks) -> xr.DataArray:
    return xr.DataArray(da.from_array(x, chunks=(1, time_chunks, x.shape[2])), dims=DIMS)


def write_zarr(path, x: np.ndarray, time_chunk: int) -> xr.DataArray:
    """Write ``x`` to a zarr store with plain xarray and open it lazily."""
    xr.DataArray(x, dims=DIMS).to_dataset(name="x").chunk({"chain": 1, "time": time_chunk}).to_zarr(
        path, consolidated=False
    )
    return xr.open_zarr(path, consolidated=False)["x"]


@contextmanager
def raise_if_dask_computes() -> Iterator[None]:
    """Fail if anything is computed through the dask scheduler inside the block."""

    def forbidden(dsk, keys, **kwargs):
        raise RuntimeError("dask computed something while building the graph")

    with dask.config.set(scheduler=forbidden):
        yield


class ComputeGuard(Callback):
    """flox's ``raise_if_dask_computes``: a dask callback that fails on any local compute,
    whichever scheduler it is given (``scheduler="synchronous"`` included)."""

    def _start(self, dsk) -> None:
        raise RuntimeError("dask computed something while building a pass's graph")


# --- clusters -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def thread_client() -> Iterator[Client]:
    """In-process cluster (threads): fast, for the many numpy reference cases."""
    with Client(processes=False, n_workers=1, threads_per_worker=2, dashboard_address=None) as c:
        yield c


@pytest.fixture(scope="module")
def process_client() -> Iterator[Client]:
    """The embedded cluster: 2 worker processes x 400 MiB (shared by the process tests). A
    worker that has unpickled this module's kernels holds about 270 MiB at rest (the module's
    imports: the package, numba, xarray), over the 80% of 300 MiB where dask pauses it."""
    client = get_client(n_workers=2, memory_limit="400MiB", quiet=True)
    client.wait_for_workers(2)
    yield client
    close_embedded_cluster()


# --- numpy reference ------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(8))
def test_random_chunkings_match_reference(thread_client: Client, seed: int) -> None:
    rng = np.random.default_rng(seed)
    chains = int(rng.integers(1, 4))
    x = make_trajectory(rng, chains, n=int(rng.integers(20, 80)))
    chunks = random_chunks(rng, x.shape[1])
    exact = Reduction("exact", partial(exact_blocks_kernel, x), halo=MAX_LAG)
    lagged, moments, blocks = run_reductions(
        as_dask(x, chunks), [LAGGED, MOMENTS, exact], thread_client, split_every=3
    )
    assert_partials_close(lagged, reduce_in_memory(LAGGED, x), 1e-12)
    assert_partials_close(moments, reduce_in_memory(MOMENTS, x), 1e-12)
    assert blocks["wrong"] == 0
    np.testing.assert_array_equal(blocks["rows"], np.full(chains, x.shape[1]))


def test_lagged_pairs_stop_at_chain_end(thread_client: Client) -> None:
    x = make_trajectory(np.random.default_rng(1), chains=3, n=12)
    result = run_reduction(as_dask(x, (2, 1, 4, 5)), LAGGED, thread_client)
    np.testing.assert_array_equal(result["pairs"], 3 * (12 - np.arange(MAX_LAG + 1)))
    brute = [sum(np.outer(c[n], c[n + s]) for c in x for n in range(12 - s)) for s in range(6)]
    assert_partials_close(result["sums"], np.array(brute), 1e-12)


def test_halo_longer_than_chain_and_single_block(thread_client: Client) -> None:
    x = make_trajectory(np.random.default_rng(2), chains=2, n=4)
    for chunks in [(4,), (1, 1, 1, 1), (3, 1)]:
        result = run_reduction(as_dask(x, chunks), LAGGED, thread_client, split_every=2)
        assert_partials_close(result, reduce_in_memory(LAGGED, x), 1e-12)


def test_chain_and_component_chunks_are_normalised(thread_client: Client) -> None:
    x = make_trajectory(np.random.default_rng(3), chains=3, n=30, d=3)
    data = xr.DataArray(da.from_array(x, chunks=(2, 7, 1)), dims=DIMS)
    result = run_reduction(data, LAGGED, thread_client)
    assert_partials_close(result, reduce_in_memory(LAGGED, x), 1e-12)


def test_float32_blocks_reach_kernels_as_float64(thread_client: Client) -> None:
    x = make_trajectory(np.random.default_rng(4), chains=1, n=40).astype(np.float32)
    result = run_reduction(as_dask(x, 9), LAGGED, thread_client)
    assert_partials_close(result, reduce_in_memory(LAGGED, x.astype(np.float64)), 1e-12)


def test_building_the_graph_computes_nothing(tmp_path) -> None:
    x = make_trajectory(np.random.default_rng(5), chains=2, n=50)
    data = write_zarr(tmp_path / "t.zarr", x, time_chunk=3)
    with raise_if_dask_computes():
        graph = build_graph(data, [LAGGED, MOMENTS], split_every=4)
        with pytest.raises(RuntimeError, match="computed"):
            data.sum().compute()  # the guard itself works
    assert len(graph.blocks) == 2 * 17


def test_large_partials_narrow_the_combine_tree(tmp_path) -> None:
    """Reductions that declare large partials get a combine tree of a smaller fan-in (down to
    2), so that a combine task holds at most COMBINE_BYTES of them; small ones keep
    ``split_every``."""
    x = make_trajectory(np.random.default_rng(5), chains=2, n=50)
    data = write_zarr(tmp_path / "t.zarr", x, time_chunk=3)
    big = dataclasses.replace(LAGGED, partial_bytes=COMBINE_BYTES // 3)
    huge = dataclasses.replace(LAGGED, partial_bytes=COMBINE_BYTES)
    assert combine_fan_in(8, 0) == 8 and combine_fan_in(8, COMBINE_BYTES // 3) == 3
    assert combine_fan_in(8, 10 * COMBINE_BYTES) == 2
    for reductions, fan_in in (([LAGGED], 8), ([big], 3), ([big, huge], 2)):
        graph = build_graph(data, reductions, split_every=8)
        blocks = len(graph.blocks)
        expected, parts = 0, blocks
        while parts > 1:
            expected += parts // fan_in + (parts % fan_in > 1)
            parts = -(-parts // fan_in)
        assert len(graph.combines) == expected, (reductions, fan_in)


LOADED_BLOCKS: list[int] = []


def record_load(block: np.ndarray) -> np.ndarray:
    LOADED_BLOCKS.append(block.shape[1])
    return block


def test_reductions_share_one_load_per_block(thread_client: Client) -> None:
    x = make_trajectory(np.random.default_rng(11), chains=2, n=40)
    loaded = da.from_array(x, chunks=(1, 3, 2)).map_blocks(record_load, dtype=x.dtype)
    LOADED_BLOCKS.clear()
    exact = Reduction("exact", partial(exact_blocks_kernel, x), halo=MAX_LAG)
    with raise_if_dask_computes():
        lagged, moments, blocks = run_reductions(
            xr.DataArray(loaded, dims=DIMS), [LAGGED, MOMENTS, exact], thread_client
        )
    assert sorted(LOADED_BLOCKS) == sorted([3] * 13 * 2 + [1] * 2)  # each block read once
    assert blocks["wrong"] == 0
    assert_partials_close(lagged, reduce_in_memory(LAGGED, x), 1e-12)


def test_kernel_error_keeps_type_and_message(thread_client: Client) -> None:
    x = make_trajectory(np.random.default_rng(6), chains=1, n=20)
    with pytest.raises(ZeroDivisionError, match="kernel failed at row 5"):
        run_reduction(as_dask(x, 5), Reduction("fails", failing_kernel), thread_client)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"split_every": 1}, "split_every=1"),
        ({"reductions": []}, "non-empty"),
        ({"reductions": [Reduction("bad", moments_kernel, halo=-1)]}, "halo=-1"),
        ({"trajectory": xr.DataArray(np.zeros((1, 3, 2)), dims=DIMS)}, "backed by dask"),
        ({"trajectory": xr.DataArray(da.zeros((3, 2)), dims=("time", "component"))}, "dims"),
    ],
)
def test_invalid_arguments(thread_client: Client, kwargs: dict, message: str) -> None:
    args = {
        "trajectory": as_dask(np.zeros((1, 6, 2)), 2),
        "reductions": [MOMENTS],
        "client": thread_client,
    } | kwargs
    with pytest.raises(ValueError, match=message):
        run_reductions(**args)


def test_progress_bar_counts_blocks(thread_client: Client, capsys) -> None:
    x = make_trajectory(np.random.default_rng(7), chains=2, n=30)
    run_reduction(as_dask(x, 10), MOMENTS, thread_client, progress=True)
    assert "6/6" in capsys.readouterr().err
    run_reduction(as_dask(x, 10), MOMENTS, thread_client, progress=False)
    assert capsys.readouterr().err == ""


# --- worker processes and zarr stores ------------------------------------------------------------


def test_zarr_chunkings_and_worker_counts_agree(tmp_path, process_client: Client) -> None:
    rng = np.random.default_rng(8)
    x = make_trajectory(rng, chains=2, n=500)
    expected = reduce_in_memory(LAGGED, x)
    for time_chunk in (3, 64, 170):
        data = write_zarr(tmp_path / f"chunk{time_chunk}.zarr", x, time_chunk)
        assert data.data.chunks[1][0] == time_chunk
        result = run_reduction(data, LAGGED, process_client, split_every=4)
        assert_partials_close(result, expected, 1e-10)
    with LocalCluster(n_workers=1, threads_per_worker=1, dashboard_address=None) as one:
        with Client(one) as client:
            assert_partials_close(run_reduction(data, LAGGED, client), expected, 1e-10)


def test_store_kept_in_memory_is_read_once_with_the_same_result(
    tmp_path, process_client: Client
) -> None:
    """A store that fits in the workers' memory is persisted: several passes, one read of the
    store (the store is deleted after the first passes), results identical to the plain reads."""
    x = make_trajectory(np.random.default_rng(21), chains=2, n=2000)
    data = write_zarr(tmp_path / "t.zarr", x, time_chunk=128)  # 16 blocks a chain, 1 short
    kept, in_memory = keep_in_memory(data, process_client)
    assert in_memory and kept.attrs == data.attrs
    # its blocks asked of the workers so that each holds the same rows to within one block
    # (dask may still move a block to an idle worker: the restrictions are loose)
    layer = kept.data.dask.layers[kept.data.name]
    process_client.gather(list(layer.values()))  # loaded
    lengths = list(kept.data.chunks[1]) * kept.data.shape[0]
    asked = {w: sum(lengths[i] for i in run) for w, run in spread(lengths, process_client).items()}
    assert len(asked) == 2 and abs(np.subtract(*asked.values())) <= max(lengths)
    assert all(process_client.who_has(list(layer.values())).values())
    plain = [run_reduction(data, r, process_client) for r in (LAGGED, MOMENTS)]
    again = [run_reduction(kept, r, process_client) for r in (LAGGED, MOMENTS)]
    for a, b in zip(plain, again, strict=True):
        assert_partials_close(b, a, 1e-12)
    shutil.rmtree(tmp_path / "t.zarr")  # later passes need no store at all
    assert_partials_close(run_reduction(kept, LAGGED, process_client), plain[0], 1e-12)
    too_big, kept_flag = keep_in_memory(data, process_client, fraction=1e-9)
    assert not kept_flag and too_big is data
    assert keep_in_memory(data, "synchronous") == (data, False)


@pytest.mark.slow
def test_killed_worker_gives_identical_result(tmp_path, process_client: Client) -> None:
    x = make_trajectory(np.random.default_rng(9), chains=2, n=3000)
    data = write_zarr(tmp_path / "t.zarr", x, time_chunk=50)  # 120 blocks, 20 ms each
    sleepy = Reduction("sleepy", sleepy_lagged_kernel, halo=MAX_LAG)
    reference = run_reduction(data, sleepy, process_client)

    busy_victims = []

    def kill_one_worker() -> None:
        while not any(process_client.processing().values()):
            time.sleep(0.01)
        time.sleep(0.5)
        victim, tasks = next(iter(process_client.processing().items()))
        busy_victims.append(bool(tasks))
        with suppress(CommClosedError):
            process_client.run(os._exit, 1, workers=[victim])

    killer = threading.Thread(target=kill_one_worker)
    killer.start()
    before = set(process_client.run(os.getpid).values())
    result = run_reduction(data, sleepy, process_client)
    killer.join()
    process_client.wait_for_workers(2)
    after = set(process_client.run(os.getpid).values())
    assert busy_victims == [True]  # killed while it had tasks of the job
    assert before != after  # one worker process really died and was restarted
    for key in reference:
        np.testing.assert_array_equal(result[key], reference[key])
    assert_partials_close(result, reduce_in_memory(LAGGED, x), 1e-12)


# --- out of core ----------------------------------------------------------------------------------

ROWS_PER_BLOCK = 2**20  # 16 MiB float64 blocks of (rows, 2)
BLOCKS_PER_CHAIN = 80  # 2 chains x 80 blocks x 16 MiB = 2.5 GiB
WORKER_MEMORY = 400 * 2**20  # the workers of process_client


def increments_kernel(x: np.ndarray, info: BlockInfo, halo: np.ndarray) -> dict:
    """``sum_n (x[n+1] - x[n])**2`` over the block's n with ``n + 1`` in the chain, ``(d,)``."""
    steps = np.diff(np.concatenate([x, halo]), axis=0)
    return {"sq": (steps * steps).sum(axis=0)}


def big_block(base: np.ndarray, g: int) -> np.ndarray:
    """Block number ``g`` (over all chains) of the big store: ``base * a_g + b_g``."""
    return base * (1.0 + g / 100.0) + g


def big_store_expectation(base: np.ndarray) -> dict:
    """Exact moments and squared increments of the big store, from the moments of ``base``."""
    n, s1, s2 = len(base), base.sum(axis=0), (base * base).sum(axis=0)
    inner = (np.diff(base, axis=0) ** 2).sum(axis=0)
    expected = {"count": 0, "sum": 0.0, "sumsq": 0.0, "sq": 0.0}
    for c in range(2):
        for g in range(c * BLOCKS_PER_CHAIN, (c + 1) * BLOCKS_PER_CHAIN):
            a, b = 1.0 + g / 100.0, float(g)
            expected["count"] += n
            expected["sum"] = expected["sum"] + a * s1 + b * n
            expected["sumsq"] = expected["sumsq"] + a * a * s2 + 2 * a * b * s1 + b * b * n
            expected["sq"] = expected["sq"] + a * a * inner
            if g + 1 < (c + 1) * BLOCKS_PER_CHAIN:  # the step into the next block of the chain
                expected["sq"] = (
                    expected["sq"] + (big_block(base[:1], g + 1) - a * base[-1] - b)[0] ** 2
                )
    return expected


@pytest.mark.slow
def test_out_of_core_store_within_worker_memory(tmp_path, process_client: Client) -> None:
    shape = (2, BLOCKS_PER_CHAIN * ROWS_PER_BLOCK, 2)
    nbytes = int(np.prod(shape)) * 8
    free = shutil.disk_usage(tmp_path).free
    if free < 2 * nbytes:
        pytest.skip(f"needs {2 * nbytes / 2**30:.1f} GiB free disk, have {free / 2**30:.1f} GiB")
    path = tmp_path / "big.zarr"
    base = np.random.default_rng(10).standard_normal((ROWS_PER_BLOCK, 2))
    try:
        store = zarr.open_group(path, mode="w").create_array(
            "x",
            shape=shape,
            chunks=(1, ROWS_PER_BLOCK, 2),
            dtype="float64",
            compressors=None,
            dimension_names=DIMS,
        )
        for g in range(2 * BLOCKS_PER_CHAIN):
            c, k = divmod(g, BLOCKS_PER_CHAIN)
            store[c, k * ROWS_PER_BLOCK : (k + 1) * ROWS_PER_BLOCK] = big_block(base, g)
        data = xr.open_zarr(path, consolidated=False)["x"]
        pids = list(process_client.run(os.getpid).values())
        increments = Reduction("increments", increments_kernel, halo=1)
        start = time.perf_counter()
        with peak_memory(pids) as peaks:
            moments, steps = run_reductions(data, [MOMENTS, increments], process_client)
        elapsed = time.perf_counter() - start
    finally:
        shutil.rmtree(path, ignore_errors=True)
    log.info(
        "out of core: %.2f GiB in %.1f s, worker peak RSS %s MiB",
        nbytes / 2**30,
        elapsed,
        [round(p / 2**20) for p in peaks.values()],
    )
    assert all(0 < peak < WORKER_MEMORY for peak in peaks.values()), peaks
    expected = big_store_expectation(base)
    assert moments["count"] == expected["count"]
    for key in ("sum", "sumsq"):
        assert_partials_close(moments[key], expected[key], 1e-10)
    assert_partials_close(steps["sq"], expected["sq"], 1e-10)


# --- coalesced chunks, scattered in-memory input, thread limits, graphs that compute nothing ----


def weighted_sum_kernel(weights: np.ndarray, x: np.ndarray, info: BlockInfo, halo: None) -> dict:
    return {"sum": x.sum(axis=0) * weights[0]}


def test_a_pass_carrying_a_large_model_sends_it_once_without_dask_warning(
    thread_client: Client, recwarn: pytest.WarningsRecorder
) -> None:
    """A reduction holding a 24 MiB table (a fitted model, like the KDE baseline's grids) enters
    the graph once, not once per task, and distributed's large-graph warning (meant for data
    embedded in graphs) stays quiet."""
    x = make_trajectory(np.random.default_rng(13), chains=1, n=4000)
    weights = np.full(3 * 2**20, 2.0)  # 24 MiB
    graphs: list = []
    with observe_graphs(graphs.append):
        (total,) = run_reductions(
            as_dask(x, 250), [Reduction("weighted", partial(weighted_sum_kernel, weights))],
            thread_client, task_bytes=0,
        )  # fmt: skip
    assert len(graphs[0].blocks) == 16
    np.testing.assert_allclose(total["sum"], 2.0 * x[0].sum(axis=0), rtol=1e-12)
    assert not [w for w in recwarn if "large graph" in str(w.message)]


def test_coalesced_chunks_give_the_same_result_with_fewer_tasks(thread_client: Client) -> None:
    x = make_trajectory(np.random.default_rng(12), chains=2, n=3000)
    data = as_dask(x, 16)  # 188 chunks of 16 rows (256 bytes) per chain
    exact = Reduction("exact", partial(exact_blocks_kernel, x), halo=MAX_LAG)
    one = build_graph(data, [LAGGED, MOMENTS], task_bytes=0)
    few = build_graph(data, [LAGGED, MOMENTS], task_bytes=4096)  # 16 chunks per task
    assert len(one.blocks) == 2 * 188
    assert len(few.blocks) == 2 * 12
    assert len(dict(few.total.__dask_graph__())) < len(dict(one.total.__dask_graph__())) / 2
    assert few.task_edges[:3] == (0, 256, 512) and few.task_edges[-1] == 3000
    plain = run_reductions(data, [LAGGED, MOMENTS, exact], thread_client, task_bytes=0)
    joined = run_reductions(data, [LAGGED, MOMENTS, exact], thread_client, task_bytes=4096)
    for a, b in zip(plain[:2], joined[:2], strict=True):
        assert_partials_close(b, a, 1e-12)
    assert joined[2]["wrong"] == 0  # each task saw its rows and the next MAX_LAG of its chain
    np.testing.assert_array_equal(joined[2]["rows"], [3000, 3000])
    assert_partials_close(joined[0], reduce_in_memory(LAGGED, x), 1e-12)


def test_default_task_target_coalesces_small_chunks_only() -> None:
    x = np.zeros((1, 2**16, 2))
    small = build_graph(as_dask(x, 64), [MOMENTS])  # 1 KiB chunks, 1 MiB in all
    assert len(small.blocks) == 32  # MIN_TASKS tasks of 32 chunks each
    big = build_graph(as_dask(np.zeros((1, 2**20, 2)), 2**16), [MOMENTS])  # 1 MiB chunks
    assert len(big.blocks) == 16  # a chunk above 1/MIN_TASKS of the data stays alone
    with pytest.raises(ValueError, match="task_bytes=-1"):
        build_graph(as_dask(x, 64), [MOMENTS], task_bytes=-1)


def test_error_in_a_coalesced_task_names_its_rows(thread_client: Client) -> None:
    x = make_trajectory(np.random.default_rng(6), chains=1, n=20)
    with pytest.raises(ZeroDivisionError, match="kernel failed at row 5"):
        run_reduction(as_dask(x, 5), Reduction("fails", failing_kernel), thread_client)
    with pytest.raises(ValueError, match="pass 'fails', chain 0, rows 10-20 of store"):
        run_reduction(as_dask(x, 5), Reduction("fails", failing_kernel_at_10), thread_client,
                      task_bytes=160)  # fmt: skip


def failing_kernel_at_10(x: np.ndarray, info: BlockInfo, halo: None) -> dict:
    if info.start == 10:
        raise ValueError(f"kernel failed on rows {info.start}-{info.stop}")
    return {"count": len(x)}


@pytest.mark.slow
def test_numpy_input_is_not_in_the_graph(thread_client: Client) -> None:
    """1e7 rows (160 MB) of numpy input: scattered once, every pass's graph holds keys only."""
    from kelr_dist.data.store import as_trajectory
    from kelr_dist.engine.passes import scatter_trajectory

    x = np.random.default_rng(13).standard_normal((10**7, 2))
    trajectory = as_trajectory(xr.DataArray(x, dims=("time", "component"), attrs={"dt": 0.1}))
    embedded = build_graph(trajectory, [MOMENTS, LAGGED])
    assert len(pickle.dumps(dict(embedded.total.__dask_graph__()))) > x.nbytes  # the old way
    scattered = scatter_trajectory(trajectory, thread_client)
    assert scatter_trajectory(scattered, thread_client) is scattered  # nothing left to send
    for reductions in ([MOMENTS], [LAGGED, MOMENTS]):
        graph = build_graph(scattered, reductions)
        size = len(pickle.dumps(dict(graph.total.__dask_graph__())))
        log.info("graph of a pass over 1e7 numpy rows: %d bytes", size)
        assert size < 2**20
    moments = run_reduction(scattered, MOMENTS, thread_client, progress=False)
    assert moments["count"] == 10**7
    np.testing.assert_allclose(moments["sum"], x.sum(axis=0), rtol=1e-10)


def test_numpy_input_runs_on_worker_processes(process_client: Client) -> None:
    from kelr_dist.data.store import as_trajectory

    x = make_trajectory(np.random.default_rng(14), chains=2, n=5000)
    trajectory = as_trajectory(xr.DataArray(x, dims=DIMS, attrs={"dt": 1.0}))
    result = run_reduction(trajectory, LAGGED, process_client, progress=False)
    assert_partials_close(result, reduce_in_memory(LAGGED, x), 1e-12)


def finalized_where(partial: dict) -> tuple[int, float]:
    """The process that finalizes, and a number of the partial."""
    return os.getpid(), float(partial["sum"].sum())


def finalize_fails(partial: dict) -> None:
    raise ArithmeticError(f"finalize failed on {partial['count']} rows")


def test_the_workers_finalize_and_the_caller_receives_the_results(process_client: Client) -> None:
    """The combined partials are finalized on the worker that holds them (a large partial never
    reaches the caller); an exception a finalize raises reaches the caller as it is."""
    x = make_trajectory(np.random.default_rng(15), chains=2, n=3000)
    trajectory = xr.DataArray(da.from_array(x, chunks=(1, 500, 3)), dims=DIMS)
    where = Reduction("where", moments_kernel, finalize=finalized_where)
    pid, total = run_reduction(trajectory, where, process_client, progress=False)
    assert pid in process_client.run(os.getpid).values()
    assert pid != os.getpid()
    assert total == pytest.approx(x.sum())
    assert run_reduction(trajectory, where, "synchronous")[1] == pytest.approx(x.sum())
    fails = Reduction("fails", moments_kernel, finalize=finalize_fails)
    for client in (process_client, "synchronous"):
        with pytest.raises(ArithmeticError, match="^finalize failed on 6000 rows$"):
            run_reductions(trajectory, [where, fails], client, progress=False)


def axis_sums(partial: dict) -> np.ndarray:
    return partial["a"].sum(axis=0)


def test_the_root_is_finalized_alike_where_it_was_combined_and_where_it_arrives() -> None:
    """A strided array in the root partial (as a combine may leave it) is finalized as the
    C-ordered copy another worker receives: a sum along an axis rounds by the layout, and a
    pass must give the same bits wherever its last task runs (a lost worker moves it)."""
    from kelr_dist.engine.graph import Stitched, _finish

    strided = np.moveaxis(np.random.default_rng(16).standard_normal((2, 4400, 11)), 2, 0)
    received = pickle.loads(pickle.dumps(strided))
    assert not strided.flags.c_contiguous and received.flags.c_contiguous
    assert not np.array_equal(strided.sum(axis=0), received.sum(axis=0))  # the hazard
    reductions = (Reduction("sums", moments_kernel, finalize=axis_sums),)
    here, there = (
        _finish(Stitched(({"a": a},), {}, {}, 4400), reductions).results()[0]
        for a in (strided, received)
    )
    np.testing.assert_array_equal(here, there)


def blas_threads(x: np.ndarray, info: BlockInfo, halo: None) -> np.ndarray:
    from threadpoolctl import threadpool_info

    return np.array([max(p["num_threads"] for p in threadpool_info())])


def test_a_users_workers_are_left_alone_unless_they_register_the_tuning(monkeypatch) -> None:
    """A user's worker process started with 2 BLAS threads (the caller's environment) and 2
    task threads: the passes leave its pools as they are; registering ``WorkerTuning`` lowers
    them to the worker's share, and removing it puts them back."""
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.setenv(name, "2")  # the nanny hands the caller's values to the worker
    x = as_dask(np.zeros((1, 40, 2)), 10)
    share = max(1, dask.system.CPU_COUNT // 2)
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=True,
                      dashboard_address=None) as cluster, Client(cluster) as client:  # fmt: skip
        untouched = run_reduction(x, Reduction("blas", blas_threads), client)
        client.register_plugin(WorkerTuning())
        tuned = run_reduction(x, Reduction("blas", blas_threads), client)
        client.unregister_worker_plugin(WorkerTuning.name)
        undone = run_reduction(x, Reduction("blas", blas_threads), client)
    assert untouched[0] == 4 * 2  # four blocks, each with the pools the worker started with
    assert tuned[0] == 4 * min(2, share)  # each at the worker's share
    assert undone[0] == 4 * 2


def test_the_embedded_workers_run_at_their_share_of_blas_threads(monkeypatch) -> None:
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.setenv(name, "8")
    close_embedded_cluster()
    try:
        client = get_client(n_workers=1, memory_limit="400MiB")
        seen = run_reduction(as_dask(np.zeros((1, 40, 2)), 10), Reduction("blas", blas_threads),
                             client)  # fmt: skip
    finally:
        close_embedded_cluster()
    assert seen[0] == 4 * max(1, dask.system.CPU_COUNT)


PASS_NAMES: list[str] = []


def test_building_every_pass_of_an_estimate_computes_nothing(monkeypatch) -> None:
    """Each pass's graph of a real estimate (the package's own reductions) is built under a
    dask callback that fails on any compute; the passes then run as usual."""
    import kelr_dist.engine.passes as engine
    from kelr_dist import estimate_response
    from kelr_dist.models.registry import make_model

    real = engine.build_graph

    def guarded(trajectory, reductions, **kwargs):
        with ComputeGuard():
            graph = real(trajectory, reductions, **kwargs)
        PASS_NAMES.extend(r.name for r in graph.reductions)
        return graph

    monkeypatch.setattr(engine, "build_graph", guarded)
    with ComputeGuard(), pytest.raises(RuntimeError, match="computed"):
        da.ones(3).sum().compute(scheduler="synchronous")  # the guard itself works
    model = make_model("ou")
    rng = np.random.default_rng(15)
    x = model.advance(model.initial_state(rng), 4000, rng)[0]
    PASS_NAMES.clear()
    for estimator, baselines in (("kernel-embedding", True), ("auto", False)):
        estimate_response(x, dt=model.dt, estimator=estimator, max_lag=20, kde=baselines,
                          gaussian=baselines, client="synchronous", progress=False)  # fmt: skip
    log.info("passes built under the guard: %s", sorted(set(PASS_NAMES)))
    assert {"moments", "coefficients"} <= set(PASS_NAMES) and len(set(PASS_NAMES)) >= 4


def failing_first_of_many(x: np.ndarray, info: BlockInfo, halo: None) -> dict:
    """Fails on the chain's first block at once; the others take a while."""
    if info.start == 0:
        raise ZeroDivisionError("the first block failed")
    time.sleep(0.05)
    return {"count": len(x)}


def test_a_failed_pass_of_many_blocks_leaves_the_client_usable() -> None:
    """A pass of 40 blocks (a combine tree of two levels) fails at its first block while most
    of the others wait: what is left of it is cancelled, and the next pass on the same client
    runs (cancelling a waiting block has the scheduler cancel its combine task too, which no
    client holds; distributed then fails an assertion and closes the client's connection).
    A client of its own: nothing earlier tests left on a shared one is in the way."""
    x = make_trajectory(np.random.default_rng(12), chains=1, n=400)
    failing = Reduction("fails", failing_first_of_many)
    with Client(processes=False, n_workers=1, threads_per_worker=2, dashboard_address=None) as c:
        with pytest.raises(ZeroDivisionError, match="the first block failed"):
            run_reduction(as_dask(x, 10), failing, c, task_bytes=0)
        result = run_reduction(as_dask(x, 10), MOMENTS, c)
    assert_partials_close(result, reduce_in_memory(MOMENTS, x), 1e-12)


def test_a_pass_whose_client_stopped_running_fails_within_its_deadline() -> None:
    """A waiting pass whose client is not running (its scheduler gone, a reconnection that
    never ends) fails once the scheduler left it unanswered for the watch's timeout, with the
    lost-connection line, instead of waiting for futures that may never end."""
    where = PassContext("pass 'moments'", "in memory", "inproc://gone", "kelr-x", frozenset(), ())
    with Client(processes=False, n_workers=1, threads_per_worker=1, dashboard_address=None) as c:
        watch = Watch(c, where, timeout=0.5, settle=10.0, interval=0.1, paused_timeout=60.0)
        watch.check()  # a running client: nothing to say
    deadline = time.monotonic() + 30
    with pytest.raises(ClusterError, match=r"lost the connection to the Dask scheduler at "
                       r"inproc://gone: no answer for 0.5 s \(ConnectionError: the client is "
                       r"closed\)"):  # fmt: skip
        while time.monotonic() < deadline:
            watch.check()
            time.sleep(0.1)
