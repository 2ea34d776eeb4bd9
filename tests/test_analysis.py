"""Tests of kelr_dist.edges.analysis against the Ornstein-Uhlenbeck response k(t) = expm(-Γt)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import xarray as xr
from scipy.linalg import expm

import kelr_dist.edges.analysis  # noqa: F401  (registers the ``kelr`` accessor)
from kelr_dist.edges.analysis import (
    QuadratureWarning,
    normalized,
    predict_response,
    ramp,
    sampled,
    step,
    susceptibility,
)

GAMMA = np.array([[1.0, 0.3], [-0.2, 0.7]])  # eigenvalues 0.85 ± 0.19i: decaying, oscillating
DT = 0.01
COMPONENTS = ["x", "y"]


def ou_dataset(max_lag: int = 2000, dt: float = DT, stderr: float = 1e-3) -> xr.Dataset:
    """A result Dataset in the estimate_response schema with k(t) = expm(-Γt)."""
    lags = np.arange(max_lag + 1)
    times = lags * dt
    exact = np.empty((max_lag + 1, 2, 2))  # (lag, i, j): powers of the one-step propagator
    exact[0] = np.eye(2)
    propagator = expm(-GAMMA * dt)
    for lag in lags[1:]:
        exact[lag] = exact[lag - 1] @ propagator
    rng = np.random.default_rng(0)
    sigma = stderr * (1.0 + rng.random(exact.shape)) * np.exp(-0.1 * times)[:, None, None]
    coords = {"lag": lags, "time": ("lag", times), "i": COMPONENTS, "j": COMPONENTS}
    dims = ("lag", "i", "j")
    return xr.Dataset(
        {
            "response": (dims, exact + 0.5 * sigma),
            "response_stderr": (dims, sigma),
            "response_exact": (dims, exact),
        },
        coords=coords,
        attrs={"dt": dt, "order": 8, "basis": "hermite"},
    )


@pytest.fixture(scope="module")
def ds() -> xr.Dataset:
    return ou_dataset()


def exact_response(ds: xr.Dataset) -> xr.DataArray:
    return ds["response_exact"]


def ou_propagator(t: np.ndarray) -> np.ndarray:
    """expm(-Γt) at times ``t = 0, dt, 2 dt, ...``, shape (n, 2, 2)."""
    return ou_dataset(max_lag=t.size - 1, dt=t[1] - t[0])["response_exact"].values


def step_solution(t: np.ndarray, amplitude: np.ndarray) -> np.ndarray:
    """∫_0^t expm(-Γs) ds f = Γ^{-1}(I - expm(-Γt)) f, shape (n, 2)."""
    decay = np.eye(2) - ou_propagator(t)
    return np.linalg.solve(GAMMA, (decay @ amplitude).T).T


def ramp_solution(t: np.ndarray, rate: np.ndarray) -> np.ndarray:
    """∫_0^t expm(-Γ(t-s)) r s ds = t Γ^{-1} r - Γ^{-2}(I - expm(-Γt)) r, shape (n, 2)."""
    decay = np.eye(2) - ou_propagator(t)
    inv = np.linalg.inv(GAMMA)
    return t[:, None] * (inv @ rate) - (inv @ inv @ decay @ rate)


def test_step_prediction_matches_closed_form(ds):
    times = ds["time"].values[:1500]
    amplitude = np.array([0.5, -0.2])
    prediction = predict_response(exact_response(ds), step(amplitude, times, j=COMPONENTS))
    assert prediction.dims == ("time", "i")
    # trapezoid error ~ dt²/12 |Γ f| ~ 4e-6
    np.testing.assert_allclose(prediction.values, step_solution(times, amplitude), atol=1e-5)
    assert "stderr" not in prediction.coords


def test_ramp_prediction_matches_closed_form(ds):
    times = ds["time"].values[:800]
    rate = np.array([0.3, 0.1])
    prediction = predict_response(exact_response(ds), ramp(rate, times, j=COMPONENTS))
    np.testing.assert_allclose(prediction.values, ramp_solution(times, rate), rtol=1e-4, atol=1e-6)


def test_quadrature_error_is_second_order():
    """Halving dt divides the step-response error by ~4 (trapezoid rule)."""
    amplitude = np.array([1.0, 1.0])
    errors = []
    for dt in (0.04, 0.02):
        coarse = ou_dataset(max_lag=int(4.0 / dt), dt=dt)
        times = coarse["time"].values
        prediction = predict_response(
            coarse["response_exact"], step(amplitude, times, j=COMPONENTS)
        )
        errors.append(np.abs(prediction.values - step_solution(times, amplitude)).max())
    assert 3.6 < errors[0] / errors[1] < 4.4


@pytest.mark.parametrize("dt", [0.04, 0.5])
def test_quadrature_error_estimate_bounds_the_error_and_warns_on_a_coarse_grid(dt):
    """Richardson's estimate of the trapezoid error is within a factor 2 of the true error of
    the OU step response (closed form); on a grid as coarse as the decay time it exceeds the
    error bars and warns, on a fine grid it is silent."""
    amplitude = np.array([1.0, 1.0])
    coarse = ou_dataset(max_lag=int(4.0 / dt), dt=dt, stderr=1e-3)
    times = coarse["time"].values
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        prediction = predict_response(
            coarse["response_exact"],
            step(amplitude, times, j=COMPONENTS),
            stderr=coarse["response_stderr"],
        )
    error = np.abs(prediction.values - step_solution(times, amplitude)).max()
    assert 0.5 < prediction.attrs["quadrature_error"] / error < 2.0
    warned = [w for w in caught if issubclass(w.category, QuadratureWarning)]
    assert bool(warned) == (dt == 0.5)


def test_one_component_forcing_selects_a_column(ds):
    times = ds["time"].values[:300]
    prediction = predict_response(exact_response(ds), step(2.0, times, j="y"))
    np.testing.assert_allclose(
        prediction.values, step_solution(times, np.array([0.0, 2.0])), rtol=1e-4, atol=1e-6
    )
    assert list(prediction["i"].values) == COMPONENTS
    np.testing.assert_array_equal(prediction["time"].values, times)


def test_matches_brute_force_trapezoid(ds):
    """Irregular forcing, response with noise: the FFT convolution equals an O(n²) trapezoid."""
    n = 120
    rng = np.random.default_rng(1)
    values = rng.normal(size=(n, 2))
    times = 3.0 + ds["time"].values[:n]  # the switch-on time need not be 0
    prediction = predict_response(ds["response"], sampled(values, times, j=COMPONENTS))
    k = ds["response"].transpose("lag", "i", "j").values
    expected = np.zeros((n, 2))
    for t in range(1, n):
        integrand = np.einsum("mij,mj->mi", k[t::-1], values[: t + 1])
        expected[t] = np.trapezoid(integrand, dx=DT, axis=0)
    np.testing.assert_allclose(prediction.values, expected, rtol=1e-12, atol=1e-14)


def test_prediction_is_linear_in_forcing(ds):
    rng = np.random.default_rng(2)
    times = ds["time"].values[:64]
    f, g = (sampled(rng.normal(size=(64, 2)), times, j=COMPONENTS) for _ in range(2))
    k = ds["response"]
    combined = predict_response(k, 2.0 * f - 3.0 * g)
    separate = 2.0 * predict_response(k, f) - 3.0 * predict_response(k, g)
    np.testing.assert_allclose(combined.values, separate.values, rtol=1e-12, atol=1e-14)


def test_forcing_component_order_does_not_matter(ds):
    times = ds["time"].values[:50]
    values = np.random.default_rng(3).normal(size=(50, 2))
    forward = predict_response(ds["response"], sampled(values, times, j=["x", "y"]))
    backward = predict_response(ds["response"], sampled(values[:, ::-1], times, j=["y", "x"]))
    np.testing.assert_allclose(forward.values, backward.values, rtol=1e-12, atol=1e-14)


def test_susceptibility_tends_to_inverse_gamma(ds):
    chi = susceptibility(exact_response(ds))
    assert chi.dims == ("i", "j")
    assert chi.attrs["horizon"] == pytest.approx(20.0)
    np.testing.assert_allclose(chi.values, np.linalg.inv(GAMMA), atol=1e-5)
    assert list(chi["i"].values) == COMPONENTS and list(chi["j"].values) == COMPONENTS


def test_susceptibility_stderr_formulas(ds):
    sigma = ds["response_stderr"].transpose("lag", "i", "j").values
    weights = np.full(sigma.shape[0], DT)
    weights[[0, -1]] /= 2
    bound = susceptibility(ds["response"], stderr=ds["response_stderr"])
    independent = susceptibility(ds["response"], stderr=ds["response_stderr"], errors="independent")
    np.testing.assert_allclose(bound["stderr"].values, np.einsum("l,lij->ij", weights, sigma))
    np.testing.assert_allclose(
        independent["stderr"].values, np.sqrt(np.einsum("l,lij->ij", weights**2, sigma**2))
    )


def _monte_carlo_std(
    ds: xr.Dataset, forcing: xr.DataArray, noise: np.ndarray, draws: int
) -> np.ndarray:
    """Standard deviation of the prediction over responses perturbed by ``noise(draws, ...)``."""
    base = ds["response"].isel(lag=slice(0, forcing.sizes["time"]))
    sigma = ds["response_stderr"].isel(lag=slice(0, forcing.sizes["time"])).values
    samples = [
        predict_response(base.copy(data=base.values + sigma * noise[r]), forcing).values
        for r in range(draws)
    ]
    return np.std(samples, axis=0, ddof=1)


def test_independent_errors_match_monte_carlo(ds):
    n, draws = 40, 600
    times = ds["time"].values[:n]
    forcing = sampled(np.abs(np.sin(3 * times))[:, None] * [1.0, 0.5], times, j=COMPONENTS)
    noise = np.random.default_rng(4).normal(size=(draws, n, 2, 2))
    measured = _monte_carlo_std(ds, forcing, noise, draws)
    predicted = ds.kelr.predict(forcing, errors="independent")["stderr"].values
    np.testing.assert_allclose(measured[1:], predicted[1:], rtol=0.15)  # ~5 sampling sd
    assert np.all(predicted[0] == 0) and np.all(measured[0] == 0)


def test_bound_covers_correlated_errors(ds):
    """AR(1) errors across lags (ρ = 0.95), shared by the j entries: std in [RSS, bound];
    the bound is attained by perfectly correlated errors of one sign."""
    n, draws, rho = 40, 600, 0.95
    times = ds["time"].values[:n]
    forcing = step(np.array([1.0, 0.5]), times, j=COMPONENTS)
    rng = np.random.default_rng(5)
    noise = np.empty((draws, n, 2, 1))
    noise[:, 0] = rng.normal(size=(draws, 2, 1))
    for lag in range(1, n):
        noise[:, lag] = rho * noise[:, lag - 1] + np.sqrt(1 - rho**2) * rng.normal(
            size=(draws, 2, 1)
        )
    measured = _monte_carlo_std(ds, forcing, np.broadcast_to(noise, (draws, n, 2, 2)), draws)
    bound = ds.kelr.predict(forcing)["stderr"].values
    rss = ds.kelr.predict(forcing, errors="independent")["stderr"].values
    assert np.all(measured[1:] <= 1.15 * bound[1:])
    assert np.all(measured[5:] >= 1.5 * rss[5:])  # correlation makes RSS an underestimate
    shifted = ds["response"] + ds["response_stderr"]
    attained = predict_response(shifted, forcing) - predict_response(ds["response"], forcing)
    np.testing.assert_allclose(attained.values, bound, rtol=1e-10, atol=1e-15)


def test_accessor_matches_functions(ds):
    times = ds["time"].values[:100]
    forcing = step(1.0, times, j="x")
    via_accessor = ds.kelr.predict(forcing)
    direct = predict_response(ds["response"], forcing, stderr=ds["response_stderr"])
    xr.testing.assert_identical(via_accessor, direct)
    exact = ds.kelr.predict(forcing, variable="response_exact")
    assert "stderr" not in exact.coords
    xr.testing.assert_identical(
        ds.kelr.susceptibility(),
        susceptibility(ds["response"], stderr=ds["response_stderr"]),
    )
    with pytest.raises(ValueError, match="response_kde"):
        ds.kelr.predict(forcing, variable="response_kde")


def test_dt_from_attrs_when_time_coordinate_missing(ds):
    response = ds["response"].isel(lag=slice(0, 30)).drop_vars("time").assign_attrs(dt=DT)
    times = ds["time"].values[:30]
    expected = predict_response(ds["response"], step(1.0, times, j="x"))
    xr.testing.assert_allclose(predict_response(response, step(1.0, times, j="x")), expected)


def test_normalized_diagonal(ds):
    scaled = ds.kelr.normalized()
    for name in ("response", "response_exact"):
        k0 = scaled[name].isel(lag=0)
        np.testing.assert_allclose(np.diag(k0.values), 1.0)
        np.testing.assert_array_equal(
            scaled[name].sel(i="x", j="y").values, ds[name].sel(i="x", j="y").values
        )
    ratio = scaled["response_stderr"] / ds["response_stderr"]
    np.testing.assert_allclose(
        ratio.sel(i="y", j="y").values, 1.0 / ds["response"].isel(lag=0).sel(i="y", j="y").item()
    )
    assert "normalization" in scaled.attrs
    xr.testing.assert_identical(scaled, normalized(ds))


@pytest.mark.parametrize(
    ("make_forcing", "message"),
    [
        (lambda t: step(1.0, t[::2], j="x"), "dt = 0.01"),  # sampled at 2 dt
        (lambda t: step(1.0, t, j="z"), r"\['z'\]"),  # unknown component
        (lambda t: sampled(np.ones((t.size, 2)), t, j=["x", "w"]), r"\['w'\]"),
        (lambda t: xr.DataArray(np.ones(t.size), dims="time", coords={"time": t}), "'j'"),
        (lambda t: xr.DataArray(np.ones(t.size), dims="t"), "dims"),
        (lambda t: np.ones(t.size), "DataArray"),
    ],
)
def test_bad_forcing_raises(ds, make_forcing, message):
    with pytest.raises(ValueError, match=message):
        predict_response(ds["response"], make_forcing(ds["time"].values[:100]))


def test_prediction_beyond_max_lag_names_the_time():
    short = ou_dataset(max_lag=10)
    times = np.arange(13) * DT
    with pytest.raises(ValueError, match=r"time 0\.11 needs the response at lag 11"):
        short.kelr.predict(step(1.0, times, j="x"))
    assert short.kelr.predict(step(1.0, times[:11], j="x")).sizes["time"] == 11


def test_bad_response_and_options_raise(ds):
    times = ds["time"].values[:20]
    forcing = step(1.0, times, j="x")
    with pytest.raises(ValueError, match="errors"):
        predict_response(ds["response"], forcing, errors="gaussian")
    with pytest.raises(ValueError, match="lags"):
        predict_response(ds["response"].isel(lag=slice(1, None)), forcing)
    with pytest.raises(ValueError, match="dims"):
        predict_response(ds["response"].isel(j=0), forcing)
    with pytest.raises(ValueError, match="non-negative"):
        predict_response(ds["response"], forcing, stderr=-ds["response_stderr"])
    with pytest.raises(ValueError, match="coordinate 'i'"):
        stderr = ds["response_stderr"].assign_coords(i=["a", "b"])
        predict_response(ds["response"], forcing, stderr=stderr)
    with pytest.raises(ValueError, match="two lags"):
        susceptibility(ds["response"].isel(lag=slice(0, 1)).assign_attrs(dt=DT))


def test_forcing_builders_validate():
    times = np.arange(5) * DT
    with pytest.raises(ValueError, match="strictly increasing"):
        step(1.0, times[::-1], j="x")
    with pytest.raises(ValueError, match="j must name the 2"):
        step(np.array([1.0, 2.0]), times, j="x")
    with pytest.raises(ValueError, match="shape"):
        sampled(np.ones(4), times, j="x")
    with pytest.raises(ValueError, match="one component"):
        sampled(np.ones(5), times, j=["x"])
    np.testing.assert_array_equal(step(2.0, times, j="x", onset=0.02).values, [0, 0, 2, 2, 2])
    np.testing.assert_allclose(ramp(1.0, times, j="x", onset=0.01).values, [0, 0, 0.01, 0.02, 0.03])


def test_susceptibility_and_predictions_carry_the_convergence_flags(ds):
    flagged = ds.copy()
    converged = np.ones(ds["response"].shape, dtype=bool)
    converged[300, 1, 0] = False  # entry k[y, x] at t = 3 has an unconverged error bar
    flagged["response_converged"] = (("lag", "i", "j"), converged)
    flagged["response_block_size"] = (("lag", "i", "j"), np.full(converged.shape, 512))
    chi = flagged.kelr.susceptibility()
    np.testing.assert_array_equal(chi["converged"].values, [[True, True], [False, True]])
    times = ds["time"].values[:500]
    on_x = flagged.kelr.predict(step(0.1, times, j="x"))  # uses k[:, x] only
    assert on_x["converged"].sel(i="x").values.all()
    y = on_x["converged"].sel(i="y").values
    assert y[:300].all() and not y[300:].any()  # from t = 3 on, the value uses k[y, x](3)
    on_y = flagged.kelr.predict(step(0.1, times, j="y"))  # the flagged entry is not used
    assert on_y["converged"].values.all()
    # the companions are not estimates: normalising leaves them as they are
    scaled = flagged.kelr.normalized()
    np.testing.assert_array_equal(scaled["response_block_size"].values, 512)
    assert "converged" not in ds.kelr.susceptibility().coords  # a result without the flags
