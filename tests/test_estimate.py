"""estimate_response end to end: result schema and round trips, the same result on every cluster
and chunking, a killed worker, atomic result writes, the OU oracle and the input errors."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

import dask.array as da
import numpy as np
import pytest
import xarray as xr
from distributed import Client, LocalCluster
from distributed.comm import CommClosedError

from kelr_dist.data.store import open_trajectory
from kelr_dist.engine.cluster import close_embedded_cluster, get_client
from kelr_dist.kernels.observables.field import LinearObservable
from kelr_dist.kernels.response.operator import Observable
from kelr_dist.models.registry import make_model
from kelr_dist.models.simulate import simulate
from kelr_dist.pipeline.estimate import estimate_response
from kelr_dist.pipeline.result import write_result

N = 20_000  # samples per chain of the small OU store
CHAINS = 2
SMALL = {"max_order": 8, "max_lag": 20}  # fast settings shared by the equality tests
# attributes that legitimately differ between two runs of the same estimate
#: attributes of the run, not of the result (store_reads: 1 when the workers kept the store in
#: memory, else one per pass)
RUN_ATTRS = (
    "created",
    "runtime_seconds",
    "chunking",
    "store",
    "store_fingerprint",
    "store_reads",
)


# --- module-level callbacks (worker processes import them) -------------------------------------


@dataclass(frozen=True, eq=False)
class SlowIdentity(LinearObservable):
    """``A(x) = x`` as a fixed matrix (affine: the identity's Stein correction), taking 50 ms
    per block: stretches the response pass for the kill test."""

    def __call__(self, x: np.ndarray) -> np.ndarray:
        time.sleep(0.05)
        return super().__call__(x)


# --- helpers --------------------------------------------------------------------------------------


def rechunk_store(source: Path, target: Path, time_chunk: int) -> Path:
    """Rewrite the store ``source`` with plain xarray, ``time_chunk`` samples per chunk."""
    ds = xr.open_zarr(source, consolidated=False)
    for var in ds.variables.values():
        var.encoding.pop("chunks", None)
        var.encoding.pop("preferred_chunks", None)
    ds.chunk({"time": time_chunk}).to_zarr(target, consolidated=False)
    return target


def assert_same_result(actual: xr.Dataset, expected: xr.Dataset, rtol: float = 1e-10) -> None:
    """Same variables, coordinates and attributes; numbers within ``rtol`` of each variable's
    largest entry (or of its standard error's, for a quantity that is zero up to rounding, like
    score matching's Stein residual); run-specific attributes (time stamps, chunking, store)
    ignored."""
    assert set(actual.data_vars) == set(expected.data_vars)
    assert dict(actual.sizes) == dict(expected.sizes)
    for name, coord in expected.coords.items():
        np.testing.assert_array_equal(actual[name].values, coord.values)
    for name, var in expected.data_vars.items():
        assert actual[name].dims == var.dims, name
        if var.dtype.kind in "OUSb":
            np.testing.assert_array_equal(actual[name].values, var.values, err_msg=name)
            continue
        want = np.asarray(var.values, dtype=float)
        got = np.asarray(actual[name].values, dtype=float)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=name)
        scale = np.nanmax(np.abs(want)) if np.isfinite(want).any() else 0.0
        if f"{name}_stderr" in expected:
            scale = max(scale, float(np.nanmax(np.abs(expected[f"{name}_stderr"].values))))
        for suffix in ("_estimator_stderr", "_total_stderr", "_model_shift"):
            # an estimator error that is zero up to rounding (an affine score, corrected), or
            # the shift to a neighbouring model: a difference of two fits, whose rounding is
            # the response's amplified by the fits' conditioning, is set against the error bar
            if name.endswith(suffix) and f"{name[: -len(suffix)]}_stderr" in expected:
                sampling = expected[f"{name[: -len(suffix)]}_stderr"].values
                scale = max(scale, float(np.nanmax(np.abs(sampling))))
        if name.startswith("candidate_loss"):
            # unregularised high-degree fits amplify rounding by the Gram matrix's condition
            # number (up to 1e12): their (useless) losses agree to a relative 1e-4 only
            np.testing.assert_allclose(got, want, rtol=1e-4, err_msg=name)
            continue
        np.testing.assert_allclose(got, want, rtol=0, atol=rtol * scale, err_msg=name)
    assert set(actual.attrs) == set(expected.attrs)
    for key, want in expected.attrs.items():
        if key not in RUN_ATTRS:
            assert_same_attr(actual.attrs[key], want, rtol, key)


NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


def assert_same_attr(actual, expected, rtol: float, key: str) -> None:
    """Equal, up to ``rtol`` on every number (also the numbers inside a string such as the
    basis' fitted ``loc``/``scale``, which depend on the summation order in the last digit)."""
    if isinstance(expected, str):
        assert isinstance(actual, str), key
        assert NUMBER.split(actual) == NUMBER.split(expected), key
        got, want = NUMBER.findall(actual), NUMBER.findall(expected)
        assert len(got) == len(want), key
        np.testing.assert_allclose(
            [float(g) for g in got], [float(w) for w in want], rtol=rtol, err_msg=key
        )
    else:
        np.testing.assert_allclose(actual, expected, rtol=rtol, err_msg=key)


# --- fixtures -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> dict[str, Path]:
    """One simulated OU trajectory (2 chains x 20 000, chunks of 5 000) and three rechunked
    copies written with xarray (chunks of 3 000, 7 001 and 500 samples)."""
    root = tmp_path_factory.mktemp("stores")
    base = root / "ou.zarr"
    simulate("ou", base, N, chains=CHAINS, seed=3, chunk=5_000, progress=False)
    out = {"base": base}
    for chunk in (3_000, 7_001, 500):
        out[f"chunk{chunk}"] = rechunk_store(base, root / f"ou-{chunk}.zarr", chunk)
    return out


@pytest.fixture(scope="module")
def reference(stores: dict[str, Path]) -> xr.Dataset:
    """The estimate in this process (``client="synchronous"``), with every extra variable."""
    return estimate_response(stores["base"], client="synchronous", exact=True, **SMALL)


@pytest.fixture(scope="module")
def process_client() -> Iterator[Client]:
    """The embedded cluster: 2 worker processes, one thread each."""
    client = get_client(n_workers=2, memory_limit="1GiB", quiet=True)
    client.wait_for_workers(2)
    yield client
    close_embedded_cluster()


# --- schema and round trips -----------------------------------------------------------------------


def test_result_schema(stores: dict[str, Path]) -> None:
    ds = estimate_response(
        stores["base"], client="synchronous", exact=True, kde=True, gaussian=True, **SMALL
    )
    model = make_model("ou")
    lag = SMALL["max_lag"]
    for name in ("response", "response_exact", "response_kde", "response_gaussian"):
        for var in (name, f"{name}_stderr"):
            assert ds[var].dims == ("lag", "i", "j"), var
            assert ds[var].shape == (lag + 1, 2, 2), var
            assert np.all(np.isfinite(ds[var].values)), var
        assert np.all(ds[f"{name}_stderr"].values[1:] > 0), name
    np.testing.assert_array_equal(ds["lag"].values, np.arange(lag + 1))
    assert ds["time"].dims == ("lag",)
    np.testing.assert_allclose(ds["time"].values, np.arange(lag + 1) * model.dt, rtol=1e-15)
    assert list(ds["i"].values) == list(model.components) == list(ds["j"].values)
    assert list(ds["component"].values) == list(model.components)

    orders = ds["order"].values
    np.testing.assert_array_equal(orders, np.arange(SMALL["max_order"] + 1))
    for name in ("delta", "rejection", "eta", "eta_noise", "delta_paper", "rejection_paper"):
        assert ds[name].dims == ("order",), name
    assert ((ds["rejection"] >= 0) & (ds["rejection"] <= 1)).all()

    # coefficients of the total-degree set |m|_1 <= max_order, with their multi-indices
    p = ds.sizes["basis_function"]
    assert p == (SMALL["max_order"] + 1) * (SMALL["max_order"] + 2) // 2
    assert ds["coefficients"].dims == ds["coefficient_variance"].dims == ("basis_function",)
    assert ds["multi_index"].dims == ("basis_function", "component")
    index = ds["multi_index"].values
    assert index.sum(axis=1).max() == SMALL["max_order"] and index.min() == 0
    assert len({tuple(m) for m in index}) == p
    assert ds["coefficients"].values[np.flatnonzero((index == 0).all(axis=1))[0]] == pytest.approx(
        1.0
    )  # c_0 = E[W^(1-beta) psi_0 ...] normalises p_M

    attrs = ds.attrs
    chosen = attrs["order"]
    assert isinstance(chosen, int)
    assert 0 <= chosen <= SMALL["max_order"] and attrs["order_selection"] == "auto"
    assert attrs["max_order"] == SMALL["max_order"]
    assert attrs["basis"].count("hermite") == 2 and attrs["index_set"] == "total"
    assert attrs["delta"] > 0 and 0 <= attrs["rejection"] < 0.01
    assert (attrs["n_samples"], attrs["chains"], attrs["chain_length"]) == (CHAINS * N, CHAINS, N)
    assert attrs["dt"] == model.dt and attrs["max_lag"] == lag
    assert list(attrs["chunking"]) == [5_000] * 4
    assert attrs["store"] == str(stores["base"]) and attrs["variable"] == "x"
    assert attrs["model"] == "ou" and json.loads(attrs["model_params"])["dt"] == model.dt
    assert attrs["kelr_dist_version"] and attrs["runtime_seconds"] > 0


@pytest.mark.parametrize("suffix", [".zarr", ".nc"])
def test_result_round_trips_losslessly(reference: xr.Dataset, tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"result{suffix}"
    write_result(reference, path)
    with open_result(path) as back:
        back = back.load()
    # numbers stay numbers; a list attribute comes back as a list (zarr) or an array (netCDF)
    assert set(back.attrs) == set(reference.attrs)
    for key, value in reference.attrs.items():
        if isinstance(value, list):
            assert list(np.atleast_1d(back.attrs[key])) == value, key
        else:
            assert back.attrs[key] == value, key
    assert set(back.variables) == set(reference.variables)
    for name, var in reference.variables.items():
        assert back[name].dims == var.dims, name
        assert back[name].attrs == var.attrs, name
        if var.dtype == object:
            assert [str(v) for v in back[name].values] == list(var.values), name
        else:
            assert back[name].dtype == var.dtype, name
            np.testing.assert_array_equal(back[name].values, var.values, err_msg=name)
    with pytest.raises(ValueError, match="exists"):
        write_result(reference, path)
    write_result(reference.assign_attrs(note="second"), path, overwrite=True)
    with open_result(path) as again:
        assert again.attrs["note"] == "second"


def test_a_result_is_never_written_over_its_input_store(
    reference: xr.Dataset, stores: dict[str, Path], tmp_path: Path
) -> None:
    """write_result(ds, path, overwrite=True) with ``path`` the store the result came from (or a
    folder inside it, or one holding it) is refused, and the trajectory stays readable."""
    copy = Path(shutil.copytree(stores["base"], tmp_path / "data" / "ou.zarr"))
    result = reference.assign_attrs(store=str(copy))
    for target, relation in [
        (copy, "is the input store"),
        (copy / "result.zarr", "lies inside the input store"),
        (tmp_path / "data", "contains the input store"),
    ]:
        with pytest.raises(ValueError, match=relation):
            write_result(result, target, overwrite=True)
    assert open_trajectory(copy).shape == open_trajectory(stores["base"]).shape


# --- the same result everywhere -------------------------------------------------------------------


def test_same_result_for_every_chunking(stores: dict[str, Path], reference: xr.Dataset) -> None:
    for key in ("chunk3000", "chunk7001", "chunk500"):
        ds = estimate_response(stores[key], client="synchronous", exact=True, **SMALL)
        chunk = int(key.removeprefix("chunk"))
        assert ds.attrs["chunking"][0] == chunk
        assert_same_result(ds, reference)


def test_same_result_on_one_and_two_worker_processes(
    stores: dict[str, Path], reference: xr.Dataset, process_client: Client
) -> None:
    assert len(process_client.scheduler_info()["workers"]) == 2
    two = estimate_response(stores["chunk3000"], client=process_client, exact=True, **SMALL)
    assert_same_result(two, reference)
    # the workers kept the small store in memory: one read for all passes
    assert (two.attrs["store_reads"], two.attrs["passes"]) == (1, reference.attrs["passes"])
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        Client(cluster) as client,
    ):
        one = estimate_response(stores["chunk7001"], client=client, exact=True, **SMALL)
    assert_same_result(one, reference)


def test_same_result_via_dask_scheduler_and_worker_processes(
    stores: dict[str, Path], reference: xr.Dataset, dask_processes: str
) -> None:
    with Client(dask_processes, timeout="30s") as client:
        client.wait_for_workers(2, timeout=60)
        pids = set(client.run(os.getpid).values())
    assert len(pids) == 2 and os.getpid() not in pids  # two separate worker processes
    ds = estimate_response(stores["base"], client=dask_processes, exact=True, **SMALL)
    assert_same_result(ds, reference)


def test_simulate_on_the_embedded_client_gives_the_same_store(
    stores: dict[str, Path], process_client: Client, tmp_path: Path
) -> None:
    """``simulate(..., client=get_client())`` then the estimate: the store equals the one
    simulated in this process (fails while ``simulate`` calls ``as_completed`` without the
    client's loop: the embedded client is not the default client, "No clients found")."""
    path = tmp_path / "ou.zarr"
    simulate("ou", path, N, chains=CHAINS, seed=3, chunk=5_000, client=process_client)
    here = xr.open_zarr(stores["base"], consolidated=False)["x"].values
    np.testing.assert_array_equal(xr.open_zarr(path, consolidated=False)["x"].values, here)


def test_killed_worker_during_response_pass_gives_the_same_result(
    stores: dict[str, Path], reference: xr.Dataset, process_client: Client
) -> None:
    """80 blocks of 500 rows, 50 ms each in the response pass: one worker is killed while it
    runs tasks of that pass; the job completes and the result is the undisturbed one."""
    slow = Observable(("x1", "x2"), SlowIdentity(np.eye(2)))
    killed: list[bool] = []

    def kill_during_response_pass() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            busy = {
                worker: tasks
                for worker, tasks in process_client.processing().items()
                if any("response" in str(task) for task in tasks)
            }
            if busy:
                time.sleep(0.3)  # well into the pass
                victim = next(iter(busy))
                killed.append(bool(process_client.processing().get(victim)))
                with suppress(CommClosedError):
                    process_client.run(os._exit, 1, workers=[victim])
                return
            time.sleep(0.01)

    before = set(process_client.run(os.getpid).values())
    killer = threading.Thread(target=kill_during_response_pass)
    killer.start()
    ds = estimate_response(
        stores["chunk500"], client=process_client, exact=True, observable=slow, **SMALL
    )
    killer.join()
    process_client.wait_for_workers(2, timeout=60)
    after = set(process_client.run(os.getpid).values())
    assert killed == [True]  # killed while it held tasks of the response pass
    assert before != after  # a worker process really died and was replaced
    assert ds.attrs["observable"].startswith("test_estimate:SlowIdentity")  # the identity, slowly
    assert_same_result(ds.assign_attrs(observable="identity"), reference)


# --- atomic writes --------------------------------------------------------------------------------


def failing_block(block: np.ndarray, block_info: dict | None = None) -> np.ndarray:
    """Raises on the last block: a write that fails after earlier chunks reached the store."""
    location = (block_info or {}).get(0, {}).get("chunk-location", (0,))
    if location[0] == 3:
        raise OSError("disk went away while writing")
    return block


def failing_dataset(reference: xr.Dataset) -> xr.Dataset:
    data = da.arange(4_000, chunks=1_000, dtype=float).map_blocks(failing_block, dtype=float)
    return reference.assign(extra=("extra_dim", data))


def open_result(path: Path) -> xr.Dataset:
    """A written result: netCDF for ``*.nc``, else zarr."""
    if path.suffix == ".nc":
        return xr.open_dataset(path)
    return xr.open_zarr(path, consolidated=False)


def no_complete_result(path: Path) -> bool:
    """Nothing that opens as a result (with a ``response``) exists at ``path``."""
    try:
        with open_result(path) as ds:
            return "response" not in ds
    except (OSError, ValueError, FileNotFoundError, KeyError):
        return True


@pytest.mark.parametrize("suffix", [".zarr", ".nc"])
def test_failed_write_leaves_no_result(reference: xr.Dataset, tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"result{suffix}"
    with pytest.raises(OSError, match="disk went away"):
        write_result(failing_dataset(reference), path)
    assert not path.exists() and no_complete_result(path)
    assert list(tmp_path.iterdir()) == []  # the temporary sibling is removed too

    # a failed overwrite keeps the previous result intact
    write_result(reference, path)
    with pytest.raises(OSError, match="disk went away"):
        write_result(failing_dataset(reference), path, overwrite=True)
    assert list(tmp_path.iterdir()) == [path]
    with open_result(path) as back:
        assert "extra" not in back
        np.testing.assert_array_equal(back["response"].values, reference["response"].values)


WRITER = """
import sys
import dask.array as da
import xarray as xr
from kelr_dist.pipeline.result import write_result

ref = xr.open_zarr(sys.argv[1], consolidated=False).load()
# 400 MiB that do not compress: its 400 chunk files take seconds to write
big = da.random.default_rng(0).random((400, 2**17), chunks=(1, 2**17))
print("writing", flush=True)
write_result(ref.assign(big=(("row", "col"), big)), sys.argv[2])
"""


def test_killed_writer_leaves_no_result(reference: xr.Dataset, tmp_path: Path) -> None:
    """A process killed (SIGKILL) while writing a large result: only a temporary sibling stays,
    nothing at the target path."""
    source = tmp_path / "reference.zarr"
    write_result(reference, source)
    target = tmp_path / "big.zarr"
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(source), str(target)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert writer.stdout is not None and writer.stdout.readline().strip() == "writing"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # wait until chunks of the big variable land
            partial = [p for p in tmp_path.glob(".big.zarr.tmp-*/big/c/*/*")]
            if len(partial) >= 3:
                break
            time.sleep(0.05)
        assert partial, "the writer never started writing chunks"
        writer.send_signal(signal.SIGKILL)
    finally:
        writer.kill()
        writer.wait()
    assert writer.returncode == -signal.SIGKILL
    assert not target.exists() and no_complete_result(target)
    assert [p.name.startswith(".big.zarr.tmp-") for p in tmp_path.iterdir() if p != source] == [
        True
    ]


# --- the OU oracle through the whole pipeline -----------------------------------------------------


@pytest.fixture(scope="module")
def ou_oracle(tmp_path_factory) -> tuple[xr.Dataset, xr.Dataset]:
    """2-D OU (non-symmetric Γ), 2 chains x 150 000, all choices automatic, t <= 3; and the
    same with the exact score given as a function instead of from the store attributes."""
    path = tmp_path_factory.mktemp("oracle") / "ou.zarr"
    model = make_model("ou")
    simulate(model, path, 150_000, chains=2, seed=11, chunk=50_000, progress=False)
    common = {"client": "synchronous", "max_order": 12, "max_time": 3.0}
    return (
        estimate_response(path, exact=True, **common),
        # the exact FDT alone is compared: the cheapest fit beside it
        estimate_response(path, score=model.score, estimator="score-matching", degree=1, **common),
    )


def test_ou_response_matches_expm_within_standard_errors(ou_oracle) -> None:
    ds, _ = ou_oracle
    model = make_model("ou")
    assert ds.sizes["lag"] == 61 and ds["time"].values[-1] == pytest.approx(3.0)
    truth = model.response(ds["time"].values)
    for name in ("response", "response_exact"):
        z = (ds[name].values - truth) / ds[f"{name}_stderr"].values
        assert np.sqrt(np.mean(z**2)) < 2.0, name
        assert np.abs(z).max() < 3.0, name
    # the estimate adds little to the sampling error of the exact FDT on the same data
    sigma = ds["response_exact_stderr"].values
    assert np.abs(ds["response"].values - ds["response_exact"].values).max() <= 2 * sigma.max()
    assert ds.attrs["order"] <= 10 and ds.attrs["rejection"] < 1e-3


def test_exact_from_store_attributes_equals_given_score(ou_oracle) -> None:
    from_store, from_score = ou_oracle
    for name in ("response_exact", "response_exact_stderr"):
        np.testing.assert_array_equal(from_store[name].values, from_score[name].values)


# --- input errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"variable": "y"}, r"variable 'y'.*no such variable.*'x'"),
        ({"order": "high"}, "^order: expected 'auto'.*'high'"),
        ({"order": -1}, "^order: expected 'auto' or a non-negative integer.*, got -1"),
        ({"order": 2.5}, "^order: expected 'auto' or a non-negative integer.*, got 2.5"),
        ({"order": True}, "^order: expected 'auto' or a non-negative integer.*, got True"),
        ({"order": 9, "max_order": 8}, "order=9 is above max_order=8"),
        ({"order": (3, 0), "index_set": "total"}, "needs index_set='box'"),
        ({"max_lag": 5, "max_time": 1.0}, "max_lag or max_time, not both"),
        ({"max_lag": N}, f"max_lag={N} is more than a quarter of the chain length {N}"),
        ({"max_lag": N // 4 + 1}, "more than a quarter of the chain length"),
        ({"max_lag": -2}, "^max_lag: expected a non-negative integer, got -2"),
        ({"max_time": -1.0}, "^max_time: expected a non-negative finite number"),
        ({"index_set": "simplex"}, "^index_set: expected one of.*'simplex'"),
        ({"delta": -1.0}, "^delta: expected 'auto', 'paper' or a positive finite number, got -1.0"),
        ({"basis": "chebyshev,hermite"}, "chebyshev"),
        ({"estimator": "neural"}, "^estimator: expected one of.*'neural'"),
        ({"degree": 0}, "^degree: expected 'auto' or a positive integer, got 0"),
        ({"degree": 4000}, r"degree=4000 gives .* features in d = 2 .*: .* GiB"),
        ({"folds": 400}, "^folds: expected an integer from 2 to 20, got 400"),
        ({"folds": 1}, "^folds: expected an integer from 2 to 20, got 1"),
        ({"kde": "yes"}, "^kde: expected true or false, got 'yes'"),
        ({"stein_correction": 1}, "^stein_correction: expected true or false, got 1"),
        ({"score": "no_such_module_kelr:f"}, "^score: cannot import module 'no_such_module_kelr'"),
        ({"score": "os.system('true')"}, "^score: expected a reference 'package.module:function'"),
    ],
)
def test_invalid_arguments(stores: dict[str, Path], kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        estimate_response(stores["base"], client="synchronous", **kwargs)


def test_transposed_and_too_short_arrays_are_named() -> None:
    x = np.random.default_rng(0).standard_normal((2, 100_000))  # (component, time) by mistake
    with pytest.raises(ValueError, match=r"100000 components \(.* is the array transposed\?\)"):
        estimate_response(x, client="synchronous")
    wide = np.random.default_rng(0).standard_normal((5_000, 300))  # not transposed: too wide
    with pytest.raises(ValueError, match="has 300 components; at most 256 are supported") as info:
        estimate_response(wide, dt=1.0, client="synchronous")
    assert "transposed" not in str(info.value)
    with pytest.raises(ValueError, match="has 10 samples per chain; .* at least 1000"):
        estimate_response(np.zeros((10, 2)), client="synchronous")
    with pytest.raises(ValueError, match=r"folds=20: .* fold of only 150 samples"):
        estimate_response(np.zeros((3_000, 2)), folds=20, client="synchronous")


def test_one_dimensional_arrays_and_lists_are_trajectories() -> None:
    """An (n,) array is one component; a list is converted like numpy; other shapes are named."""
    x = np.random.default_rng(1).standard_normal((2_000, 2))
    options = {"client": "synchronous", "max_order": 4, "max_lag": 3, "dt": 0.1}
    one = estimate_response(x[:, 0], **options)
    assert one.response.shape == (4, 1, 1) and one.i.values.tolist() == ["x1"]
    from_list = estimate_response(x.tolist(), **options)
    xr.testing.assert_allclose(from_list.response, estimate_response(x, **options).response)
    with pytest.raises(ValueError, match=r"shape \(2, 2, 2, 2\) .* expected \(time,\) for one"):
        estimate_response(np.zeros((2, 2, 2, 2)), client="synchronous")


def test_components_select_what_is_estimated() -> None:
    """``components=`` estimates on those components only, in the order given; a wide array
    is estimated on a selection; unknown names are named with the available ones."""
    x = np.random.default_rng(4).standard_normal((2_000, 3))
    traj = xr.DataArray(x, dims=("time", "component"), coords={"component": ["a", "b", "c"]})
    options = {"client": "synchronous", "max_order": 4, "max_lag": 3, "dt": 0.1}
    picked = estimate_response(traj, components="c,a", **options)
    assert picked["component"].values.tolist() == ["c", "a"]
    assert picked["i"].values.tolist() == ["c", "a"] == picked["j"].values.tolist()
    alone = estimate_response(x[:, [2, 0]], **options)
    np.testing.assert_allclose(picked.response.values, alone.response.values, atol=1e-12)
    wide = np.random.default_rng(5).standard_normal((2_000, 80))
    ds = estimate_response(wide, components=["x3", "x70"], **options)
    assert ds.sizes["i"] == 2
    with pytest.raises(ValueError, match=r"components: 'd', 'e' not in .* available: a, b, c"):
        estimate_response(traj, components=["a", "d", "e"], **options)
    with pytest.raises(ValueError, match=r"components: .* distinct"):
        estimate_response(traj, components="a,a", **options)


def test_the_result_says_its_time_unit_when_the_data_do() -> None:
    """A trajectory with dates for times gives lags in seconds, and the result says so."""
    x = np.random.default_rng(3).standard_normal((2_000, 2))
    time = np.datetime64("2000-01-01") + np.arange(2_000) * np.timedelta64(500, "ms")
    traj = xr.DataArray(x, dims=("time", "component"), coords={"time": time})
    options = {"client": "synchronous", "max_order": 4, "max_lag": 3}
    ds = estimate_response(traj, **options)
    assert ds.attrs["time_units"] == "s" and ds.attrs["dt"] == pytest.approx(0.5)
    assert ds["time"].attrs["long_name"] == "time lag (s)"
    plain = estimate_response(x, dt=0.5, **options)
    assert "time_units" not in plain.attrs and plain["time"].attrs["long_name"] == "time lag"
    steps = estimate_response(x, **options)  # an array without dt: lags counted in samples
    assert steps.attrs["time_units"] == "steps" and steps.attrs["dt"] == 1.0
    assert steps["time"].attrs["long_name"] == "time lag (steps)"


def test_dt_follows_one_rule_for_paths_datasets_and_arrays(tmp_path: Path) -> None:
    """``dt=`` is the sample interval of data that have none, and must agree with the data's own
    (a ``dt`` attribute or a ``time`` coordinate) otherwise: the same for a store's path, an
    opened Dataset and a DataArray (a path ignored it, a Dataset let it override the store's)."""
    from kelr_dist.data.store import TrajectoryError
    from kelr_dist.pipeline.inputs import check_inputs
    from kelr_dist.pipeline.options import EstimateOptions

    x = np.random.default_rng(5).standard_normal((3_000, 2))
    with_dt, without = tmp_path / "dt.zarr", tmp_path / "none.zarr"
    xr.Dataset({"x": (("time", "component"), x, {"dt": 0.05})}).to_zarr(with_dt, consolidated=False)
    xr.Dataset({"x": (("time", "component"), x)}).to_zarr(without, consolidated=False)
    options = EstimateOptions()
    own = [
        with_dt,
        xr.open_zarr(with_dt, consolidated=False),
        xr.DataArray(x, dims=("time", "component"), coords={"time": 0.05 * np.arange(3_000)}),
    ]
    for data in own:
        assert check_inputs(data, EstimateOptions(dt=0.05)).trajectory.attrs["dt"] == 0.05
        with pytest.raises(TrajectoryError, match=r"dt=0.1 given, but the data's .* says 0.05"):
            check_inputs(data, EstimateOptions(dt=0.1))
    assert check_inputs(without, EstimateOptions(dt=0.2)).trajectory.attrs["dt"] == 0.2
    with pytest.raises(TrajectoryError, match=r"no time step: .* \(or dt= to estimate_response\)"):
        check_inputs(without, options)
    with pytest.raises(ValueError, match=r"^dt: expected a positive finite number"):
        estimate_response(xr.DataArray(x, dims=("time", "component")), dt=-1.0)


@pytest.mark.slow
def test_a_netcdf_file_is_read_through_the_xarray_object(
    tmp_path: Path, stores: dict[str, Path], process_client: Client
) -> None:
    """A trajectory opened from a netCDF file by xarray, lazily and after ``.load()``, is
    estimated on the embedded cluster through the object itself (its samples scattered once),
    never reopened as a zarr store from its path: the response of the zarr store it came from."""
    path = tmp_path / "traj.nc"
    dt = open_trajectory(stores["base"]).attrs["dt"]
    with xr.open_zarr(stores["base"], consolidated=False) as ds:
        ds.drop_attrs().assign_attrs(dt=dt).to_netcdf(path)
    want = estimate_response(stores["base"], client=process_client, **SMALL)
    with xr.open_dataset(path) as ds:
        lazy = estimate_response(ds, client=None, **SMALL)
        loaded = estimate_response(ds.load(), client=None, **SMALL)
    for got in (lazy, loaded):
        np.testing.assert_allclose(got.response, want.response, rtol=1e-10, atol=1e-13)
        assert got.attrs["store"] == f"{path} (read through the xarray object)"


def test_max_time_for_an_array_without_dt_is_refused() -> None:
    """An array has no sample interval of its own: ``max_time`` without ``dt`` would count
    samples (5 steps for max_time=5) and is refused in one line; with ``dt`` it is time."""
    x = np.random.default_rng(2).standard_normal((2_000, 2))
    message = (
        r"^max_time=5 given for an array without dt or a time index: .* give dt= .* or max_lag \(in"
    )
    with pytest.raises(ValueError, match=message):
        estimate_response(x, client="synchronous", max_order=4, max_time=5)
    ds = estimate_response(x, client="synchronous", max_order=4, max_time=0.5, dt=0.1)
    assert ds.sizes["lag"] == 6


def test_one_naming_rule_for_components_by_every_route(tmp_path: Path) -> None:
    """A simulated store's components (x1, x2) and the same samples given as an array, a
    DataFrame with default columns or an unnamed DataArray carry the same names, so responses
    of the same data by two routes align."""
    import pandas as pd

    from kelr_dist.pipeline.inputs import check_inputs
    from kelr_dist.pipeline.options import EstimateOptions

    path = tmp_path / "tw.zarr"
    simulate("triple-well", path, 2_000, seed=1, progress=False)
    options = EstimateOptions()
    store = check_inputs(path, options).trajectory
    values = store.values[0]
    routes = [values, pd.DataFrame(values), xr.DataArray(values, dims=("time", "component"))]
    for data in routes:
        names = check_inputs(data, EstimateOptions(dt=0.1)).trajectory["component"]
        assert names.values.tolist() == store["component"].values.tolist() == ["x1", "x2"]


def test_pandas_columns_name_the_components() -> None:
    """A DataFrame's columns (a named Series' name) are the component names, as a store's
    component coordinate is; plain arrays and default columns get x1, x2, ... as unnamed
    components of a store do"""
    import pandas as pd

    from kelr_dist.pipeline.inputs import check_inputs
    from kelr_dist.pipeline.options import EstimateOptions

    x = np.random.default_rng(8).standard_normal((3_000, 2))
    options = EstimateOptions(dt=0.1)

    def names(data: object) -> list[str]:
        return check_inputs(data, options).trajectory["component"].values.tolist()

    assert names(pd.DataFrame(x, columns=["u", "v"])) == ["u", "v"]
    assert names(pd.Series(x[:, 0], name="temperature")) == ["temperature"]
    assert names(x) == ["x1", "x2"]
    assert names(pd.DataFrame(x)) == ["x1", "x2"]
    unnamed = xr.DataArray(x, dims=("time", "component"), attrs={"dt": 0.1})
    assert names(unnamed) == names(x)
    with pytest.raises(ValueError, match=r"component names \['u', 'u'\] are not unique"):
        names(pd.DataFrame(x, columns=["u", "u"]))


def test_a_pandas_time_index_is_used_as_the_time_coordinate() -> None:
    """A float index gives ``dt`` (so ``max_time`` is taken), dates and durations give ``dt``
    in seconds, as xarray's time coordinate does; an integer index counts samples."""
    import pandas as pd

    from kelr_dist.pipeline.inputs import check_inputs
    from kelr_dist.pipeline.options import EstimateOptions

    x = np.random.default_rng(8).standard_normal((3_000, 2))
    cases = {
        "float": (np.arange(3_000) * 0.1, 0.1, None),
        "dates": (pd.date_range("2020-01-01", periods=3_000, freq="1min"), 60.0, "s"),
        "dates in a time zone": (
            pd.date_range("2020-03-28", periods=3_000, freq="1min", tz="Europe/Paris"),
            60.0,
            "s",
        ),
        "durations": (pd.timedelta_range(0, periods=3_000, freq="2s"), 2.0, "s"),
    }
    for case, (index, dt, units) in cases.items():
        for data in (pd.DataFrame(x, index=index), pd.Series(x[:, 0], index=index, name="u")):
            inputs = check_inputs(data, EstimateOptions(max_time=30 * dt))
            assert inputs.trajectory.attrs["dt"] == pytest.approx(dt), case
            assert inputs.trajectory.attrs.get("time_units") == units, case
            assert inputs.max_lag == 30, case
    counted = check_inputs(pd.DataFrame(x, index=np.arange(3_000)), EstimateOptions(max_lag=3))
    assert counted.trajectory.attrs["time_units"] == "steps"
    with pytest.raises(ValueError, match="without dt or a time index"):
        check_inputs(pd.DataFrame(x), EstimateOptions(max_time=3.0))
    with pytest.raises(ValueError, match="dt=0.2 given, but the data's time coordinate says 0.1"):
        check_inputs(pd.DataFrame(x, index=cases["float"][0]), EstimateOptions(dt=0.2))


def test_the_result_records_its_observable_and_forcing() -> None:
    """A response of A = x² to a linear forcing says so (attributes and report), as a result of
    A = x to a constant forcing does: its j labels alone cannot tell them apart."""
    from kelr_dist.edges.report import summary
    from kelr_dist.kernels.response.operator import Observable

    x = np.random.default_rng(4).standard_normal((3_000, 2))
    options = {"dt": 0.1, "max_lag": 3, "max_order": 4, "client": "synchronous"}
    plain = estimate_response(x, **options)
    assert (plain.attrs["observable"], plain.attrs["forcing"]) == ("identity", "constant")
    squared = estimate_response(x, observable="square", forcing="linear", **options)
    assert (squared.attrs["observable"], squared.attrs["forcing"]) == ("square", "linear")
    assert "A = square, forcing c = linear" in summary(squared)
    cubed = estimate_response(x, observable=Observable(("a", "b"), np.negative), **options)
    assert cubed.attrs["observable"] == "numpy:negative"

    def linear(z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return z, np.ones_like(z)

    # a forcing function as it is (its components are the trajectory's); the same as "linear"
    by_function = estimate_response(x, observable="square", forcing=linear, **options)
    assert by_function.attrs["forcing"].endswith(
        ":test_the_result_records_its_observable_and_forcing.<locals>.linear"
    )
    np.testing.assert_allclose(by_function["response"], squared["response"], rtol=1e-12)
    with pytest.raises(ValueError, match=r"needs the names of its components: pass kelr_dist.Obs"):
        estimate_response(x, observable=np.square, **options)


def test_a_nonlinear_observable_is_refitted_on_its_own_functions() -> None:
    """A = x² on two skewed bimodal components, with a score (degree 1: Gaussian) whose span misses
    the squares: the Stein correction refits it on the observable's own functions, so their
    lag-0 response is exact (Stein residual zero to rounding), where the affine correction
    alone leaves it many standard errors off; A = x keeps the affine correction."""
    grid = np.linspace(-4, 4, 200_001)
    cdf = np.cumsum(np.exp(-((grid**2 - 1.5) ** 2) / 0.5 + grid))
    u = np.random.default_rng(11).uniform(size=(40_000, 2))
    x = np.interp(u, cdf / cdf[-1], grid)
    options = {"dt": 0.1, "max_lag": 2, "estimator": "score-matching", "degree": 1,
               "client": "synchronous"}  # fmt: skip
    squared = estimate_response(x, observable="square", **options)
    assert squared.attrs["stein_correction"] == "observable"
    stderr = squared["stein_residual_stderr"]
    assert float(np.abs(squared["stein_residual"]).max()) < 1e-6 * float(stderr.max())
    assert float((np.abs(squared["stein_residual_uncorrected"]) / stderr).max()) > 10
    assert estimate_response(x, **options).attrs["stein_correction"] == "affine"


@pytest.mark.parametrize(("max_time", "lag"), [(3.049, 60), (3.0, 60), (0.15, 3), (0.05, 1)])
def test_max_time_gives_the_lags_up_to_it(max_time: float, lag: int) -> None:
    """The largest lag is the last whole lag at or before ``max_time`` (3.049 with dt = 0.05
    gave lag 61, time 3.05, past it), counting a ratio a rounding below a whole number
    (0.15 / 0.05 = 2.9999999999999996) as that number."""
    from kelr_dist.pipeline.inputs import check_inputs
    from kelr_dist.pipeline.options import EstimateOptions

    x = np.random.default_rng(6).standard_normal((3_000, 2))
    assert check_inputs(x, EstimateOptions(max_time=max_time, dt=0.05)).max_lag == lag


def test_integer_arrays_are_estimated_as_float64_and_booleans_refused() -> None:
    """Integer data (counts, a discretised signal) give the estimate of their float64 copy."""
    x = np.random.default_rng(2).integers(-50, 50, size=(2_000, 2))
    options = {"client": "synchronous", "max_order": 4, "max_lag": 3, "dt": 0.1}
    xr.testing.assert_equal(
        estimate_response(x, **options).response,
        estimate_response(x.astype(np.float64), **options).response,
    )
    with pytest.raises(ValueError, match=r"dtype bool: true/false values are not a trajectory"):
        estimate_response(x > 0, **options)


def test_unwritable_outputs_are_refused_before_any_work(tmp_path: Path) -> None:
    from kelr_dist.pipeline.result import check_output

    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    immutable = False
    try:
        if os.access(locked, os.W_OK):  # root ignores permission bits: an immutable folder
            immutable = subprocess.run(["chattr", "+i", str(locked)], check=False).returncode == 0
            if not immutable:
                pytest.skip("cannot make a folder this user cannot write to")
        with pytest.raises(ValueError, match="locked.*is not writable"):
            check_output(locked / "sub" / "out.zarr")
        assert list(locked.iterdir()) == []
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(locked)], check=True)
        locked.chmod(0o700)
    (tmp_path / "plain").write_text("x")
    with pytest.raises(ValueError, match=r"'.*plain/out.zarr' cannot be created: .* is a file"):
        check_output(tmp_path / "plain" / "out.zarr")


def test_non_finite_samples_are_rejected() -> None:
    x = np.random.default_rng(0).standard_normal((1_000, 2))
    x[700, 1] = np.nan
    message = "'<in-memory>', component 'x2': the earliest non-finite sample"
    with pytest.raises(ValueError, match=message):
        estimate_response(x, client="synchronous", max_order=4, max_lag=5)
    x[700, 1] = np.inf
    with pytest.raises(ValueError, match="non-finite"):
        estimate_response(x, client="synchronous", max_order=4, max_lag=5)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            np.nan,
            r"component 'v': the earliest non-finite sample \(NaN or inf\) is at chain 0, "
            r"time index 700; 1 in all, all in this component \(`kelr info --scan` lists them\)",
        ),
        (1e300, r"component 'v': values too large \(max \|x\| = 1e\+300;"),
        (None, r"component 'v': constant \(every sample is 2\.5\): .* leave it out \(components="),
    ],
    ids=["nan", "huge", "constant"],
)
def test_bad_component_of_a_store_is_named(
    tmp_path: Path, value: float | None, message: str
) -> None:
    """NaN, too large and constant components are named with the store, and no numpy warning
    leaks out."""
    x = np.random.default_rng(0).standard_normal((1_000, 2))
    if value is None:
        x[:, 1] = 2.5
    else:
        x[700, 1] = value
    path = tmp_path / "bad.zarr"
    xr.Dataset(
        {"x": (("time", "component"), x)},
        coords={"component": np.array(["u", "v"], dtype=object)},
        attrs={"dt": 0.1},
    ).chunk({"time": 300}).to_zarr(path, consolidated=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        with pytest.raises(ValueError, match=f"^trajectory {str(path)!r}, {message}"):
            estimate_response(path, client="synchronous", max_order=4, max_lag=5)


def test_exact_without_a_model_is_rejected() -> None:
    x = np.random.default_rng(0).standard_normal((1_000, 2))
    message = "^exact: the exact response needs the store's model.*or its score function: score="
    with pytest.raises(ValueError, match=message):
        estimate_response(x, client="synchronous", exact=True, max_order=4, max_lag=5)


def test_missing_store_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        estimate_response(tmp_path / "nowhere.zarr", client="synchronous")


def test_estimate_response_is_a_thin_composition_of_explicit_steps() -> None:
    """``estimate_response``'s body (after its docstring) is at most 60 lines and reads no
    ``locals()``; no step of :mod:`kelr_dist.pipeline.steps` forwards ``**options``."""
    import ast
    import inspect

    from kelr_dist.pipeline import estimate, steps

    tree = ast.parse(inspect.getsource(estimate))
    function = next(
        node
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and node.name == "estimate_response"
    )
    assert function.end_lineno is not None and function.body[0].end_lineno is not None
    assert function.end_lineno - function.body[0].end_lineno <= 60
    calls = [n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and hasattr(n.func, "id")]
    assert "locals" not in calls
    for name in steps.__all__:
        step = getattr(steps, name)
        if inspect.isfunction(step):
            kinds = {p.kind for p in inspect.signature(step).parameters.values()}
            assert inspect.Parameter.VAR_KEYWORD not in kinds, name
