"""Basis families against scipy, Gauss quadrature orthonormality, stability at high order."""

import math

import numpy as np
import pytest
from scipy import special

from kelr_dist.kernels.bases.families import Coordinate, Fourier, Hermite, Laguerre, TensorBasis


def scipy_hermite(x, order, beta):
    """Normalised probabilists' Hermite times W^beta, via scipy (accurate at moderate order)."""
    m = np.arange(order + 1)
    norm = np.exp(-0.5 * special.gammaln(m + 1))
    w = np.exp(-beta * (0.5 * x**2 + 0.5 * math.log(2 * math.pi)))
    return special.eval_hermitenorm(m[None, :], x[:, None]) * norm * w[:, None]


def scipy_laguerre(x, order, theta, beta):
    m = np.arange(order + 1)
    # ||L_m||^2 under the Gamma(theta+1) density = (theta+1)_m / m!
    norm = np.exp(
        -0.5
        * (special.gammaln(m + theta + 1) - special.gammaln(m + 1) - special.gammaln(theta + 1))
    )
    w = np.exp(beta * (theta * np.log(x) - x - special.gammaln(theta + 1)))
    return special.eval_genlaguerre(m[None, :], theta, x[:, None]) * norm * w[:, None]


@pytest.mark.parametrize("beta", [0.5, 1.0, 2.0])
def test_hermite_matches_scipy(beta):
    x = np.linspace(-6, 6, 97)
    ours, _ = Hermite(beta).evaluate(x, 40)
    ref = scipy_hermite(x, 40, beta)
    scale = np.abs(ref).max(axis=0)
    np.testing.assert_allclose(ours / scale, ref / scale, rtol=0, atol=1e-10)


@pytest.mark.parametrize(("theta", "beta"), [(0.0, 1.0), (1.0, 1.0), (2.5, 0.5), (1.0, 2.0)])
def test_laguerre_matches_scipy(theta, beta):
    x = np.linspace(0.01, 30, 113)
    ours, _ = Laguerre(theta, beta).evaluate(x, 40)
    ref = scipy_laguerre(x, 40, theta, beta)
    scale = np.abs(ref).max(axis=0)
    np.testing.assert_allclose(ours / scale, ref / scale, rtol=0, atol=1e-10)


def test_hermite_orthonormal_by_gauss_quadrature_to_order_150():
    # ∫ Ψ_m Ψ_n W^{1-2β} dx = δ_mn; with β = 1/2 the weight is 1: Gauss-Hermite (physicists')
    # integrates e^{-t²} p(t); Ψ_mΨ_n = ψ_mψ_n W, exact for 2*150 degree with 160 nodes.
    t, w = special.roots_hermite(160)
    x = np.sqrt(2.0) * t
    values, _ = Hermite(0.5).evaluate(x, 150)
    # Ψ_mΨ_n = ψ_mψ_n W(x) = ψ_mψ_n e^{-t²}/√(2π); dx = √2 dt
    gram = (values / np.exp(-(t[:, None] ** 2) / 2)).T @ (
        values * (w * np.sqrt(2.0) / np.exp(-(t**2) / 2))[:, None]
    )
    np.testing.assert_allclose(gram, np.eye(151), atol=1e-12)


@pytest.mark.parametrize("theta", [0.0, 1.0, 3.0])
def test_laguerre_orthonormal_by_gauss_quadrature_to_order_150(theta):
    x, w = special.roots_genlaguerre(160, theta)  # ∫ f x^θ e^{-x}
    p, _ = Laguerre(theta, 0.0 + 1.0).evaluate(x, 150)
    # Ψ_m = ℓ_m G, so ℓ_m = Ψ_m / G; ∫ ℓ_m ℓ_n G = Σ w ℓ_m ℓ_n / Γ(θ+1)
    g = np.exp(theta * np.log(x) - x - special.gammaln(theta + 1))
    ell = p / g[:, None]
    gram = ell.T @ (ell * (w / math.gamma(theta + 1))[:, None])
    np.testing.assert_allclose(gram, np.eye(151), atol=1e-12)


@pytest.mark.parametrize("family", [Hermite(1.0), Hermite(0.5), Laguerre(1.0), Laguerre(0.0, 0.5)])
def test_derivatives_match_finite_differences(family):
    x = np.linspace(0.05, 8, 41) if isinstance(family, Laguerre) else np.linspace(-7, 7, 41)
    h = 1e-6
    _, d = family.evaluate(x, 60)
    vp, _ = family.evaluate(x + h, 60)
    vm, _ = family.evaluate(x - h, 60)
    fd = (vp - vm) / (2 * h)
    scale = np.abs(d).max(axis=0) + 1e-300
    np.testing.assert_allclose(d / scale, fd / scale, atol=1e-6)


@pytest.mark.parametrize("family", [Hermite(1.0), Hermite(0.5), Laguerre(1.0), Laguerre(3.0, 0.5)])
def test_high_order_far_out_stays_finite(family):
    x = np.array([-1e3, -300.0, -40.0, 0.0, 1e-300, 1.0, 40.0, 300.0, 1e3])
    v, d = family.evaluate(x, 200)
    assert np.isfinite(v).all() and np.isfinite(d).all()
    # not everything underflowed: at |x| = 40 order 150 the weighted function is representable
    assert np.abs(v[x == 40.0][0, 150]) > 0


def test_laguerre_derivative_at_zero_is_the_one_sided_limit():
    fam = Laguerre(1.0, 1.0)
    _, d0 = fam.evaluate(np.array([0.0]), 30)
    _, d1 = fam.evaluate(np.array([1e-9]), 30)
    np.testing.assert_allclose(d0, d1, rtol=1e-6)
    _, dneg = fam.evaluate(np.array([-1.0]), 5)
    assert (dneg == 0).all()


def test_affine_map_chain_rule():
    c = Coordinate(Hermite(1.0), loc=2.0, scale=3.0)
    x = np.linspace(-5, 9, 23)
    v, d = c.evaluate(x, 10)
    h = 1e-6
    fd = (c.evaluate(x + h, 10)[0] - c.evaluate(x - h, 10)[0]) / (2 * h)
    np.testing.assert_allclose(d, fd, atol=1e-8)
    # with β = 1, Ψ_0(y) = W(y) is a density in y, so Ψ_0(y)/scale is a density in x
    grid = np.linspace(-40, 44, 20001)
    v0 = c.evaluate(grid, 0)[0][:, 0]
    np.testing.assert_allclose(np.trapezoid(v0, grid), 1.0, rtol=1e-9)


@pytest.mark.parametrize(
    ("order", "index_set", "d", "size"),
    [
        (60, "total", 2, 1891),
        (5, "total", 3, 56),
        (4, "total", 1, 5),
        ((90, 0), "box", 2, 91),
        ((2, 3, 1), "box", 3, 24),
    ],
)
def test_index_sets(order, index_set, d, size):
    basis = TensorBasis(tuple(Coordinate() for _ in range(d)), order, index_set)
    assert basis.size == size
    assert len({tuple(r) for r in basis.indices}) == size
    c = np.arange(size, dtype=float)
    np.testing.assert_array_equal(basis.from_matrix(basis.to_matrix(c)), c)


def test_bad_parameters_are_named():
    with pytest.raises(ValueError, match="beta"):
        Hermite(0.3)
    with pytest.raises(ValueError, match="theta"):
        Laguerre(-1.5)
    with pytest.raises(ValueError, match="scale"):
        Coordinate(Hermite(), 0.0, -1.0)
    with pytest.raises(ValueError, match="GiB"):
        TensorBasis((Coordinate(),) * 4, 400)
    with pytest.raises(ValueError, match="order"):
        TensorBasis((Coordinate(),) * 2, -1)


@pytest.mark.parametrize(
    ("order", "index_set", "d"),
    [(20, "total", 3), (7, "total", 4), (4, "total", 6), ((3, 5, 0, 2), "box", 4)],
)
def test_tail_products_and_columns_equal_the_products_of_gathered_factors(order, index_set, d):
    # the compiled kernels against the definition: gather each factor's table, multiply
    basis = TensorBasis(tuple(Coordinate() for _ in range(d)), order, index_set)
    rng = np.random.default_rng(d)
    tables = [np.asfortranarray(rng.normal(size=(300, m + 1))) for m in basis.max_orders]
    slopes = [np.asfortranarray(rng.normal(size=(300, m + 1))) for m in basis.max_orders]
    product, grads = basis.tail_products(tables, slopes)
    gathered = [t[:, basis.tails[:, k - 1]] for k, t in enumerate(tables) if k > 0]
    np.testing.assert_allclose(product, np.prod(gathered, axis=0), rtol=1e-14)
    for k, grad in enumerate(grads, start=1):
        factors = list(gathered)
        factors[k - 1] = slopes[k][:, basis.tails[:, k - 1]]
        np.testing.assert_allclose(grad, np.prod(factors, axis=0), rtol=1e-14)
    columns = basis.columns(tables[0], product)
    expected = tables[0][:, basis.indices[:, 0]] * np.prod(
        [t[:, basis.indices[:, k]] for k, t in enumerate(tables) if k > 0], axis=0
    )
    np.testing.assert_allclose(columns, expected, rtol=1e-14)


@pytest.mark.parametrize(
    ("family", "points"),
    [
        (Hermite(), np.r_[np.linspace(-8.0, 8.0, 401), -30.0, 30.5, -45.0]),
        (Hermite(beta=0.5), np.r_[np.linspace(-12.0, 12.0, 401), -31.0, 40.0]),
        (Laguerre(theta=1.0, beta=0.5), np.r_[np.linspace(1e-3, 60.0, 401), 0.0, 1e-300, 301.0]),
        (Laguerre(theta=2.5), np.r_[np.linspace(1e-3, 40.0, 401), -1.0, 350.0]),
        (Fourier(), np.linspace(-np.pi, 3 * np.pi, 401)),
    ],
)
@pytest.mark.parametrize("count", [1, 3])
def test_series_is_the_contraction_of_the_tables(family, points, count):
    """``Family.series`` (the recurrence summed as it goes, the far samples by the tables) is
    each coefficient row times the tables of ``evaluate``, values and derivatives, to rounding;
    where the tables are not finite the series is not either."""
    order = 9 if isinstance(family, Fourier) else 60
    coefficients = np.random.default_rng(count).standard_normal((count, order + 1))
    values, derivs = family.evaluate(points, order)
    sums, slopes = family.series(points, coefficients)
    for got, table in ((sums, values), (slopes, derivs)):
        want = coefficients @ table.T
        finite = np.isfinite(want)
        assert np.array_equal(np.isfinite(got), finite)
        scale = np.abs(want[finite]).max()
        assert np.allclose(got[finite], want[finite], rtol=0, atol=1e-12 * scale)
