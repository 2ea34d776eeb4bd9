"""Distribution observables: bins that partition unity, the OU process's PDF and moment responses
in closed form, every route (Python, CLI, job file), and the predicted PDF."""

import json
import textwrap
import warnings

import numpy as np
import pytest
import xarray as xr
from scipy.linalg import expm

import kelr_dist
from kelr_dist.edges.distribution import LinearRegimeWarning
from kelr_dist.edges.report import write_figures
from kelr_dist.kernels.observables.distribution import (
    KERNELS,
    bin_functions,
    cardinal_bspline,
    parse_distribution_spec,
)
from kelr_dist.models.registry import make_model
from kelr_dist.models.simulate import simulate
from kelr_dist.pipeline.options import EstimateOptions, OptionsError, checked


@pytest.mark.parametrize("kernel", list(KERNELS))
def test_bins_partition_unity_with_their_derivatives(kernel):
    degree = KERNELS[kernel]
    x = np.concatenate([np.linspace(-9.0, 9.0, 20001), [-1e6, 1e6]])
    lo, h, bins = -2.0, 0.25, 17
    values, slopes = bin_functions(x, lo, h, bins, degree)
    np.testing.assert_allclose(values.sum(axis=1), 1.0, atol=1e-14)
    np.testing.assert_allclose(slopes.sum(axis=1), 0.0, atol=1e-12)
    assert values.min() >= -1e-15
    step = 1e-6
    up, down = (
        bin_functions(x + step, lo, h, bins, degree)[0],
        bin_functions(x - step, lo, h, bins, degree)[0],
    )
    np.testing.assert_allclose(slopes, (up - down) / (2 * step), atol=1e-4)  # kinks
    # interior bins integrate to h (a density p_b = E[A_b] / h), and peak at their centres
    dx = x[1] - x[0]
    np.testing.assert_allclose(values[:-2, 3:-3].sum(axis=0) * dx, h, rtol=1e-6)
    centres = lo + h * np.arange(bins)
    assert np.allclose(x[:-2][np.argmax(values[:-2, 3:-3], axis=0)], centres[3:-3], atol=dx)
    t = np.linspace(-3, 3, 6001)
    assert abs(cardinal_bspline(t, degree)[0].sum() * (t[1] - t[0]) - 1.0) < 1e-6


def test_specs_parse_and_bad_ones_are_named():
    assert parse_distribution_spec("identity") is None
    spec = parse_distribution_spec("pdf(bins=60, kernel=quadratic)")
    assert (spec.kind, spec.bins, spec.kernel) == ("pdf", 60, "quadratic")
    assert parse_distribution_spec(spec.text) == spec
    spec = parse_distribution_spec("exceedance(quantiles=0.9,0.99,width=0.1)")
    assert spec.quantiles == (0.9, 0.99) and spec.width == 0.1
    assert parse_distribution_spec(spec.text) == spec
    assert checked(EstimateOptions, {"observable": "moments"}).function_names()["observable"] == (
        "moments"
    )
    for text, message in [
        ("pdf(bins=2)", "bins must be an integer from 3"),
        ("pdf(kernel=box)", "kernel must be one of"),
        ("pdf(width=1)", "unknown parameter"),
        ("exceedance(quantiles=1.5)", "quantiles must be distinct numbers in (0, 1)"),
        ("pdf(bins=40", "expected pdf(key=value"),
    ]:
        with pytest.raises(
            OptionsError, match=r"^observable: .*" + __import__("re").escape(message)
        ):
            checked(EstimateOptions, {"observable": text})


@pytest.fixture(scope="module")
def ou():
    model = make_model("ou")
    rng = np.random.default_rng(7)
    x, _ = model.advance(model.initial_state(rng), 200_000, rng)
    return model, x


def _gaussian_slope_means(record, c, variance, kernel):
    """``E[A_b'(X_c)]`` for ``X_c ~ N(0, variance)`` by quadrature, ``(bins,)``."""
    centres = np.asarray(record["coordinates"][c])
    h = record["bin_width"][c]
    x = np.linspace(-12 * np.sqrt(variance), 12 * np.sqrt(variance), 200_001)
    density = np.exp(-0.5 * x * x / variance) / np.sqrt(2 * np.pi * variance)
    slopes = bin_functions(x, centres[0], h, centres.size, KERNELS[kernel])[1]
    return (slopes * density[:, None]).sum(axis=0) * (x[1] - x[0])


def test_ou_pdf_response_is_the_shifted_gaussian(ou, tmp_path):
    """A constant forcing shifts the OU process's mean by ``∫_0^t expm(-Γ s) ds δf`` and keeps its
    covariance, so ``δp = -∇p0 · δμ`` and the bin response is
    ``k_(c,b) j(t) = expm(-Γ t)_cj E[A_b'(X_c)]``; the estimate (exact score and score matching)
    agrees within 4 standard errors, and the bins' responses sum to 0 at every lag."""
    model, x = ou
    ds = kelr_dist.estimate_response(
        x, dt=model.dt, observable="pdf(bins=20)", max_time=2.0, score=model.score,
        estimator="score-matching", degree=1, client="synchronous",
    )  # fmt: skip
    record = json.loads(ds.attrs["distribution"])
    # the estimated score is refitted on the bins: their lag-0 identity holds to rounding, and
    # the residual before the refit is kept as the evidence of bias
    assert ds.attrs["stein_correction"] == "observable"
    residual = np.abs(ds["stein_residual"]).max()
    assert residual < 1e-3 * ds["stein_residual_stderr"].max()
    assert float(np.abs(ds["stein_residual_uncorrected"]).max()) > 0
    covariance = model.stationary_covariance()
    propagator = np.stack([expm(-model.gamma * t) for t in ds["time"].values])  # (lag, d, d)
    for c in range(2):
        slope_means = _gaussian_slope_means(record, c, covariance[c, c], "cubic")
        truth = propagator[:, c, None, :] * slope_means[None, :, None]  # (lag, bin, j)
        for name in ("response_exact", "response"):
            labelled = kelr_dist.distribution_response(ds, f"x{c + 1}", name=name)
            h = record["bin_width"][c]
            error = labelled["response"].values - truth / h
            assert np.all(np.abs(error) <= 4 * labelled["response_stderr"].values + 1e-4), name
            k = ds[name].values[:, c * 20 : (c + 1) * 20]
            np.testing.assert_allclose(k.sum(axis=1), 0.0, atol=1e-13)
    # the equilibrium PDF on the grid is the Gaussian's, smoothed by the bins
    labelled = kelr_dist.distribution_response(ds, "x1")
    assert labelled["bin"].values[0] >= x[:, 0].min() and labelled.sizes["bin"] == 20
    # the estimate's total error bars come with it, per bin
    assert labelled["response_total_stderr"].dims == ("lag", "bin", "j")
    assert (labelled["response_total_stderr"] >= labelled["response_stderr"]).all()
    np.testing.assert_allclose((labelled["equilibrium"] * record["bin_width"][0]).sum(), 1.0)

    # the predicted PDF integrates to 1; a forcing far beyond the linear regime goes negative
    # and says so (kept, not clipped)
    times = ds["time"].values[:30]
    with warnings.catch_warnings():
        warnings.simplefilter("error", LinearRegimeWarning)
        small = kelr_dist.predict_distribution(
            ds, kelr_dist.step(0.05, times, j="x1"), component="x1", name="response_exact"
        )
    np.testing.assert_allclose(small["integral"].values, 1.0, atol=1e-12)
    assert np.isnan(small.attrs["negative_from_time"]) and not small["negative"].any()
    assert np.all(small["stderr"].values[1:] > 0)
    with pytest.warns(LinearRegimeWarning, match="goes negative from time"):
        large = kelr_dist.predict_distribution(
            ds, kelr_dist.step(20.0, times, j="x1"), component="x1"
        )
    assert large["negative"].any() and large["pdf"].min() < 0
    # the report draws one distribution figure per forced component
    written = {p.name: p for p in write_figures(ds, tmp_path)}
    for j in ("x1", "x2"):
        assert written[f"distribution_{j}.png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert large.attrs["negative_from_time"] == float(
        large["time"][large["negative"].any("bin")].min()
    )


def test_ou_moment_responses(ou):
    """Centred moments: ``δE[X - μ] = δμ``, ``δE[(X - μ)²] = 0`` (the variance does not move),
    ``δE[(X - μ)³] = 3 C δμ``, ``δE[(X - μ)⁴] = 0`` for the Gaussian, per unit forcing."""
    model, x = ou
    ds = kelr_dist.estimate_response(
        x, dt=model.dt, observable="moments", max_time=2.0, score=model.score,
        estimator="score-matching", degree=1, client="synchronous",
    )  # fmt: skip
    covariance = model.stationary_covariance()
    propagator = np.stack([expm(-model.gamma * t) for t in ds["time"].values])
    for c in range(2):
        labelled = kelr_dist.distribution_response(ds, f"x{c + 1}", name="response_exact")
        assert labelled["moment"].values.tolist() == [1.0, 2.0, 3.0, 4.0]
        factor = np.array([1.0, 0.0, 3.0 * covariance[c, c], 0.0])
        truth = propagator[:, c, None, :] * factor[None, :, None]
        error = np.abs(labelled["response"].values - truth)
        assert np.all(error <= 4 * labelled["response_stderr"].values + 1e-3)


def test_ou_exceedance_responses(ou):
    """Smooth exceedances ``Φ((x - x_q)/w)`` at the data's quantiles: for the shifted Gaussian,
    ``k(t) = expm(-Γ t)_cj E[φ_w(X_c - x_q)]``, a Gaussian density of variance ``C_cc + w²`` at
    ``x_q``; the thresholds are the data's quantiles."""
    model, x = ou
    ds = kelr_dist.estimate_response(
        x, dt=model.dt, observable="exceedance(quantiles=0.05,0.5,0.9)", max_time=2.0,
        score=model.score, estimator="score-matching", degree=1, client="synchronous",
    )  # fmt: skip
    covariance = model.stationary_covariance()
    propagator = np.stack([expm(-model.gamma * t) for t in ds["time"].values])
    for c in range(2):
        labelled = kelr_dist.distribution_response(ds, f"x{c + 1}", name="response_exact")
        thresholds = labelled["threshold"].values
        np.testing.assert_allclose(thresholds, np.quantile(x[:, c], [0.05, 0.5, 0.9]), atol=2e-3)
        width = labelled.attrs["width"]
        np.testing.assert_allclose(width, 0.05 * x[:, c].std())
        variance = covariance[c, c] + width**2
        slope = np.exp(-0.5 * thresholds**2 / variance) / np.sqrt(2 * np.pi * variance)
        truth = propagator[:, c, None, :] * slope[None, :, None]
        error = np.abs(labelled["response"].values - truth)
        assert np.all(error <= 4 * labelled["response_stderr"].values + 1e-3)
        np.testing.assert_allclose(labelled["equilibrium"].values, [0.95, 0.5, 0.1], atol=2e-3)


def test_moments_by_every_route(tmp_path, capsys, monkeypatch):
    """Python, ``kelr estimate --observable moments`` and a job file give the same result."""
    from kelr_dist.edges.cli import main

    simulate("ou", tmp_path / "ou.zarr", 20000, chunk=5000, progress=False)
    common = {"order": 4, "max_order": 6, "max_lag": 20, "exact": True}
    python = kelr_dist.estimate_response(
        tmp_path / "ou.zarr", observable="moments", client="synchronous", **common
    )
    monkeypatch.chdir(tmp_path)
    argv = ["estimate", "ou.zarr", "cli.zarr", "--observable", "moments", "--order", "4",
            "--max-order", "6", "--max-lag", "20", "--exact", "--scheduler", "synchronous",
            "-q"]  # fmt: skip
    with pytest.raises(SystemExit) as exit_info:
        main.main(argv, prog_name="kelr")
    assert exit_info.value.code == 0, capsys.readouterr().err
    (tmp_path / "job.yaml").write_text(
        textwrap.dedent(
            """
            input: {store: ou.zarr}
            basis: {order: 4, max_order: 6}
            observable: moments
            lags: {max_lag: 20}
            baselines: {exact: true}
            outputs: {result: job.zarr}
            cluster: {scheduler: synchronous}
            """
        )
    )
    with pytest.raises(SystemExit) as exit_info:
        main.main(["run", "job.yaml", "-q"], prog_name="kelr")
    assert exit_info.value.code == 0, capsys.readouterr().err
    for out in ("cli.zarr", "job.zarr"):
        result = xr.open_zarr(tmp_path / out, consolidated=False).load()
        assert result.attrs["observable"] == "moments"
        assert result["i"].values.tolist() == python["i"].values.tolist()
        for name in ("response", "response_exact", "response_stderr"):
            np.testing.assert_allclose(result[name].values, python[name].values, rtol=1e-10)
        labelled = kelr_dist.distribution_response(result, "x2")
        assert labelled["moment"].values.tolist() == [1.0, 2.0, 3.0, 4.0]
    with pytest.raises(ValueError, match="observable='pdf'"):
        kelr_dist.predict_distribution(
            python, kelr_dist.step(1.0, python["time"].values[:5], j="x1"), component="x1"
        )


def test_the_distribution_figure_explains_its_step_and_names_its_time_unit(ou):
    """The predicted PDFs' panel says what ``δf`` is (a step of forcing on the forced
    component, sized to keep every PDF's move within a quarter of its peak) and the time axis
    names its unit, the data's own when the result records none."""
    from kelr_dist.edges.distribution_plot import plot_distribution

    model, x = ou
    ds = kelr_dist.estimate_response(
        x[:20_000], dt=model.dt, observable="pdf(bins=10)", max_lag=10, score=model.score,
        estimator="score-matching", degree=1, client="synchronous",
    )  # fmt: skip
    fig = plot_distribution(ds, "x1")
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert titles and all("after a step of forcing" in t and "on x1" in t for t in titles)
    assert all("each PDF moves ≤ 25% of its peak" in t for t in titles)
    labels = [ax.get_xlabel() for ax in fig.axes if ax.get_xlabel().startswith("time")]
    assert labels == ["time since the step (the data's time unit)"] * 2
