"""Fields: (time, lat, lon) variables in, labelled fields out; their observables and forcing
patterns; the inputs a field estimate refuses before any pass.

The field is a linear (Gaussian) AR(1) on a 3 x 4 grid with two land points masked (NaN at
every time): ten components. Every field estimate is checked against the same estimate of the
same samples given as a plain ``(time, component)`` array.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import warnings

import numpy as np
import pytest
import scipy.linalg
import xarray as xr
from conftest import frame_along

import kelr_dist
import kelr_dist.edges.analysis  # noqa: F401  (registers the Dataset.kelr accessor)
from kelr_dist import estimate_response
from kelr_dist.data.fields import FieldLayout
from kelr_dist.kernels.response.operator import Observable

KELR = [sys.executable, "-m", "kelr_dist.edges.cli"]
LAT = np.array([-40.0, 0.0, 40.0])
LON = np.array([0.0, 90.0, 180.0, 270.0])
LAND = [(0, 0), (2, 3)]  # (lat, lon) indices of the masked points
N, DT = 3000, 0.1
#: a small, fast estimate: score matching of degree 1 (the field is Gaussian)
FAST = {"estimator": "score-matching", "degree": 1, "max_lag": 8, "client": "synchronous"}
#: the same from the command line
FAST_CLI = ["--estimator", "score-matching", "--degree", "1", "--max-lag", "8",
            "--scheduler", "synchronous", "-q"]  # fmt: skip


def _step() -> np.ndarray:
    """The AR(1) step ``expm(-G dt)`` of the field: damped, diffusing along longitude."""
    d = LAT.size * LON.size
    generator = np.eye(d)
    for a in range(LAT.size):
        for b in range(LON.size):
            p, q = a * LON.size + b, a * LON.size + (b + 1) % LON.size
            generator[[p, q], [q, p]] -= 0.3
            generator[[p, q], [p, q]] += 0.3
    return scipy.linalg.expm(-generator * DT)


def _samples() -> np.ndarray:
    """``(N, 3, 4)`` samples of a damped field diffusing along longitude, land set to NaN."""
    rng = np.random.default_rng(45)
    d = LAT.size * LON.size
    step = _step()
    x = np.zeros((N, d))
    noise = rng.standard_normal((N, d)) * np.sqrt(DT)
    for t in range(1, N):
        x[t] = step @ x[t - 1] + noise[t]
    field = x.reshape(N, LAT.size, LON.size)
    for a, b in LAND:
        field[:, a, b] = np.nan
    return field


@pytest.fixture(scope="module")
def field() -> xr.DataArray:
    return xr.DataArray(
        _samples(),
        dims=("time", "lat", "lon"),
        coords={"time": np.arange(N) * DT, "lat": LAT, "lon": LON},
        name="tas",
        attrs={"units": "K"},
    )


@pytest.fixture(scope="module")
def netcdf(field, tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("fields") / "tas.nc"
    field.to_dataset().to_netcdf(path)
    return str(path)


@pytest.fixture(scope="module")
def store(field, tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("fields") / "tas.zarr"
    field.to_dataset().chunk({"time": 1000}).to_zarr(path, consolidated=False)
    return str(path)


def _quiet(*args, **kwargs) -> xr.Dataset:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return estimate_response(*args, **kwargs)


@pytest.fixture(scope="module")
def plain(field) -> xr.Dataset:
    """The estimate of the same samples as a (time, component) array of the sea points."""
    sea = field.stack(point=("lat", "lon")).dropna("point", how="all")
    return _quiet(sea.values, dt=DT, **FAST)


@pytest.fixture(scope="module")
def from_netcdf(netcdf) -> xr.Dataset:
    with xr.open_dataset(netcdf) as ds:
        return _quiet(ds, variable="tas", **FAST)


def _sea() -> list[tuple[float, float]]:
    return [(a, b) for a in LAT for b in LON if (a, b) not in {(LAT[i], LON[j]) for i, j in LAND}]


def test_a_netcdf_field_gives_the_response_on_its_grid(from_netcdf, plain):
    ds = from_netcdf
    assert ds["response"].dims == ("lag", "i_lat", "i_lon", "j_lat", "j_lon")
    np.testing.assert_array_equal(ds["i_lat"], LAT)
    np.testing.assert_array_equal(ds["j_lon"], LON)
    assert json.loads(ds.attrs["field_masked"]) == ["lat=-40.0,lon=0.0", "lat=40.0,lon=270.0"]
    # the same numbers as the estimate of the stacked sea points
    sea = _sea()
    for p, (a, b) in enumerate(sea):
        for q, (c, e) in enumerate(sea):
            entry = ds["response"].sel(i_lat=a, i_lon=b, j_lat=c, j_lon=e).values
            np.testing.assert_allclose(entry, plain["response"].values[:, p, q], rtol=1e-9)
    # land is NaN in every response entry that involves it
    assert np.isnan(ds["response"].sel(i_lat=-40.0, i_lon=0.0)).all()
    assert np.isnan(ds["response_stderr"].sel(j_lat=40.0, j_lon=270.0)).all()
    assert not np.isnan(ds["response"].sel(i_lat=0.0, i_lon=90.0, j_lat=0.0, j_lon=90.0)).any()


def test_predict_of_a_field_result_is_a_field(from_netcdf, plain):
    times = from_netcdf["time"].values
    history = xr.DataArray(
        np.zeros((times.size, LAT.size, LON.size)),
        dims=("time", "lat", "lon"),
        coords={"time": times, "lat": LAT, "lon": LON},
    )
    history[:, 1, 1] = 0.5  # a step on the point (0, 90)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        predicted = from_netcdf.kelr.predict(history)
        forced = f"x{_sea().index((0.0, 90.0)) + 1}"  # the point's name in the plain estimate
        reference = plain.kelr.predict(kelr_dist.step(0.5, times, j=forced))
    assert predicted.dims == ("time", "lat", "lon")
    assert predicted.stderr.dims == ("time", "lat", "lon")
    for p, (a, b) in enumerate(_sea()):
        np.testing.assert_allclose(
            predicted.sel(lat=a, lon=b).values, reference.values[:, p], rtol=1e-9, atol=1e-14
        )
    assert np.isnan(predicted.sel(lat=40.0, lon=270.0)).all()


def test_a_zarr_field_from_the_command_line_is_the_python_estimate(store, from_netcdf, tmp_path):
    out = tmp_path / "response.zarr"
    run = subprocess.run(
        [*KELR, "estimate", store, str(out), "--variable", "tas", *FAST_CLI],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr
    written = xr.open_zarr(out)
    assert written["response"].dims == ("lag", "i_lat", "i_lon", "j_lat", "j_lon")
    np.testing.assert_allclose(
        written["response"].values,
        from_netcdf["response"].values,
        rtol=1e-9,
        atol=1e-12,  # the store's chunks sum in another order
        equal_nan=True,
    )
    assert json.loads(written.attrs["field_masked"]) == json.loads(
        from_netcdf.attrs["field_masked"]
    )


def test_the_weighted_mean_is_the_weighted_sum_of_the_field_response(netcdf, from_netcdf):
    with xr.open_dataset(netcdf) as ds:
        mean = _quiet(ds, variable="tas", observable="mean(weights=cos(lat))", **FAST)
    assert mean["response"].dims == ("lag", "i", "j_lat", "j_lon")
    assert list(mean["i"].values) == ["mean"]
    weights = xr.DataArray(np.cos(np.deg2rad(LAT)), dims="i_lat", coords={"i_lat": LAT})
    sea = from_netcdf["response"].notnull().isel(lag=0, j_lat=1, j_lon=1)
    total = (weights * sea).sum(("i_lat", "i_lon"))
    expected = (from_netcdf["response"] * weights).sum(("i_lat", "i_lon")) / total
    expected = expected.where(from_netcdf["response"].isel(i_lat=1, i_lon=1).notnull())
    np.testing.assert_allclose(
        mean["response"].isel(i=0).values, expected.values, rtol=1e-9, atol=1e-14
    )


def test_a_forcing_pattern_scales_the_columns_and_sums_to_the_pattern_response(netcdf, from_netcdf):
    pattern = xr.DataArray(
        np.outer(np.cos(np.deg2rad(LAT)), 1.0 + np.sin(np.deg2rad(LON))),
        dims=("lat", "lon"),
        coords={"lat": LAT, "lon": LON},
    )
    pattern[0, 0] = np.nan  # land: its value is not used
    with xr.open_dataset(netcdf) as ds:
        forced = _quiet(ds, variable="tas", forcing=pattern, **FAST)
    assert forced.attrs["forcing"] == "pattern"
    f = pattern.rename(lat="j_lat", lon="j_lon")
    np.testing.assert_allclose(
        forced["response"].values, (from_netcdf["response"] * f).values, rtol=1e-9,
        atol=1e-14, equal_nan=True,
    )  # fmt: skip
    np.testing.assert_allclose(
        forced["response_total_stderr"].values,
        (from_netcdf["response_total_stderr"] * abs(f)).values,
        rtol=1e-9,
        equal_nan=True,
    )
    sea = forced["response"].isel(j_lat=1, j_lon=1).notnull()
    total = forced["response"].sum(("j_lat", "j_lon")).where(sea)
    assert forced["pattern_response"].dims == ("lag", "i_lat", "i_lon")
    np.testing.assert_allclose(
        forced["pattern_response"].values, total.values, rtol=1e-9, atol=1e-14, equal_nan=True
    )


def _precision(field: xr.DataArray) -> np.ndarray:
    """``C⁻¹`` of the sea points' stationary law (the AR(1) of :func:`_samples`, Gaussian): the
    exact score of their samples is ``-C⁻¹ x``."""
    d = LAT.size * LON.size
    step = _step()
    cov = scipy.linalg.solve_discrete_lyapunov(step, DT * np.eye(d))
    kept = np.isfinite(field.isel(time=0).values.reshape(-1))
    return np.linalg.inv(cov[np.ix_(kept, kept)])


def test_the_pattern_response_has_the_standard_errors_of_its_own_column(netcdf, field):
    """With the exact score, the pattern's response and its standard error equal those of the
    forcing along ``f`` estimated as a component of its own (the sea points in an orthonormal
    frame whose first axis is ``f / |f|``), and for a pattern of mixed signs they are well
    below the sum of the points' standard errors (the bound the result gave before)."""
    values = np.outer(np.cos(np.deg2rad(LAT)), np.sin(np.deg2rad(LON)) + 0.3)
    pattern = xr.DataArray(values, dims=("lat", "lon"), coords={"lat": LAT, "lon": LON})
    precision = _precision(field)
    with xr.open_dataset(netcdf) as ds:
        forced = _quiet(ds, variable="tas", forcing=pattern, score=lambda x: -x @ precision, **FAST)
    assert "bound" not in forced["pattern_response_stderr"].attrs
    kept = np.isfinite(field.isel(time=0).values.reshape(-1))
    f = values.reshape(-1)[kept]
    assert (f > 0).any() and (f < 0).any()
    frame = frame_along(f)
    names = tuple(map(str, range(f.size)))
    direct = _quiet(
        field.stack(point=("lat", "lon")).dropna("point", how="all").values @ frame.T,
        dt=DT,
        observable=Observable(
            names, lambda y: y @ frame, lambda y: np.broadcast_to(frame.T, (len(y), f.size, f.size))
        ),
        score=lambda y: -(y @ frame) @ precision @ frame.T,
        **FAST,
    )
    norm = np.linalg.norm(f)

    def on_points(name: str) -> np.ndarray:
        return forced[name].values.reshape(forced.sizes["lag"], -1)[:, kept]

    for suffix in ("", "_stderr"):
        np.testing.assert_allclose(
            on_points(f"pattern_response_exact{suffix}"),
            norm * direct[f"response_exact{suffix}"].isel(j=0).values,
            rtol=1e-9,
            atol=1e-12,
        )
    for name in ("response_exact_stderr", "response_total_stderr"):
        bound = forced[name].sum(("j_lat", "j_lon")).values.reshape(forced.sizes["lag"], -1)
        assert np.all(on_points(f"pattern_{name}")[1:] < 0.9 * bound[1:, kept])
    # a history of the pattern's amplitude is predicted from its column, with its errors
    times = forced["time"].values
    predicted = forced.kelr.predict(kelr_dist.step(0.5, times), variable="response_exact")
    reference = direct.kelr.predict(
        kelr_dist.step(0.5 * norm, times, j="x1"), variable="response_exact"
    )
    for got, want in [(predicted, reference), (predicted.stderr, reference.stderr)]:
        np.testing.assert_allclose(
            got.values.reshape(times.size, -1)[:, kept], want.values, rtol=1e-9, atol=1e-12
        )


def test_eof_amplitudes_are_the_loadings_times_the_field_response(netcdf, from_netcdf, field):
    with xr.open_dataset(netcdf) as ds:
        eof = _quiet(ds, variable="tas", observable="eof(2)", **FAST)
    assert list(eof["i"].values) == ["eof1", "eof2"]
    loading = eof["eof_loading"]
    assert loading.dims == ("i", "lat", "lon")
    assert np.isnan(loading.sel(lat=-40.0, lon=0.0)).all()
    flat = loading.stack(point=("lat", "lon")).dropna("point").values
    np.testing.assert_allclose(flat @ flat.T, np.eye(2), atol=1e-12)
    # the sample covariance's leading eigenvalues share of its trace
    sea = field.stack(point=("lat", "lon")).dropna("point", how="all").values
    values = np.linalg.eigvalsh(np.cov(sea.T))[::-1]
    np.testing.assert_allclose(eof["eof_explained_variance"], values[:2] / values.sum(), rtol=1e-9)
    expected = xr.dot(
        loading.rename(lat="i_lat", lon="i_lon").fillna(0.0),
        from_netcdf["response"].fillna(0.0),
        dim=("i_lat", "i_lon"),
    ).where(from_netcdf["response"].isel(i_lat=1, i_lon=1).notnull())
    np.testing.assert_allclose(
        eof["response"].transpose("lag", "i", "j_lat", "j_lon").values,
        expected.transpose("lag", "i", "j_lat", "j_lon").values,
        rtol=1e-9, atol=1e-13, equal_nan=True,
    )  # fmt: skip


# --------------------------------------------------------------------------------------------
# refused before any pass: the client is an address nothing listens on, so an estimate that got
# as far as a pass would fail on the connection instead
# --------------------------------------------------------------------------------------------

NOWHERE = "tcp://127.0.0.1:9"


def _refused(trajectory, match, **options) -> None:
    with pytest.raises(ValueError, match=match) as caught:
        estimate_response(trajectory, variable="tas", max_lag=8, client=NOWHERE, **options)
    assert "\n" not in str(caught.value)


def test_a_variable_without_a_time_dim_is_refused(field):
    _refused(
        field.rename(time="step"),
        r"dims \('step', 'lat', 'lon'\) found, expected .* or a field: a 'time' dim",
    )


def test_two_candidate_time_dims_are_refused(field):
    two = field.isel(lon=slice(0, 2)).rename(lon="t")
    two = two.assign_coords(t=np.array(["2000-01-01", "2000-01-02"], dtype="datetime64[ns]"))
    _refused(two, r"2 candidate time dims \('time', 't'\)")


def test_a_time_dim_known_by_its_dates_is_used(field):
    dated = field.rename(time="date").assign_coords(
        date=np.datetime64("2000-01-01") + np.arange(N) * np.timedelta64(6, "h")
    )
    layout = FieldLayout.from_attrs(
        kelr_dist.data.fields.stacked(dated, "tas", "<in-memory>").attrs
    )
    assert layout is not None and layout.dims == ("lat", "lon")


def test_a_point_missing_at_some_times_only_is_refused_naming_it(field, tmp_path):
    gappy = field.copy()
    gappy[100:110, 1, 2] = np.nan  # a gap at (0, 180)
    gappy[:50, 2, 3] = 1.0  # land that is sea at first: the mask changes in time
    gappy.to_dataset().to_netcdf(tmp_path / "gappy.nc")
    path = tmp_path / "gappy.zarr"
    gappy.to_dataset().chunk({"time": 1000}).to_zarr(path, consolidated=False)
    with xr.open_dataset(tmp_path / "gappy.nc") as ds:
        _refused(ds, r"2 grid point\(s\) are NaN at some times only: lat=0.0,lon=180.0 "
                 r"\(10 of 3000 times\), lat=40.0,lon=270.0 \(2950 of 3000 times\)")  # fmt: skip
    run = subprocess.run(
        [*KELR, "estimate", str(path), str(tmp_path / "out.zarr"), "--variable", "tas",
         *FAST_CLI], capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 2, run.stderr
    assert "lat=0.0,lon=180.0 (10 of 3000 times)" in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1


def test_a_forcing_pattern_on_other_dims_is_refused(field):
    wrong = xr.DataArray(np.ones(LAT.size), dims=("lat",), coords={"lat": LAT})
    _refused(field, r"forcing: the pattern's dims \('lat',\) are not the spatial", forcing=wrong)
    shifted = xr.DataArray(
        np.ones((LAT.size, LON.size)), dims=("lat", "lon"), coords={"lat": LAT + 1, "lon": LON}
    )
    _refused(field, "forcing: the pattern's coordinates do not hold every point", forcing=shifted)


def test_a_forcing_pattern_of_text_is_refused(field):
    names = xr.DataArray(np.full((LAT.size, LON.size), "a"), dims=("lat", "lon"),
                         coords={"lat": LAT, "lon": LON})  # fmt: skip
    _refused(field, "forcing: the pattern's values must be real numbers, got text", forcing=names)


def test_a_forcing_pattern_needs_a_field(field):
    components = field.isel(lat=1).rename(lon="component").drop_vars(["lat", "component"])
    pattern = xr.DataArray(np.ones(LON.size), dims=("lon",))
    _refused(components, "forcing: a pattern .* needs a field", forcing=pattern)


def test_field_observables_name_their_problems(field):
    _refused(field, "no coordinate 'height' over the grid", observable="mean(weights=height)")
    _refused(field, "eof\\(k\\) needs the number of EOFs", observable="eof")
    _refused(field, "11 EOFs of 10 components", observable="eof(11)")


def test_layout_stack_inverts_unstack():
    layout = FieldLayout(("lat", "lon"), {"lat": [0.0, 1.0], "lon": [5.0, 6.0, 7.0]},
                         (True, False, True, True, True, False))  # fmt: skip
    values = xr.DataArray(
        np.arange(8.0).reshape(2, 4), dims=("lag", "i"), coords={"i": layout.components}
    )
    spread = layout.unstack(values, "i", "i_")
    assert spread.dims == ("lag", "i_lat", "i_lon")
    assert np.isnan(spread.sel(i_lat=0.0, i_lon=6.0)).all()
    back = layout.stack(spread, "i_", "i")
    xr.testing.assert_equal(back, values)


def test_any_grid_dims_are_stacked_with_their_coordinates():
    rng = np.random.default_rng(1)
    values = rng.standard_normal((2, 50, 2, 2, 3))  # (chain, time, level, lat, lon)
    values[:, :, 1, 0, 2] = np.nan
    area = xr.DataArray([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dims=("lat", "lon"))
    da = xr.DataArray(
        values,
        dims=("chain", "time", "level", "lat", "lon"),
        coords={"level": [850, 500], "lat": [0.0, 10.0], "lon": [0.0, 5.0, 10.0], "area": area},
        attrs={"dt": 0.5},
    )
    out = kelr_dist.data.fields.stacked(da, "ta", "<in-memory>")
    assert out.dims == ("chain", "time", "component")
    assert out.sizes["component"] == 11
    assert str(out["component"].values[0]) == "level=850,lat=0.0,lon=0.0"
    layout = FieldLayout.from_attrs(out.attrs)
    assert layout is not None and layout.masked == ["level=500,lat=0.0,lon=10.0"]
    np.testing.assert_array_equal(out["area"].values, [1, 2, 3, 4, 5, 6, 1, 2, 4, 5, 6])
    np.testing.assert_array_equal(out["level"].values[:6], [850] * 6)
    np.testing.assert_array_equal(out.values, values.reshape(2, 50, 12)[..., layout.kept])


def test_weights_from_a_coordinate_over_the_grid():
    from kelr_dist.kernels.observables.field import parse_field_spec
    from kelr_dist.pipeline.fields import field_observable

    da = xr.DataArray(
        np.ones((10, 2, 2)),
        dims=("time", "lat", "lon"),
        coords={"lat": [0.0, 60.0], "lon": [0.0, 1.0], "area": (("lat", "lon"), [[1, 3], [2, 2]])},
    )
    trajectory = kelr_dist.data.store.as_trajectory(
        kelr_dist.data.fields.stacked(da, "x", "<in-memory>"), dt=1.0
    )
    area = field_observable(parse_field_spec("mean(weights=area)"), trajectory)
    np.testing.assert_allclose(area.function.matrix, [[0.125, 0.375, 0.25, 0.25]])
    cosine = field_observable(parse_field_spec("mean(weights=cos(lat))"), trajectory)
    np.testing.assert_allclose(cosine.function.matrix, [[1 / 3, 1 / 3, 1 / 6, 1 / 6]])


def test_points_picked_by_name_stay_components(field):
    picked = ["lat=0.0,lon=90.0", "lat=0.0,lon=180.0"]
    ds = _quiet(field, components=picked, **FAST)
    assert ds["response"].dims == ("lag", "i", "j")
    assert list(ds["j"].values) == picked
    assert "field" not in ds.attrs


# --------------------------------------------------------------------------------------------
# a forcing pattern from a file: 'pattern=FILE:VARIABLE' on the command line and in job files
# --------------------------------------------------------------------------------------------

#: attributes two runs of one estimate differ in (when, how long), and the file of the pattern
RUN_ATTRS = ("created", "runtime_seconds", "forcing_pattern")


def _heating() -> xr.DataArray:
    """A pattern of mixed signs over the grid, NaN on a land point (its value is not used)."""
    values = np.outer(np.cos(np.deg2rad(LAT)), np.sin(np.deg2rad(LON)) + 0.3)
    values[LAND[0]] = np.nan
    return xr.DataArray(values, dims=("lat", "lon"), coords={"lat": LAT, "lon": LON},
                        name="heating", attrs={"units": "W m-2"})  # fmt: skip


@pytest.fixture(scope="module")
def patterns(tmp_path_factory):
    """A folder with the pattern as a netCDF file and as a zarr store, and bad ones beside it."""
    folder = tmp_path_factory.mktemp("patterns")
    heating = _heating().to_dataset()
    heating.to_netcdf(folder / "heating.nc")
    heating.to_zarr(folder / "heating.zarr", consolidated=False)
    xr.Dataset({"zonal": _heating().isel(lon=0, drop=True)}).to_netcdf(folder / "zonal.nc")
    names = xr.full_like(_heating(), "a", dtype=object).rename("names")
    names.to_dataset().to_netcdf(folder / "names.nc")
    gap = _heating().rename("gap")
    gap[1, 1] = np.nan  # a sea point
    gap.to_dataset().to_netcdf(folder / "gap.nc")
    (folder / "notes.nc").write_text("not a netCDF file\n")
    return folder


@pytest.fixture(scope="module")
def forced_in_python(store) -> xr.Dataset:
    """The estimate with the pattern given as a DataArray, from the same store."""
    return _quiet(store, variable="tas", forcing=_heating(), **FAST)


def _same_estimate(written: xr.Dataset, expected: xr.Dataset) -> None:
    """The same numbers, coordinates and attributes, apart from :data:`RUN_ATTRS`."""
    xr.testing.assert_allclose(written.load(), expected, rtol=1e-12, atol=1e-15)
    for key in expected.variables:
        assert written[key].attrs == expected[key].attrs, key

    def run_free(attrs):
        return {k: str(v) for k, v in attrs.items() if k not in RUN_ATTRS}

    assert run_free(written.attrs) == run_free(expected.attrs)


def test_a_pattern_file_on_the_command_line_is_the_python_pattern(
    store, patterns, forced_in_python, tmp_path
):
    out = tmp_path / "forced.zarr"
    spec = f"pattern={patterns / 'heating.nc'}:heating"
    run = subprocess.run(
        [*KELR, "estimate", store, str(out), "--variable", "tas", "--forcing", spec, *FAST_CLI],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    written = xr.open_zarr(out)
    assert written.attrs["forcing"] == "pattern"
    assert written.attrs["forcing_pattern"] == spec
    assert "pattern_response" in written and written["response"].dims[-2:] == ("j_lat", "j_lon")
    _same_estimate(written, forced_in_python)


def test_python_takes_a_pattern_file_too(store, patterns, forced_in_python):
    spec = f"pattern={patterns / 'heating.zarr'}:heating"
    forced = _quiet(store, variable="tas", forcing=spec, **FAST)
    assert forced.attrs["forcing_pattern"] == spec
    _same_estimate(forced, forced_in_python)


def test_a_job_file_takes_a_pattern_store_relative_to_its_folder(
    store, patterns, forced_in_python, tmp_path, monkeypatch
):
    from click.testing import CliRunner

    from kelr_dist.edges.cli import main

    folder = tmp_path / "job"
    shutil.copytree(patterns / "heating.zarr", folder / "inputs" / "heating.zarr")
    job = folder / "job.yaml"
    job.write_text(
        f"input: {{store: {store}, variable: tas}}\n"
        "estimator: {method: score-matching, degree: 1}\n"
        "forcing: pattern=inputs/heating.zarr:heating\n"
        "lags: {max_lag: 8}\n"
        "outputs: {result: forced.zarr}\n"
        "cluster: {scheduler: synchronous}\n"
    )
    monkeypatch.chdir(tmp_path)  # not the job's folder
    run = CliRunner().invoke(main, ["run", str(job), "--quiet"])
    assert run.exit_code == 0, run.output
    written = xr.open_zarr(folder / "forced.zarr")
    assert written.attrs["forcing_pattern"] == f"pattern={folder / 'inputs/heating.zarr'}:heating"
    _same_estimate(written, forced_in_python)

    job.write_text(job.read_text().replace(":heating", ":cooling").replace("forced", "again"))
    run = CliRunner().invoke(main, ["run", str(job), "--quiet"])
    assert run.exit_code == 2
    assert run.stderr == (
        "kelr run: error: job.yaml: forcing='pattern=inputs/heating.zarr:cooling': no variable "
        f"'cooling' in '{folder / 'inputs/heating.zarr'}' (its variables: heating)\n"
    )


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ("nowhere.nc:heating", "no file or zarr store '{folder}/nowhere.nc'"),
        ("heating.nc:cooling",
         "no variable 'cooling' in '{folder}/heating.nc' (its variables: heating)"),
        ("heating.zarr:cooling",
         "no variable 'cooling' in '{folder}/heating.zarr' (its variables: heating)"),
        ("notes.nc:notes", "cannot read '{folder}/notes.nc' as a netCDF file or zarr store ("),
        ("zonal.nc:zonal", "the pattern's dims ('lat',) are not the spatial dims ('lat', 'lon') "
         "of the field"),
        ("names.nc:names", "the pattern's values must be real numbers, got text"),
        ("gap.nc:gap",
         "the pattern is not finite at 1 grid point(s) of the field, the first lat=0.0,lon=90.0"),
    ],
)  # fmt: skip
def test_a_bad_pattern_file_is_one_line_naming_the_option_file_and_variable(
    store, patterns, tmp_path, spec, problem
):
    """Refused before any pass (the scheduler is an address nothing listens on), exit code 2."""
    from click.testing import CliRunner

    from kelr_dist.edges.cli import main

    given = f"pattern={patterns / spec}"
    args = ["estimate", store, str(tmp_path / "out.zarr"), "--variable", "tas", "--max-lag", "8",
            "--forcing", given, "--scheduler", NOWHERE, "--quiet"]  # fmt: skip
    run = CliRunner().invoke(main, args)
    assert run.exit_code == 2
    assert run.stderr.count("\n") == 1
    assert run.stderr.startswith(f"kelr estimate: error: --forcing='{given}': ")
    assert problem.format(folder=patterns) in run.stderr
    assert not (tmp_path / "out.zarr").exists()


def test_a_pattern_spec_without_a_variable_is_refused_by_the_options():
    from click.testing import CliRunner

    from kelr_dist.edges.cli import main

    run = CliRunner().invoke(main, ["estimate", "s.zarr", "o.zarr", "--forcing", "pattern=f.nc"])
    assert run.exit_code == 2
    assert run.stderr == (
        "kelr estimate: error: --forcing: expected 'pattern=FILE:VARIABLE' (a netCDF file or zarr "
        "store and the name of its variable), got 'pattern=f.nc'\n"
    )
