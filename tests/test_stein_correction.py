"""Affine Stein correction (score-matching refit of ŝ + V z̃): closed-form oracles, the lag-0
identity it restores, its chunking invariance and its gain on a biased score."""

import numpy as np
import pytest

from kelr_dist.kernels.baselines.quasi_gaussian import gaussian_score
from kelr_dist.kernels.reduction import reduce_in_memory
from kelr_dist.kernels.response.operator import (
    Forcing,
    FunctionScore,
    constant_forcing,
    identity_observable,
    response_reduction,
)
from kelr_dist.kernels.response.stein_correction import (
    FourierFeatures,
    affine_fit,
    augmented,
    corrected_response,
)
from kelr_dist.kernels.scores.refit import refit_reduction
from kelr_dist.models.registry import make_model

NAMES = ("x1", "x2")


def triple_well_samples(n: int, seed: int) -> tuple[object, np.ndarray]:
    model = make_model("triple-well")
    rng = np.random.default_rng(seed)
    return model, model.advance(model.initial_state(rng), n, rng)[0]


def test_affine_fit_of_no_score_is_the_gaussian_score():
    """ŝ = 0: the refit is the quasi-Gaussian score -Σ⁻¹(x - x̄) exactly."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5000, 3)) @ np.array([[1.0, 0.3, 0.0], [0.0, 2.0, 0.5], [0, 0, 0.7]])
    origin = x.mean(axis=0)
    z = augmented(x, origin)
    weights = affine_fit(np.zeros((3, 4)), z.T @ z / len(x))
    cov = np.cov(x.T, bias=True)
    np.testing.assert_allclose(weights[:, :3], -np.linalg.inv(cov), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(weights[:, 3], 0.0, atol=1e-12)


def test_affine_fit_leaves_an_affine_exact_score_unchanged():
    """ŝ already satisfies the sample Stein identity for affine test functions: V = 0."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4000, 2))
    origin = x.mean(axis=0)
    z = augmented(x, origin)
    score = gaussian_score(origin, np.cov(x.T, bias=True))(x)
    weights = affine_fit(score.T @ z / len(x), z.T @ z / len(x))
    np.testing.assert_allclose(weights, 0.0, atol=1e-10)


def test_corrected_response_is_linear_and_its_error_bound_adds():
    rng = np.random.default_rng(2)
    mean, stderr = rng.normal(size=(4, 2, 2)), rng.uniform(size=(4, 2, 2))
    lagged, lagged_stderr = rng.normal(size=(4, 2, 2, 3)), rng.uniform(size=(4, 2, 2, 3))
    weights = rng.normal(size=(2, 3))
    out, bound = corrected_response(mean, stderr, lagged, lagged_stderr, weights)
    for j in range(2):
        np.testing.assert_allclose(out[:, :, j], mean[:, :, j] - lagged[:, :, j] @ weights[j])
        np.testing.assert_allclose(
            bound[:, :, j], stderr[:, :, j] + lagged_stderr[:, :, j] @ np.abs(weights[j])
        )


def biased_score(model):
    """The true score, shrunk and shifted: a deliberately biased estimate."""

    def score(x):
        return 0.8 * model.score(x) + 0.1

    return score


@pytest.mark.parametrize("forcing", ["constant", "varying"])
def test_corrected_response_equals_the_response_of_the_refitted_score(forcing):
    """The correction from lagged sums = the response pass run with ŝ + V z̃ directly."""
    model, x = triple_well_samples(6000, 3)
    force = (
        constant_forcing(NAMES)
        if forcing == "constant"
        else Forcing(NAMES, lambda x: (1.0 + 0.1 * x**2, 0.2 * x))
    )
    origin = x.mean(axis=0)
    score = biased_score(model)
    scores = {"estimate": FunctionScore(score)}
    reduction = response_reduction(
        scores, identity_observable(NAMES), force, 30, corrected=["estimate"], origin=origin
    )
    result = reduce_in_memory(reduction, x)["estimate"]
    weights = result.correction
    refit = {"refit": FunctionScore(lambda y: score(y) + augmented(y, origin) @ weights.T)}
    direct = reduce_in_memory(response_reduction(refit, identity_observable(NAMES), force, 30), x)[
        "refit"
    ]
    np.testing.assert_allclose(result.mean, direct.mean, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(result.stein_residual, direct.stein_residual, atol=1e-12)
    # the bound is a bound of the refitted estimate's own standard error
    assert np.all(result.stderr >= 0.9 * direct.stderr)


def corrected_biased(model, x: np.ndarray, max_lag: int, **options):
    """The response pass of the biased score ``"estimate"`` with the affine correction, for
    ``A = x`` and a constant forcing."""
    return response_reduction(
        {"estimate": FunctionScore(biased_score(model))},
        identity_observable(NAMES),
        constant_forcing(NAMES),
        max_lag,
        corrected=["estimate"],
        origin=x.mean(axis=0),
        **options,
    )


def test_correction_restores_the_lag0_identity_and_reports_the_raw_residual():
    """A = x, c = 1: k̂(0) = I after the correction; the uncorrected residual is kept."""
    model, x = triple_well_samples(20000, 4)
    result = reduce_in_memory(corrected_biased(model, x, 10), x)["estimate"]
    np.testing.assert_allclose(result.mean[0], np.eye(2), atol=1e-12)
    np.testing.assert_allclose(result.stein_residual, 0.0, atol=1e-12)
    raw = result.uncorrected_stein_residual
    assert raw is not None and np.abs(np.diag(raw)).min() > 0.1  # 0.8 of the true score


def test_correction_is_the_same_over_any_chunking():
    model, x = triple_well_samples(5000, 5)
    reduction = corrected_biased(model, x, 25, base_block=64)
    whole = reduce_in_memory(reduction, x)["estimate"]
    split = reduce_in_memory(reduction, x, [700, 1300, 999, 2001])["estimate"]
    np.testing.assert_allclose(split.mean, whole.mean, rtol=1e-11, atol=1e-13)
    np.testing.assert_allclose(split.stderr, whole.stderr, rtol=1e-9, atol=1e-13)
    np.testing.assert_allclose(split.correction, whole.correction, rtol=1e-11, atol=1e-13)


def test_correction_brings_a_biased_score_closer_to_the_exact_response():
    model, x = triple_well_samples(100000, 6)
    scores = {"estimate": FunctionScore(biased_score(model)), "exact": FunctionScore(model.score)}
    out = reduce_in_memory(
        response_reduction(
            scores,
            identity_observable(NAMES),
            constant_forcing(NAMES),
            200,
            corrected=["estimate"],
            origin=x.mean(axis=0),
        ),
        x,
    )
    raw = reduce_in_memory(
        response_reduction(scores, identity_observable(NAMES), constant_forcing(NAMES), 200), x
    )
    exact = out["exact"].mean
    before = np.abs(raw["estimate"].mean - exact).max()
    after = np.abs(out["estimate"].mean - exact).max()
    assert after < 0.6 * before, (before, after)  # measured 0.30 -> 0.16


def test_unknown_corrected_name_is_refused():
    with pytest.raises(ValueError, match="corrected names"):
        response_reduction(
            {"a": FunctionScore(np.negative)},
            identity_observable(NAMES),
            constant_forcing(NAMES),
            3,
            corrected=["b"],
        )


def test_fourier_features_and_their_divergence_sums():
    """The features are ``cos(ω · (x - x̄) / σ + b)``, and their divergence sums equal the sums
    of central differences of that function."""
    x = np.random.default_rng(0).normal(size=(50, 3)) * [1.0, 2.0, 0.5] + 3.0
    features = FourierFeatures.draw(x.mean(axis=0), x.std(axis=0), count=8)

    def exact(y):
        z = (y - features.origin) / features.scale
        return np.cos(z @ features.frequencies.T + features.phases)

    values, divergence = features.values_and_divergence_sums(x)
    np.testing.assert_allclose(values, exact(x), rtol=1e-12, atol=1e-12)
    h = 1e-5
    expected = np.stack(
        [((exact(x + h * e) - exact(x - h * e)) / (2 * h)).sum(axis=0) for e in np.eye(3)]
    )
    np.testing.assert_allclose(divergence, expected, rtol=1e-6, atol=1e-8)


def test_fourier_extension_finds_what_a_polynomial_score_misses():
    """Samples of ``p ∝ exp(-x²/2 + a cos(ω x))``: a Gaussian score misses the cosine's part
    ``-a ω sin(ω x)``, and the score refitted with the random Fourier features recovers most of
    it (Fisher divergence down by more than half); the true score moves by the fit's noise only
    (66 weights on 200 000 samples)."""
    rng = np.random.default_rng(1)
    a, omega = 0.6, 2.5
    grid = np.linspace(-8, 8, 200_001)
    density = np.exp(-(grid**2) / 2 + a * np.cos(omega * grid))
    cdf = np.cumsum(density) / density.sum()
    x = np.interp(rng.uniform(size=200_000), cdf, grid)[:, None]

    def true(y):
        return -y - a * omega * np.sin(omega * y)

    features = FourierFeatures.draw(x.mean(axis=0), x.std(axis=0))
    for base, shrink in ((FunctionScore(lambda y: -y), 0.5), (FunctionScore(true), None)):
        (fitted,) = reduce_in_memory(refit_reduction([(base, features, None)]), x, 50_000)
        before = np.mean((base(x)[0] - true(x)) ** 2)
        after = np.mean((fitted(x)[0] - true(x)) ** 2)
        if shrink is None:
            assert after < 5e-3
        else:
            assert after < shrink * before
