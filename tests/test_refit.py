"""Refits of a score on test functions (``ŝ + V [z̃, φ]``, one read): the Stein identity they
restore for the observable's own functions, the Fisher divergence they cannot raise, their
chunking invariance, and the shared evaluation of the bases."""

import numpy as np

from kelr_dist.kernels.observables.distribution import KERNELS, bin_functions
from kelr_dist.kernels.reduction import reduce_in_memory
from kelr_dist.kernels.response.operator import FunctionScore, Observable, evaluate_scores
from kelr_dist.kernels.response.stein_correction import (
    FourierFeatures,
    ObservableFeatures,
    StackedFeatures,
)
from kelr_dist.kernels.scores.folds import Folds
from kelr_dist.kernels.scores.refit import refit_reduction

BINS = 24


def bimodal_samples(n: int, seed: int) -> np.ndarray:
    """``p ∝ exp(-(x² - 1.5)² / 0.5)`` by inverse transform: two wells, a sharp dip."""
    grid = np.linspace(-4, 4, 400_001)
    density = np.exp(-((grid**2 - 1.5) ** 2) / 0.5)
    cdf = np.cumsum(density) / density.sum()
    return np.interp(np.random.default_rng(seed).uniform(size=n), cdf, grid)[:, None]


def true_score(x: np.ndarray) -> np.ndarray:
    return -4.0 * x * (x**2 - 1.5) / 0.5


def bins_observable(x: np.ndarray) -> Observable:
    """Cubic B-spline bins on the data's range, with their derivatives."""
    low, high = float(x.min()), float(x.max())
    h = (high - low) / (BINS - 1)

    def values(y: np.ndarray) -> np.ndarray:
        return bin_functions(y[:, 0], low, h, BINS, KERNELS["cubic"])[0]

    def derivative(y: np.ndarray) -> np.ndarray:
        return bin_functions(y[:, 0], low, h, BINS, KERNELS["cubic"])[1][:, :, None]

    return Observable(tuple(f"bin{b}" for b in range(BINS)), values, derivative)


def features_for(x: np.ndarray) -> ObservableFeatures:
    return ObservableFeatures(bins_observable(x), x.mean(axis=0), x.std(axis=0), 1e-5 * x.std())


def test_refit_on_the_bins_makes_their_stein_identity_exact():
    """A Gaussian score on bimodal samples misses the dip; refitted on the bins, the sample
    Stein identity ``Ê[s A_b] = -Ê[A_b']`` holds for every bin (so the bins' lag-0 response to a
    constant forcing is exact), ``Ê[s] = 0``, and the Fisher divergence falls."""
    x = bimodal_samples(200_000, 0)
    base = FunctionScore(lambda y: -(y - x.mean()) / x.var())
    features = features_for(x)
    (refit,) = reduce_in_memory(refit_reduction([(base, features, None)]), x, 40_000)
    s = refit(x)[0][:, 0]
    a, slopes = features.observable(x), features.observable.jacobian(x, features.steps)[:, :, 0]
    identity = (s[:, None] * a).mean(axis=0) + slopes.mean(axis=0)
    before = (base(x)[0][:, 0, None] * a).mean(axis=0) + slopes.mean(axis=0)
    assert np.abs(identity).max() < 1e-6 * np.abs(before).max()
    assert abs(s.mean()) < 1e-6 * np.abs(s).mean()
    fisher = [np.mean((v - true_score(x)[:, 0]) ** 2) for v in (base(x)[0][:, 0], s)]
    assert fisher[1] < 0.5 * fisher[0], fisher


def test_refit_of_the_true_score_moves_it_by_noise_only():
    """The true score is in the family: refitted on 2 + 24 features it stays within the fit's
    noise (its Fisher divergence is a small fraction of the Gaussian's)."""
    x = bimodal_samples(200_000, 1)
    (refit,) = reduce_in_memory(
        refit_reduction([(FunctionScore(true_score), features_for(x), None)]), x, 50_000
    )
    gaussian = np.mean((-(x - x.mean()) / x.var() - true_score(x)) ** 2)
    assert np.mean((refit(x)[0] - true_score(x)) ** 2) < 5e-3 * gaussian


def test_refits_are_the_same_over_any_chunking_and_share_their_bases():
    """Several requests (two bases, two feature sets, one stacked) in one read: the refitted
    scores do not depend on the chunking, and each base is evaluated once per block."""
    x = bimodal_samples(30_000, 2)
    calls = []

    def counted(y):
        calls.append(len(y))
        return -(y - 0.1)

    first, second = FunctionScore(counted), FunctionScore(true_score)
    bins = features_for(x)
    fourier = FourierFeatures.draw(x.mean(axis=0), x.std(axis=0), count=8)
    requests = [
        (first, bins, None),
        (second, bins, None),
        (first, StackedFeatures((fourier, bins)), None),
    ]
    whole = reduce_in_memory(refit_reduction(requests), x, len(x))
    assert sum(calls) == len(x)  # the first base once per row, though two requests use it
    pieces = reduce_in_memory(refit_reduction(requests), x, 7_001)
    for a, b in zip(whole, pieces, strict=True):
        np.testing.assert_allclose(a(x)[0], b(x)[0], rtol=1e-7, atol=1e-7 * abs(a(x)[0]).max())
    assert whole[2].weights.shape == (1, 2 + 8 + BINS)
    # a refit starts from its base's values when both are evaluated together
    calls.clear()
    values = evaluate_scores([first, whole[0], whole[2]], x[:100])
    assert calls == [100]
    np.testing.assert_allclose(values[1][0], whole[0](x[:100])[0], rtol=1e-12)


def test_a_fold_refit_leaves_its_fold_out():
    """A request that leaves out held-out fold ``f`` is the refit on the other folds' rows, in
    any chunking: a fold refit's jackknife then includes the refit's own variance."""
    x = bimodal_samples(40_000, 3)
    base, bins = FunctionScore(lambda y: -(y - 0.1)), features_for(x)
    folds = Folds(4, 1, len(x))
    (left_out,) = reduce_in_memory(refit_reduction([(base, bins, 2)], folds), x, 7_001)
    rest = np.delete(x, np.arange(folds.edge(2), folds.edge(3)), axis=0)
    (on_rest,) = reduce_in_memory(refit_reduction([(base, bins, None)]), rest, len(rest))
    want = on_rest(x)[0]  # the two sum the same rows in another order: rounding, scaled
    np.testing.assert_allclose(left_out(x)[0], want, rtol=1e-7, atol=1e-7 * abs(want).max())
