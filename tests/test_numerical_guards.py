"""Numerical guards: collinear components refused in read 1, the affine Stein correction solved
like score matching's normal equations, ill-conditioned Gram matrices reported."""

import warnings

import numpy as np
import pytest

from kelr_dist import ConditioningWarning, estimate_response
from kelr_dist.kernels.bases.families import Coordinate, Hermite, TensorBasis
from kelr_dist.kernels.response.stein_correction import affine_fit
from kelr_dist.kernels.scores.kernel_embedding import KernelDensity
from kelr_dist.kernels.scores.selection import convergence, windowed_max


def _ar1(n: int, d: int, seed: int = 0) -> np.ndarray:
    """An AR(1) series ``(n, d)`` with unit variance and coefficient 0.9 in each component."""
    rng = np.random.default_rng(seed)
    noise = rng.normal(size=(n, d)) * np.sqrt(1 - 0.81)
    x = np.zeros((n, d))
    for t in range(1, n):
        x[t] = 0.9 * x[t - 1] + noise[t]
    return x


@pytest.mark.parametrize("estimator", ["kernel-embedding", "score-matching"])
def test_a_collinear_component_is_refused_in_the_first_read_by_name(estimator: str) -> None:
    x1 = _ar1(5000, 1)[:, 0]
    x = np.stack([x1, 2.0 * x1 + 1.0], axis=1)
    with pytest.raises(ValueError, match=r"component 'x2': a linear combination of \['x1'\]"):
        estimate_response(x, client="synchronous", max_lag=3, estimator=estimator)


def test_a_nearly_collinear_component_among_three_is_named() -> None:
    x = _ar1(5000, 3)
    x[:, 2] = x[:, 0] - 3.0 * x[:, 1] + 1e-6 * x[:, 2]
    with pytest.raises(ValueError, match=r"'x3': a linear combination of \['x1', 'x2'\].*"
                       r"components=\['x1', 'x2'\]"):  # fmt: skip
        estimate_response(x, client="synchronous", max_lag=3, estimator="score-matching")


def test_the_affine_fit_of_a_singular_second_moment_is_the_minimum_norm_one() -> None:
    # y ~ N(0, 1) with features z = (y, 2y, 1) (E[z zᵀ] singular) and a score ŝ = -y / 2 that is
    # half the true one: the refit ŝ + V z is -y, V (z's weights) finite
    second = np.array([[1.0, 2.0, 0.0], [2.0, 4.0, 0.0], [0.0, 0.0, 1.0]])
    score_moment = np.array([[-0.5, -1.0, 0.0]])
    weights = affine_fit(score_moment, second, divergence=np.array([[1.0, 2.0, 0.0]]))
    assert np.all(np.isfinite(weights))
    np.testing.assert_allclose(weights @ [1.0, 2.0, 0.0], [-0.5], atol=1e-12)
    np.testing.assert_allclose(weights[:, 2], [0.0], atol=1e-12)


def test_an_ill_conditioned_gram_matrix_is_warned_about() -> None:
    # one component takes three values: its polynomials of degree 3 and up are collinear there
    x = _ar1(20000, 2)
    x[:, 1] = np.clip(np.round(x[:, 1]), -1, 1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ds = estimate_response(
            x, client="synchronous", max_lag=3, estimator="score-matching", degree=4
        )
    assert ds.attrs["gram_condition"] > 1e10
    assert any(issubclass(w.category, ConditioningWarning) for w in caught)
    assert "ConditioningWarning: score matching's Gram matrix" in ds.attrs["warnings"]


def test_a_nan_shell_norm_is_not_converged() -> None:
    # η at order 2 is not finite: orders 0..2 have an unknown later shell, not a vanishing one
    eta = np.array([1.0, 0.5, np.nan, 0.01, 0.01, np.nan])  # the last: the scan's end
    later_max, line = convergence(eta)
    assert line == pytest.approx(0.02)
    np.testing.assert_array_equal(later_max <= line, [False, False, False, True, True, True])
    # a NaN at the level the scan ends at leaves no order converged
    later_max, line = convergence(np.array([1.0, 0.5, 0.01, np.nan, np.nan]))
    assert not np.any(later_max <= line)


def test_a_nan_error_bound_is_never_the_least() -> None:
    np.testing.assert_array_equal(windowed_max(np.array([0.3, np.nan, 0.2, 0.1]), 0),
                                  [0.3, np.inf, 0.2, 0.1])  # fmt: skip


def _with_outlier(n: int = 20000, sigmas: float = 30.0) -> np.ndarray:
    x = _ar1(n, 2, seed=1)
    x[n // 2, 0] = sigmas
    return x


def test_a_beta_that_cannot_work_on_gaussian_tails_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"component 'x1': basis beta=3 cannot work"):
        estimate_response(
            _with_outlier(), client="synchronous", max_lag=3, estimator="kernel-embedding",
            basis="hermite(beta=3),hermite", order=10,
        )  # fmt: skip


def test_a_30_sigma_outlier_gives_a_finite_estimate_end_to_end() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = estimate_response(_with_outlier(), client="synchronous", max_lag=3)
    both = [name for name in ("response_kernel_embedding", "response_score_matching") if name in ds]
    for name in ["response", *both]:
        assert np.isfinite(ds[name].values).all(), name
    assert len(both) == 1


def test_overflowing_coefficient_integrands_are_refused_naming_coordinate_order_and_beta() -> None:
    x = _with_outlier()
    basis = TensorBasis((Coordinate(Hermite()), Coordinate(Hermite(beta=3.0))), 10)
    with pytest.raises(ValueError, match=r"coordinate 1 \(hermite\(beta=3\)\), order 0: its "
                       r"integrand is beyond float64 on 1 of the samples"):  # fmt: skip
        KernelDensity.fit(basis, x[:, ::-1])
    one = TensorBasis((Coordinate(Hermite(beta=1.4)),), 40)  # the recurrence without tables
    x[0, 0] = 70.0
    with pytest.raises(ValueError, match=r"coordinate 0 \(hermite\(beta=1.4\)\), order"):
        KernelDensity.fit(one, x[:, :1])


@pytest.mark.parametrize(
    ("y", "order", "weight"),
    [(100.0, 300, 0.0), (25.0, 100, -2.0), (1e3, 200, -1.0), (-40.0, 50, -3.0)],
)
def test_weighted_polynomials_are_never_nan(y: float, order: int, weight: float) -> None:
    values = Hermite().weighted_polynomials(np.array([y, -y, 0.0, 1.0]), order, weight)
    assert not np.isnan(values).any()
    assert np.isfinite(values[2:]).all()


@pytest.mark.parametrize("d", [1, 2])
def test_the_coefficient_variance_takes_both_moments_from_the_same_rows(d: int) -> None:
    # the rows of the variance's subsample (every 16th) are ±1, the others 5: the integrand y of
    # order 1 has variance 1 there; E[y] of all rows (4.75) with E[y²] of those would give 0
    x = np.full((1600, d), 5.0)
    x[::16, 0] = np.resize([1.0, -1.0], 100)
    if d == 2:
        x[:, 1] = np.random.default_rng(0).normal(size=1600)
    basis = TensorBasis(tuple(Coordinate(Hermite()) for _ in range(d)), 1)
    density = KernelDensity.fit(basis, x)
    first = np.flatnonzero((basis.indices[:, 0] == 1) & (basis.indices.sum(axis=1) == 1))[0]
    assert density.variances[first] == pytest.approx(1.0 / 1600)


@pytest.mark.parametrize(
    ("keywords", "message"),
    [
        ({"progress": "yes"}, r"^progress: expected true or false, got 'yes'$"),
        ({"n_workers": 0}, r"^n_workers: expected a positive integer, got 0$"),
        ({"client": 42}, r"^client: expected a distributed.Client, a scheduler address"),
        ({"client": "synchronous", "n_workers": 2},
         r"^n_workers applies to the embedded cluster only, not with client$"),
        ({"memory_limit": -5}, r"^memory_limit: expected a memory size"),
        ({"dt": float("nan")}, r"^dt: expected a positive finite number"),
    ],
)  # fmt: skip
def test_the_cluster_keywords_and_dt_are_validated_by_the_options_model(
    keywords: dict, message: str
) -> None:
    # refused before the trajectory is looked at (it is not even an array here)
    with pytest.raises(ValueError, match=message):
        estimate_response(object(), **keywords)


def test_the_adaptive_growth_starts_from_collinear_features_without_failing() -> None:
    # the kernel-level growth, given two identical components: the start set's Gram matrix is
    # singular, and its inverse is the guarded pseudo-inverse of score matching's solve
    from kelr_dist.kernels.reduction import reduce_in_memory
    from kelr_dist.kernels.scores.folds import Folds
    from kelr_dist.kernels.scores.index_sets import dictionary, grow
    from kelr_dist.kernels.scores.score_matching import gram_reduction

    x = _ar1(8000, 1)
    x = np.hstack([x, x])
    coordinates = tuple(Coordinate(Hermite(), float(c.mean()), float(c.std())) for c in x.T)
    features = dictionary(coordinates, 2, 30)
    sums = reduce_in_memory(gram_reduction(features, Folds(4, 1, len(x))), x, 4000)
    path = grow(sums, features.mask(1))
    assert np.isfinite(path.losses[0]).all()
