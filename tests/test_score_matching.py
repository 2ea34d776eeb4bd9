"""Score matching (Hyvärinen 2005) in the polynomial basis: features and their derivatives,
partial sums over any chunking, exact recovery of representable scores, held-out folds that never
score a fit on its own data, and the one-standard-error choice."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kelr_dist.kernels.bases.families import Coordinate, Hermite, Laguerre
from kelr_dist.kernels.reduction import BlockInfo, reduce_in_memory
from kelr_dist.kernels.scores.folds import Folds
from kelr_dist.kernels.scores.score_matching import (
    Candidate,
    GramSums,
    PolynomialFeatures,
    choose_candidate,
    feature_count,
    fit_score,
    gram_reduction,
    held_out_candidates,
    hyvarinen_loss,
    solve_weights,
)


def gaussian_coordinates(d: int) -> tuple[Coordinate, ...]:
    return tuple(Coordinate(Hermite(1.0), loc=0.1 * k, scale=1.0 + 0.2 * k) for k in range(d))


def correlated(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.multivariate_normal([3.0, -1.0], [[2.0, 0.6], [0.6, 0.5]], n)


@pytest.mark.parametrize("d, degree", [(1, 6), (2, 5), (3, 3), (4, 2)])
def test_features_are_the_total_degree_set_and_their_gradients_match_differences(d, degree):
    coords = gaussian_coordinates(d)
    features = PolynomialFeatures(coords, degree)
    assert features.size == feature_count(d, degree)
    assert features.indices.sum(axis=1).max() == degree
    x = np.random.default_rng(1).normal(size=(40, d))
    phi, sums = features.values_and_gradient_sums(x)
    np.testing.assert_allclose(features.gradients(x).sum(axis=1), sums, rtol=1e-12, atol=1e-12)
    h = 1e-6
    for j in range(d):
        up, down = x.copy(), x.copy()
        up[:, j] += h
        down[:, j] -= h
        numeric = (features.values(up) - features.values(down)) / (2 * h)
        np.testing.assert_allclose(numeric.sum(axis=0), sums[j], rtol=1e-6, atol=1e-6)
    # a lower degree is the subset given by the mask, in the same order
    low = features.truncated(degree - 1)
    np.testing.assert_array_equal(low.values(x), phi[:, features.mask(degree - 1)])


def test_features_are_products_of_the_families_orthonormal_polynomials():
    """φ for a Hermite x Laguerre pair equals scipy's normalised polynomials multiplied."""
    from scipy.special import eval_genlaguerre, eval_hermitenorm, gammaln

    coords = (Coordinate(Hermite(1.0), 0.5, 2.0), Coordinate(Laguerre(1.5, 1.0), -1.0, 0.7))
    features = PolynomialFeatures(coords, 7)
    x = np.column_stack([np.linspace(-3, 4, 9), np.linspace(-0.5, 6, 9)])
    y0, y1 = (x[:, 0] - 0.5) / 2.0, (x[:, 1] + 1.0) / 0.7
    for a, (m0, m1) in enumerate(features.indices):
        hermite = eval_hermitenorm(m0, y0) / np.sqrt(np.exp(gammaln(m0 + 1)))
        norm = np.exp(0.5 * (gammaln(m1 + 1) + gammaln(2.5) - gammaln(m1 + 2.5)))
        laguerre = eval_genlaguerre(m1, 1.5, y1) * norm * (-1) ** m1
        np.testing.assert_allclose(
            np.abs(features.values(x)[:, a]), np.abs(hermite * laguerre), rtol=1e-9, atol=1e-12
        )


def test_values_and_one_derivative_are_the_products_and_the_gradient_sums_row():
    """The one-pass products (a score's values, a local fit's own derivative) equal the
    factors' products and the row ``k`` of the gradient sums, for a Laguerre coordinate too."""
    coords = (
        Coordinate(Hermite(1.0), 0.5, 2.0),
        Coordinate(Laguerre(1.5, 1.0), -1.0, 0.7),
        Coordinate(Hermite(1.0), 0.0, 1.3),
    )
    features = PolynomialFeatures(coords, 5)
    x = np.random.default_rng(3).standard_normal((200, 3)) + np.array([0.0, 2.0, 0.0])
    factors, _ = features._factors(x)
    phi, gradient_sums = features.values_and_gradient_sums(x)
    np.testing.assert_allclose(features.values(x), factors.prod(axis=2), rtol=1e-13)
    for k in range(3):
        values, own = features.values_and_derivative_sums(x, k)
        np.testing.assert_allclose(values, phi, rtol=1e-13)
        np.testing.assert_allclose(own, gradient_sums[k], rtol=1e-10, atol=1e-9)


@settings(max_examples=12, deadline=None)
@given(
    cuts=st.lists(st.integers(1, 2999), min_size=1, max_size=6),
    stride=st.sampled_from([1, 3]),
    folds=st.sampled_from([2, 4]),
)
def test_gram_partial_sums_add_up_over_any_chunking(cuts, stride, folds):
    x = correlated(3000)
    features = PolynomialFeatures(gaussian_coordinates(2), 4)
    reduction = gram_reduction(features, Folds(folds, 1, 3000), stride)
    lengths = np.diff([0, *sorted(set(cuts)), 3000]).tolist()
    whole = reduce_in_memory(reduction, x)
    split = reduce_in_memory(reduction, x, lengths)
    np.testing.assert_array_equal(split.n, whole.n)
    scale = np.abs(whole.gram).max()
    np.testing.assert_allclose(split.gram, whole.gram, rtol=0, atol=1e-12 * scale)
    np.testing.assert_allclose(split.b, whole.b, rtol=0, atol=1e-12 * np.abs(whole.b).max())


def quadrature_sums(features: PolynomialFeatures, log_p, box: float, nodes: int) -> GramSums:
    """``G = E[φφᵀ]`` and ``b = E[∂φ]`` under ``p ∝ exp(log_p)`` by a fine 2-D trapezoid rule
    (exact to rounding for these rapidly decaying densities), as one fold of weight 1."""
    axis = np.linspace(-box, box, nodes)
    mesh = np.stack(np.meshgrid(axis, axis, indexing="ij"), -1).reshape(-1, 2)
    weights = np.exp(log_p(mesh) - log_p(mesh).max())
    weights /= weights.sum()
    keep = weights > 1e-18
    mesh, weights = mesh[keep], weights[keep]
    phi = features.values(mesh)
    grads = features.gradients(mesh)
    gram = (phi * weights[:, None]).T @ phi
    b = np.einsum("jnp,n->jp", grads, weights)
    return GramSums(features, gram[None], b[None], np.array([1]))


def test_fit_recovers_a_gaussian_score_exactly():
    cov = np.array([[2.0, 0.6], [0.6, 0.5]])
    mean = np.array([3.0, -1.0])
    precision = np.linalg.inv(cov)
    coords = (Coordinate(Hermite(1.0), 3.0, 1.4), Coordinate(Hermite(1.0), -1.0, 0.7))

    def log_p(x):
        z = x - mean
        return -0.5 * np.einsum("ni,ij,nj->n", z, precision, z)

    for degree in (1, 3):
        features = PolynomialFeatures(coords, degree)
        sums = quadrature_sums(features, log_p, 14.0, 561)
        model = fit_score(sums, degree)
        x = mean + np.random.default_rng(0).normal(size=(50, 2))
        score, kept = model(x)
        assert kept.all()
        np.testing.assert_allclose(score, -(x - mean) @ precision, atol=1e-6)


def test_fit_recovers_a_polynomial_potential_of_the_feature_degree():
    """p ∝ exp(-V), V = x⁴/4 + y⁴/4 + x²y/2 - x/3: the score -∇V is cubic, in the span of the
    degree-3 features, so the minimiser of J is the score itself."""

    def log_p(z):
        x, y = z[:, 0], z[:, 1]
        return -(x**4 / 4 + y**4 / 4 + x**2 * y / 2 - x / 3)

    def score(z):
        x, y = z[:, 0], z[:, 1]
        return np.column_stack([-(x**3 + x * y - 1 / 3), -(y**3 + x**2 / 2)])

    coords = (Coordinate(Hermite(1.0), 0.1, 0.8), Coordinate(Hermite(1.0), -0.2, 0.8))
    features = PolynomialFeatures(coords, 3)
    sums = quadrature_sums(features, log_p, 4.5, 501)
    model = fit_score(sums, 3)
    x = np.random.default_rng(2).uniform(-1.5, 1.5, size=(50, 2))
    np.testing.assert_allclose(model(x)[0], score(x), atol=1e-6)


def test_linear_features_satisfy_the_sample_stein_identity():
    """Ê[(x - x̄) s(x)ᵀ] = -I exactly when the linear features are in the span (no ridge)."""
    x = correlated(20_000, seed=4)
    features = PolynomialFeatures(gaussian_coordinates(2), 3)
    sums = reduce_in_memory(gram_reduction(features, Folds(4, 1, len(x))), x, 5000)
    score, _ = fit_score(sums, 3)(x)
    np.testing.assert_allclose((x - x.mean(0)).T @ score / len(x), -np.eye(2), atol=1e-9)


def test_held_out_losses_score_each_fold_with_a_fit_that_never_saw_it():
    x = correlated(8000, seed=5)
    folds = Folds(4, 1, len(x))
    features = PolynomialFeatures(gaussian_coordinates(2), 3)
    sums = reduce_in_memory(gram_reduction(features, folds), x, 1000)
    candidates = held_out_candidates(sums, [2, 3], (0.0,))
    for candidate in candidates:
        for f in range(4):
            rows = slice(folds.edge(f), folds.edge(f + 1))
            rest = np.delete(x, np.arange(rows.start, rows.stop), axis=0)
            # the fit from the other folds' samples alone (and nothing of fold f) ...
            alone = reduce_in_memory(gram_reduction(features, Folds(2, 1, len(rest))), rest)
            train = GramSums(
                features, alone.gram.sum(0)[None], alone.b.sum(0)[None], np.array([alone.n.sum()])
            )
            weights = fit_score(train, candidate.degree).weights
            # ... scored by J on fold f's samples
            mask = features.mask(candidate.degree)
            phi, grad_sums = features.values_and_gradient_sums(x[rows])
            n = rows.stop - rows.start
            scales = np.array([c.scale for c in features.coordinates])
            expected = hyvarinen_loss(
                weights, (phi.T @ phi)[np.ix_(mask, mask)] / n, grad_sums[:, mask] / n, scales
            )
            assert candidate.fold_losses[f] == pytest.approx(expected, rel=1e-9, abs=1e-12)
    # changing the samples of fold 0 changes only fold 0's loss among the fits scored elsewhere
    y = x.copy()
    y[: folds.edge(1)] *= 1.3
    other = held_out_candidates(
        reduce_in_memory(gram_reduction(features, folds), y, 1000), [3], (0.0,)
    )[0]
    assert other.fold_losses[0] != pytest.approx(candidates[1].fold_losses[0])


def test_one_standard_error_rule_prefers_low_degree_and_no_ridge():
    flat = np.array([-1.0, -1.0, -1.0, -1.0])
    c = [
        Candidate(1, 0.0, -0.50, flat * 0.5),
        Candidate(2, 0.0, -1.00, flat + np.array([0.01, -0.01, 0.02, -0.02])),
        Candidate(2, 1e-2, -1.00, flat),
        Candidate(5, 0.0, -1.001, flat - 0.001 + np.array([0.02, -0.02, 0.01, -0.01])),
    ]
    pick = choose_candidate(c)
    assert (pick.degree, pick.ridge) == (2, 0.0)
    # an unstable low-degree fit whose fold losses scatter wildly is not within one error
    wild = Candidate(1, 0.0, 30.0, np.array([-10.0, 100.0, -10.0, 40.0]))
    assert choose_candidate([wild, *c[1:]]).degree == 2
    with pytest.raises(ValueError, match="non-finite"):
        choose_candidate([Candidate(1, 0.0, np.nan, flat)])


def test_solve_weights_drops_null_directions_instead_of_blowing_up():
    """Two identical features: the pseudo-inverse shares the weight between them."""
    gram = np.array([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0], [0.0, 0.0, 2.0]])
    b = np.array([[1.0, 1.0, 1.0]])
    (w,) = solve_weights(gram, b, (0.0,))
    np.testing.assert_allclose(w, [[-0.5, -0.5, -0.5]])


def test_solve_weights_do_not_depend_on_the_size_of_a_feature():
    """A feature 1e-10 times another's size is scaled to unit diagonal, not dropped as null: its
    weight is 1e10 times larger and the fitted score the same (the raw Gram matrix's eigenvalue
    1e-20 of it is below RCOND of the largest)."""
    gram = np.diag([1.0, 1e-20, 2.0])
    b = np.array([[1.0, 5e-10, 1.0]])
    (w,) = solve_weights(gram, b, (0.0,))
    np.testing.assert_allclose(w, [[-1.0, -5e10, -0.5]])


def test_folds_split_by_chain_or_by_contiguous_block_and_refuse_tiny_folds():
    by_block = Folds(4, 1, 1000)
    assert not by_block.by_chain and by_block.sizes() == [250] * 4
    pieces = list(by_block.segments(BlockInfo(0, 200, 600, 1000)))
    assert [(f, r.start, r.stop) for f, r in pieces] == [(0, 0, 50), (1, 50, 300), (2, 300, 400)]
    by_chain = Folds(3, 5, 400)
    assert by_chain.by_chain and by_chain.sizes() == [800, 800, 400]
    assert list(by_chain.segments(BlockInfo(4, 0, 400, 400)))[0][0] == 1
    with pytest.raises(ValueError, match="folds=4.*only 100 samples"):
        Folds(4, 1, 400)
    with pytest.raises(ValueError, match="folds must be an integer >= 2"):
        Folds(1, 1, 10_000)
