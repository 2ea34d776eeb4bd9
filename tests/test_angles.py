"""Angles: wrapped coordinates found in the data (and only there), a declared period, the lag-0
identity on a circle with its boundary term, the same answer in degrees, any chunking, and a
wrapped process whose response is known without samples."""

import json
import math
import warnings

import numpy as np
import pytest
import xarray as xr
from scipy.linalg import expm
from scipy.special import i0, i1

from kelr_dist import EdgeWarning, estimate_response
from kelr_dist.kernels.bases.coordinates import fit_basis, periodicity
from kelr_dist.kernels.bases.families import Fourier
from kelr_dist.kernels.observables.builtin import Angles, WrappedJacobian
from kelr_dist.kernels.reduction import reduce_in_memory
from kelr_dist.kernels.response.operator import (
    FunctionScore,
    Observable,
    constant_forcing,
    response_reduction,
)
from kelr_dist.kernels.survey.moments import edge_reduction, moments_reduction, wrap_reduction
from kelr_dist.models.registry import MODEL_NAMES, make_model
from kelr_dist.pipeline.options import EstimateOptions, checked
from kelr_dist.testing import DegreesScore, degrees


def samples(name: str, n: int, seed: int = 7, **params) -> np.ndarray:
    model = make_model(name, **params)
    rng = np.random.default_rng(seed)
    state = model.initial_state(rng)
    burn = min(model.default_burn_in, 5_000)
    _, state = model.advance(state, burn, rng)
    return model.advance(state, n, rng)[0]


def periodic_of(x: np.ndarray, spec="auto", declared=None):
    moments = reduce_in_memory(moments_reduction(), x)
    return periodicity(moments, spec, reduce_in_memory(wrap_reduction(), x), declared)


@pytest.fixture(scope="module")
def torus() -> np.ndarray:
    return samples("torus", 60_000)


def test_wrapped_angles_are_found_in_radians_and_degrees(torus):
    for x, period, loc in [
        (torus, 2 * math.pi, -math.pi),
        (degrees(torus), 360.0, 0.0),  # [0, 360)
        (np.degrees(torus), 360.0, -180.0),  # [-180, 180]
    ]:
        found = periodic_of(x)
        assert [p.period for p in found] == pytest.approx([period, period])
        assert [p.loc for p in found] == pytest.approx([loc, loc])
        assert all("wrapped" in p.reason for p in found)
        coordinates = fit_basis(x)
        assert all(isinstance(c.family, Fourier) for c in coordinates)
        assert coordinates[0].period == pytest.approx(period)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_no_detection_on_the_systems_on_the_line(name):
    model = make_model(name)
    if hasattr(model, "angles"):  # the systems with angles: those and only those
        found = periodic_of(samples(name, 30_000))
        angles = model.angles
        assert [p is not None for p in found] == [True] * angles + [False] * (len(found) - angles)
        return
    assert periodic_of(samples(name, 30_000)) == [None] * len(model.components)


@pytest.mark.parametrize("chunks", [None, 1, 7, [3, 1, 400, 96]])
def test_wrap_statistics_count_every_step_within_a_chain_in_any_chunking(chunks):
    """The steps across block boundaries are counted from the blocks' end rows: the same
    statistics for any blocks as for the whole chains, and no step between two chains."""
    rng = np.random.default_rng(8)
    x = np.mod(np.cumsum(rng.normal(0.0, 0.9, (2, 500, 2)), axis=1), 2 * np.pi)
    x[1, 0] += 100.0  # a chain's first sample far from the other chain's last: no step there
    got = reduce_in_memory(wrap_reduction(), x, chunks)
    steps = np.abs(np.diff(x, axis=1))  # (chains, n - 1, d)
    jumps = steps > np.pi
    assert got.steps.tolist() == [2 * 499, 2 * 499]
    assert got.jumps[:, 0].tolist() == jumps.sum(axis=(0, 1)).tolist()
    arcs = np.where(jumps, 2 * np.pi - steps, steps) ** 2
    np.testing.assert_allclose(got.step_rms[:, 0], np.sqrt(arcs.mean(axis=(0, 1))), rtol=1e-12)


def test_no_detection_on_a_fast_unwrapped_process_in_an_angle_window():
    rng = np.random.default_rng(1)
    fast = rng.normal(0.0, 0.6, size=(200_000, 1))  # independent samples, all within (-π, π]
    assert np.abs(fast).max() < math.pi
    moments = reduce_in_memory(moments_reduction(), fast)
    wraps = reduce_in_memory(wrap_reduction(), fast)
    assert wraps.jumps[0, 0] > 0  # it does step by more than π now and then ...
    assert periodicity(moments, "auto", wraps) == [None]  # ... but not by nearly 2π
    # a bounded coordinate whose density vanishes at its edges, scaled into [0, 360)
    bounded = 180.0 + 170.0 * np.sin(np.cumsum(rng.normal(0, 0.3, 200_000)))[:, None]
    assert periodic_of(bounded) == [None]


def test_a_declared_period_and_a_declared_line_override_detection(torus):
    # a spec entry wins: hermite keeps a wrapped angle on the line, fourier declares a period
    found = periodic_of(torus, "hermite,fourier(period=6.283185307179586)")
    assert found[0] is None and found[1].reason == "declared by the basis spec"
    # the 'periods' attribute: a period without any jump, 0 to keep a wrapped angle on the line
    smooth = 0.5 * torus  # no jumps: never found, but declared
    found = periodic_of(smooth, declared=[2 * math.pi, 0.0])
    assert found[0].period == pytest.approx(2 * math.pi) and "attribute" in found[0].reason
    assert periodic_of(torus, declared=[None, 0.0])[1] is None


def test_the_options_accept_the_keyword_and_the_observable():
    options = checked(
        EstimateOptions, {"basis": "fourier(period=360),auto", "observable": "angles"}
    )
    assert options.basis == "fourier(period=360),auto"
    assert options.function_names()["observable"] == "angles"
    with pytest.raises(ValueError, match="period > 0"):
        checked(EstimateOptions, {"basis": "fourier(period=0)"})


def test_wrap_statistics_and_the_response_pass_do_not_depend_on_the_chunking(torus):
    chains = torus[:48_000].reshape(2, 24_000, 2)
    first = reduce_in_memory(wrap_reduction(), chains, 5_000)
    other = reduce_in_memory(wrap_reduction(), chains, 7_777)
    assert np.array_equal(first.jumps, other.jumps) and np.array_equal(first.steps, other.steps)
    np.testing.assert_allclose(first.step_rms, other.step_rms, rtol=1e-12)
    score = FunctionScore(make_model("torus").score)
    periods = np.full(2, 2 * math.pi)
    names = ("phi", "psi")
    observable = Observable(names, None, WrappedJacobian((2 * math.pi,) * 2, (-math.pi,) * 2, 0.1))
    reduction = response_reduction(
        {"exact": score}, observable, constant_forcing(names), 20, corrected=["exact"],
        periods=periods,
    )  # fmt: skip
    a = reduce_in_memory(reduction, chains, 5_000)["exact"]
    b = reduce_in_memory(reduction, chains, 7_777)["exact"]
    np.testing.assert_allclose(a.mean, b.mean, rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(a.stein_residual, b.stein_residual, rtol=1e-10, atol=1e-13)


def spectral_response(kappa: float, mu: float, observable: str, times: np.ndarray) -> np.ndarray:
    """``k(t)`` of the von Mises diffusion ``dθ = -κ sin(θ - μ) dt + √2 dW`` to a constant
    forcing, without samples: ``E_p[(e^{tL} A)(θ) B(θ)]``, ``B = κ sin(θ - μ)``, with the
    generator ``L e^{ikθ} = -k² e^{ikθ} - (κk/2)(e^{-iμ} e^{i(k+1)θ} - e^{iμ} e^{i(k-1)θ})`` on
    the modes ``|k| ≤ K``; ``(times, q)``."""
    modes = np.arange(-128, 129)  # B is smooth: the modes beyond add nothing to E[u_t B]
    size = modes.size
    generator = np.diag(-(modes**2).astype(complex))
    for col, k in enumerate(modes):
        if col + 1 < size:
            generator[col + 1, col] = -0.5 * kappa * k * np.exp(-1j * mu)
        if col > 0:
            generator[col - 1, col] = 0.5 * kappa * k * np.exp(1j * mu)
    if observable == "identity":  # the sawtooth θ on (-π, π]: a_k = i (-1)^k / k
        coefficients = [np.where(modes == 0, 0, 1j * (-1.0) ** modes / np.where(modes, modes, 1))]
    else:  # cos θ, sin θ
        coefficients = [(modes == 1) * 0.5 + (modes == -1) * 0.5]
        coefficients += [(modes == 1) * -0.5j + (modes == -1) * 0.5j]
    grid = np.linspace(-math.pi, math.pi, 4096, endpoint=False)
    density = np.exp(kappa * np.cos(grid - mu))
    density /= density.mean() * 2 * math.pi
    weight = density * kappa * np.sin(grid - mu) * (2 * math.pi / grid.size)
    projection = np.exp(1j * np.outer(modes, grid)) @ weight  # E_p[e^{ikθ} B]
    step = expm((times[1] - times[0]) * generator)  # equally spaced times from 0
    out = np.empty((times.size, len(coefficients)))
    for i, a in enumerate(coefficients):
        u = np.asarray(a, dtype=complex)
        for n in range(times.size):
            out[n, i] = np.real(u @ projection)
            u = step @ u
    return out


@pytest.mark.parametrize("observable", ["identity", "angles"])
def test_a_wrapped_process_with_a_known_response(observable):
    model = make_model("circle")
    x = samples("circle", 200_000)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = estimate_response(
            x, dt=model.dt, max_lag=25, observable=observable, client="synchronous", max_order=24
        )
    truth = spectral_response(model.kappa, model.mu, observable, ds["time"].values)
    if observable == "identity":
        wrap = (
            2
            * math.pi
            * math.exp(-model.kappa * (1 + math.cos(model.mu)))
            / (2 * math.pi * np.i0(model.kappa) * math.exp(-model.kappa))
        )
        assert truth[0, 0] == pytest.approx(1.0 - wrap, abs=1e-3)  # 1 - 2π p(±π), not 1
        assert truth[0, 0] < 0.8
    estimate = ds["response"].values[:, :, 0]
    stderr = ds["response_stderr"].values[:, :, 0]
    assert np.all(np.abs(estimate - truth) <= 4 * stderr + 0.01)
    assert ds.attrs["basis"].startswith("fourier(")
    assert "x1" in ds.attrs["periodic"]
    # the lag-0 self-check holds on the circle (with the wrap's boundary term for the angle)
    ratio = np.abs(ds["stein_residual"] / ds["stein_residual_stderr"]).max()
    assert float(ratio) < 3.0 or observable == "angles"


@pytest.mark.parametrize("observable", ["identity", "angles"])
def test_the_same_data_in_degrees_gives_the_same_answer(torus, observable):
    x = torus[:30_000]
    # the identity: the same window (-180, 180], so the same wrapped observable; the angles:
    # another window [0, 360) too (cos and sin do not see where the values wrap)
    in_degrees = np.degrees(x) if observable == "identity" else degrees(x)
    common = {"max_lag": 10, "client": "synchronous", "observable": observable, "max_order": 16}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        radians = estimate_response(x, score=make_model("torus").score, exact=True, **common)
        other = estimate_response(
            in_degrees, score=DegreesScore(make_model("torus")), exact=True, **common
        )
    unit = 1.0 if observable == "identity" else math.pi / 180.0  # B is per degree
    for name in ("response", "response_exact"):
        difference = np.abs(other[name].values - unit * radians[name].values)
        assert np.all(difference <= 0.01 * unit * radians[f"{name}_stderr"].values + 1e-12)
    assert radians.attrs["estimator"] == other.attrs["estimator"]


def test_angles_observable_and_its_derivative():
    x = np.array([[0.3, 90.0, 2.0]])
    angles = Angles((2 * math.pi, 360.0, 0.0))
    np.testing.assert_allclose(
        angles(x), [[math.cos(0.3), math.sin(0.3), 0.0, 1.0, 2.0]], atol=1e-15
    )
    step = 1e-6
    numeric = (angles(x + [[step, 0, 0]]) - angles(x - [[step, 0, 0]])) / (2 * step)
    np.testing.assert_allclose(angles.derivative(x)[0, :, 0], numeric[0], atol=1e-8)


def test_the_wrap_kernel_has_unit_mass():
    jacobian = WrappedJacobian((360.0,), (0.0,), 0.05)
    x = np.linspace(-180, 180, 20001)[:-1, None]
    # 1 - J = P K: its mean over one period is ∫ K dx
    assert (1.0 - jacobian(x)[:, 0, 0]).mean() == pytest.approx(1.0, rel=1e-9)


def test_a_store_attribute_declares_the_periods(torus):
    smooth = xr.DataArray(
        0.5 * torus[:20_000], dims=("time", "component"), coords={"component": ["a", "b"]},
        attrs={"dt": 0.15, "periods": {"a": 2 * math.pi}},
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = estimate_response(smooth, max_lag=5, client="synchronous", estimator="score-matching")
    assert set(json.loads(ds.attrs["periodic"])) == {"a"}
    assert ds.attrs["basis"].startswith("fourier(")


def reflected_ou(n: int, seed: int = 0) -> np.ndarray:
    """An Ornstein-Uhlenbeck process reflected at 0 (its density does not vanish there)."""
    rng = np.random.default_rng(seed)
    noise = rng.normal(size=n) * math.sqrt(2 * 0.01)
    out = np.empty(n)
    out[0] = 1.0
    for i in range(1, n):
        out[i] = abs(out[i - 1] - 0.01 * (out[i - 1] - 0.5) + noise[i])
    return out[:, None]


def test_hard_edges_are_found_and_vanishing_ones_are_not():
    wall = reduce_in_memory(edge_reduction(), reflected_ou(100_000))
    assert wall.hard().tolist() == [[True, False]]
    at_a_value = np.clip(reflected_ou(50_000, 1), None, 1.2)  # data clipped at 1.2
    assert reduce_in_memory(edge_reduction(), at_a_value, 7_000).hard().tolist() == [[True, True]]
    for name in ("wall", "ou", "triple-well"):  # densities that vanish at the data's edges
        assert not reduce_in_memory(edge_reduction(), samples(name, 100_000)).hard().any()


def test_a_hard_edge_on_the_line_is_warned_in_one_line():
    with pytest.warns(EdgeWarning, match="lower edge") as caught:
        ds = estimate_response(
            reflected_ou(40_000), max_lag=5, client="synchronous", estimator="score-matching"
        )
    message = next(str(w.message) for w in caught if w.category is EdgeWarning)
    assert "\n" not in message and "do not hold" in message
    # recorded with the result like every other warning, so that the report shows it
    assert "EdgeWarning: " + message in ds.attrs["warnings"].splitlines()


def test_job_files_and_the_command_line_take_the_period_and_the_observable(tmp_path):
    from click.testing import CliRunner

    from kelr_dist.edges.cli import main
    from kelr_dist.edges.jobfile import parse_job

    document = {
        "input": {"store": "dihedrals.zarr"},
        "outputs": {"result": "result.zarr"},
        "basis": {"spec": "fourier(period=360),fourier(period=360)"},
        "observable": "angles",
    }
    job = parse_job(document, tmp_path / "job.yaml")
    assert job.options.basis == "fourier(period=360),fourier(period=360)"
    assert job.options.observable_for(["phi", "psi"]).names == ("phi", "psi")
    bad = {**document, "basis": {"spec": "fourier(period=0)"}}
    with pytest.raises(ValueError, match="basis.spec: .*period > 0"):
        parse_job(bad, tmp_path / "job.yaml")
    help_text = " ".join(CliRunner().invoke(main, ["estimate", "--help"]).output.split())
    assert "'angles' ((cos, sin) of the periodic components" in help_text
    refused = CliRunner().invoke(
        main, ["estimate", "x.zarr", "y.zarr", "--basis", "fourier(period=-1)"]
    )
    assert refused.exit_code == 2 and "period > 0" in refused.output


def blocked_stderr_of_the_mean(values: np.ndarray) -> float:
    """The block-averaging standard error of the mean of ``values (n,)`` (one chain)."""
    from kelr_dist.kernels.reduction import BlockInfo
    from kelr_dist.kernels.response.blocking import block_standard_error, response_block_partial

    info = BlockInfo(0, 0, values.size, values.size)
    partial = response_block_partial(values[:, None], np.ones((values.size, 1)), 0, info)
    return float(block_standard_error(partial).stderr[0, 0, 0])


def test_the_lag0_error_bar_of_an_angle_includes_the_error_of_its_mean():
    """With ``observable="angles"`` the Stein correction makes ``k_{sin θ, θ}(0)`` the sample
    mean of ``cos θ`` (Stein's identity on the circle): its error bar is at least that mean's
    block-averaged standard error, and over seeds the estimate stays within 4 of its error bars
    of the analytic ``E[cos θ] = I1(κ)/I0(κ) cos μ`` (von Mises)."""
    model = make_model("circle")
    concentration = i1(model.kappa) / i0(model.kappa)  # E[cos(θ - μ)]
    # k_{A,θ}(0) = E[A'(θ)]: E[-sin θ] and E[cos θ]
    truth = {
        "cos(x1)": -concentration * math.sin(model.mu),
        "sin(x1)": concentration * math.cos(model.mu),
    }
    z = []
    for seed in range(6):
        x = samples("circle", 50_000, seed=seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ds = estimate_response(
                x, dt=model.dt, max_lag=5, observable="angles", client="synchronous", max_order=24
            )
        lag0 = ds.isel(lag=0, j=0)
        assert ds.attrs["stein_correction"] == "affine"
        mean = float(lag0["response"].sel(i="sin(x1)"))
        np.testing.assert_allclose(mean, np.cos(x[:, 0]).mean(), rtol=1e-10)
        floor = blocked_stderr_of_the_mean(np.cos(x[:, 0]))
        assert float(lag0["response_stderr"].sel(i="sin(x1)")) >= 0.95 * floor
        for i, value in truth.items():
            z.append(
                (float(lag0["response"].sel(i=i)) - value)
                / float(lag0["response_total_stderr"].sel(i=i))
            )
    assert np.all(np.abs(z) < 4), z
