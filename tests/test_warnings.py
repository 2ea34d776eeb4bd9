"""Truth-free warnings (truncation, bias, non-finite values), and silence where all is well."""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest

from kelr_dist import estimate_response
from kelr_dist.kernels.bases.families import Coordinate, Hermite, TensorBasis
from kelr_dist.kernels.reduction import reduce_in_memory
from kelr_dist.kernels.response.operator import (
    DensityScore,
    Observable,
    constant_forcing,
    identity_observable,
    response_reduction,
)
from kelr_dist.kernels.scores.folds import Folds
from kelr_dist.kernels.scores.kernel_embedding import KernelDensity
from kelr_dist.kernels.scores.score_matching import (
    RCOND,
    PolynomialFeatures,
    ScaledGram,
    ScoreModel,
    gram_reduction,
    gram_sums,
    solve_weights,
)
from kelr_dist.models.registry import make_model
from kelr_dist.pipeline.steps import choose_score_matching, score_matching_truncation
from kelr_dist.pipeline.warnings import (
    STEIN_TOLERANCE,
    BiasWarning,
    SensitivityWarning,
    stein_threshold,
)

#: a sampler exact in law at a coarse step (MALA), for the warnings that need only the
#: stationary law: 30 times fewer steps than curved-wells' default
COARSE = {"curved-wells": {"step": 0.03, "subsample": 10}}


def sample(name: str, n: int, seed: int = 5) -> tuple[np.ndarray, object]:
    model = make_model(name, **COARSE.get(name, {}))
    rng = np.random.default_rng(seed)
    state = model.initial_state(rng)
    _, state = model.advance(state, model.default_burn_in, rng)
    return model.advance(state, n, rng)[0], model


def estimate(x, model, **options):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds = estimate_response(x, dt=model.dt, client="synchronous", **options)
    return ds, [w for w in caught if issubclass(w.category, UserWarning)]


def test_silent_on_ou():
    """Exact OU samples: no warning of any kind, and none recorded."""
    x, model = sample("ou", 50_000)
    ds, caught = estimate(x, model, score=model.score, exact=True, max_lag=50)
    assert [str(w.message) for w in caught] == []
    assert ds.attrs["warnings"] == ""
    assert ds.attrs["nonfinite_rejection"] == 0.0


@pytest.mark.parametrize(("system", "binds"), [("trig-4d", True), ("ou", False)])
def test_truncation_when_the_degree_budget_binds(system, binds):
    """Score matching given features up to degree 3: on four coordinates tied by a sine and a
    cosine it takes the largest degree, its held-out loss still falling, and the truncation says
    by how much and names the knob with its cost; on OU (a linear score) it does not bind."""
    x, _ = sample(system, 100_000)
    coords = tuple(
        Coordinate(Hermite(1.0), float(x[:, k].mean()), float(x[:, k].std()))
        for k in range(x.shape[1])
    )
    folds = Folds(4, 1, x.shape[0])
    sums = reduce_in_memory(gram_reduction(PolynomialFeatures(coords, 3), folds), x, 25_000)
    choice = choose_score_matching(sums)
    truncation = score_matching_truncation(choice, x.shape[0])
    assert (truncation is not None) == binds
    if binds:
        assert choice.degree == 3 and truncation.drop > truncation.drop_stderr > 0
        assert "degree=4 raises it" in truncation.message
        assert "MiB" in truncation.message and "standard errors" in truncation.message


def test_bias_warns_for_a_nonlinear_observable():
    """The Gaussian score (degree 1) of a three-well density with A = x²: the Stein correction
    refits it on the squares, so their lag-0 identity holds, and the residual before the refit
    says how poor the score was."""
    x, model = sample("curved-wells", 100_000)
    ds, caught = estimate(x, model, estimator="score-matching", degree=1, observable="square",
                          max_lag=20)  # fmt: skip
    assert ds.attrs["stein_correction"] == "observable"
    found = [str(w.message) for w in caught if w.category is BiasWarning]
    assert found and "total standard errors" in found[0]
    # the entry named as the result names it
    assert re.search(r"residual of x[12]\^2 forced on x[12] was [0-9]+% of k\(0\)", found[0])
    assert "BiasWarning: " + found[0] in ds.attrs["warnings"].splitlines()
    ratio = np.abs(ds["stein_residual_uncorrected"] / ds["stein_residual_total_stderr"])
    assert float(ratio.max()) > 3
    assert float(np.abs(ds["stein_residual"] / ds["stein_residual_total_stderr"]).max()) < 1e-6


def test_sensitivity_warns_when_one_more_degree_moves_the_response():
    """A three-well density fitted by a quadratic score (a given degree 2): the cubic, fitted
    beside it, follows it much better, the response moves by many error bars between them, and
    the warning says so and is recorded, with the move kept in ``response_model_shift``."""
    x, model = sample("curved-wells", 100_000)
    ds, caught = estimate(x, model, estimator="score-matching", degree=2, max_lag=20)
    found = [str(w.message) for w in caught if w.category is SensitivityWarning]
    assert found and "degree 2 -> 3; + 64 random Fourier features" in found[0]
    # the entry by its names and the lag as a time in the data's unit, and the rule in words
    assert re.search(r"\(x1 forced on x1 at time [0-9.]+\)", found[0])
    assert "more than the 1 a model that follows the score moves by" in found[0]
    assert "SensitivityWarning: " + found[0] in ds.attrs["warnings"].splitlines()
    moved = np.abs(ds["response_model_shift"]) / ds["response_total_stderr"]
    assert float(moved.max()) == pytest.approx(ds.attrs["model_sensitivity"])
    assert ds.attrs["model_sensitivity"] > 1
    assert ds.attrs["model_neighbour"] == "degree 2 -> 3; + 64 random Fourier features"


def nan_every_thousandth(x: np.ndarray) -> np.ndarray:
    out = -np.array(x, dtype=float)
    out[::1000] = np.nan
    return out


def nan_observable(x: np.ndarray) -> np.ndarray:
    return np.where(x > 3.5, np.inf, x)


def nan_forcing(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    c = np.ones_like(x)
    c[x[:, 0] < -3.5] = np.nan
    return c, np.zeros_like(x)


@pytest.mark.parametrize(
    ("option", "kind", "name"),
    [
        ({"score": nan_every_thousandth, "exact": True}, "score function", "nan_every_thousandth"),
        ({"observable": Observable(("a1", "a2"), nan_observable)}, "observable", "nan_observable"),
        ({"forcing": nan_forcing}, "forcing", "nan_forcing"),
    ],
)
def test_non_finite_user_functions_are_refused(option, kind, name):
    """A score, observable or forcing that returns NaN or inf on some rows is refused, naming the
    function and the first offending row (never an all-NaN response)."""
    x, model = sample("ou", 20_000)
    with pytest.raises(ValueError, match=rf"the {kind} \S*{name} returned a non-finite") as err:
        estimate(x, model, estimator="score-matching", max_lag=10, **option)
    assert "time index" in str(err.value) and "chain 0" in str(err.value)


def test_non_finite_density_is_counted_apart_from_low_density():
    """Rows where ``p_M`` is NaN get ``B = 0`` and are counted as non-finite, not as rejected."""
    rng = np.random.default_rng(2)
    x = rng.normal(size=(2000, 1))
    basis = TensorBasis((Coordinate(Hermite(1.0)),), 4, "total")
    density = KernelDensity.fit(basis, x)
    coefficients = density.coefficients.copy()
    coefficients[3] = np.nan
    broken = KernelDensity(basis, coefficients, density.variances, density.n)
    names = ("x",)
    result = reduce_in_memory(
        response_reduction(
            {"ke": DensityScore(broken, 4, 1e-6)},
            identity_observable(names),
            constant_forcing(names),
            3,
        ),
        x,
    )["ke"]
    assert result.nonfinite == 2000 and result.kept == 0
    assert result.rejection == 0.0 and result.nonfinite_rejection == 1.0
    assert np.all(result.mean == 0.0)


def test_gram_scaling_keeps_the_directions_of_a_heavy_tailed_sample():
    """Student-t (ν = 5) features of degree 14: the raw Gram matrix keeps a handful of directions
    above RCOND of its largest eigenvalue, the Jacobi-scaled one many more; the fit keeps the
    sample Stein identity ``Ê[x sᵀ] = -I`` (the linear features stay in the span)."""
    rng = np.random.default_rng(0)
    x = rng.standard_t(5, size=(100_000, 2))
    x[:, 1] = 0.6 * x[:, 0] + 0.8 * x[:, 1]
    coords = tuple(Coordinate(Hermite(1.0), 0.0, float(np.std(x[:, k]))) for k in range(2))
    features = PolynomialFeatures(coords, 14)
    sums = gram_sums(features, x)
    gram, b = sums["gram"] / sums["n"], sums["b"] / sums["n"]
    raw = np.linalg.eigvalsh(gram)
    raw_kept = int((raw > RCOND * raw[-1]).sum())
    scaled_kept = int(ScaledGram.of(gram).kept.sum())
    assert scaled_kept >= 4 * raw_kept, (raw_kept, scaled_kept)
    (weights,) = solve_weights(gram, b, (0.0,))
    score, _ = ScoreModel(features, weights)(x)
    np.testing.assert_allclose(x.T @ score / len(x), -np.eye(2), atol=1e-6)


def _bias_warned(model_name: str, seed: int) -> bool:
    """Whether a score-matching degree-1 PDF estimate (80 bins per forcing, no Stein
    correction) of ``model_name`` at 20 000 samples raises a BiasWarning."""
    model = make_model(model_name)
    rng = np.random.default_rng(seed)
    x = model.advance(model.initial_state(rng), 20_000, rng)[0]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        estimate_response(
            x, dt=model.dt, estimator="score-matching", degree=1, observable="pdf", max_lag=5,
            stein_correction=False, client="synchronous", progress=False,
        )  # fmt: skip
    return any(issubclass(w.category, BiasWarning) for w in caught)


@pytest.mark.slow
def test_bias_warning_is_family_wise_over_many_entries() -> None:
    """OU's score is linear, so degree-1 score matching estimates it without bias: its 160
    lag-0 Stein residuals are noise, and the family-wise threshold (about 4.3 standard errors
    for 160 entries) warns on at most one of 30 seeds (a fixed 3 warned on about one seed in
    eight). The triple-well's score is not linear: the same estimate is biased and warns."""
    assert stein_threshold(1) == pytest.approx(STEIN_TOLERANCE)
    assert stein_threshold(160) == pytest.approx(4.30, abs=0.01)
    false_alarms = sum(_bias_warned("ou", seed) for seed in range(30))
    assert false_alarms <= 1
    assert all(_bias_warned("triple-well", seed) for seed in range(2))
