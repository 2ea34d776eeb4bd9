"""Tests of the KDE baseline and the quasi-Gaussian FDT (kernels.baselines.kde,
kernels.baselines.quasi_gaussian)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from scipy import stats

from kelr_dist.kernels.baselines.kde import (
    BinnedKDE,
    binned_kde_reduction,
    default_grid,
    exact_kde_reduction,
    linear_binning,
    make_grid,
    silverman_bandwidth,
)
from kelr_dist.kernels.baselines.quasi_gaussian import (
    SampleMoments,
    gaussian_score,
    mean_covariance_reduction,
)
from kelr_dist.kernels.reduction import reduce_in_memory
from kelr_dist.pipeline.steps import kde_grid_and_bandwidth
from kelr_dist.testing import kde_exact

WEIGHTS = np.array([0.6, 0.4])
MEANS = np.array([[-1.5, 0.0], [1.5, 1.0]])
COVS = np.array([[[1.0, 0.5], [0.5, 1.0]], [[0.5, -0.2], [-0.2, 1.5]]])


def mixture_samples(n: int, seed: int) -> np.ndarray:
    """``(n, 2)`` i.i.d. samples of a two-component, correlated Gaussian mixture."""
    rng = np.random.default_rng(seed)
    component = rng.choice(2, size=n, p=WEIGHTS)
    factors = np.linalg.cholesky(COVS)
    z = rng.standard_normal((n, 2))
    return MEANS[component] + np.einsum("nij,nj->ni", factors[component], z)


def mixture_density(x: np.ndarray) -> np.ndarray:
    return sum(
        w * stats.multivariate_normal(m, c).pdf(x)
        for w, m, c in zip(WEIGHTS, MEANS, COVS, strict=True)
    )


def direct_kde(samples, points, h):
    """Numpy twin of eq. 58 with a diagonal bandwidth: density (n,) and gradient (n, d)."""
    z = (points[:, None, :] - samples[None]) / h
    k = np.exp(-0.5 * (z**2).sum(-1)) / ((2 * np.pi) ** (len(h) / 2) * np.prod(h))
    return k.mean(1), (-(z / h) * k[..., None]).mean(1)


def random_chunks(n: int, rng: np.random.Generator, pieces: int = 5) -> list[int]:
    edges = np.sort(rng.choice(np.arange(1, n), size=pieces - 1, replace=False))
    return np.diff([0, *edges, n]).tolist()


def rel(a, b) -> float:
    return float(np.max(np.abs(a - b)) / np.max(np.abs(b)))


# ----------------------------------------------------------------------------- bandwidth


def test_silverman_matches_paper_formula():
    h = silverman_bandwidth([1.0, 2.0], 10**6)  # (4 / (4e6))^(1/6) = 0.1
    np.testing.assert_allclose(h, [0.1, 0.2], rtol=1e-14)
    np.testing.assert_allclose(silverman_bandwidth([3.0], 100), (4 / 300) ** 0.2 * 3, rtol=1e-14)


@pytest.mark.parametrize(
    ("std", "n", "name"), [([1.0, 0.0], 10, "std"), ([1.0, np.nan], 10, "std"), ([1.0], 0, "n")]
)
def test_silverman_rejects_bad_input(std, n, name):
    with pytest.raises(ValueError, match=name):
        silverman_bandwidth(std, n)


# ----------------------------------------------------------------------------- exact KDE


@pytest.mark.parametrize("d", [1, 2, 3])
def test_exact_matches_direct_formula(d):
    rng = np.random.default_rng(d)
    samples = rng.standard_normal((5000, d)) * np.arange(1, d + 1)
    points = rng.standard_normal((40, d)) * 2
    h = np.linspace(0.2, 0.5, d)
    density, gradient = kde_exact(samples, points, h)
    want_density, want_gradient = direct_kde(samples, points, h)
    assert rel(density, want_density) < 1e-12
    assert rel(gradient, want_gradient) < 1e-12


def test_exact_matches_scipy_gaussian_kde():
    rng = np.random.default_rng(3)
    samples = rng.standard_normal((500, 2))
    points = rng.standard_normal((20, 2))
    h = np.array([0.3, 0.6])
    reference = stats.gaussian_kde(samples.T)
    reference.set_bandwidth(1.0)  # covariance factor 1: then fix the covariance to diag(h^2)
    reference.covariance = np.diag(h**2)
    reference.cho_cov = np.diag(h)
    reference.log_det = 2 * np.log(h).sum()
    assert rel(kde_exact(samples, points, h)[0], reference(points.T)) < 1e-12


def test_exact_gradient_is_derivative_of_density():
    rng = np.random.default_rng(4)
    samples = rng.standard_normal((800, 2))
    points = rng.standard_normal((10, 2))
    h = np.array([0.25, 0.4])
    _, gradient = kde_exact(samples, points, h)
    step = 1e-5
    for k in range(2):
        e = np.zeros(2)
        e[k] = step
        fd = (kde_exact(samples, points + e, h)[0] - kde_exact(samples, points - e, h)[0]) / (
            2 * step
        )
        assert rel(gradient[:, k], fd) < 1e-8


def test_exact_reduction_is_chunking_invariant():
    rng = np.random.default_rng(5)
    samples = rng.standard_normal((3000, 2))
    points = rng.standard_normal((30, 2))
    h = np.array([0.3, 0.3])
    whole = kde_exact(samples, points, h)
    split = reduce_in_memory(exact_kde_reduction(points, h), samples, random_chunks(3000, rng))
    for a, b in zip(split, whole, strict=True):
        assert rel(a, b) < 1e-12


def test_kde_sup_error_falls_with_n():
    g = np.linspace(-3.5, 3.5, 15)
    points = np.stack(np.meshgrid(g, g), -1).reshape(-1, 2)
    truth = mixture_density(points)
    errors = []
    for n in (1000, 10_000, 100_000):
        samples = mixture_samples(n, seed=n)
        h = silverman_bandwidth(samples.std(0, ddof=1), n)
        errors.append(np.max(np.abs(kde_exact(samples, points, h)[0] - truth)))
    assert errors[1] < 0.8 * errors[0]
    assert errors[2] < 0.8 * errors[1]


@pytest.mark.parametrize(
    ("samples", "points", "h", "name"),
    [
        (np.ones((5, 2)), np.ones((3, 2)), [0.1, 0.0], "bandwidth"),
        (np.ones((5, 2)), np.ones((3, 2)), [0.1], "bandwidth"),
        (np.ones((5, 3)), np.ones((3, 2)), [0.1, 0.1], "samples"),
        (np.full((5, 2), np.inf), np.ones((3, 2)), [0.1, 0.1], "samples"),
        (np.ones((5, 2)), np.full((3, 2), np.nan), [0.1, 0.1], "points"),
        (np.ones(5), np.ones((3, 1)), [0.1], "samples"),
    ],
)
def test_exact_rejects_bad_input(samples, points, h, name):
    with pytest.raises(ValueError, match=name):
        kde_exact(samples, points, h)


# ----------------------------------------------------------------------------- binning


@pytest.mark.parametrize("d", [1, 2, 3])
def test_binning_is_chunking_invariant_and_conserves_mass_and_mean(d):
    rng = np.random.default_rng(10 + d)
    x = rng.standard_normal((4000, d))
    h = np.full(d, 0.3)
    grid = default_grid(x.min(0), x.max(0), h, spacing=0.5)
    reduction = binned_kde_reduction(grid, h)
    whole = reduce_in_memory(reduction, x)
    split = reduce_in_memory(reduction, x, random_chunks(len(x), rng, pieces=7))
    assert whole.n == split.n == len(x)
    assert rel(split.counts, whole.counts) < 1e-12
    assert abs(whole.counts.sum() - len(x)) < 1e-9
    # linear binning also preserves the first moment: sum_j counts_j node_j = sum_n X_n
    axes = [
        lo + np.arange(s) * dx
        for lo, s, dx in zip(grid.lower, grid.shape, grid.spacing, strict=True)
    ]
    nodes = np.stack(np.meshgrid(*axes, indexing="ij"), -1)
    np.testing.assert_allclose(
        np.tensordot(whole.counts, nodes, axes=d), x.sum(0), rtol=1e-10, atol=1e-8
    )


def test_binning_of_a_node_and_a_cell_centre():
    grid = make_grid([0.0, 0.0], [2.0, 4.0], (3, 5))  # spacing 1 x 1
    counts = linear_binning(np.array([[1.0, 2.0], [0.5, 3.5], [2.0, 4.0]]), grid)
    want = np.zeros((3, 5))
    want[1, 2] = 1.0
    want[0:2, 3:5] = 0.25
    want[2, 4] = 1.0
    np.testing.assert_array_equal(counts, want)


def test_binning_rejects_samples_outside_the_grid():
    grid = make_grid([0.0], [1.0], (11,))
    with pytest.raises(ValueError, match="outside the KDE grid"):
        linear_binning(np.array([[0.5], [1.5]]), grid)


@pytest.mark.parametrize(
    ("lower", "upper", "shape", "name"),
    [
        ([0.0, 0.0], [1.0, 0.0], (4, 4), "upper"),
        ([0.0, 0.0], [1.0, 1.0], (4, 1), "shape"),
        ([0.0, 0.0], [1.0, 1.0], (4,), "shape"),
        ([0.0] * 4, [1.0] * 4, (4,) * 4, "d = 1..3"),
        ([0.0, np.nan], [1.0, 1.0], (4, 4), "lower"),
    ],
)
def test_make_grid_rejects_bad_grids(lower, upper, shape, name):
    with pytest.raises(ValueError, match=name):
        make_grid(lower, upper, shape)


def test_grid_too_big_names_its_bytes():
    with pytest.raises(ValueError, match=r"shape=\(2000, 2000, 2000\) needs \d+ MiB"):
        make_grid([0.0] * 3, [1.0] * 3, (2000, 2000, 2000))


# ----------------------------------------------------------------------------- binned KDE


def test_binned_matches_exact_within_measured_error():
    """Default grid (spacing h/4): score error ~2e-3 rms, 2e-2 max (module docstring table)."""
    x = mixture_samples(20_000, seed=20)
    h = silverman_bandwidth(x.std(0, ddof=1), len(x))
    grid = default_grid(x.min(0), x.max(0), h)
    kde = reduce_in_memory(binned_kde_reduction(grid, h), x, 3000)
    points = x[:400]
    density, gradient = kde_exact(x, points, h)
    binned_density, binned_gradient = kde.evaluate(points)
    density_error = np.abs(binned_density / density - 1)
    score = gradient / density[:, None]
    score_error = np.linalg.norm(kde.score(points) - score, axis=1) / np.sqrt(
        np.mean(np.sum(score**2, 1))
    )
    assert np.sqrt(np.mean(density_error**2)) < 2e-3
    assert density_error.max() < 3e-2
    assert np.sqrt(np.mean(score_error**2)) < 5e-3
    assert score_error.max() < 5e-2
    assert rel(binned_gradient, gradient) < 2e-2


@pytest.mark.parametrize("d", [1, 3])
def test_binned_matches_exact_in_other_dimensions(d):
    rng = np.random.default_rng(30 + d)
    x = rng.standard_normal((3000, d)) + 3.0 * (rng.random((3000, d)) < 0.3)  # bimodal
    h = silverman_bandwidth(x.std(0, ddof=1), len(x))
    kde = reduce_in_memory(binned_kde_reduction(default_grid(x.min(0), x.max(0), h), h), x)
    density, gradient = kde_exact(x, x[:100], h)
    binned_density, binned_gradient = kde.evaluate(x[:100])
    assert rel(binned_density, density) < 1e-2
    assert rel(binned_gradient, gradient) < 3e-2


def test_cubic_interpolation_is_at_least_as_accurate():
    x = mixture_samples(5000, seed=40)
    h = silverman_bandwidth(x.std(0, ddof=1), len(x))
    grid = default_grid(x.min(0), x.max(0), h, spacing=0.5)
    linear = reduce_in_memory(binned_kde_reduction(grid, h, order=1), x)
    cubic = BinnedKDE(grid, linear.counts, linear.n, h, order=3)
    density, _ = kde_exact(x, x[:200], h)
    assert rel(cubic.evaluate(x[:200])[0], density) <= rel(linear.evaluate(x[:200])[0], density)


def test_binned_is_zero_outside_the_grid_and_pickles():
    x = np.random.default_rng(50).standard_normal((1000, 2))
    h = np.array([0.3, 0.3])
    grid = default_grid(x.min(0), x.max(0), h)
    kde = pickle.loads(pickle.dumps(reduce_in_memory(binned_kde_reduction(grid, h), x)))
    far = np.array([[grid.upper[0] + 1.0, 0.0], [0.0, grid.lower[1] - 1e-9]])
    density, gradient = kde.evaluate(far)
    np.testing.assert_array_equal(density, 0.0)
    np.testing.assert_array_equal(gradient, 0.0)
    np.testing.assert_array_equal(kde.score(far), 0.0)


def test_binned_reduction_rejects_bad_parameters():
    grid = make_grid([0.0, 0.0], [1.0, 1.0], (8, 8))
    with pytest.raises(ValueError, match="bandwidth"):
        binned_kde_reduction(grid, [0.1, -0.1])
    with pytest.raises(ValueError, match="bandwidth"):
        binned_kde_reduction(grid, [0.1, 0.1, 0.1])
    with pytest.raises(ValueError, match="order"):
        binned_kde_reduction(grid, [0.1, 0.1], order=2)


# ----------------------------------------------------------------------------- quasi-Gaussian


def test_mean_covariance_reduction_matches_numpy_over_random_splits():
    rng = np.random.default_rng(60)
    x = rng.standard_normal((5000, 3)) @ rng.standard_normal((3, 3)) + 1e3
    moments = reduce_in_memory(mean_covariance_reduction(), x, random_chunks(5000, rng, 9))
    assert moments.count == 5000
    assert rel(moments.mean, x.mean(0)) < 1e-12
    assert rel(moments.cov, np.cov(x.T)) < 1e-12
    np.testing.assert_array_equal(moments.minimum, x.min(0))
    np.testing.assert_array_equal(moments.maximum, x.max(0))


def test_mean_covariance_over_several_chains():
    rng = np.random.default_rng(61)
    x = rng.standard_normal((3, 700, 2))
    moments = reduce_in_memory(mean_covariance_reduction(), x, 128)
    flat = x.reshape(-1, 2)
    assert rel(moments.mean, flat.mean(0)) < 1e-12
    assert rel(moments.cov, np.cov(flat.T)) < 1e-12


def test_gaussian_score_is_gradient_of_log_density():
    mean = np.array([0.5, -1.0])
    cov = np.array([[2.0, 0.6], [0.6, 0.5]])
    score = pickle.loads(pickle.dumps(gaussian_score(mean, cov)))
    x = np.random.default_rng(62).standard_normal((20, 2))
    np.testing.assert_allclose(score(x), -np.linalg.solve(cov, (x - mean).T).T, rtol=1e-12)
    logpdf = stats.multivariate_normal(mean, cov).logpdf
    step = 1e-6
    fd = np.stack(
        [(logpdf(x + step * e) - logpdf(x - step * e)) / (2 * step) for e in np.eye(2)], 1
    )
    np.testing.assert_allclose(score(x), fd, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize(
    ("mean", "cov", "name"),
    [
        ([0.0, 0.0], [[1.0, 0.5], [0.4, 1.0]], "symmetric"),
        ([0.0, 0.0], [[1.0, 2.0], [2.0, 1.0]], "positive definite"),
        ([0.0], [[1.0, 0.0], [0.0, 1.0]], "cov"),
        ([np.nan, 0.0], np.eye(2), "mean"),
    ],
)
def test_gaussian_score_rejects_bad_input(mean, cov, name):
    with pytest.raises(ValueError, match=name):
        gaussian_score(mean, cov)


def test_mean_covariance_accepts_empty_blocks():
    x = np.random.default_rng(63).standard_normal((50, 2))
    reduction = mean_covariance_reduction()
    info = None
    empty = reduction.chunk(x[:0], info, None)
    merged = reduction.combine(reduction.combine(empty, reduction.chunk(x, info, None)), empty)
    moments = reduction.finalize(reduction.combine(empty, merged))
    assert rel(moments.cov, np.cov(x.T)) < 1e-12
    np.testing.assert_array_equal(moments.minimum, x.min(0))


def test_a_grid_too_large_for_the_baseline_says_what_the_user_can_do() -> None:
    """The pipeline's KDE baseline at d = 3 and 1e6 samples needs more than its grid budget:
    the message names the grid and the way out a user has (leave it out, fewer components),
    not the kernel's max_bytes, which no interface exposes."""
    d = 3
    sample = SampleMoments(10**6, np.zeros(d), np.eye(d), np.full(d, -5.0), np.full(d, 5.0))
    with pytest.raises(ValueError, match=r"^kde: .* grid of \(\d+, \d+, \d+\) nodes") as info:
        kde_grid_and_bandwidth(sample)
    assert "leave the baseline out, or estimate fewer components" in str(info.value)
    assert "max_bytes" not in str(info.value)
    small = SampleMoments(10**4, np.zeros(d), np.eye(d), sample.minimum, sample.maximum)
    grid, _ = kde_grid_and_bandwidth(small)
    assert len(grid.shape) == d
