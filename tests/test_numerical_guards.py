"""Numerical guards: collinear components refused in read 1, the affine Stein correction solved
like score matching's normal equations, ill-conditioned Gram matrices reported."""

import warnings

import numpy as np
import pytest

from kelr_dist import ConditioningWarning, estimate_response
from kelr_dist.kernels.response.stein_correction import affine_fit
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
