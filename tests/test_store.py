"""The trajectory store contract: hand-made stores open, broken ones fail with their own message."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import dask.array
import numpy as np
import pytest
import xarray as xr

from kelr_dist.data.store import (
    DIMS,
    MAX_CHUNK_BYTES,
    TrajectoryError,
    as_trajectory,
    describe_trajectory,
    open_trajectory,
    read_progress,
)
from kelr_dist.data.writer import create_store, mark_complete, write_progress, write_samples

# xarray writes the hand-made stores' string coordinates as zarr's (unspecified) fixed-length type
pytestmark = pytest.mark.filterwarnings("ignore::zarr.errors.UnstableSpecificationWarning")

RNG = np.random.default_rng(7)
DATA_3D = RNG.standard_normal((2, 50, 3))


def _save(ds: xr.Dataset, path: Path, time_chunk: int = 20) -> Path:
    chunks = {"time": time_chunk} if "time" in ds.dims else {}
    ds.chunk(chunks).to_zarr(path, mode="w-", consolidated=False)
    return path


def test_2d_store_with_time_coordinate_opens(tmp_path: Path) -> None:
    data = DATA_3D[0].astype(np.float32)
    time = 3.0 + 0.01 * np.arange(50)
    ds = xr.Dataset(
        {"x": (("time", "component"), data)},
        coords={"time": time, "component": ["u", "v", "w"]},
        attrs={"model": "made by hand"},
    )
    path = _save(ds, tmp_path / "a.zarr")
    da = open_trajectory(path)
    assert da.dims == DIMS
    assert da.shape == (1, 50, 3)
    assert da.dtype == np.float32
    assert isinstance(da.data, dask.array.Array)
    assert da.chunks == ((1,), (20, 20, 10), (3,))
    assert da.attrs["dt"] == pytest.approx(0.01, rel=1e-12)
    assert da.attrs["store"] == str(path)
    assert da.attrs["model"] == "made by hand"
    assert da.coords["component"].values.tolist() == ["u", "v", "w"]
    np.testing.assert_array_equal(da.values[0], data)


def test_3d_store_with_dt_attribute_and_default_names_opens(tmp_path: Path) -> None:
    ds = xr.Dataset({"x": (DIMS, DATA_3D, {"dt": 0.5})})
    da = open_trajectory(_save(ds, tmp_path / "b.zarr"))
    assert da.dims == DIMS
    assert da.dtype == np.float64
    assert da.attrs["dt"] == 0.5
    assert da.coords["component"].values.tolist() == ["x1", "x2", "x3"]
    assert da.coords["chain"].values.tolist() == [0, 1]
    np.testing.assert_array_equal(da.values, DATA_3D)


def test_other_dim_order_and_chunks_spanning_chains_are_rearranged(tmp_path: Path) -> None:
    ds = xr.Dataset({"y": (("component", "chain", "time"), DATA_3D.transpose(2, 0, 1))})
    ds.attrs["dt"] = 0.1
    path = tmp_path / "c.zarr"
    ds.chunk({"chain": 2, "time": 16, "component": 1}).to_zarr(path, consolidated=False)
    da = open_trajectory(path, variable="y")
    assert da.dims == DIMS
    assert da.chunks == ((1, 1), (16, 16, 16, 2), (3,))
    np.testing.assert_array_equal(da.values, DATA_3D)


@pytest.mark.parametrize("dims", [("time",), ("chain", "time"), ("time", "chain")])
def test_scalar_trajectory_gets_one_component_named_after_the_variable(
    tmp_path: Path, dims: tuple[str, ...]
) -> None:
    """A one-component store written without a ``component`` dim (how xarray users write a
    scalar series) opens as ``(chain, time, 1)``, lazily, the component named after the
    variable."""
    by_dim = {"chain": 0, "time": 1}
    data = DATA_3D[..., 0] if "chain" in dims else DATA_3D[0, :, 0]
    if "chain" in dims:
        data = data.transpose([by_dim[d] for d in dims])
    ds = xr.Dataset({"temperature": (dims, data, {"dt": 0.25})})
    da = open_trajectory(_save(ds, tmp_path / "scalar.zarr"), variable="temperature")
    assert da.dims == DIMS and isinstance(da.data, dask.array.Array)
    assert da.sizes["component"] == 1
    assert da.coords["component"].values.tolist() == ["temperature"]
    assert da.attrs["dt"] == 0.25
    expected = DATA_3D[..., :1] if "chain" in dims else DATA_3D[:1, :, :1]
    np.testing.assert_array_equal(da.values, expected)


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint16])
def test_integer_data_are_read_as_float64(tmp_path: Path, dtype: type) -> None:
    """An integer store (counts, a discretised signal) opens, converted to float64 lazily; so
    do integer arrays in memory."""
    data = (10 * DATA_3D).astype(dtype)
    da = open_trajectory(_plain(tmp_path / "int.zarr", data=data))
    assert da.dtype == np.float64 and isinstance(da.data, dask.array.Array)
    np.testing.assert_array_equal(da.values, data.astype(np.float64))
    assert describe_trajectory(da)["dtype"] == "float64"
    in_memory = as_trajectory(xr.DataArray(data[0], dims=("time", "component"), attrs={"dt": 1}))
    assert in_memory.dtype == np.float64
    np.testing.assert_array_equal(in_memory.values[0], data[0].astype(np.float64))


def test_as_trajectory_chunks_in_memory_data() -> None:
    da = as_trajectory(xr.DataArray(DATA_3D[0], dims=("time", "component"), attrs={"dt": 2.0}))
    assert isinstance(da.data, dask.array.Array)
    assert da.dims == DIMS and da.attrs["store"] == "<in-memory>"
    np.testing.assert_array_equal(da.values[0], DATA_3D[0])
    with pytest.raises(TrajectoryError, match="expected an xarray Dataset or DataArray"):
        as_trajectory(DATA_3D)  # type: ignore[arg-type]


# ---- broken stores: one builder per contract violation -------------------------------------


def _plain(path: Path, **changes: object) -> Path:
    """A valid 3-D store with a dt attribute, with ``changes`` applied to the pieces."""
    data = changes.get("data", DATA_3D)
    dims = changes.get("dims", DIMS)
    attrs = changes.get("attrs", {"dt": 0.5})
    coords = changes.get("coords", {})
    name = changes.get("name", "x")
    ds = xr.Dataset({name: (dims, data, attrs)}, coords=coords)
    return _save(ds, path)


def _huge_single_chunk(path: Path) -> Path:
    n = MAX_CHUNK_BYTES // 16 + 1  # (n, 2) float64 in one chunk: just over the limit
    lazy = dask.array.zeros((n, 2), chunks=(n, 2))
    ds = xr.Dataset({"x": (("time", "component"), lazy, {"dt": 1.0})})
    ds.to_zarr(path, compute=False, consolidated=False)  # metadata only
    chunk = path / "x" / "c" / "0" / "0"  # and its one chunk file, never read: the layout is
    chunk.parent.mkdir(parents=True)  # refused first (a store without chunk files would be
    chunk.write_bytes(b"")  # refused as one whose metadata does not match its data)
    return path


def _incomplete(path: Path) -> Path:
    create_store(
        path,
        chains=2,
        n_samples=10,
        components=("a", "b"),
        dt=0.1,
        chunk=4,
        attrs={"model": "ou", "model_params": "{}", "n_samples": 10, "chains": 2},
        progress_width=3,
    )
    write_progress(path, 0, np.array([4, 0, 0], dtype=np.uint64))
    return path


def _not_zarr(path: Path) -> Path:
    path.mkdir()
    (path / "notes.txt").write_text("not a store")
    return path


T_JUMP = np.concatenate([0.01 * np.arange(25), 0.24 + 0.02 * np.arange(1, 26)])
BROKEN: dict[str, tuple[Callable[[Path], Path], str]] = {
    "missing": (lambda p: p, "the store does not exist"),
    "not zarr": (_not_zarr, "not a readable zarr store"),
    "no variable": (lambda p: _plain(p, name="y"), r"no such variable \(variables present: 'y'\)"),
    "wrong dims": (
        lambda p: _plain(p, dims=("chain", "t", "component")),
        r"dims \('chain', 't', 'component'\) found, expected \('time', 'component'\) or",
    ),
    "non-uniform": (
        lambda p: _plain(p, attrs={}, coords={"time": T_JUMP}),
        r"time step is not uniform \(dt varies from 0.01 to 0.02, more than the float64 ",
    ),
    "decreasing time": (
        lambda p: _plain(p, attrs={}, coords={"time": -np.arange(50.0)}),
        r"dt=-1 from the time coordinate .* \(the time coordinate must increase\)",
    ),
    "drifting float32 time": (
        lambda p: _save(
            xr.Dataset(
                {"x": (("time",), np.zeros(200_000))},
                coords={"time": np.cumsum(np.full(200_000, 0.05, dtype=np.float32))},
            ),
            p,
            time_chunk=50_000,
        ),
        r"time step is not uniform: .* float32 times accumulated step by step drift like this",
    ),
    "no time step": (lambda p: _plain(p, attrs={}), "no time step: give a numeric 'time'"),
    "time vs dt": (
        lambda p: _plain(p, coords={"time": 0.4 * np.arange(50)}),
        r"the time coordinate's step 0.4 disagrees with dt=0.5",
    ),
    "boolean": (
        lambda p: _plain(p, data=np.ones((2, 50, 3), dtype=bool)),
        r"dtype bool: true/false values are not a trajectory \(convert them to float",
    ),
    "complex": (
        lambda p: _plain(p, data=np.ones((2, 50, 3), dtype=np.complex128)),
        "dtype complex128 is not a real number type",
    ),
    "one sample": (lambda p: _plain(p, data=DATA_3D[:, :1]), "1 entries along 'time', at least 2"),
    "no component": (lambda p: _plain(p, data=DATA_3D[:, :, :0]), "0 entries along 'component'"),
    "nan dt": (lambda p: _plain(p, attrs={"dt": np.nan}), "dt=nan is not a positive finite"),
    "text dt": (lambda p: _plain(p, attrs={"dt": "fast"}), "dt attribute 'fast' is not a number"),
    "duplicate names": (
        lambda p: _plain(p, coords={"component": ["a", "b", "a"]}),
        r"component names \['a', 'b', 'a'\] are not unique",
    ),
    "huge chunk": (
        _huge_single_chunk,
        r"make a task read 256.0 MiB, more than the 256.0 MiB limit; rechunk the store along",
    ),
    "incomplete": (
        _incomplete,
        r"incomplete generated store \(0 to 4 of 10 samples per chain written\); resume it by "
        r"calling kelr_dist.models.simulate.simulate\(make_model\('ou'",
    ),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_broken_store_is_rejected_with_its_own_message(tmp_path: Path, case: str) -> None:
    build, message = BROKEN[case]
    path = build(tmp_path / "broken.zarr")
    with pytest.raises(TrajectoryError, match=message) as info:
        open_trajectory(path)
    text = str(info.value)
    assert text.startswith(f"store {str(path)!r}, variable 'x': ")
    assert isinstance(info.value, ValueError)
    assert info.value.__cause__ is None  # no chained traceback from inside zarr/xarray


def test_messages_are_distinct() -> None:
    assert len({m for _, m in BROKEN.values()}) == len(BROKEN)


# ---- writer ---------------------------------------------------------------------------------


def test_writer_round_trip_and_description(tmp_path: Path) -> None:
    path = tmp_path / "w.zarr"
    data = RNG.standard_normal((2, 10, 2))
    create_store(
        path,
        chains=2,
        n_samples=10,
        components=("q", "p"),
        dt=0.25,
        chunk=4,
        attrs={"model": "hand", "model_params": '{"a": 1}', "seed": 3},
        progress_width=2,
    )
    for chain in (1, 0):  # any order: regions are disjoint
        for start in (8, 0, 4):
            write_samples(path, chain, start, data[chain, start : start + 4])
        write_progress(path, chain, np.array([10, chain], dtype=np.uint64))
    np.testing.assert_array_equal(read_progress(path), [[10, 0], [10, 1]])
    mark_complete(path)
    da = open_trajectory(path)
    np.testing.assert_array_equal(da.values, data)
    assert da.chunks == ((1, 1), (4, 4, 2), (2,))
    info = describe_trajectory(da)
    assert info["chains"] == 2 and info["length"] == 10 and info["dt"] == 0.25
    assert info["components"] == ["q", "p"] and info["time_chunk"] == 4
    assert info["bytes"] == data.nbytes and info["n_blocks"] == 6
    assert info["origin"] == {"model": "hand", "model_params": {"a": 1}, "seed": 3}
    assert re.fullmatch(r".*w\.zarr", info["store"])


# ---- lazy time coordinate, absolute paths ------------------------------------------------------


def _timed_store(path: Path, time: np.ndarray) -> Path:
    data = RNG.standard_normal((time.size, 2))
    ds = xr.Dataset({"x": (("time", "component"), data)}, coords={"time": time})
    encoding = {"time": {"chunks": (8,)}}  # the coordinate in chunks of its own
    ds.chunk({"time": 8}).to_zarr(path, mode="w-", consolidated=False, encoding=encoding)
    return path


def test_time_coordinate_stays_lazy_and_gives_dt(tmp_path: Path) -> None:
    path = _timed_store(tmp_path / "t.zarr", 5.0 + 0.25 * np.arange(50))
    da = open_trajectory(path)
    assert isinstance(da.coords["time"].data, dask.array.Array)  # not loaded on the client
    assert da.coords["time"].data.chunks == ((8,) * 6 + (2,),)
    assert da.attrs["dt"] == pytest.approx(0.25, rel=1e-12)
    np.testing.assert_array_equal(da.coords["time"].values, 5.0 + 0.25 * np.arange(50))


def test_long_time_coordinate_is_probed_not_read(tmp_path: Path, monkeypatch) -> None:
    """Beyond TIME_CHECK_ROWS entries: first/last chunk in full, probes elsewhere."""
    import kelr_dist.data.store as store

    monkeypatch.setattr(store, "TIME_CHECK_ROWS", 10)
    monkeypatch.setattr(store, "TIME_PROBES", 7)
    uniform = _timed_store(tmp_path / "u.zarr", 0.5 * np.arange(50))
    assert open_trajectory(uniform).attrs["dt"] == pytest.approx(0.5, rel=1e-12)
    gap = 0.5 * np.arange(50)
    gap[20:40] += 0.1  # entries off the grid t0 + i dt between the first and the last chunk
    with pytest.raises(TrajectoryError, match=r"time step is not uniform: time\[\d+\] = "):
        open_trajectory(_timed_store(tmp_path / "g.zarr", gap))
    jump = 0.5 * np.arange(50)
    jump[2] += 0.2  # within the first chunk: found by the chunk check
    with pytest.raises(TrajectoryError, match=r"time step is not uniform \(dt varies"):
        open_trajectory(_timed_store(tmp_path / "j.zarr", jump))


def test_float32_time_coordinate_is_judged_at_float32_resolution(
    tmp_path: Path, monkeypatch
) -> None:
    """float32 times are rounded to ~1e-7 of the time: uniform within that, dt from float64."""
    import kelr_dist.data.store as store

    time = (0.05 * np.arange(100_000)).astype(np.float32)
    data = RNG.standard_normal((time.size, 1))
    plain = xr.Dataset({"x": (("time", "component"), data)}, coords={"time": time})
    path = _save(plain, tmp_path / "f32.zarr", time_chunk=25_000)
    assert open_trajectory(path).attrs["dt"] == pytest.approx(0.05, rel=1e-7)
    with_dt = plain.assign_coords(time=time + np.float32(1000)).assign_attrs(dt=0.05)
    assert open_trajectory(_save(with_dt, tmp_path / "f32dt.zarr", time_chunk=25_000)).attrs[
        "dt"
    ] == pytest.approx(0.05, rel=1e-7)
    monkeypatch.setattr(store, "TIME_CHECK_ROWS", 10)  # the probed path: the same tolerance
    assert open_trajectory(path).attrs["dt"] == pytest.approx(0.05, rel=1e-7)
    jump = time.copy()
    jump[50_000:] += np.float32(0.01)  # a real gap, far above float32's rounding
    with pytest.raises(TrajectoryError, match=r"time\[\d+\] = .* \(dt from the first and"):
        open_trajectory(_save(plain.assign_coords(time=jump), tmp_path / "jump.zarr", 25_000))
    monkeypatch.undo()
    with pytest.raises(TrajectoryError, match=r"dt varies from .* float32 coordinate's rounding"):
        open_trajectory(_save(plain.assign_coords(time=jump), tmp_path / "jump2.zarr", 25_000))
    coarse = plain.assign_coords(time=(1e6 + 0.05 * np.arange(100_000)).astype(np.float32))
    with pytest.raises(
        TrajectoryError,
        match=r"the float32 time coordinate is too coarse for its step dt=0.0[45]\d*: .* store the "
        r"time as float64, or drop the coordinate and give a 'dt' attribute",
    ):
        open_trajectory(_save(coarse, tmp_path / "coarse.zarr", time_chunk=25_000))


@pytest.mark.parametrize(
    "time",
    [
        np.datetime64("2000-01-01") + np.arange(1000) * np.timedelta64(3, "h"),
        np.arange(1000) * np.timedelta64(3, "h"),
    ],
    ids=["datetime64", "timedelta64"],
)
def test_date_and_duration_time_coordinates_give_dt_in_seconds(
    tmp_path: Path, time: np.ndarray
) -> None:
    """The same dt in seconds from the store's path and from ``xr.open_zarr`` of it."""
    ds = xr.Dataset({"x": (("time", "component"), RNG.standard_normal((time.size, 2)))})
    path = _save(ds.assign_coords(time=time), tmp_path / "dates.zarr", time_chunk=256)
    by_path = open_trajectory(path)
    assert by_path.attrs["dt"] == 3 * 3600.0
    assert isinstance(by_path.coords["time"].data, dask.array.Array)  # not loaded
    assert by_path.coords["time"].dtype.kind == time.dtype.kind  # kept as dates / durations
    opened = as_trajectory(xr.open_zarr(path, consolidated=False))
    assert opened.attrs["dt"] == 3 * 3600.0
    gap = time.copy()
    gap[500:] += np.timedelta64(1, "h")
    with pytest.raises(TrajectoryError, match=r"time step is not uniform \(dt varies from 10800"):
        open_trajectory(_save(ds.assign_coords(time=gap), tmp_path / "gap.zarr", 256))


@pytest.mark.parametrize(
    ("time", "attrs", "units", "source"),
    [
        (np.datetime64("2000-01-01") + np.arange(100) * np.timedelta64(500, "ms"), {}, "s",
         "from datetime coordinates"),
        (np.arange(100) * np.timedelta64(500, "ms"), {}, "s", "from timedelta coordinates"),
        (0.5 * np.arange(100), {"units": "days"}, "days", "from the time coordinate's units"),
        (0.5 * np.arange(100), {}, None, None),
    ],
    ids=["datetime64", "timedelta64", "units attribute", "plain numbers"],
)  # fmt: skip
def test_the_time_unit_is_labelled_where_the_store_says_it(
    tmp_path: Path, time: np.ndarray, attrs: dict, units: str | None, source: str | None
) -> None:
    """Dates and durations give dt in seconds, labelled ``time_units = "s"``; a numeric time
    coordinate is labelled by its ``units`` attribute, else not at all."""
    ds = xr.Dataset(
        {"x": (("time", "component"), RNG.standard_normal((time.size, 2)))},
        coords={"time": ("time", time, attrs)},
    )
    da = open_trajectory(_save(ds, tmp_path / "t.zarr"))
    assert da.attrs["dt"] == 0.5 and da.attrs.get("time_units") == units
    summary = describe_trajectory(da)
    assert summary["time_units"] == units and summary["time_units_source"] == source
    assert as_trajectory(ds).attrs.get("time_units") == units  # the same in memory


def test_description_says_when_a_store_is_below_the_estimate_limits(tmp_path: Path) -> None:
    """``kelr info``'s summary: chains under 1000 samples, more than 64 components."""
    short = xr.Dataset(
        {"x": (("time", "component"), RNG.standard_normal((500, 2)))}, attrs={"dt": 1}
    )
    (limit,) = describe_trajectory(open_trajectory(_save(short, tmp_path / "s.zarr", 100)))[
        "limits"
    ]
    assert limit == (
        "500 samples per chain; the estimate needs at least 1000 (orders, held-out folds and "
        "error bars)"
    )
    wide = xr.Dataset(
        {"x": (("time", "component"), RNG.standard_normal((1000, 257)))}, attrs={"dt": 1}
    )
    (limit,) = describe_trajectory(open_trajectory(_save(wide, tmp_path / "w.zarr", 500)))["limits"]
    assert limit.startswith("257 components; at most 256 are supported")
    assert "select the components to estimate with --components NAMES (components=" in limit
    ok = xr.Dataset(
        {"x": (("time", "component"), RNG.standard_normal((1000, 256)))}, attrs={"dt": 1}
    )
    assert (
        describe_trajectory(open_trajectory(_save(ok, tmp_path / "ok.zarr", 500)))["limits"] == []
    )


def test_relative_path_is_made_absolute(tmp_path: Path, monkeypatch) -> None:
    _plain(tmp_path / "rel.zarr")
    monkeypatch.chdir(tmp_path)
    da = open_trajectory("rel.zarr")
    assert da.attrs["store"] == str(tmp_path / "rel.zarr")
    with pytest.raises(TrajectoryError, match=re.escape(f"store {str(tmp_path / 'nope.zarr')!r}")):
        open_trajectory("nope.zarr")


@pytest.fixture
def workers_elsewhere(tmp_path_factory) -> Iterator[str]:
    """A ``dask scheduler`` and a ``dask worker`` on 127.0.0.1 whose working directory is a
    folder of their own; yields the scheduler address."""
    from conftest import dask_processes_in

    folder = tmp_path_factory.mktemp("workers-cwd")
    with dask_processes_in(folder, workers=1, cwd=folder) as address:
        yield address


def column_sums(x: np.ndarray, info: object, halo: None) -> np.ndarray:
    return x.sum(axis=0)


def test_relative_store_path_with_workers_in_another_directory(
    tmp_path: Path, monkeypatch, workers_elsewhere: str
) -> None:
    from distributed import Client

    from kelr_dist.engine.passes import run_reduction
    from kelr_dist.kernels.reduction import Reduction

    _plain(tmp_path / "rel.zarr")
    monkeypatch.chdir(tmp_path)
    with Client(workers_elsewhere, timeout="30s") as client:
        client.wait_for_workers(1, timeout=60)
        assert set(client.run(os.getcwd).values()) != {str(tmp_path)}  # workers live elsewhere
        assert not any(client.run(os.path.exists, "rel.zarr").values())
        da = open_trajectory("rel.zarr")
        sums = run_reduction(da, Reduction("sums", column_sums), client, progress=False)
    np.testing.assert_allclose(sums, DATA_3D.sum(axis=(0, 1)), rtol=1e-12)


OPEN_WITHOUT_WORKERS = """
import sys
from distributed import Client, LocalCluster
cluster = LocalCluster(n_workers=0, processes=False, dashboard_address=None)
client = Client(cluster)  # the default client; no worker: anything sent to it would wait
from kelr_dist.data.store import open_trajectory
print(open_trajectory(sys.argv[1]).component.values.tolist())
"""


def test_opening_a_store_reads_nothing_through_the_default_client(tmp_path: Path) -> None:
    """Metadata and coordinates are read locally: a default client whose cluster runs no task
    (no worker, or paused) does not hold up opening a store."""
    import subprocess
    import sys

    from kelr_dist.models.simulate import simulate

    simulate("ou", tmp_path / "ou.zarr", 2000, chunk=500, progress=False)
    run = subprocess.run(
        [sys.executable, "-c", OPEN_WITHOUT_WORKERS, str(tmp_path / "ou.zarr")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.stdout.strip() == "['x1', 'x2']", run.stderr
